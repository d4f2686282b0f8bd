//! ComfyUI's upscale-model nodes through the real server: `UpscaleModelLoader` and
//! `ImageUpscaleWithModel` on the reduced models of `tests/fixtures/upscale-models/` give
//! ComfyUI's pixels, other architectures are refused by name, an upscale the job's memory
//! cannot hold ends with `node_memory_limit`, and `/object_info` lists both classes as
//! ComfyUI does.

mod support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::{Options, Server};

/// The fixture folder.
fn fixtures() -> PathBuf {
    support::root().join("tests/fixtures/upscale-models")
}

/// A models directory whose `upscale_models` holds an ESRGAN, a compact network (as a
/// PyTorch pickle) and a file of another kind.
fn models_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("upscale_models");
    std::fs::create_dir_all(&folder).unwrap();
    for file in [
        "esrgan-old-x4.safetensors",
        "compact-x4.pth",
        "not-an-upscaler.safetensors",
    ] {
        std::fs::copy(fixtures().join(file), folder.join(file)).unwrap();
    }
    dir
}

/// A server over `dir` with `--job-memory-mib` `job_mib`.
fn server(dir: &Path, job_mib: u64) -> Server {
    Server::with(Options {
        args: vec![
            "--models-dir".into(),
            dir.display().to_string(),
            "--cache-mib".into(),
            "0".into(),
            "--job-memory-mib".into(),
            job_mib.to_string(),
        ],
        ..Default::default()
    })
}

/// `image` (a node's `IMAGE` output) upscaled by `model` and saved.
fn upscale_graph(model: &str, image: Value) -> Value {
    json!({
        "1": image,
        "2": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": model}},
        "3": {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["2", 0], "image": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"filename_prefix": "up", "images": ["3", 0]}}
    })
}

/// A PNG's size and RGB bytes.
fn decode(png: &[u8]) -> ((u32, u32), Vec<u8>) {
    let image = image::load_from_memory(png).unwrap().to_rgb8();
    (image.dimensions(), image.into_raw())
}

#[test]
fn an_esrgan_upscale_through_the_server_gives_comfyuis_pixels() {
    let dir = models_dir();
    let server = server(dir.path(), 4096);
    let asset = server.upload("photo.png", std::fs::read(fixtures().join("photo.png")).unwrap());
    let load =
        json!({"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": asset["id"]}}}});
    let files = support::run_outputs(&server, upscale_graph("esrgan-old-x4.safetensors", load));
    let (size, got) = decode(&files[0].1);
    let (want_size, want) = decode(&std::fs::read(fixtures().join("photo-esrgan-old-x4.png")).unwrap());
    assert_eq!((size, want_size), ((52, 36), (52, 36)));
    // 8-bit values truncated from floats within rounding of each other: at most 1 apart.
    let worst = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    assert!(worst <= 1, "pixels differ by up to {worst}");
}

#[test]
fn a_pytorch_pickle_of_a_compact_network_upscales_images() {
    let dir = models_dir();
    let server = server(dir.path(), 4096);
    let empty =
        json!({"class_type": "EmptyImage", "inputs": {"width": 24, "height": 16, "batch_size": 2, "color": 0x336699}});
    let files = support::run_outputs(&server, upscale_graph("compact-x4.pth", empty));
    assert_eq!(files.len(), 2);
    for (_, png) in &files {
        assert_eq!(decode(png).0, (96, 64));
    }
}

#[test]
fn a_file_of_another_architecture_is_refused_naming_the_supported_ones() {
    let dir = models_dir();
    let server = server(dir.path(), 4096);
    let empty = json!({"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}});
    let job = server.run(upscale_graph("not-an-upscaler.safetensors", empty));
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], "2", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid_model") || job["error"]["code"] == "invalid_model",
        "{job}"
    );
    assert!(message.contains("ESRGAN") && message.contains("Compact"), "{message}");
    assert!(
        !message.contains(&dir.path().display().to_string()),
        "no server path in {message}"
    );
}

#[test]
fn an_upscale_too_large_for_the_jobs_memory_ends_with_node_memory_limit() {
    let dir = models_dir();
    let server = server(dir.path(), 256);
    // 8192x8192 RGB float32 out: 805 MB whatever the tile.
    let empty =
        json!({"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": 0}});
    let job = server.run(upscale_graph("esrgan-old-x4.safetensors", empty));
    support::assert_failed_at_node(&job, "node_memory_limit", "3");
}

#[test]
fn object_info_lists_both_classes_as_comfyui_does() {
    let dir = models_dir();
    let server = server(dir.path(), 4096);
    let info: Value = server.get("/object_info").json().unwrap();
    let loader = &info["UpscaleModelLoader"];
    assert_eq!(loader["display_name"], "Load Upscale Model");
    assert_eq!(loader["category"], "loaders");
    assert_eq!(loader["output"], json!(["UPSCALE_MODEL"]));
    assert_eq!(loader["output_name"], json!(["UPSCALE_MODEL"]));
    assert_eq!(loader["input_order"]["required"], json!(["model_name"]));
    assert_eq!(
        loader["input"]["required"]["model_name"][0],
        json!([
            "compact-x4.pth",
            "esrgan-old-x4.safetensors",
            "not-an-upscaler.safetensors"
        ])
    );
    assert!(
        loader.get("deprecated").is_none_or(|d| d == false),
        "weft runs it: {loader}"
    );
    let upscale = &info["ImageUpscaleWithModel"];
    assert_eq!(upscale["display_name"], "Upscale Image (using Model)");
    assert_eq!(upscale["category"], "image/upscaling");
    assert_eq!(
        upscale["input"]["required"],
        json!({"upscale_model": ["UPSCALE_MODEL", {}], "image": ["IMAGE", {}]})
    );
    assert_eq!(upscale["input_order"]["required"], json!(["upscale_model", "image"]));
    assert_eq!(upscale["output"], json!(["IMAGE"]));
    assert_eq!(upscale["output_name"], json!(["IMAGE"]));
}
