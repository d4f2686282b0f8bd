//! A ControlNet as a conditioning entry carries it (`comfy/controlnet.py`'s `ControlNet`
//! after `set_cond_hint`): a [`Control`], chained to the control the entry had before, whose
//! residuals sampling adds to the UNet's skip connections and middle block for the steps
//! inside its range (`get_control`). The nodes that attach controls are in
//! [`super::controlnet`].

use std::fmt;
use std::sync::Arc;

use candle_core::{Result, Tensor};

use crate::image::resample::{upscale_center, Mode, Planes};
use crate::image::ImageBatch;
use crate::interrupt::Interrupt;
use crate::models::controlnet::ControlNetFile;
use crate::models::ControlResiduals;
use crate::sampling::ModelSampling;

/// Pixels per latent cell the hint is resized to (ComfyUI's `compression_ratio`).
pub(super) const HINT_SCALE: usize = 8;

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
        let (start, end) = (
            call.ms.percent_to_sigma(self.range.0),
            call.ms.percent_to_sigma(self.range.1),
        );
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
        Tensor::from_vec(
            resized.data,
            (b, h * HINT_SCALE, w * HINT_SCALE, c),
            call.input.device(),
        )?
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::controlnet::tests::{reference, write_fixture};
    use crate::models::controlnet::{load, ControlNetKeys};
    use candle_core::Device;

    fn image_of(t: &Tensor) -> crate::image::ImageBatch {
        let (b, c, h, w) = t.dims4().unwrap();
        crate::image::ImageBatch {
            width: w as u32,
            height: h as u32,
            batch: b as u32,
            channels: c as u32,
            data: t
                .permute((0, 2, 3, 1))
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap(),
        }
    }

    /// Two chained controls (hints resized with a centre crop and fitted to the batch,
    /// strengths, a range that leaves the second out at the first step) against ComfyUI's
    /// `ControlNet.get_control`.
    #[test]
    fn chained_controls_match_comfyui_get_control() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = write_fixture(dir.path(), ControlNetKeys::Original);
        let model = Arc::new(load(&path, &Device::Cpu).expect("load"));
        let control = |hint: &str, strength: f64, range: (f64, f64), previous: Option<Arc<Control>>| {
            Arc::new(Control {
                model: model.clone(),
                hint: Arc::new(image_of(&reference(hint))),
                strength,
                range,
                previous,
                apply_to_uncond: false,
            })
        };
        let first = control("first_hint", 0.6, (0.0, 1.0), None);
        let second = control("second_hint", 1.3, (0.3, 0.9), Some(first));
        let ms = crate::sampling::ModelSampling::sd1();
        let (x, context) = (reference("batch_x"), reference("batch_context"));
        for step in ["start", "middle"] {
            let sigma = reference(&format!("{step}.sigma")).to_vec1::<f32>().unwrap()[0];
            let data: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            let input = Tensor::from_vec(ms.calculate_input(sigma, &data), x.dims(), &Device::Cpu).unwrap();
            let call = ControlCall {
                input: &input,
                sigma,
                ms: &ms,
                context: (&context, None),
                members: 2,
                stop: Interrupt::NEVER,
            };
            let got = second.residuals(&call).expect("residuals").expect("a control applies");
            let mut compared: Vec<(String, &Option<Tensor>)> = got
                .output
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("{step}.output.{i}"), t))
                .collect();
            compared.push((format!("{step}.middle.0"), &got.middle[0]));
            for (name, got) in compared {
                let want = reference(&name);
                let got = got.as_ref().expect("a residual");
                let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                let worst = crate::max_abs_diff(got, &want);
                assert!(worst <= 1e-5 * scale, "{name}: {worst} against {scale}");
            }
        }
    }
}
