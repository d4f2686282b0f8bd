//! ComfyUI's custom sampling (`comfy_extras/nodes_custom_sampler.py`, `AlignYourSteps`):
//! samplers with their own parameters, schedules and their edits, noise, guiders, and the
//! `SamplerCustom` / `SamplerCustomAdvanced` nodes that sample with them.

use weft_sdk::prelude::*;

use crate::sampling::{MAX_SEED, SAMPLERS, SCHEDULERS};

/// The `Sampler*` nodes' `noise_device` choices (weft's noise is the same on either).
const NOISE_DEVICES: [&str; 2] = ["gpu", "cpu"];
/// The schedules' default `sigma_max` and `sigma_min`: SD1's range.
const SIGMA_MAX: f64 = 14.614642;
const SIGMA_MIN: f64 = 0.0291675;

/// The sampler `name` with `options`, as a `SAMPLER`.
fn sampler(name: &str, options: diffusion::SamplerOptions) -> Result<(Sampler,), NodeError> {
    Ok((Sampler(diffusion::sampler(name, options)?),))
}

/// `eta` and `s_noise` alone.
fn noise_options(eta: f64, s_noise: f64) -> diffusion::SamplerOptions {
    diffusion::SamplerOptions {
        eta: Some(eta),
        s_noise: Some(s_noise),
        r: None,
        order: None,
    }
}

/// A `SIGMAS` from a host call.
fn sigmas(handle: Result<Handle, NodeError>) -> Result<(Sigmas,), NodeError> {
    Ok((Sigmas(handle?),))
}

weft_sdk::node! {
    /// Samples a latent with a custom sampler and schedule, guided by classifier-free guidance.
    pub struct SamplerCustom {
        category: "sampling/custom_sampling",
        inputs {
            model: Model = input::model(),
            add_noise: bool = input::boolean().default(true),
            noise_seed: u64 = input::uint64().default(0).min(0).max(MAX_SEED),
            cfg: f64 = input::float().default(8.0).min(0.0).max(100.0).step(0.1),
            positive: Conditioning = input::conditioning(),
            negative: Conditioning = input::conditioning(),
            sampler: Sampler,
            sigmas: Sigmas,
            latent_image: Latent = input::latent(),
        }
        outputs { output: Latent, denoised_output: Latent }
        fn execute(_, inp) {
            let noise = diffusion::noise(inp.noise_seed, inp.add_noise)?;
            let guider = diffusion::cfg_guider(inp.model.handle(), inp.positive.handle(), inp.negative.handle(), inp.cfg)?;
            let (out, denoised) =
                diffusion::sample_custom(&noise, &guider, inp.sampler.handle(), inp.sigmas.handle(), &inp.latent_image)?;
            Ok((out, denoised))
        }
    }
}

weft_sdk::node! {
    /// Samples a latent from a noise, a guider, a sampler and a schedule.
    pub struct SamplerCustomAdvanced {
        category: "sampling/custom_sampling",
        inputs {
            noise: Noise,
            guider: Guider,
            sampler: Sampler,
            sigmas: Sigmas,
            latent_image: Latent = input::latent(),
        }
        outputs { output: Latent, denoised_output: Latent }
        fn execute(_, inp) {
            let (out, denoised) = diffusion::sample_custom(
                inp.noise.handle(),
                inp.guider.handle(),
                inp.sampler.handle(),
                inp.sigmas.handle(),
                &inp.latent_image,
            )?;
            Ok((out, denoised))
        }
    }
}

weft_sdk::node! {
    /// Selects a sampler by name, with its default parameters.
    pub struct KSamplerSelect {
        category: "sampling/custom_sampling/samplers",
        inputs {
            sampler_name: String = input::combo(SAMPLERS),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            sampler(&inp.sampler_name, noise_options_default())
        }
    }
}

