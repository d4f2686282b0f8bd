//! Guidance as ComfyUI's guiders compute it: each conditioning's prediction is the weighted
//! mean of its entries' UNet predictions (`calc_cond_batch`: areas, strengths, timestep
//! ranges, entries batched into shared UNet calls, ControlNets), and the predictions are combined by
//! classifier-free guidance (`CFGGuider`, `KSampler`) or `DualCFGGuider`'s two scales, with
//! the model's `RescaleCFG` patch applied where ComfyUI applies its `cfg_function`.

use candle_core::Tensor as CTensor;

use super::adm::{adm_vector, PromptKind};
use super::conditioning::{can_batch, repeat_to_common_length, CondEntry, Conditioning};
use super::control::{same_control, ControlCall};
use super::inpaint::{concat_inputs, ConcatSource};
use super::model::DiffusionModel;
use super::placement::{region, weights, Region};
use crate::interrupt::Interrupt;
use crate::sampling::{cfg, rescale_cfg, ModelSampling};

/// How a guider combines its conditionings' predictions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Combine {
    /// Classifier-free guidance over `[positive, negative]`:
    /// `negative + (positive - negative) * scale`; at scale 1 the negative is not run.
    Cfg {
        /// The guidance scale.
        scale: f32,
    },
    /// `DualCFGGuider` over `[negative, middle, positive]`.
    DualCfg {
        /// Scale from the middle conditioning to the positive one (`cfg_conds`).
        cfg_conds: f32,
        /// Scale from the negative conditioning to the middle one (`cfg_cond2_negative`).
        cfg_negative: f32,
        /// `nested` style: the positive-over-middle guidance, itself guided against the
        /// negative; otherwise (`regular`) the two guidances added.
        nested: bool,
    },
}

/// ComfyUI's `math.isclose(value, 1.0)`.
fn is_one(value: f32) -> bool {
    (value - 1.0).abs() <= 1e-9
}

/// A guider at work on one sampling run: its model, conditionings and how they combine.
pub struct Guidance<'a> {
    /// The model.
    pub model: &'a DiffusionModel,
    /// The model's sampling (sigmas, timesteps, prediction type).
    pub ms: &'a ModelSampling,
    /// The latent batch's shape, `[batch, channels, height, width]`.
    pub shape: &'a [usize],
    /// The conditionings, in the order [`Combine`] names them, each with the prompt kind
    /// SDXL's refiner conditioning reads (its default aesthetic score).
    pub conds: Vec<(&'a Conditioning, PromptKind)>,
    /// How the predictions combine.
    pub combine: Combine,
    /// `RescaleCFG`'s multiplier, when the model has one.
    pub rescale: Option<f64>,
    /// Asked between the UNet's blocks.
    pub stop: Interrupt<'a>,
    /// What an inpainting model's extra input falls back on ([`concat_inputs`]).
    pub concat: ConcatSource<'a>,
}

/// Entries that share a UNet call: their region, the first entry's token count, and each
/// entry with the index of the conditioning it belongs to.
type Group<'a> = (Region, usize, Vec<(usize, &'a CondEntry)>);

