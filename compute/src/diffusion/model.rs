//! The denoising model behind a `MODEL` handle: a checkpoint's UNet, or one rebuilt from the
//! checkpoint with LoRAs added to its weights, with the patches ComfyUI's model nodes add
//! to it: another model sampling (`ModelSamplingDiscrete`, `ModelSamplingContinuousEDM`),
//! its latent format, and `RescaleCFG` guidance.

use std::path::PathBuf;
use std::sync::Arc;

use candle_nn::VarBuilder;

use super::checkpoint::ModelError;
use super::lora::Lora;
use super::source::Source;
use crate::models::layout::Component;
use crate::models::separate::UnetKeys;
use crate::models::{CheckpointModels, Unet, UnetModels};
use crate::sampling::{DiscreteSampling, EdmSampling, ModelSampling};
use crate::ComputeError;

/// How sampling reads and writes a model's latents (ComfyUI's `latent_format`
/// `process_in` / `process_out`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LatentFormat {
    /// The checkpoint's own: latents times its scale factor.
    Checkpoint,
    /// Playground v2.5's: per channel, `(latent - mean) * 0.5 / std`.
    Playground25,
}

/// Playground v2.5's latent channel means.
const PLAYGROUND_MEAN: [f32; 4] = [-1.6574, 1.886, -1.383, 2.5155];
/// Playground v2.5's latent channel standard deviations.
const PLAYGROUND_STD: [f32; 4] = [8.4927, 5.9022, 6.5498, 5.2299];
/// Playground v2.5's latent scale factor.
const PLAYGROUND_SCALE: f32 = 0.5;

/// A checkpoint's UNet with the LoRAs applied to it, in order, and the sampling patches.
#[derive(Clone)]
pub struct DiffusionModel {
    /// The UNet as loaded, with its layout and device (the UNet sampled when no LoRA is
    /// applied).
    pub checkpoint: Arc<UnetModels>,
    /// The file the UNet was loaded from (a checkpoint or a UNet file).
    pub source: PathBuf,
    /// How to read the UNet's weights again, to rebuild it with LoRAs.
    origin: Source,
    /// The LoRAs applied, with their strengths.
    pub loras: Vec<(Arc<Lora>, f64)>,
    patched: Option<Arc<Unet>>,
    /// Another model sampling than the checkpoint's, from a model-sampling node.
    sampling: Option<Arc<ModelSampling>>,
    latent_format: LatentFormat,
    /// `RescaleCFG`'s multiplier.
    cfg_rescale: Option<f64>,
}

impl DiffusionModel {
    /// The checkpoint's own UNet.
    pub fn new(checkpoint: Arc<CheckpointModels>, source: PathBuf) -> Self {
        let origin = Source::Checkpoint(source.clone());
        Self::from_parts(Arc::new(checkpoint.unet_part()), source, origin)
    }

    /// The UNet loaded from its own file `source`, whose keys are in style `keys`
    /// (`UNETLoader`).
    pub fn from_unet(unet: Arc<UnetModels>, source: PathBuf, keys: UnetKeys) -> Self {
        let origin = Source::Unet(source.clone(), keys);
        Self::from_parts(unet, source, origin)
    }

    fn from_parts(checkpoint: Arc<UnetModels>, source: PathBuf, origin: Source) -> Self {
        DiffusionModel {
            checkpoint,
            source,
            origin,
            loras: Vec::new(),
            patched: None,
            sampling: None,
            latent_format: LatentFormat::Checkpoint,
            cfg_rescale: None,
        }
    }

    /// The UNet to sample with.
    pub fn unet(&self) -> &Unet {
        self.patched.as_deref().unwrap_or(&self.checkpoint.unet)
    }

    /// The model sampling to sample with: a node's patch, or the checkpoint's own: the
    /// discrete linear schedule with EPS prediction (SD1, SDXL, SD2 512-base), or with v
    /// prediction for a checkpoint that predicts v (SD2 768-v).
    pub fn model_sampling(&self) -> Arc<ModelSampling> {
        self.sampling.clone().unwrap_or_else(|| {
            Arc::new(match self.checkpoint.config.v_prediction {
                true => ModelSampling::discrete(DiscreteSampling::VPrediction, false),
                false => ModelSampling::sd1(),
            })
        })
    }

    /// How sampling reads and writes latents.
    pub fn latent_format(&self) -> LatentFormat {
        self.latent_format
    }

    /// `RescaleCFG`'s multiplier, when the model has one.
    pub fn cfg_rescale(&self) -> Option<f64> {
        self.cfg_rescale
    }

