//! ComfyUI's mask nodes (`comfy_extras/nodes_mask.py`) on [`MaskBatch`]es, in float32 as
//! torch and scipy compute them.

use crate::image::{ImageBatch, MaskBatch, MAX_SIDE, MAX_VALUES};
use crate::ComputeError;

/// Refuses a mask batch with an empty or oversized side, or too many values.
fn check_mask(width: u32, height: u32, batch: u32) -> Result<(), ComputeError> {
    if width == 0 || height == 0 || batch == 0 {
        return Err(ComputeError::invalid("mask sides and batch size must be at least 1"));
    }
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(ComputeError::invalid(format!(
            "mask sides must be at most {MAX_SIDE} pixels, got {width}x{height}"
        )));
    }
    if u64::from(width) * u64::from(height) * u64::from(batch) > MAX_VALUES {
        return Err(ComputeError::TooLarge("the mask batch is too large".into()));
    }
    Ok(())
}

/// A mask batch of the given size holding `data`.
fn mask(width: u32, height: u32, batch: u32, data: Vec<f32>) -> MaskBatch {
    MaskBatch {
        width,
        height,
        batch,
        data,
    }
}

/// `SolidMask`: one `width` x `height` mask of `value` (as float32).
pub fn solid(value: f64, width: u32, height: u32) -> Result<MaskBatch, ComputeError> {
    check_mask(width, height, 1)?;
    Ok(mask(
        width,
        height,
        1,
        vec![value as f32; width as usize * height as usize],
    ))
}

/// `InvertMask`: every value `v` becomes `1 - v`.
pub fn invert(m: &MaskBatch) -> MaskBatch {
    mask(m.width, m.height, m.batch, m.data.iter().map(|v| 1.0 - v).collect())
}

/// `ThresholdMask`: 1 where the value is above `value` (as float32), else 0.
pub fn threshold(m: &MaskBatch, value: f64) -> MaskBatch {
    let value = value as f32;
    let data = m.data.iter().map(|&v| if v > value { 1.0 } else { 0.0 }).collect();
    mask(m.width, m.height, m.batch, data)
}

/// `CropMask`: the `w` x `h` rectangle at `x`, `y` of every mask, cut at the mask's right
/// and bottom edges. A corner outside the mask (an empty mask in ComfyUI) is refused.
pub fn crop(m: &MaskBatch, (x, y, w, h): (u32, u32, u32, u32)) -> Result<MaskBatch, ComputeError> {
    if x >= m.width || y >= m.height {
        return Err(ComputeError::invalid(format!(
            "the crop's corner {x},{y} lies outside the {}x{} mask",
            m.width, m.height
        )));
    }
    let (w, h) = (w.min(m.width - x), h.min(m.height - y));
    let mut data = Vec::with_capacity(w as usize * h as usize * m.batch as usize);
    for frame in m.data.chunks_exact(m.width as usize * m.height as usize) {
        for row in y..y + h {
            let start = (row * m.width + x) as usize;
            data.extend_from_slice(&frame[start..start + w as usize]);
        }
    }
    Ok(mask(w, h, m.batch, data))
}

/// `MaskComposite`'s operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompositeOp {
    /// `d * s`.
    Multiply,
    /// `d + s`.
    Add,
    /// `d - s`.
    Subtract,
    /// Both round to non-zero.
    And,
    /// Either rounds to non-zero.
    Or,
    /// Exactly one rounds to non-zero.
    Xor,
}

impl CompositeOp {
    /// The operation on one destination and one source value.
    fn apply(self, d: f32, s: f32) -> f32 {
        let on = |v: f32| v.round_ties_even() != 0.0;
        let bit = |b: bool| if b { 1.0 } else { 0.0 };
        match self {
            Self::Multiply => d * s,
            Self::Add => d + s,
            Self::Subtract => d - s,
            Self::And => bit(on(d) && on(s)),
            Self::Or => bit(on(d) || on(s)),
            Self::Xor => bit(on(d) != on(s)),
        }
    }
}

/// `MaskComposite`: `source` placed with its top-left corner at `x`, `y` and combined with
/// `destination` where they overlap, then everything clamped to 0..=1. The source's batch
/// must be 1 or the destination's (torch's broadcasting); a corner beyond the destination
/// changes nothing but the clamp.
pub fn composite(
    destination: &MaskBatch,
    source: &MaskBatch,
    (x, y): (u32, u32),
    op: CompositeOp,
) -> Result<MaskBatch, ComputeError> {
    if source.batch != 1 && source.batch != destination.batch {
        return Err(ComputeError::invalid(format!(
            "cannot combine a batch of {} masks with a batch of {}",
            source.batch, destination.batch
        )));
    }
    let mut out = destination.clone();
    let visible_w = source.width.min(destination.width.saturating_sub(x)) as usize;
    let visible_h = source.height.min(destination.height.saturating_sub(y)) as usize;
    let (dw, dh, sw, sh) = (
        destination.width as usize,
        destination.height as usize,
        source.width as usize,
        source.height as usize,
    );
    for b in 0..destination.batch as usize {
        let s = &source.data[(b % source.batch as usize) * sw * sh..][..sw * sh];
        for row in 0..visible_h {
            let at = (b * dh + y as usize + row) * dw + x as usize;
            for (col, d) in out.data[at..at + visible_w].iter_mut().enumerate() {
                *d = op.apply(*d, s[row * sw + col]);
            }
        }
    }
    out.data.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
    Ok(out)
}

