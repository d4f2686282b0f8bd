//! ComfyUI's `KSampler` / `KSamplerAdvanced` and the sampling run every guider shares, on SD1
//! and SDXL networks: the schedule cut to the requested steps, the seed's noise per batch
//! index, guidance over every conditioning entry ([`super::guidance`]), SDXL's size
//! conditioning, inpainting by noise mask, and the model's sampling patches (another model
//! sampling or latent format, `RescaleCFG`).

use super::adm::PromptKind;
use super::conditioning::Conditioning;
use super::guidance::{Combine, Guidance};
use super::inpaint::{noise_mask, ConcatSource};
use super::model::DiffusionModel;
use crate::interrupt::Interrupt;
use crate::sampling::{
    default_noise, ksampler_sigmas, sample_with, seeded_noise, ModelSampling, SampleError, SamplerKind, SamplerOptions,
    Scheduler, StepControl, StepInfo, Tensor, TorchGenerator,
};
use crate::values::LatentBatch;
use crate::ComputeError;

/// A sampling run's parameters: `KSampler`'s, plus `KSamplerAdvanced`'s step window.
#[derive(Debug, Clone)]
pub struct SampleSettings {
    /// Seed of the initial noise and of stochastic samplers' noise.
    pub seed: u64,
    /// Steps of the schedule.
    pub steps: usize,
    /// Guidance scale.
    pub cfg: f64,
    /// Sampler.
    pub sampler: SamplerKind,
    /// Scheduler.
    pub scheduler: Scheduler,
    /// Fraction of the schedule to run.
    pub denoise: f64,
    /// Whether the seed's noise is added to the latent first.
    pub add_noise: bool,
    /// First step to run.
    pub start_step: usize,
    /// Step to stop at (past the end: run to the end).
    pub last_step: usize,
    /// Whether a run stopped early by `last_step` still ends at sigma 0.
    pub force_full_denoise: bool,
}

