//! Parity with ComfyUI through the job API: the workflows that ComfyUI itself ran for
//! `tests/fixtures/sd15-parity/` and `tests/fixtures/sdxl-parity/` (its default graph plus
//! `SaveLatent` on the seed-0 random-weight SD1.5 and SDXL checkpoints, and SDXL's
//! `CLIPTextEncodeSDXL`) are submitted unchanged to `POST /api/v2/jobs`, and the saved PNG
//! and latent must equal ComfyUI's within the fixture READMEs' tolerances.
//!
//! The checkpoints (2.1 and 6.9 GB) are written once per machine into weft's cache directory
//! (by `weft models sd15-random` / `sdxl-random`, when missing) and hard-linked into a models
//! folder beside it.

mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::parity::{cached_checkpoint, latent_values, models_dir_with, run_long};
use support::{Options, Server};

/// One family's parity fixtures: ComfyUI's workflows and outputs on a seed-0 random-weight
/// checkpoint that `weft models <command>` writes.
struct Family {
    /// The fixture folder under `tests/fixtures/`.
    fixtures: &'static str,
    /// The file name the workflows load.
    checkpoint: &'static str,
    /// The `weft models` subcommand that writes it.
    command: &'static str,
    /// Its sha256, from the fixture's README.
    sha256: &'static str,
    /// The cases of `cases.json` to run.
    cases: &'static [&'static str],
}

const SD15: Family = Family {
    fixtures: "sd15-parity",
    checkpoint: "sd15-random-s0.safetensors",
    command: "sd15-random",
    sha256: "aa64b29d75cc3581c40496e21560f885b40078d8af1910f2f2282424b1636fe9",
    cases: &["a", "c"],
};

const SDXL: Family = Family {
    fixtures: "sdxl-parity",
    checkpoint: "sdxl-random-s0.safetensors",
    command: "sdxl-random",
    sha256: "937a6c69eb0d36f381b7b3c4ea9240014ffa8d2173f23ea7054488c8b8c968c8",
    cases: &["a", "c", "x"],
};

impl Family {
    fn fixtures(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(self.fixtures)
    }

    /// A models folder whose `checkpoints/` holds the cached checkpoint as a hard link,
    /// writing the checkpoint first if missing.
    fn models_dir(&self) -> PathBuf {
        let stem = self.checkpoint.trim_end_matches(".safetensors");
        let cached = cached_checkpoint(self.command, stem, self.sha256);
        models_dir_with(&cached, &format!("{}-models", self.fixtures), self.checkpoint)
    }
}

fn rgb(png: &[u8]) -> Vec<u8> {
    image::load_from_memory(png).unwrap().to_rgb8().into_raw()
}

#[test]
fn comfyuis_own_workflows_give_comfyuis_latent_and_png_through_the_job_api() {
    runs_like_comfyui(&SD15);
}

#[test]
fn comfyuis_own_sdxl_workflows_give_comfyuis_latent_and_png_through_the_job_api() {
    runs_like_comfyui(&SDXL);
}

/// Runs `family`'s cases through the job API and compares what they save with ComfyUI's
/// files, within the fixture README's tolerances.
fn runs_like_comfyui(family: &Family) {
    let models = family.models_dir();
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.display().to_string()],
        ..Default::default()
    });
    let fixtures = family.fixtures();
    let cases: Value = serde_json::from_slice(&std::fs::read(fixtures.join("cases.json")).unwrap()).unwrap();
    for &name in family.cases {
        let job = run_long(&server, cases["cases"][name]["workflow"].clone());
        assert_eq!(job["status"], "succeeded", "case {name}: {job}");
        let outputs: Vec<(String, Vec<u8>)> = job["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                let file = o["filename"].as_str().or(o["name"].as_str()).unwrap_or("").to_string();
                (file, server.download(o["url"].as_str().unwrap()))
            })
            .collect();
        let latent = outputs
            .iter()
            .find(|(file, _)| file.ends_with(".latent"))
            .unwrap_or_else(|| panic!("case {name}: no latent among {job}"));
        let png = outputs
            .iter()
            .find(|(_, bytes)| bytes.starts_with(b"\x89PNG\r\n\x1a\n"))
            .unwrap_or_else(|| panic!("case {name}: no PNG among {job}"));

        let (shape, ours) = latent_values(&latent.1);
        let (want_shape, want) = latent_values(&std::fs::read(fixtures.join(format!("case_{name}.latent"))).unwrap());
        assert_eq!(shape, want_shape, "case {name}: latent shape");
        let n = want.len() as f64;
        let mean = want.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (want.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        let largest = want.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
        let diffs: Vec<f64> = ours
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

        let (ours, theirs) = (
            rgb(&png.1),
            rgb(&std::fs::read(fixtures.join(format!("case_{name}.png"))).unwrap()),
        );
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
}
