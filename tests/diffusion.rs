//! The diffusion node pack against the real server: ComfyUI's workflows in API format run
//! unchanged on a tiny random-weight checkpoint (`weft models tiny-sd`) in a ComfyUI-style
//! models folder, every node's contract as `GET /api/v2/nodes` shows it, model names that
//! stay inside their folder, bad model files as clean node errors, cancel during sampling,
//! and a plugin built against the frozen `weft:node@0.1.0` contract.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use support::sse::Sse;
use support::{plugins_with, weft_bin, Options, Server};

/// The checkpoint name ComfyUI's default workflow uses.
const CHECKPOINT: &str = "v1-5-pruned-emaonly.safetensors";

/// A models directory with a tiny checkpoint named [`CHECKPOINT`].
fn models_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for folder in ["checkpoints", "loras", "vae", "embeddings"] {
        std::fs::create_dir_all(dir.path().join(folder)).unwrap();
    }
    support::tiny_checkpoint(&dir.path().join("checkpoints").join(CHECKPOINT), 0);
    dir
}

/// A server over `models` with the node cache off (every run computes), plus `args`.
fn server(models: &Path, plugins: Option<PathBuf>, args: &[&str]) -> Server {
    let mut all = vec!["--models-dir".to_string(), models.display().to_string()];
    all.extend(["--cache-mib".to_string(), "0".to_string()]);
    all.extend(args.iter().map(|a| a.to_string()));
    Server::with(Options {
        args: all,
        plugins_dir: plugins,
        ..Default::default()
    })
}

/// ComfyUI's default workflow, exported in API format, at `size` pixels and `steps` steps.
fn default_graph(seed: u64, size: u32, steps: u32) -> Value {
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": seed, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": size, "width": size}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {
            "clip": ["4", 1], "text": "beautiful scenery nature glass bottle landscape, , purple galaxy bottle,"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "text, watermark"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}}
    })
}

/// Runs `workflow`, asserting success, and returns the bytes of every output.
fn run_outputs(server: &Server, workflow: Value) -> Vec<(String, Vec<u8>)> {
    let job = server.run(workflow);
    assert_eq!(job["status"], "succeeded", "{job}");
    job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let name = o["filename"].as_str().or(o["name"].as_str()).unwrap_or("").to_string();
            (name, server.download(o["url"].as_str().unwrap()))
        })
        .collect()
}

fn is_png(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x89PNG\r\n\x1a\n")
}

/// ComfyUI's default graph as exported, at a size and step count that keep the test short
/// (the test profile compiles the compute kernels without optimisation).
#[test]
fn the_default_text_to_image_graph_runs_unchanged_and_the_seed_decides_the_bytes() {
    let models = models_dir();
    let server = server(models.path(), None, &[]);
    let first = run_outputs(&server, default_graph(8566257, 128, 4));
    assert_eq!(first.len(), 1);
    assert!(is_png(&first[0].1), "the output is a PNG");
    let again = run_outputs(&server, default_graph(8566257, 128, 4));
    assert_eq!(first[0].1, again[0].1, "same seed, same bytes");
    let other = run_outputs(&server, default_graph(8566258, 128, 4));
    assert_ne!(first[0].1, other[0].1, "another seed, another image");
}

/// The inputs of `class` in `/object_info` order: `(name, type or "COMBO", options)`.
fn inputs(nodes: &Value, class: &str) -> Vec<(String, String, Value)> {
    let def = &nodes[class];
    assert!(def.is_object(), "{class} is in the catalogue");
    let mut out = Vec::new();
    for section in ["required", "optional"] {
        for name in def["input_order"][section].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let spec = &def["input"][section][name];
            let kind = if spec[0].is_array() {
                "COMBO".to_string()
            } else {
                spec[0].as_str().unwrap().to_string()
            };
            out.push((name.to_string(), kind, spec[1].clone()));
        }
    }
    out
}

/// A node's contract: class, `(input, type, default)` per input, output types, category.
type NodeContract = (
    &'static str,
    Vec<(&'static str, &'static str, Value)>,
    Vec<&'static str>,
    &'static str,
);

