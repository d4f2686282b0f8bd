//! The autoencoder behind a `VAE` handle: a checkpoint's, or one loaded from a standalone
//! VAE file of the `vae` models folder (`VAELoader`; original-layout names, with or without
//! the `first_stage_model.` prefix).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use candle_core::Device;
use candle_nn::VarBuilder;

use super::checkpoint::ModelError;
use crate::image::ImageBatch;
use crate::interrupt::Interrupt;
use crate::models::autoencoder::Sd1Vae;
use crate::models::layout::{ldm_to_candle, vae_layout, Component, ModelConfig, VAE_PREFIX};
use crate::models::safetensors::{SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::models::CheckpointModels;
use crate::sampling::Tensor;
use crate::vae;

/// Where a `VAE` handle's networks come from.
pub enum Autoencoder {
    /// A checkpoint's autoencoder.
    Checkpoint(Arc<CheckpointModels>),
    /// A standalone VAE file.
    File(Arc<StandaloneVae>),
}

/// An autoencoder loaded from its own file.
pub struct StandaloneVae {
    vae: Sd1Vae,
    device: Device,
    latent_channels: usize,
    config: ModelConfig,
}

impl Autoencoder {
    /// Decodes VAE-space latents `[batch, channels, h, w]` into images; `stop` is asked
    /// between the decoder's blocks.
    pub fn decode(&self, latent: &Tensor, stop: Interrupt<'_>) -> anyhow::Result<ImageBatch> {
        let (vae, device, channels) = self.parts();
        vae::decode_interruptible(vae, device, channels, latent, stop)
    }

    /// Encodes an RGB batch (sides multiples of 8) into VAE-space latents (posterior mean);
    /// `stop` is asked between the encoder's blocks.
    pub fn encode(&self, image: &ImageBatch, stop: Interrupt<'_>) -> anyhow::Result<Tensor> {
        let (vae, device, _) = self.parts();
        vae::encode_interruptible(vae, device, image, stop)
    }

    /// The networks, where they live, and their latent channels.
    fn parts(&self) -> (&Sd1Vae, &Device, usize) {
        match self {
            Autoencoder::Checkpoint(models) => (&models.vae, &models.device, models.config.latent_channels),
            Autoencoder::File(own) => (&own.vae, &own.device, own.latent_channels),
        }
    }

    /// The layout of these networks.
    pub fn config(&self) -> &ModelConfig {
        match self {
            Autoencoder::Checkpoint(models) => &models.config,
            Autoencoder::File(own) => &own.config,
        }
    }
}

impl StandaloneVae {
    /// Loads the VAE file at `path` (called `name` in messages) onto `device`.
    pub fn load(path: &Path, name: &str, device: &Device) -> Result<StandaloneVae, ModelError> {
        let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)
            .map_err(|e| ModelError::from_checkpoint(&e, path, name))?;
        let prefix = |n: &str| {
            if n.starts_with(VAE_PREFIX) {
                n.to_string()
            } else {
                format!("{VAE_PREFIX}{n}")
            }
        };
        let by_name: HashMap<String, &str> = index.tensors.keys().map(|k| (prefix(k), k.as_str())).collect();
        let width = by_name
            .get(&format!("{VAE_PREFIX}encoder.conv_in.weight"))
            .and_then(|k| index.tensors[*k].shape.first().copied());
        let cfg = match width {
            Some(128) => ModelConfig::sd1(),
            Some(32) => ModelConfig::tiny(),
            _ => {
                return Err(ModelError::Invalid(format!(
                    "{name}: not an SD1 VAE in the original layout (encoder.conv_in.weight missing or of another width)"
                )))
            }
        };
        let missing: Vec<String> = vae_layout(&cfg)
            .into_iter()
            .filter(|(n, shape)| {
                by_name
                    .get(&format!("{VAE_PREFIX}{n}"))
                    .is_none_or(|k| &index.tensors[*k].shape != shape)
            })
            .map(|(n, _)| n)
            .collect();
        if !missing.is_empty() {
            return Err(ModelError::Invalid(format!(
                "{name}: {} VAE tensors missing or mis-shaped, e.g. {}",
                missing.len(),
                missing[..missing.len().min(3)].join(", ")
            )));
        }
        Self::build(path, &cfg, &by_name, device)
            .map_err(|e| ModelError::Failed(format!("{name}: {e:#}").replace(&path.display().to_string(), name)))
    }

    fn build(
        path: &Path,
        cfg: &ModelConfig,
        by_name: &HashMap<String, &str>,
        device: &Device,
    ) -> anyhow::Result<StandaloneVae> {
        // SAFETY: a file just validated; like every mmap-based loader this assumes the operator
        // does not rewrite it while it is mapped.
        let mm = unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }?;
        let mut tensors = HashMap::new();
        for (ldm, stored) in by_name {
            if let Some((Component::Vae, target)) = ldm_to_candle(ldm, cfg) {
                // Converted to the autoencoder's precision by the VarBuilder below.
                tensors.insert(target, mm.load(stored, device)?);
            }
        }
        let dtype = crate::device::precisions(device).vae.dtype();
        let vae = Sd1Vae::new(VarBuilder::from_tensors(tensors, dtype, device), cfg).context("building the VAE")?;
        Ok(StandaloneVae {
            vae,
            device: device.clone(),
            latent_channels: cfg.latent_channels,
            config: cfg.clone(),
        })
    }
}

/// Writes a random-weight standalone VAE of layout `cfg` (original names, no prefix).
pub fn write_random_vae(path: &Path, cfg: &ModelConfig, seed: u64) -> std::io::Result<()> {
    let mut g = crate::sampling::TorchGenerator::new(seed);
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = vae_layout(cfg)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let data = if name.contains("norm") && shape.len() == 1 {
                vec![if name.ends_with(".weight") { 1.0 } else { 0.0 }; n]
            } else {
                g.randn(n).into_iter().map(|v| v * 0.02).collect()
            };
            (name, shape, data)
        })
        .collect();
    crate::models::safetensors::write_f32_safetensors(path, &tensors, &Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standalone_vae_files_load_decode_and_encode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-vae.safetensors");
        write_random_vae(&path, &ModelConfig::tiny(), 4).unwrap();
        let own = Autoencoder::File(Arc::new(
            StandaloneVae::load(&path, "tiny-vae.safetensors", &Device::Cpu).unwrap(),
        ));
        let image = own.decode(&Tensor::zeros(vec![1, 4, 3, 5]), Interrupt::NEVER).unwrap();
        assert_eq!((image.width, image.height), (10, 6));
        let back = own
            .encode(&crate::image::empty(16, 8, 1, 0x336699).unwrap(), Interrupt::NEVER)
            .unwrap();
        assert_eq!(back.shape, vec![1, 4, 4, 8]);
        // A checkpoint's `first_stage_model.` tensors load as a VAE too.
        let ckpt = dir.path().join("tiny.safetensors");
        crate::models::write_random_checkpoint(&ckpt, &ModelConfig::tiny(), 1).unwrap();
        assert!(StandaloneVae::load(&ckpt, "tiny.safetensors", &Device::Cpu).is_ok());
        let junk = dir.path().join("junk.safetensors");
        std::fs::write(&junk, b"junk").unwrap();
        assert_eq!(
            StandaloneVae::load(&junk, "junk", &Device::Cpu).err().map(|e| e.code()),
            Some("invalid_model")
        );
    }
}
