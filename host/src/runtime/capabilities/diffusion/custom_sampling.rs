//! ComfyUI's custom sampling for nodes: `SAMPLER`, `SIGMAS`, `NOISE` and `GUIDER` handles,
//! their settings checked, and `SamplerCustomAdvanced`'s run. The `Host` functions of
//! `mod.rs` call these.

use std::sync::Arc;

use wasmtime::component::Resource;
use weft_compute::diffusion::{
    self as sd, Conditioning, CustomSampler, DiffusionModel, Guider, GuiderKind, NoiseSpec, Sigmas,
};
use weft_compute::sampling::sigma_schedules::{self as schedules, AysModel};
use weft_compute::sampling::{self as sampling, SamplerKind, SamplerOptions, Scheduler, UnknownName};
use weft_types::NodeErrorCode;

use super::{compute_error, node_error, unet_working_bytes, Ctx};
pub(super) use crate::runtime::bindings::v0_2::weft::node::diffusion::{
    DualCfg, SamplerOptions as WitSamplerOptions, SigmaFormula, SigmaRange,
};
use crate::runtime::bindings::v0_2::wit::NodeError;
use crate::runtime::value::{HandleRes, LatentRes};

/// The most steps a schedule may have, as `KSampler`'s `steps` input.
const MAX_STEPS: u32 = 10_000;

/// A host function's answer: a wasmtime trap, or the node's result.
type Answer<T> = wasmtime::Result<Result<T, NodeError>>;

fn invalid(message: impl Into<String>) -> NodeError {
    node_error(NodeErrorCode::InvalidInput, message)
}

fn unknown(e: UnknownName) -> NodeError {
    invalid(e.to_string())
}

/// `value` when it is finite and within `min..=max`; `invalid_input` naming it otherwise.
fn in_range(name: &str, value: f64, min: f64, max: f64) -> Result<f64, NodeError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(format!(
            "{name} must be a number from {min} to {max}, got {value}"
        )))
    }
}

/// `steps` when it is 1 to `max`.
fn steps_in(steps: u32, max: u32) -> Result<usize, NodeError> {
    if (1..=max).contains(&steps) {
        Ok(steps as usize)
    } else {
        Err(invalid(format!("steps must be 1 to {max}, got {steps}")))
    }
}

/// The sampler `name` with `options` checked against the `Sampler*` nodes' ranges.
pub(super) fn custom_sampler(name: &str, options: &WitSamplerOptions) -> Result<CustomSampler, NodeError> {
    let kind: SamplerKind = name.parse().map_err(unknown)?;
    let defaults = SamplerOptions::default();
    let eta = options.eta.map(|v| in_range("eta", v, 0.0, 100.0)).transpose()?;
    let s_noise = options
        .s_noise
        .map(|v| in_range("s_noise", v, 0.0, 100.0))
        .transpose()?;
    let r = options.r.map(|v| in_range("r", v, 0.0, 100.0)).transpose()?;
    if r == Some(0.0) {
        return Err(invalid("r must be above 0"));
    }
    let order = match options.order {
        Some(order @ 1..=100) => order as usize,
        Some(other) => return Err(invalid(format!("order must be 1 to 100, got {other}"))),
        None => defaults.order,
    };
    Ok(CustomSampler {
        kind,
        options: SamplerOptions {
            eta: eta.unwrap_or(defaults.eta),
            s_noise: s_noise.unwrap_or(defaults.s_noise),
            r: r.unwrap_or(defaults.r),
            order,
        },
    })
}

/// `BasicScheduler`'s sigmas for `model`.
pub(super) fn basic_schedule(
    model: &DiffusionModel,
    scheduler: &str,
    steps: u32,
    denoise: f64,
) -> Result<Vec<f32>, NodeError> {
    let scheduler: Scheduler = scheduler.parse().map_err(unknown)?;
    let steps = steps_in(steps, MAX_STEPS)?;
    let denoise = in_range("denoise", denoise, 0.0, 1.0)?;
    let ms = model.model_sampling();
    if denoise <= 0.0 {
        return Ok(Vec::new());
    }
    let total = if denoise < 1.0 {
        ((steps as f64 / denoise) as usize).min(MAX_STEPS as usize * 100)
    } else {
        steps
    };
    let sigmas = sampling::sigmas(&ms, scheduler, total);
    let keep = (steps + 1).min(sigmas.len());
    Ok(sigmas[sigmas.len() - keep..].to_vec())
}

/// The sigmas of a model-free `formula` over `range`.
pub(super) fn formula_schedule(formula: &SigmaFormula, range: &SigmaRange) -> Result<Vec<f32>, NodeError> {
    let steps = steps_in(range.steps, MAX_STEPS)?;
    let max = in_range("sigma_max", range.sigma_max, 0.0, 5000.0)?;
    let min = in_range("sigma_min", range.sigma_min, 0.0, max)?;
    Ok(match *formula {
        SigmaFormula::Karras(rho) => {
            let rho = in_range("rho", rho, 0.0, 100.0)?;
            if rho == 0.0 {
                return Err(invalid("rho must be above 0"));
            }
            sampling::karras(steps, min, max, rho)
        }
        SigmaFormula::Exponential => sampling::exponential(steps, min, max),
        SigmaFormula::Polyexponential(rho) => {
            schedules::polyexponential(steps, min, max, in_range("rho", rho, 0.0, 100.0)?)
        }
        SigmaFormula::Laplace((mu, beta)) => schedules::laplace(
            steps,
            min,
            max,
            in_range("mu", mu, -10.0, 10.0)?,
            in_range("beta", beta, 0.0, 10.0)?,
        ),
    })
}

