//! Inpainting, black-box: ComfyUI's inpainting and outpainting example graphs on the seed-0
//! random-weight SD1.5 inpainting checkpoint (a UNet of 9 input channels) against what
//! ComfyUI itself saved for them (`tests/fixtures/inpaint/`), `InpaintModelConditioning`'s
//! catalogue entry against ComfyUI's, its conditioning ignored by an ordinary 4-channel
//! model, and malformed inpainting checkpoints refused with a clear error.
//!
//! The inpainting checkpoint (2.1 GB) is written once per machine into weft's cache
//! directory by `weft models sd15-inpaint-random` and hard-linked into a models folder
//! beside it, as `tests/parity.rs` does for its checkpoints.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::parity::{cached_checkpoint, latent_values, models_dir_with, run_long};
use support::{models_server, run_outputs, tiny_checkpoint, Options, Server};

/// The checkpoint the fixture's workflows load.
const CHECKPOINT: &str = "sd15-inpaint-random-s0.safetensors";
/// Its sha256, as `weft models sd15-inpaint-random --seed 0` writes it.
const SHA256: &str = "f9b22da57f5d2c479ff55b783c0555883f58b37bf2eb258170a757738980cdc5";
/// The fixture's cases.
const CASES: [&str; 4] = ["imc", "imc_nomask", "vefi", "outpaint"];

fn fixtures() -> PathBuf {
    support::root().join("tests/fixtures/inpaint")
}

/// A models folder whose `checkpoints/` holds the cached inpainting checkpoint as a hard
/// link, writing the checkpoint first if missing.
fn models_dir() -> PathBuf {
    let cached = cached_checkpoint(
        "sd15-inpaint-random",
        CHECKPOINT.trim_end_matches(".safetensors"),
        SHA256,
    );
    models_dir_with(&cached, "inpaint-models", CHECKPOINT)
}

/// `workflow` with its `LoadImage` nodes reading the uploaded assets `ids` (file name -> id)
/// instead of ComfyUI's input folder.
fn with_assets(mut workflow: Value, ids: &[(&str, String)]) -> Value {
    for node in workflow.as_object_mut().unwrap().values_mut() {
        if node["class_type"] == "LoadImage" {
            let file = node["inputs"]["image"].as_str().unwrap().to_string();
            let (_, id) = ids.iter().find(|(name, _)| *name == file).unwrap();
            node["inputs"]["image"] = json!({"__type": "core/ASSET", "info": {"id": id}});
        }
    }
    workflow
}

/// The latent within the sd15-parity README's tolerances of ComfyUI's: max |diff| at most
/// 1e-3 of ComfyUI's largest value, mean |diff| at most 1e-4 of its standard deviation.
fn assert_latent_close(name: &str, ours: &[f32], want: &[f32]) {
    assert_eq!(ours.len(), want.len(), "case {name}: latent size");
    let n = want.len() as f64;
    let mean = want.iter().map(|&v| v as f64).sum::<f64>() / n;
    let std = (want.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let largest = want.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
    let diffs: Vec<f64> = ours
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).abs())
        .collect();
    let max_diff = diffs.iter().fold(0f64, |m, &d| m.max(d));
    let mean_diff = diffs.iter().sum::<f64>() / n;
    assert!(
        max_diff <= 1e-3 * largest,
        "case {name}: latent max difference {max_diff}"
    );
    assert!(
        mean_diff <= 1e-4 * std,
        "case {name}: latent mean difference {mean_diff}"
    );
}

/// The PNG within the README's tolerances: every value within 3/255, at most 1% differing.
fn assert_png_close(name: &str, ours: &[u8], want: &[u8]) {
    let (ours, want) = (
        image::load_from_memory(ours).unwrap().to_rgb8(),
        image::load_from_memory(want).unwrap().to_rgb8(),
    );
    assert_eq!(ours.dimensions(), want.dimensions(), "case {name}: PNG size");
    let (ours, want) = (ours.into_raw(), want.into_raw());
    let worst = ours.iter().zip(&want).map(|(&a, &b)| a.abs_diff(b)).max().unwrap();
    let differing = ours.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert!(worst <= 3, "case {name}: a PNG value differs by {worst}");
    assert!(
        differing * 100 <= want.len(),
        "case {name}: {differing} PNG values differ"
    );
}