impl Guidance<'_> {
    /// `D(x, sigma)` with guidance, for the sampler-space batch `x`. As in ComfyUI, the
    /// conditionings a guider needs go through one `calc_cond_batch`, so that entries of any
    /// of them that may be batched share a UNet call. A conditioning whose scale makes it
    /// unnecessary is not run; `RescaleCFG` then reads a prediction of zeros for it, as
    /// ComfyUI's does.
    pub fn denoise(&self, x: &[f32], sigma: f32) -> anyhow::Result<Vec<f32>> {
        match self.combine {
            Combine::Cfg { scale } => {
                let with_uncond = !is_one(scale);
                let which: &[usize] = if with_uncond { &[0, 1] } else { &[0] };
                let mut preds = self.predict(which, x, sigma)?;
                let uncond = with_uncond.then(|| preds.pop()).flatten();
                let cond = preds.pop().expect("the positive prediction");
                Ok(self.cfg(x, &cond, uncond, scale, sigma))
            }
            Combine::DualCfg {
                cfg_conds,
                cfg_negative,
                nested: false,
            } => {
                let with_negative = !is_one(cfg_negative);
                let with_middle = with_negative || !is_one(cfg_conds);
                let which: Vec<usize> = [(0, with_negative), (1, with_middle), (2, true)]
                    .into_iter()
                    .filter_map(|(i, used)| used.then_some(i))
                    .collect();
                let mut preds = self.predict(&which, x, sigma)?.into_iter();
                let negative = with_negative.then(|| preds.next()).flatten();
                let middle = with_middle.then(|| preds.next()).flatten();
                let middle = middle.unwrap_or_else(|| vec![0.0; x.len()]);
                let positive = preds.next().expect("the positive prediction");
                let guided = self.cfg(x, &middle, negative, cfg_negative, sigma);
                Ok(guided
                    .iter()
                    .zip(positive.iter().zip(&middle))
                    .map(|(&g, (&p, &m))| g + (p - m) * cfg_conds)
                    .collect())
            }
            Combine::DualCfg {
                cfg_conds,
                cfg_negative,
                nested: true,
            } => {
                let [negative, middle, positive]: [Vec<f32>; 3] = self
                    .predict(&[0, 1, 2], x, sigma)?
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("three predictions"))?;
                let text = self.cfg(x, &positive, Some(middle), cfg_conds, sigma);
                Ok(negative
                    .iter()
                    .zip(&text)
                    .map(|(&n, &t)| n + cfg_negative * (t - n))
                    .collect())
            }
        }
    }

    /// ComfyUI's `cfg_function`: `uncond + (cond - uncond) * scale`, or the model's
    /// `RescaleCFG` (which reads zeros for an unconditional prediction that was not run).
    fn cfg(&self, x: &[f32], cond: &[f32], uncond: Option<Vec<f32>>, scale: f32, sigma: f32) -> Vec<f32> {
        match (self.rescale, uncond) {
            (None, None) => cond.to_vec(),
            (None, Some(uncond)) => cfg(&uncond, cond, scale),
            (Some(multiplier), uncond) => {
                let uncond = uncond.unwrap_or_else(|| vec![0.0; x.len()]);
                rescale_cfg(x, cond, &uncond, scale, sigma, multiplier, self.shape[0])
            }
        }
    }

    /// For each conditioning of `self.conds` named in `which`, in that order, the weighted
    /// mean of its entries' denoised predictions (`calc_cond_batch`). Entries over one region
    /// share a UNet call, whichever conditioning they belong to, when their prompt lengths
    /// may be batched ([`can_batch`] with the group's first entry, as ComfyUI groups them).
    fn predict(&self, which: &[usize], x: &[f32], sigma: f32) -> anyhow::Result<Vec<Vec<f32>>> {
        let [b, c, height, width] = [self.shape[0], self.shape[1], self.shape[2], self.shape[3]];
        let mut out: Vec<Vec<f32>> = vec![vec![0.0f32; x.len()]; which.len()];
        let mut counts: Vec<Vec<f32>> = vec![vec![1e-37f32; x.len()]; which.len()];
        let mut groups: Vec<Group> = Vec::new();
        for (index, &cond) in which.iter().enumerate() {
            for entry in self.conds[cond].0 .0.iter() {
                let Some(region) = region(entry.area, height, width) else {
                    continue;
                };
                if !self.applies_at(entry, sigma) {
                    continue;
                }
                let tokens = entry.context.dim(1)?;
                match groups.iter_mut().find(|(r, t, members)| {
                    *r == region && can_batch(*t, tokens) && same_control(&members[0].1.control, &entry.control)
                }) {
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
            let preds = self.unet(which, &members, &crop, (region, [b, c, h, w]), sigma)?;
            for (&(index, entry), pred) in members.iter().zip(preds.chunks_exact(crop.len())) {
                let mult = weights(entry, region, height, width, b);
                let (out, counts) = (&mut out[index], &mut counts[index]);
                for plane in 0..b * c {
                    let latent = plane / c;
                    for r in 0..h {
                        for col in 0..w {
                            let i = (plane * height + y + r) * width + x0 + col;
                            let m = mult[(latent * h + r) * w + col];
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

    /// One UNet call for `members` (entries with their conditioning's index in `which`) on
    /// the cropped batch `crop`, their contexts repeated to a common length: every member's
    /// denoised prediction, one after the other.
    fn unet(
        &self,
        which: &[usize],
        members: &[(usize, &CondEntry)],
        crop: &[f32],
        (region, shape): (Region, [usize; 4]),
        sigma: f32,
    ) -> anyhow::Result<Vec<f32>> {
        let device = &self.model.checkpoint.device;
        let b = shape[0];
        let scaled = self.ms.calculate_input(sigma, crop);
        let latent_input = CTensor::from_slice(&scaled, shape.as_slice(), device)?;
        // An inpainting model reads the concat inputs beside the latent; a ControlNet reads
        // the latent alone, as ComfyUI's `get_control` does.
        let input = self.with_concat(&latent_input, members, region)?;
        let contexts = members
            .iter()
            .map(|(_, e)| e.context.to_device(device)?.repeat((b, 1, 1)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let context = CTensor::cat(&repeat_to_common_length(&contexts)?, 0)?;
        let y = self.adm(which, members, b)?;
        let t = self.ms.timestep(sigma) as f64;
        let control = match &members[0].1.control {
            Some(control) => control.residuals(&ControlCall {
                input: &CTensor::cat(&vec![&latent_input; members.len()], 0)?,
                sigma,
                ms: self.ms,
                context: (&context, y.as_ref()),
                members: members.len(),
                stop: self.stop,
            })?,
            None => None,
        };
        let output =
            self.model
                .unet()
                .forward_controlled(&input, t, (&context, y.as_ref()), control.as_ref(), self.stop)?;
        let output = output.flatten_all()?.to_vec1::<f32>()?;
        Ok(output
            .chunks_exact(crop.len())
            .flat_map(|out| self.ms.calculate_denoised(sigma, out, crop))
            .collect())
    }
}

impl Guidance<'_> {
    /// `input` (the batch cut to `region`) once per member, each followed along the
    /// channels by the member's extra input cut to `region` when the model is an inpainting
    /// model (ComfyUI's `c_concat`, cut to the entry's area); other models ignore it.
    fn with_concat(&self, input: &CTensor, members: &[(usize, &CondEntry)], region: Region) -> anyhow::Result<CTensor> {
        let mut rows = Vec::with_capacity(members.len());
        for (_, entry) in members {
            let Some(extra) = concat_inputs(self.model, entry, &self.concat)? else {
                rows.push(input.clone());
                continue;
            };
            let [b, c, height, width] = self.concat.shape;
            let (y, x0, h, w) = region;
            let channels = c + 1;
            let cut: Vec<f32> = (0..b * channels)
                .flat_map(|plane| {
                    (0..h).flat_map(move |r| {
                        let start = (plane * height + y + r) * width + x0;
                        start..start + w
                    })
                })
                .map(|i| extra[i])
                .collect();
            let extra = CTensor::from_slice(&cut, (b, channels, h, w), input.device())?;
            rows.push(CTensor::cat(&[input, &extra], 1)?);
        }
        Ok(CTensor::cat(&rows, 0)?)
    }

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
    fn adm(&self, which: &[usize], members: &[(usize, &CondEntry)], batch: usize) -> anyhow::Result<Option<CTensor>> {
        let config = &self.model.checkpoint.config;
        let latent = (self.shape[2], self.shape[3]);
        let mut rows = Vec::with_capacity(members.len());
        for &(index, entry) in members {
            let kind = self.conds[which[index]].1;
            match adm_vector(config.family, entry, latent, kind)? {
                Some(y) => rows.push(y.to_device(&self.model.checkpoint.device)?.repeat((batch, 1))?),
                None => return Ok(None),
            }
        }
        Ok(Some(CTensor::cat(&rows, 0)?))
    }
}
