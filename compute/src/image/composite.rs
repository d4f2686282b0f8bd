//! `ImageCompositeMasked`, `ImagePadForOutpaint` and `MaskToImage`, as ComfyUI computes
//! them (`nodes_mask.composite`, `nodes.ImagePadForOutpaint`).

use super::resample::{interpolate, repeat_to_batch, Mode, Planes};
use super::{check_size, ImageBatch, MaskBatch};
use crate::ComputeError;

/// The planes of a mask batch (one channel).
fn mask_planes(mask: &MaskBatch) -> Planes {
    Planes {
        batch: mask.batch as usize,
        height: mask.height as usize,
        width: mask.width as usize,
        channels: 1,
        data: mask.data.clone(),
    }
}

/// `node_helpers.image_alpha_fix`: the source cut to the destination's channels, or the
/// destination given an opaque alpha channel when the source has one more.
fn alpha_fix(destination: &mut Planes, source: &mut Planes) {
    if destination.channels < source.channels {
        let (keep, from) = (destination.channels, source.channels);
        source.data = source
            .data
            .chunks_exact(from)
            .flat_map(|p| &p[..keep])
            .copied()
            .collect();
        source.channels = keep;
    } else if destination.channels > source.channels {
        let c = destination.channels;
        destination.data = destination
            .data
            .chunks_exact(c)
            .flat_map(|p| p.iter().copied().chain([1.0]))
            .collect();
        destination.channels = c + 1;
    }
}

/// `ImageCompositeMasked`: `source` pasted onto `destination` with its top-left corner at
/// `x`, `y`, weighed by `mask` (bilinear-resized to the source, repeated over the batch; 1
/// everywhere without one). With `resize_source` the source is first resized (bilinear) to
/// the destination's size. The source is repeated or cut to the destination's batch.
pub fn composite(
    destination: &ImageBatch,
    source: &ImageBatch,
    (x, y): (u32, u32),
    resize_source: bool,
    mask: Option<&MaskBatch>,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    let (mut out, mut source) = (Planes::of_image(destination), Planes::of_image(source));
    alpha_fix(&mut out, &mut source);
    if source.channels != out.channels {
        return Err(ComputeError::invalid(
            "the source has too few channels for the destination",
        ));
    }
    if resize_source {
        source = interpolate(&source, Mode::Bilinear, out.width, out.height, keep_going)?;
    }
    let source = repeat_to_batch(&source, out.batch);
    let mask = match mask {
        Some(mask) => {
            let resized = interpolate(
                &mask_planes(mask),
                Mode::Bilinear,
                source.width,
                source.height,
                keep_going,
            )?;
            Some(repeat_to_batch(&resized, source.batch))
        }
        None => None,
    };
    let (left, top) = ((x as usize).min(out.width), (y as usize).min(out.height));
    let visible_w = source.width.min(out.width - left);
    let visible_h = source.height.min(out.height - top);
    let c = out.channels;
    for b in 0..out.batch {
        if !keep_going() {
            return Err(ComputeError::Interrupted);
        }
        for row in 0..visible_h {
            for col in 0..visible_w {
                let m = mask
                    .as_ref()
                    .map_or(1.0, |m| m.data[(b * m.height + row) * m.width + col]);
                let s = &source.data[((b * source.height + row) * source.width + col) * c..][..c];
                let at = ((b * out.height + top + row) * out.width + left + col) * c;
                for (d, s) in out.data[at..at + c].iter_mut().zip(s) {
                    *d = m * s + (1.0 - m) * *d;
                }
            }
        }
    }
    Ok(out.into_image())
}

/// `ImagePadForOutpaint`'s mask inside the original image: 0, rising as `v * v` with
/// `v = (feathering - d) / feathering` within `feathering` pixels of a padded edge
/// (`d` the distance to the nearest padded edge). `edges` says which sides are padded
/// (left, top, right, bottom); the ramp applies only when `feathering * 2` is less than
/// both sides. `keep_going` is asked once per row.
pub fn outpaint_ramp(
    (width, height): (usize, usize),
    edges: [bool; 4],
    feathering: usize,
    keep_going: &dyn Fn() -> bool,
) -> Result<Vec<f32>, ComputeError> {
    let mut inner = vec![0f32; width * height];
    if feathering == 0 || feathering * 2 >= height || feathering * 2 >= width {
        return Ok(inner);
    }
    let [left, top, right, bottom] = edges;
    for i in 0..height {
        if !keep_going() {
            return Err(ComputeError::Interrupted);
        }
        for j in 0..width {
            let dt = if top { i } else { height };
            let db = if bottom { height - i } else { height };
            let dl = if left { j } else { width };
            let dr = if right { width - j } else { width };
            let d = dt.min(db).min(dl).min(dr);
            if d < feathering {
                let v = (feathering - d) as f64 / feathering as f64;
                inner[i * width + j] = (v * v) as f32;
            }
        }
    }
    Ok(inner)
}

