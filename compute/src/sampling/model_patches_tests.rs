//! The model patch nodes' numbers against ComfyUI's: sigma tables, schedules, timesteps,
//! input scaling and denoised predictions per sampling choice, and `RescaleCFG`, from
//! `tests/fixtures/sdxl-components/model_patches.json` (made by `make_model_patches.py`
//! beside it) and `sampling.json` (made by `make_components.py`).

use serde_json::Value;

use super::{ksampler_sigmas, rescale_cfg, DiscreteSampling, EdmSampling, ModelSampling, SamplerKind, Scheduler};

fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/../tests/fixtures/sdxl-components/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The numbers of a (nested) JSON array, flattened.
fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(items) => items.iter().flat_map(floats).collect(),
        _ => vec![v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")) as f32],
    }
}

/// Asserts discrete model timesteps agree, or that `sigma` lies halfway between the two
/// table entries in log space: there the nearest entry turns on the last bit of float32
/// logarithms, which torch's vectorised `log` (and CUDA's) do not round correctly.
fn assert_timesteps(what: &str, ms: &ModelSampling, sigmas: &[f32], want: &[f32]) {
    let step = if ms.sigmas().len() == 50 { 20.0 } else { 1.0 };
    for ((&sigma, &w), i) in sigmas.iter().zip(want).zip(0..) {
        let g = ms.timestep(sigma);
        if g == w {
            continue;
        }
        let entry = |t: f32| ms.log_sigmas()[((t - (step - 1.0)) / step).round() as usize] as f64;
        let ls = (sigma as f64).ln();
        let gap = ((ls - entry(g)).abs() - (ls - entry(w)).abs()).abs();
        assert!(gap < 1e-6, "{what}[{i}]: timestep {g}, ComfyUI {w} (not a tie: {gap})");
    }
}

/// Asserts `got` is `want` within `rel` relative (or `abs` absolute near zero).
fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32, abs: f32) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= abs.max(rel * w.abs());
        assert!(ok, "{what}[{i}]: got {g}, ComfyUI {w}");
    }
}

/// float32 results that torch's vectorised `exp`/`log` may put 1 ulp from the correctly
/// rounded ones weft computes.
const ULPS: f32 = 2.5e-7;

/// The model sampling of a table of the fixture.
fn table(name: &str) -> ModelSampling {
    let continuous = |sampling, max| ModelSampling::continuous_edm(sampling, 0.002, max).unwrap();
    match name {
        "discrete" => ModelSampling::discrete(DiscreteSampling::Eps, false),
        "discrete_zsnr" => ModelSampling::discrete(DiscreteSampling::Eps, true),
        "lcm" => ModelSampling::discrete(DiscreteSampling::Lcm, false),
        "lcm_zsnr" => ModelSampling::discrete(DiscreteSampling::Lcm, true),
        "edm" => continuous(EdmSampling::Eps, 120.0),
        "edm_playground" => continuous(EdmSampling::EdmPlayground25, 80.0),
        other => panic!("unknown table {other}"),
    }
}

/// The model sampling a node makes for a `predictions` entry of the fixture.
fn node_sampling(case: &Value) -> ModelSampling {
    let sampling = case["sampling"].as_str().unwrap();
    match case["node"].as_str().unwrap() {
        "ModelSamplingDiscrete" => ModelSampling::discrete(sampling.parse().unwrap(), case["zsnr"].as_bool().unwrap()),
        _ => {
            let range = floats(&case["sigma_range"]);
            ModelSampling::continuous_edm(sampling.parse().unwrap(), range[0] as f64, range[1] as f64).unwrap()
        }
    }
}