/// No parameter set: every sampler's own defaults.
fn noise_options_default() -> diffusion::SamplerOptions {
    diffusion::SamplerOptions {
        eta: None,
        s_noise: None,
        r: None,
        order: None,
    }
}

weft_sdk::node! {
    /// Euler ancestral with its noise strength and scale.
    pub struct SamplerEulerAncestral {
        category: "sampling/custom_sampling/samplers",
        inputs {
            eta: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            s_noise: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            sampler("euler_ancestral", noise_options(inp.eta, inp.s_noise))
        }
    }
}

weft_sdk::node! {
    /// DPM-Solver++(2S) ancestral with its noise strength and scale.
    pub struct SamplerDpmpp2sAncestral {
        class_type: "SamplerDPMPP_2S_Ancestral",
        category: "sampling/custom_sampling/samplers",
        inputs {
            eta: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            s_noise: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            sampler("dpmpp_2s_ancestral", noise_options(inp.eta, inp.s_noise))
        }
    }
}

weft_sdk::node! {
    /// Linear multistep with its order.
    pub struct SamplerLMS {
        category: "sampling/custom_sampling/samplers",
        inputs {
            order: u32 = input::uint().default(4).min(1).max(100),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            let options = diffusion::SamplerOptions { order: Some(inp.order), ..noise_options_default() };
            sampler("lms", options)
        }
    }
}

weft_sdk::node! {
    /// DPM-Solver++ (stochastic) with its noise strength, scale and intermediate step.
    pub struct SamplerDpmppSde {
        class_type: "SamplerDPMPP_SDE",
        category: "sampling/custom_sampling/samplers",
        inputs {
            eta: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            s_noise: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            r: f64 = input::float().default(0.5).min(0.0).max(100.0).step(0.01),
            noise_device: String = input::combo(NOISE_DEVICES),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            let options = diffusion::SamplerOptions { r: Some(inp.r), ..noise_options(inp.eta, inp.s_noise) };
            sampler(&device_name("dpmpp_sde", &inp.noise_device), options)
        }
    }
}

weft_sdk::node! {
    /// DPM-Solver++(2M) SDE with its solver, noise strength and scale.
    pub struct SamplerDpmpp2mSde {
        class_type: "SamplerDPMPP_2M_SDE",
        category: "sampling/custom_sampling/samplers",
        inputs {
            solver_type: String = input::combo(["midpoint", "heun"]),
            eta: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            s_noise: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            noise_device: String = input::combo(NOISE_DEVICES),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            let base = match inp.solver_type.as_str() {
                "midpoint" => "dpmpp_2m_sde",
                "heun" => "dpmpp_2m_sde_heun",
                other => {
                    return Err(NodeError::invalid_input(format!(
                        "unknown solver_type {other:?}; expected midpoint or heun"
                    )))
                }
            };
            sampler(&device_name(base, &inp.noise_device), noise_options(inp.eta, inp.s_noise))
        }
    }
}

weft_sdk::node! {
    /// DPM-Solver++(3M) SDE with its noise strength and scale.
    pub struct SamplerDpmpp3mSde {
        class_type: "SamplerDPMPP_3M_SDE",
        category: "sampling/custom_sampling/samplers",
        inputs {
            eta: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            s_noise: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
            noise_device: String = input::combo(NOISE_DEVICES),
        }
        outputs { SAMPLER: Sampler }
        fn execute(_, inp) {
            sampler(&device_name("dpmpp_3m_sde", &inp.noise_device), noise_options(inp.eta, inp.s_noise))
        }
    }
}

/// ComfyUI's sampler name for `noise_device`: `base` for `cpu`, `base_gpu` for `gpu`.
fn device_name(base: &str, noise_device: &str) -> String {
    if noise_device == "cpu" {
        base.to_string()
    } else {
        format!("{base}_gpu")
    }
}

