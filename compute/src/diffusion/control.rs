//! ControlNets applied to conditioning, as ComfyUI's `ControlNetApply` and
//! `ControlNetApplyAdvanced` attach them (`comfy/controlnet.py`'s `ControlNet` after
//! `set_cond_hint`): each entry carries a [`Control`], chained to the control it had before,
//! and sampling adds the controls' residuals to the UNet's skip connections and middle block
//! for the steps inside each control's range.

use std::fmt;
use std::sync::Arc;

use candle_core::{Result, Tensor};

use super::conditioning::{CondEntry, Conditioning};
use crate::image::resample::{upscale_center, Mode, Planes};
use crate::image::ImageBatch;
use crate::interrupt::Interrupt;
use crate::models::controlnet::ControlNetFile;
use crate::models::ControlResiduals;
use crate::sampling::ModelSampling;
use crate::ComputeError;

/// Pixels per latent cell the hint is resized to (ComfyUI's `compression_ratio`).
const HINT_SCALE: usize = 8;

/// A ControlNet with its control image, strength and range (one ComfyUI `ControlNet` copy).
/// Entries that share a `Control` (the same `Arc`) share UNet calls.
pub struct Control {
    /// The network.
    pub model: Arc<ControlNetFile>,
    /// The control image, `[batch, height, width, channels]` in 0..=1.
    pub hint: Arc<ImageBatch>,
    /// Multiplies the residuals.
    pub strength: f64,
    /// Where in sampling it applies, as fractions of the way through (`start_percent`,
    /// `end_percent`).
    pub range: (f64, f64),
    /// The control the entry had before this one was applied; its residuals are added.
    pub previous: Option<Arc<Control>>,
    /// Whether sampling gives it to a negative prompt without controls too (`ControlNetApply`'s
    /// `control_apply_to_uncond`).
    pub apply_to_uncond: bool,
}

impl fmt::Debug for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Control")
            .field("strength", &self.strength)
            .field("range", &self.range)
            .field("previous", &self.previous)
            .finish_non_exhaustive()
    }
}