#[test]
fn sigma_tables_schedules_and_timesteps_match_comfyui() {
    let root = fixture("model_patches.json");
    let steps = root["steps"].as_u64().unwrap() as usize;
    for (name, want) in root["tables"].as_object().unwrap() {
        let ms = table(name);
        assert_eq!(ms.sigmas().len() as u64, want["table_len"].as_u64().unwrap(), "{name}");
        let at: Vec<usize> = want["indices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect();
        let pick = |v: &[f32]| at.iter().map(|&i| v[i]).collect::<Vec<_>>();
        assert_close(name, &pick(ms.sigmas()), &floats(&want["sigmas"]), ULPS, 0.0);
        let logs = floats(&want["log_sigmas"]);
        assert_close(name, &pick(ms.log_sigmas()), &logs, ULPS, 1e-7);
        for scheduler in root["schedulers"].as_array().unwrap() {
            let scheduler: Scheduler = scheduler.as_str().unwrap().parse().unwrap();
            let got = ksampler_sigmas(&ms, scheduler, SamplerKind::Euler, steps, 1.0);
            let what = format!("{name} {scheduler}");
            assert_close(&what, &got, &floats(&want["schedules"][scheduler.name()]), 1e-6, 0.0);
        }
        let normal = floats(&want["schedules"]["normal"]);
        let timesteps = floats(&want["timestep_of_normal"]);
        if name.starts_with("edm") {
            let got: Vec<f32> = normal[..normal.len() - 1].iter().map(|&s| ms.timestep(s)).collect();
            assert_close(name, &got, &timesteps, 1e-6, 1e-6);
        } else {
            assert_timesteps(name, &ms, &normal[..normal.len() - 1], &timesteps);
        }
        let probes = floats(&want["sigma_at"]["timesteps"]);
        let sigmas: Vec<f32> = probes.iter().map(|&t| ms.sigma(t)).collect();
        assert_close(name, &sigmas, &floats(&want["sigma_at"]["sigmas"]), 1e-6, 0.0);
        let scaling = &want["noise_scaling"];
        let (noise, latent) = (floats(&scaling["noise"]), floats(&scaling["latent"]));
        let sigma = scaling["sigma"].as_f64().unwrap() as f32;
        assert_eq!(sigma, ms.sigma_max(), "{name}");
        for (max_denoise, key) in [(true, "max_denoise"), (false, "plain")] {
            let got = ms.noise_scaling(sigma, &noise, &latent, max_denoise);
            assert_close(name, &got, &floats(&scaling[key]), 1e-6, 1e-6);
        }
    }
}

#[test]
fn each_sampling_choice_scales_and_denoises_as_comfyui() {
    let root = fixture("model_patches.json");
    for case in root["predictions"].as_array().unwrap() {
        let ms = node_sampling(case);
        let what = format!("{} {}", case["node"], case["sampling"]);
        // A prediction type keeps its table: v_prediction and x0 share eps's.
        assert_eq!(ms.sigmas(), table(case["table"].as_str().unwrap()).sigmas(), "{what}");
        assert_eq!(ms.sigma_data() as f64, case["sigma_data"].as_f64().unwrap(), "{what}");
        for step in case["algebra"].as_array().unwrap() {
            let sigma = step["sigma"].as_f64().unwrap() as f32;
            let (x, output) = (floats(&step["x"]), floats(&step["output"]));
            let what = format!("{what} at sigma {sigma}");
            assert_close(
                &what,
                &ms.calculate_input(sigma, &x),
                &floats(&step["input"]),
                1e-6,
                1e-7,
            );
            let denoised = ms.calculate_denoised(sigma, &output, &x);
            assert_close(&what, &denoised, &floats(&step["denoised"]), 1e-6, 1e-6);
        }
    }
}

#[test]
fn the_eps_patch_without_zsnr_is_the_default_model_sampling_exactly() {
    let (plain, patched) = (
        ModelSampling::sd1(),
        ModelSampling::discrete(DiscreteSampling::Eps, false),
    );
    assert_eq!(plain.sigmas(), patched.sigmas());
    assert_eq!(plain.log_sigmas(), patched.log_sigmas());
    assert_eq!(plain.prediction(), patched.prediction());
    for sigma in [0.03, 1.0, 14.6] {
        assert_eq!(plain.timestep(sigma), patched.timestep(sigma));
    }
}

#[test]
fn zsnr_ends_at_comfyuis_terminal_sigma_and_keeps_the_first() {
    let zsnr = ModelSampling::discrete(DiscreteSampling::VPrediction, true);
    let plain = ModelSampling::sd1();
    assert_eq!(zsnr.sigma_max(), 4_518.763_7);
    assert!((zsnr.sigma_min() - plain.sigma_min()).abs() < 1e-5);
    // LCM keeps timesteps 19, 39, ..., 999 of the 1000, and maps its sigmas back to them.
    let lcm = ModelSampling::discrete(DiscreteSampling::Lcm, false);
    assert_eq!(lcm.sigmas().len(), 50);
    assert_eq!(lcm.sigmas()[0], plain.sigmas()[19]);
    assert_eq!(lcm.timestep(lcm.sigma_max()), 999.0);
    assert_eq!(lcm.timestep(lcm.sigma_min()), 19.0);
}

/// `sampling.json` was made by the older ComfyUI beside weft, whose zsnr rescaled the
/// float32 table (0.3.64 rescales the float64 one): its zsnr numbers agree within 1e-4.
#[test]
fn the_sdxl_components_sampling_fixture_agrees() {
    let root = fixture("sampling.json");
    for (key, want) in root.as_object().unwrap() {
        let default = serde_json::json!({"class": "ModelSamplingDiscrete", "sampling": "eps", "zsnr": false});
        let node = want.get("node").unwrap_or(&default);
        let zsnr = node["zsnr"].as_bool().unwrap_or(false);
        let ms = node_sampling(&serde_json::json!({
            "node": node["class"], "sampling": node["sampling"], "zsnr": zsnr,
            "sigma_range": [node["sigma_min"], node["sigma_max"]],
        }));
        let rel = if zsnr { 1e-4 } else { 1e-6 };
        let n = ms.sigmas().len();
        assert_close(key, &ms.sigmas()[..8], &floats(&want["sigmas_first8"]), rel, 0.0);
        assert_close(key, &ms.sigmas()[n - 8..], &floats(&want["sigmas_last8"]), rel, 0.0);
        for scheduler in [Scheduler::Normal, Scheduler::Karras] {
            let got = ksampler_sigmas(&ms, scheduler, SamplerKind::Euler, 10, 1.0);
            let wanted = floats(&want[format!("{}_10", scheduler.name())]);
            assert_close(&format!("{key} {scheduler}"), &got, &wanted, rel, 0.0);
        }
        if node["class"] == "ModelSamplingDiscrete" {
            let normal = floats(&want["normal_10"]);
            assert_timesteps(key, &ms, &normal[..10], &floats(&want["timestep_of_normal_10"]));
        }
        let algebra = &want["algebra"];
        let (x, output) = (floats(&algebra["model_input"]), floats(&algebra["model_output"]));
        let half = x.len() / 2;
        for (b, &sigma) in floats(&algebra["sigma"]).iter().enumerate() {
            let part = b * half..(b + 1) * half;
            let input = &floats(&algebra["calculate_input"])[part.clone()];
            assert_close(key, &ms.calculate_input(sigma, &x[part.clone()]), input, 1e-6, 1e-7);
            let denoised = &floats(&algebra["calculate_denoised"])[part.clone()];
            let got = ms.calculate_denoised(sigma, &output[part.clone()], &x[part]);
            assert_close(key, &got, denoised, 1e-6, 1e-6);
        }
    }
}

#[test]
fn rescale_cfg_guides_as_comfyui() {
    let root = fixture("model_patches.json");
    let fixture = &root["rescale_cfg"];
    let batch = fixture["shape"][0].as_u64().unwrap() as usize;
    let (x, cond, uncond) = (
        floats(&fixture["x"]),
        floats(&fixture["cond"]),
        floats(&fixture["uncond"]),
    );
    let zeros = vec![0.0; x.len()];
    for case in fixture["cases"].as_array().unwrap() {
        let uncond = if case["with_uncond"].as_bool().unwrap() {
            &uncond
        } else {
            &zeros
        };
        let (sigma, scale) = (case["sigma"].as_f64().unwrap(), case["scale"].as_f64().unwrap());
        let multiplier = case["multiplier"].as_f64().unwrap();
        let got = rescale_cfg(&x, &cond, uncond, scale as f32, sigma as f32, multiplier, batch);
        let what = format!("sigma {sigma} cfg {scale} multiplier {multiplier}");
        assert_close(&what, &got, &floats(&case["guided"]), 1e-6, 1e-6);
    }
}