weft_sdk::node! {
    /// The model's noise schedule by scheduler name, over the steps and denoise given.
    pub struct BasicScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            model: Model = input::model(),
            scheduler: String = input::combo(SCHEDULERS),
            steps: u32 = input::uint().default(20).min(1).max(10000),
            denoise: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::basic_scheduler(inp.model.handle(), &inp.scheduler, inp.steps, inp.denoise))
        }
    }
}

/// A formula schedule over `steps` from `sigma_max` to `sigma_min`.
fn formula(
    formula: diffusion::SigmaFormula,
    steps: u32,
    sigma_max: f64,
    sigma_min: f64,
) -> Result<(Sigmas,), NodeError> {
    let range = diffusion::SigmaRange {
        steps,
        sigma_max,
        sigma_min,
    };
    sigmas(diffusion::formula_scheduler(formula, range))
}

weft_sdk::node! {
    /// Karras et al.'s noise schedule.
    pub struct KarrasScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            steps: u32 = input::uint().default(20).min(1).max(10000),
            sigma_max: f64 = input::float().default(SIGMA_MAX).min(0.0).max(5000.0).step(0.01),
            sigma_min: f64 = input::float().default(SIGMA_MIN).min(0.0).max(5000.0).step(0.01),
            rho: f64 = input::float().default(7.0).min(0.0).max(100.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            formula(diffusion::SigmaFormula::Karras(inp.rho), inp.steps, inp.sigma_max, inp.sigma_min)
        }
    }
}

weft_sdk::node! {
    /// Sigmas evenly spaced in log sigma.
    pub struct ExponentialScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            steps: u32 = input::uint().default(20).min(1).max(10000),
            sigma_max: f64 = input::float().default(SIGMA_MAX).min(0.0).max(5000.0).step(0.01),
            sigma_min: f64 = input::float().default(SIGMA_MIN).min(0.0).max(5000.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            formula(diffusion::SigmaFormula::Exponential, inp.steps, inp.sigma_max, inp.sigma_min)
        }
    }
}

weft_sdk::node! {
    /// Sigmas along a polynomial in log sigma.
    pub struct PolyexponentialScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            steps: u32 = input::uint().default(20).min(1).max(10000),
            sigma_max: f64 = input::float().default(SIGMA_MAX).min(0.0).max(5000.0).step(0.01),
            sigma_min: f64 = input::float().default(SIGMA_MIN).min(0.0).max(5000.0).step(0.01),
            rho: f64 = input::float().default(1.0).min(0.0).max(100.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            formula(diffusion::SigmaFormula::Polyexponential(inp.rho), inp.steps, inp.sigma_max, inp.sigma_min)
        }
    }
}

weft_sdk::node! {
    /// Laplace-distributed log sigmas (Tiankai et al., 2024).
    pub struct LaplaceScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            steps: u32 = input::uint().default(20).min(1).max(10000),
            sigma_max: f64 = input::float().default(SIGMA_MAX).min(0.0).max(5000.0).step(0.01),
            sigma_min: f64 = input::float().default(SIGMA_MIN).min(0.0).max(5000.0).step(0.01),
            mu: f64 = input::float().default(0.0).min(-10.0).max(10.0).step(0.1),
            beta: f64 = input::float().default(0.5).min(0.0).max(10.0).step(0.1),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            let shape = diffusion::SigmaFormula::Laplace((inp.mu, inp.beta));
            formula(shape, inp.steps, inp.sigma_max, inp.sigma_min)
        }
    }
}

weft_sdk::node! {
    /// A continuous variance-preserving schedule.
    pub struct VPScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            steps: u32 = input::uint().default(20).min(1).max(10000),
            beta_d: f64 = input::float().default(19.9).min(0.0).max(5000.0).step(0.01),
            beta_min: f64 = input::float().default(0.1).min(0.0).max(5000.0).step(0.01),
            eps_s: f64 = input::float().default(0.001).min(0.0).max(1.0).step(0.0001),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::vp_scheduler(inp.steps, inp.beta_d, inp.beta_min, inp.eps_s))
        }
    }
}