/// Whether `a` and `b` may share a UNet call: the same control, or none (ComfyUI compares
/// the objects).
pub fn same_control(a: &Option<Arc<Control>>, b: &Option<Arc<Control>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// The parts of a control application the nodes choose.
#[derive(Debug, Clone, Copy)]
pub struct ControlSettings {
    /// Multiplies the residuals.
    pub strength: f64,
    /// `start_percent`, `end_percent`.
    pub range: (f64, f64),
}

/// Checks that `hint` can drive `model`: as many channels as its hint encoder reads.
fn check_hint(model: &ControlNetFile, hint: &ImageBatch) -> std::result::Result<(), ComputeError> {
    let want = model.net.hint_channels();
    if hint.channels as usize != want {
        return Err(ComputeError::invalid(format!(
            "this ControlNet reads {want}-channel control images; the image has {} channels",
            hint.channels
        )));
    }
    if hint.width == 0 || hint.height == 0 || hint.batch == 0 {
        return Err(ComputeError::invalid("the control image is empty"));
    }
    Ok(())
}

/// `ControlNetApplyAdvanced`: `positive` and `negative` with `model` applied (strength 0
/// leaves them as they are). Entries that had the same control before share the new one.
pub fn apply_advanced(
    (positive, negative): (&Conditioning, &Conditioning),
    model: &Arc<ControlNetFile>,
    hint: &Arc<ImageBatch>,
    settings: ControlSettings,
) -> std::result::Result<(Conditioning, Conditioning), ComputeError> {
    if settings.strength == 0.0 {
        return Ok((positive.clone(), negative.clone()));
    }
    check_hint(model, hint)?;
    let mut made: Vec<(Option<Arc<Control>>, Arc<Control>)> = Vec::new();
    let mut apply = |c: &Conditioning| {
        let entries = c
            .0
            .iter()
            .map(|entry| {
                let control = match made.iter().find(|(prev, _)| same_control(prev, &entry.control)) {
                    Some((_, control)) => control.clone(),
                    None => {
                        let control = Arc::new(Control {
                            model: model.clone(),
                            hint: hint.clone(),
                            strength: settings.strength,
                            range: settings.range,
                            previous: entry.control.clone(),
                            apply_to_uncond: false,
                        });
                        made.push((entry.control.clone(), control.clone()));
                        control
                    }
                };
                CondEntry {
                    control: Some(control),
                    ..entry.clone()
                }
            })
            .collect();
        Conditioning(entries)
    };
    Ok((apply(positive), apply(negative)))
}

/// `ControlNetApply`: every entry of `conditioning` with a control of its own over the whole
/// of sampling, which sampling also gives the negative prompt (strength 0 leaves it as it is).
pub fn apply_simple(
    conditioning: &Conditioning,
    model: &Arc<ControlNetFile>,
    hint: &Arc<ImageBatch>,
    strength: f64,
) -> std::result::Result<Conditioning, ComputeError> {
    if strength == 0.0 {
        return Ok(conditioning.clone());
    }
    check_hint(model, hint)?;
    let entries = conditioning
        .0
        .iter()
        .map(|entry| CondEntry {
            control: Some(Arc::new(Control {
                model: model.clone(),
                hint: hint.clone(),
                strength,
                range: (0.0, 1.0),
                previous: entry.control.clone(),
                apply_to_uncond: true,
            })),
            ..entry.clone()
        })
        .collect();
    Ok(Conditioning(entries))
}

/// ComfyUI's `apply_empty_x_to_equal_area` for controls: when no whole-image entry of
/// `uncond` has a control, the controls of `positive`'s whole-image entries applied with
/// `ControlNetApply` are given, in turn, to `uncond`'s whole-image entries.
pub fn share_with_uncond(positive: &Conditioning, uncond: &mut Conditioning) {
    let whole = |e: &&CondEntry| e.area.is_none() && e.area_fraction.is_none();
    let controls: Vec<Arc<Control>> = positive
        .0
        .iter()
        .filter(whole)
        .filter_map(|e| e.control.clone().filter(|c| c.apply_to_uncond))
        .collect();
    if controls.is_empty() || uncond.0.iter().filter(whole).any(|e| e.control.is_some()) {
        return;
    }
    let others: Vec<usize> = (0..uncond.0.len()).filter(|&i| whole(&&uncond.0[i])).collect();
    if others.is_empty() {
        return;
    }
    for (x, control) in controls.into_iter().enumerate() {
        uncond.0[others[x % others.len()]].control = Some(control);
    }
}

/// What one UNet call gives a control: the scaled input batch, the model's sampling at
/// this step, the call's context and label vector, how many conditioning entries share the
/// batch, and the interruption.
pub struct ControlCall<'a> {
    /// The UNet's input, `calculate_input(sigma, x)`, `[members * b, c, h, w]`.
    pub input: &'a Tensor,
    /// The step's sigma.
    pub sigma: f32,
    /// The model's sampling.
    pub ms: &'a ModelSampling,
    /// The call's context and SDXL vector.
    pub context: (&'a Tensor, Option<&'a Tensor>),
    /// Conditioning entries in the batch (ComfyUI's `batched_number`).
    pub members: usize,
    /// Asked between blocks.
    pub stop: Interrupt<'a>,
}

impl Control {
    /// The residuals of this control and those it was chained to, for one UNet call; `None`
    /// when none of them applies at this step (ComfyUI's `get_control`).
    pub fn residuals(&self, call: &ControlCall<'_>) -> Result<Option<ControlResiduals>> {
        let previous = match &self.previous {
            Some(p) => p.residuals(call)?,
            None => None,
        };
        let (start, end) = (call.ms.percent_to_sigma(self.range.0), call.ms.percent_to_sigma(self.range.1));
        if call.sigma > start || call.sigma < end {
            return Ok(previous);
        }
        let hint = self.hint_tensor(call)?;
        let timestep = f64::from(call.ms.timestep(call.sigma));
        let mut out = self
            .model
            .net
            .forward((call.input, &hint), timestep, call.context, call.stop)?;
        for residual in out.output.iter_mut().chain(out.middle.iter_mut()).flatten() {
            if self.model.global_average_pooling {
                let (_, _, h, w) = residual.dims4()?;
                *residual = residual.mean_keepdim(2)?.mean_keepdim(3)?.repeat((1, 1, h, w))?;
            }
            *residual = (&*residual * self.strength)?;
        }
        if let Some(previous) = previous {
            merge(&mut out.output, previous.output)?;
            merge(&mut out.middle, previous.middle)?;
        }
        Ok(Some(out))
    }

