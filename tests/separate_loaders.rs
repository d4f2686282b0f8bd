//! ComfyUI's separate-file loaders through the real server: `UNETLoader`, `CLIPLoader` and
//! `DualCLIPLoader` on files split out of a tiny SDXL checkpoint (`weft models split`) give
//! the checkpoint's own image, the legacy `unet` / `clip` folders are listed under the new
//! names, and types or files weft cannot run are clean node errors.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::Server;

/// The tiny SDXL checkpoint's name.
const SDXL: &str = "sdxl.safetensors";

/// Splits `checkpoint` into `dir` with `weft models split`.
fn split(checkpoint: &Path, dir: &Path) {
    let status = Command::new(support::weft_bin())
        .args(["models", "split", "--checkpoint"])
        .arg(checkpoint)
        .arg("--out-dir")
        .arg(dir)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models split failed");
}

/// A models directory with a tiny SDXL checkpoint and its parts as separate files: the UNet
/// in the legacy `unet` folder, CLIP-L in the legacy `clip` folder, CLIP-G in
/// `text_encoders`, the VAE in `vae`; a server over it with the node cache off.
fn setup() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for folder in [
        "checkpoints",
        "unet",
        "clip",
        "text_encoders",
        "vae",
        "diffusion_models",
    ] {
        std::fs::create_dir_all(root.join(folder)).unwrap();
    }
    let checkpoint = root.join("checkpoints").join(SDXL);
    support::tiny_model("tiny-sdxl", &checkpoint, 0);
    let parts = root.join("parts");
    split(&checkpoint, &parts);
    for (file, folder) in [
        ("sdxl_unet", "unet"),
        ("sdxl_clip_l", "clip"),
        ("sdxl_clip_g", "text_encoders"),
        ("sdxl_vae", "vae"),
    ] {
        let name = format!("{file}.safetensors");
        std::fs::rename(parts.join(&name), root.join(folder).join(&name)).unwrap();
    }
    let unet = std::fs::read(root.join("unet/sdxl_unet.safetensors")).unwrap();
    std::fs::write(
        root.join("diffusion_models/truncated.safetensors"),
        &unet[..unet.len() / 2],
    )
    .unwrap();
    std::fs::write(root.join("text_encoders/a_unet.safetensors"), &unet).unwrap();
    let server = support::models_server(root);
    (dir, server)
}

/// ComfyUI's SDXL text-to-image graph on the checkpoint, saving the image and the latent.
fn checkpoint_graph() -> Value {
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": 11, "steps": 2}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SDXL}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse at dusk"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
        "10": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI", "samples": ["3", 0]}}
    })
}

/// The same graph on the separate files: `UNETLoader`, `DualCLIPLoader` (`clip_g` first)
/// and `VAELoader`.
fn separate_graph() -> Value {
    let mut graph = checkpoint_graph();
    graph["4"] = json!({"class_type": "UNETLoader", "inputs": {
        "unet_name": "sdxl_unet.safetensors", "weight_dtype": "default"}});
    graph["11"] = json!({"class_type": "DualCLIPLoader", "inputs": {
        "clip_name1": "sdxl_clip_g.safetensors", "clip_name2": "sdxl_clip_l.safetensors",
        "type": "sdxl", "device": "default"}});
    graph["12"] = json!({"class_type": "VAELoader", "inputs": {"vae_name": "sdxl_vae.safetensors"}});
    graph["6"]["inputs"]["clip"] = json!(["11", 0]);
    graph["7"]["inputs"]["clip"] = json!(["11", 0]);
    graph["8"]["inputs"]["vae"] = json!(["12", 0]);
    graph
}

/// Runs `graph` and returns the bytes of its outputs, PNG first, asserting success.
fn outputs(server: &Server, graph: Value) -> Vec<Vec<u8>> {
    let files = support::run_outputs(server, graph);
    files.into_iter().map(|(_, bytes)| bytes).collect()
}

/// Runs `graph`, expecting node `node` to fail; returns the error message.
fn failure(server: &Server, graph: Value, node: &str) -> String {
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], node, "{job}");
    job["error"]["message"].as_str().unwrap().to_string()
}

