//! A library-level text-to-image run on SD1 networks, as ComfyUI's default workflow does it
//! (CLIPTextEncode x 2 -> EmptyLatentImage -> KSampler -> VAEDecode): tokenize, encode the
//! prompt and the negative prompt with CLIP, start from `seeded_noise(seed)` scaled to the
//! first sigma, sample with classifier-free guidance (cond and uncond in one UNet batch),
//! and decode with the VAE.

use anyhow::{Context, Result};
use candle_core::Tensor as CTensor;

use super::diffusion::conditioning::repeat_to_common_length;
use super::diffusion::prompt::encode_prompt;
use super::image::ImageBatch;
use super::models::{CheckpointModels, Unet};
use super::sampling::{
    cfg, default_noise, ksampler_sigmas, sample, seeded_noise, ModelSampling, SamplerKind, Scheduler, StepControl,
    StepInfo, Tensor,
};
use super::vae;

/// What to make.
#[derive(Debug, Clone)]
pub struct TextToImage {
    /// Positive prompt.
    pub prompt: String,
    /// Negative prompt.
    pub negative: String,
    /// Image width in pixels (a multiple of the VAE's scale: 8 for SD1).
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// Seed of the initial noise (and of ancestral samplers' noise).
    pub seed: u64,
    /// Sampler steps.
    pub steps: usize,
    /// Guidance scale.
    pub cfg: f32,
    /// Sampler.
    pub sampler: SamplerKind,
    /// Scheduler.
    pub scheduler: Scheduler,
}

impl Default for TextToImage {
    fn default() -> Self {
        TextToImage {
            prompt: String::new(),
            negative: String::new(),
            width: 512,
            height: 512,
            seed: 0,
            steps: 20,
            cfg: 8.0,
            sampler: SamplerKind::Euler,
            scheduler: Scheduler::Normal,
        }
    }
}

/// Encodes `text` (ComfyUI's prompt syntax, no embeddings folder) with the models' whole
/// CLIP text encoder: `[1, 77 * chunks, context_dim]`.
pub fn encode_text(models: &CheckpointModels, text: &str) -> Result<CTensor> {
    Ok(encode_prompt(
        &models.text[0],
        models.text[0].layer_count(),
        text,
        None,
    )?)
}

/// The pixel-to-latent scale of the models' VAE (8 for SD1: one per downsampling level).
pub fn vae_scale(models: &CheckpointModels) -> u32 {
    1 << (models.config.vae_mult.len() - 1)
}

/// A denoiser over SD1's UNet with classifier-free guidance, for [`sample`]: EPS prediction,
/// `c_in = 1 / sqrt(sigma^2 + 1)`, timestep = nearest sigma of the SD1 table.
pub struct GuidedUnet<'a> {
    unet: &'a Unet,
    ms: ModelSampling,
    /// `[2, tokens, d]`: uncond then cond, repeated to a common length (or cond alone,
    /// `[1, tokens, d]`, when `scale == 1`).
    context: CTensor,
    scale: f32,
}

impl<'a> GuidedUnet<'a> {
    /// Guidance of `cond` against `uncond` (both `[1, 77 * chunks, d]`, on the UNet's device)
    /// at `scale`.
    pub fn new(unet: &'a Unet, cond: &CTensor, uncond: &CTensor, scale: f32) -> Result<Self> {
        let context = if scale == 1.0 {
            cond.clone()
        } else {
            CTensor::cat(&repeat_to_common_length(&[uncond.clone(), cond.clone()])?, 0)?
        };
        Ok(GuidedUnet {
            unet,
            ms: ModelSampling::sd1(),
            context,
            scale,
        })
    }

    /// `D(x, sigma)` for a batch-1 latent.
    pub fn denoise(&self, x: &Tensor, sigma: f32) -> Result<Tensor> {
        let c_in = 1.0 / (sigma * sigma + 1.0).sqrt();
        let t = self.ms.timestep(sigma) as f64;
        let xin = CTensor::from_slice(&x.data, x.shape.as_slice(), self.context.device())?;
        let n = self.context.dim(0)?;
        let scaled = (&xin * c_in as f64)?;
        let batch = if n == 2 {
            CTensor::cat(&[&scaled, &scaled], 0)?
        } else {
            scaled
        };
        let eps = self.unet.forward(&batch, t, &self.context, None).context("UNet")?;
        // denoised = x - eps * sigma, per half of the batch.
        let per = x.data.len();
        let eps = eps.flatten_all()?.to_vec1::<f32>()?;
        let den = |half: usize| -> Vec<f32> {
            x.data
                .iter()
                .zip(&eps[half * per..(half + 1) * per])
                .map(|(&xv, &e)| xv - e * sigma)
                .collect()
        };
        Ok(if n == 2 {
            x.with_data(cfg(&den(0), &den(1), self.scale))
        } else {
            x.with_data(den(0))
        })
    }
}

