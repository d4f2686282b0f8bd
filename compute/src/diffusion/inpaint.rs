//! Inpainting models: the extra input an inpainting UNet reads beside the noisy latent (the
//! mask and the masked image's latent, as ComfyUI's `BaseModel.concat_cond` builds its
//! `c_concat`), and `InpaintModelConditioning`, which attaches them to conditioning.

use std::sync::Arc;

use super::autoencoder::Autoencoder;
use super::conditioning::{CondEntry, Conditioning};
use super::model::DiffusionModel;
use super::vae::{crop_to_cells, encode, encode_cropped, grey_masked, mask_at_cells};
use crate::image::resample::{upscale_center, Planes};
use crate::image::{ImageBatch, MaskBatch};
use crate::interrupt::Interrupt;
use crate::resize::{resize_planes, Mode};
use crate::sampling::Tensor;
use crate::values::LatentBatch;
use crate::ComputeError;

/// ComfyUI's latent of an all-black image for SD1/SDXL latents, per channel
/// (`blank_inpaint_image_like`): the masked image an inpainting model reads when there is
/// no mask at all.
const BLANK_LATENT: [f32; 4] = [0.8223, -0.6876, 0.6364, 0.1380];

/// What sampling holds that the extra input falls back on when an entry carries none of
/// its own (ComfyUI's `latent_image` and `denoise_mask` arguments of `concat_cond`).
#[derive(Debug, Clone, Copy)]
pub struct ConcatSource<'a> {
    /// The latent being sampled, as the model reads it (`process_latent_in`), of `shape`.
    pub latent: &'a [f32],
    /// The latent's noise mask at the latent's size, repeated over its channels
    /// (`[batch, channels, height, width]`), if it has one.
    pub denoise_mask: Option<&'a [f32]>,
    /// The sampled latent's `[batch, channels, height, width]`.
    pub shape: [usize; 4],
}

/// The extra input channels `model` reads for `entry` over the whole latent, `[batch, 1 +
/// channels, height, width]`: the mask (rounded), then the masked image's latent. `None`
/// for a model that is not an inpainting model (which ignores the entry's inpainting
/// inputs, as ComfyUI's does).
///
/// As ComfyUI: the entry's `concat_mask`, or else the latent's noise mask; the entry's
/// `concat_latent_image` (processed in), or else the sampled latent. Both are resized to
/// the latent (bilinear, centre-cropped to its aspect ratio) and their batches to the
/// latent's batch. Without any mask, the mask is all ones and the masked image a blank one.
pub fn concat_inputs(
    model: &DiffusionModel,
    entry: &CondEntry,
    source: &ConcatSource<'_>,
) -> Result<Option<Vec<f32>>, ComputeError> {
    if !model.checkpoint.config.inpainting {
        return Ok(None);
    }
    let process_in = |data: &[f32], plane: usize| model.process_latent_in(data, plane);
    build_concat(entry, source, &process_in).map(Some)
}

/// [`concat_inputs`] of an inpainting model whose latent format is `process_in` (latents
/// of `plane` values per channel as the model reads them).
pub(crate) fn build_concat(
    entry: &CondEntry,
    source: &ConcatSource<'_>,
    process_in: &dyn Fn(&[f32], usize) -> Vec<f32>,
) -> Result<Vec<f32>, ComputeError> {
    let [b, c, h, w] = source.shape;
    let plane = h * w;
    let mask = match (&entry.concat_mask, source.denoise_mask) {
        (Some(m), _) => Some(mask_to_latent(m, source.shape)?),
        (None, Some(d)) => {
            // The first channel of each latent's mask, already at the latent's size.
            let first: Vec<f32> = (0..b).flat_map(|i| &d[i * c * plane..][..plane]).copied().collect();
            Some(mask_to_latent(
                &MaskBatch {
                    width: w as u32,
                    height: h as u32,
                    batch: b as u32,
                    data: first,
                },
                source.shape,
            )?)
        }
        (None, None) => None,
    };
    let Some(mask) = mask else {
        let blank = (0..b).flat_map(|_| {
            std::iter::repeat_n(1.0, plane).chain((0..c).flat_map(|ch| std::iter::repeat_n(blank_value(ch), plane)))
        });
        return Ok(blank.collect());
    };
    let image = match &entry.concat_latent_image {
        Some(t) => latent_to_noise_shape(process_in, t, source.shape)?,
        None => source.latent.to_vec(),
    };
    let per = c * plane;
    Ok((0..b)
        .flat_map(|i| mask[i * plane..][..plane].iter().chain(&image[i * per..][..per]))
        .copied()
        .collect())
}