#[test]
fn every_diffusion_node_has_comfyuis_inputs_defaults_and_outputs() {
    let models = models_dir();
    let server = server(models.path(), None, &[]);
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    // (class, [(input, type, default)], outputs, category)
    let n = Value::Null;
    let cases: Vec<NodeContract> = vec![
        (
            "CheckpointLoaderSimple",
            vec![("ckpt_name", "COMBO", n.clone())],
            vec!["MODEL", "CLIP", "VAE"],
            "loaders",
        ),
        (
            "VAELoader",
            vec![("vae_name", "COMBO", n.clone())],
            vec!["VAE"],
            "loaders",
        ),
        (
            "UNETLoader",
            vec![("unet_name", "COMBO", n.clone()), ("weight_dtype", "COMBO", n.clone())],
            vec!["MODEL"],
            "advanced/loaders",
        ),
        (
            "CLIPLoader",
            vec![
                ("clip_name", "COMBO", n.clone()),
                ("type", "COMBO", n.clone()),
                ("device", "COMBO", n.clone()),
            ],
            vec!["CLIP"],
            "advanced/loaders",
        ),
        (
            "DualCLIPLoader",
            vec![
                ("clip_name1", "COMBO", n.clone()),
                ("clip_name2", "COMBO", n.clone()),
                ("type", "COMBO", n.clone()),
                ("device", "COMBO", n.clone()),
            ],
            vec!["CLIP"],
            "advanced/loaders",
        ),
        (
            "LoraLoader",
            vec![
                ("model", "MODEL", n.clone()),
                ("clip", "CLIP", n.clone()),
                ("lora_name", "COMBO", n.clone()),
                ("strength_model", "FLOAT", json!(1.0)),
                ("strength_clip", "FLOAT", json!(1.0)),
            ],
            vec!["MODEL", "CLIP"],
            "loaders",
        ),
        (
            "LoraLoaderModelOnly",
            vec![
                ("model", "MODEL", n.clone()),
                ("lora_name", "COMBO", n.clone()),
                ("strength_model", "FLOAT", json!(1.0)),
            ],
            vec!["MODEL"],
            "loaders",
        ),
        (
            "CLIPTextEncode",
            vec![("text", "STRING", n.clone()), ("clip", "CLIP", n.clone())],
            vec!["CONDITIONING"],
            "conditioning",
        ),
        (
            "CLIPSetLastLayer",
            vec![("clip", "CLIP", n.clone()), ("stop_at_clip_layer", "INT", json!(-1))],
            vec!["CLIP"],
            "conditioning",
        ),
        (
            "ConditioningCombine",
            vec![
                ("conditioning_1", "CONDITIONING", n.clone()),
                ("conditioning_2", "CONDITIONING", n.clone()),
            ],
            vec!["CONDITIONING"],
            "conditioning",
        ),
        (
            "ConditioningAverage",
            vec![
                ("conditioning_to", "CONDITIONING", n.clone()),
                ("conditioning_from", "CONDITIONING", n.clone()),
                ("conditioning_to_strength", "FLOAT", json!(1.0)),
            ],
            vec!["CONDITIONING"],
            "conditioning",
        ),
        (
            "ConditioningSetArea",
            vec![
                ("conditioning", "CONDITIONING", n.clone()),
                ("width", "INT", json!(64)),
                ("height", "INT", json!(64)),
                ("x", "INT", json!(0)),
                ("y", "INT", json!(0)),
                ("strength", "FLOAT", json!(1.0)),
            ],
            vec!["CONDITIONING"],
            "conditioning",
        ),
        (
            "ConditioningZeroOut",
            vec![("conditioning", "CONDITIONING", n.clone())],
            vec!["CONDITIONING"],
            "advanced/conditioning",
        ),
        (
            "EmptyLatentImage",
            vec![
                ("width", "INT", json!(512)),
                ("height", "INT", json!(512)),
                ("batch_size", "INT", json!(1)),
            ],
            vec!["LATENT"],
            "latent",
        ),
        (
            "LatentUpscale",
            vec![
                ("samples", "LATENT", n.clone()),
                ("upscale_method", "COMBO", n.clone()),
                ("width", "INT", json!(512)),
                ("height", "INT", json!(512)),
                ("crop", "COMBO", n.clone()),
            ],
            vec!["LATENT"],
            "latent",
        ),
        (
            "LatentUpscaleBy",
            vec![
                ("samples", "LATENT", n.clone()),
                ("upscale_method", "COMBO", n.clone()),
                ("scale_by", "FLOAT", json!(1.5)),
            ],
            vec!["LATENT"],
            "latent",
        ),
        (
            "LatentComposite",
            vec![
                ("samples_to", "LATENT", n.clone()),
                ("samples_from", "LATENT", n.clone()),
                ("x", "INT", json!(0)),
                ("y", "INT", json!(0)),
                ("feather", "INT", json!(0)),
            ],
            vec!["LATENT"],
            "latent",
        ),
        (
            "LatentFromBatch",
            vec![
                ("samples", "LATENT", n.clone()),
                ("batch_index", "INT", json!(0)),
                ("length", "INT", json!(1)),
            ],
            vec!["LATENT"],
            "latent/batch",
        ),
        (
            "RepeatLatentBatch",
            vec![("samples", "LATENT", n.clone()), ("amount", "INT", json!(1))],
            vec!["LATENT"],
            "latent/batch",
        ),
        (
            "SetLatentNoiseMask",
            vec![("samples", "LATENT", n.clone()), ("mask", "MASK", n.clone())],
            vec!["LATENT"],
            "latent/inpaint",
        ),
        (
            "SaveLatent",
            vec![
                ("samples", "LATENT", n.clone()),
                ("filename_prefix", "STRING", json!("latents/ComfyUI")),
            ],
            vec![],
            "_for_testing",
        ),
        (
            "LoadLatent",
            vec![("latent", "core/ASSET", n.clone())],
            vec!["LATENT"],
            "_for_testing",
        ),
        (
            "KSampler",
            vec![
                ("model", "MODEL", n.clone()),
                ("seed", "INT", json!(0)),
                ("steps", "INT", json!(20)),
                ("cfg", "FLOAT", json!(8.0)),
                ("sampler_name", "COMBO", n.clone()),
                ("scheduler", "COMBO", n.clone()),
                ("positive", "CONDITIONING", n.clone()),
                ("negative", "CONDITIONING", n.clone()),
                ("latent_image", "LATENT", n.clone()),
                ("denoise", "FLOAT", json!(1.0)),
            ],
            vec!["LATENT"],
            "sampling",
        ),
        (
            "KSamplerAdvanced",
            vec![
                ("model", "MODEL", n.clone()),
                ("add_noise", "COMBO", n.clone()),
                ("noise_seed", "INT", json!(0)),
                ("steps", "INT", json!(20)),
                ("cfg", "FLOAT", json!(8.0)),
                ("sampler_name", "COMBO", n.clone()),
                ("scheduler", "COMBO", n.clone()),
                ("positive", "CONDITIONING", n.clone()),
                ("negative", "CONDITIONING", n.clone()),
                ("latent_image", "LATENT", n.clone()),
                ("start_at_step", "INT", json!(0)),
                ("end_at_step", "INT", json!(10000)),
                ("return_with_leftover_noise", "COMBO", n.clone()),
            ],
            vec!["LATENT"],
            "sampling",
        ),
        (
            "VAEDecode",
            vec![("samples", "LATENT", n.clone()), ("vae", "VAE", n.clone())],
            vec!["IMAGE"],
            "latent",
        ),
        (
            "VAEEncode",
            vec![("pixels", "IMAGE", n.clone()), ("vae", "VAE", n.clone())],
            vec!["LATENT"],
            "latent",
        ),
        (
            "VAEEncodeForInpaint",
            vec![
                ("pixels", "IMAGE", n.clone()),
                ("vae", "VAE", n.clone()),
                ("mask", "MASK", n.clone()),
                ("grow_mask_by", "INT", json!(6)),
            ],
            vec!["LATENT"],
            "latent/inpaint",
        ),
        ("PreviewImage", vec![("images", "IMAGE", n.clone())], vec![], "image"),
        (
            "ImageScaleBy",
            vec![
                ("image", "IMAGE", n.clone()),
                ("upscale_method", "COMBO", n.clone()),
                ("scale_by", "FLOAT", json!(1.0)),
            ],
            vec!["IMAGE"],
            "image/upscaling",
        ),
        (
            "LoadImageMask",
            vec![("image", "core/ASSET", n.clone()), ("channel", "COMBO", n.clone())],
            vec!["MASK"],
            "mask",
        ),
    ];
    for (class, want_inputs, want_outputs, category) in cases {
        let got = inputs(&nodes, class);
        let names: Vec<&str> = got.iter().map(|(n, _, _)| n.as_str()).collect();
        let want_names: Vec<&str> = want_inputs.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(names, want_names, "{class}: inputs");
        for ((name, kind, opts), (_, want_kind, want_default)) in got.iter().zip(&want_inputs) {
            assert_eq!(kind, want_kind, "{class}.{name}: type");
            if !want_default.is_null() {
                assert_eq!(&opts["default"], want_default, "{class}.{name}: default");
            }
        }
        assert_eq!(nodes[class]["output"], json!(want_outputs), "{class}: outputs");
        assert_eq!(nodes[class]["category"], category, "{class}: category");
    }
    let combo = |class: &str, input: &str| -> Vec<String> {
        serde_json::from_value(nodes[class]["input"]["required"][input][0].clone()).unwrap()
    };
    assert_eq!(nodes["KSampler"]["display_name"], "KSampler");
    assert_eq!(nodes["KSamplerAdvanced"]["display_name"], "KSampler (Advanced)");
    assert_eq!(nodes["CheckpointLoaderSimple"]["display_name"], "Load Checkpoint");
    assert_eq!(nodes["CLIPTextEncode"]["display_name"], "CLIP Text Encode (Prompt)");
    assert_eq!(nodes["UNETLoader"]["display_name"], "Load Diffusion Model");
    assert_eq!(nodes["CLIPLoader"]["display_name"], "Load CLIP");
    assert_eq!(nodes["DualCLIPLoader"]["display_name"], "DualCLIPLoader");
    assert_eq!(
        combo("UNETLoader", "weight_dtype"),
        ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]
    );
    assert_eq!(combo("CLIPLoader", "type")[0], "stable_diffusion");
    assert_eq!(combo("DualCLIPLoader", "type")[0], "sdxl");
    assert_eq!(combo("CLIPLoader", "device"), ["default", "cpu"]);
    assert_eq!(nodes["DualCLIPLoader"]["output_name"], json!(["CLIP"]));
    assert_eq!(nodes["SaveLatent"]["output_node"], true);
    assert_eq!(nodes["PreviewImage"]["output_node"], true);
    assert_eq!(
        combo("LatentUpscale", "upscale_method"),
        ["nearest-exact", "bilinear", "area", "bicubic", "bislerp"]
    );
    assert_eq!(combo("LatentUpscale", "crop"), ["disabled", "center"]);
    assert_eq!(combo("KSamplerAdvanced", "add_noise"), ["enable", "disable"]);
    assert_eq!(
        combo("KSamplerAdvanced", "return_with_leftover_noise"),
        ["disable", "enable"]
    );
    assert_eq!(combo("LoadImageMask", "channel"), ["alpha", "red", "green", "blue"]);
    // Every sampler and scheduler of the compute core, and its ComfyUI aliases.
    let mut samplers: Vec<String> = weft_compute::sampling::SamplerKind::ALL
        .iter()
        .map(|k| k.name().to_string())
        .collect();
    samplers.extend(
        [
            "dpmpp_sde_gpu",
            "dpmpp_2m_sde_gpu",
            "dpmpp_2m_sde_heun_gpu",
            "dpmpp_3m_sde_gpu",
        ]
        .map(String::from),
    );
    for class in ["KSampler", "KSamplerAdvanced"] {
        let mut offered = combo(class, "sampler_name");
        let mut want = samplers.clone();
        offered.sort();
        want.sort();
        assert_eq!(offered, want, "{class}: samplers");
        let mut schedulers = combo(class, "scheduler");
        let mut want: Vec<String> = weft_compute::sampling::Scheduler::ALL
            .iter()
            .map(|s| s.name().to_string())
            .collect();
        schedulers.sort();
        want.sort();
        assert_eq!(schedulers, want, "{class}: schedulers");
        assert!(offered
            .iter()
            .all(|s| s.parse::<weft_compute::sampling::SamplerKind>().is_ok()));
    }
}

