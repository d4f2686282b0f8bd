//! ComfyUI's custom-sampling values and `SamplerCustomAdvanced`: a `SAMPLER` (a sampler with
//! its own parameters), `SIGMAS` (the noise levels to step through), `NOISE` (the initial
//! noise's seed, or none) and a `GUIDER` (a model with its conditionings and how they
//! combine), sampled together by [`sample_custom`].

use std::sync::Arc;

use super::adm::PromptKind;
use super::conditioning::Conditioning;
use super::guidance::Combine;
use super::ksampler::{run_sampling, SampleFailure, Sampled, SamplingRun};
use super::model::DiffusionModel;
use crate::interrupt::Interrupt;
use crate::sampling::{SamplerKind, SamplerOptions, StepControl, StepInfo};
use crate::values::LatentBatch;
use crate::ComputeError;

/// The most sigmas a `SIGMAS` value may hold (one more than `KSampler`'s 10000 steps).
pub const MAX_SIGMAS: usize = 10_001;

/// ComfyUI's `SAMPLER`: which sampler, with its own parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CustomSampler {
    /// The sampler.
    pub kind: SamplerKind,
    /// Its parameters (`eta`, `s_noise`, ...).
    pub options: SamplerOptions,
}

/// ComfyUI's `SIGMAS`: noise levels, normally decreasing to 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Sigmas(Vec<f32>);

impl Sigmas {
    /// `values` as sigmas; an error when a value is negative or not finite, or when there are
    /// more than [`MAX_SIGMAS`].
    pub fn new(values: Vec<f32>) -> Result<Self, ComputeError> {
        if values.len() > MAX_SIGMAS {
            return Err(ComputeError::invalid(format!(
                "{} sigmas; at most {MAX_SIGMAS} are allowed",
                values.len()
            )));
        }
        if let Some(bad) = values.iter().find(|s| !s.is_finite() || **s < 0.0) {
            return Err(ComputeError::invalid(format!(
                "sigmas must be finite and not negative, got {bad}"
            )));
        }
        Ok(Sigmas(values))
    }

    /// The values.
    pub fn values(&self) -> &[f32] {
        &self.0
    }
}

/// ComfyUI's `NOISE`: the initial noise of a sampling run, and the seed of the sampler's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoiseSpec {
    /// The seed (`RandomNoise`'s `noise_seed`; 0 for `DisableNoise`).
    pub seed: u64,
    /// Whether the seed's noise is added to the latent first, drawn per batch index as
    /// `KSampler` draws it (`DisableNoise` and `SamplerCustom`'s `add_noise` off: not).
    pub add: bool,
}

/// ComfyUI's `GUIDER`: a model and the conditionings it guides by.
#[derive(Clone)]
pub struct Guider {
    /// The model.
    pub model: Arc<DiffusionModel>,
    /// The conditionings and how they combine.
    pub kind: GuiderKind,
}

/// The guiders of ComfyUI's custom-sampling nodes.
#[derive(Clone)]
pub enum GuiderKind {
    /// `CFGGuider` (and `SamplerCustom`): classifier-free guidance.
    Cfg {
        /// What to move towards.
        positive: Arc<Conditioning>,
        /// What to move away from.
        negative: Arc<Conditioning>,
        /// The guidance scale.
        cfg: f64,
    },
    /// `BasicGuider`: the conditioning alone, without guidance.
    Basic {
        /// The conditioning.
        conditioning: Arc<Conditioning>,
    },
    /// `DualCFGGuider`: two positive conditionings against a negative one.
    DualCfg {
        /// The first positive (`cond1`).
        cond1: Arc<Conditioning>,
        /// The second positive (`cond2`), guided against `negative`.
        cond2: Arc<Conditioning>,
        /// The negative.
        negative: Arc<Conditioning>,
        /// Scale from `cond2` to `cond1`.
        cfg_conds: f64,
        /// Scale from `negative` to `cond2`.
        cfg_cond2_negative: f64,
        /// `nested` style rather than `regular`.
        nested: bool,
    },
}

impl Guider {
    /// The conditionings in the order ComfyUI batches them, and how they combine.
    fn conds(&self) -> (Vec<(&Conditioning, PromptKind)>, Combine) {
        use PromptKind::{Negative, Positive};
        match &self.kind {
            GuiderKind::Cfg {
                positive,
                negative,
                cfg,
            } => (
                vec![(positive, Positive), (negative, Negative)],
                Combine::Cfg { scale: *cfg as f32 },
            ),
            GuiderKind::Basic { conditioning } => (vec![(conditioning, Positive)], Combine::Cfg { scale: 1.0 }),
            GuiderKind::DualCfg {
                cond1,
                cond2,
                negative,
                cfg_conds,
                cfg_cond2_negative,
                nested,
            } => (
                // ComfyUI marks the middle conditioning as a negative prompt.
                vec![(negative, Negative), (cond2, Negative), (cond1, Positive)],
                Combine::DualCfg {
                    cfg_conds: *cfg_conds as f32,
                    cfg_negative: *cfg_cond2_negative as f32,
                    nested: *nested,
                },
            ),
        }
    }

    /// Every conditioning the guider holds.
    pub fn conditionings(&self) -> Vec<&Conditioning> {
        self.conds().0.into_iter().map(|(c, _)| c).collect()
    }
}

/// `SamplerCustomAdvanced`: `latent` sampled by `sampler` down `sigmas`, guided by `guider`,
/// from `noise`. Returns the sampled latents and, when a step ran, the model's last
/// prediction of the clean latents (`denoised_output`). `on_step` and `stop` are as for
/// [`super::ksample`].
pub fn sample_custom(
    guider: &Guider,
    sampler: &CustomSampler,
    sigmas: &Sigmas,
    noise: NoiseSpec,
    latent: &LatentBatch,
    on_step: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
    stop: Interrupt<'_>,
) -> Result<Sampled, SampleFailure> {
    let (conds, combine) = guider.conds();
    let run = SamplingRun {
        model: &guider.model,
        conds,
        combine,
        sampler: sampler.kind,
        options: sampler.options,
        sigmas: sigmas.values().to_vec(),
        noise_seed: noise.add.then_some(noise.seed),
        sampler_seed: noise.seed,
    };
    run_sampling(&run, latent, on_step, stop)
}