/// `blank_inpaint_image_like`'s value for channel `ch` (1 beyond the four it knows).
fn blank_value(ch: usize) -> f32 {
    BLANK_LATENT.get(ch).copied().unwrap_or(1.0)
}

/// `mask` as `concat_cond` uses it: at the latent's size (bilinear, centre crop) when its
/// size differs, rounded half to even, its batch resized to the latent's
/// ([`resize_to_batch_size`]): `[batch, height, width]`.
fn mask_to_latent(mask: &MaskBatch, [b, _, h, w]: [usize; 4]) -> Result<Vec<f32>, ComputeError> {
    let planes = Planes {
        batch: mask.batch as usize,
        height: mask.height as usize,
        width: mask.width as usize,
        channels: 1,
        data: mask.data.clone(),
    };
    if planes.batch == 0 || planes.data.len() != planes.batch * planes.height * planes.width {
        return Err(ComputeError::invalid("an inpainting mask is empty or malformed"));
    }
    let resized = match (planes.height, planes.width) == (h, w) {
        true => planes,
        false => upscale_center(&planes, Mode::Bilinear, w, h, &|| true)?,
    };
    let rounded: Vec<f32> = resized.data.iter().map(|v| v.round_ties_even()).collect();
    Ok(resize_to_batch_size(&rounded, resized.batch, b))
}

/// The conditioning's masked-image latent as `concat_cond` uses it: processed in, at the
/// latent's size (bilinear, centre crop) when its size differs, its batch resized to the
/// latent's.
fn latent_to_noise_shape(
    process_in: &dyn Fn(&[f32], usize) -> Vec<f32>,
    t: &Tensor,
    [b, c, h, w]: [usize; 4],
) -> Result<Vec<f32>, ComputeError> {
    let [tb, tc, th, tw] = match t.shape.as_slice() {
        &[tb, tc, th, tw] if tb > 0 && th > 0 && tw > 0 => [tb, tc, th, tw],
        other => {
            return Err(ComputeError::invalid(format!(
                "an inpainting image latent of shape {other:?}"
            )))
        }
    };
    if tc != c {
        return Err(ComputeError::invalid(format!(
            "the inpainting image latent has {tc} channels; the model samples latents of {c}"
        )));
    }
    if t.data.len() != tb * tc * th * tw {
        return Err(ComputeError::invalid("an inpainting image latent is malformed"));
    }
    let processed = process_in(&t.data, th * tw);
    let planes = Planes {
        batch: tb * tc,
        height: th,
        width: tw,
        channels: 1,
        data: processed,
    };
    let resized = match (th, tw) == (h, w) {
        true => planes,
        false => upscale_center(&planes, Mode::Bilinear, w, h, &|| true)?,
    };
    Ok(resize_to_batch_size(&resized.data, tb, b))
}

/// ComfyUI's `resize_to_batch_size` of the `count` equal items of `data` to `batch`: a
/// larger batch repeats items in order (`floor((i + 0.5) * count / batch)`), a smaller one
/// picks them evenly spread (`round(i * (count - 1) / (batch - 1))`, halves to even).
pub fn resize_to_batch_size(data: &[f32], count: usize, batch: usize) -> Vec<f32> {
    if count == batch || count == 0 {
        return data.to_vec();
    }
    let per = data.len() / count;
    let pick = |i: usize| -> usize {
        if batch <= 1 {
            return i;
        }
        let index = if batch < count {
            let scale = (count - 1) as f64 / (batch - 1) as f64;
            (i as f64 * scale).round_ties_even() as usize
        } else {
            let scale = count as f64 / batch as f64;
            ((i as f64 + 0.5) * scale).floor() as usize
        };
        index.min(count - 1)
    };
    (0..batch)
        .flat_map(|i| &data[pick(i) * per..][..per])
        .copied()
        .collect()
}

