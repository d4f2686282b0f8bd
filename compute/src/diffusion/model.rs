//! The denoising model behind a `MODEL` handle: a checkpoint's UNet, or one rebuilt from the
//! checkpoint with LoRAs added to its weights.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::DType;
use candle_nn::VarBuilder;

use super::checkpoint::ModelError;
use super::lora::{load_component, Lora};
use crate::models::layout::Component;
use crate::models::{CheckpointModels, Unet};

/// A checkpoint's UNet with the LoRAs applied to it, in order.
pub struct DiffusionModel {
    /// The checkpoint's networks (layout, device, and the UNet when no LoRA is applied).
    pub checkpoint: Arc<CheckpointModels>,
    /// The checkpoint file, to rebuild the UNet from.
    pub source: PathBuf,
    /// The LoRAs applied, with their strengths.
    pub loras: Vec<(Arc<Lora>, f64)>,
    patched: Option<Unet>,
}

impl DiffusionModel {
    /// The checkpoint's own UNet.
    pub fn new(checkpoint: Arc<CheckpointModels>, source: PathBuf) -> Self {
        DiffusionModel {
            checkpoint,
            source,
            loras: Vec::new(),
            patched: None,
        }
    }

    /// The UNet to sample with.
    pub fn unet(&self) -> &Unet {
        self.patched.as_ref().unwrap_or(&self.checkpoint.unet)
    }

    /// This model with `lora` added at `strength` (`LoraLoader`): the UNet is rebuilt from the
    /// checkpoint with every LoRA so far.
    pub fn with_lora(&self, lora: Arc<Lora>, strength: f64) -> Result<DiffusionModel, ModelError> {
        let cfg = &self.checkpoint.config;
        lora.check_fits(cfg)?;
        let mut loras = self.loras.clone();
        loras.push((lora, strength));
        let device = &self.checkpoint.device;
        let failed = |e: &dyn std::fmt::Display| ModelError::Failed(format!("rebuilding the UNet: {e}"));
        let mut tensors = load_component(&self.source, cfg, Component::Unet, device).map_err(|e| failed(&e))?;
        for (lora, strength) in &loras {
            lora.apply(*strength, Component::Unet, cfg, &mut tensors)?;
        }
        let unet = Unet::new(VarBuilder::from_tensors(tensors, DType::F32, device), cfg).map_err(|e| failed(&e))?;
        Ok(DiffusionModel {
            checkpoint: self.checkpoint.clone(),
            source: self.source.clone(),
            loras,
            patched: Some(unet),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::lora::write_random_lora;
    use crate::models::loader::tiny_test_models;
    use crate::models::ModelConfig;

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
}
