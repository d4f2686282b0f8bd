//! SDXL through the real server: ComfyUI's SDXL graphs in API format run unchanged on a
//! tiny random-weight SDXL checkpoint (`weft models tiny-sdxl`) that `CheckpointLoaderSimple`
//! detects by its keys; `CLIPTextEncodeSDXL` and `CLIPTextEncodeSDXLRefiner` have ComfyUI's
//! contract and their size conditioning reaches the model; conditioning from another
//! family's CLIP is a clean node error.

mod support;

use serde_json::{json, Value};
use support::Server;

/// The checkpoint name ComfyUI's SDXL example workflow uses.
const SDXL: &str = "sd_xl_base_1.0.safetensors";
/// The refiner's, in ComfyUI's example.
const REFINER: &str = "sd_xl_refiner_1.0.safetensors";
/// An SD1 checkpoint beside it.
const SD1: &str = "v1-5-pruned-emaonly.safetensors";

/// A models directory with a tiny SDXL and a tiny SD1 checkpoint, and a server over it
/// with the node cache off.
fn setup() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    support::tiny_model("tiny-sdxl", &checkpoints.join(SDXL), 0);
    support::tiny_model("tiny-sd", &checkpoints.join(SD1), 0);
    let server = support::models_server(dir.path());
    (dir, server)
}

/// ComfyUI's SDXL text-to-image graph (the default graph on an SDXL checkpoint) with a
/// `SaveLatent` of the sampler's output.
fn sdxl_graph(seed: u64) -> Value {
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": seed, "steps": 2}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SDXL}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse at dusk, oil painting"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
        "10": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI", "samples": ["3", 0]}}
    })
}

/// `CLIPTextEncodeSDXL` in place of node `id`'s `CLIPTextEncode`, with `crop_w`.
fn sdxl_text_encode(graph: &mut Value, id: &str, crop_w: u32) {
    let text = graph[id]["inputs"]["text"].clone();
    graph[id] = json!({"class_type": "CLIPTextEncodeSDXL", "inputs": {
        "clip": ["4", 1], "width": 1024, "height": 1024, "crop_w": crop_w, "crop_h": 0,
        "target_width": 1024, "target_height": 1024, "text_g": text, "text_l": text}});
}

/// Runs `graph` and returns the bytes of its outputs, PNG first, asserting success.
fn outputs(server: &Server, graph: Value) -> Vec<Vec<u8>> {
    let files = support::run_outputs(server, graph);
    files.into_iter().map(|(_, bytes)| bytes).collect()
}

#[test]
fn an_sdxl_checkpoint_runs_comfyuis_graph_unchanged_and_the_seed_decides_the_bytes() {
    let (_dir, server) = setup();
    let first = outputs(&server, sdxl_graph(42));
    assert!(first[0].starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_eq!(first, outputs(&server, sdxl_graph(42)), "same seed, same bytes");
    assert_ne!(
        first[1],
        outputs(&server, sdxl_graph(43))[1],
        "another seed, another latent"
    );
}

#[test]
fn clip_text_encode_sdxl_carries_its_size_conditioning_to_the_model() {
    let (_dir, server) = setup();
    let latent = |graph: Value| outputs(&server, graph).pop().unwrap();
    let plain = latent(sdxl_graph(7));
    let mut sized = sdxl_graph(7);
    sdxl_text_encode(&mut sized, "6", 0);
    sdxl_text_encode(&mut sized, "7", 0);
    let sized_latent = latent(sized.clone());
    // The default graph conditions on the latent's size (64 pixels), this one on 1024.
    assert_ne!(plain, sized_latent);
    let mut cropped = sized;
    cropped["6"]["inputs"]["crop_w"] = json!(256);
    assert_ne!(sized_latent, latent(cropped));
    // The refiner's node runs on a base CLIP too (the base model ignores the score).
    let mut refiner = sdxl_graph(7);
    refiner["6"] = json!({"class_type": "CLIPTextEncodeSDXLRefiner", "inputs": {
        "clip": ["4", 1], "ascore": 6.0, "width": 1024, "height": 1024, "text": "a lighthouse"}});
    latent(refiner);
}

#[test]
fn sdxl_text_nodes_have_comfyuis_inputs_defaults_and_category() {
    let (_dir, server) = setup();
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let order = |class: &str| nodes[class]["input_order"]["required"].clone();
    assert_eq!(
        order("CLIPTextEncodeSDXL"),
        json!([
            "clip",
            "width",
            "height",
            "crop_w",
            "crop_h",
            "target_width",
            "target_height",
            "text_g",
            "text_l"
        ])
    );
    assert_eq!(
        order("CLIPTextEncodeSDXLRefiner"),
        json!(["clip", "ascore", "width", "height", "text"])
    );
    let input = |class: &str, name: &str| nodes[class]["input"]["required"][name].clone();
    assert_eq!(input("CLIPTextEncodeSDXL", "width")[1]["default"], json!(1024));
    assert_eq!(input("CLIPTextEncodeSDXL", "crop_w")[1]["default"], json!(0));
    assert_eq!(input("CLIPTextEncodeSDXL", "text_g")[1]["multiline"], json!(true));
    assert_eq!(input("CLIPTextEncodeSDXLRefiner", "ascore")[1]["default"], json!(6.0));
    for class in ["CLIPTextEncodeSDXL", "CLIPTextEncodeSDXLRefiner"] {
        assert_eq!(nodes[class]["category"], "advanced/conditioning", "{class}");
        assert_eq!(nodes[class]["output"], json!(["CONDITIONING"]), "{class}");
    }
}

#[test]
fn conditioning_from_another_familys_clip_is_a_clean_node_error() {
    let (_dir, server) = setup();
    let mut graph = sdxl_graph(1);
    graph["11"] = json!({"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": SD1}});
    graph["6"]["inputs"]["clip"] = json!(["11", 1]);
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], "3", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid_input") && message.contains("pooled"),
        "{message}"
    );
}

