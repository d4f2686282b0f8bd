//! Stable Diffusion 2.x through the real server: ComfyUI's default graph runs unchanged on
//! tiny random-weight SD2 checkpoints (`weft models tiny-sd2`, eps and `--v-prediction`)
//! that `CheckpointLoaderSimple` detects by their keys; a v-prediction file samples with
//! v-prediction unless a `ModelSamplingDiscrete` says otherwise; `CLIPSetLastLayer` moves
//! the encoding off SD2's default penultimate layer; SD2's unCLIP variant, and an
//! inpainting one that lacks tensors, are clean node errors.

mod support;

use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::Server;

/// SD 2.1 512-base's checkpoint name (eps prediction).
const SD2_BASE: &str = "v2-1_512-ema-pruned.safetensors";
/// SD 2.1 768-v's checkpoint name (v prediction).
const SD2_V: &str = "v2-1_768-ema-pruned.safetensors";

/// Writes a tiny SD2 checkpoint to `path`, v-prediction when `v`.
fn tiny_sd2(path: &std::path::Path, v: bool) {
    let mut command = Command::new(support::weft_bin());
    command.args(["models", "tiny-sd2", "--seed", "0", "--out"]).arg(path);
    if v {
        command.arg("--v-prediction");
    }
    let status = command.stdout(Stdio::null()).status().unwrap();
    assert!(status.success(), "weft models tiny-sd2 failed");
}

/// A safetensors file of float32 tensors of `tensors`' shapes, all zeros.
fn zeros_file(path: &std::path::Path, tensors: &[(&str, &[usize])]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in tensors {
        let bytes = shape.iter().product::<usize>() * 4;
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(text);
    bytes.extend(std::iter::repeat_n(0u8, offset));
    std::fs::write(path, bytes).unwrap();
}

/// A models directory with both tiny SD2 checkpoints, and a server over it with the node
/// cache off.
fn setup() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    tiny_sd2(&checkpoints.join(SD2_BASE), false);
    tiny_sd2(&checkpoints.join(SD2_V), true);
    let server = support::models_server(dir.path());
    (dir, server)
}

/// ComfyUI's default graph on checkpoint `ckpt`, with a `SaveLatent` of the sampler's output.
fn default_graph(ckpt: &str, seed: u64) -> Value {
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": seed, "steps": 2}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {
            "clip": ["4", 1], "text": "beautiful scenery nature glass bottle landscape, , purple galaxy bottle,"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "text, watermark"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
        "10": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI", "samples": ["3", 0]}}
    })
}

/// Runs `graph`, asserting success and a PNG, and returns the bytes of its latent output.
fn latent(server: &Server, graph: Value) -> Vec<u8> {
    let mut files = support::run_outputs(server, graph);
    assert_eq!(
        files.len(),
        2,
        "{:?}",
        files.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    assert!(files[0].1.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", files[0].0);
    files.pop().unwrap().1
}

/// `graph` with a `ModelSamplingDiscrete` of `sampling` between the loader and the sampler.
fn with_sampling(mut graph: Value, sampling: &str) -> Value {
    graph["20"] = json!({"class_type": "ModelSamplingDiscrete", "inputs": {
        "model": ["4", 0], "sampling": sampling, "zsnr": false}});
    graph["3"]["inputs"]["model"] = json!(["20", 0]);
    graph
}

#[test]
fn sd2_checkpoints_run_comfyuis_default_graph_and_a_v_checkpoint_samples_with_v() {
    let (_dir, server) = setup();
    let base = latent(&server, default_graph(SD2_BASE, 42));
    assert_eq!(
        base,
        latent(&server, default_graph(SD2_BASE, 42)),
        "same seed, same bytes"
    );
    // The eps checkpoint's own sampling is eps.
    assert_eq!(base, latent(&server, with_sampling(default_graph(SD2_BASE, 42), "eps")));

    // The v checkpoint samples with v prediction by default: the same as asking for it,
    // and not the same as the same weights sampled with eps.
    let v = latent(&server, default_graph(SD2_V, 42));
    let as_v = latent(&server, with_sampling(default_graph(SD2_V, 42), "v_prediction"));
    let as_eps = latent(&server, with_sampling(default_graph(SD2_V, 42), "eps"));
    assert_eq!(v, as_v, "a v checkpoint's own sampling is v_prediction");
    assert_ne!(v, as_eps, "eps sampling of the v weights differs");
}

#[test]
fn clip_set_last_layer_moves_sd2_off_its_penultimate_default() {
    let (_dir, server) = setup();
    let with_last_layer = |layer: i64| {
        let mut graph = default_graph(SD2_BASE, 7);
        graph["30"] =
            json!({"class_type": "CLIPSetLastLayer", "inputs": {"clip": ["4", 1], "stop_at_clip_layer": layer}});
        graph["6"]["inputs"]["clip"] = json!(["30", 0]);
        graph["7"]["inputs"]["clip"] = json!(["30", 0]);
        latent(&server, graph)
    };
    let plain = latent(&server, default_graph(SD2_BASE, 7));
    assert_eq!(plain, with_last_layer(-2), "SD2 encodes with the penultimate layer");
    assert_ne!(plain, with_last_layer(-1), "the last layer is another encoding");
}

#[test]
fn sd2_unclip_and_incomplete_inpainting_checkpoints_are_clean_node_errors() {
    let (dir, server) = setup();
    let checkpoints = dir.path().join("checkpoints");
    let unet = |name: &str| format!("model.diffusion_model.{name}");
    let to_k = unet("input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight");
    let conv_in = unet("input_blocks.0.0.weight");
    let label = unet("label_emb.0.0.weight");
    let clip = "cond_stage_model.model.ln_final.weight";
    zeros_file(
        &checkpoints.join("512-inpainting-ema.safetensors"),
        &[(&to_k, &[320, 1024]), (&conv_in, &[320, 9, 3, 3]), (clip, &[1024])],
    );
    zeros_file(
        &checkpoints.join("sd21-unclip-h.safetensors"),
        &[
            (&to_k, &[320, 1024]),
            (&conv_in, &[320, 4, 3, 3]),
            (&label, &[1280, 1536]),
            (clip, &[1024]),
        ],
    );
    for (name, says) in [
        // Inpainting UNets are run (`tests/inpainting.rs`); this file lacks their tensors.
        ("512-inpainting-ema.safetensors", "missing"),
        ("sd21-unclip-h.safetensors", "unCLIP"),
    ] {
        let job = server.run(default_graph(name, 1));
        assert_eq!(job["status"], "failed", "{name}: {job}");
        assert_eq!(job["error"]["code"], "node_execution_error", "{name}: {job}");
        assert_eq!(job["error"]["node_id"], "4", "{name}: {job}");
        let message = job["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("invalid_model") && message.contains(name) && message.contains(says),
            "{name}: {message}"
        );
    }
}
