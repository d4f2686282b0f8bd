//! LoRAs on SDXL through the real server: `LoraLoader` and `LoraLoaderModelOnly` apply a
//! kohya-layout SDXL LoRA (`weft models tiny-lora --sdxl`: the UNet's original names with
//! LoCon convolutions, `lora_te1_` / `lora_te2_` for the two text encoders) to a tiny SDXL
//! checkpoint (`weft models tiny-sdxl`); strength 0 changes nothing; an SD1 LoRA on SDXL is a
//! clean node error that names the LoRA.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::{weft_bin, Server};

/// The checkpoint name ComfyUI's SDXL example workflow uses.
const SDXL: &str = "sd_xl_base_1.0.safetensors";
/// A LoRA for it.
const SDXL_LORA: &str = "sdxl-style.safetensors";
/// A LoRA for SD1.
const SD1_LORA: &str = "sd15-style.safetensors";

/// Runs `weft models <args> --out <path>`.
fn weft_models(args: &[&str], path: &Path) {
    let status = Command::new(weft_bin())
        .arg("models")
        .args(args)
        .arg("--out")
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models {args:?} failed");
}

/// A models directory with a tiny SDXL checkpoint, an SDXL LoRA and an SD1 LoRA, and a
/// server over it with the node cache off.
fn setup() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoints, loras) = (dir.path().join("checkpoints"), dir.path().join("loras"));
    std::fs::create_dir_all(&checkpoints).unwrap();
    std::fs::create_dir_all(&loras).unwrap();
    weft_models(&["tiny-sdxl", "--seed", "0"], &checkpoints.join(SDXL));
    weft_models(&["tiny-lora", "--sdxl", "--seed", "3"], &loras.join(SDXL_LORA));
    weft_models(&["tiny-lora", "--seed", "3"], &loras.join(SD1_LORA));
    let server = support::models_server(dir.path());
    (dir, server)
}

/// ComfyUI's SDXL text-to-image graph with a `SaveLatent` of the sampler's output.
fn sdxl_graph() -> Value {
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": 5, "steps": 2}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SDXL}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse at dusk, oil painting"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
        "10": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI", "samples": ["3", 0]}}
    })
}

/// The SDXL graph through `LoraLoader` (node 20) with `lora` at the two strengths.
fn with_lora(lora: &str, strength_model: f64, strength_clip: f64) -> Value {
    let mut graph = sdxl_graph();
    graph["20"] = json!({"class_type": "LoraLoader", "inputs": {
        "model": ["4", 0], "clip": ["4", 1], "lora_name": lora,
        "strength_model": strength_model, "strength_clip": strength_clip}});
    graph["3"]["inputs"]["model"] = json!(["20", 0]);
    graph["6"]["inputs"]["clip"] = json!(["20", 1]);
    graph["7"]["inputs"]["clip"] = json!(["20", 1]);
    graph
}

/// What a run gave: the image's pixels and the latent file's bytes.
#[derive(PartialEq)]
struct Outputs {
    pixels: Vec<u8>,
    latent: Vec<u8>,
}

/// Runs `graph` and returns its outputs, asserting success.
fn outputs(server: &Server, graph: Value) -> Outputs {
    let job = server.run(graph);
    assert_eq!(job["status"], "succeeded", "{job}");
    let (mut pixels, mut latent) = (Vec::new(), Vec::new());
    for output in job["outputs"].as_array().unwrap() {
        let name = output["filename"].as_str().or(output["name"].as_str()).unwrap_or("");
        let bytes = server.download(output["url"].as_str().unwrap());
        match name.ends_with(".png") {
            true => pixels = image::load_from_memory(&bytes).unwrap().to_rgb8().into_raw(),
            false => latent = bytes,
        }
    }
    assert!(!pixels.is_empty() && !latent.is_empty(), "{job}");
    Outputs { pixels, latent }
}

#[test]
fn an_sdxl_lora_changes_the_image_through_the_unet_and_the_text_encoders() {
    let (_dir, server) = setup();
    let plain = outputs(&server, sdxl_graph());
    let zero = outputs(&server, with_lora(SDXL_LORA, 0.0, 0.0));
    assert!(zero == plain, "strength 0 leaves the model and CLIP as they were");
    let styled = outputs(&server, with_lora(SDXL_LORA, 1.0, 1.0));
    assert!(styled.pixels != plain.pixels, "the LoRA changes the image");
    assert!(styled.latent != plain.latent, "the LoRA changes the latent");
    let text_only = outputs(&server, with_lora(SDXL_LORA, 0.0, 1.0));
    assert!(
        text_only.latent != plain.latent,
        "the text encoders' patches change the conditioning"
    );
    assert!(text_only.latent != styled.latent);
}

#[test]
fn lora_loader_model_only_patches_the_unet_alone() {
    let (_dir, server) = setup();
    let mut graph = sdxl_graph();
    graph["21"] = json!({"class_type": "LoraLoaderModelOnly", "inputs": {
        "model": ["4", 0], "lora_name": SDXL_LORA, "strength_model": 1.0}});
    graph["3"]["inputs"]["model"] = json!(["21", 0]);
    let model_only = outputs(&server, graph);
    assert!(model_only.latent != outputs(&server, sdxl_graph()).latent);
    assert!(
        model_only == outputs(&server, with_lora(SDXL_LORA, 1.0, 0.0)),
        "the same as LoraLoader with strength_clip 0"
    );
}

#[test]
fn an_sd1_lora_on_sdxl_is_a_clean_node_error_naming_the_lora() {
    let (_dir, server) = setup();
    for graph in [with_lora(SD1_LORA, 1.0, 1.0), with_lora(SD1_LORA, 1.0, 0.0)] {
        let job = server.run(graph);
        assert_eq!(job["status"], "failed", "{job}");
        assert_eq!(job["error"]["node_id"], "20", "{job}");
        let message = job["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("invalid_model") && message.contains(SD1_LORA),
            "{message}"
        );
    }
}
