//! Loads an SD1.x original-layout checkpoint into candle-transformers' `stable_diffusion`
//! UNet, VAE and CLIP text encoder (CPU, float32).
//!
//! Needs `candle-core`, `candle-nn` and `candle-transformers` 0.9 (no default features).
//! The checkpoint is validated by [`open_sd1`] first (header cap, bounds, shapes, arch), then
//! memory-mapped; tensors are renamed with [`ldm_to_candle`].

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::stable_diffusion::{clip, unet_2d, vae};

use crate::compute::models::safetensors::DEFAULT_MAX_HEADER;
use crate::compute::models::sd1::{ldm_to_candle, open_sd1, Component, Sd1Config};

/// The three SD1 networks.
pub struct Sd1Models {
    /// Denoising UNet (EPS prediction).
    pub unet: unet_2d::UNet2DConditionModel,
    /// KL autoencoder.
    pub vae: vae::AutoEncoderKL,
    /// CLIP ViT-L/14 text encoder; `None` for non-standard configs (candle's CLIP config has
    /// private fields, so only the stock SD1 text encoder can be built).
    pub clip: Option<clip::ClipTextTransformer>,
}

/// candle UNet configuration for `cfg`.
pub fn unet_config(cfg: &Sd1Config) -> unet_2d::UNet2DConditionModelConfig {
    let blocks = cfg
        .channel_mult
        .iter()
        .zip(&cfg.attention)
        .map(|(&m, &attn)| unet_2d::BlockConfig {
            out_channels: m * cfg.model_channels,
            use_cross_attn: attn.then_some(1),
            attention_head_dim: 8,
        })
        .collect();
    unet_2d::UNet2DConditionModelConfig {
        blocks,
        layers_per_block: cfg.num_res_blocks,
        cross_attention_dim: cfg.context_dim,
        use_linear_projection: false,
        ..Default::default()
    }
}

/// candle VAE configuration for `cfg`.
pub fn vae_config(cfg: &Sd1Config) -> vae::AutoEncoderKLConfig {
    vae::AutoEncoderKLConfig {
        block_out_channels: cfg.vae_mult.iter().map(|m| m * cfg.vae_channels).collect(),
        layers_per_block: cfg.vae_res_blocks,
        latent_channels: cfg.latent_channels,
        norm_num_groups: 32,
        use_quant_conv: true,
        use_post_quant_conv: true,
    }
}

/// Loads the stock SD1.x networks from `path`.
pub fn load_sd1(path: &Path, device: &Device) -> Result<Sd1Models> {
    load_sd1_with_config(path, &Sd1Config::sd1(), device)
}

/// Loads networks of layout `cfg` from `path` (float32).
pub fn load_sd1_with_config(path: &Path, cfg: &Sd1Config, device: &Device) -> Result<Sd1Models> {
    let index = open_sd1(path, cfg, DEFAULT_MAX_HEADER)?;
    // SAFETY: the file was just validated; like every mmap-based loader we assume it is not
    // modified while mapped.
    let mm = unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }
        .with_context(|| format!("memory-mapping {}", path.display()))?;
    let mut parts: HashMap<Component, HashMap<String, Tensor>> = HashMap::new();
    for name in index.tensors.keys() {
        let Some((component, target)) = ldm_to_candle(name, cfg) else {
            continue;
        };
        let t = mm
            .load(name, device)
            .with_context(|| format!("loading tensor {name}"))?
            .to_dtype(DType::F32)?;
        parts.entry(component).or_default().insert(target, t);
    }
    let mut take = |c: Component| parts.remove(&c).unwrap_or_default();
    let unet_vb = VarBuilder::from_tensors(take(Component::Unet), DType::F32, device);
    let unet = unet_2d::UNet2DConditionModel::new(
        unet_vb,
        cfg.latent_channels,
        cfg.latent_channels,
        false,
        unet_config(cfg),
    )
    .context("building the UNet")?;
    let vae_vb = VarBuilder::from_tensors(take(Component::Vae), DType::F32, device);
    let vae = vae::AutoEncoderKL::new(vae_vb, 3, 3, vae_config(cfg)).context("building the VAE")?;
    let clip = if *cfg == Sd1Config::sd1() {
        let vb = VarBuilder::from_tensors(take(Component::Clip), DType::F32, device);
        Some(clip::ClipTextTransformer::new(vb, &clip::Config::v1_5()).context("building CLIP")?)
    } else {
        None
    };
    Ok(Sd1Models { unet, vae, clip })
}