#[test]
fn ckpt_name_lists_the_checkpoints_folder_when_asked_and_names_stay_inside_it() {
    let models = models_dir();
    let checkpoints = models.path().join("checkpoints");
    std::fs::write(models.path().join("outside.safetensors"), b"secret").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(
        models.path().join("outside.safetensors"),
        checkpoints.join("escape.safetensors"),
    )
    .unwrap();
    let server = server(models.path(), None, &[]);
    let options = |server: &Server| -> Vec<String> {
        let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
        serde_json::from_value(nodes["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0].clone()).unwrap()
    };
    assert_eq!(options(&server), [CHECKPOINT]);
    // A file added while the server runs is listed at the next catalogue read.
    std::fs::create_dir_all(checkpoints.join("sd15")).unwrap();
    support::tiny_checkpoint(&checkpoints.join("sd15/second.safetensors"), 1);
    assert_eq!(options(&server), ["sd15/second.safetensors", CHECKPOINT]);

    // Names outside the folder are not choices: validation refuses them.
    for name in [
        "../outside.safetensors",
        "/etc/passwd",
        "escape.safetensors",
        "sd15/../../outside.safetensors",
    ] {
        let mut graph = default_graph(1, 64, 1);
        graph["4"]["inputs"]["ckpt_name"] = json!(name);
        let r = server.post("/api/v2/jobs", &json!({"workflow": graph}));
        assert_eq!(r.status().as_u16(), 422, "{name}");
        let body: Value = r.json().unwrap();
        assert_eq!(
            body["error"]["details"]["node_errors"]["4"][0]["reason"], "value_not_in_list",
            "{name}: {body}"
        );
    }
    // Given through a link (no list to check at submit), the host refuses them as it loads.
    for (name, code) in [
        ("../outside.safetensors", "invalid_model_name"),
        ("/etc/passwd", "invalid_model_name"),
        ("escape.safetensors", "invalid_model_name"),
        ("missing.safetensors", "model_not_found"),
    ] {
        let mut graph = default_graph(1, 64, 1);
        graph["10"] = json!({"class_type": "PrimitiveString", "inputs": {"value": name}});
        graph["4"]["inputs"]["ckpt_name"] = json!(["10", 0]);
        let job = server.run(graph);
        assert_eq!(job["status"], "failed", "{name}: {job}");
        let message = job["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(code), "{name}: {job}");
        assert!(
            !message.contains(&models.path().display().to_string()),
            "no host path in {message}"
        );
    }
}

/// A safetensors file of one-value F32 tensors named `names`.
fn safetensors_with(path: &Path, names: &[&str]) {
    let mut header = serde_json::Map::new();
    for (i, name) in names.iter().enumerate() {
        header.insert(
            name.to_string(),
            json!({"dtype": "F32", "shape": [1], "data_offsets": [i * 4, i * 4 + 4]}),
        );
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(text);
    bytes.extend(std::iter::repeat_n(0u8, names.len() * 4));
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn truncated_and_other_architecture_checkpoints_are_clean_node_errors() {
    let models = models_dir();
    let checkpoints = models.path().join("checkpoints");
    let whole = std::fs::read(checkpoints.join(CHECKPOINT)).unwrap();
    std::fs::write(checkpoints.join("truncated.safetensors"), &whole[..whole.len() / 3]).unwrap();
    safetensors_with(
        &checkpoints.join("sdxl.safetensors"),
        &[
            "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
            "model.diffusion_model.label_emb.0.0.weight",
        ],
    );
    safetensors_with(
        &checkpoints.join("sd2.safetensors"),
        &["cond_stage_model.model.ln_final.weight"],
    );
    std::fs::write(checkpoints.join("garbage.safetensors"), b"this is not a checkpoint").unwrap();
    let server = server(models.path(), None, &[]);
    for name in [
        "truncated.safetensors",
        "sdxl.safetensors",
        "sd2.safetensors",
        "garbage.safetensors",
    ] {
        let mut graph = default_graph(1, 64, 1);
        graph["4"]["inputs"]["ckpt_name"] = json!(name);
        let job = server.run(graph);
        assert_eq!(job["status"], "failed", "{name}: {job}");
        assert_eq!(job["error"]["code"], "node_execution_error", "{name}: {job}");
        assert_eq!(job["error"]["node_id"], "4", "{name}: {job}");
        let message = job["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("invalid_model") && message.contains(name),
            "{name}: {message}"
        );
    }
}

/// Waits until job `id`'s `KSampler` has finished two steps.
fn wait_until_sampling(server: &Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        let p = &job["progress"];
        if p["current_node_class"] == "KSampler" && p["step"].as_u64().unwrap_or(0) >= 2 {
            return;
        }
        assert!(Instant::now() < deadline, "sampling never started: {job}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sampling_sends_latent_previews_as_small_pngs_on_the_event_stream() {
    let models = models_dir();
    let server = server(models.path(), None, &[]);
    let job = server.submit(default_graph(3, 64, 10000));
    let id = job["id"].as_str().unwrap();
    wait_until_sampling(&server, id);
    // The first preview comes with the snapshot on connect, the next one live.
    let mut sse = Sse::open(&server, id, None);
    let mut previews = Vec::new();
    while previews.len() < 2 {
        let frame = sse.next_event().expect("the stream ended before two previews");
        if frame.event == "preview" {
            previews.push(frame.data);
        }
    }
    for preview in &previews {
        assert_eq!(preview["node_id"], "3", "{preview}");
        assert_eq!(preview["content_type"], "image/png");
        let png = base64::engine::general_purpose::STANDARD
            .decode(preview["data_base64"].as_str().unwrap())
            .unwrap();
        assert!(is_png(&png));
        let size = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().unwrap());
        assert_eq!((size(16), size(20)), (8, 8), "1/8 of the 64x64 image");
    }
    server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(server.wait(id)["status"], "canceled");
}

#[test]
fn a_cancel_during_sampling_ends_the_job_canceled_before_the_next_step() {
    let models = models_dir();
    let server = server(models.path(), None, &[]);
    let job = server.submit(default_graph(3, 64, 10000));
    let id = job["id"].as_str().unwrap();
    wait_until_sampling(&server, id);
    let asked = Instant::now();
    let r = server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(r.status().as_u16(), 200);
    let done = server.wait(id);
    assert_eq!(done["status"], "canceled", "{done}");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "cancel took {:?}",
        asked.elapsed()
    );
    assert!(done["progress"]["step"].as_u64().unwrap_or(0) < 10000, "{done}");
}

#[test]
fn the_node_deadline_stops_sampling_inside_the_host() {
    let models = models_dir();
    let server = server(models.path(), None, &["--node-timeout-ms", "1500"]);
    let started = Instant::now();
    let job = server.run(default_graph(3, 64, 10000));
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "node_timeout", "{job}");
    assert_eq!(job["error"]["node_id"], "3", "{job}");
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
}

#[test]
fn a_plugin_built_against_the_frozen_first_contract_still_runs() {
    let models = models_dir();
    let plugins = plugins_with(&["weft_test_contract_v0_1"]);
    let server = server(models.path(), Some(plugins.path().to_path_buf()), &[]);
    // Images cross between a 0.2.0 plugin, the 0.1.0 one and back.
    let outputs = run_outputs(
        &server,
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 1, "color": 0}},
            "2": {"class_type": "LegacyInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "legacy"}}
        }),
    );
    assert!(is_png(&outputs[0].1));
    // A MODEL made by the 0.2.0 diffusion plugin reaches it as 0.1.0's `model` resource.
    let outputs = run_outputs(
        &server,
        json!({
            "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
            "2": {"class_type": "LegacyDescribe", "inputs": {"value": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}
        }),
    );
    assert_eq!(String::from_utf8_lossy(&outputs[0].1), format!("MODEL {CHECKPOINT}"));
}

#[test]
fn image_to_image_inpainting_hires_fix_and_latent_batches_run() {
    let models = models_dir();
    let server = server(models.path(), None, &[]);
    let image = {
        let png = run_outputs(&server, default_graph(5, 64, 2)).remove(0).1;
        server.upload("input.png", png)
    };
    let asset = json!({"__type": "core/ASSET", "info": {"id": image["id"]}});
    let base = |extra: Value| -> Value {
        let mut graph = json!({
            "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
            "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a red house"}},
            "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
            "10": {"class_type": "LoadImage", "inputs": {"image": asset.clone()}},
        });
        for (k, v) in extra.as_object().unwrap() {
            graph[k] = v.clone();
        }
        graph
    };
    let sampler = |latent: Value, denoise: f64| {
        json!({"class_type": "KSampler", "inputs": {
            "cfg": 7, "denoise": denoise, "latent_image": latent, "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "dpmpp_2m", "scheduler": "karras", "seed": 2, "steps": 3}})
    };
    let save =
        |images: Value| json!({"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": images}});
    // Image to image.
    let out = run_outputs(
        &server,
        base(json!({
            "11": {"class_type": "VAEEncode", "inputs": {"pixels": ["10", 0], "vae": ["4", 2]}},
            "3": sampler(json!(["11", 0]), 0.6),
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
            "9": save(json!(["8", 0])),
        })),
    );
    assert!(is_png(&out[0].1));
    // Inpainting with a mask from the image's red channel.
    let out = run_outputs(
        &server,
        base(json!({
            "12": {"class_type": "LoadImageMask", "inputs": {"image": asset.clone(), "channel": "red"}},
            "11": {"class_type": "VAEEncodeForInpaint", "inputs": {"pixels": ["10", 0], "vae": ["4", 2], "mask": ["12", 0], "grow_mask_by": 6}},
            "3": sampler(json!(["11", 0]), 1.0),
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
            "9": save(json!(["8", 0])),
        })),
    );
    assert!(is_png(&out[0].1));
    // Hires fix: sample, upscale the latent, sample again at denoise 0.5; batches and a
    // noise mask on the way; the first pass also saved as a latent and previewed.
    let out = run_outputs(
        &server,
        base(json!({
            "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 2}},
            "3": sampler(json!(["5", 0]), 1.0),
            "13": {"class_type": "LatentUpscale", "inputs": {"samples": ["3", 0], "upscale_method": "nearest-exact", "width": 96, "height": 96, "crop": "disabled"}},
            "14": {"class_type": "LatentFromBatch", "inputs": {"samples": ["13", 0], "batch_index": 1, "length": 1}},
            "15": {"class_type": "RepeatLatentBatch", "inputs": {"samples": ["14", 0], "amount": 2}},
            "16": sampler(json!(["15", 0]), 0.5),
            "17": {"class_type": "LatentUpscaleBy", "inputs": {"samples": ["16", 0], "upscale_method": "bilinear", "scale_by": 0.5}},
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["17", 0], "vae": ["4", 2]}},
            "9": save(json!(["8", 0])),
            "18": {"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "latents/ComfyUI"}},
            "19": {"class_type": "ImageScaleBy", "inputs": {"image": ["8", 0], "upscale_method": "bilinear", "scale_by": 2.0}},
            "20": {"class_type": "PreviewImage", "inputs": {"images": ["19", 0]}},
        })),
    );
    let pngs = out.iter().filter(|(_, b)| is_png(b)).count();
    assert_eq!(pngs, 4, "two saved and two previewed images");
    let latent = out
        .iter()
        .find(|(_, b)| !is_png(b))
        .expect("the saved latent")
        .1
        .clone();
    // The saved latent loads back unchanged.
    let uploaded = server.upload("first.latent", latent.clone());
    let out = run_outputs(
        &server,
        base(json!({
            "21": {"class_type": "LoadLatent", "inputs": {"latent": {"__type": "core/ASSET", "info": {"id": uploaded["id"]}}}},
            "8": {"class_type": "VAEDecode", "inputs": {"samples": ["21", 0], "vae": ["4", 2]}},
            "9": save(json!(["8", 0])),
            "22": {"class_type": "SaveLatent", "inputs": {"samples": ["21", 0], "filename_prefix": "again"}},
        })),
    );
    assert!(out.iter().any(|(_, b)| is_png(b)));
    let again = out
        .iter()
        .find(|(_, b)| !is_png(b))
        .expect("the latent saved again")
        .1
        .clone();
    assert_eq!(
        again, latent,
        "SaveLatent -> LoadLatent -> SaveLatent keeps every value"
    );
}

