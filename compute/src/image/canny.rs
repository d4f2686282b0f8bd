//! `Canny` (ComfyUI's `nodes_canny`): kornia's `canny` with its defaults (a 5x5 gaussian
//! of sigma 1, the unnormalised Sobel gradient, `eps` 1e-6, hysteresis), every float
//! operation in float32 and in kornia's order, so that the edges are the same pixels.
//!
//! Per image: grey (`0.299 r + 0.587 g + 0.114 b`), blurred along rows then columns
//! (reflected edges), differentiated (replicated edges), thinned by non-maximum
//! suppression along the gradient's direction rounded to 45 degrees, split by the two
//! thresholds into weak and strong pixels, and a weak pixel kept when a chain of weak
//! pixels joins it to a strong one through any of their 8 neighbours. kornia finds that
//! chain by growing the strong pixels one neighbour at a time until nothing changes; a
//! flood fill from the strong pixels reaches the same fixed point in one pass.

use super::{check_size, ImageBatch, Work};
use crate::ComputeError;

/// kornia's float32 gaussian taps for a window of 5 and sigma 1 (`get_gaussian_kernel1d`).
const GAUSSIAN: [f32; 5] = [
    f32::from_bits(1_029_648_264),
    f32::from_bits(1_048_186_860),
    f32::from_bits(1_053_697_076),
    f32::from_bits(1_048_186_860),
    f32::from_bits(1_029_648_264),
];

/// `4 / pi`, the float32 the angle is multiplied by to count eighths of a turn.
const FOUR_OVER_PI: f32 = (4.0 / std::f64::consts::PI) as f32;

/// kornia's `eps` under the square root of the magnitude, as the float32 it is added as.
const EPS: f32 = 1e-6;

/// The neighbours non-maximum suppression compares with, by direction index (kornia's
/// `_WINDOW_OFFSETS`): `(dy, dx)`, from the right neighbour clockwise.
const NEIGHBOURS: [(isize, isize); 8] = [(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)];

/// Bytes [`canny`] holds at its peak besides its source: the result, and per image the
/// grey and blurred planes, the two gradients, the padded magnitude, the edge classes and
/// the flood fill's queue (at most one entry per pixel).
pub fn canny_peak_bytes(image: &ImageBatch) -> u64 {
    let pixels = u64::from(image.width) * u64::from(image.height);
    let padded = (u64::from(image.width) + 2) * (u64::from(image.height) + 2);
    let result = pixels * u64::from(image.batch) * 3 * 4;
    let working = pixels * 4 * 4 + padded * 4 + pixels + pixels * 8;
    result + working
}

/// `Canny`: each image's edges as white on black, an RGB image of the same size. `low`
/// and `high` are the thresholds on the gradient magnitude (compared as float32, strictly
/// above); `low` must be positive and at most `high`. Images must be RGB and at least 3
/// pixels on each side (kornia's reflected blur). `keep_going` is asked before each image
/// and every few million pixel operations inside one; when it says no the result is
/// [`ComputeError::Interrupted`].
pub fn canny(
    image: &ImageBatch,
    low: f64,
    high: f64,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    if image.channels != 3 {
        return Err(ComputeError::invalid(format!(
            "Canny needs RGB images, got {} channels",
            image.channels
        )));
    }
    if !(low > 0.0 && low <= high) {
        return Err(ComputeError::invalid(format!(
            "Canny needs 0 < low_threshold <= high_threshold, got {low} and {high}"
        )));
    }
    let (w, h) = (image.width as usize, image.height as usize);
    if w < 3 || h < 3 {
        return Err(ComputeError::invalid(format!(
            "Canny needs images of at least 3x3 pixels, got {w}x{h}"
        )));
    }
    check_size(image.width, image.height, image.batch, 3)?;
    let thresholds = (low as f32, high as f32);
    let mut data = Vec::with_capacity(image.data.len());
    for frame in image.data.chunks_exact(image.frame_len()) {
        if !keep_going() {
            return Err(ComputeError::Interrupted);
        }
        let edges = frame_edges(frame, (w, h), thresholds, keep_going)?;
        for strong in edges {
            let v = if strong { 1.0 } else { 0.0 };
            data.extend_from_slice(&[v, v, v]);
        }
    }
    Ok(ImageBatch { data, ..*image })
}

