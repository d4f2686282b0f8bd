//! ComfyUI's custom-sampling nodes against the real server, on tiny random-weight SD1 and
//! SDXL checkpoints: `SamplerCustom` and `SamplerCustomAdvanced` with `KSamplerSelect` and
//! `BasicScheduler` give `KSampler`'s own latent byte for byte, the `Sampler*` nodes'
//! defaults are `KSampler`'s samplers and their parameters count, ComfyUI's SDXL Turbo graph
//! runs, the guiders and sigma edits do what ComfyUI's do, the nodes have ComfyUI's
//! contract, and bad values are clean node errors.

mod support;

use serde_json::{json, Value};
use support::Server;

/// The SD1 checkpoint name ComfyUI's default workflow uses.
const SD1: &str = "v1-5-pruned-emaonly.safetensors";
/// The checkpoint name ComfyUI's SDXL Turbo example uses.
const TURBO: &str = "sd_xl_turbo_1.0_fp16.safetensors";

/// A models directory with tiny SD1 and SDXL checkpoints, and a server over it with the
/// node cache off (every run computes).
fn setup() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    support::tiny_checkpoint(&checkpoints.join(SD1), 0);
    support::tiny_model("tiny-sdxl", &checkpoints.join(TURBO), 0);
    let server = support::models_server(dir.path());
    (dir, server)
}

/// The shared part of every graph: checkpoint `4`, prompts `6` and `7`, an empty 64-pixel
/// latent `5`, and `SaveLatent` `10` of whatever node `sampled` names.
fn base(checkpoint: &str, sampled: Value) -> Value {
    json!({
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse at dusk"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "10": {"class_type": "SaveLatent", "inputs": {"filename_prefix": "latents/ComfyUI", "samples": sampled}}
    })
}

/// `KSampler` with `sampler` over 3 `normal` steps at seed 5.
fn ksampler(sampler: &str, cfg: f64) -> Value {
    let mut g = base(SD1, json!(["3", 0]));
    g["3"] = json!({"class_type": "KSampler", "inputs": {
        "cfg": cfg, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
        "positive": ["6", 0], "sampler_name": sampler, "scheduler": "normal", "seed": 5, "steps": 3}});
    g
}

/// `SamplerCustom` (seed 5, cfg 8) with the `SAMPLER` node `sampler` and `BasicScheduler`'s
/// 3 `normal` steps; `output` picks the sampled (0) or denoised (1) latent.
fn sampler_custom(sampler: (&str, Value), output: u32) -> Value {
    let mut g = base(SD1, json!(["3", output]));
    g["3"] = json!({"class_type": "SamplerCustom", "inputs": {
        "model": ["4", 0], "add_noise": true, "noise_seed": 5, "cfg": 8, "positive": ["6", 0],
        "negative": ["7", 0], "sampler": ["20", 0], "sigmas": ["21", 0], "latent_image": ["5", 0]}});
    g["20"] = json!({"class_type": sampler.0, "inputs": sampler.1});
    g["21"] = json!({"class_type": "BasicScheduler", "inputs": {
        "model": ["4", 0], "scheduler": "normal", "steps": 3, "denoise": 1.0}});
    g
}

fn select(name: &str) -> (&'static str, Value) {
    ("KSamplerSelect", json!({"sampler_name": name}))
}

/// Runs `graph` and returns the bytes of its saved latent, asserting success.
fn latent(server: &Server, graph: Value) -> Vec<u8> {
    let job = server.run(graph);
    assert_eq!(job["status"], "succeeded", "{job}");
    let output = job["outputs"].as_array().unwrap().iter().find(|o| o["node_id"] == "10");
    server.download(output.expect("the saved latent")["url"].as_str().unwrap())
}

/// Runs `graph`, asserting it fails at node `node` with a node error of `code`.
fn assert_node_error(server: &Server, graph: Value, node: &str, code: &str) {
    let job = server.run(graph);
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["node_id"], node, "{job}");
    let message = job["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(code), "{job}");
}

#[test]
fn sampler_custom_with_ksampler_select_and_basic_scheduler_is_ksampler_byte_for_byte() {
    let (_dir, server) = setup();
    // A deterministic, an ancestral (seeded noise) and an SDE (Brownian tree) sampler.
    for name in ["euler", "euler_ancestral", "dpmpp_2m_sde"] {
        let own = latent(&server, ksampler(name, 8.0));
        assert_eq!(own, latent(&server, sampler_custom(select(name), 0)), "{name}");
    }
}

