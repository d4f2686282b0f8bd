//! Loads an original-layout checkpoint (SD1.x, SDXL, the SDXL refiner) into weft's UNet,
//! autoencoder and CLIP text transformers, on the device chosen by
//! [`crate::device::select_device`], in the precisions [`crate::device::precisions`] gives
//! (float32 on the CPU, a half-precision file's layer matrices held as stored and widened per
//! call; on a GPU the tensors are uploaded as stored and converted there: `storage`).
//!
//! The checkpoint is validated by [`open_checkpoint`] first (header cap, bounds, shapes, dtypes, arch),
//! then read tensor by tensor; tensors are renamed with [`ldm_to_candle`]. Errors from validation are
//! [`CheckpointError`](crate::models::CheckpointError)s inside the returned
//! `anyhow::Error` (use `downcast_ref`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::device::{Precision, Precisions};
use crate::models::autoencoder::Sd1Vae;
use crate::models::clip_text::ClipText;
use crate::models::layout::{ldm_to_candle, network_shape, open_checkpoint, Component, ModelConfig};
use crate::models::safetensors::{CheckpointError, SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::models::separate::{self, UnetKeys};
use crate::models::storage;
use crate::models::unet::Unet;

/// A checkpoint's networks.
pub struct CheckpointModels {
    /// Denoising UNet (EPS prediction), shared with the `MODEL`s made from it.
    pub unet: Arc<Unet>,
    /// KL autoencoder (encoding gives the posterior's mean, as ComfyUI's).
    pub vae: Sd1Vae,
    /// The text encoders, in the order of the configuration's `text` (SD1: ViT-L; SDXL:
    /// ViT-L and bigG; smaller for test layouts).
    pub text: Vec<ClipText>,
    /// The layout these networks were built from.
    pub config: ModelConfig,
    /// The device holding the weights.
    pub device: Device,
    /// The precision each network holds its weights and computes in.
    pub precisions: Precisions,
    /// Bytes of weights held.
    pub bytes: u64,
}

/// candle-transformers' configuration of the autoencoder of `cfg` (the reference of weft's
/// autoencoder in tests).
#[cfg(test)]
pub(crate) fn vae_config(cfg: &ModelConfig) -> candle_transformers::models::stable_diffusion::vae::AutoEncoderKLConfig {
    candle_transformers::models::stable_diffusion::vae::AutoEncoderKLConfig {
        block_out_channels: cfg.vae_mult.iter().map(|m| m * cfg.vae_channels).collect(),
        layers_per_block: cfg.vae_res_blocks,
        latent_channels: cfg.latent_channels,
        norm_num_groups: 32,
        use_quant_conv: true,
        use_post_quant_conv: true,
    }
}

/// Loads the stock SD1.x networks from `path`.
pub fn load_sd1(path: &Path, device: &Device) -> Result<CheckpointModels> {
    load_models(path, &ModelConfig::sd1(), device)
}

/// Loads networks of layout `cfg` from `path`, each in the precision
/// [`crate::device::precisions`] gives it on `device`.
pub fn load_models(path: &Path, cfg: &ModelConfig, device: &Device) -> Result<CheckpointModels> {
    let precisions = crate::device::precisions(device);
    let index = open_checkpoint(path, cfg, DEFAULT_MAX_HEADER)?;
    // Tensor by tensor, as `storage` holds them: on the CPU, the layer matrices of a half-
    // precision file as stored and the rest widened to float32 in parallel (the file is not
    // mapped, so only what is held counts against the process's memory); on a GPU, uploaded
    // as stored and converted there.
    let mut parts: HashMap<Component, HashMap<String, Tensor>> = HashMap::new();
    for name in index.tensors.keys() {
        let Some((component, target)) = ldm_to_candle(name, cfg) else {
            continue;
        };
        let dtype = precision_of(&precisions, component).dtype();
        let t = storage::read_tensor(&index, name, &target, device, dtype)?;
        parts.entry(component).or_default().insert(target, t);
    }
    let bytes = parts.values().map(tensor_bytes).sum();
    let mut take = |c: Component| parts.remove(&c).unwrap_or_default();
    let unet_vb = storage::var_builder(take(Component::Unet), precisions.unet.dtype(), device);
    let unet = Arc::new(Unet::new(unet_vb, cfg).context("building the UNet")?);
    let vae_vb = storage::var_builder(take(Component::Vae), precisions.vae.dtype(), device);
    let vae = Sd1Vae::new(vae_vb, cfg).context("building the VAE")?;
    let text = cfg
        .text
        .iter()
        .enumerate()
        .map(|(i, clip)| {
            let vb = storage::var_builder(take(Component::Clip(i)), precisions.text.dtype(), device);
            ClipText::new(vb, clip).with_context(|| format!("building {}", clip.name))
        })
        .collect::<Result<_>>()?;
    tracing::info!(path = %path.display(), "networks loaded ({})", precisions.describe());
    Ok(CheckpointModels {
        unet,
        vae,
        text,
        config: cfg.clone(),
        device: device.clone(),
        precisions,
        bytes,
    })
}

/// A UNet without the rest of a checkpoint: a checkpoint's, or one loaded from its own file
/// (`UNETLoader`).
pub struct UnetModels {
    /// The UNet.
    pub unet: Arc<Unet>,
    /// The layout it was built from (the family's text encoders and VAE included, unused).
    pub config: ModelConfig,
    /// The device holding the weights.
    pub device: Device,
    /// The precision each network holds its weights and computes in.
    pub precisions: Precisions,
    /// Bytes of weights held (0 for a checkpoint's UNet: the checkpoint counts them).
    pub bytes: u64,
}

/// Text encoders without the rest of a checkpoint: a checkpoint's, or loaded from their own
/// files (`CLIPLoader`, `DualCLIPLoader`).
pub struct TextModels {
    /// The text encoders, in the order of the configuration's `text`.
    pub text: Vec<ClipText>,
    /// The layout they belong to (the family's UNet and VAE included, unused).
    pub config: ModelConfig,
    /// The device holding the weights.
    pub device: Device,
    /// The precision each network holds its weights and computes in.
    pub precisions: Precisions,
    /// Bytes of weights held (0 for a checkpoint's encoders: the checkpoint counts them).
    pub bytes: u64,
}

impl CheckpointModels {
    /// The checkpoint's UNet, sharing its weights.
    pub fn unet_part(&self) -> UnetModels {
        UnetModels {
            unet: self.unet.clone(),
            config: self.config.clone(),
            device: self.device.clone(),
            precisions: self.precisions,
            bytes: 0,
        }
    }

    /// The checkpoint's text encoders, sharing their weights.
    pub fn text_part(&self) -> TextModels {
        TextModels {
            text: self.text.clone(),
            config: self.config.clone(),
            device: self.device.clone(),
            precisions: self.precisions,
            bytes: 0,
        }
    }
}

/// Loads the UNet file at `path` (keys in style `keys`, layout `cfg`, checked with
/// [`separate::check_unet`] first) onto `device`.
pub fn load_unet(path: &Path, cfg: &ModelConfig, keys: UnetKeys, device: &Device) -> Result<UnetModels> {
    let precisions = crate::device::precisions(device);
    let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)?;
    separate::check_unet(&index, cfg, keys).map_err(|detail| CheckpointError::WrongArch {
        path: path.to_path_buf(),
        detail,
    })?;
    let dtype = precisions.unet.dtype();
    let tensors = separate::unet_tensors(&index, cfg, keys, device, dtype)?;
    let bytes = tensor_bytes(&tensors);
    let unet = Unet::new(storage::var_builder(tensors, dtype, device), cfg).context("building the UNet")?;
    tracing::info!(path = %path.display(), "UNet loaded ({})", precisions.describe());
    Ok(UnetModels {
        unet: Arc::new(unet),
        config: cfg.clone(),
        device: device.clone(),
        precisions,
        bytes,
    })
}