/// The edge map of one RGB image: true where kornia's edges are 1.
fn frame_edges(
    frame: &[f32],
    size: (usize, usize),
    thresholds: (f32, f32),
    keep_going: &dyn Fn() -> bool,
) -> Result<Vec<bool>, ComputeError> {
    let mut work = Work::new(keep_going);
    let grey = greyscale(frame, size, &mut work)?;
    let blurred = blur(&grey, size, &mut work)?;
    drop(grey);
    let (gx, gy) = sobel(&blurred, size, &mut work)?;
    drop(blurred);
    let classes = suppress_and_classify(&gx, &gy, size, thresholds, &mut work)?;
    drop((gx, gy));
    hysteresis(classes, size, &mut work)
}

/// kornia's `rgb_to_grayscale`: `r * 0.299`, then `+ g * 0.587`, then `+ b * 0.114`.
fn greyscale(frame: &[f32], (w, _): (usize, usize), work: &mut Work<'_>) -> Result<Vec<f32>, ComputeError> {
    let (wr, wg, wb) = (0.299f32, 0.587f32, 0.114f32);
    let mut grey = Vec::with_capacity(frame.len() / 3);
    for row in frame.chunks_exact(w * 3) {
        grey.extend(row.chunks_exact(3).map(|p| {
            let out = p[0] * wr;
            let out = out + p[1] * wg;
            out + p[2] * wb
        }));
        work.step(w as u64)?;
    }
    Ok(grey)
}

/// Index `i` (at most 2 outside `0..n`, `n >= 3`) reflected into it, as torch's reflect pad.
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    let r = if i < 0 {
        -i
    } else if i >= n {
        2 * (n - 1) - i
    } else {
        i
    };
    r as usize
}

/// The 5-tap gaussian along rows, then along columns, edges reflected; each output the
/// first tap's product plus the others' in order. kornia blurs a small batch with
/// `conv2d` and a large one (from 2^17 pixels, 2^16 per image) with weighted slices; both
/// sum the taps in this order (the fixture has a case of each).
fn blur(plane: &[f32], (w, h): (usize, usize), work: &mut Work<'_>) -> Result<Vec<f32>, ComputeError> {
    let mut rows = vec![0f32; w * h];
    for y in 0..h {
        let line = &plane[y * w..(y + 1) * w];
        for x in 0..w {
            let tap = |t: usize| line[reflect(x as isize + t as isize - 2, w)];
            let mut sum = tap(0) * GAUSSIAN[0];
            for (t, k) in GAUSSIAN.iter().enumerate().skip(1) {
                sum += tap(t) * k;
            }
            rows[y * w + x] = sum;
        }
        work.step(w as u64 * 5)?;
    }
    let mut out = vec![0f32; w * h];
    for y in 0..h {
        for x in 0..w {
            let tap = |t: usize| rows[reflect(y as isize + t as isize - 2, h) * w + x];
            let mut sum = tap(0) * GAUSSIAN[0];
            for (t, k) in GAUSSIAN.iter().enumerate().skip(1) {
                sum += tap(t) * k;
            }
            out[y * w + x] = sum;
        }
        work.step(w as u64 * 5)?;
    }
    Ok(out)
}

/// The unnormalised Sobel gradients (x, y) with replicated edges, each the sum of its
/// kernel's non-zero taps in row-major order (the zero taps add nothing).
fn sobel(plane: &[f32], (w, h): (usize, usize), work: &mut Work<'_>) -> Result<(Vec<f32>, Vec<f32>), ComputeError> {
    let at = |y: isize, x: isize| {
        let y = y.clamp(0, h as isize - 1) as usize;
        let x = x.clamp(0, w as isize - 1) as usize;
        plane[y * w + x]
    };
    let mut gx = vec![0f32; w * h];
    let mut gy = vec![0f32; w * h];
    for y in 0..h as isize {
        for x in 0..w as isize {
            let p = |dy: isize, dx: isize| at(y + dy, x + dx);
            let sx = 0.0 - p(-1, -1) + p(-1, 1) - 2.0 * p(0, -1) + 2.0 * p(0, 1) - p(1, -1) + p(1, 1);
            let sy = 0.0 - p(-1, -1) - 2.0 * p(-1, 0) - p(-1, 1) + p(1, -1) + 2.0 * p(1, 0) + p(1, 1);
            let i = y as usize * w + x as usize;
            gx[i] = sx;
            gy[i] = sy;
        }
        work.step(w as u64 * 12)?;
    }
    Ok((gx, gy))
}

/// An edge class: 0 none, 1 weak (above the low threshold), 2 strong (above the high).
type Class = u8;