/// What `InpaintModelConditioning` returns.
#[derive(Debug, Clone)]
pub struct InpaintConditioning {
    /// The positive conditioning with the inpainting inputs attached.
    pub positive: Conditioning,
    /// The negative conditioning with the same inputs.
    pub negative: Conditioning,
    /// The whole image encoded, with the mask as its noise mask when asked.
    pub latent: LatentBatch,
}

/// `InpaintModelConditioning`: `mask` resized (bilinear) to `pixels`, both cut to whole
/// latent cells; the masked pixels set to grey and encoded as the conditionings'
/// `concat_latent_image`, the mask their `concat_mask`; the latent is `pixels` encoded,
/// with the mask as its noise mask when `noise_mask`. `stop` is asked inside the encoder.
pub fn inpaint_model_conditioning(
    vae: &Autoencoder,
    (positive, negative): (&Conditioning, &Conditioning),
    pixels: &ImageBatch,
    mask: &MaskBatch,
    noise_mask: bool,
    stop: Interrupt<'_>,
) -> Result<InpaintConditioning, ComputeError> {
    let (grey, cells) = prepare_inpaint_pixels(pixels, mask)?;
    let concat = encode_cropped(vae, &grey, stop)?;
    let mut latent = encode(vae, pixels, stop)?;
    let cells = Arc::new(cells);
    if noise_mask {
        latent.noise_mask = Some(cells.clone());
    }
    let image = Arc::new(Tensor::new(concat.shape.map(|d| d as usize).to_vec(), concat.data));
    let attach = |c: &Conditioning| {
        Conditioning(
            c.0.iter()
                .map(|e| CondEntry {
                    concat_latent_image: Some(image.clone()),
                    concat_mask: Some(cells.clone()),
                    ..e.clone()
                })
                .collect(),
        )
    };
    Ok(InpaintConditioning {
        positive: attach(positive),
        negative: attach(negative),
        latent,
    })
}

/// `InpaintModelConditioning`'s pixel work: `pixels` cut to whole latent cells with the
/// pixels under the (rounded) mask set to grey, and the mask resized to `pixels` and cut
/// the same way (not rounded), which the node attaches and sets as the noise mask.
pub fn prepare_inpaint_pixels(pixels: &ImageBatch, mask: &MaskBatch) -> Result<(ImageBatch, MaskBatch), ComputeError> {
    let cropped = crop_to_cells(pixels)?;
    let (cells_mask, planes) = mask_at_cells(pixels, mask)?;
    if planes != 1 && planes != cropped.batch as usize {
        return Err(ComputeError::invalid(format!(
            "{planes} masks cannot mask {} images: give one mask, or one per image",
            cropped.batch
        )));
    }
    // torch's `round`: halves to even.
    let rounded: Vec<f32> = cells_mask.iter().map(|v| v.round_ties_even()).collect();
    let grey = grey_masked(cropped, &rounded, planes);
    let cells = MaskBatch {
        width: grey.width,
        height: grey.height,
        batch: planes as u32,
        data: cells_mask,
    };
    Ok((grey, cells))
}

/// The latent's noise mask resized (bilinear) to its cells and repeated over its channels
/// and batch, if it has one (ComfyUI's `prepare_mask`): the mask sampling blends with and
/// [`concat_inputs`] falls back on.
pub(super) fn noise_mask(latent: &LatentBatch, shape: &[usize]) -> Option<Vec<f32>> {
    let m = latent.noise_mask.as_ref()?;
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
    Some(
        (0..shape[0])
            .flat_map(|b| {
                let mine = &planes[(b % count) * plane..(b % count + 1) * plane];
                std::iter::repeat_n(mine, shape[1]).flatten().copied()
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
