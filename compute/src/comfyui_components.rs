//! SDXL's components against ComfyUI itself, on reduced configurations: the fixtures of
//! `tests/fixtures/sdxl-components/` were made by ComfyUI imported as a library
//! (`make_components.py` there) from random weights stored in the single-file names.
//! - `unet.safetensors`: an SDXL-shaped UNet (no attention at level 0, deeper levels below,
//!   16-wide heads, linear projections, label embedding) on two inputs at two timesteps;
//! - `clip_g.safetensors`: a reduced OpenCLIP bigG under SDXL's prefix: the penultimate
//!   hidden states and the projected pooled output of two prompts;
//! - `adm.safetensors`: the SDXL and refiner size-conditioning vectors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::diffusion::adm::{adm_vector, PromptKind};
use super::diffusion::lora::load_component;
use super::diffusion::{CondEntry, SizeConditioning};
use super::interrupt::Interrupt;
use super::models::layout::{ClipConfig, Family, Heads, SDXL_CLIP_G_PREFIX};
use super::models::{ClipText, Component, ModelConfig, Unet};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sdxl-components")
        .join(name)
}

/// Every tensor of a fixture file, float tensors as float32.
fn tensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    Ok(candle_core::safetensors::load(path, &Device::Cpu)?)
}

/// The largest difference between `ours` and `want`, against `want`'s largest magnitude.
fn relative_gap(ours: &Tensor, want: &Tensor) -> Result<(f32, f32)> {
    let ours = ours.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let want = want.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    anyhow::ensure!(ours.len() == want.len(), "sizes {} and {}", ours.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = ours.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    Ok((worst, scale))
}

/// The fixture UNet's configuration, as `make_components.py` built it in ComfyUI.
fn reduced_unet() -> ModelConfig {
    ModelConfig {
        model_channels: 32,
        channel_mult: vec![1, 1, 2],
        num_res_blocks: 2,
        transformer_depth: vec![0, 0, 2, 2, 1, 1],
        transformer_depth_middle: Some(1),
        transformer_depth_output: vec![0, 0, 0, 2, 2, 2, 1, 1, 1],
        heads: Heads::Width(16),
        linear_projection: true,
        adm_in_channels: Some(40),
        context_dim: 48,
        ..ModelConfig::tiny_sdxl()
    }
}

#[test]
fn sdxl_unet_with_its_label_embedding_matches_comfyui() -> Result<()> {
    let path = fixture("unet.safetensors");
    let cfg = reduced_unet();
    let weights = load_component(&path, &cfg, Component::Unet, &Device::Cpu)?;
    let unet = Unet::new(VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu), &cfg)?;
    let io = tensors(&path)?;
    let get = |name: &str| io.get(name).with_context(|| name.to_string());
    let timesteps: Vec<f32> = get("input.timesteps")?.to_vec1()?;
    for (row, &t) in timesteps.iter().enumerate() {
        let pick = |name: &str| -> Result<Tensor> { Ok(get(name)?.narrow(0, row, 1)?) };
        let y = pick("input.y")?;
        let ours = unet.forward(&pick("input.x")?, t as f64, &pick("input.context")?, Some(&y))?;
        let (worst, scale) = relative_gap(&ours, &pick("output")?)?;
        assert!(scale > 0.1, "a degenerate output proves nothing");
        assert!(worst <= 1e-4 * scale, "row {row} (t = {t}): {worst} against {scale}");
    }
    Ok(())
}

#[test]
fn openclip_big_g_penultimate_and_projected_pooled_output_match_comfyui() -> Result<()> {
    let path = fixture("clip_g.safetensors");
    let clip = ClipConfig {
        width: 16,
        layers: 3,
        heads: 4,
        intermediate: 64,
        ..ClipConfig::big_g(SDXL_CLIP_G_PREFIX)
    };
    let cfg = ModelConfig {
        text: vec![clip.clone()],
        ..ModelConfig::tiny_sdxl()
    };
    let weights = load_component(&path, &cfg, Component::Clip(0), &Device::Cpu)?;
    let model = ClipText::new(VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu), &clip)?;
    let io = tensors(&path)?;
    let tokens = io.get("input.tokens").context("tokens")?.to_dtype(DType::U32)?;
    let ids: Vec<Vec<u32>> = tokens.to_vec2()?;
    // ComfyUI pools at the first end token; bigG pads with 0 after it.
    let at: Vec<usize> = ids
        .iter()
        .map(|row| row.iter().position(|&t| t == 49407).unwrap_or(0))
        .collect();
    let embeds = model
        .token_embeddings(&ids.concat())?
        .reshape((ids.len(), ids[0].len(), clip.width))?;
    let out = model.encode(&embeds, clip.layers - 1, false, Some(&at), Interrupt::NEVER)?;
    for (name, ours) in [
        ("output.penultimate", &out.hidden),
        ("output.pooled", &out.pooled.context("pooled")?),
    ] {
        let (worst, scale) = relative_gap(ours, io.get(name).context(name)?)?;
        assert!(worst <= 1e-5 * scale.max(1.0), "{name}: {worst} against {scale}");
    }
    Ok(())
}

#[test]
fn sdxl_and_refiner_size_conditioning_match_comfyui() -> Result<()> {
    let io = tensors(&fixture("adm.safetensors"))?;
    let get = |name: &str| io.get(name).cloned().with_context(|| name.to_string());
    let entry = |pooled: Tensor, size: SizeConditioning| CondEntry {
        context: Tensor::zeros((1, 77, 8), DType::F32, &Device::Cpu).expect("zeros"),
        pooled: Some(pooled),
        size,
        area: None,
        area_fraction: None,
        mask: None,
        strength: 1.0,
        timestep_range: None,
        concat_latent_image: None,
        concat_mask: None,
        control: None,
    };
    let sized = SizeConditioning {
        width: Some(832.0),
        height: Some(1216.0),
        crop_w: Some(16.0),
        crop_h: Some(8.0),
        ..Default::default()
    };
    let check = |family: Family, size: SizeConditioning, pooled: &str, kind: PromptKind, want: &str| -> Result<()> {
        let ours = adm_vector(family, &entry(get(pooled)?, size), (1, 1), kind)?.context("a vector")?;
        // The pooled half is copied; the size embeddings are sinusoids of arguments up to
        // 1216, where one float32 ulp of a frequency (libm's `exp` against PyTorch's
        // vectorised one) moves the value by about 7e-5.
        let (worst, scale) = relative_gap(&ours, &get(want)?)?;
        assert!(worst <= 1e-4, "{want}: {worst} against {scale}");
        Ok(())
    };
    let targets = SizeConditioning {
        target_width: Some(1024.0),
        target_height: Some(1024.0),
        ..sized
    };
    check(
        Family::Sdxl,
        targets,
        "input.pooled",
        PromptKind::Positive,
        "output.sdxl",
    )?;
    let refiner = "input.pooled_refiner";
    let score = |s: f64| SizeConditioning {
        aesthetic_score: Some(s),
        ..sized
    };
    check(
        Family::SdxlRefiner,
        score(6.0),
        refiner,
        PromptKind::Negative,
        "output.refiner_ascore_6",
    )?;
    check(
        Family::SdxlRefiner,
        score(2.5),
        refiner,
        PromptKind::Positive,
        "output.refiner_ascore_2_5",
    )?;
    check(
        Family::SdxlRefiner,
        sized,
        refiner,
        PromptKind::Positive,
        "output.refiner_default_positive",
    )?;
    check(
        Family::SdxlRefiner,
        sized,
        refiner,
        PromptKind::Negative,
        "output.refiner_default_negative",
    )
}
