//! ComfyUI's model patch nodes against the real server: `ModelSamplingDiscrete`,
//! `ModelSamplingContinuousEDM` and `RescaleCFG` have ComfyUI's contract, each patch moves
//! the sampled latent of ComfyUI's default graph on tiny random-weight SD1 and SDXL
//! checkpoints (the `eps` patch without zsnr is the model's own sampling, byte for byte),
//! and bad settings are clean node errors.

mod support;

use serde_json::{json, Value};
use support::Server;

/// The SD1 checkpoint name ComfyUI's default workflow uses.
const SD1: &str = "v1-5-pruned-emaonly.safetensors";
/// The checkpoint name ComfyUI's SDXL example workflow uses.
const SDXL: &str = "sd_xl_base_1.0.safetensors";

/// A models directory with tiny SD1 and SDXL checkpoints, and a server over it with the
/// node cache off (every run computes).
fn setup() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    support::tiny_checkpoint(&checkpoints.join(SD1), 0);
    support::tiny_model("tiny-sdxl", &checkpoints.join(SDXL), 0);
    let server = support::models_server(dir.path());
    (dir, server)
}

/// ComfyUI's default graph on `checkpoint` (64 pixels, 3 steps), its sampled latent saved
/// by `SaveLatent`, with `patches` (`class_type`, inputs) chained between the checkpoint's
/// `MODEL` and the sampler.
fn graph(checkpoint: &str, patches: &[(&str, Value)]) -> Value {
    let mut g = json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": 5, "steps": 3}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse at dusk"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "10": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI", "samples": ["3", 0]}}
    });
    let mut model = json!(["4", 0]);
    for (i, (class, inputs)) in patches.iter().enumerate() {
        let id = format!("{}", 20 + i);
        let mut inputs = inputs.clone();
        inputs["model"] = model;
        g[&id] = json!({"class_type": class, "inputs": inputs});
        model = json!([id, 0]);
    }
    g["3"]["inputs"]["model"] = model;
    g
}

/// Runs `graph` and returns the bytes of its saved latent, asserting success.
fn latent(server: &Server, graph: Value) -> Vec<u8> {
    let job = server.run(graph);
    assert_eq!(job["status"], "succeeded", "{job}");
    let output = &job["outputs"][0];
    server.download(output["url"].as_str().unwrap())
}

/// Runs `graph`, asserting it fails at node `node` with a node error of `code`.
fn assert_node_error(server: &Server, graph: Value, node: &str, code: &str) {
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    let error = &job["error"];
    assert_eq!(error["node_id"], node, "{job}");
    let message = error["message"].as_str().unwrap_or("");
    assert!(message.contains(code), "{job}");
}

#[test]
fn the_patch_nodes_have_comfyuis_inputs_defaults_and_category() {
    let (_dir, server) = setup();
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let order = |class: &str| nodes[class]["input_order"]["required"].clone();
    assert_eq!(order("ModelSamplingDiscrete"), json!(["model", "sampling", "zsnr"]));
    assert_eq!(
        order("ModelSamplingContinuousEDM"),
        json!(["model", "sampling", "sigma_max", "sigma_min"])
    );
    assert_eq!(order("RescaleCFG"), json!(["model", "multiplier"]));
    let input = |class: &str, name: &str| nodes[class]["input"]["required"][name].clone();
    assert_eq!(
        input("ModelSamplingDiscrete", "sampling")[0],
        json!(["eps", "v_prediction", "lcm", "x0", "img_to_img"])
    );
    assert_eq!(input("ModelSamplingDiscrete", "zsnr")[0], "BOOLEAN");
    assert_eq!(input("ModelSamplingDiscrete", "zsnr")[1]["default"], json!(false));
    assert_eq!(
        input("ModelSamplingContinuousEDM", "sampling")[0],
        json!(["v_prediction", "edm", "edm_playground_v2.5", "eps"])
    );
    // FLOAT inputs: [default, min, max, step].
    let numbers = |spec: &Value| ["default", "min", "max", "step"].map(|k| spec[1][k].as_f64());
    let edm = |name: &str| input("ModelSamplingContinuousEDM", name);
    assert_eq!(numbers(&edm("sigma_max")), [120.0, 0.0, 1000.0, 0.001].map(Some));
    assert_eq!(numbers(&edm("sigma_min")), [0.002, 0.0, 1000.0, 0.001].map(Some));
    let multiplier = input("RescaleCFG", "multiplier");
    assert_eq!(numbers(&multiplier), [0.7, 0.0, 1.0, 0.01].map(Some));
    for spec in [edm("sigma_max"), edm("sigma_min"), multiplier] {
        assert_eq!(spec[0], "FLOAT");
    }
    for class in ["ModelSamplingDiscrete", "ModelSamplingContinuousEDM", "RescaleCFG"] {
        assert_eq!(nodes[class]["category"], "advanced/model", "{class}");
        assert_eq!(nodes[class]["output"], json!(["MODEL"]), "{class}");
        assert_eq!(nodes[class]["input"]["required"]["model"][0], "MODEL", "{class}");
    }
}

