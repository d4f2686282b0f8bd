//! ComfyUI's `KSampler` / `KSamplerAdvanced` on SD1 and SDXL networks: the schedule cut to the
//! requested steps, the seed's noise per batch index, classifier-free guidance over every
//! conditioning entry (areas and strengths weighted as ComfyUI's `calc_cond_batch` does),
//! SDXL's size conditioning, inpainting by noise mask, and the model's sampling patches
//! (another model sampling or latent format, `RescaleCFG`).

use candle_core::Tensor as CTensor;

use super::adm::{adm_vector, PromptKind};
use super::conditioning::{can_batch, repeat_to_common_length, Area, CondEntry, Conditioning};
use super::model::DiffusionModel;
use super::resize::{resize_planes, Mode};
use crate::interrupt::Interrupt;
use crate::sampling::{
    cfg, default_noise, ksampler_sigmas, rescale_cfg, sample, seeded_noise, ModelSampling, SampleError, SamplerKind,
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
    let models = &model.checkpoint;
    let shape: Vec<usize> = latent.shape.iter().map(|&d| d as usize).collect();
    if shape[1] != models.config.latent_channels {
        return Err(ComputeError::invalid(format!(
            "the model takes latents of {} channels, got {:?}",
            models.config.latent_channels, latent.shape
        ))
        .into());
    }
    if positive.0.is_empty() {
        return Err(ComputeError::invalid("the positive conditioning is empty").into());
    }
    let needs_pooled = models.config.adm_in_channels.is_some();
    if needs_pooled && positive.0.iter().chain(&negative.0).any(|e| e.pooled.is_none()) {
        return Err(ComputeError::invalid(
            "this SDXL model needs conditioning from its own text encoders (a pooled output); \
             this conditioning was made by another model's CLIP",
        )
        .into());
    }
    let ms = model.model_sampling();
    let sigmas = schedule(&ms, settings);
    if sigmas.len() <= 1 {
        return Ok(latent.clone());
    }
    let noise = if settings.add_noise {
        prepare_noise(settings.seed, &shape, latent.batch_index.as_deref())
    } else {
        vec![0.0; latent.data.len()]
    };
    let plane = shape[2] * shape[3];
    let latent_in = model.process_latent_in(&latent.data, plane);
    let mask = latent.noise_mask.as_ref().map(|m| {
        let planes = resize_planes(
            &m.data,
            m.height as usize,
            m.width as usize,
            shape[2],
            shape[3],
            Mode::Bilinear,
        );
        let plane = shape[2] * shape[3];
        let count = m.batch as usize;
        (0..shape[0])
            .flat_map(|b| {
                let mine = &planes[(b % count) * plane..(b % count + 1) * plane];
                std::iter::repeat_n(mine, shape[1]).flatten().copied()
            })
            .collect::<Vec<f32>>()
    });
    let x0 = ms.noise_scaling(sigmas[0], &noise, &latent_in, ms.is_max_denoise(sigmas[0]));
    let guide = Guidance {
        model,
        ms: &ms,
        shape: &shape,
        positive,
        negative,
        scale: settings.cfg as f32,
        rescale: model.cfg_rescale(),
        stop,
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
    let mut step_noise = default_noise(settings.sampler, settings.seed, &sigmas, &shape)
        .map_err(|e| ComputeError::invalid(format!("{e:#}")))?;
    let x0 = Tensor::new(shape.clone(), x0);
    let samples = sample(
        settings.sampler,
        &mut denoiser,
        x0,
        &sigmas,
        step_noise.as_mut(),
        on_step,
    )
    .map_err(|e| match e {
        SampleError::Cancelled { step } => SampleFailure::Stopped(step),
        _ if stop.requested() => SampleFailure::Interrupted,
        other => SampleFailure::Compute(ComputeError::Failed(other.to_string())),
    })?;
    Ok(LatentBatch {
        data: model.process_latent_out(&samples.data, plane),
        ..latent.clone()
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

/// Classifier-free guidance over conditioning lists.
struct Guidance<'a> {
    model: &'a DiffusionModel,
    ms: &'a ModelSampling,
    shape: &'a [usize],
    positive: &'a Conditioning,
    negative: &'a Conditioning,
    scale: f32,
    /// `RescaleCFG`'s multiplier, when the model has one.
    rescale: Option<f64>,
    stop: Interrupt<'a>,
}

/// A latent region in cells: `(y, x, height, width)`.
type Region = (usize, usize, usize, usize);

/// The latent region an entry reads, in cells: `(y, x, height, width)`, clamped to the latent.
fn region(area: Option<Area>, height: usize, width: usize) -> Option<Region> {
    match area {
        None => Some((0, 0, height, width)),
        Some(a) => {
            let h = a.height.min(height.saturating_sub(a.y));
            let w = a.width.min(width.saturating_sub(a.x));
            (h > 0 && w > 0).then_some((a.y, a.x, h, w))
        }
    }
}

/// ComfyUI's weight of each cell of an area entry: its strength, faded in over up to 8 cells
/// at every edge that is not the latent's border.
fn weights(entry: &CondEntry, (y, x, h, w): (usize, usize, usize, usize), height: usize, width: usize) -> Vec<f32> {
    let mut mult = vec![entry.strength; h * w];
    if entry.area.is_none() {
        return mult;
    }
    let fade = |size: usize, offset: usize, full: usize| -> Vec<f32> {
        let mut f = vec![1.0f32; size];
        let rr = 8.min(size / 4);
        for t in 0..rr {
            let ramp = (1.0 / rr as f32) * (t + 1) as f32;
            if offset != 0 {
                f[t] *= ramp;
            }
            if size + offset < full {
                f[size - 1 - t] *= ramp;
            }
        }
        f
    };
    let (fy, fx) = (fade(h, y, height), fade(w, x, width));
    for r in 0..h {
        for c in 0..w {
            mult[r * w + c] *= fy[r] * fx[c];
        }
    }
    mult
}

/// Entries that share a UNet call: their region, the first entry's token count, and each
/// entry with the index of the conditioning it belongs to.
type Group<'a> = (Region, usize, Vec<(usize, &'a CondEntry)>);

impl Guidance<'_> {
    /// `D(x, sigma)` with guidance, for the sampler-space batch `x`. As in ComfyUI's
    /// `sampling_function`, the positive and negative entries go through one
    /// `calc_cond_batch`, so that entries of both that may be batched share a UNet call.
    /// Without guidance (scale 1) the negative is not run; `RescaleCFG` then reads an
    /// unconditional prediction of zeros, as ComfyUI's does.
    fn denoise(&self, x: &[f32], sigma: f32) -> anyhow::Result<Vec<f32>> {
        let with_uncond = (self.scale - 1.0).abs() > 1e-9;
        let (cond, uncond) = if with_uncond {
            let [cond, uncond] = self.predict([&self.positive.0, &self.negative.0], x, sigma)?;
            (cond, Some(uncond))
        } else {
            let [cond] = self.predict([&self.positive.0], x, sigma)?;
            (cond, None)
        };
        Ok(match (self.rescale, uncond) {
            (None, None) => cond,
            (None, Some(uncond)) => cfg(&uncond, &cond, self.scale),
            (Some(multiplier), uncond) => {
                let uncond = uncond.unwrap_or_else(|| vec![0.0; x.len()]);
                rescale_cfg(x, &cond, &uncond, self.scale, sigma, multiplier, self.shape[0])
            }
        })
    }

    /// For each conditioning of `conds`, the weighted mean of its entries' denoised
    /// predictions (`calc_cond_batch`). Entries over one region share a UNet call, whichever
    /// conditioning they belong to, when their prompt lengths may be batched ([`can_batch`]
    /// with the group's first entry, as ComfyUI groups them).
    fn predict<const N: usize>(
        &self,
        conds: [&[CondEntry]; N],
        x: &[f32],
        sigma: f32,
    ) -> anyhow::Result<[Vec<f32>; N]> {
        let [b, c, height, width] = [self.shape[0], self.shape[1], self.shape[2], self.shape[3]];
        let mut out: [Vec<f32>; N] = std::array::from_fn(|_| vec![0.0f32; x.len()]);
        let mut counts: [Vec<f32>; N] = std::array::from_fn(|_| vec![1e-37f32; x.len()]);
        let mut groups: Vec<Group> = Vec::new();
        for (index, entries) in conds.iter().enumerate() {
            for entry in entries.iter() {
                let Some(region) = region(entry.area, height, width) else {
                    continue;
                };
                if !self.applies_at(entry, sigma) {
                    continue;
                }
                let tokens = entry.context.dim(1)?;
                match groups
                    .iter_mut()
                    .find(|(r, t, _)| *r == region && can_batch(*t, tokens))
                {
                    Some((_, _, members)) => members.push((index, entry)),
                    None => groups.push((region, tokens, vec![(index, entry)])),
                }
            }
        }
        for (region, _, mut members) in groups {
            // ComfyUI batches a group's entries in reverse order: the negative prompt first.
            members.reverse();
            let (y, x0, h, w) = region;
            let crop: Vec<f32> = (0..b * c)
                .flat_map(|plane| {
                    (0..h).flat_map(move |r| {
                        let start = (plane * height + y + r) * width + x0;
                        start..start + w
                    })
                })
                .map(|i| x[i])
                .collect();
            let preds = self.unet(&members, &crop, [b, c, h, w], sigma)?;
            for (&(index, entry), pred) in members.iter().zip(preds.chunks_exact(crop.len())) {
                let mult = weights(entry, region, height, width);
                let (out, counts) = (&mut out[index], &mut counts[index]);
                for plane in 0..b * c {
                    for r in 0..h {
                        for col in 0..w {
                            let i = (plane * height + y + r) * width + x0 + col;
                            let m = mult[r * w + col];
                            out[i] += pred[(plane * h + r) * w + col] * m;
                            counts[i] += m;
                        }
                    }
                }
            }
        }
        for (out, counts) in out.iter_mut().zip(&counts) {
            for (o, n) in out.iter_mut().zip(counts) {
                *o /= n;
            }
        }
        Ok(out)
    }

    /// One UNet call for `members` (entries with the index of their conditioning: 0 positive,
    /// 1 negative) on the cropped batch `crop`, their contexts repeated to a common length:
    /// every member's denoised prediction, one after the other.
    fn unet(
        &self,
        members: &[(usize, &CondEntry)],
        crop: &[f32],
        shape: [usize; 4],
        sigma: f32,
    ) -> anyhow::Result<Vec<f32>> {
        let device = &self.model.checkpoint.device;
        let b = shape[0];
        let scaled = self.ms.calculate_input(sigma, crop);
        let input = CTensor::from_slice(&scaled, shape.as_slice(), device)?;
        let input = CTensor::cat(&vec![&input; members.len()], 0)?;
        let contexts = members
            .iter()
            .map(|(_, e)| e.context.to_device(device)?.repeat((b, 1, 1)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let context = CTensor::cat(&repeat_to_common_length(&contexts)?, 0)?;
        let y = self.adm(members, b)?;
        let t = self.ms.timestep(sigma) as f64;
        let output = self
            .model
            .unet()
            .forward_interruptible(&input, t, (&context, y.as_ref()), self.stop)?;
        let output = output.flatten_all()?.to_vec1::<f32>()?;
        Ok(output
            .chunks_exact(crop.len())
            .flat_map(|out| self.ms.calculate_denoised(sigma, out, crop))
            .collect())
    }
}

impl Guidance<'_> {
    /// Whether `entry` takes part at `sigma`: inside its timestep range, the range's ends
    /// turned into sigmas as ComfyUI's `calculate_start_end_timesteps` does.
    fn applies_at(&self, entry: &CondEntry, sigma: f32) -> bool {
        match entry.timestep_range {
            None => true,
            Some((start, end)) => sigma <= self.ms.percent_to_sigma(start) && sigma >= self.ms.percent_to_sigma(end),
        }
    }

    /// The members' SDXL conditioning vectors, each repeated for the `batch` latents, or
    /// `None` for models without one.
    fn adm(&self, members: &[(usize, &CondEntry)], batch: usize) -> anyhow::Result<Option<CTensor>> {
        let config = &self.model.checkpoint.config;
        let latent = (self.shape[2], self.shape[3]);
        let mut rows = Vec::with_capacity(members.len());
        for &(index, entry) in members {
            let kind = if index == 0 {
                PromptKind::Positive
            } else {
                PromptKind::Negative
            };
            match adm_vector(config.family, entry, latent, kind)? {
                Some(y) => rows.push(y.to_device(&self.model.checkpoint.device)?.repeat((batch, 1))?),
                None => return Ok(None),
            }
        }
        Ok(Some(CTensor::cat(&rows, 0)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diffusion::latent;
    use crate::diffusion::SizeConditioning;
    use crate::models::loader::tiny_test_models;
    use crate::text_to_image::{text_to_image, TextToImage};

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