/// ComfyUI's SDXL base-plus-refiner example: the base model's `KSamplerAdvanced` stops
/// early with its leftover noise, and the refiner's finishes without adding noise, each
/// prompt encoded by its own model's CLIP (`CLIPTextEncodeSDXLRefiner` for the refiner).
fn base_and_refiner_graph(seed: u64) -> Value {
    let sampler = |model: &str,
                   positive: &str,
                   negative: &str,
                   latent: Value,
                   add: &str,
                   start: u32,
                   end: u32,
                   leftover: &str| {
        json!({"class_type": "KSamplerAdvanced", "inputs": {
            "add_noise": add, "noise_seed": seed, "steps": 4, "cfg": 8, "sampler_name": "euler",
            "scheduler": "normal", "start_at_step": start, "end_at_step": end,
            "return_with_leftover_noise": leftover, "model": [model, 0], "positive": [positive, 0],
            "negative": [negative, 0], "latent_image": latent}})
    };
    let refiner_text = |text: &str, ascore: f64| {
        json!({"class_type": "CLIPTextEncodeSDXLRefiner", "inputs": {
            "clip": ["12", 1], "ascore": ascore, "width": 1024, "height": 1024, "text": text}})
    };
    let mut graph = sdxl_graph(seed);
    graph["12"] = json!({"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": REFINER}});
    graph["3"] = sampler("4", "6", "7", json!(["5", 0]), "enable", 0, 2, "enable");
    graph["13"] = refiner_text("a lighthouse at dusk, oil painting", 6.0);
    graph["14"] = refiner_text("blurry", 2.5);
    graph["15"] = sampler("12", "13", "14", json!(["3", 0]), "disable", 2, 10000, "disable");
    graph["8"]["inputs"] = json!({"samples": ["15", 0], "vae": ["12", 2]});
    graph["10"]["inputs"]["samples"] = json!(["15", 0]);
    graph
}

#[test]
fn the_base_and_refiner_hand_off_runs_and_the_refiner_scores_its_prompts() {
    let (dir, server) = setup();
    support::tiny_model("tiny-sdxl-refiner", &dir.path().join("checkpoints").join(REFINER), 0);
    let refined = outputs(&server, base_and_refiner_graph(5));
    assert!(refined[0].starts_with(b"\x89PNG\r\n\x1a\n"));
    assert_ne!(
        refined[1],
        outputs(&server, sdxl_graph(5))[1],
        "the refiner changed the latent"
    );
    let mut rescored = base_and_refiner_graph(5);
    rescored["13"]["inputs"]["ascore"] = json!(9.0);
    assert_ne!(
        refined[1],
        outputs(&server, rescored)[1],
        "the aesthetic score reaches the refiner"
    );
}

#[test]
fn a_truncated_sdxl_checkpoint_is_a_clean_node_error() {
    let (dir, server) = setup();
    let checkpoints = dir.path().join("checkpoints");
    let whole = std::fs::read(checkpoints.join(SDXL)).unwrap();
    std::fs::write(checkpoints.join("cut.safetensors"), &whole[..whole.len() * 2 / 3]).unwrap();
    let mut graph = sdxl_graph(1);
    graph["4"]["inputs"]["ckpt_name"] = json!("cut.safetensors");
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], "4", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid_model") && message.contains("cut.safetensors"),
        "{message}"
    );
}

#[test]
fn conditioning_set_timestep_range_limits_a_prompt_to_part_of_sampling() {
    let (_dir, server) = setup();
    let latent = |graph: Value| outputs(&server, graph).pop().unwrap();
    let ranged = |start: f64, end: f64| {
        let mut graph = sdxl_graph(3);
        graph["11"] = json!({"class_type": "ConditioningSetTimestepRange", "inputs": {
            "conditioning": ["6", 0], "start": start, "end": end}});
        graph["3"]["inputs"]["positive"] = json!(["11", 0]);
        graph
    };
    let plain = latent(sdxl_graph(3));
    assert_eq!(plain, latent(ranged(0.0, 1.0)), "the whole range is no range");
    assert_ne!(plain, latent(ranged(0.5, 1.0)), "half the steps without the prompt");
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let node = &nodes["ConditioningSetTimestepRange"];
    assert_eq!(node["input_order"]["required"], json!(["conditioning", "start", "end"]));
    assert_eq!(node["input"]["required"]["end"][1]["default"], json!(1.0));
    assert_eq!(node["category"], "advanced/conditioning");
}
