//! Numeric core of ComfyUI-compatible sampling: model sampling (sigma tables, timesteps and
//! prediction types), schedulers, k-diffusion samplers, `RescaleCFG` guidance and
//! torch-identical seeded noise, all in float32 with torch's operation order.
//!
//! Everything is checked against reference vectors produced by ComfyUI itself; see
//! [`check_vectors`].
//!
//! Typical KSampler flow: `let s = ksampler_sigmas(&ms, scheduler, kind, steps, denoise);`
//! `let noise = seeded_noise(seed, &shape);` start from
//! `ms.noise_scaling(s[0], &noise.data, &latent, ms.is_max_denoise(s[0]))` and call [`sample`] with a
//! [`Denoiser`] that applies [`cfg`] to the model's conditional and unconditional predictions.

mod beta_dist;
mod brownian;
#[cfg(test)]
mod custom_sampling_tests;
#[cfg(test)]
mod model_patches_tests;
mod model_sampling;
mod noise;
mod prediction;
mod rescale_cfg;
mod sampler;
mod scheduler;
pub mod sigma_schedules;
mod vectors;

pub use beta_dist::{beta_cdf, beta_ppf};
pub use brownian::BrownianTreeNoise;
pub use model_sampling::{DiscreteSampling, EdmSampling, ModelSampling, UnknownSampling};
pub use noise::{
    default_noise, seeded_noise, seeded_noise_with_kernel, ListNoise, Mt19937, NoiseSource, NormalKernel,
    TorchGenerator, TorchNoise, ZeroNoise,
};
pub use prediction::Prediction;
pub use rescale_cfg::rescale_cfg;
pub use sampler::{sample, sample_with, SampleError, SamplerKind, SamplerOptions, StepControl, StepInfo};
pub use scheduler::{beta, exponential, karras, kl_optimal, ksampler_sigmas, sigmas, Scheduler, UnknownName};
pub use vectors::{check_vectors, CaseResult, CaseStatus, VectorReport};

/// A dense float32 tensor: row-major `data` with its `shape` (e.g. `[batch, 4, h, w]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Row-major elements; `data.len()` equals the product of `shape`.
    pub data: Vec<f32>,
}

impl Tensor {
    /// Wraps `data` with `shape`. Panics if the element count does not match.
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "tensor data does not match shape {shape:?}"
        );
        Tensor { shape, data }
    }

    /// Like [`Tensor::new`] but returns an error on a size mismatch.
    pub fn try_new(shape: Vec<usize>, data: Vec<f32>) -> anyhow::Result<Self> {
        anyhow::ensure!(
            shape.iter().product::<usize>() == data.len(),
            "{} values do not fill shape {shape:?}",
            data.len()
        );
        Ok(Tensor { shape, data })
    }

    /// A zero tensor of `shape`.
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }

    /// Same shape, new data.
    pub fn with_data(&self, data: Vec<f32>) -> Self {
        Tensor::new(self.shape.clone(), data)
    }
}

/// A model that predicts the clean sample: `denoise(x, sigma)` returns `D(x, sigma)` with the
/// shape of `x` (ComfyUI's wrapped model as the k-diffusion samplers call it).
pub trait Denoiser {
    /// Denoised prediction for the noisy `x` at noise level `sigma` (same for the whole batch).
    fn denoise(&mut self, x: &Tensor, sigma: f32) -> anyhow::Result<Tensor>;
}

impl<F> Denoiser for F
where
    F: FnMut(&Tensor, f32) -> anyhow::Result<Tensor>,
{
    fn denoise(&mut self, x: &Tensor, sigma: f32) -> anyhow::Result<Tensor> {
        self(x, sigma)
    }
}

/// Classifier-free guidance as ComfyUI combines it: `uncond + (cond - uncond) * scale`
/// (float32, that op order).
pub fn cfg(uncond: &[f32], cond: &[f32], scale: f32) -> Vec<f32> {
    uncond.iter().zip(cond).map(|(&u, &c)| u + (c - u) * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cfg_formula() {
        assert_eq!(cfg(&[1.0, 2.0], &[3.0, 2.0], 2.0), vec![5.0, 2.0]);
        assert_eq!(cfg(&[1.0], &[3.0], 1.0), vec![3.0]);
    }

    #[test]
    fn fixture_vectors_pass() {
        let path = std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/comfyui-sampling.json"
        ));
        let report = check_vectors(path).expect("vectors load");
        println!("{report}");
        assert!(report.all_passed(), "{report}");
    }
}
