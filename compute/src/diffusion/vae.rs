//! `VAEDecode`, `VAEEncode` and `VAEEncodeForInpaint` on an [`Autoencoder`], with ComfyUI's
//! cropping to whole latent cells and inpainting's mask handling.

use std::sync::Arc;

use super::autoencoder::Autoencoder;
use super::latent::{plain, PIXELS_PER_CELL};
use crate::image::{ImageBatch, MaskBatch};
use crate::interrupt::Interrupt;
use crate::resize::{resize_planes, Mode};
use crate::sampling::Tensor;
use crate::values::LatentBatch;
use crate::ComputeError;

fn failed(e: anyhow::Error) -> ComputeError {
    ComputeError::Failed(format!("{e:#}"))
}

/// Decodes `latent` into images; `stop` is asked between the decoder's blocks (then
/// [`ComputeError::Interrupted`]).
///
/// The latents are decoded one at a time (each image is independent of the others), so the
/// working memory is one image's whatever the batch ([`crate::models::Sd1Vae::decode_working_bytes`]
/// with a batch of 1).
pub fn decode(vae: &Autoencoder, latent: &LatentBatch, stop: Interrupt<'_>) -> Result<ImageBatch, ComputeError> {
    let [batch, channels, height, width] = latent.shape.map(|d| d as usize);
    let per_latent = channels * height * width;
    let mut images: Option<ImageBatch> = None;
    for index in 0..batch {
        let data = latent.data[index * per_latent..(index + 1) * per_latent].to_vec();
        let t = Tensor::try_new(vec![1, channels, height, width], data).map_err(failed)?;
        let image = vae.decode(&t, stop).map_err(|e| stop.explain("VAE decode", e))?;
        match &mut images {
            None => images = Some(image),
            Some(all) => {
                all.data.extend_from_slice(&image.data);
                all.batch += image.batch;
            }
        }
    }
    images.ok_or_else(|| ComputeError::invalid("VAE decoding needs at least one latent"))
}

/// `pixels` cut to whole latent cells, centred, keeping only RGB.
pub(super) fn crop_to_cells(pixels: &ImageBatch) -> Result<ImageBatch, ComputeError> {
    let (w, h) = (
        pixels.width / PIXELS_PER_CELL * PIXELS_PER_CELL,
        pixels.height / PIXELS_PER_CELL * PIXELS_PER_CELL,
    );
    if w == 0 || h == 0 || pixels.channels < 3 {
        return Err(ComputeError::invalid(format!(
            "VAE encoding needs RGB images of at least {PIXELS_PER_CELL}x{PIXELS_PER_CELL} pixels, got {}x{} with {} channels",
            pixels.width, pixels.height, pixels.channels
        )));
    }
    let (x0, y0) = (
        (pixels.width % PIXELS_PER_CELL) / 2,
        (pixels.height % PIXELS_PER_CELL) / 2,
    );
    let c = pixels.channels as usize;
    let mut data = Vec::with_capacity((pixels.batch * w * h * 3) as usize);
    for b in 0..pixels.batch as usize {
        for y in 0..h as usize {
            for x in 0..w as usize {
                let i = ((b * pixels.height as usize + y0 as usize + y) * pixels.width as usize + x0 as usize + x) * c;
                data.extend_from_slice(&pixels.data[i..i + 3]);
            }
        }
    }
    Ok(ImageBatch {
        width: w,
        height: h,
        batch: pixels.batch,
        channels: 3,
        data,
    })
}

/// Encodes `pixels` one image at a time, as [`decode`] decodes: one image's working memory
/// whatever the batch.
pub(super) fn encode_cropped(
    vae: &Autoencoder,
    pixels: &ImageBatch,
    stop: Interrupt<'_>,
) -> Result<LatentBatch, ComputeError> {
    let per_image = (pixels.width * pixels.height * pixels.channels) as usize;
    let mut shape = [0u32; 4];
    let mut data = Vec::new();
    for index in 0..pixels.batch as usize {
        let one = ImageBatch {
            batch: 1,
            data: pixels.data[index * per_image..(index + 1) * per_image].to_vec(),
            ..*pixels
        };
        let t = vae.encode(&one, stop).map_err(|e| stop.explain("VAE encode", e))?;
        shape = [t.shape[0], t.shape[1], t.shape[2], t.shape[3]].map(|d| d as u32);
        shape[0] = index as u32 + 1;
        data.extend_from_slice(&t.data);
    }
    if data.is_empty() {
        return Err(ComputeError::invalid("VAE encoding needs at least one image"));
    }
    Ok(plain(shape, data))
}

