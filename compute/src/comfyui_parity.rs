//! Parity with ComfyUI on a full-size SD1.5 checkpoint: the two cases of
//! `tests/fixtures/sd15-parity/` (ComfyUI's default graph at 256x256, 4 steps: euler /
//! normal and dpmpp_2m / karras) run through [`text_to_latent`] and the VAE, and must give
//! ComfyUI's latent and PNG within the tolerances of the fixture's README.
//!
//! The checkpoint is the seed-0 random-weight SD1.5 file (2.1 GB), written once per machine
//! into [`sd15_random::cache_dir`] and reused by later runs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Device;

use super::models::{load_sd1, sd15_random, SafetensorsIndex, DEFAULT_MAX_HEADER};
use super::sampling::StepControl;
use super::text_to_image::{text_to_latent, TextToImage};
use super::vae;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/sd15-parity")
}

/// Case `name`'s settings from the fixture's `cases.json`.
fn request(name: &str) -> Result<TextToImage> {
    let cases: serde_json::Value = serde_json::from_slice(&std::fs::read(fixtures().join("cases.json"))?)?;
    let p = &cases["cases"][name]["params"];
    let text = |key: &str| p[key].as_str().map(str::to_string).context(key.to_string());
    let number = |key: &str| p[key].as_f64().context(key.to_string());
    anyhow::ensure!(number("denoise")? == 1.0 && number("batch_size")? == 1.0);
    Ok(TextToImage {
        prompt: text("positive")?,
        negative: text("negative")?,
        width: number("width")? as u32,
        height: number("height")? as u32,
        seed: number("seed")? as u64,
        steps: number("steps")? as usize,
        cfg: number("cfg")? as f32,
        sampler: text("sampler_name")?.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
        scheduler: text("scheduler")?.parse().map_err(|e| anyhow::anyhow!("{e}"))?,
    })
}

/// The 8-bit RGB values of a PNG.
fn png_values(bytes: &[u8]) -> Result<Vec<u8>> {
    Ok(image::load_from_memory(bytes)?.to_rgb8().into_raw())
}

#[test]
fn sd15_default_graph_matches_comfyui() -> Result<()> {
    let checkpoint = sd15_random::cached_seed0(&sd15_random::cache_dir())?;
    let models = load_sd1(&checkpoint, &Device::Cpu)?;
    for name in ["a", "c"] {
        let req = request(name)?;
        let latent = text_to_latent(&models, &req, &mut |_| StepControl::Continue)?;

        let saved = SafetensorsIndex::open(&fixtures().join(format!("case_{name}.latent")), DEFAULT_MAX_HEADER)?;
        let want = saved.read_f32("latent_tensor")?;
        assert_eq!(latent.shape, saved.tensors["latent_tensor"].shape, "case {name}");
        let n = want.len() as f64;
        let mean = want.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (want.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let largest = want.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let diffs: Vec<f64> = latent
            .data
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b as f64).abs())
            .collect();
        let max_diff = diffs.iter().fold(0f64, |m, &d| m.max(d));
        let mean_diff = diffs.iter().sum::<f64>() / n;
        eprintln!(
            "case {name}: latent max |diff| {max_diff:.3e} (limit {:.3e}), mean {mean_diff:.3e} (limit {:.3e})",
            1e-3 * largest,
            1e-4 * std
        );
        assert!(
            max_diff <= 1e-3 * largest,
            "case {name}: latent max difference {max_diff}"
        );
        assert!(
            mean_diff <= 1e-4 * std,
            "case {name}: latent mean difference {mean_diff}"
        );

        let image = vae::decode(&models, &latent)?;
        let ours = png_values(&crate::codecs::encode_png(&image, 0, &[])?)?;
        let theirs = png_values(&std::fs::read(fixtures().join(format!("case_{name}.png")))?)?;
        assert_eq!(ours.len(), theirs.len(), "case {name}: image size");
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(&a, &b)| a.abs_diff(b))
            .max()
            .unwrap_or(0);
        let differing = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count() as f64 / ours.len() as f64;
        eprintln!(
            "case {name}: PNG worst {worst}/255, {:.4}% of values differ",
            100.0 * differing
        );
        assert!(worst <= 3, "case {name}: a PNG value differs by {worst}/255");
        assert!(
            differing <= 0.01,
            "case {name}: {:.2}% of PNG values differ",
            100.0 * differing
        );
    }
    Ok(())
}
