//! `JoinImageWithAlpha` and `SplitImageWithAlpha` (ComfyUI's `nodes_compositing`): an
//! RGBA image's alpha channel to and from a mask, where a mask is 1 where transparent.

use super::resample::{interpolate, Mode, Planes};
use super::{check_size, ImageBatch, MaskBatch};
use crate::ComputeError;

/// `JoinImageWithAlpha`: the RGB of each image with `1 - alpha` as a fourth channel, the
/// mask first resized (bilinear) to the image's size; as many images as the shorter batch.
pub fn join(image: &ImageBatch, alpha: &MaskBatch, keep_going: &dyn Fn() -> bool) -> Result<ImageBatch, ComputeError> {
    if image.channels < 3 {
        return Err(ComputeError::invalid("JoinImageWithAlpha needs an RGB image"));
    }
    let batch = image.batch.min(alpha.batch);
    check_size(image.width, image.height, batch, 4)?;
    let planes = Planes {
        batch: batch as usize,
        height: alpha.height as usize,
        width: alpha.width as usize,
        channels: 1,
        data: alpha.data[..(alpha.width * alpha.height * batch) as usize].to_vec(),
    };
    let (w, h) = (image.width as usize, image.height as usize);
    let resized = interpolate(&planes, Mode::Bilinear, w, h, keep_going)?;
    let c = image.channels as usize;
    let pixels = w * h * batch as usize;
    let mut data = Vec::with_capacity(pixels * 4);
    for (p, a) in image.data.chunks_exact(c).take(pixels).zip(&resized.data) {
        data.extend_from_slice(&p[..3]);
        data.push(1.0 - a);
    }
    Ok(ImageBatch {
        batch,
        channels: 4,
        data,
        ..*image
    })
}

/// `SplitImageWithAlpha`: the RGB of each image, and a mask of `1 - alpha` (0 everywhere
/// for an image without alpha).
pub fn split(image: &ImageBatch) -> Result<(ImageBatch, MaskBatch), ComputeError> {
    if image.channels < 3 {
        return Err(ComputeError::invalid("SplitImageWithAlpha needs an RGB image"));
    }
    let c = image.channels as usize;
    let mut rgb = Vec::with_capacity(image.data.len() / c * 3);
    let mut mask = Vec::with_capacity(image.data.len() / c);
    for p in image.data.chunks_exact(c) {
        rgb.extend_from_slice(&p[..3]);
        mask.push(if c > 3 { 1.0 - p[3] } else { 0.0 });
    }
    let rgb = ImageBatch {
        channels: 3,
        data: rgb,
        ..*image
    };
    let mask = MaskBatch {
        width: image.width,
        height: image.height,
        batch: image.batch,
        data: mask,
    };
    Ok((rgb, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, Fixture};

    #[test]
    fn join_resizes_the_mask_and_takes_the_shorter_batch_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("JoinImageWithAlpha") {
            let got = join(&f.image(case, "image"), &f.mask(case, "alpha"), &always).unwrap();
            f.check_image(case, 0, &got, 1e-6);
        }
    }

    #[test]
    fn split_gives_rgb_and_the_inverted_alpha_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("SplitImageWithAlpha") {
            let (rgb, mask) = split(&f.image(case, "image")).unwrap();
            f.check_image(case, 0, &rgb, 0.0);
            f.check_mask(case, 1, &mask, 0.0);
        }
    }
}