    /// The control image as the network reads it for `call`: resized (nearest-exact, centre
    /// crop) to the latent's size times 8, `[batch, channels, 8h, 8w]`, its batch fitted to
    /// the call's (ComfyUI's `broadcast_image_to`).
    fn hint_tensor(&self, call: &ControlCall<'_>) -> Result<Tensor> {
        let (batch, _, h, w) = call.input.dims4()?;
        let planes = Planes::of_image(&self.hint);
        let keep_going = || !call.stop.requested();
        let resized = upscale_center(&planes, Mode::NearestExact, w * HINT_SCALE, h * HINT_SCALE, &keep_going)
            .map_err(|e| candle_core::Error::Msg(format!("control image: {e}")))?;
        let resized = fit_batch(resized, batch, call.members);
        let (b, c) = (resized.batch, resized.channels);
        Tensor::from_vec(resized.data, (b, h * HINT_SCALE, w * HINT_SCALE, c), call.input.device())?
            .permute((0, 3, 1, 2))?
            .contiguous()
    }
}

/// ComfyUI's `broadcast_image_to`: a single image stays as it is (it broadcasts); otherwise
/// the first `target / members` images (repeated when fewer), once per member.
fn fit_batch(planes: Planes, target: usize, members: usize) -> Planes {
    if planes.batch == 1 || planes.batch == target {
        return planes;
    }
    let per = target / members.max(1);
    let len = planes.height * planes.width * planes.channels;
    let one: Vec<f32> = (0..per)
        .flat_map(|i| &planes.data[(i % planes.batch) * len..][..len])
        .copied()
        .collect();
    let data = if per == target { one } else { one.repeat(members) };
    Planes {
        batch: data.len() / len.max(1),
        data,
        ..planes
    }
}

/// Adds `previous`'s residuals to `out`'s (ComfyUI's `control_merge`: `previous + out`).
fn merge(out: &mut Vec<Option<Tensor>>, previous: Vec<Option<Tensor>>) -> Result<()> {
    for (i, prev) in previous.into_iter().enumerate() {
        if i >= out.len() {
            out.push(prev);
            continue;
        }
        if let Some(prev) = prev {
            out[i] = Some(match out[i].take() {
                None => prev,
                Some(mine) => prev.broadcast_add(&mine)?,
            });
        }
    }
    Ok(())
}

/// Working memory of the controls of `entries` for one UNet call over `batch` latents of
/// `size` cells: each distinct control chain's networks and resized hints.
pub fn working_bytes<'a>(
    entries: impl Iterator<Item = &'a CondEntry>,
    batch: usize,
    size: (usize, usize),
    tokens: usize,
) -> u64 {
    let mut seen: Vec<*const Control> = Vec::new();
    let mut bytes = 0u64;
    for entry in entries {
        let mut next = entry.control.as_deref();
        while let Some(control) = next {
            if !seen.contains(&(control as *const Control)) {
                seen.push(control);
                let hint = (batch * size.0 * size.1 * HINT_SCALE * HINT_SCALE * control.hint.channels as usize) as u64 * 8;
                bytes = bytes.max(control.model.net.working_bytes(batch, size, tokens) + hint);
                bytes += hint;
            }
            next = control.previous.as_deref();
        }
    }
    bytes
}

/// Loads the ControlNet file at `path` (the workflow's `name` for it) onto `device`, for a
/// `CONTROL_NET`; errors name the file by `name`, never by its path.
pub fn load_controlnet(path: &std::path::Path, name: &str, device: &candle_core::Device) -> std::result::Result<ControlNetFile, super::ModelError> {
    crate::models::controlnet::load(path, device).map_err(|e| super::ModelError::from_load(e, path, name))
}
