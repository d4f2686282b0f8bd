//! `KSampler` and `KSamplerAdvanced`.

use weft_sdk::prelude::*;

/// Every sampler of the host's compute core, in ComfyUI's order (the `_gpu` names are
/// ComfyUI's aliases of the SDE samplers).
pub const SAMPLERS: [&str; 35] = [
    "euler",
    "euler_ancestral",
    "heun",
    "heunpp2",
    "dpm_2",
    "dpm_2_ancestral",
    "lms",
    "dpm_fast",
    "dpm_adaptive",
    "dpmpp_2s_ancestral",
    "dpmpp_sde",
    "dpmpp_sde_gpu",
    "dpmpp_2m",
    "dpmpp_2m_sde",
    "dpmpp_2m_sde_gpu",
    "dpmpp_2m_sde_heun",
    "dpmpp_2m_sde_heun_gpu",
    "dpmpp_3m_sde",
    "dpmpp_3m_sde_gpu",
    "ddpm",
    "lcm",
    "ipndm",
    "ipndm_v",
    "deis",
    "res_multistep",
    "res_multistep_ancestral",
    "gradient_estimation",
    "er_sde",
    "seeds_2",
    "seeds_3",
    "sa_solver",
    "sa_solver_pece",
    "ddim",
    "uni_pc",
    "uni_pc_bh2",
];

/// Every scheduler of the host's compute core, in ComfyUI's order.
pub const SCHEDULERS: [&str; 9] = [
    "simple",
    "sgm_uniform",
    "karras",
    "exponential",
    "ddim_uniform",
    "beta",
    "normal",
    "linear_quadratic",
    "kl_optimal",
];

/// Rejects seeds the contract's `s64` values cannot carry (above `i64::MAX`).
pub(crate) const MAX_SEED: u64 = i64::MAX as u64;

weft_sdk::node! {
    /// Uses the provided model, positive and negative conditioning to denoise the latent image.
    pub struct KSampler {
        category: "sampling",
        inputs {
            model: Model = input::model().tooltip("The model used for denoising the input latent."),
            seed: u64 = input::uint64().default(0).min(0).max(MAX_SEED)
                .tooltip("The random seed used for creating the noise."),
            steps: u32 = input::uint().default(20).min(1).max(10000)
                .tooltip("The number of steps used in the denoising process."),
            cfg: f64 = input::float().default(8.0).min(0.0).max(100.0).step(0.1).tooltip(
                "The Classifier-Free Guidance scale balances creativity and adherence to the prompt. \
                 Higher values result in images more closely matching the prompt however too high values \
                 will negatively impact quality.",
            ),
            sampler_name: String = input::combo(SAMPLERS).tooltip(
                "The algorithm used when sampling, this can affect the quality, speed, and style of the \
                 generated output.",
            ),
            scheduler: String = input::combo(SCHEDULERS)
                .tooltip("The scheduler controls how noise is gradually removed to form the image."),
            positive: Conditioning = input::conditioning()
                .tooltip("The conditioning describing the attributes you want to include in the image."),
            negative: Conditioning = input::conditioning()
                .tooltip("The conditioning describing the attributes you want to exclude from the image."),
            latent_image: Latent = input::latent().tooltip("The latent image to denoise."),
            denoise: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01).tooltip(
                "The amount of denoising applied, lower values will maintain the structure of the initial \
                 image allowing for image to image sampling.",
            ),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let options = diffusion::SampleOptions {
                seed: inp.seed,
                steps: inp.steps,
                cfg: inp.cfg,
                sampler_name: inp.sampler_name,
                scheduler: inp.scheduler,
                denoise: inp.denoise,
                add_noise: true,
                start_at_step: 0,
                end_at_step: 10000,
                return_with_leftover_noise: true,
            };
            let out = diffusion::sample(
                inp.model.handle(),
                inp.positive.handle(),
                inp.negative.handle(),
                &inp.latent_image,
                &options,
            )?;
            Ok((out,))
        }
    }
}

weft_sdk::node! {
    /// KSampler with control over noise and the steps it runs.
    pub struct KSamplerAdvanced {
        display_name: "KSampler (Advanced)",
        category: "sampling",
        inputs {
            model: Model = input::model(),
            add_noise: String = input::combo(["enable", "disable"]),
            noise_seed: u64 = input::uint64().default(0).min(0).max(MAX_SEED),
            steps: u32 = input::uint().default(20).min(1).max(10000),
            cfg: f64 = input::float().default(8.0).min(0.0).max(100.0).step(0.1),
            sampler_name: String = input::combo(SAMPLERS),
            scheduler: String = input::combo(SCHEDULERS),
            positive: Conditioning = input::conditioning(),
            negative: Conditioning = input::conditioning(),
            latent_image: Latent = input::latent(),
            start_at_step: u32 = input::uint().default(0).min(0).max(10000),
            end_at_step: u32 = input::uint().default(10000).min(0).max(10000),
            return_with_leftover_noise: String = input::combo(["disable", "enable"]),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let options = diffusion::SampleOptions {
                seed: inp.noise_seed,
                steps: inp.steps,
                cfg: inp.cfg,
                sampler_name: inp.sampler_name,
                scheduler: inp.scheduler,
                denoise: 1.0,
                add_noise: inp.add_noise == "enable",
                start_at_step: inp.start_at_step,
                end_at_step: inp.end_at_step,
                return_with_leftover_noise: inp.return_with_leftover_noise == "enable",
            };
            let out = diffusion::sample(
                inp.model.handle(),
                inp.positive.handle(),
                inp.negative.handle(),
                &inp.latent_image,
                &options,
            )?;
            Ok((out,))
        }
    }
}