#[test]
fn every_patch_moves_the_sampled_latent_and_eps_without_zsnr_is_the_unpatched_model() {
    let (_dir, server) = setup();
    let plain = latent(&server, graph(SD1, &[]));
    let discrete = |sampling: &str, zsnr: bool| ("ModelSamplingDiscrete", json!({"sampling": sampling, "zsnr": zsnr}));
    assert_eq!(plain, latent(&server, graph(SD1, &[discrete("eps", false)])));
    let mut patches = vec![discrete("eps", true)];
    for sampling in ["v_prediction", "lcm", "x0", "img_to_img"] {
        patches.extend([discrete(sampling, false), discrete(sampling, true)]);
    }
    for sampling in ["v_prediction", "edm", "edm_playground_v2.5", "eps"] {
        let inputs = json!({"sampling": sampling, "sigma_max": 120.0, "sigma_min": 0.002});
        patches.push(("ModelSamplingContinuousEDM", inputs));
    }
    patches.push(("RescaleCFG", json!({"multiplier": 0.7})));
    for patch in patches {
        let patched = latent(&server, graph(SD1, std::slice::from_ref(&patch)));
        assert_ne!(plain, patched, "{patch:?}");
    }
}

#[test]
fn sdxl_samples_with_v_prediction_zsnr_and_rescale_cfg_chained() {
    let (_dir, server) = setup();
    let plain = latent(&server, graph(SDXL, &[]));
    let v = (
        "ModelSamplingDiscrete",
        json!({"sampling": "v_prediction", "zsnr": true}),
    );
    let rescale = ("RescaleCFG", json!({"multiplier": 0.7}));
    let v_only = latent(&server, graph(SDXL, std::slice::from_ref(&v)));
    let both = latent(&server, graph(SDXL, &[v.clone(), rescale.clone()]));
    assert_ne!(plain, v_only);
    assert_ne!(v_only, both);
    // The patches are independent: RescaleCFG first gives the same model.
    assert_eq!(both, latent(&server, graph(SDXL, &[rescale, v])));
}

#[test]
fn an_inverted_zero_or_empty_sigma_range_is_a_clean_node_error() {
    let (_dir, server) = setup();
    let edm = |max: f64, min: f64| {
        let inputs = json!({"sampling": "eps", "sigma_max": max, "sigma_min": min});
        graph(SD1, &[("ModelSamplingContinuousEDM", inputs)])
    };
    // Inside the inputs' ranges, but no schedule: ComfyUI would fail in log(0) or sample
    // backwards.
    for (max, min) in [(0.002, 120.0), (120.0, 0.0), (5.0, 5.0)] {
        assert_node_error(&server, edm(max, min), "20", "invalid_input");
    }
    // The server still samples afterwards.
    latent(&server, graph(SD1, &[]));
}

#[test]
fn settings_outside_the_inputs_contract_are_refused_at_submit() {
    let (_dir, server) = setup();
    let refused = |patch: (&str, Value)| {
        let r = server.post("/api/v2/jobs", &json!({ "workflow": graph(SD1, &[patch]) }));
        assert_eq!(r.status().as_u16(), 422);
        let body: Value = r.json().unwrap();
        assert_eq!(body["error"]["code"], "invalid_workflow", "{body}");
        body["error"]["details"]["node_errors"]["20"][0]["reason"].clone()
    };
    let edm = json!({"sampling": "eps", "sigma_max": 1200.0, "sigma_min": 0.002});
    assert_eq!(refused(("ModelSamplingContinuousEDM", edm)), "value_bigger_than_max");
    assert_eq!(
        refused(("RescaleCFG", json!({"multiplier": 1.5}))),
        "value_bigger_than_max"
    );
    // ComfyUI 0.3.64's `cosmos_rflow` is for Cosmos models, which weft does not load.
    let cosmos = json!({"sampling": "cosmos_rflow", "sigma_max": 80.0, "sigma_min": 0.002});
    assert_eq!(refused(("ModelSamplingContinuousEDM", cosmos)), "value_not_in_list");
    let unknown = json!({"sampling": "flow", "zsnr": false});
    assert_eq!(refused(("ModelSamplingDiscrete", unknown)), "value_not_in_list");
}
