//! ComfyUI's ControlNet nodes through the real server: `ControlNetLoader` +
//! `ControlNetApplyAdvanced` in ComfyUI's example graph give ComfyUI's latent and PNG on a
//! random-weight SD1.5 checkpoint and ControlNet (`tests/fixtures/controlnet/`), a control
//! changes what a tiny model samples (strength 0 does not), files of other kinds and
//! control images the job's memory cannot hold are refused clearly, and `/object_info`
//! lists the four classes as ComfyUI does.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::parity::{cached_checkpoint, latent_values};
use support::{Options, Server};
use weft_compute::models::safetensors::{write_f32_safetensors, SafetensorsIndex, DEFAULT_MAX_HEADER};
use weft_compute::sampling::TorchGenerator;

const CHECKPOINT: &str = "tiny.safetensors";
const CONTROLNET: &str = "tiny-control.safetensors";

fn fixtures() -> PathBuf {
    support::root().join("tests/fixtures/controlnet")
}

/// Writes the tiny ControlNet of the fixture's layout (`layout.json`, the tiny model's
/// layout) to `path`, with random weights.
fn tiny_controlnet(path: &Path) {
    let layout: Value = serde_json::from_slice(&std::fs::read(fixtures().join("layout.json")).unwrap()).unwrap();
    let mut g = TorchGenerator::new(7);
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = layout["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let shape: Vec<usize> = entry[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let n = shape.iter().product();
            let data = g.randn(n).into_iter().map(|v| v * 0.1).collect();
            (entry[0].as_str().unwrap().to_string(), shape, data)
        })
        .collect();
    write_f32_safetensors(path, &tensors, &BTreeMap::new()).unwrap();
}

/// A models directory with the tiny checkpoint, the tiny ControlNet and a file of another
/// kind in `controlnet/`.
fn tiny_models() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("checkpoints")).unwrap();
    std::fs::create_dir_all(dir.path().join("controlnet")).unwrap();
    support::tiny_checkpoint(&dir.path().join("checkpoints").join(CHECKPOINT), 0);
    tiny_controlnet(&dir.path().join("controlnet").join(CONTROLNET));
    std::fs::copy(
        dir.path().join("checkpoints").join(CHECKPOINT),
        dir.path().join("controlnet").join("a-checkpoint.safetensors"),
    )
    .unwrap();
    dir
}

fn server(dir: &Path, job_mib: u64) -> Server {
    Server::with(Options {
        args: vec![
            "--models-dir".into(),
            dir.display().to_string(),
            "--job-memory-mib".into(),
            job_mib.to_string(),
        ],
        ..Default::default()
    })
}

/// ComfyUI's ControlNet example graph on `checkpoint` and `controlnet`, the control image
/// made by node `"11"` (to be added), its latent saved by node `"10"`.
fn example_graph(checkpoint: &str, controlnet: &str, (size, steps): (u32, u32), control: (f64, f64, f64)) -> Value {
    let (strength, start, end) = control;
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["13", 1],
            "positive": ["13", 0], "sampler_name": "euler", "scheduler": "normal", "seed": 42, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": size, "width": size}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse at dusk, oil painting"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "control", "images": ["8", 0]}},
        "10": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "control"}},
        "12": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": controlnet}},
        "13": {"class_type": "ControlNetApplyAdvanced", "inputs": {
            "positive": ["6", 0], "negative": ["7", 0], "control_net": ["12", 0], "image": ["11", 0],
            "strength": strength, "start_percent": start, "end_percent": end}}
    })
}

/// The saved latent's values among a job's outputs.
fn saved_latent(server: &Server, workflow: Value) -> Vec<f32> {
    let files = support::run_outputs(server, workflow);
    let (_, bytes) = files
        .iter()
        .find(|(name, _)| name.ends_with(".latent"))
        .expect("a latent");
    latent_values(bytes).1
}

fn empty_image(width: u32, height: u32) -> Value {
    json!({"class_type": "EmptyImage", "inputs": {"width": width, "height": height, "batch_size": 1, "color": 0x3366cc}})
}

#[test]
fn a_control_changes_what_is_sampled_and_strength_zero_changes_nothing() {
    let dir = tiny_models();
    let server = server(dir.path(), 4096);
    let with = |strength: f64| {
        let mut graph = example_graph(CHECKPOINT, CONTROLNET, (64, 3), (strength, 0.0, 1.0));
        graph["11"] = empty_image(40, 56);
        saved_latent(&server, graph)
    };
    let mut plain = example_graph(CHECKPOINT, CONTROLNET, (64, 3), (1.0, 0.0, 1.0));
    plain["3"]["inputs"]["positive"] = json!(["6", 0]);
    plain["3"]["inputs"]["negative"] = json!(["7", 0]);
    for node in ["11", "12", "13"] {
        plain.as_object_mut().unwrap().remove(node);
    }
    let without = saved_latent(&server, plain);
    assert_eq!(with(0.0), without, "strength 0 leaves the conditioning as it was");
    assert_ne!(with(1.0), without, "the control moves the sampled latent");
}

