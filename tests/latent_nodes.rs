//! ComfyUI's latent arithmetic, batching and transform nodes and its area, strength, mask and
//! concatenation conditioning nodes, run by the real server: their catalogue entries and
//! their results through a graph against ComfyUI's own (`tests/fixtures/latent-nodes`).

mod support;

use serde_json::{json, Value};
use support::{run_outputs, Server};

fn fixture() -> Value {
    let path = support::root().join("tests/fixtures/latent-nodes/latent_nodes.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A ComfyUI `.latent` file (safetensors, marked as holding unscaled latents) of `latent`,
/// a fixture's `{"shape", "data"}`.
fn latent_file(latent: &Value) -> Vec<u8> {
    let data: Vec<u8> = latent["data"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| (v.as_f64().unwrap() as f32).to_le_bytes())
        .collect();
    let header = json!({
        "latent_tensor": {"dtype": "F32", "shape": latent["shape"], "data_offsets": [0, data.len()]},
        "latent_format_version_0": {"dtype": "F32", "shape": [0], "data_offsets": [data.len(), data.len()]},
    })
    .to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(data);
    file
}

/// The shape and values of a `.latent` file's `latent_tensor`.
fn read_latent_file(bytes: &[u8]) -> (Vec<u64>, Vec<f32>) {
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let entry = &header["latent_tensor"];
    assert_eq!(entry["dtype"], "F32");
    let [from, to] = [0, 1].map(|i| entry["data_offsets"][i].as_u64().unwrap() as usize + 8 + len);
    let data = bytes[from..to]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let shape = entry["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    (shape, data)
}

fn asset(server: &Server, name: &str, bytes: Vec<u8>) -> Value {
    let uploaded = server.upload(name, bytes);
    json!({"__type": "core/ASSET", "info": {"id": uploaded["id"]}})
}

#[test]
fn the_latent_and_conditioning_nodes_have_comfyuis_specs() {
    let server = Server::start();
    let catalogue: Value = server.get("/object_info").json().unwrap();
    support::specs::assert_catalogue_matches(&catalogue, &fixture()["specs"]);
}

#[test]
fn latent_nodes_in_a_graph_give_comfyuis_values() {
    let server = Server::start();
    let fixture = fixture();
    // One case of each node, its latents uploaded and loaded, its result saved.
    let mut seen = std::collections::HashSet::new();
    for case in fixture["cases"].as_array().unwrap() {
        let node = case["node"].as_str().unwrap();
        if !seen.insert(node) {
            continue;
        }
        let mut inputs = case["inputs"].as_object().unwrap().clone();
        let mut graph = json!({});
        for (i, name) in ["samples", "samples1", "samples2", "destination", "source"]
            .iter()
            .enumerate()
        {
            if let Some(latent) = inputs.get(*name).cloned() {
                let file = asset(&server, &format!("{name}.latent"), latent_file(&latent["samples"]));
                graph[format!("{}", 10 + i)] = json!({"class_type": "LoadLatent", "inputs": {"latent": file}});
                inputs.insert(name.to_string(), json!([format!("{}", 10 + i), 0]));
            }
        }
        graph["1"] = json!({"class_type": node, "inputs": inputs});
        graph["2"] = json!({"class_type": "SaveLatent", "inputs": {"samples": ["1", 0], "filename_prefix": "out"}});
        let outputs = run_outputs(&server, graph);
        let (shape, data) = read_latent_file(&outputs[0].1);
        let want = &case["output"]["samples"];
        assert_eq!(json!(shape), want["shape"], "{node}: shape");
        for (k, (g, w)) in data.iter().zip(want["data"].as_array().unwrap()).enumerate() {
            let w = w.as_f64().unwrap() as f32;
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{node}: value {k} is {g}, ComfyUI's {w}"
            );
        }
    }
    assert!(seen.len() >= 10, "every node has a case");
}

/// A PNG of `width` x `height` whose alpha is opaque on the left half only.
fn half_transparent_png(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbaImage::from_fn(width, height, |x, _| {
        image::Rgba([200, 100, 50, if x < width / 2 { 255 } else { 0 }])
    });
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    png
}

/// A text-to-image graph on the tiny checkpoint whose positive prompt is `positive` (node
/// ids 20 and up may build it from the prompts `6` and `7`).
fn graph_with(positive: Value, extra: Value) -> Value {
    let mut graph = json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 6, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["8", 0],
            "positive": positive, "sampler_name": "euler", "scheduler": "normal", "seed": 3, "steps": 3}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 2, "height": 128, "width": 128}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a red barn"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a blue sky"}},
        "8": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "9": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "10": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["9", 0]}}
    });
    for (id, node) in extra.as_object().unwrap() {
        graph[id] = node.clone();
    }
    graph
}

#[test]
fn masked_percentage_and_concatenated_conditioning_steer_sampling() {
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("checkpoints")).unwrap();
    support::tiny_checkpoint(&models.path().join("checkpoints/tiny.safetensors"), 1);
    let server = support::models_server(models.path());
    let mask = asset(&server, "mask.png", half_transparent_png(40, 24));
    let plain = run_outputs(&server, graph_with(json!(["6", 0]), json!({})));
    let steered = graph_with(
        json!(["24", 0]),
        json!({
            "20": {"class_type": "LoadImageMask", "inputs": {"image": mask, "channel": "alpha"}},
            "21": {"class_type": "ConditioningSetMask", "inputs": {
                "conditioning": ["7", 0], "mask": ["20", 0], "strength": 0.8, "set_cond_area": "mask bounds"}},
            "22": {"class_type": "ConditioningSetAreaPercentage", "inputs": {
                "conditioning": ["6", 0], "width": 0.5, "height": 0.75, "x": 0.25, "y": 0.1, "strength": 1.0}},
            "23": {"class_type": "ConditioningSetAreaStrength", "inputs": {"conditioning": ["22", 0], "strength": 1.3}},
            "25": {"class_type": "ConditioningConcat", "inputs": {"conditioning_to": ["6", 0], "conditioning_from": ["7", 0]}},
            "26": {"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["21", 0], "conditioning_2": ["23", 0]}},
            "24": {"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["26", 0], "conditioning_2": ["25", 0]}}
        }),
    );
    let first = run_outputs(&server, steered.clone());
    let again = run_outputs(&server, steered);
    assert_eq!(first.len(), 2, "one image per latent of the batch");
    assert_eq!(first, again, "the same graph gives the same images");
    assert_ne!(first[0].1, plain[0].1, "the steered prompt changes the image");
}

#[test]
fn latents_of_other_channel_counts_are_node_errors() {
    let server = Server::start();
    let four = json!({"shape": [1, 4, 2, 2], "data": vec![0.5; 16]});
    let sixteen = json!({"shape": [1, 16, 2, 2], "data": vec![0.5; 64]});
    let (a, b) = (
        asset(&server, "a.latent", latent_file(&four)),
        asset(&server, "b.latent", latent_file(&sixteen)),
    );
    let job = server.run(json!({
        "1": {"class_type": "LoadLatent", "inputs": {"latent": a}},
        "2": {"class_type": "LoadLatent", "inputs": {"latent": b}},
        "3": {"class_type": "LatentAdd", "inputs": {"samples1": ["1", 0], "samples2": ["2", 0]}},
        "4": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "x"}}
    }));
    support::assert_failed_at_node(&job, "node_execution_error", "3");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains("4 and 16 channels"), "{message}");
}