/// A PNG's image data (its `IDAT` chunks): the pixels, without the workflow's text chunks.
fn pixels(png: &[u8]) -> Vec<u8> {
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let mut at = 8;
    let mut data = Vec::new();
    while at + 8 <= png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        if &png[at + 4..at + 8] == b"IDAT" {
            data.extend_from_slice(&png[at + 8..at + 8 + len]);
        }
        at += 12 + len;
    }
    data
}

#[test]
fn a_split_sdxl_checkpoint_gives_the_checkpoints_own_image() {
    let (_dir, server) = setup();
    let whole = outputs(&server, checkpoint_graph());
    let separate = outputs(&server, separate_graph());
    assert!(!pixels(&whole[0]).is_empty());
    assert!(pixels(&whole[0]) == pixels(&separate[0]), "same pixels, bit for bit");
    assert!(whole[1] == separate[1], "same latent, bit for bit");
    // Every fp8 weight type computes as the default one.
    let mut fp8 = separate_graph();
    fp8["4"]["inputs"]["weight_dtype"] = json!("fp8_e4m3fn");
    assert!(outputs(&server, fp8)[1] == whole[1]);
}

#[test]
fn the_legacy_unet_and_clip_folders_are_listed_under_comfyuis_names() {
    let (_dir, server) = setup();
    let info: Value = server.get("/object_info").json().unwrap();
    let choices = |class: &str, input: &str| info[class]["input"]["required"][input][0].clone();
    assert_eq!(
        choices("UNETLoader", "unet_name"),
        json!(["sdxl_unet.safetensors", "truncated.safetensors"])
    );
    let encoders = json!([
        "a_unet.safetensors",
        "sdxl_clip_g.safetensors",
        "sdxl_clip_l.safetensors"
    ]);
    assert_eq!(choices("CLIPLoader", "clip_name"), encoders);
    assert_eq!(choices("DualCLIPLoader", "clip_name2"), encoders);
    assert!(info["UNETLoader"].get("deprecated").is_none(), "weft runs it now");
}

#[test]
fn an_unsupported_clip_type_is_refused_with_the_types_weft_supports() {
    let (_dir, server) = setup();
    let mut dual = separate_graph();
    dual["11"]["inputs"]["type"] = json!("flux");
    let message = failure(&server, dual, "11");
    assert!(
        message.contains("invalid_input") && message.contains("sdxl"),
        "{message}"
    );
    let mut single = checkpoint_graph();
    single["11"] = json!({"class_type": "CLIPLoader", "inputs": {
        "clip_name": "sdxl_clip_l.safetensors", "type": "sd3", "device": "default"}});
    single["6"]["inputs"]["clip"] = json!(["11", 0]);
    let message = failure(&server, single, "11");
    assert!(
        message.contains("invalid_input") && message.contains("stable_diffusion"),
        "{message}"
    );
}

#[test]
fn files_that_do_not_fit_their_loader_are_clean_model_errors() {
    let (_dir, server) = setup();
    // The same CLIP-L twice: DualCLIPLoader's sdxl needs a CLIP-L and a CLIP-G.
    let mut twice = separate_graph();
    twice["11"]["inputs"]["clip_name1"] = json!("sdxl_clip_l.safetensors");
    let message = failure(&server, twice, "11");
    assert!(
        message.contains("invalid_model") && message.contains("CLIP-G"),
        "{message}"
    );
    // A UNet file is no text encoder.
    let mut unet_as_clip = checkpoint_graph();
    unet_as_clip["11"] = json!({"class_type": "CLIPLoader", "inputs": {
        "clip_name": "a_unet.safetensors", "type": "stable_diffusion", "device": "cpu"}});
    unet_as_clip["6"]["inputs"]["clip"] = json!(["11", 0]);
    let message = failure(&server, unet_as_clip, "11");
    assert!(
        message.contains("invalid_model") && message.contains("text encoder"),
        "{message}"
    );
    // A truncated UNet file.
    let mut truncated = separate_graph();
    truncated["4"]["inputs"]["unet_name"] = json!("truncated.safetensors");
    let message = failure(&server, truncated, "4");
    assert!(message.contains("invalid_model"), "{message}");
    assert!(!message.contains("/tmp"), "no server path in {message}");
}