/// Non-maximum suppression and the double threshold: each pixel's class.
fn suppress_and_classify(
    gx: &[f32],
    gy: &[f32],
    (w, h): (usize, usize),
    (low, high): (f32, f32),
    work: &mut Work<'_>,
) -> Result<Vec<Class>, ComputeError> {
    // The magnitude with a border of one pixel whose gradient is zero: sqrt(eps) there.
    let pw = w + 2;
    let floor = EPS.sqrt();
    let mut padded = vec![floor; pw * (h + 2)];
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            padded[(y + 1) * pw + x + 1] = (gx[i] * gx[i] + gy[i] * gy[i] + EPS).sqrt();
        }
        work.step(w as u64)?;
    }
    let mut classes = vec![0u8; w * h];
    for y in 0..h {
        for x in 0..w {
            let i = y * w + x;
            let centre = (y + 1) * pw + x + 1;
            let magnitude = padded[centre];
            let neighbour = |d: usize| {
                let (dy, dx) = NEIGHBOURS[d];
                padded[(centre as isize + dy * pw as isize + dx) as usize]
            };
            let angle = gy[i].atan2(gx[i]);
            let angle = if angle.is_nan() { 0.0 } else { angle };
            let octant = (angle * FOUR_OVER_PI).round_ties_even();
            let positive = octant.rem_euclid(8.0) as usize;
            let negative = (octant + 4.0).rem_euclid(8.0) as usize;
            // Towards the right or down a tie is enough, as kornia's `_beats`.
            let beats = |d: usize| {
                let n = neighbour(d);
                magnitude > n || ((d == 0 || d == 2) && magnitude == n)
            };
            let is_max = beats(positive) && beats(negative) && magnitude > floor;
            let kept = if is_max { magnitude } else { 0.0 };
            classes[i] = u8::from(kept > low) + u8::from(kept > high);
        }
        work.step(w as u64 * 4)?;
    }
    Ok(classes)
}

/// kornia's hysteresis: strong pixels, and weak pixels joined to one through weak
/// 8-neighbours, filled from the strong ones.
fn hysteresis(mut classes: Vec<Class>, (w, h): (usize, usize), work: &mut Work<'_>) -> Result<Vec<bool>, ComputeError> {
    let mut queue: Vec<usize> = (0..w * h).filter(|&i| classes[i] == 2).collect();
    work.step((w * h) as u64)?;
    while let Some(i) = queue.pop() {
        work.step(8)?;
        let (y, x) = ((i / w) as isize, (i % w) as isize);
        for (dy, dx) in NEIGHBOURS {
            let (ny, nx) = (y + dy, x + dx);
            if ny < 0 || nx < 0 || ny >= h as isize || nx >= w as isize {
                continue;
            }
            let n = ny as usize * w + nx as usize;
            if classes[n] == 1 {
                classes[n] = 2;
                queue.push(n);
            }
        }
    }
    Ok(classes.into_iter().map(|c| c == 2).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, float, Fixture};

    #[test]
    fn canny_finds_kornias_edges() {
        let f = Fixture::load();
        for case in f.cases("Canny") {
            let image = f.image(case, "image");
            let got = canny(
                &image,
                float(case, "low_threshold"),
                float(case, "high_threshold"),
                &always,
            )
            .unwrap();
            f.check_image(case, 0, &got, 0.0);
        }
    }

    #[test]
    fn alpha_tiny_images_and_crossed_thresholds_are_refused() {
        let rgba = ImageBatch {
            channels: 4,
            data: vec![0.5; 8 * 8 * 4],
            ..crate::image::empty(8, 8, 1, 0).unwrap()
        };
        assert!(canny(&rgba, 0.4, 0.8, &always).is_err());
        let thin = crate::image::empty(2, 9, 1, 0).unwrap();
        assert!(canny(&thin, 0.4, 0.8, &always).is_err());
        let ok = crate::image::empty(3, 3, 1, 0).unwrap();
        assert!(canny(&ok, 0.4, 0.8, &always).is_ok());
        assert!(canny(&ok, 0.8, 0.4, &always).is_err());
        assert!(canny(&ok, 0.0, 0.4, &always).is_err());
    }

    #[test]
    fn a_stop_ends_edge_detection_as_interrupted() {
        let image = crate::image::empty(64, 64, 2, 0x808080).unwrap();
        let result = canny(&image, 0.1, 0.2, &|| false);
        assert!(matches!(result, Err(ComputeError::Interrupted)));
        // Inside one large image, the caller is asked long before it is done.
        let big = crate::image::empty(2048, 1024, 1, 0x808080).unwrap();
        let asked = std::cell::Cell::new(0);
        let stop_soon = || {
            asked.set(asked.get() + 1);
            asked.get() < 3
        };
        assert!(matches!(
            canny(&big, 0.1, 0.2, &stop_soon),
            Err(ComputeError::Interrupted)
        ));
        assert_eq!(asked.get(), 3, "stopped at the first no");
    }
}
