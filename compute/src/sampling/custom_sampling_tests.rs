//! The custom-sampling nodes' numbers against ComfyUI's: the model-free schedules,
//! `SDTurboScheduler`, Align Your Steps, and samplers run with their own parameters (`eta`,
//! `s_noise`, `r`, `solver_type`, `order`), from
//! `tests/fixtures/custom-sampling/custom_sampling.json` (made by `make_custom_sampling.py`
//! beside it).

use serde_json::Value;

use super::sigma_schedules::{align_your_steps, polyexponential, sd_turbo, vp, AysModel};
use super::{exponential, karras, sample_with, ListNoise, ModelSampling, SamplerKind, SamplerOptions, Tensor};

fn fixture() -> Value {
    let path = format!(
        "{}/../tests/fixtures/custom-sampling/custom_sampling.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Asserts `got` is within `tolerance` of `want`, relative to the largest value wanted.
fn assert_close(what: &str, got: &[f32], want: &[f32], tolerance: f32) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} against {want:?}");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * scale,
            "{what}[{i}]: {g} against ComfyUI's {w}"
        );
    }
}

#[test]
fn model_free_schedules_match_comfyui() {
    let f = fixture();
    let s = &f["schedules"];
    let (min, max) = (0.0291675, 14.614642);
    // The formulas are float32 arithmetic: within a few ulps of torch's.
    let close = |name: &str, got: Vec<f32>| assert_close(name, &got, &floats(&s[name]), 1e-6);
    close("karras_rho7.0", karras(7, min, max, 7.0));
    close("karras_rho3.5", karras(7, min, max, 3.5));
    close("exponential", exponential(7, min, max));
    close("polyexponential_rho1.0", polyexponential(7, min, max, 1.0));
    close("polyexponential_rho2.5", polyexponential(7, min, max, 2.5));
    close("vp", vp(5, 19.9, 0.1, 1e-3));
    let ms = ModelSampling::sd1();
    close("sd_turbo_1_1.0", sd_turbo(&ms, 1, 1.0));
    close("sd_turbo_4_1.0", sd_turbo(&ms, 4, 1.0));
    close("sd_turbo_2_0.5", sd_turbo(&ms, 2, 0.5));
    close("ays_sd1_20", align_your_steps(AysModel::Sd1, 20, 1.0));
}

#[test]
fn samplers_with_their_own_parameters_match_comfyui() {
    let f = fixture();
    let sigmas = floats(&f["sigmas"]);
    let x0 = floats(&f["x0"]);
    let shape = vec![1, 4, 4, 4];
    let draws: Vec<Tensor> = f["draws"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| Tensor::new(shape.clone(), floats(d)))
        .collect();
    let runs = f["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 7);
    for (name, run) in runs {
        let kind: SamplerKind = run["sampler"].as_str().unwrap().parse().unwrap();
        let o = &run["options"];
        let get = |key: &str, default: f64| o.get(key).and_then(Value::as_f64).unwrap_or(default);
        let defaults = SamplerOptions::default();
        let options = SamplerOptions {
            eta: get("eta", defaults.eta),
            s_noise: get("s_noise", defaults.s_noise),
            r: get("r", defaults.r),
            order: get("order", defaults.order as f64) as usize,
        };
        let run_sigmas = floats(&run["sigmas"]);
        let start = Tensor::new(shape.clone(), x0.iter().map(|v| v * sigmas[0]).collect());
        let mut noise = ListNoise::new(draws.clone());
        let mut denoiser = |x: &Tensor, sigma: f32| -> anyhow::Result<Tensor> {
            let sig2 = sigma * sigma;
            let t = sig2 * 0.3f32;
            Ok(x.with_data(x.data.iter().map(|&v| (0.25 * v + t) / (0.25 + sig2)).collect()))
        };
        let out = sample_with(
            kind,
            &options,
            &mut denoiser,
            start,
            &run_sigmas,
            &mut noise,
            &mut |_| super::StepControl::Continue,
        )
        .unwrap();
        assert_eq!(
            noise.calls.len() as u64,
            run["noise_draws"].as_u64().unwrap(),
            "{name}: noise draws"
        );
        // ComfyUI's reference tree writes the SDE samplers in an older, algebraically equal
        // form (without alpha_t), so agreement is to float32 rounding, not bit for bit.
        assert_close(name, &out.data, &floats(&run["out"]), 1e-6);
    }
}