    /// This model with `lora` added at `strength` (`LoraLoader`): the UNet is rebuilt from its
    /// file with every LoRA so far; the sampling patches stay.
    pub fn with_lora(&self, lora: Arc<Lora>, strength: f64) -> Result<DiffusionModel, ModelError> {
        let cfg = &self.checkpoint.config;
        lora.check_fits(cfg)?;
        let mut loras = self.loras.clone();
        loras.push((lora, strength));
        let device = &self.checkpoint.device;
        let failed = |e: &dyn std::fmt::Display| ModelError::Failed(format!("rebuilding the UNet: {e}"));
        let mut tensors = self
            .origin
            .load_component(cfg, Component::Unet, device)
            .map_err(|e| failed(&e))?;
        for (lora, strength) in &loras {
            lora.apply(*strength, Component::Unet, cfg, &mut tensors)?;
        }
        let unet = Unet::new(
            VarBuilder::from_tensors(tensors, self.checkpoint.precisions.unet.dtype(), device),
            cfg,
        )
        .map_err(|e| failed(&e))?;
        Ok(DiffusionModel {
            loras,
            patched: Some(Arc::new(unet)),
            ..self.clone()
        })
    }

    /// This model sampled as ComfyUI's `ModelSamplingDiscrete` patches it: `sampling`'s
    /// prediction over the discrete schedule, rescaled to zero terminal SNR when `zsnr`.
    pub fn with_discrete_sampling(&self, sampling: DiscreteSampling, zsnr: bool) -> DiffusionModel {
        DiffusionModel {
            sampling: Some(Arc::new(ModelSampling::discrete(sampling, zsnr))),
            ..self.clone()
        }
    }

    /// This model sampled as ComfyUI's `ModelSamplingContinuousEDM` patches it: continuous
    /// sigmas from `sigma_min` to `sigma_max` with `sampling`'s prediction; Playground v2.5's
    /// choice also sets its latent format (other choices keep the model's). The range must be
    /// finite with `0 < sigma_min < sigma_max`.
    pub fn with_continuous_edm(
        &self,
        sampling: EdmSampling,
        sigma_min: f64,
        sigma_max: f64,
    ) -> Result<DiffusionModel, ComputeError> {
        let table = ModelSampling::continuous_edm(sampling, sigma_min, sigma_max).map_err(ComputeError::Invalid)?;
        let latent_format = match sampling {
            EdmSampling::EdmPlayground25 => LatentFormat::Playground25,
            _ => self.latent_format,
        };
        if latent_format == LatentFormat::Playground25 && self.checkpoint.config.latent_channels != 4 {
            return Err(ComputeError::invalid(
                "Playground v2.5's latent format needs a model of 4 latent channels",
            ));
        }
        Ok(DiffusionModel {
            sampling: Some(Arc::new(table)),
            latent_format,
            ..self.clone()
        })
    }

    /// This model guided as ComfyUI's `RescaleCFG` patches it, with `multiplier` in 0..=1.
    pub fn with_cfg_rescale(&self, multiplier: f64) -> Result<DiffusionModel, ComputeError> {
        if !(0.0..=1.0).contains(&multiplier) {
            return Err(ComputeError::invalid(format!(
                "the RescaleCFG multiplier must be between 0 and 1, got {multiplier}"
            )));
        }
        Ok(DiffusionModel {
            cfg_rescale: Some(multiplier),
            ..self.clone()
        })
    }

    /// Latents as the model samples them (`process_latent_in`), `plane` values per channel.
    pub fn process_latent_in(&self, data: &[f32], plane: usize) -> Vec<f32> {
        let scale = self.checkpoint.config.latent_scale();
        self.latent_format.process_in(data, plane, scale)
    }

    /// Sampled latents as the VAE reads them (`process_latent_out`), `plane` values per
    /// channel.
    pub fn process_latent_out(&self, data: &[f32], plane: usize) -> Vec<f32> {
        let scale = self.checkpoint.config.latent_scale();
        self.latent_format.process_out(data, plane, scale)
    }
}

impl LatentFormat {
    /// `process_in` of row-major latents with `plane` values per channel; `scale` is the
    /// checkpoint's own scale factor.
    pub fn process_in(self, data: &[f32], plane: usize, scale: f32) -> Vec<f32> {
        match self {
            LatentFormat::Checkpoint => data.iter().map(|v| v * scale).collect(),
            LatentFormat::Playground25 => per_channel(data, plane, |v, c| {
                (v - PLAYGROUND_MEAN[c]) * PLAYGROUND_SCALE / PLAYGROUND_STD[c]
            }),
        }
    }

    /// `process_out`, the inverse of [`LatentFormat::process_in`].
    pub fn process_out(self, data: &[f32], plane: usize, scale: f32) -> Vec<f32> {
        match self {
            LatentFormat::Checkpoint => data.iter().map(|v| v / scale).collect(),
            LatentFormat::Playground25 => per_channel(data, plane, |v, c| {
                v * PLAYGROUND_STD[c] / PLAYGROUND_SCALE + PLAYGROUND_MEAN[c]
            }),
        }
    }
}