/// Checks the LDM -> candle name mapping of layout `cfg` against the names and shapes
/// candle-transformers actually requests when building the networks, without allocating
/// weights (every tensor is a broadcast zero). Returns the layout tensors candle never asked for.
pub fn verify_mapping(cfg: &Sd1Config) -> Result<Vec<String>> {
    use std::sync::{Arc, Mutex};

    use crate::compute::models::sd1::checkpoint_layout;

    type Served = HashMap<String, (Vec<usize>, String)>;
    struct Layout {
        served: Served,
        used: Arc<Mutex<Vec<String>>>,
    }
    impl candle_nn::var_builder::SimpleBackend for Layout {
        fn get(
            &self,
            s: candle_core::Shape,
            name: &str,
            _h: candle_nn::Init,
            dtype: DType,
            dev: &Device,
        ) -> candle_core::Result<Tensor> {
            let (shape, ldm) = self
                .served
                .get(name)
                .ok_or_else(|| candle_core::Error::Msg(format!("candle wants '{name}', not in the layout")))?;
            if shape.as_slice() != s.dims() {
                return Err(candle_core::Error::Msg(format!(
                    "'{name}' (from {ldm}): layout {shape:?}, candle wants {:?}",
                    s.dims()
                )));
            }
            self.used.lock().expect("lock").push(name.to_string());
            Tensor::zeros((), dtype, dev)?.broadcast_as(s)
        }
        fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
            let (shape, _) = self
                .served
                .get(name)
                .ok_or_else(|| candle_core::Error::Msg(format!("candle wants '{name}'")))?;
            self.used.lock().expect("lock").push(name.to_string());
            Tensor::zeros((), dtype, dev)?.broadcast_as(shape.as_slice())
        }
        fn contains_tensor(&self, name: &str) -> bool {
            self.served.contains_key(name)
        }
    }

    let mut parts: HashMap<Component, Served> = HashMap::new();
    for (ldm, shape) in checkpoint_layout(cfg) {
        let (c, n) = ldm_to_candle(&ldm, cfg).ok_or_else(|| anyhow::anyhow!("unmapped {ldm}"))?;
        parts.entry(c).or_default().insert(n, (shape, ldm));
    }
    let dev = Device::Cpu;
    let mut unused = Vec::new();
    for (c, served) in parts {
        let used = Arc::new(Mutex::new(Vec::new()));
        let names: Vec<(String, String)> = served.iter().map(|(k, v)| (k.clone(), v.1.clone())).collect();
        let vb = VarBuilder::from_backend(
            Box::new(Layout {
                served,
                used: used.clone(),
            }),
            DType::F32,
            dev.clone(),
        );
        match c {
            Component::Unet => {
                unet_2d::UNet2DConditionModel::new(
                    vb,
                    cfg.latent_channels,
                    cfg.latent_channels,
                    false,
                    unet_config(cfg),
                )?;
            }
            Component::Vae => {
                vae::AutoEncoderKL::new(vb, 3, 3, vae_config(cfg))?;
            }
            Component::Clip => {
                if *cfg != Sd1Config::sd1() {
                    continue;
                }
                clip::ClipTextTransformer::new(vb, &clip::Config::v1_5())?;
            }
        }
        let used = used.lock().expect("lock");
        for (n, ldm) in names {
            if !used.contains(&n) {
                unused.push(ldm);
            }
        }
    }
    unused.sort();
    Ok(unused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::models::sd1::write_random_checkpoint;

    #[test]
    fn full_sd1_mapping_matches_candle() -> Result<()> {
        let unused = verify_mapping(&Sd1Config::sd1())?;
        assert!(unused.is_empty(), "layout tensors candle never requested: {unused:?}");
        let unused = verify_mapping(&Sd1Config::tiny())?;
        assert!(unused.is_empty(), "{unused:?}");
        Ok(())
    }

    #[test]
    fn tiny_checkpoint_runs() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("weft-candle-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let p = dir.join("tiny.safetensors");
        let cfg = Sd1Config::tiny();
        write_random_checkpoint(&p, &cfg, 3)?;
        let dev = Device::Cpu;
        let m = load_sd1_with_config(&p, &cfg, &dev)?;
        let x = Tensor::randn(0f32, 1.0, (1, 4, 8, 8), &dev)?;
        let ctx = Tensor::randn(0f32, 1.0, (1, 77, cfg.context_dim), &dev)?;
        let eps = m.unet.forward(&x, 999.0, &ctx)?;
        assert_eq!(eps.dims(), &[1, 4, 8, 8]);
        let img = m.vae.decode(&x)?;
        assert_eq!(img.dims(), &[1, 3, 16, 16]);
        let _ = m.vae.encode(&img)?;
        Ok(())
    }
}