/// Why sampling did not return a latent.
#[derive(Debug, thiserror::Error)]
pub enum SampleFailure {
    /// The step callback asked to stop.
    #[error("sampling stopped at step {0}")]
    Stopped(usize),
    /// Bad inputs or a failing model.
    #[error(transparent)]
    Compute(#[from] ComputeError),
    /// The caller's [`Interrupt`] fired during a step (inside the model's forward pass).
    #[error("sampling was interrupted")]
    Interrupted,
}

/// One sampling run as ComfyUI's guiders make it (`CFGGuider.sample`): a model, the
/// conditionings its guidance combines, a sampler with its parameters, and the sigmas.
pub struct SamplingRun<'a> {
    /// The model.
    pub model: &'a DiffusionModel,
    /// The conditionings, in the order `combine` names them, each with its prompt kind.
    pub conds: Vec<(&'a Conditioning, PromptKind)>,
    /// How their predictions combine.
    pub combine: Combine,
    /// The sampler.
    pub sampler: SamplerKind,
    /// The sampler's own parameters.
    pub options: SamplerOptions,
    /// The noise levels to step through.
    pub sigmas: Vec<f32>,
    /// Seed of the initial noise (`prepare_noise`); `None` starts from the latent alone.
    pub noise_seed: Option<u64>,
    /// Seed of the sampler's own noise (ancestral and SDE samplers).
    pub sampler_seed: u64,
}

/// What a sampling run returns: the sampled latents and the model's last prediction of the
/// clean latents (`SamplerCustom`'s `denoised_output`; `None` when no step ran).
#[derive(Debug, Clone)]
pub struct Sampled {
    /// The sampled latents.
    pub latent: LatentBatch,
    /// The model's denoised prediction at the last step.
    pub denoised: Option<LatentBatch>,
}

/// Samples `latent` with `model`'s UNet guided by `positive` against `negative`.
/// `on_step` runs after every step with the sampler's view of it (its `step` is 0-based, and
/// `denoised` is the model's prediction, in the sampler's space, as previews show it);
/// [`StepControl::Stop`] ends the run with [`SampleFailure::Stopped`]. `stop` is asked
/// inside every UNet call (between its blocks); once it fires, the run ends with
/// [`SampleFailure::Interrupted`].
pub fn ksample(
    model: &DiffusionModel,
    positive: &Conditioning,
    negative: &Conditioning,
    latent: &LatentBatch,
    settings: &SampleSettings,
    on_step: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
    stop: Interrupt<'_>,
) -> Result<LatentBatch, SampleFailure> {
    let sigmas = schedule(&model.model_sampling(), settings);
    let run = SamplingRun {
        model,
        conds: vec![(positive, PromptKind::Positive), (negative, PromptKind::Negative)],
        combine: Combine::Cfg {
            scale: settings.cfg as f32,
        },
        sampler: settings.sampler,
        options: SamplerOptions::default(),
        sigmas,
        noise_seed: settings.add_noise.then_some(settings.seed),
        sampler_seed: settings.seed,
    };
    if run.sigmas.len() <= 1 {
        check_inputs(&run, latent)?;
        return Ok(latent.clone());
    }
    Ok(run_sampling(&run, latent, on_step, stop)?.latent)
}

/// Refuses what the model cannot sample: latents of another channel count, no positive
/// conditioning, or SDXL without its pooled text output.
fn check_inputs(run: &SamplingRun<'_>, latent: &LatentBatch) -> Result<(), ComputeError> {
    let config = &run.model.checkpoint.config;
    if latent.shape[1] as usize != config.latent_channels {
        return Err(ComputeError::invalid(format!(
            "the model takes latents of {} channels, got {:?}",
            config.latent_channels, latent.shape
        )));
    }
    let positive = run.conds.iter().find(|(_, kind)| *kind == PromptKind::Positive);
    if positive.is_none_or(|(c, _)| c.0.is_empty()) {
        return Err(ComputeError::invalid("the positive conditioning is empty"));
    }
    let needs_pooled = config.adm_in_channels.is_some();
    if needs_pooled && run.conds.iter().flat_map(|(c, _)| &c.0).any(|e| e.pooled.is_none()) {
        return Err(ComputeError::invalid(
            "this SDXL model needs conditioning from its own text encoders (a pooled output); \
             this conditioning was made by another model's CLIP",
        ));
    }
    Ok(())
}

/// Gives the negative conditionings the positive's `ControlNetApply` controls, as ComfyUI's
/// `process_conds` does (the positive is the first for CFG, the last for dual CFG).
fn share_controls(conds: &mut [(Conditioning, PromptKind)], combine: Combine) {
    let positive = match combine {
        Combine::Cfg { .. } => 0,
        Combine::DualCfg { .. } => conds.len().saturating_sub(1),
    };
    let Some(positive_cond) = conds.get(positive).map(|(c, _)| c.clone()) else {
        return;
    };
    for (i, (cond, _)) in conds.iter_mut().enumerate() {
        if i != positive {
            super::controlnet::share_with_uncond(&positive_cond, cond);
        }
    }
}

/// Runs `run` on `latent` (see [`ksample`] for `on_step` and `stop`). No sigmas leave the
/// latent as it is; a single sigma only noises it, as ComfyUI's guiders do.
pub fn run_sampling(
    run: &SamplingRun<'_>,
    latent: &LatentBatch,
    on_step: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
    stop: Interrupt<'_>,
) -> Result<Sampled, SampleFailure> {
    check_inputs(run, latent)?;
    let sigmas = &run.sigmas;
    if sigmas.is_empty() {
        return Ok(Sampled {
            latent: latent.clone(),
            denoised: None,
        });
    }
    let model = run.model;
    let ms = model.model_sampling();
    let shape: Vec<usize> = latent.shape.iter().map(|&d| d as usize).collect();
    let noise = match run.noise_seed {
        Some(seed) => prepare_noise(seed, &shape, latent.batch_index.as_deref()),
        None => vec![0.0; latent.data.len()],
    };
    let plane = shape[2] * shape[3];
    let latent_in = model.process_latent_in(&latent.data, plane);
    let mask = noise_mask(latent, &shape);
    let x0 = ms.noise_scaling(sigmas[0], &noise, &latent_in, ms.is_max_denoise(sigmas[0]));
    let out = |data: &[f32]| LatentBatch {
        data: model.process_latent_out(data, plane),
        ..latent.clone()
    };
    if sigmas.len() == 1 {
        return Ok(Sampled {
            latent: out(&x0),
            denoised: None,
        });
    }
    // Areas in fractions and masks are resolved against the latent once, as ComfyUI does.
    let mut resolved: Vec<(Conditioning, PromptKind)> = run
        .conds
        .iter()
        .map(|(c, kind)| (super::placement::resolve(c, shape[2], shape[3]), *kind))
        .collect();
    share_controls(&mut resolved, run.combine);
    let guide = Guidance {
        model,
        ms: &ms,
        shape: &shape,
        conds: resolved.iter().map(|(c, kind)| (c, *kind)).collect(),
        combine: run.combine,
        rescale: model.cfg_rescale(),
        stop,
        concat: ConcatSource {
            latent: &latent_in,
            denoise_mask: mask.as_deref(),
            shape: [shape[0], shape[1], shape[2], shape[3]],
        },
    };
    let mut denoiser = |x: &Tensor, sigma: f32| -> anyhow::Result<Tensor> {
        let Some(mask) = &mask else {
            return Ok(x.with_data(guide.denoise(&x.data, sigma)?));
        };
        // ComfyUI's KSamplerX0Inpaint: outside the mask the latent is the (noised) original.
        let blended: Vec<f32> = x
            .data
            .iter()
            .zip(mask)
            .zip(noise.iter().zip(&latent_in))
            .map(|((&xv, &m), (&n, &l))| xv * m + (n * sigma + l) * (1.0 - m))
            .collect();
        let out = guide.denoise(&blended, sigma)?;
        Ok(x.with_data(
            out.iter()
                .zip(mask)
                .zip(&latent_in)
                .map(|((&o, &m), &l)| o * m + l * (1.0 - m))
                .collect(),
        ))
    };
    // ComfyUI's default noise sampler for this sampler: a seeded generator, or for the SDE
    // samplers a Brownian tree over these sigmas.
    let mut step_noise = default_noise(run.sampler, run.sampler_seed, sigmas, &shape)
        .map_err(|e| ComputeError::invalid(format!("{e:#}")))?;
    let mut last_denoised: Option<Vec<f32>> = None;
    let mut watch = |info: &StepInfo<'_>| {
        last_denoised = Some(info.denoised.data.clone());
        on_step(info)
    };
    let samples = sample_with(
        run.sampler,
        &run.options,
        &mut denoiser,
        Tensor::new(shape.clone(), x0),
        sigmas,
        step_noise.as_mut(),
        &mut watch,
    )
    .map_err(|e| match e {
        SampleError::Cancelled { step } => SampleFailure::Stopped(step),
        _ if stop.requested() => SampleFailure::Interrupted,
        other => SampleFailure::Compute(ComputeError::Failed(other.to_string())),
    })?;
    Ok(Sampled {
        latent: out(&samples.data),
        denoised: last_denoised.map(|d| out(&d)),
    })
}