/// `VPScheduler`'s sigmas.
pub(super) fn vp_schedule(steps: u32, beta_d: f64, beta_min: f64, eps_s: f64) -> Result<Vec<f32>, NodeError> {
    Ok(schedules::vp(
        steps_in(steps, MAX_STEPS)?,
        in_range("beta_d", beta_d, 0.0, 5000.0)?,
        in_range("beta_min", beta_min, 0.0, 5000.0)?,
        in_range("eps_s", eps_s, 0.0, 1.0)?,
    ))
}

/// `AlignYourStepsScheduler`'s sigmas.
pub(super) fn ays_schedule(model_type: &str, steps: u32, denoise: f64) -> Result<Vec<f32>, NodeError> {
    let model: AysModel = model_type.parse().map_err(unknown)?;
    let steps = steps_in(steps, MAX_STEPS)?;
    Ok(schedules::align_your_steps(
        model,
        steps,
        in_range("denoise", denoise, 0.0, 1.0)?,
    ))
}

/// The guider of `kind` over the model `model`.
pub(super) fn guider(model: Arc<DiffusionModel>, kind: GuiderKind) -> Result<Guider, NodeError> {
    let check = |name: &str, v: f64| in_range(name, v, 0.0, 100.0);
    match &kind {
        GuiderKind::Cfg { cfg, .. } => {
            check("cfg", *cfg)?;
        }
        GuiderKind::Basic { .. } => {}
        GuiderKind::DualCfg {
            cfg_conds,
            cfg_cond2_negative,
            ..
        } => {
            check("cfg_conds", *cfg_conds)?;
            check("cfg_cond2_negative", *cfg_cond2_negative)?;
        }
    }
    Ok(Guider { model, kind })
}

/// `DualCFGGuider`'s kind.
pub(super) fn dual_cfg(
    cond1: Arc<Conditioning>,
    cond2: Arc<Conditioning>,
    negative: Arc<Conditioning>,
    scales: &DualCfg,
) -> GuiderKind {
    GuiderKind::DualCfg {
        cond1,
        cond2,
        negative,
        cfg_conds: scales.cfg_conds,
        cfg_cond2_negative: scales.cfg_cond2_negative,
        nested: scales.nested,
    }
}

impl Ctx<'_> {
    /// Keeps `values` as a `SIGMAS` handle; `invalid_input` for values sigmas cannot be.
    pub(super) fn push_sigmas(&mut self, values: Vec<f32>) -> Answer<Resource<HandleRes>> {
        let count = values.len();
        let sigmas = attempt!(Sigmas::new(values).map_err(compute_error));
        let charge = self.core.charge(count as u64 * 4, || format!("{count} sigmas"))?;
        Ok(Ok(self.push_handle(
            "SIGMAS",
            format!("{count} sigmas"),
            count as u32,
            Arc::new(sigmas),
            charge,
        )?))
    }

    /// Keeps a small settings value (`SAMPLER`, `NOISE`, `GUIDER`) as a handle of `type_name`.
    pub(super) fn push_setting<T: std::any::Any + Send + Sync>(
        &mut self,
        type_name: &str,
        name: String,
        value: T,
    ) -> wasmtime::Result<Resource<HandleRes>> {
        let charge = self
            .core
            .charge(std::mem::size_of::<T>() as u64, || format!("a {type_name}"))?;
        self.push_handle(type_name, name, 1, Arc::new(value), charge)
    }

    /// The values of the `SIGMAS` handle `sigmas`.
    pub(super) fn sigmas(&self, sigmas: &Resource<HandleRes>) -> Answer<Arc<Sigmas>> {
        self.payload::<Sigmas>(sigmas, "SIGMAS")
    }

    /// `SamplerCustomAdvanced`: the sampled latents and the denoised ones.
    pub(super) fn run_custom(
        &mut self,
        noise: Resource<HandleRes>,
        guider: Resource<HandleRes>,
        sampler: Resource<HandleRes>,
        sigmas: Resource<HandleRes>,
        latent: Resource<LatentRes>,
    ) -> Answer<(Resource<LatentRes>, Resource<LatentRes>)> {
        let noise = *attempt!(self.payload::<NoiseSpec>(&noise, "NOISE")?);
        let guider = attempt!(self.payload::<Guider>(&guider, "GUIDER")?);
        let sampler = *attempt!(self.payload::<CustomSampler>(&sampler, "SAMPLER")?);
        let sigmas = attempt!(self.sigmas(&sigmas)?);
        let latent = self.latent(&latent)?;
        if let Some(stop) = self.interruption() {
            return Err(stop.into());
        }
        // Both results, the sampler's working copies of the latent and the UNet's working
        // memory, before any of it is allocated.
        let conds = guider.conditionings();
        let working = 5 * latent.data.len() as u64 * 4 + unet_working_bytes(&guider.model, latent.shape, &conds);
        let charge = self.charge_latent(latent.shape, working, "sampling")?;
        let denoised_charge = self.charge_latent(latent.shape, 0, "the denoised latents")?;
        let colours = guider.model.checkpoint.config.latent_rgb();
        let sampled = self.sample_reporting(colours, |on_step, stop| {
            sd::sample_custom(&guider, &sampler, &sigmas, noise, &latent, on_step, stop)
        })?;
        let sampled = attempt!(sampled);
        let denoised = sampled.denoised.unwrap_or_else(|| sampled.latent.clone());
        let out = self.push_latent(sampled.latent, charge)?;
        let denoised = self.push_latent(denoised, denoised_charge)?;
        Ok(Ok((out, denoised)))
    }
}