#[test]
fn area_composition_noisy_latent_composition_and_conditioning_nodes_run() {
    let models = models_dir();
    let status = Command::new(weft_bin())
        .args(["models", "tiny-vae", "--seed", "2", "--out"])
        .arg(models.path().join("vae/vae-ft-mse-840000-ema-pruned.safetensors"))
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models tiny-vae failed");
    let server = server(models.path(), None, &[]);
    let encode = |text: &str| json!({"class_type": "CLIPTextEncode", "inputs": {"clip": ["40", 0], "text": text}});
    let out = run_outputs(
        &server,
        json!({
            "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
            "40": {"class_type": "CLIPSetLastLayer", "inputs": {"clip": ["4", 1], "stop_at_clip_layer": -2}},
            "6": encode("a night sky"),
            "7": encode("a lake"),
            "8": encode("blurry"),
            "9": {"class_type": "ConditioningSetArea", "inputs": {"conditioning": ["7", 0], "width": 128, "height": 64, "x": 0, "y": 64, "strength": 1.2}},
            "10": {"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["6", 0], "conditioning_2": ["9", 0]}},
            "11": {"class_type": "ConditioningAverage", "inputs": {"conditioning_to": ["10", 0], "conditioning_from": ["6", 0], "conditioning_to_strength": 0.75}},
            "12": {"class_type": "ConditioningZeroOut", "inputs": {"conditioning": ["8", 0]}},
            "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 128, "height": 128, "batch_size": 1}},
            "13": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
            "14": {"class_type": "KSamplerAdvanced", "inputs": {
                "model": ["4", 0], "add_noise": "enable", "noise_seed": 4, "steps": 4, "cfg": 6.5, "sampler_name": "euler_ancestral",
                "scheduler": "normal", "positive": ["11", 0], "negative": ["12", 0], "latent_image": ["5", 0],
                "start_at_step": 0, "end_at_step": 2, "return_with_leftover_noise": "enable"}},
            "15": {"class_type": "KSamplerAdvanced", "inputs": {
                "model": ["4", 0], "add_noise": "enable", "noise_seed": 5, "steps": 4, "cfg": 6.5, "sampler_name": "euler",
                "scheduler": "normal", "positive": ["6", 0], "negative": ["12", 0], "latent_image": ["13", 0],
                "start_at_step": 0, "end_at_step": 2, "return_with_leftover_noise": "enable"}},
            "16": {"class_type": "LatentComposite", "inputs": {"samples_to": ["14", 0], "samples_from": ["15", 0], "x": 32, "y": 32, "feather": 16}},
            "17": {"class_type": "KSamplerAdvanced", "inputs": {
                "model": ["4", 0], "add_noise": "disable", "noise_seed": 4, "steps": 4, "cfg": 6.5, "sampler_name": "euler",
                "scheduler": "normal", "positive": ["6", 0], "negative": ["12", 0], "latent_image": ["16", 0],
                "start_at_step": 2, "end_at_step": 10000, "return_with_leftover_noise": "disable"}},
            "41": {"class_type": "VAELoader", "inputs": {"vae_name": "vae-ft-mse-840000-ema-pruned.safetensors"}},
            "18": {"class_type": "VAEDecode", "inputs": {"samples": ["17", 0], "vae": ["41", 0]}},
            "19": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["18", 0]}}
        }),
    );
    assert!(is_png(&out[0].1));
}