/// `ImagePadForOutpaint`: every image grown by `[left, top, right, bottom]` pixels of grey
/// (0.5), and one mask of the padded size: 1 on the margins, [`outpaint_ramp`] inside.
pub fn pad_for_outpaint(
    image: &ImageBatch,
    [left, top, right, bottom]: [u32; 4],
    feathering: u32,
    keep_going: &dyn Fn() -> bool,
) -> Result<(ImageBatch, MaskBatch), ComputeError> {
    let too_large = || ComputeError::TooLarge("the padded image is too large".into());
    let width = image
        .width
        .checked_add(left)
        .and_then(|w| w.checked_add(right))
        .ok_or_else(too_large)?;
    let height = image
        .height
        .checked_add(top)
        .and_then(|h| h.checked_add(bottom))
        .ok_or_else(too_large)?;
    check_size(width, height, image.batch, image.channels)?;
    let (w, h, c) = (image.width as usize, image.height as usize, image.channels as usize);
    let (pw, ph) = (width as usize, height as usize);
    let mut data = vec![0.5f32; pw * ph * c * image.batch as usize];
    for (b, frame) in image.data.chunks_exact(w * h * c).enumerate() {
        for (row, line) in frame.chunks_exact(w * c).enumerate() {
            let at = ((b * ph + top as usize + row) * pw + left as usize) * c;
            data[at..at + w * c].copy_from_slice(line);
        }
    }
    let mut mask = vec![1f32; pw * ph];
    let edges = [left > 0, top > 0, right > 0, bottom > 0];
    let ramp = outpaint_ramp((w, h), edges, feathering as usize, keep_going)?;
    for (row, line) in ramp.chunks_exact(w).enumerate() {
        let at = (top as usize + row) * pw + left as usize;
        mask[at..at + w].copy_from_slice(line);
    }
    let padded = ImageBatch {
        width,
        height,
        data,
        ..*image
    };
    let mask = MaskBatch {
        width,
        height,
        batch: 1,
        data: mask,
    };
    Ok((padded, mask))
}

/// `MaskToImage`: each mask as an RGB image with the mask's value in every channel.
pub fn from_mask(mask: &MaskBatch) -> ImageBatch {
    ImageBatch {
        width: mask.width,
        height: mask.height,
        batch: mask.batch,
        channels: 3,
        data: mask.data.iter().flat_map(|&v| [v, v, v]).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, uint, Fixture};

    #[test]
    fn composite_masked_resizes_repeats_and_clips_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageCompositeMasked") {
            let mask = case.inputs.get("mask").map(|_| f.mask(case, "mask"));
            let got = composite(
                &f.image(case, "destination"),
                &f.image(case, "source"),
                (uint(case, "x"), uint(case, "y")),
                case.inputs["resize_source"].as_bool().unwrap(),
                mask.as_ref(),
                &always,
            )
            .unwrap();
            f.check_image(case, 0, &got, 1e-6);
        }
    }

    #[test]
    fn pad_for_outpaint_pads_grey_and_feathers_the_mask_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImagePadForOutpaint") {
            let margins = ["left", "top", "right", "bottom"].map(|side| uint(case, side));
            let (image, mask) =
                pad_for_outpaint(&f.image(case, "image"), margins, uint(case, "feathering"), &always).unwrap();
            f.check_image(case, 0, &image, 0.0);
            f.check_mask(case, 1, &mask, 0.0);
        }
    }

    #[test]
    fn mask_to_image_repeats_the_mask_in_each_channel_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("MaskToImage") {
            f.check_image(case, 0, &from_mask(&f.mask(case, "mask")), 0.0);
        }
    }
}
