//! ComfyUI's `CONDITIONING`: a list of encoded prompts, each with where it applies and how
//! strongly, and the conditioning nodes' operations on it.

use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::latent::PIXELS_PER_CELL;
use crate::image::MaskBatch;
use crate::ComputeError;

/// Where an entry applies, in latent cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Area {
    /// Height.
    pub height: usize,
    /// Width.
    pub width: usize,
    /// Top edge.
    pub y: usize,
    /// Left edge.
    pub x: usize,
}

/// One encoded prompt.
#[derive(Debug, Clone)]
pub struct CondEntry {
    /// The text encoder's output, `[1, tokens, context_dim]` (float32).
    pub context: Tensor,
    /// The pooled output of SDXL's bigG, `[1, 1280]` (ComfyUI's `pooled_output`).
    pub pooled: Option<Tensor>,
    /// SDXL's size and aesthetic-score conditioning, where a node set it.
    pub size: SizeConditioning,
    /// Where it applies; the whole latent when none.
    pub area: Option<Area>,
    /// Where it applies as fractions of the latent's `[height, width, y, x]`
    /// (`ConditioningSetAreaPercentage`), turned into [`area`](Self::area) when sampling.
    pub area_fraction: Option<[f64; 4]>,
    /// The mask that weights it (`ConditioningSetMask`).
    pub mask: Option<CondMask>,
    /// Weight against the other entries where they overlap.
    pub strength: f32,
    /// The part of sampling it applies to, as fractions of the way through (ComfyUI's
    /// `start_percent`, `end_percent`); all of it when none.
    pub timestep_range: Option<(f64, f64)>,
    /// The masked image's latent an inpainting model reads beside the noisy latent
    /// (`InpaintModelConditioning`'s `concat_latent_image`), `[batch, channels, h, w]` as
    /// nodes see latents; other models ignore it.
    pub concat_latent_image: Option<Arc<crate::sampling::Tensor>>,
    /// The mask an inpainting model reads beside it (`concat_mask`), at any size.
    pub concat_mask: Option<Arc<MaskBatch>>,
    /// The ControlNet applied to it (`ControlNetApply`, `ControlNetApplyAdvanced`), with
    /// those applied before it chained behind.
    pub control: Option<Arc<super::control::Control>>,
}

/// A mask that weights a conditioning entry's prediction cell by cell.
#[derive(Debug, Clone)]
pub struct CondMask {
    /// The masks (one per latent of the batch, or one for all); at the latent's size once
    /// sampling has resolved them.
    pub mask: Arc<MaskBatch>,
    /// Multiplies the mask (ComfyUI's `mask_strength`).
    pub strength: f32,
    /// Whether the entry's area becomes the mask's bounding box (`mask bounds`).
    pub to_bounds: bool,
}

/// The numbers SDXL embeds beside the pooled output (ComfyUI's `width`, `height`,
/// `crop_w`, `crop_h`, `target_width`, `target_height` and the refiner's
/// `aesthetic_score`); `None` takes ComfyUI's default when sampling.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SizeConditioning {
    /// Original width in pixels (default: the latent's).
    pub width: Option<f64>,
    /// Original height in pixels (default: the latent's).
    pub height: Option<f64>,
    /// Left crop in pixels (default 0).
    pub crop_w: Option<f64>,
    /// Top crop in pixels (default 0).
    pub crop_h: Option<f64>,
    /// Target width in pixels (default: `width`).
    pub target_width: Option<f64>,
    /// Target height in pixels (default: `height`).
    pub target_height: Option<f64>,
    /// The refiner's aesthetic score (default 6, or 2.5 for the negative prompt).
    pub aesthetic_score: Option<f64>,
}

/// A list of encoded prompts (ComfyUI's `CONDITIONING`).
#[derive(Debug, Clone)]
pub struct Conditioning(pub Vec<CondEntry>);

/// The most a prompt's tokens are repeated to share a UNet batch with a longer one
/// (ComfyUI's `CONDCrossAttn.can_concat` limit).
const MAX_REPEAT: usize = 4;

/// Whether contexts of `a` and `b` tokens may share one UNet batch (ComfyUI's
/// `CONDCrossAttn.can_concat`): their least common multiple is at most 4 times the shorter.
pub fn can_batch(a: usize, b: usize) -> bool {
    a == b || (a.min(b) > 0 && lcm(a, b) / a.min(b) <= MAX_REPEAT)
}

/// `contexts` (`[batch, tokens, width]`, token counts may differ) each repeated along the
/// token axis to their least common multiple, as ComfyUI's `CONDCrossAttn.concat` does;
/// cross-attention over a context repeated whole gives the same result as over the original.
pub fn repeat_to_common_length(contexts: &[Tensor]) -> candle_core::Result<Vec<Tensor>> {
    let mut common = 1;
    for c in contexts {
        common = lcm(common, c.dim(1)?.max(1));
    }
    contexts
        .iter()
        .map(|c| {
            let tokens = c.dim(1)?;
            if tokens == 0 || tokens == common {
                Ok(c.clone())
            } else {
                c.repeat((1, common / tokens, 1))
            }
        })
        .collect()
}