/// Loads the text encoders of layout `cfg` from their own Hugging Face layout files, one
/// `(path, key prefix)` per encoder of `cfg.text` in its order, onto `device`.
pub fn load_text(files: &[(std::path::PathBuf, String)], cfg: &ModelConfig, device: &Device) -> Result<TextModels> {
    let precisions = crate::device::precisions(device);
    let dtype = precisions.text.dtype();
    if files.len() != cfg.text.len() {
        anyhow::bail!("{} text-encoder files for {} encoders", files.len(), cfg.text.len());
    }
    let mut text = Vec::with_capacity(files.len());
    let mut bytes = 0;
    for ((path, prefix), clip) in files.iter().zip(&cfg.text) {
        let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)?;
        separate::check_clip(&index, prefix, clip).map_err(|detail| CheckpointError::WrongArch {
            path: path.clone(),
            detail,
        })?;
        let tensors = separate::clip_tensors(&index, prefix, clip, device, dtype)?;
        bytes += tensor_bytes(&tensors);
        let vb = storage::var_builder(tensors, dtype, device);
        text.push(ClipText::new(vb, clip).with_context(|| format!("building {}", clip.name))?);
    }
    Ok(TextModels {
        text,
        config: cfg.clone(),
        device: device.clone(),
        precisions,
        bytes,
    })
}

