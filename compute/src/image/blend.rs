//! `ImageBlend` (ComfyUI's `nodes_post_processing.Blend`), in float32 as torch computes it.

use super::resample::{upscale_center, Mode, Planes};
use super::{check_size, ImageBatch};
use crate::ComputeError;

/// `ImageBlend`'s modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlendMode {
    /// The second image.
    Normal,
    /// `a * b`.
    Multiply,
    /// `1 - (1 - a)(1 - b)`.
    Screen,
    /// Multiply or screen, by the first image.
    Overlay,
    /// The W3C soft light, by the second image.
    SoftLight,
    /// `a - b`.
    Difference,
}

/// The soft-light helper `g` of ComfyUI's `Blend.g`.
fn soft_light_g(x: f32) -> f32 {
    if x <= 0.25 {
        ((16.0 * x - 12.0) * x + 4.0) * x
    } else {
        x.sqrt()
    }
}

/// `mode` of one value of each image.
fn blend_value(mode: BlendMode, a: f32, b: f32) -> f32 {
    match mode {
        BlendMode::Normal => b,
        BlendMode::Multiply => a * b,
        BlendMode::Screen => 1.0 - (1.0 - a) * (1.0 - b),
        BlendMode::Overlay if a <= 0.5 => 2.0 * a * b,
        BlendMode::Overlay => 1.0 - 2.0 * (1.0 - a) * (1.0 - b),
        BlendMode::SoftLight if b <= 0.5 => a - (1.0 - 2.0 * b) * a * (1.0 - a),
        BlendMode::SoftLight => a + (2.0 * b - 1.0) * (soft_light_g(a) - a),
        BlendMode::Difference => a - b,
    }
}

/// The batch size of two broadcast batches, as torch's broadcasting allows it.
fn broadcast_batch(a: u32, b: u32) -> Result<u32, ComputeError> {
    match (a, b) {
        (a, b) if a == b => Ok(a),
        (1, b) => Ok(b),
        (a, 1) => Ok(a),
        (a, b) => Err(ComputeError::invalid(format!(
            "cannot blend a batch of {a} images with a batch of {b}"
        ))),
    }
}

/// `ImageBlend`: `image1 * (1 - factor) + mode(image1, image2) * factor`, clamped to 0..=1.
/// `image2` is resized (bicubic, centre crop) to `image1`'s size when it differs; a batch
/// of one image is broadcast against the other batch.
pub fn blend(
    image1: &ImageBatch,
    image2: &ImageBatch,
    factor: f64,
    mode: BlendMode,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    if image1.channels != image2.channels {
        return Err(ComputeError::invalid("cannot blend images of different channel counts"));
    }
    let batch = broadcast_batch(image1.batch, image2.batch)?;
    check_size(image1.width, image1.height, batch, image1.channels)?;
    let second = if (image1.width, image1.height) == (image2.width, image2.height) {
        Planes::of_image(image2)
    } else {
        let (w, h) = (image1.width as usize, image1.height as usize);
        upscale_center(&Planes::of_image(image2), Mode::Bicubic, w, h, keep_going)?
    };
    let keep = (1.0 - factor) as f32;
    let factor = factor as f32;
    let frame = image1.frame_len();
    let mut data = Vec::with_capacity(frame * batch as usize);
    for b in 0..batch as usize {
        let a = &image1.data[(b % image1.batch as usize) * frame..][..frame];
        let s = &second.data[(b % second.batch) * frame..][..frame];
        data.extend(
            a.iter()
                .zip(s)
                .map(|(&a, &s)| (a * keep + blend_value(mode, a, s) * factor).clamp(0.0, 1.0)),
        );
    }
    Ok(ImageBatch { batch, data, ..*image1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, float, text, Fixture};

    #[test]
    fn blend_modes_broadcast_and_resize_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageBlend") {
            let mode = match text(case, "blend_mode") {
                "normal" => BlendMode::Normal,
                "multiply" => BlendMode::Multiply,
                "screen" => BlendMode::Screen,
                "overlay" => BlendMode::Overlay,
                "soft_light" => BlendMode::SoftLight,
                _ => BlendMode::Difference,
            };
            let (a, b) = (f.image(case, "image1"), f.image(case, "image2"));
            let got = blend(&a, &b, float(case, "blend_factor"), mode, &always).unwrap();
            f.check_image(case, 0, &got, 1e-6);
        }
    }

    #[test]
    fn batches_of_different_sizes_above_one_are_refused() {
        let a = crate::image::empty(2, 2, 2, 0).unwrap();
        let b = crate::image::empty(2, 2, 3, 0).unwrap();
        assert!(blend(&a, &b, 0.5, BlendMode::Normal, &always).is_err());
    }
}