/// `FeatherMask`: each mask multiplied by linear ramps over `[left, top, right, bottom]`
/// pixels from its edges (each clamped to the mask's side), in ComfyUI's order and with
/// its indexing: the right and bottom ramps' first step falls on column (row) 0.
pub fn feather(m: &MaskBatch, [left, top, right, bottom]: [u32; 4]) -> MaskBatch {
    let (w, h) = (m.width as usize, m.height as usize);
    let (left, right) = ((left as usize).min(w), (right as usize).min(w));
    let (top, bottom) = ((top as usize).min(h), (bottom as usize).min(h));
    // Python's `-x` index: 0 is the first column, else counted from the end.
    let from_end = |x: usize, n: usize| if x == 0 { 0 } else { n - x };
    let rate = |x: usize, n: usize| ((x as f64 + 1.0) / n as f64) as f32;
    let mut out = m.clone();
    for frame in out.data.chunks_exact_mut(w * h) {
        let mut column = |col: usize, r: f32| (0..h).for_each(|row| frame[row * w + col] *= r);
        (0..left).for_each(|x| column(x, rate(x, left)));
        (0..right).for_each(|x| column(from_end(x, w), rate(x, right)));
        let mut line = |row: usize, r: f32| frame[row * w..][..w].iter_mut().for_each(|v| *v *= r);
        (0..top).for_each(|y| line(y, rate(y, top)));
        (0..bottom).for_each(|y| line(from_end(y, h), rate(y, bottom)));
    }
    out
}

/// One step of grey dilation (`max`) or erosion (`min`) of a `w` x `h` mask with a 3x3
/// footprint: the cross when `tapered`, else the square. Neighbours beyond the edges are
/// left out (scipy's `reflect` mode gives the same). Returns whether anything changed;
/// `keep_going` is asked every 64 rows.
fn morph_step(
    (src, dst): (&[f32], &mut [f32]),
    (w, h): (usize, usize),
    (dilate, tapered): (bool, bool),
    keep_going: &dyn Fn() -> bool,
) -> Result<bool, ComputeError> {
    let mut changed = false;
    for y in 0..h {
        if y % 64 == 63 && !keep_going() {
            return Err(ComputeError::Interrupted);
        }
        for x in 0..w {
            let mut v = src[y * w + x];
            for dy in -1isize..=1 {
                for dx in -1isize..=1 {
                    let (ny, nx) = (y as isize + dy, x as isize + dx);
                    let corner = dx != 0 && dy != 0;
                    if (tapered && corner) || ny < 0 || nx < 0 || ny >= h as isize || nx >= w as isize {
                        continue;
                    }
                    let n = src[ny as usize * w + nx as usize];
                    v = if dilate { v.max(n) } else { v.min(n) };
                }
            }
            changed |= v != src[y * w + x];
            dst[y * w + x] = v;
        }
    }
    Ok(changed)
}

/// `GrowMask`: `|expand|` steps of grey dilation (erosion when `expand` is negative) of
/// each mask; stops early once a step changes nothing. `keep_going` is asked before each
/// step and every 64 rows of one; when it says no the result is
/// [`ComputeError::Interrupted`].
pub fn grow(
    m: &MaskBatch,
    expand: i32,
    tapered: bool,
    keep_going: &dyn Fn() -> bool,
) -> Result<MaskBatch, ComputeError> {
    let (w, h) = (m.width as usize, m.height as usize);
    let mut out = m.clone();
    let mut scratch = vec![0f32; w * h];
    for frame in out.data.chunks_exact_mut(w * h) {
        for _ in 0..expand.unsigned_abs() {
            if !keep_going() {
                return Err(ComputeError::Interrupted);
            }
            let changed = morph_step((frame, &mut scratch), (w, h), (expand > 0, tapered), keep_going)?;
            frame.copy_from_slice(&scratch);
            if !changed {
                break;
            }
        }
    }
    Ok(out)
}