/// Least common multiple (0 when either is 0).
fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a.checked_div(x).map_or(0, |q| q * b)
}

fn failed(e: candle_core::Error) -> ComputeError {
    ComputeError::Failed(format!("conditioning: {e}"))
}

impl Conditioning {
    /// One whole-image entry of strength 1 without a pooled output.
    pub fn from_context(context: Tensor) -> Self {
        Self::from_encoded(context, None, SizeConditioning::default())
    }

    /// One whole-image entry of strength 1 (what `CLIPTextEncode` and
    /// `CLIPTextEncodeSDXL` make).
    pub fn from_encoded(context: Tensor, pooled: Option<Tensor>, size: SizeConditioning) -> Self {
        Conditioning(vec![CondEntry {
            context,
            pooled,
            size,
            area: None,
            area_fraction: None,
            mask: None,
            strength: 1.0,
            timestep_range: None,
            concat_latent_image: None,
            concat_mask: None,
            control: None,
        }])
    }

    /// `ConditioningCombine`: both lists, `self`'s entries first.
    pub fn combine(&self, other: &Conditioning) -> Conditioning {
        Conditioning(self.0.iter().chain(&other.0).cloned().collect())
    }

    /// `ConditioningAverage`: every entry blended with `source`'s first entry,
    /// `entry * strength + source * (1 - strength)`; `source` is cut or zero-padded to the
    /// entry's token count.
    pub fn average(&self, source: &Conditioning, strength: f64) -> Result<Conditioning, ComputeError> {
        let first = source
            .0
            .first()
            .ok_or_else(|| ComputeError::invalid("conditioning_from is empty"))?;
        let from = &first.context;
        let entries = self
            .0
            .iter()
            .map(|entry| {
                let to = &entry.context;
                let (_, tokens, width) = to.dims3()?;
                let have = from.dim(1)?;
                let from = if have >= tokens {
                    from.narrow(1, 0, tokens)?
                } else {
                    let pad = Tensor::zeros((1, tokens - have, width), DType::F32, from.device())?;
                    Tensor::cat(&[from, &pad], 1)?
                };
                let blended = ((to * strength)? + (from * (1.0 - strength))?)?;
                // ComfyUI blends the pooled outputs the same way, or takes the source's.
                let pooled = match (&entry.pooled, &first.pooled) {
                    (Some(to), Some(from)) => Some(((to * strength)? + (from * (1.0 - strength))?)?),
                    (None, from) => from.clone(),
                    (to, None) => to.clone(),
                };
                Ok(CondEntry {
                    context: blended,
                    pooled,
                    ..entry.clone()
                })
            })
            .collect::<candle_core::Result<_>>()
            .map_err(failed)?;
        Ok(Conditioning(entries))
    }

    /// Every entry changed by `change`.
    fn each(&self, change: impl Fn(&mut CondEntry)) -> Conditioning {
        Conditioning(
            self.0
                .iter()
                .map(|e| {
                    let mut e = e.clone();
                    change(&mut e);
                    e
                })
                .collect(),
        )
    }

    /// `ConditioningSetArea`: every entry restricted to the `width` x `height` rectangle at
    /// `x`, `y` (pixels, rounded down to latent cells) with `strength`; a mask no longer sets
    /// the area.
    pub fn set_area(&self, width: u32, height: u32, x: u32, y: u32, strength: f64) -> Conditioning {
        let cells = |v: u32| (v / PIXELS_PER_CELL) as usize;
        let area = Area {
            height: cells(height),
            width: cells(width),
            y: cells(y),
            x: cells(x),
        };
        self.each(|e| {
            (e.area, e.area_fraction, e.strength) = (Some(area), None, strength as f32);
            e.mask.iter_mut().for_each(|m| m.to_bounds = false);
        })
    }

    /// `ConditioningSetAreaPercentage`: as [`set_area`](Self::set_area), with the rectangle
    /// in fractions of the latent's sides.
    pub fn set_area_fraction(&self, width: f64, height: f64, x: f64, y: f64, strength: f64) -> Conditioning {
        self.each(|e| {
            (e.area, e.area_fraction, e.strength) = (None, Some([height, width, y, x]), strength as f32);
            e.mask.iter_mut().for_each(|m| m.to_bounds = false);
        })
    }

    /// `ConditioningSetAreaStrength`: every entry's strength.
    pub fn set_strength(&self, strength: f64) -> Conditioning {
        self.each(|e| e.strength = strength as f32)
    }

    /// `ConditioningSetMask`: every entry weighted by `mask` times `strength`, its area the
    /// mask's bounding box when `to_bounds`.
    pub fn set_mask(&self, mask: Arc<MaskBatch>, strength: f64, to_bounds: bool) -> Conditioning {
        self.each(|e| {
            e.mask = Some(CondMask {
                mask: mask.clone(),
                strength: strength as f32,
                to_bounds,
            })
        })
    }