/// Bytes of `tensors`' elements.
fn tensor_bytes(tensors: &HashMap<String, Tensor>) -> u64 {
    tensors
        .values()
        .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
        .sum()
}

/// The precision `precisions` gives the network `component` belongs to.
pub fn precision_of(precisions: &Precisions, component: Component) -> Precision {
    match component {
        Component::Unet => precisions.unet,
        Component::Vae => precisions.vae,
        Component::Clip(_) => precisions.text,
    }
}

/// Checks the LDM -> candle name mapping of layout `cfg` against the names and shapes
/// candle-transformers actually requests when building the networks, without allocating
/// weights (every tensor is a broadcast zero). Returns the layout tensors candle never asked for.
pub fn verify_mapping(cfg: &ModelConfig) -> Result<Vec<String>> {
    use std::sync::{Arc, Mutex};

    use crate::models::layout::checkpoint_layout;

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
        let shape = network_shape(&n, &shape);
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
                Unet::new(vb, cfg)?;
            }
            Component::Vae => {
                Sd1Vae::new(vb, cfg)?;
            }
            Component::Clip(i) => {
                ClipText::new(vb, &cfg.text[i])?;
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

/// The tiny model written with `seed` into a fresh directory and loaded on the CPU, for
/// tests; the directory holds the mapped file and must outlive the models.
#[cfg(test)]
pub(crate) fn tiny_test_models(seed: u64) -> Result<(tempfile::TempDir, CheckpointModels)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tiny.safetensors");
    let cfg = ModelConfig::tiny();
    super::layout::write_random_checkpoint(&path, &cfg, seed)?;
    let models = load_models(&path, &cfg, &Device::Cpu)?;
    Ok((dir, models))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::models::layout::{checkpoint_layout, write_random_checkpoint};
    use crate::models::safetensors::{write_f32_safetensors, CheckpointError};

    fn tiny_file(dir: &tempfile::TempDir) -> Result<PathBuf> {
        let p = dir.path().join("tiny.safetensors");
        write_random_checkpoint(&p, &ModelConfig::tiny(), 3)?;
        Ok(p)
    }

    fn load_err(path: &Path, cfg: &ModelConfig) -> CheckpointError {
        match load_models(path, cfg, &Device::Cpu) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => match e.downcast::<CheckpointError>() {
                Ok(c) => c,
                Err(e) => panic!("not a CheckpointError: {e:#}"),
            },
        }
    }

    /// Rewrites the JSON header of `src` with `edit` applied, into `dst`.
    fn rewrite_header(src: &Path, dst: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
        let bytes = std::fs::read(src).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        edit(&mut header);
        let mut json = serde_json::to_vec(&header).unwrap();
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let mut out = (json.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&json);
        out.extend_from_slice(&bytes[8 + n..]);
        std::fs::write(dst, out).unwrap();
    }

    #[test]
    fn full_sd1_mapping_matches_candle() -> Result<()> {
        let unused = verify_mapping(&ModelConfig::sd1())?;
        assert!(unused.is_empty(), "layout tensors candle never requested: {unused:?}");
        let unused = verify_mapping(&ModelConfig::tiny())?;
        assert!(unused.is_empty(), "{unused:?}");
        Ok(())
    }

    #[test]
    fn tiny_checkpoint_runs() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let p = tiny_file(&dir)?;
        let cfg = ModelConfig::tiny();
        let dev = Device::Cpu;
        let m = load_models(&p, &cfg, &dev)?;
        let x = Tensor::randn(0f32, 1.0, (1, 4, 8, 8), &dev)?;
        let ids = Tensor::new(&[[49406u32, 320, 1125, 49407]], &dev)?;
        let ctx = m.text[0].forward(&ids)?;
        assert_eq!(ctx.dims(), &[1, 4, cfg.context_dim]);
        let eps = m.unet.forward(&x, 999.0, &ctx, None)?;
        assert_eq!(eps.dims(), &[1, 4, 8, 8]);
        let img = m.vae.decode(&x)?;
        assert_eq!(img.dims(), &[1, 3, 16, 16]);
        // Encoding gives the posterior's mean: deterministic.
        let a = m.vae.encode(&img)?.flatten_all()?.to_vec1::<f32>()?;
        let b = m.vae.encode(&img)?.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(a, b);
        assert_eq!(a.len(), 4 * 8 * 8);
        Ok(())
    }

    /// A float16 checkpoint keeps its layer matrices in float16 on the CPU, holds less, and
    /// computes exactly what the same values widened to a float32 file compute.
    #[test]
    fn a_half_checkpoint_stays_half_and_computes_on_its_exact_values() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let dev = Device::Cpu;
        let f32s = candle_core::safetensors::load(tiny_file(&dir)?, &dev)?;
        let half: HashMap<String, Tensor> = f32s
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_dtype(DType::F16)?)))
            .collect::<Result<_>>()?;
        let widened: HashMap<String, Tensor> = half
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_dtype(DType::F32)?)))
            .collect::<Result<_>>()?;
        let (half_path, wide_path) = (dir.path().join("half.safetensors"), dir.path().join("wide.safetensors"));
        candle_core::safetensors::save(&half, &half_path)?;
        candle_core::safetensors::save(&widened, &wide_path)?;
        let cfg = ModelConfig::tiny();
        let (h, w) = (
            load_models(&half_path, &cfg, &dev)?,
            load_models(&wide_path, &cfg, &dev)?,
        );
        // The tiny layout is mostly its (widened) token embeddings; SDXL is mostly layer matrices.
        assert!(h.bytes < w.bytes, "{} bytes half, {} widened", h.bytes, w.bytes);
        let x = Tensor::randn(0f32, 1.0, (1, 4, 8, 8), &dev)?;
        let ids = Tensor::new(&[[49406u32, 320, 1125, 49407]], &dev)?;
        let same = |a: &Tensor, b: &Tensor| crate::max_abs_diff(a, b) == 0.0;
        let (ctx, ctx_w) = (h.text[0].forward(&ids)?, w.text[0].forward(&ids)?);
        assert!(same(&ctx, &ctx_w));
        let eps = h.unet.forward(&x, 999.0, &ctx, None)?;
        assert!(same(&eps, &w.unet.forward(&x, 999.0, &ctx, None)?));
        assert_eq!(eps.dtype(), DType::F32);
        assert!(same(&h.vae.decode(&x)?, &w.vae.decode(&x)?));
        Ok(())
    }

    #[test]
    fn truncated_file() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let p = tiny_file(&dir)?;
        let bytes = std::fs::read(&p)?;
        let t = dir.path().join("truncated.safetensors");
        for cut in [bytes.len() - 1, bytes.len() / 2, 20, 5, 0] {
            std::fs::write(&t, &bytes[..cut])?;
            let e = load_err(&t, &ModelConfig::tiny());
            assert!(
                matches!(e, CheckpointError::Truncated { .. } | CheckpointError::Malformed { .. }),
                "{cut}: {e}"
            );
            assert!(
                e.to_string().contains("truncated") || e.to_string().contains("malformed"),
                "{e}"
            );
        }
        Ok(())
    }

    #[test]
    fn oversized_header() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("huge-header.safetensors");
        // Claims a 200 MiB header; the cap is 100 MiB. The file itself stays tiny.
        let mut bytes = (200u64 * 1024 * 1024).to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{}");
        std::fs::write(&p, &bytes)?;
        let e = load_err(&p, &ModelConfig::tiny());
        assert!(matches!(e, CheckpointError::Malformed { .. }), "{e}");
        // An absurd length (u64::MAX) is rejected the same way, without allocating.
        std::fs::write(&p, u64::MAX.to_le_bytes())?;
        let e = load_err(&p, &ModelConfig::tiny());
        assert!(
            matches!(e, CheckpointError::Malformed { .. } | CheckpointError::Truncated { .. }),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn wrong_dtype() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let p = tiny_file(&dir)?;
        let bad = dir.path().join("int.safetensors");
        let victim = "model.diffusion_model.out.2.bias";
        rewrite_header(&p, &bad, |h| {
            // Same byte length (4 bytes per element), integer type.
            h[victim]["dtype"] = "I32".into();
        });
        let e = load_err(&bad, &ModelConfig::tiny());
        assert!(matches!(e, CheckpointError::MissingKeys { count: 1, .. }), "{e}");
        assert!(e.to_string().contains("I32"), "{e}");
        // A dtype whose size does not match the stored bytes is malformed.
        rewrite_header(&p, &bad, |h| h[victim]["dtype"] = "F16".into());
        assert!(matches!(
            load_err(&bad, &ModelConfig::tiny()),
            CheckpointError::Malformed { .. }
        ));
        Ok(())
    }

    #[test]
    fn missing_keys() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cfg = ModelConfig::tiny();
        let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = checkpoint_layout(&cfg)
            .into_iter()
            .filter(|(n, _)| !n.starts_with("first_stage_model.decoder."))
            .map(|(n, s)| {
                let len = s.iter().product();
                (n, s, vec![0.0; len])
            })
            .collect();
        let p = dir.path().join("no-decoder.safetensors");
        write_f32_safetensors(&p, &tensors, &BTreeMap::new())?;
        let e = load_err(&p, &cfg);
        let CheckpointError::MissingKeys {
            count, ref examples, ..
        } = e
        else {
            panic!("{e}");
        };
        assert!(count > 10, "{e}");
        assert!(examples.contains("first_stage_model.decoder."), "{e}");
        Ok(())
    }

    #[test]
    fn wrong_architecture() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cases: [(&str, Vec<usize>); 3] = [
            (
                "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
                vec![768],
            ),
            ("cond_stage_model.model.ln_final.weight", vec![1024]),
            ("lora_unet_down_blocks_0_attentions_0.alpha", vec![1]),
        ];
        for (i, (name, shape)) in cases.into_iter().enumerate() {
            let p = dir.path().join(format!("other{i}.safetensors"));
            let len = shape.iter().product();
            write_f32_safetensors(&p, &[(name.to_string(), shape, vec![1.0; len])], &BTreeMap::new())?;
            let e = load_err(&p, &ModelConfig::sd1());
            assert!(matches!(e, CheckpointError::WrongArch { .. }), "{name}: {e}");
            assert!(e.to_string().contains("unsupported model family"), "{e}");
        }
        // The tiny layout is not mistaken for a full SD1 checkpoint either.
        let p = tiny_file(&dir)?;
        assert!(matches!(
            load_err(&p, &ModelConfig::sd1()),
            CheckpointError::WrongArch { .. }
        ));
        Ok(())
    }
}