weft_sdk::node! {
    /// SD Turbo's few-step schedule: timesteps 999, 899, ... of the model.
    pub struct SDTurboScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            model: Model = input::model(),
            steps: u32 = input::uint().default(1).min(1).max(10),
            denoise: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::sd_turbo_scheduler(inp.model.handle(), inp.steps, inp.denoise))
        }
    }
}

weft_sdk::node! {
    /// The model's timesteps at quantiles of a Beta distribution.
    pub struct BetaSamplingScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            model: Model = input::model(),
            steps: u32 = input::uint().default(20).min(1).max(10000),
            alpha: f64 = input::float().default(0.6).min(0.0).max(50.0).step(0.01),
            beta: f64 = input::float().default(0.6).min(0.0).max(50.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::beta_scheduler(inp.model.handle(), inp.steps, inp.alpha, inp.beta))
        }
    }
}

weft_sdk::node! {
    /// NVIDIA's Align Your Steps noise levels for SD1, SDXL or SVD.
    pub struct AlignYourStepsScheduler {
        category: "sampling/custom_sampling/schedulers",
        inputs {
            model_type: String = input::combo(["SD1", "SDXL", "SVD"]),
            steps: u32 = input::uint().default(10).min(1).max(10000),
            denoise: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::align_your_steps_scheduler(&inp.model_type, inp.steps, inp.denoise))
        }
    }
}

weft_sdk::node! {
    /// Splits a schedule at a step: the sigmas up to it, and those from it on.
    pub struct SplitSigmas {
        category: "sampling/custom_sampling/sigmas",
        inputs {
            sigmas: Sigmas,
            step: u32 = input::uint().default(0).min(0).max(10000),
        }
        outputs { high_sigmas: Sigmas, low_sigmas: Sigmas }
        fn execute(_, inp) {
            let (high, low) = diffusion::split_sigmas(inp.sigmas.handle(), inp.step)?;
            Ok((Sigmas(high), Sigmas(low)))
        }
    }
}

weft_sdk::node! {
    /// Splits a schedule so that the low part runs the given fraction of its steps.
    pub struct SplitSigmasDenoise {
        category: "sampling/custom_sampling/sigmas",
        inputs {
            sigmas: Sigmas,
            denoise: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
        }
        outputs { high_sigmas: Sigmas, low_sigmas: Sigmas }
        fn execute(_, inp) {
            let (high, low) = diffusion::split_sigmas_denoise(inp.sigmas.handle(), inp.denoise)?;
            Ok((Sigmas(high), Sigmas(low)))
        }
    }
}

weft_sdk::node! {
    /// Reverses a schedule (for unsampling); a leading 0 becomes 0.0001.
    pub struct FlipSigmas {
        category: "sampling/custom_sampling/sigmas",
        inputs {
            sigmas: Sigmas,
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::flip_sigmas(inp.sigmas.handle()))
        }
    }
}

weft_sdk::node! {
    /// Replaces the first sigma of a schedule.
    pub struct SetFirstSigma {
        category: "sampling/custom_sampling/sigmas",
        inputs {
            sigmas: Sigmas,
            sigma: f64 = input::float().default(136.0).min(0.0).max(20000.0).step(0.001),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::set_first_sigma(inp.sigmas.handle(), inp.sigma))
        }
    }
}

weft_sdk::node! {
    /// Sigmas written out as numbers, for example "1, 0.5".
    pub struct ManualSigmas {
        category: "experimental/custom_sampling",
        inputs {
            sigmas: String = input::string().default("1, 0.5"),
        }
        outputs { SIGMAS: Sigmas }
        fn execute(_, inp) {
            sigmas(diffusion::sigmas_from_values(&numbers_in(&inp.sigmas)))
        }
    }
}