/// `VAEEncode`: `pixels` (cut to whole latent cells) encoded into latents; `stop` is asked
/// between the encoder's blocks (then [`ComputeError::Interrupted`]).
pub fn encode(vae: &Autoencoder, pixels: &ImageBatch, stop: Interrupt<'_>) -> Result<LatentBatch, ComputeError> {
    encode_cropped(vae, &crop_to_cells(pixels)?, stop)
}

/// `VAEEncodeForInpaint`: `pixels` with the masked part set to grey, encoded, with the
/// mask grown by `grow_by` pixels as the latent's noise mask; `stop` as for [`encode`].
pub fn encode_for_inpaint(
    vae: &Autoencoder,
    pixels: &ImageBatch,
    mask: &MaskBatch,
    grow_by: u32,
    stop: Interrupt<'_>,
) -> Result<LatentBatch, ComputeError> {
    let cropped = crop_to_cells(pixels)?;
    let (w, h) = (cropped.width as usize, cropped.height as usize);
    let (cells_mask, planes) = mask_at_cells(pixels, mask)?;
    // torch's `round`: halves to even.
    let rounded: Vec<f32> = cells_mask.iter().map(|v| v.round_ties_even()).collect();
    let grey = grey_masked(cropped, &rounded, planes);
    let mut latent = encode_cropped(vae, &grey, stop)?;
    latent.noise_mask = Some(Arc::new(MaskBatch {
        width: w as u32,
        height: h as u32,
        batch: planes as u32,
        data: grow(&rounded, planes, h, w, grow_by as usize),
    }));
    Ok(latent)
}

/// `mask` resized (bilinear) to `pixels`' size and cut to whole latent cells as
/// [`crop_to_cells`] cuts the image: the values and the number of masks.
pub(super) fn mask_at_cells(pixels: &ImageBatch, mask: &MaskBatch) -> Result<(Vec<f32>, usize), ComputeError> {
    let (pw, ph) = (pixels.width as usize, pixels.height as usize);
    let planes = mask.batch as usize;
    if planes == 0 || mask.width == 0 || mask.height == 0 {
        return Err(ComputeError::invalid("the mask is empty"));
    }
    let full = resize_planes(
        &mask.data,
        mask.height as usize,
        mask.width as usize,
        ph,
        pw,
        Mode::Bilinear,
    );
    let cell = PIXELS_PER_CELL as usize;
    let (w, h) = (pw / cell * cell, ph / cell * cell);
    let (x0, y0) = ((pw % cell) / 2, (ph % cell) / 2);
    let cut = (0..planes)
        .flat_map(|p| {
            let full = &full;
            (0..h).flat_map(move |y| (0..w).map(move |x| full[(p * ph + y0 + y) * pw + x0 + x]))
        })
        .collect();
    Ok((cut, planes))
}

/// `cropped` with the pixels where the rounded mask (`planes` masks, one for all images or
/// one per image) is 1 set to grey: `(v - 0.5) * (1 - mask) + 0.5`, as ComfyUI computes it.
pub(super) fn grey_masked(cropped: ImageBatch, rounded: &[f32], planes: usize) -> ImageBatch {
    let (w, h) = (cropped.width as usize, cropped.height as usize);
    let mut grey = cropped;
    for b in 0..grey.batch as usize {
        let m = &rounded[(b % planes) * w * h..][..w * h];
        for (i, &keep) in m.iter().enumerate() {
            let k = 1.0 - keep;
            for v in &mut grey.data[(b * w * h + i) * 3..][..3] {
                *v = (*v - 0.5) * k + 0.5;
            }
        }
    }
    grey
}