    /// `ConditioningConcat`: every entry's tokens followed by those of `from`'s first entry.
    pub fn concat(&self, from: &Conditioning) -> Result<Conditioning, ComputeError> {
        let first = from
            .0
            .first()
            .ok_or_else(|| ComputeError::invalid("conditioning_from is empty"))?;
        let entries = self
            .0
            .iter()
            .map(|e| {
                if e.context.dim(2)? != first.context.dim(2)? {
                    candle_core::bail!(
                        "prompts of {} and {} features cannot be concatenated",
                        e.context.dim(2)?,
                        first.context.dim(2)?
                    );
                }
                let context = Tensor::cat(&[&e.context, &first.context.to_device(e.context.device())?], 1)?;
                Ok(CondEntry { context, ..e.clone() })
            })
            .collect::<candle_core::Result<_>>()
            .map_err(|e| ComputeError::invalid(format!("ConditioningConcat: {e}")))?;
        Ok(Conditioning(entries))
    }

    /// `ConditioningSetTimestepRange`: every entry applies from `start` to `end` of the way
    /// through sampling (fractions in 0..=1).
    pub fn set_timestep_range(&self, start: f64, end: f64) -> Result<Conditioning, ComputeError> {
        if !(0.0..=1.0).contains(&start) || !(0.0..=1.0).contains(&end) {
            return Err(ComputeError::invalid(format!(
                "start and end must be between 0 and 1, got {start} and {end}"
            )));
        }
        Ok(Conditioning(
            self.0
                .iter()
                .map(|e| CondEntry {
                    timestep_range: Some((start, end)),
                    ..e.clone()
                })
                .collect(),
        ))
    }

    /// `ConditioningZeroOut`: every entry's tensor set to zero.
    pub fn zero_out(&self) -> Result<Conditioning, ComputeError> {
        let entries = self
            .0
            .iter()
            .map(|e| {
                Ok(CondEntry {
                    context: e.context.zeros_like()?,
                    pooled: e.pooled.as_ref().map(Tensor::zeros_like).transpose()?,
                    ..e.clone()
                })
            })
            .collect::<candle_core::Result<_>>()
            .map_err(failed)?;
        Ok(Conditioning(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn cond(values: &[f32], tokens: usize) -> Conditioning {
        let t = Tensor::from_slice(values, (1, tokens, values.len() / tokens), &Device::Cpu).unwrap();
        Conditioning::from_context(t)
    }

    #[test]
    fn operations_follow_comfyui() {
        let a = cond(&[1.0, 1.0, 1.0, 1.0], 2);
        let b = cond(&[3.0, 3.0], 1);
        assert_eq!(a.combine(&b).0.len(), 2);
        let avg = a.average(&b, 0.25).unwrap();
        let v: Vec<f32> = avg.0[0].context.flatten_all().unwrap().to_vec1().unwrap();
        // First token blends with b's token, the second with zero padding.
        assert_eq!(v, vec![2.5, 2.5, 0.25, 0.25]);
        let area = a.set_area(64, 128, 8, 16, 0.5);
        assert_eq!(
            area.0[0].area,
            Some(Area {
                height: 16,
                width: 8,
                y: 2,
                x: 1
            })
        );
        assert_eq!(area.0[0].strength, 0.5);
        // ComfyUI's averaging cuts a longer source to the entry's tokens.
        let long = cond(&[5.0, 5.0, 7.0, 7.0, 9.0, 9.0], 3);
        let short = cond(&[1.0, 1.0], 1);
        let v: Vec<f32> = short.average(&long, 0.5).unwrap().0[0]
            .context
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(v, vec![3.0, 3.0]);
        let zero = a.zero_out().unwrap();
        let v: Vec<f32> = zero.0[0].context.flatten_all().unwrap().to_vec1().unwrap();
        assert!(v.iter().all(|&x| x == 0.0));
        assert!(a.average(&Conditioning(Vec::new()), 0.5).is_err());
    }

    #[test]
    fn contexts_repeat_to_their_least_common_multiple() {
        assert!(can_batch(77, 154) && can_batch(154, 231) && can_batch(77, 308));
        assert!(!can_batch(77, 385) && !can_batch(154, 385) && !can_batch(0, 77));
        let a = Tensor::from_slice(&[1f32, 2.0], (1, 1, 2), &Device::Cpu).unwrap();
        let b = Tensor::from_slice(&[3f32, 4.0, 5.0, 6.0], (1, 2, 2), &Device::Cpu).unwrap();
        let c = Tensor::from_slice(&[7f32; 6], (1, 3, 2), &Device::Cpu).unwrap();
        let out = repeat_to_common_length(&[a, b, c]).unwrap();
        assert!(out.iter().all(|t| t.dims() == [1, 6, 2]));
        let v: Vec<f32> = out[1].flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(v, vec![3.0, 4.0, 5.0, 6.0, 3.0, 4.0, 5.0, 6.0, 3.0, 4.0, 5.0, 6.0]);
    }
}