/// The numbers in `text`, as ComfyUI's `ManualSigmas` finds them: runs of digits with an
/// optional sign and decimal point; anything else separates them.
fn numbers_in(text: &str) -> Vec<f32> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        if current.chars().any(|c| c.is_ascii_digit()) {
            if let Ok(v) = current.parse::<f32>() {
                out.push(v);
            }
        }
        current.clear();
    };
    for c in text.chars() {
        let starts_new = matches!(c, '+' | '-') && !current.is_empty();
        if starts_new {
            flush(&mut current);
        }
        if c.is_ascii_digit() || matches!(c, '.' | '+' | '-') {
            current.push(c);
        } else {
            flush(&mut current);
        }
    }
    flush(&mut current);
    out
}

weft_sdk::node! {
    /// Noise from a seed, drawn as KSampler draws it.
    pub struct RandomNoise {
        category: "sampling/custom_sampling/noise",
        inputs {
            noise_seed: u64 = input::uint64().default(0).min(0).max(MAX_SEED),
        }
        outputs { NOISE: Noise }
        fn execute(_, inp) {
            Ok((Noise(diffusion::noise(inp.noise_seed, true)?),))
        }
    }
}

weft_sdk::node! {
    /// No initial noise: sampling starts from the latent as it is.
    pub struct DisableNoise {
        category: "sampling/custom_sampling/noise",
        inputs {}
        outputs { NOISE: Noise }
        fn execute(_, _inp) {
            Ok((Noise(diffusion::noise(0, false)?),))
        }
    }
}

weft_sdk::node! {
    /// Guides the model by a positive against a negative conditioning.
    pub struct CFGGuider {
        category: "sampling/custom_sampling/guiders",
        inputs {
            model: Model = input::model(),
            positive: Conditioning = input::conditioning(),
            negative: Conditioning = input::conditioning(),
            cfg: f64 = input::float().default(8.0).min(0.0).max(100.0).step(0.1),
        }
        outputs { GUIDER: Guider }
        fn execute(_, inp) {
            let guider = diffusion::cfg_guider(inp.model.handle(), inp.positive.handle(), inp.negative.handle(), inp.cfg)?;
            Ok((Guider(guider),))
        }
    }
}

weft_sdk::node! {
    /// The model with one conditioning and no guidance (for guidance-distilled models).
    pub struct BasicGuider {
        category: "sampling/custom_sampling/guiders",
        inputs {
            model: Model = input::model(),
            conditioning: Conditioning = input::conditioning(),
        }
        outputs { GUIDER: Guider }
        fn execute(_, inp) {
            Ok((Guider(diffusion::basic_guider(inp.model.handle(), inp.conditioning.handle())?),))
        }
    }
}

weft_sdk::node! {
    /// Guides the model by two positive conditionings against a negative one.
    pub struct DualCFGGuider {
        category: "sampling/custom_sampling/guiders",
        inputs {
            model: Model = input::model(),
            cond1: Conditioning = input::conditioning(),
            cond2: Conditioning = input::conditioning(),
            negative: Conditioning = input::conditioning(),
            cfg_conds: f64 = input::float().default(8.0).min(0.0).max(100.0).step(0.1),
            cfg_cond2_negative: f64 = input::float().default(8.0).min(0.0).max(100.0).step(0.1),
            style: String = input::combo(["regular", "nested"]),
        }
        outputs { GUIDER: Guider }
        fn execute(_, inp) {
            let nested = match inp.style.as_str() {
                "regular" => false,
                "nested" => true,
                other => {
                    return Err(NodeError::invalid_input(format!(
                        "unknown style {other:?}; expected regular or nested"
                    )))
                }
            };
            let scales = diffusion::DualCfg {
                cfg_conds: inp.cfg_conds,
                cfg_cond2_negative: inp.cfg_cond2_negative,
                nested,
            };
            let guider = diffusion::dual_cfg_guider(
                inp.model.handle(),
                inp.cond1.handle(),
                inp.cond2.handle(),
                inp.negative.handle(),
                scales,
            )?;
            Ok((Guider(guider),))
        }
    }
}