/// `f(value, channel)` over 4-channel latents of `plane` values per channel.
fn per_channel(data: &[f32], plane: usize, f: impl Fn(f32, usize) -> f32) -> Vec<f32> {
    let plane = plane.max(1);
    data.iter()
        .enumerate()
        .map(|(i, &v)| f(v, (i / plane) % PLAYGROUND_MEAN.len()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::lora::write_random_lora;
    use crate::models::loader::tiny_test_models;
    use crate::models::ModelConfig;
    use candle_core::DType;

    #[test]
    fn a_lora_changes_the_unet_and_strength_zero_does_not() {
        let (dir, m) = tiny_test_models(8).unwrap();
        let base = DiffusionModel::new(Arc::new(m), dir.path().join("tiny.safetensors"));
        let path = dir.path().join("lora.safetensors");
        write_random_lora(&path, &ModelConfig::tiny(), 3, 4).unwrap();
        let lora = Arc::new(Lora::read(&path, "lora.safetensors").unwrap());
        let x = candle_core::Tensor::ones((1, 4, 4, 4), DType::F32, &candle_core::Device::Cpu).unwrap();
        let ctx = candle_core::Tensor::ones((1, 77, 32), DType::F32, &candle_core::Device::Cpu).unwrap();
        let run = |m: &DiffusionModel| m.unet().forward(&x, 500.0, &ctx, None).unwrap();
        let plain = run(&base);
        let zero = base.with_lora(lora.clone(), 0.0).unwrap();
        assert_eq!(crate::max_abs_diff(&plain, &run(&zero)), 0.0);
        let patched = base.with_lora(lora.clone(), 1.0).unwrap();
        let moved = crate::max_abs_diff(&plain, &run(&patched));
        assert!(moved > 0.0);
        // LoRAs chain: the same one at -1 takes it back out (up to rounding).
        let twice = patched.with_lora(lora, -1.0).unwrap();
        assert_eq!(twice.loras.len(), 2);
        assert!(crate::max_abs_diff(&plain, &run(&twice)) < moved / 10.0);
    }

    fn floats(v: &serde_json::Value) -> Vec<f32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect()
    }

    #[test]
    fn playground_latents_are_processed_as_comfyui_does() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/sdxl-components/model_patches.json"
        );
        let root: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let want = &root["playground_latents"];
        let latent = floats(&want["latent"]);
        let plane = 4;
        let format = LatentFormat::Playground25;
        let close = |got: &[f32], key: &str| {
            for (g, w) in got.iter().zip(floats(&want[key])) {
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{key}: {g} vs {w}");
            }
        };
        close(&format.process_in(&latent, plane, 0.13025), "process_in");
        close(&format.process_out(&latent, plane, 0.13025), "process_out");
        let back = format.process_out(&format.process_in(&latent, plane, 1.0), plane, 1.0);
        assert!(back.iter().zip(&latent).all(|(a, b)| (a - b).abs() < 1e-5));
    }

    #[test]
    fn patches_stack_and_survive_a_lora_and_bad_settings_are_invalid_input() {
        let (dir, m) = tiny_test_models(8).unwrap();
        let base = DiffusionModel::new(Arc::new(m), dir.path().join("tiny.safetensors"));
        assert_eq!(base.model_sampling().sigmas(), ModelSampling::sd1().sigmas());
        assert_eq!(base.latent_format(), LatentFormat::Checkpoint);
        let v = base.with_discrete_sampling(DiscreteSampling::VPrediction, true);
        let guided = v.with_cfg_rescale(0.7).unwrap();
        assert_eq!(guided.cfg_rescale(), Some(0.7));
        assert_eq!(guided.model_sampling().prediction(), crate::sampling::Prediction::V);
        let playground = guided
            .with_continuous_edm(EdmSampling::EdmPlayground25, 0.002, 80.0)
            .unwrap();
        assert_eq!(playground.latent_format(), LatentFormat::Playground25);
        assert_eq!(playground.cfg_rescale(), Some(0.7));
        // Another model sampling keeps the latent format, as ComfyUI's object patches do.
        let again = playground.with_discrete_sampling(DiscreteSampling::Eps, false);
        assert_eq!(again.latent_format(), LatentFormat::Playground25);
        let path = dir.path().join("lora.safetensors");
        write_random_lora(&path, &ModelConfig::tiny(), 3, 4).unwrap();
        let lora = Arc::new(Lora::read(&path, "lora.safetensors").unwrap());
        let with_lora = playground.with_lora(lora, 1.0).unwrap();
        assert_eq!(with_lora.latent_format(), LatentFormat::Playground25);
        assert_eq!(with_lora.cfg_rescale(), Some(0.7));
        assert_eq!(
            with_lora.model_sampling().sigma_max(),
            playground.model_sampling().sigma_max()
        );
        for (min, max) in [
            (0.0, 120.0),
            (-1.0, 1.0),
            (5.0, 1.0),
            (1.0, 1.0),
            (f64::NAN, 1.0),
            (0.1, f64::INFINITY),
        ] {
            let bad = base.with_continuous_edm(EdmSampling::Eps, min, max);
            assert!(matches!(bad, Err(ComputeError::Invalid(_))), "{min} {max}");
        }
        for multiplier in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                base.with_cfg_rescale(multiplier),
                Err(ComputeError::Invalid(_))
            ));
        }
    }
}