#[test]
fn loras_change_the_image_strength_zero_passes_through_and_foreign_or_missing_loras_are_node_errors() {
    let models = models_dir();
    let status = Command::new(weft_bin())
        .args(["models", "tiny-lora", "--seed", "3", "--out"])
        .arg(models.path().join("loras/style.safetensors"))
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models tiny-lora failed");
    safetensors_with(
        &models.path().join("loras/other-model.safetensors"),
        &["lora_unet_foo_bar.lora_up.weight", "lora_unet_foo_bar.lora_down.weight"],
    );
    let server = server(models.path(), None, &[]);
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    assert_eq!(
        nodes["LoraLoader"]["input"]["required"]["lora_name"][0],
        json!(["other-model.safetensors", "style.safetensors"])
    );
    let with_lora = |lora: Value, strength: f64| {
        let mut graph = default_graph(1, 64, 2);
        graph["20"] = json!({"class_type": "LoraLoader", "inputs": {
            "model": ["4", 0], "clip": ["4", 1], "lora_name": lora, "strength_model": strength, "strength_clip": strength}});
        graph["21"] = json!({"class_type": "LoraLoaderModelOnly", "inputs": {
            "model": ["20", 0], "lora_name": "style.safetensors", "strength_model": strength}});
        graph["3"]["inputs"]["model"] = json!(["21", 0]);
        graph["6"]["inputs"]["clip"] = json!(["20", 1]);
        graph
    };
    let pixels = |png: &[u8]| image::load_from_memory(png).unwrap().to_rgb8().into_raw();
    let plain = pixels(&run_outputs(&server, default_graph(1, 64, 2))[0].1);
    let zero = pixels(&run_outputs(&server, with_lora(json!("style.safetensors"), 0.0))[0].1);
    assert_eq!(zero, plain, "strength 0 leaves the model as it was");
    let styled = pixels(&run_outputs(&server, with_lora(json!("style.safetensors"), 1.0))[0].1);
    assert_ne!(styled, plain, "the LoRA changes the image");

    let job = server.run(with_lora(json!("other-model.safetensors"), 1.0));
    assert_eq!(job["status"], "failed", "{job}");
    assert!(
        job["error"]["message"].as_str().unwrap().contains("invalid_model"),
        "{job}"
    );
    let mut missing = with_lora(json!(["22", 0]), 1.0);
    missing["22"] = json!({"class_type": "PrimitiveString", "inputs": {"value": "nope.safetensors"}});
    let job = server.run(missing);
    assert_eq!(job["status"], "failed", "{job}");
    assert!(
        job["error"]["message"].as_str().unwrap().contains("model_not_found"),
        "{job}"
    );
}