/// `ImageToMask`: channel `channel` (0 red, 1 green, 2 blue, 3 alpha) of every image.
pub fn from_channel(image: &ImageBatch, channel: u32) -> Result<MaskBatch, ComputeError> {
    if channel >= image.channels {
        return Err(ComputeError::invalid(format!(
            "channel {channel} is not in an image of {} channels",
            image.channels
        )));
    }
    let data = image
        .data
        .chunks_exact(image.channels as usize)
        .map(|p| p[channel as usize])
        .collect();
    Ok(mask(image.width, image.height, image.batch, data))
}

/// `ImageColorToMask`: 1 where the pixel's red, green and blue, each clamped to 0..=1 and
/// rounded to 8 bits (halves to even), make `color` (0xRRGGBB); else 0.
pub fn from_color(image: &ImageBatch, color: u32) -> Result<MaskBatch, ComputeError> {
    if image.channels < 3 {
        return Err(ComputeError::invalid("ImageColorToMask needs an RGB image"));
    }
    let byte = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round_ties_even() as i64;
    let data = image
        .data
        .chunks_exact(image.channels as usize)
        .map(|p| {
            let packed = (byte(p[0]) << 16) + (byte(p[1]) << 8) + byte(p[2]);
            if packed == i64::from(color) {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    Ok(mask(image.width, image.height, image.batch, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, float, text, uint, Fixture};

    #[test]
    fn solid_invert_threshold_and_crop_match_comfyui() {
        let f = Fixture::load();
        for case in f.cases("SolidMask") {
            let got = solid(float(case, "value"), uint(case, "width"), uint(case, "height")).unwrap();
            f.check_mask(case, 0, &got, 0.0);
        }
        for case in f.cases("InvertMask") {
            f.check_mask(case, 0, &invert(&f.mask(case, "mask")), 0.0);
        }
        for case in f.cases("ThresholdMask") {
            f.check_mask(case, 0, &threshold(&f.mask(case, "mask"), float(case, "value")), 0.0);
        }
        for case in f.cases("CropMask") {
            let area = (
                uint(case, "x"),
                uint(case, "y"),
                uint(case, "width"),
                uint(case, "height"),
            );
            f.check_mask(case, 0, &crop(&f.mask(case, "mask"), area).unwrap(), 0.0);
        }
    }

    #[test]
    fn composite_operations_round_halves_to_even_and_clamp_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("MaskComposite") {
            let op = match text(case, "operation") {
                "multiply" => CompositeOp::Multiply,
                "add" => CompositeOp::Add,
                "subtract" => CompositeOp::Subtract,
                "and" => CompositeOp::And,
                "or" => CompositeOp::Or,
                _ => CompositeOp::Xor,
            };
            let (d, s) = (f.mask(case, "destination"), f.mask(case, "source"));
            let got = composite(&d, &s, (uint(case, "x"), uint(case, "y")), op).unwrap();
            f.check_mask(case, 0, &got, 0.0);
        }
    }

    #[test]
    fn feather_follows_comfyuis_ramps_and_indexing() {
        let f = Fixture::load();
        for case in f.cases("FeatherMask") {
            let widths = ["left", "top", "right", "bottom"].map(|side| uint(case, side));
            f.check_mask(case, 0, &feather(&f.mask(case, "mask"), widths), 0.0);
        }
    }

    #[test]
    fn grow_dilates_and_erodes_as_scipy() {
        let f = Fixture::load();
        for case in f.cases("GrowMask") {
            let expand = case.inputs["expand"].as_i64().unwrap() as i32;
            let tapered = case.inputs["tapered_corners"].as_bool().unwrap();
            f.check_mask(
                case,
                0,
                &grow(&f.mask(case, "mask"), expand, tapered, &always).unwrap(),
                0.0,
            );
        }
    }

    #[test]
    fn image_channels_and_colours_become_masks_as_comfyui() {
        let f = Fixture::load();
        for case in f.cases("ImageToMask") {
            let channel = ["red", "green", "blue", "alpha"]
                .iter()
                .position(|c| *c == text(case, "channel"))
                .unwrap();
            let got = from_channel(&f.image(case, "image"), channel as u32).unwrap();
            f.check_mask(case, 0, &got, 0.0);
        }
        for case in f.cases("ImageColorToMask") {
            let got = from_color(&f.image(case, "image"), uint(case, "color")).unwrap();
            f.check_mask(case, 0, &got, 0.0);
        }
    }

    #[test]
    fn grow_stops_when_told_to() {
        let mut m = solid(0.0, 200, 200).unwrap();
        m.data[0] = 1.0;
        let stop = || false;
        assert!(matches!(grow(&m, 5, true, &stop), Err(ComputeError::Interrupted)));
    }

    #[test]
    fn source_batches_that_do_not_broadcast_are_refused() {
        let d = solid(0.5, 4, 4).unwrap();
        let s = MaskBatch {
            batch: 2,
            data: [d.data.clone(), d.data.clone()].concat(),
            ..d.clone()
        };
        assert!(composite(&d, &s, (0, 0), CompositeOp::Add).is_err());
    }
}