#[test]
fn the_older_apply_node_runs_and_gives_the_negative_prompt_the_control() {
    let dir = tiny_models();
    let server = server(dir.path(), 4096);
    let mut graph = example_graph(CHECKPOINT, CONTROLNET, (64, 2), (1.0, 0.0, 1.0));
    graph["11"] = empty_image(64, 64);
    graph["13"] = json!({"class_type": "ControlNetApply", "inputs": {
        "conditioning": ["6", 0], "control_net": ["12", 0], "image": ["11", 0], "strength": 0.5}});
    graph["3"]["inputs"]["positive"] = json!(["13", 0]);
    graph["3"]["inputs"]["negative"] = json!(["7", 0]);
    let latent = saved_latent(&server, graph);
    assert!(latent.iter().all(|v| v.is_finite()));
}

#[test]
fn a_file_that_is_not_a_controlnet_is_refused_saying_what_it_holds() {
    let dir = tiny_models();
    let server = server(dir.path(), 4096);
    let mut graph = example_graph(CHECKPOINT, "a-checkpoint.safetensors", (64, 1), (1.0, 0.0, 1.0));
    graph["11"] = empty_image(64, 64);
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], "12", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid_model") || job["error"]["code"] == "invalid_model",
        "{job}"
    );
    assert!(message.contains("no ControlNet tensors"), "{message}");
    assert!(
        !message.contains(&dir.path().display().to_string()),
        "no server path in {message}"
    );
}

#[test]
fn a_control_image_the_jobs_memory_cannot_hold_ends_with_node_memory_limit() {
    let dir = tiny_models();
    let server = server(dir.path(), 300);
    let mut graph = example_graph(CHECKPOINT, CONTROLNET, (64, 1), (1.0, 0.0, 1.0));
    // 8192 x 4096 RGB in float32 is 403 MB: the copy the conditioning keeps does not fit.
    graph["11"] = empty_image(8192, 4096);
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "node_memory_limit", "{job}");
}

#[test]
fn a_control_image_that_cannot_be_cropped_to_the_latent_is_refused() {
    let dir = tiny_models();
    let server = server(dir.path(), 4096);
    let mut graph = example_graph(CHECKPOINT, CONTROLNET, (64, 1), (1.0, 0.0, 1.0));
    // A 4096 x 1 strip has no square centre crop to resize from.
    graph["11"] = empty_image(4096, 1);
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], "3", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains("control image"), "{message}");
}

#[test]
fn the_controlnet_nodes_have_comfyuis_specs() {
    let server = Server::start();
    let catalogue: Value = server.get("/object_info").json().unwrap();
    let specs: Value = serde_json::from_slice(&std::fs::read(fixtures().join("specs.json")).unwrap()).unwrap();
    support::specs::assert_catalogue_matches(&catalogue, &specs);
    assert_eq!(
        catalogue["ControlNetApplyAdvanced"]["output_name"],
        json!(["positive", "negative"])
    );
    assert!(catalogue["ControlNetLoader"]
        .get("deprecated")
        .is_none_or(|d| d == false));
}

const SD15_SHA256: &str = "aa64b29d75cc3581c40496e21560f885b40078d8af1910f2f2282424b1636fe9";

/// The cached seed-0 SD1.5 checkpoint, written by `weft models sd15-random` when missing.
fn sd15_checkpoint() -> PathBuf {
    cached_checkpoint("sd15-random", "sd15-random-s0", SD15_SHA256)
}