/// Runs the whole pipeline; `callback` sees every step (return [`StepControl::Stop`] to
/// cancel).
pub fn text_to_image(
    models: &CheckpointModels,
    req: &TextToImage,
    callback: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
) -> Result<ImageBatch> {
    vae::decode(models, &text_to_latent(models, req, callback)?)
}

/// The pipeline up to the sampler's result: the latent `VAEDecode` receives, in the VAE's
/// space (ComfyUI's `LATENT`, as its `SaveLatent` writes it).
pub fn text_to_latent(
    models: &CheckpointModels,
    req: &TextToImage,
    callback: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
) -> Result<Tensor> {
    let scale = vae_scale(models);
    anyhow::ensure!(
        req.width >= scale
            && req.height >= scale
            && req.width.is_multiple_of(scale)
            && req.height.is_multiple_of(scale),
        "width and height must be positive multiples of {scale}, got {}x{}",
        req.width,
        req.height
    );
    anyhow::ensure!(req.steps >= 1 && req.steps <= 10_000, "steps must be 1..=10000");
    let cond = encode_text(models, &req.prompt)?;
    let uncond = encode_text(models, &req.negative)?;
    let unet = GuidedUnet::new(&models.unet, &cond, &uncond, req.cfg)?;
    let shape = vec![
        1,
        models.config.latent_channels,
        (req.height / scale) as usize,
        (req.width / scale) as usize,
    ];
    let ms = ModelSampling::sd1();
    let sigmas = ksampler_sigmas(&ms, req.scheduler, req.sampler, req.steps, 1.0);
    let noise = seeded_noise(req.seed, &shape);
    let empty = Tensor::zeros(shape);
    let x0 = empty.with_data(ms.noise_scaling(sigmas[0], &noise.data, &empty.data, ms.is_max_denoise(sigmas[0])));
    let mut denoiser = |x: &Tensor, sigma: f32| unet.denoise(x, sigma);
    let mut step_noise = default_noise(req.sampler, req.seed, &sigmas, &x0.shape)?;
    let latent = sample(req.sampler, &mut denoiser, x0, &sigmas, step_noise.as_mut(), callback)?;
    Ok(vae::process_out(&latent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codecs;
    use crate::models::loader::tiny_test_models;

    /// Generations running at once share rayon's workers, which run each other's tasks
    /// while they wait: each must still get the image it gets alone.
    #[test]
    fn concurrent_generations_equal_one_at_a_time() -> Result<()> {
        let (_dir, m) = tiny_test_models(5)?;
        let m = &m;
        let request = |seed| TextToImage {
            prompt: "a lighthouse".into(),
            width: 32,
            height: 32,
            seed,
            steps: 1,
            ..Default::default()
        };
        let alone: Vec<Vec<f32>> = (0..3)
            .map(|seed| Ok(text_to_image(m, &request(seed), &mut |_| StepControl::Continue)?.data))
            .collect::<Result<_>>()?;
        for _ in 0..2 {
            std::thread::scope(|scope| {
                let runs: Vec<_> = (0..3)
                    .map(|seed| scope.spawn(move || text_to_image(m, &request(seed), &mut |_| StepControl::Continue)))
                    .collect();
                for (seed, run) in runs.into_iter().enumerate() {
                    let image = run.join().expect("no panic").expect("generated");
                    assert_eq!(image.data, alone[seed], "seed {seed}");
                }
            });
        }
        Ok(())
    }

    #[test]
    fn tiny_text_to_image() -> Result<()> {
        let (_dir, m) = tiny_test_models(11)?;
        let mut req = TextToImage {
            prompt: "a photo of a cat".into(),
            negative: "blurry".into(),
            width: 24,
            height: 16,
            seed: 42,
            steps: 4,
            cfg: 7.5,
            ..Default::default()
        };
        let mut steps = 0;
        let a = text_to_image(&m, &req, &mut |_| {
            steps += 1;
            StepControl::Continue
        })?;
        assert_eq!(steps, 4);
        assert_eq!((a.width, a.height, a.batch, a.channels), (24, 16, 1, 3));
        let png_a = codecs::encode_png(&a, 0, &[("prompt".into(), "{}".into())])?;
        let b = text_to_image(&m, &req, &mut |_| StepControl::Continue)?;
        assert_eq!(
            png_a,
            codecs::encode_png(&b, 0, &[("prompt".into(), "{}".into())])?,
            "same seed, same bytes"
        );
        req.seed = 43;
        let c = text_to_image(&m, &req, &mut |_| StepControl::Continue)?;
        assert_ne!(a.data, c.data, "another seed, another image");
        assert_ne!(png_a, codecs::encode_png(&c, 0, &[("prompt".into(), "{}".into())])?);
        // Cancellation.
        let stopped = text_to_image(&m, &req, &mut |s| {
            if s.step == 1 {
                StepControl::Stop
            } else {
                StepControl::Continue
            }
        });
        assert!(stopped.is_err());
        // Bad sizes are errors.
        req.width = 7;
        assert!(text_to_image(&m, &req, &mut |_| StepControl::Continue).is_err());
        Ok(())
    }
}
