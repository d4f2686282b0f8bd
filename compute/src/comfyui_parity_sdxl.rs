//! Parity with ComfyUI on a full-size SDXL checkpoint: the cases of
//! `tests/fixtures/sdxl-parity/` (ComfyUI's default graph on an SDXL checkpoint at 256x256, 4
//! steps, euler / normal and dpmpp_2m / karras, and the same through `CLIPTextEncodeSDXL`) run
//! through weft's text encoders, sampler and VAE, and must give ComfyUI's latent and PNG
//! within the fixture README's tolerances.
//!
//! The checkpoint is the seed-0 random-weight SDXL file (6.9 GB), written once per machine
//! into [`random_checkpoint::cache_dir`] and reused by later runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::Device;
use serde_json::Value;

use super::comfyui_parity::{png_values, LatentGap};
use super::diffusion::{
    ksample, Conditioning, DiffusionModel, EncoderTexts, SampleSettings, SizeConditioning, TextEncoder,
};
use super::interrupt::Interrupt;
use super::models::{load_models, random_checkpoint, ModelConfig, SafetensorsIndex, DEFAULT_MAX_HEADER};
use super::sampling::StepControl;
use super::vae;
use super::values::LatentBatch;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sdxl-parity")
}

/// A case's conditioning for `side` (`positive` or `negative`): one text through both
/// encoders (`CLIPTextEncode`), or `text_g` and `text_l` with the case's size conditioning
/// (`CLIPTextEncodeSDXL`).
fn conditioning(encoder: &TextEncoder, params: &Value, side: &str) -> Result<Conditioning> {
    let never = Interrupt::NEVER;
    if let Some(text) = params[side].as_str() {
        let e = encoder.encode(text, None, never)?;
        return Ok(Conditioning::from_encoded(
            e.context,
            e.pooled,
            SizeConditioning::default(),
        ));
    }
    let text = |key: &str| params[side][key].as_str().context(format!("{side}.{key}"));
    let texts = EncoderTexts {
        clip_l: text("text_l")?,
        clip_g: text("text_g")?,
    };
    let e = encoder.encode_each(texts, None, never)?;
    let s = &params["size_conditioning"];
    let number = |key: &str| s[key].as_f64();
    let size = SizeConditioning {
        width: number("width"),
        height: number("height"),
        crop_w: number("crop_w"),
        crop_h: number("crop_h"),
        target_width: number("target_width"),
        target_height: number("target_height"),
        aesthetic_score: None,
    };
    Ok(Conditioning::from_encoded(e.context, e.pooled, size))
}

/// The sampler settings of a case's parameters.
fn settings(p: &Value) -> Result<SampleSettings> {
    let number = |key: &str| p[key].as_f64().context(key.to_string());
    let text = |key: &str| p[key].as_str().context(key.to_string());
    Ok(SampleSettings {
        seed: number("seed")? as u64,
        steps: number("steps")? as usize,
        cfg: number("cfg")?,
        sampler: text("sampler_name")?.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        scheduler: text("scheduler")?.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        denoise: number("denoise")?,
        add_noise: true,
        start_step: 0,
        last_step: usize::MAX,
        force_full_denoise: false,
    })
}

/// One checkpoint load (6.9 GB of float16, held as float32) for every case.
#[test]
fn sdxl_default_graph_and_clip_text_encode_sdxl_match_comfyui() -> Result<()> {
    let checkpoint = random_checkpoint::SDXL.cached_seed0(&random_checkpoint::cache_dir())?;
    let models = Arc::new(load_models(&checkpoint, &ModelConfig::sdxl(), &Device::Cpu)?);
    let cases: Value = serde_json::from_slice(&std::fs::read(fixtures().join("cases.json"))?)?;
    let encoder = TextEncoder::new(models.clone(), checkpoint.clone());
    let model = DiffusionModel::new(models.clone(), checkpoint.clone());
    for name in ["a", "c", "x"] {
        let p = &cases["cases"][name]["params"];
        let positive = conditioning(&encoder, p, "positive")?;
        let negative = conditioning(&encoder, p, "negative")?;
        let (width, height) = (
            p["width"].as_u64().context("width")?,
            p["height"].as_u64().context("height")?,
        );
        let shape = [1, 4, height as u32 / 8, width as u32 / 8];
        let empty = LatentBatch {
            shape,
            data: vec![0.0; shape.iter().product::<u32>() as usize],
            noise_mask: None,
            batch_index: None,
        };
        let never = Interrupt::NEVER;
        let latent = ksample(
            &model,
            &positive,
            &negative,
            &empty,
            &settings(p)?,
            &mut |_| StepControl::Continue,
            never,
        )?;

        let saved = SafetensorsIndex::open(&fixtures().join(format!("case_{name}.latent")), DEFAULT_MAX_HEADER)?;
        let want = saved.read_f32("latent_tensor")?;
        let gap = LatentGap::measure(&latent.data, &want);
        eprintln!(
            "SDXL case {name}: latent max |diff| {:.3e} (limit {:.3e}), mean {:.3e} (limit {:.3e})",
            gap.max_diff, gap.max_limit, gap.mean_diff, gap.mean_limit
        );
        let image = vae::decode(
            &models,
            &crate::sampling::Tensor::new(shape.map(|d| d as usize).to_vec(), latent.data),
        )?;
        let ours = png_values(&crate::codecs::encode_png(&image, 0, &[])?)?;
        let theirs = png_values(&std::fs::read(fixtures().join(format!("case_{name}.png")))?)?;
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap_or(0);
        let differing = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count() as f64 / ours.len() as f64;
        eprintln!(
            "SDXL case {name}: PNG worst {worst}/255, {:.4}% of values differ",
            100.0 * differing
        );
        assert!(gap.within(), "case {name}: latent outside the tolerances");
        assert_eq!(ours.len(), theirs.len(), "case {name}: image size");
        assert!(
            worst <= 3 && differing <= 0.01,
            "case {name}: PNG outside the tolerances"
        );
    }
    Ok(())
}
