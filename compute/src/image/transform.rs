//! Rearranging pixels and batches, as ComfyUI's `ImageCrop`, `ImageFlip`, `ImageRotate`,
//! `ImageFromBatch`, `RepeatImageBatch` and `ImageBatch`.

use super::resample::{upscale_center, Mode, Planes};
use super::{check_size, ImageBatch};
use crate::ComputeError;

/// The size `ImageCrop` makes of a `width` x `height` image for a crop of `w` x `h` at
/// `x`, `y`: `(x, y, w, h)` with the corner clamped inside the image and the size cut at
/// its edges.
pub fn crop_area(width: u32, height: u32, (x, y, w, h): (u32, u32, u32, u32)) -> (u32, u32, u32, u32) {
    let x = x.min(width.saturating_sub(1));
    let y = y.min(height.saturating_sub(1));
    (x, y, w.min(width - x), h.min(height - y))
}

/// `ImageCrop`: the `w` x `h` rectangle at `x`, `y` of every image, clamped as
/// [`crop_area`] says.
pub fn crop(image: &ImageBatch, area: (u32, u32, u32, u32)) -> ImageBatch {
    let (x, y, w, h) = crop_area(image.width, image.height, area);
    Planes::of_image(image)
        .window(x as usize, y as usize, w as usize, h as usize)
        .into_image()
}

/// `ImageFlip`: top to bottom when `vertical` (ComfyUI's `x-axis`), else left to right.
pub fn flip(image: &ImageBatch, vertical: bool) -> ImageBatch {
    let (w, h, c) = (image.width as usize, image.height as usize, image.channels as usize);
    let mut data = Vec::with_capacity(image.data.len());
    for frame in image.data.chunks_exact(w * h * c) {
        for y in 0..h {
            let line = if vertical { h - 1 - y } else { y };
            let row = &frame[line * w * c..][..w * c];
            if vertical {
                data.extend_from_slice(row);
            } else {
                row.chunks_exact(c).rev().for_each(|p| data.extend_from_slice(p));
            }
        }
    }
    ImageBatch { data, ..*image }
}

/// `ImageRotate`: every image turned clockwise by `quarter_turns` x 90 degrees (torch's
/// `rot90(k, dims=[2, 1])`).
pub fn rotate(image: &ImageBatch, quarter_turns: u8) -> ImageBatch {
    let (w, h, c) = (image.width as usize, image.height as usize, image.channels as usize);
    let turns = quarter_turns % 4;
    if turns == 2 {
        return flip(&flip(image, true), false);
    }
    if turns == 0 {
        return image.clone();
    }
    // A quarter turn swaps the sides: output (row i, column j) of an H-wide, W-high image.
    let mut data = Vec::with_capacity(image.data.len());
    for frame in image.data.chunks_exact(w * h * c) {
        for i in 0..w {
            for j in 0..h {
                let (row, col) = if turns == 1 { (h - 1 - j, i) } else { (j, w - 1 - i) };
                data.extend_from_slice(&frame[(row * w + col) * c..][..c]);
            }
        }
    }
    ImageBatch {
        width: image.height,
        height: image.width,
        data,
        ..*image
    }
}

/// The `(start, length)` `ImageFromBatch` takes from a batch of `batch`: `start` clamped
/// to the last image, `length` to the images left.
pub fn select_range(batch: u32, start: u32, length: u32) -> (u32, u32) {
    let start = start.min(batch - 1);
    (start, length.min(batch - start))
}

/// `ImageFromBatch`: images `start..start + length` of the batch, clamped as
/// [`select_range`] says.
pub fn select(image: &ImageBatch, start: u32, length: u32) -> ImageBatch {
    let (start, length) = select_range(image.batch, start, length);
    let frame = image.frame_len();
    ImageBatch {
        batch: length,
        data: image.data[start as usize * frame..(start + length) as usize * frame].to_vec(),
        ..*image
    }
}

/// `RepeatImageBatch`: the whole batch, `amount` times over.
pub fn repeat(image: &ImageBatch, amount: u32) -> Result<ImageBatch, ComputeError> {
    let batch = image
        .batch
        .checked_mul(amount)
        .ok_or_else(|| ComputeError::TooLarge("the repeated batch is too large".into()))?;
    check_size(image.width, image.height, batch, image.channels)?;
    Ok(ImageBatch {
        batch,
        data: image.data.repeat(amount as usize),
        ..*image
    })
}

/// `ImageBatch`: the images of `first`, then those of `second`, which is first resized
/// (bilinear, centre crop) to `first`'s size when its size differs.
pub fn concat(
    first: &ImageBatch,
    second: &ImageBatch,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    if first.channels != second.channels {
        return Err(ComputeError::invalid(format!(
            "cannot batch images of {} and {} channels",
            first.channels, second.channels
        )));
    }
    check_size(first.width, first.height, first.batch + second.batch, first.channels)?;
    let mut data = Vec::with_capacity(first.data.len() + second.frame_len() * second.batch as usize);
    data.extend_from_slice(&first.data);
    if (first.width, first.height) == (second.width, second.height) {
        data.extend_from_slice(&second.data);
    } else {
        let (w, h) = (first.width as usize, first.height as usize);
        let resized = upscale_center(&Planes::of_image(second), Mode::Bilinear, w, h, keep_going)?;
        data.extend_from_slice(&resized.data);
    }
    Ok(ImageBatch {
        batch: first.batch + second.batch,
        data,
        ..*first
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, text, uint, Fixture};

    /// Float copies only: these must match ComfyUI to the bit.
    const EXACT: f32 = 0.0;

    #[test]
    fn crop_clamps_the_corner_and_cuts_at_the_edges_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageCrop") {
            let area = (
                uint(case, "x"),
                uint(case, "y"),
                uint(case, "width"),
                uint(case, "height"),
            );
            f.check_image(case, 0, &crop(&f.image(case, "image"), area), EXACT);
        }
    }

    #[test]
    fn flip_and_rotate_rearrange_pixels_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageFlip") {
            let vertical = text(case, "flip_method").starts_with('x');
            f.check_image(case, 0, &flip(&f.image(case, "image"), vertical), EXACT);
        }
        for case in f.cases("ImageRotate") {
            let turns = ["none", "90 degrees", "180 degrees", "270 degrees"]
                .iter()
                .position(|r| *r == text(case, "rotation"))
                .unwrap();
            f.check_image(case, 0, &rotate(&f.image(case, "image"), turns as u8), EXACT);
        }
    }

    #[test]
    fn from_batch_and_repeat_clamp_and_tile_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageFromBatch") {
            let got = select(&f.image(case, "image"), uint(case, "batch_index"), uint(case, "length"));
            f.check_image(case, 0, &got, EXACT);
        }
        for case in f.cases("RepeatImageBatch") {
            let got = repeat(&f.image(case, "image"), uint(case, "amount")).unwrap();
            f.check_image(case, 0, &got, EXACT);
        }
    }

    #[test]
    fn batch_resizes_the_second_bilinear_centre_cropped_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageBatch") {
            let got = concat(&f.image(case, "image1"), &f.image(case, "image2"), &always).unwrap();
            f.check_image(case, 0, &got, 1e-6);
        }
    }
}