/// KSampler's sigmas cut to the step window (`comfy.samplers.KSampler.sample`).
fn schedule(ms: &ModelSampling, s: &SampleSettings) -> Vec<f32> {
    let mut sigmas = ksampler_sigmas(ms, s.scheduler, s.sampler, s.steps, s.denoise);
    if s.last_step < sigmas.len().saturating_sub(1) {
        sigmas.truncate(s.last_step + 1);
        if s.force_full_denoise {
            *sigmas.last_mut().expect("at least one sigma") = 0.0;
        }
    }
    if s.start_step < sigmas.len().saturating_sub(1) {
        sigmas.drain(..s.start_step);
    } else {
        sigmas.clear();
    }
    sigmas
}

/// ComfyUI's `prepare_noise`: one `randn` of the whole batch, or with batch indices one
/// draw per index up to the largest, each latent taking its index's draw.
fn prepare_noise(seed: u64, shape: &[usize], batch_index: Option<&[u32]>) -> Vec<f32> {
    let Some(indices) = batch_index else {
        return seeded_noise(seed, shape).data;
    };
    let per: usize = shape[1..].iter().product();
    let last = indices.iter().copied().max().unwrap_or(0) as usize;
    let mut generator = TorchGenerator::new(seed);
    let draws: Vec<Vec<f32>> = (0..=last).map(|_| generator.randn(per)).collect();
    indices
        .iter()
        .flat_map(|&i| draws[i as usize].iter().copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::latent;
    use crate::diffusion::SizeConditioning;
    use crate::models::loader::tiny_test_models;
    use crate::text_to_image::{text_to_image, TextToImage};
    use candle_core::Tensor as CTensor;

    fn settings(seed: u64) -> SampleSettings {
        SampleSettings {
            seed,
            steps: 3,
            cfg: 7.5,
            sampler: SamplerKind::Euler,
            scheduler: Scheduler::Normal,
            denoise: 1.0,
            add_noise: true,
            start_step: 0,
            last_step: 10_000,
            force_full_denoise: false,
        }
    }

    #[test]
    fn the_default_graph_matches_text_to_image() {
        let (dir, m) = tiny_test_models(5).unwrap();
        let m = std::sync::Arc::new(m);
        let model = DiffusionModel::new(m.clone(), dir.path().join("tiny.safetensors"));
        let encode = |t: &str| crate::text_to_image::encode_text(&m, t).unwrap();
        let pos = Conditioning::from_context(encode("a lighthouse"));
        let neg = Conditioning::from_context(encode("blurry"));
        let empty = latent::empty(32, 16, 1).unwrap();
        let mut steps = Vec::new();
        let out = ksample(
            &model,
            &pos,
            &neg,
            &empty,
            &settings(42),
            &mut |info| {
                let (s, n) = (info.step + 1, info.total);
                steps.push((s, n));
                StepControl::Continue
            },
            Interrupt::NEVER,
        )
        .unwrap();
        assert_eq!(steps, vec![(1, 3), (2, 3), (3, 3)]);
        let image = crate::vae::decode(&m, &Tensor::new(vec![1, 4, 2, 4], out.data.clone())).unwrap();
        let reference = text_to_image(
            &m,
            &TextToImage {
                prompt: "a lighthouse".into(),
                negative: "blurry".into(),
                width: 8,
                height: 4,
                seed: 42,
                steps: 3,
                cfg: 7.5,
                ..Default::default()
            },
            &mut |_| StepControl::Continue,
        )
        .unwrap();
        let worst = image
            .data
            .iter()
            .zip(&reference.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "node path and text_to_image differ by {worst}");
        // Same seed, same latent; another seed, another one.
        let again = ksample(
            &model,
            &pos,
            &neg,
            &empty,
            &settings(42),
            &mut |_| StepControl::Continue,
            Interrupt::NEVER,
        )
        .unwrap();
        assert_eq!(again.data, out.data);
        let other = ksample(
            &model,
            &pos,
            &neg,
            &empty,
            &settings(43),
            &mut |_| StepControl::Continue,
            Interrupt::NEVER,
        )
        .unwrap();
        assert_ne!(other.data, out.data);
        // A stop ends the run.
        let stopped = ksample(
            &model,
            &pos,
            &neg,
            &empty,
            &settings(42),
            &mut |info| {
                let s = info.step + 1;
                if s == 1 {
                    StepControl::Stop
                } else {
                    StepControl::Continue
                }
            },
            Interrupt::NEVER,
        );
        assert!(matches!(stopped, Err(SampleFailure::Stopped(_))));
    }

    #[test]
    fn prompts_of_different_lengths_batch_as_comfyui_does() {
        let (dir, m) = tiny_test_models(8).unwrap();
        let m = std::sync::Arc::new(m);
        let model = DiffusionModel::new(m.clone(), dir.path().join("tiny.safetensors"));
        let encode = |t: &str| crate::text_to_image::encode_text(&m, t).unwrap();
        let short = encode("a lighthouse");
        let long = encode(&"a lighthouse on a cliff at dusk ".repeat(12));
        assert_eq!(long.dim(1).unwrap(), 154);
        let neg = Conditioning::from_context(encode("blurry"));
        let empty = latent::empty(32, 16, 1).unwrap();
        let go = |pos: &Conditioning, neg: &Conditioning| {
            ksample(
                &model,
                pos,
                neg,
                &empty,
                &settings(3),
                &mut |_| StepControl::Continue,
                Interrupt::NEVER,
            )
            .unwrap()
        };
        // A context repeated whole guides exactly as the original (ComfyUI pads by repeating).
        let once = go(&Conditioning::from_context(short.clone()), &neg);
        let twice = go(
            &Conditioning::from_context(CTensor::cat(&[&short, &short], 1).unwrap()),
            &neg,
        );
        let worst = once
            .data
            .iter()
            .zip(&twice.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "a repeated context changed the latent by {worst}");
        // Entries of 77 and 154 tokens share a UNet call; the long one's second chunk counts.
        let both = Conditioning::from_context(short.clone()).combine(&Conditioning::from_context(long.clone()));
        let batched = go(&both, &neg);
        let long_padded = Conditioning::from_context(short.clone())
            .combine(&Conditioning::from_context(long.narrow(1, 0, 77).unwrap()));
        assert_ne!(go(&long_padded, &neg).data, batched.data, "the second chunk counts");
        // A long positive against a short negative runs, and differs from the short one.
        let long_run = go(&Conditioning::from_context(long), &neg);
        assert_ne!(long_run.data, once.data);
        assert!(long_run.data.iter().all(|v| v.is_finite()));
        // `weft models generate`'s path batches a long prompt with a short negative too.
        let request = TextToImage {
            prompt: "a lighthouse on a cliff at dusk ".repeat(12),
            negative: "blurry".into(),
            width: 8,
            height: 4,
            steps: 2,
            ..Default::default()
        };
        let image = text_to_image(&m, &request, &mut |_| StepControl::Continue).unwrap();
        assert!(image.data.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn areas_masks_and_step_windows() {
        let (dir, m) = tiny_test_models(6).unwrap();
        let m = std::sync::Arc::new(m);
        let model = DiffusionModel::new(m.clone(), dir.path().join("tiny.safetensors"));
        let encode = |t: &str| crate::text_to_image::encode_text(&m, t).unwrap();
        let pos = Conditioning::from_context(encode("sky"))
            .combine(&Conditioning::from_context(encode("sea")).set_area(64, 64, 64, 0, 1.0));
        let neg = Conditioning::from_context(encode("")).zero_out().unwrap();
        let base = latent::empty(128, 64, 2).unwrap();
        let go = |l: &LatentBatch, s: &SampleSettings| {
            ksample(
                &model,
                &pos,
                &neg,
                l,
                s,
                &mut |_| StepControl::Continue,
                Interrupt::NEVER,
            )
        };
        let out = go(&base, &settings(1)).unwrap();
        assert_eq!(out.shape, base.shape);
        // A window past the schedule leaves the latent as it was.
        let mut late = settings(1);
        late.start_step = 5;
        assert_eq!(go(&base, &late).unwrap().data, base.data);
        // A zero noise mask keeps the latent.
        let mask = crate::image::MaskBatch {
            width: 128,
            height: 64,
            batch: 1,
            data: vec![0.0; 128 * 64],
        };
        let kept = go(&latent::with_noise_mask(&out, std::sync::Arc::new(mask)), &settings(2)).unwrap();
        let worst = kept
            .data
            .iter()
            .zip(&out.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "masked-out latent changed by {worst}");
        // Batch indices pick the seed's draws: latent 1 of a repeated batch gets draw 1.
        let pair = latent::repeat(&latent::from_batch(&base, 0, 1), 2).unwrap();
        assert_eq!(pair.batch_index, Some(vec![0, 1]));
        let noise = prepare_noise(9, &[2, 4, 8, 16], pair.batch_index.as_deref());
        assert_eq!(noise, seeded_noise(9, &[2, 4, 8, 16]).data);
    }

    /// Every model patch samples (finite latents) and moves the result, except the `eps`
    /// patch without zsnr, which is the model's own sampling bit for bit.
    #[test]
    fn model_patches_change_the_sampling_and_eps_is_the_default() {
        use crate::sampling::{DiscreteSampling, EdmSampling};
        let (dir, m) = tiny_test_models(5).unwrap();
        let m = std::sync::Arc::new(m);
        let model = DiffusionModel::new(m.clone(), dir.path().join("tiny.safetensors"));
        let encode = |t: &str| crate::text_to_image::encode_text(&m, t).unwrap();
        let pos = Conditioning::from_context(encode("a lighthouse"));
        let neg = Conditioning::from_context(encode("blurry"));
        let empty = latent::empty(32, 16, 1).unwrap();
        let run = |model: &DiffusionModel, cfg: f64| {
            let mut s = settings(42);
            s.cfg = cfg;
            let out = ksample(
                model,
                &pos,
                &neg,
                &empty,
                &s,
                &mut |_| StepControl::Continue,
                Interrupt::NEVER,
            );
            let out = out.unwrap();
            assert!(out.data.iter().all(|v| v.is_finite()));
            out.data
        };
        let plain = run(&model, 7.5);
        let eps = model.with_discrete_sampling(DiscreteSampling::Eps, false);
        assert_eq!(run(&eps, 7.5), plain, "eps without zsnr is the default");
        let mut patched: Vec<(String, DiffusionModel)> = DiscreteSampling::ALL
            .iter()
            .flat_map(|&s| [(s, false), (s, true)])
            .filter(|&(s, zsnr)| s != DiscreteSampling::Eps || zsnr)
            .map(|(s, zsnr)| (format!("{s} zsnr {zsnr}"), model.with_discrete_sampling(s, zsnr)))
            .collect();
        for s in EdmSampling::ALL {
            patched.push((format!("edm {s}"), model.with_continuous_edm(s, 0.002, 120.0).unwrap()));
        }
        patched.push(("rescale".into(), model.with_cfg_rescale(0.7).unwrap()));
        for (name, model) in &patched {
            assert_ne!(run(model, 7.5), plain, "{name}");
        }
        // Without guidance RescaleCFG reads zeros for the unconditional prediction: it still
        // runs, and at multiplier 0 it is plain guidance up to rounding.
        let unguided = run(&model, 1.0);
        let zero = run(&model.with_cfg_rescale(0.0).unwrap(), 1.0);
        let worst = zero
            .iter()
            .zip(&unguided)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-3, "{worst}");
    }

    /// A tiny SDXL: both encoders, the pooled output and the size conditioning reach the
    /// UNet, and the sizes change the result.
    #[test]
    fn a_tiny_sdxl_samples_with_its_size_conditioning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-sdxl.safetensors");
        let cfg = crate::models::ModelConfig::tiny_sdxl();
        crate::models::write_random_checkpoint(&path, &cfg, 4).unwrap();
        assert_eq!(crate::diffusion::detect_layout(&path).unwrap(), cfg);
        let cache = crate::models::ModelCache::new(u64::MAX, candle_core::Device::Cpu);
        let m = crate::diffusion::load_checkpoint(&cache, &path, "tiny-sdxl.safetensors").unwrap();
        let text = crate::diffusion::TextEncoder::new(m.clone(), path.clone());
        let encode = |t: &str| text.encode(t, None, Interrupt::NEVER).unwrap();
        let (pos, neg) = (encode("a lighthouse"), encode("blurry"));
        assert_eq!(pos.context.dims(), &[1, 77, 80]);
        assert_eq!(pos.pooled.as_ref().unwrap().dims(), &[1, 48]);
        let model = DiffusionModel::new(m, path);
        let empty = latent::empty(32, 16, 1).unwrap();
        let run = |size: SizeConditioning| {
            let cond =
                |e: &crate::diffusion::Encoded| Conditioning::from_encoded(e.context.clone(), e.pooled.clone(), size);
            ksample(
                &model,
                &cond(&pos),
                &cond(&neg),
                &empty,
                &settings(42),
                &mut |_| StepControl::Continue,
                Interrupt::NEVER,
            )
            .unwrap()
        };
        let plain = run(SizeConditioning::default());
        assert!(plain.data.iter().all(|v| v.is_finite()));
        let same = run(SizeConditioning {
            width: Some(32.0),
            height: Some(16.0),
            ..Default::default()
        });
        assert_eq!(plain.data, same.data, "the defaults are the latent's size");
        let cropped = run(SizeConditioning {
            crop_w: Some(8.0),
            ..Default::default()
        });
        assert_ne!(plain.data, cropped.data);
        // Conditioning without a pooled output (another model's) is refused, not sampled.
        let bare = Conditioning::from_context(pos.context.clone());
        let refused = ksample(
            &model,
            &bare,
            &bare,
            &empty,
            &settings(1),
            &mut |_| StepControl::Continue,
            Interrupt::NEVER,
        );
        assert!(
            matches!(refused, Err(SampleFailure::Compute(ComputeError::Invalid(_)))),
            "{:?}",
            refused.err()
        );
    }
}