#[test]
fn comfyuis_inpainting_and_outpainting_graphs_give_comfyuis_latent_and_png() {
    let models = models_dir();
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.display().to_string()],
        ..Default::default()
    });
    let fixtures = fixtures();
    let ids: Vec<(&str, String)> = ["inpaint.png", "outpaint.png"]
        .into_iter()
        .map(|name| {
            let asset = server.upload(name, std::fs::read(fixtures.join(name)).unwrap());
            (name, asset["id"].as_str().unwrap().to_string())
        })
        .collect();
    let cases: Value = serde_json::from_slice(&std::fs::read(fixtures.join("cases.json")).unwrap()).unwrap();
    for name in CASES {
        let workflow = with_assets(cases["cases"][name]["workflow"].clone(), &ids);
        let job = run_long(&server, workflow);
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
        let latent = outputs.iter().find(|(file, _)| file.ends_with(".latent"));
        let latent = latent.unwrap_or_else(|| panic!("case {name}: no latent among {job}"));
        let png = outputs
            .iter()
            .find(|(_, bytes)| bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
        let png = png.unwrap_or_else(|| panic!("case {name}: no PNG among {job}"));
        let (shape, ours) = latent_values(&latent.1);
        let want_bytes = std::fs::read(fixtures.join(format!("case_{name}.latent"))).unwrap();
        let (want_shape, want) = latent_values(&want_bytes);
        assert_eq!(shape, want_shape, "case {name}: latent shape");
        assert_latent_close(name, &ours, &want);
        let want_png = std::fs::read(fixtures.join(format!("case_{name}.png"))).unwrap();
        assert_png_close(name, &png.1, &want_png);
    }
}

#[test]
fn inpaint_model_conditioning_declares_comfyuis_exact_spec() {
    let server = Server::start();
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let path = fixtures().join("specs.json");
    let specs: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (class, want) in specs.as_object().unwrap() {
        let got = &nodes[class];
        assert!(got.is_object(), "{class} is in the catalogue");
        assert_eq!(got["display_name"], want["display_name"], "{class}: display name");
        assert_eq!(got["category"], want["category"], "{class}: category");
        assert_eq!(got["output"], want["output"], "{class}: outputs");
        assert_eq!(got["output_name"], want["output_name"], "{class}: output names");
        let names: Vec<&Value> = want["required"].as_array().unwrap().iter().map(|f| &f[0]).collect();
        assert_eq!(got["input_order"]["required"], json!(names), "{class}: inputs");
        assert!(got["input"]
            .get("optional")
            .is_none_or(|o| o.as_object().is_none_or(|o| o.is_empty())));
        for field in want["required"].as_array().unwrap() {
            let entry = &got["input"]["required"][field[0].as_str().unwrap()];
            assert_eq!(entry[0], field[1], "{class}.{}: type", field[0]);
            for key in ["default", "min", "max", "step"] {
                assert_eq!(entry[1].get(key), field[2].get(key), "{class}.{}: {key}", field[0]);
            }
        }
    }
}

/// A `width` x `height` RGBA PNG whose alpha is 0 (masked, for `LoadImage`) in a block.
fn masked_png(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbaImage::from_fn(width, height, |x, y| {
        let hole = (width / 4..width / 2).contains(&x) && (height / 3..height * 2 / 3).contains(&y);
        image::Rgba([
            (x * 5) as u8,
            (y * 7) as u8,
            ((x + y) * 3) as u8,
            if hole { 0 } else { 255 },
        ])
    });
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    png
}