/// Writes the fixture's random-weight SD1.5 ControlNet (see `make_controlnet_graph.py`): the
/// checkpoint's encoder tensors, and the hint encoder, zero convolutions and
/// `middle_block_out` drawn from the seeded generator in sorted key order.
fn sd15_controlnet(checkpoint: &Path, out: &Path) {
    const UNET: &str = "model.diffusion_model.";
    let index = SafetensorsIndex::open(checkpoint, DEFAULT_MAX_HEADER).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (key, info) in &index.tensors {
        let Some(rest) = key.strip_prefix(UNET) else { continue };
        if ["time_embed.", "input_blocks.", "middle_block."]
            .iter()
            .any(|p| rest.starts_with(p))
        {
            tensors.push((rest.to_string(), info.shape.clone(), index.read_f32(key).unwrap()));
        }
    }
    let hint = [
        (3, 16),
        (16, 16),
        (16, 32),
        (32, 32),
        (32, 96),
        (96, 96),
        (96, 256),
        (256, 320),
    ];
    let zero = [320, 320, 320, 320, 640, 640, 640, 1280, 1280, 1280, 1280, 1280];
    let mut drawn: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, (cin, cout)) in hint.iter().enumerate() {
        drawn.insert(format!("input_hint_block.{}.weight", 2 * i), vec![*cout, *cin, 3, 3]);
        drawn.insert(format!("input_hint_block.{}.bias", 2 * i), vec![*cout]);
    }
    for (i, c) in zero.iter().enumerate() {
        drawn.insert(format!("zero_convs.{i}.0.weight"), vec![*c, *c, 1, 1]);
        drawn.insert(format!("zero_convs.{i}.0.bias"), vec![*c]);
    }
    drawn.insert("middle_block_out.0.weight".into(), vec![1280, 1280, 1, 1]);
    drawn.insert("middle_block_out.0.bias".into(), vec![1280]);
    let mut g = TorchGenerator::new(20261130);
    for (key, shape) in drawn {
        let n: usize = shape.iter().product();
        let scale = if shape.len() >= 2 {
            1.0 / ((n / shape[0]) as f64).sqrt()
        } else {
            0.1
        };
        let data = g.randn(n).into_iter().map(|v| (f64::from(v) * scale) as f32).collect();
        tensors.push((key, shape, data));
    }
    write_f32_safetensors(out, &tensors, &BTreeMap::new()).unwrap();
}

/// Waits for `job` up to half an hour: the full-size networks take a while on a busy
/// machine (this bounds a hang; it is not a timing assertion).
fn wait(server: &Server, job: Value) -> Value {
    let id = job["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if matches!(
            job["status"].as_str(),
            Some("succeeded" | "failed" | "canceled" | "expired")
        ) {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} did not finish: {job}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn comfyuis_controlnet_example_graph_gives_comfyuis_latent_and_png() {
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("checkpoints")).unwrap();
    std::fs::create_dir_all(models.path().join("controlnet")).unwrap();
    let checkpoint = sd15_checkpoint();
    std::fs::hard_link(
        &checkpoint,
        models.path().join("checkpoints/sd15-random-s0.safetensors"),
    )
    .unwrap();
    sd15_controlnet(
        &checkpoint,
        &models.path().join("controlnet/control-sd15-random.safetensors"),
    );
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.path().display().to_string()],
        ..Default::default()
    });
    let asset = server.upload("hint.png", std::fs::read(fixtures().join("hint.png")).unwrap());
    let mut graph = example_graph(
        "sd15-random-s0.safetensors",
        "control-sd15-random.safetensors",
        (256, 4),
        (0.8, 0.0, 0.75),
    );
    graph["11"] =
        json!({"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": asset["id"]}}}});
    let job = wait(&server, server.submit(graph));
    assert_eq!(job["status"], "succeeded", "{job}");
    let outputs: Vec<(String, Vec<u8>)> = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let file = o["filename"].as_str().or(o["name"].as_str()).unwrap_or("").to_string();
            (file, server.download(o["url"].as_str().unwrap()))
        })
        .collect();
    let latent = outputs.iter().find(|(f, _)| f.ends_with(".latent")).expect("a latent");
    let png = outputs.iter().find(|(_, b)| b.starts_with(b"\x89PNG")).expect("a PNG");

    // The sd15-parity README's tolerances.
    let (shape, ours) = latent_values(&latent.1);
    let (want_shape, want) = latent_values(&std::fs::read(fixtures().join("graph.latent")).unwrap());
    assert_eq!(shape, want_shape);
    let n = want.len() as f64;
    let mean = want.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let std = (want.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let largest = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
    let diffs: Vec<f64> = ours
        .iter()
        .zip(&want)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
        .collect();
    let max_diff = diffs.iter().fold(0f64, |m, &d| m.max(d));
    assert!(
        max_diff <= 1e-3 * largest,
        "latent max difference {max_diff} against {largest}"
    );
    assert!(diffs.iter().sum::<f64>() / n <= 1e-4 * std, "latent mean difference");

    let rgb = |png: &[u8]| image::load_from_memory(png).unwrap().to_rgb8().into_raw();
    let (ours, theirs) = (rgb(&png.1), rgb(&std::fs::read(fixtures().join("graph.png")).unwrap()));
    assert_eq!(ours.len(), theirs.len());
    let worst = ours
        .iter()
        .zip(&theirs)
        .map(|(&a, &b)| a.abs_diff(b))
        .max()
        .unwrap_or(0);
    let differing = ours.iter().zip(&theirs).filter(|(a, b)| a != b).count() as f64 / ours.len() as f64;
    assert!(worst <= 3, "a PNG value differs by {worst}/255");
    assert!(differing <= 0.01, "{:.2}% of PNG values differ", 100.0 * differing);
}
