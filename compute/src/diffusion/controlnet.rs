//! ComfyUI's ControlNet nodes on conditioning: `ControlNetApplyAdvanced` and
//! `ControlNetApply` attach a [`Control`] to every entry (chained to the control it had),
//! sampling gives `ControlNetApply`'s controls to a negative prompt without any
//! (`process_conds`), and a ControlNet file loads for a `CONTROL_NET`.

use std::sync::Arc;

use super::conditioning::{CondEntry, Conditioning};
use super::control::{same_control, Control, HINT_SCALE};
use crate::image::ImageBatch;
use crate::models::controlnet::ControlNetFile;
use crate::ComputeError;

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
        let entries =
            c.0.iter()
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
                let hint =
                    (batch * size.0 * size.1 * HINT_SCALE * HINT_SCALE * control.hint.channels as usize) as u64 * 8;
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
pub fn load_controlnet(
    path: &std::path::Path,
    name: &str,
    device: &candle_core::Device,
) -> std::result::Result<ControlNetFile, super::ModelError> {
    crate::models::controlnet::load(path, device).map_err(|e| super::ModelError::from_load(e, path, name))
}