#[test]
fn an_ordinary_model_ignores_inpaint_model_conditionings_inputs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("checkpoints")).unwrap();
    tiny_checkpoint(&dir.path().join("checkpoints/tiny.safetensors"), 7);
    let server = models_server(dir.path());
    let asset = server.upload("masked.png", masked_png(64, 48));
    let image = json!({"__type": "core/ASSET", "info": {"id": asset["id"]}});
    let common = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": image}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny.safetensors"}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]}},
        "10": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "out"}},
    });
    let sampler = |positive: Value, negative: Value, latent: Value| {
        json!({"class_type": "KSampler", "inputs": {
            "seed": 5, "steps": 3, "cfg": 6.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0,
            "model": ["4", 0], "positive": positive, "negative": negative, "latent_image": latent}})
    };
    // With InpaintModelConditioning's conditioning and latent.
    let mut with_inputs = common.clone();
    with_inputs["11"] = json!({"class_type": "InpaintModelConditioning", "inputs": {
        "positive": ["6", 0], "negative": ["7", 0], "vae": ["4", 2], "pixels": ["1", 0], "mask": ["1", 1],
        "noise_mask": true}});
    with_inputs["3"] = sampler(json!(["11", 0]), json!(["11", 1]), json!(["11", 2]));
    // The same latent and noise mask, with the plain conditioning.
    let mut plain = common;
    plain["12"] = json!({"class_type": "VAEEncode", "inputs": {"pixels": ["1", 0], "vae": ["4", 2]}});
    plain["13"] = json!({"class_type": "SetLatentNoiseMask", "inputs": {"samples": ["12", 0], "mask": ["1", 1]}});
    plain["3"] = sampler(json!(["6", 0]), json!(["7", 0]), json!(["13", 0]));
    let a = run_outputs(&server, with_inputs);
    let b = run_outputs(&server, plain);
    assert_eq!(latent_values(&a[0].1), latent_values(&b[0].1));
}

/// The SD1.5 inpainting layout (names and shapes) from the random-checkpoint recipe's table.
fn inpainting_layout() -> Vec<(String, Vec<usize>)> {
    let table = support::root().join("compute/assets/sd15-inpaint-random/layout.tsv");
    let mut out = Vec::new();
    for line in std::fs::read_to_string(table).unwrap().lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        let shape: Vec<usize> = match fields[1] {
            "scalar" => vec![],
            dims => dims.split('x').map(|d| d.parse().unwrap()).collect(),
        };
        for key in expand(fields[0]) {
            out.push((key, shape.clone()));
        }
    }
    out
}

/// The keys a table key stands for: each `{a..b}` is each of `a..=b`.
fn expand(key: &str) -> Vec<String> {
    let Some(open) = key.find('{') else {
        return vec![key.to_string()];
    };
    let close = open + key[open..].find('}').unwrap();
    let (a, b) = key[open + 1..close].split_once("..").unwrap();
    let (a, b): (usize, usize) = (a.parse().unwrap(), b.parse().unwrap());
    (a..=b)
        .flat_map(|i| expand(&format!("{}{i}{}", &key[..open], &key[close + 1..])))
        .collect()
}

/// A safetensors file of `layout` (float16) whose data is all zeros, written sparse.
fn sparse_checkpoint(path: &Path, layout: &[(String, Vec<usize>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (key, shape) in layout {
        let bytes = shape.iter().product::<usize>() as u64 * 2;
        header.insert(
            key.clone(),
            json!({"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    std::fs::write(path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(bytes.len() as u64 + offset).unwrap();
}

#[test]
fn a_malformed_inpainting_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    let conv_in = "model.diffusion_model.input_blocks.0.0.weight";
    let with_conv = |shape: Vec<usize>| -> Vec<(String, Vec<usize>)> {
        inpainting_layout()
            .into_iter()
            .map(|(k, s)| if k == conv_in { (k, shape.clone()) } else { (k, s) })
            .collect()
    };
    // A 9-channel input convolution with a 5x5 kernel, and one of 7 input channels.
    sparse_checkpoint(&checkpoints.join("kernel.safetensors"), &with_conv(vec![320, 9, 5, 5]));
    sparse_checkpoint(&checkpoints.join("seven.safetensors"), &with_conv(vec![320, 7, 3, 3]));
    let server = models_server(dir.path());
    for (file, says) in [
        ("kernel.safetensors", "[320, 9, 5, 5], expected [320, 9, 3, 3]"),
        ("seven.safetensors", "takes 7 channels"),
    ] {
        let job = server.run(json!({
            "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": file}},
            "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["4", 2]}},
            "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "x"}}
        }));
        // A node error: its code is in the message, as for every node error.
        support::assert_failed_at_node(&job, "node_execution_error", "4");
        let message = job["error"]["message"].as_str().unwrap();
        for part in [says, file, "(invalid_model)"] {
            assert!(message.contains(part), "{file}: {message}");
        }
    }
}