/// ComfyUI's mask growth: a `size` x `size` box sum (padding `ceil((size - 1) / 2)`, output
/// cut to the input's size) clamped to 0..=1, i.e. a dilation of the rounded mask.
fn grow(mask: &[f32], planes: usize, h: usize, w: usize, size: usize) -> Vec<f32> {
    if size == 0 {
        return mask.to_vec();
    }
    let pad = (size - 1).div_ceil(2) as isize;
    let mut out = Vec::with_capacity(mask.len());
    for p in 0..planes {
        let plane = &mask[p * h * w..(p + 1) * h * w];
        for y in 0..h as isize {
            for x in 0..w as isize {
                let mut sum = 0f32;
                for dy in 0..size as isize {
                    for dx in 0..size as isize {
                        let (sy, sx) = (y + dy - pad, x + dx - pad);
                        if sy >= 0 && sx >= 0 && (sy as usize) < h && (sx as usize) < w {
                            sum += plane[sy as usize * w + sx as usize];
                        }
                    }
                }
                out.push(sum.clamp(0.0, 1.0).round());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::loader::tiny_test_models;

    #[test]
    fn growth_dilates_the_mask() {
        let mut m = vec![0.0; 25];
        m[12] = 1.0;
        let grown = grow(&m, 1, 5, 5, 3);
        assert_eq!(grown.iter().sum::<f32>(), 9.0);
        assert_eq!(grow(&m, 1, 5, 5, 0), m);
    }

    #[test]
    fn encoding_crops_and_inpainting_sets_the_noise_mask() {
        let (_dir, m) = tiny_test_models(4).unwrap();
        let m = Autoencoder::Checkpoint(std::sync::Arc::new(m));
        let image = crate::image::empty(20, 17, 1, 0x808080).unwrap();
        let latent = encode(&m, &image, Interrupt::NEVER).unwrap();
        // Cut to 16x16 pixels; the tiny VAE halves them.
        assert_eq!(latent.shape, [1, 4, 8, 8]);
        let mask = MaskBatch {
            width: 20,
            height: 17,
            batch: 1,
            data: vec![1.0; 20 * 17],
        };
        let inpaint = encode_for_inpaint(&m, &image, &mask, 6, Interrupt::NEVER).unwrap();
        let noise_mask = inpaint.noise_mask.expect("a noise mask");
        assert_eq!((noise_mask.width, noise_mask.height), (16, 16));
        assert!(noise_mask.data.iter().all(|&v| v == 1.0));
        let decoded = decode(&m, &latent, Interrupt::NEVER).unwrap();
        assert_eq!((decoded.width, decoded.height), (16, 16));
    }

    #[test]
    fn a_batch_coded_one_image_at_a_time_equals_the_batch_coded_at_once() {
        let (_dir, m) = tiny_test_models(4).unwrap();
        let m = Autoencoder::Checkpoint(std::sync::Arc::new(m));
        let (w, h) = (16usize, 24usize);
        let pixels = ImageBatch {
            width: w as u32,
            height: h as u32,
            batch: 3,
            channels: 3,
            data: (0..3 * w * h * 3).map(|i| ((i * 37) % 101) as f32 / 100.0).collect(),
        };
        let latent = encode(&m, &pixels, Interrupt::NEVER).unwrap();
        assert_eq!(latent.shape[0], 3);
        let at_once = m.encode(&pixels, Interrupt::NEVER).unwrap();
        assert_eq!(latent.data, at_once.data, "encode");
        let decoded = decode(&m, &latent, Interrupt::NEVER).unwrap();
        assert_eq!(decoded.batch, 3);
        let shape = latent.shape.iter().map(|&d| d as usize).collect();
        let tensor = Tensor::try_new(shape, latent.data.clone()).unwrap();
        let at_once = m.decode(&tensor, Interrupt::NEVER).unwrap();
        assert_eq!(decoded.data, at_once.data, "decode");
    }
}