/// Writes a tiny textual-inversion embedding with `weft models tiny-embedding`.
fn tiny_embedding(path: &Path, seed: u64) {
    let status = Command::new(weft_bin())
        .args(["models", "tiny-embedding", "--seed", &seed.to_string(), "--out"])
        .arg(path)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models tiny-embedding failed");
}

/// The default graph with prompts `positive` and `negative`, also saving the sampled
/// latent (the tiny model's prompts move its values by less than a pixel step).
fn prompted_graph(positive: &str, negative: &str) -> Value {
    let mut graph = default_graph(5, 64, 2);
    graph["6"]["inputs"]["text"] = json!(positive);
    graph["7"]["inputs"]["text"] = json!(negative);
    graph["10"] = json!({"class_type": "SaveLatent", "inputs": {"samples": ["3", 0], "filename_prefix": "prompted"}});
    graph
}

#[test]
fn prompt_weights_long_prompts_and_textual_inversion_embeddings_follow_comfyui() {
    let models = models_dir();
    tiny_embedding(&models.path().join("embeddings/EasyNegative.safetensors"), 1);
    tiny_embedding(&models.path().join("secret.safetensors"), 2);
    let server = server(models.path(), None, &[]);
    // The sampled latent's file: the same bytes for the same values.
    let image = |positive: &str, negative: &str| {
        let out = run_outputs(&server, prompted_graph(positive, negative));
        assert!(out.iter().any(|(_, b)| is_png(b)));
        out.into_iter().find(|(_, b)| !is_png(b)).expect("the saved latent").1
    };

    // ComfyUI's textual-inversion example: an embedding in the negative prompt, by file name
    // with or without its extension.
    let plain = image("a castle on a hill", "blurry");
    let embedded = image("a castle on a hill", "embedding:EasyNegative, blurry");
    assert_ne!(embedded, plain, "the embedding changes the negative prompt");
    let by_file = image("a castle on a hill", "embedding:EasyNegative.safetensors, blurry");
    assert_eq!(by_file, embedded, "name and file name are the same embedding");
    assert_ne!(
        image("a castle on a hill", "(embedding:EasyNegative:1.5), blurry"),
        embedded,
        "embeddings take weights"
    );

    // Weights change the image; a weight of 1 does not; brackets are text, not weights.
    assert_ne!(image("a (castle:1.6) on a hill", "blurry"), plain);
    assert_ne!(image("a ((castle)) on a hill", "blurry"), plain);
    assert_eq!(image("a (castle:1.0) on a hill", "blurry"), plain);
    assert_ne!(image("a [castle] on a hill", "blurry"), plain);
    // Malformed weighting is text, never a failure.
    image("a ((castle on a hill", "blurry)) \\(x\\) (:) (a:b:c)");

    // A 200-token prompt runs (three chunks against the negative's one).
    let long = "castle ".repeat(200);
    let long_image = image(&long, "blurry");
    assert_ne!(
        long_image,
        image(&"castle ".repeat(75), "blurry"),
        "tokens past 75 count"
    );

    // Names outside the embeddings folder and missing embeddings are clean node errors.
    for (text, expected) in [
        ("embedding:../secret", "embedding:../secret"),
        ("a embedding:missing castle", "embedding:missing"),
    ] {
        let job = server.run(prompted_graph("a castle", text));
        assert_eq!(job["status"], "failed", "{job}");
        let message = job["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{job}");
    }
}

#[test]
fn the_precision_is_reported_per_network_and_the_cpu_computes_in_float32_whatever_is_asked() {
    let models = models_dir();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("server.log");
    let asked = Server::with(Options {
        args: vec![
            "--models-dir".into(),
            models.path().display().to_string(),
            "--precision".into(),
            "float16".into(),
        ],
        log_file: Some(log.clone()),
        ..Default::default()
    });
    let plain = server(models.path(), None, &[]);
    let graph = default_graph(7, 64, 2);
    assert_eq!(run_outputs(&asked, graph.clone()), run_outputs(&plain, graph));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("networks loaded (unet float32, text float32, vae float32)"),
        "no precision report in the log:\n{text}"
    );
}