#[test]
fn sampler_custom_advanced_with_random_noise_and_cfg_guider_is_ksampler_byte_for_byte() {
    let (_dir, server) = setup();
    let own = latent(&server, ksampler("dpmpp_2m", 8.0));
    let mut g = sampler_custom(select("dpmpp_2m"), 0);
    g["3"] = json!({"class_type": "SamplerCustomAdvanced", "inputs": {
        "noise": ["22", 0], "guider": ["23", 0], "sampler": ["20", 0], "sigmas": ["21", 0],
        "latent_image": ["5", 0]}});
    g["22"] = json!({"class_type": "RandomNoise", "inputs": {"noise_seed": 5}});
    g["23"] = json!({"class_type": "CFGGuider", "inputs": {
        "model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "cfg": 8}});
    assert_eq!(own, latent(&server, g.clone()));
    // Without guidance, BasicGuider is CFGGuider at cfg 1 (the negative is never run).
    g["23"]["inputs"]["cfg"] = json!(1.0);
    let unguided = latent(&server, g.clone());
    g["23"] = json!({"class_type": "BasicGuider", "inputs": {"model": ["4", 0], "conditioning": ["6", 0]}});
    assert_eq!(unguided, latent(&server, g.clone()));
    assert_ne!(unguided, own);
    // DisableNoise starts from the empty latent itself: another result.
    g["22"] = json!({"class_type": "DisableNoise", "inputs": {}});
    assert_ne!(unguided, latent(&server, g));
}

#[test]
fn the_sampler_nodes_defaults_are_ksamplers_samplers_and_their_parameters_count() {
    let (_dir, server) = setup();
    let run = |node: &str, inputs: Value| latent(&server, sampler_custom((node, inputs), 0));
    let ancestral = run("SamplerEulerAncestral", json!({"eta": 1.0, "s_noise": 1.0}));
    assert_eq!(ancestral, latent(&server, ksampler("euler_ancestral", 8.0)));
    assert_ne!(
        ancestral,
        run("SamplerEulerAncestral", json!({"eta": 0.5, "s_noise": 1.0}))
    );
    assert_ne!(
        ancestral,
        run("SamplerEulerAncestral", json!({"eta": 1.0, "s_noise": 0.5}))
    );
    let lms = run("SamplerLMS", json!({"order": 4}));
    assert_eq!(lms, latent(&server, ksampler("lms", 8.0)));
    assert_ne!(lms, run("SamplerLMS", json!({"order": 1})));
    let sde = |solver: &str, eta: f64| {
        let inputs = json!({"solver_type": solver, "eta": eta, "s_noise": 1.0, "noise_device": "cpu"});
        run("SamplerDPMPP_2M_SDE", inputs)
    };
    assert_eq!(sde("midpoint", 1.0), latent(&server, ksampler("dpmpp_2m_sde", 8.0)));
    assert_eq!(
        sde("heun", 1.0),
        latent(&server, ksampler("dpmpp_2m_sde_heun_gpu", 8.0))
    );
    assert_ne!(sde("midpoint", 1.0), sde("midpoint", 0.0));
    let dpmpp_sde = |r: f64| {
        let inputs = json!({"eta": 1.0, "s_noise": 1.0, "r": r, "noise_device": "gpu"});
        run("SamplerDPMPP_SDE", inputs)
    };
    assert_eq!(dpmpp_sde(0.5), latent(&server, ksampler("dpmpp_sde", 8.0)));
    assert_ne!(dpmpp_sde(0.5), dpmpp_sde(0.3));
    for (node, inputs) in [
        (
            "SamplerDPMPP_3M_SDE",
            json!({"eta": 0.5, "s_noise": 1.0, "noise_device": "cpu"}),
        ),
        ("SamplerDPMPP_2S_Ancestral", json!({"eta": 0.5, "s_noise": 0.8})),
    ] {
        run(node, inputs);
    }
}

#[test]
fn comfyuis_sdxl_turbo_graph_runs_with_sd_turbo_scheduler_and_sampler_custom() {
    let (_dir, server) = setup();
    // ComfyUI's SDXL Turbo example, at 64 pixels.
    let graph = json!({
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a photo of a cat", "clip": ["20", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["20", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["13", 0], "vae": ["20", 2]}},
        "13": {"class_type": "SamplerCustom", "inputs": {
            "add_noise": true, "noise_seed": 0, "cfg": 1.0, "model": ["20", 0], "positive": ["6", 0],
            "negative": ["7", 0], "sampler": ["14", 0], "sigmas": ["22", 0], "latent_image": ["5", 0]}},
        "14": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler_ancestral"}},
        "20": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": TURBO}},
        "22": {"class_type": "SDTurboScheduler", "inputs": {"steps": 1, "denoise": 1.0, "model": ["20", 0]}},
        "25": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}}
    });
    let job = server.run(graph.clone());
    assert_eq!(job["status"], "succeeded", "{job}");
    let image = job["outputs"].as_array().unwrap().iter().find(|o| o["node_id"] == "25");
    let png = server.download(image.expect("an image")["url"].as_str().unwrap());
    assert_eq!(&png[1..4], b"PNG");
    let mut two = graph;
    two["22"]["inputs"]["steps"] = json!(2);
    assert_eq!(server.run(two)["status"], "succeeded");
}

#[test]
fn sampler_custom_reports_its_sampler_steps_as_job_progress() {
    let (_dir, server) = setup();
    // Enough steps that the stream, opened after the submit, sees some of them live.
    let mut g = sampler_custom(select("euler"), 0);
    g["21"]["inputs"]["steps"] = json!(300);
    let job = server.submit(g);
    let frames = support::sse::Sse::open(&server, job["id"].as_str().unwrap(), None).rest();
    let steps: Vec<&Value> = frames
        .iter()
        .filter(|f| f.event == "progress" && f.data["steps"] == 300)
        .map(|f| &f.data)
        .collect();
    assert!(!steps.is_empty(), "{frames:?}");
    for progress in steps {
        assert_eq!(progress["current_node"], "3", "{progress}");
        assert!((1..=300).contains(&progress["step"].as_u64().unwrap()), "{progress}");
    }
}

#[test]
fn split_sigmas_hand_off_and_the_denoised_output_differ_from_the_full_run() {
    let (_dir, server) = setup();
    let full = latent(&server, sampler_custom(select("euler"), 0));
    // The high sigmas with noise, then the low ones without: a two-sampler hand-off.
    let mut g = sampler_custom(select("euler"), 0);
    g["24"] = json!({"class_type": "SplitSigmas", "inputs": {"sigmas": ["21", 0], "step": 1}});
    g["3"]["inputs"]["sigmas"] = json!(["24", 0]);
    // Stopped at a sigma above 0, the output is still noisy; denoised_output is the model's
    // last prediction of the clean latent.
    let first = latent(&server, g.clone());
    g["10"]["inputs"]["samples"] = json!(["3", 1]);
    let first_denoised = latent(&server, g.clone());
    assert!(
        first != first_denoised,
        "denoised_output is the last prediction, not the output"
    );
    g["30"] = g["3"].clone();
    g["30"]["inputs"]["add_noise"] = json!(false);
    g["30"]["inputs"]["sigmas"] = json!(["24", 1]);
    g["30"]["inputs"]["latent_image"] = json!(["3", 0]);
    g["10"]["inputs"]["samples"] = json!(["30", 0]);
    let handed_off = latent(&server, g.clone());
    assert_eq!(handed_off.len(), full.len());
    assert!(handed_off != first, "the second sampler ran");
    // Flipped sigmas run too (unsampling), and SplitSigmasDenoise's low half is a schedule.
    g["25"] = json!({"class_type": "FlipSigmas", "inputs": {"sigmas": ["24", 1]}});
    g["30"]["inputs"]["sigmas"] = json!(["25", 0]);
    latent(&server, g.clone());
    g["24"] = json!({"class_type": "SplitSigmasDenoise", "inputs": {"sigmas": ["21", 0], "denoise": 0.5}});
    latent(&server, g);
}

#[test]
fn every_scheduler_node_makes_sigmas_that_sample() {
    let (_dir, server) = setup();
    let range = json!({"steps": 3, "sigma_max": 14.614642, "sigma_min": 0.0291675});
    let with = |extra: Value| {
        let mut inputs = range.clone();
        inputs
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        inputs
    };
    let schedulers = [
        ("KarrasScheduler", with(json!({"rho": 7.0}))),
        ("ExponentialScheduler", range.clone()),
        ("PolyexponentialScheduler", with(json!({"rho": 1.0}))),
        ("LaplaceScheduler", with(json!({"mu": 0.0, "beta": 0.5}))),
        (
            "VPScheduler",
            json!({"steps": 3, "beta_d": 19.9, "beta_min": 0.1, "eps_s": 0.001}),
        ),
        (
            "SDTurboScheduler",
            json!({"model": ["4", 0], "steps": 2, "denoise": 1.0}),
        ),
        (
            "BetaSamplingScheduler",
            json!({"model": ["4", 0], "steps": 3, "alpha": 0.6, "beta": 0.6}),
        ),
        (
            "AlignYourStepsScheduler",
            json!({"model_type": "SD1", "steps": 3, "denoise": 1.0}),
        ),
        ("ManualSigmas", json!({"sigmas": "14.6, 3.0, 0.5, 0"})),
    ];
    let mut seen = Vec::new();
    for (class, inputs) in schedulers {
        let mut g = sampler_custom(select("euler"), 0);
        g["21"] = json!({"class_type": class, "inputs": inputs});
        let out = latent(&server, g);
        assert!(!seen.contains(&out), "{class} gave another scheduler's latent");
        seen.push(out);
    }
}

#[test]
fn negative_or_too_many_sigmas_and_bad_sampler_settings_are_clean_node_errors() {
    let (_dir, server) = setup();
    let manual = |text: &str| {
        let mut g = sampler_custom(select("euler"), 0);
        g["21"] = json!({"class_type": "ManualSigmas", "inputs": {"sigmas": text}});
        g
    };
    assert_node_error(&server, manual("5, -1, 0"), "21", "invalid_input");
    assert_node_error(&server, manual(&"1 ".repeat(10_002)), "21", "invalid_input");
    // An inverted range for a formula schedule.
    let mut g = sampler_custom(select("euler"), 0);
    g["21"] = json!({"class_type": "KarrasScheduler", "inputs": {
        "steps": 3, "sigma_max": 0.5, "sigma_min": 10.0, "rho": 7.0}});
    assert_node_error(&server, g, "21", "invalid_input");
    // Values outside an input's contract are refused at submit.
    let r = server.post(
        "/api/v2/jobs",
        &json!({"workflow": sampler_custom(("SamplerLMS", json!({"order": 0})), 0)}),
    );
    assert_eq!(r.status().as_u16(), 422);
    // The server still samples afterwards.
    latent(&server, sampler_custom(select("euler"), 0));
}

#[test]
fn the_custom_sampling_nodes_have_comfyuis_inputs_outputs_and_categories() {
    let (_dir, server) = setup();
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let order = |class: &str| nodes[class]["input_order"]["required"].clone();
    assert_eq!(
        order("SamplerCustom"),
        json!([
            "model",
            "add_noise",
            "noise_seed",
            "cfg",
            "positive",
            "negative",
            "sampler",
            "sigmas",
            "latent_image"
        ])
    );
    assert_eq!(
        order("SamplerCustomAdvanced"),
        json!(["noise", "guider", "sampler", "sigmas", "latent_image"])
    );
    assert_eq!(
        order("DualCFGGuider"),
        json!([
            "model",
            "cond1",
            "cond2",
            "negative",
            "cfg_conds",
            "cfg_cond2_negative",
            "style"
        ])
    );
    for class in ["SamplerCustom", "SamplerCustomAdvanced"] {
        assert_eq!(nodes[class]["output"], json!(["LATENT", "LATENT"]), "{class}");
        assert_eq!(
            nodes[class]["output_name"],
            json!(["output", "denoised_output"]),
            "{class}"
        );
        assert_eq!(nodes[class]["category"], "sampling/custom_sampling", "{class}");
    }
    assert_eq!(
        nodes["SplitSigmas"]["output_name"],
        json!(["high_sigmas", "low_sigmas"])
    );
    let input = |class: &str, name: &str| nodes[class]["input"]["required"][name].clone();
    assert_eq!(input("SamplerCustomAdvanced", "noise")[0], "NOISE");
    assert_eq!(input("SamplerCustomAdvanced", "guider")[0], "GUIDER");
    assert_eq!(input("SamplerCustom", "sampler")[0], "SAMPLER");
    assert_eq!(input("SamplerCustom", "sigmas")[0], "SIGMAS");
    assert_eq!(input("SamplerCustom", "add_noise")[1]["default"], json!(true));
    let ksampler_names = &nodes["KSampler"]["input"]["required"]["sampler_name"][0];
    assert_eq!(&input("KSamplerSelect", "sampler_name")[0], ksampler_names);
    assert_eq!(
        input("SamplerDPMPP_2M_SDE", "solver_type")[0],
        json!(["midpoint", "heun"])
    );
    assert_eq!(input("SamplerDPMPP_SDE", "noise_device")[0], json!(["gpu", "cpu"]));
    assert_eq!(
        input("AlignYourStepsScheduler", "model_type")[0],
        json!(["SD1", "SDXL", "SVD"])
    );
    let numbers = |spec: &Value| ["default", "min", "max"].map(|k| spec[1][k].as_f64());
    assert_eq!(numbers(&input("SDTurboScheduler", "steps")), [1.0, 1.0, 10.0].map(Some));
    assert_eq!(numbers(&input("KarrasScheduler", "rho")), [7.0, 0.0, 100.0].map(Some));
    for (class, output, category) in [
        ("KSamplerSelect", "SAMPLER", "samplers"),
        ("SamplerEulerAncestral", "SAMPLER", "samplers"),
        ("BasicScheduler", "SIGMAS", "schedulers"),
        ("KarrasScheduler", "SIGMAS", "schedulers"),
        ("FlipSigmas", "SIGMAS", "sigmas"),
        ("RandomNoise", "NOISE", "noise"),
        ("DisableNoise", "NOISE", "noise"),
        ("CFGGuider", "GUIDER", "guiders"),
        ("BasicGuider", "GUIDER", "guiders"),
    ] {
        assert_eq!(nodes[class]["output"], json!([output]), "{class}");
        assert_eq!(
            nodes[class]["category"],
            format!("sampling/custom_sampling/{category}"),
            "{class}"
        );
    }
}
