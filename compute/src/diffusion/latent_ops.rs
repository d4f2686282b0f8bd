//! ComfyUI's latent arithmetic and transforms (`LatentAdd`, `LatentSubtract`,
//! `LatentMultiply`, `LatentInterpolate`, `LatentBlend`, `LatentBatch`,
//! `LatentBatchSeedBehavior`, `LatentCrop`, `LatentFlip`, `LatentRotate`), computed as its
//! torch code computes them in float32. As in ComfyUI, each result keeps the first latent's
//! noise mask and noise indices (its `samples.copy()`), except where a node changes them.

use super::latent::scale;
use crate::image::{composite, ImageBatch, MaskBatch};
use crate::values::LatentBatch;
use crate::ComputeError;

/// How `LatentAdd`, `LatentSubtract`, `LatentInterpolate` and `LatentBlend` combine two
/// latent batches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Combination {
    /// `samples1 + samples2`.
    Add,
    /// `samples1 - samples2`.
    Subtract,
    /// Each latent vector's direction and length interpolated: `ratio` of `samples1`.
    Interpolate(f64),
    /// `samples1 * factor + samples2 * (1 - factor)`.
    Blend(f64),
}

/// A change to one latent batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Transform {
    /// `LatentMultiply`: every value times the factor.
    Multiply(f64),
    /// `LatentCrop`: `width` x `height` pixels at `x`, `y` (pixels; cells are 8 pixels).
    Crop {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// Left edge in pixels.
        x: u32,
        /// Top edge in pixels.
        y: u32,
    },
    /// `LatentFlip`: upside down (`x-axis: vertically`) or mirrored (`y-axis: horizontally`).
    Flip {
        /// Mirrored left to right rather than upside down.
        horizontally: bool,
    },
    /// `LatentRotate`: clockwise by this many quarter turns (0 to 3).
    Rotate(u32),
    /// `LatentBatchSeedBehavior`: every latent gets the first one's noise (`fixed`), or each
    /// its own by position (`random`).
    SeedBehavior {
        /// `fixed` rather than `random`.
        fixed: bool,
    },
}

/// `samples2` as ComfyUI's `reshape_latent_to` makes it fit `target`: resized with `method`
/// (centre-cropped) when its planes differ, then repeated or cut to the batch when `batch`.
fn reshape_to(target: [u32; 4], latent: &LatentBatch, method: &str, batch: bool) -> Result<Vec<f32>, ComputeError> {
    let [b, c, h, w] = target;
    if latent.shape[1] != c {
        return Err(ComputeError::invalid(format!(
            "latents of {} and {} channels cannot be combined",
            c, latent.shape[1]
        )));
    }
    let data = if latent.shape[2..] == target[2..] {
        latent.data.clone()
    } else {
        scale(latent, method, w, h, true)?.data
    };
    if !batch {
        return Ok(data);
    }
    let per = (c * h * w) as usize;
    Ok(data
        .chunks_exact(per)
        .cycle()
        .take(b as usize)
        .flatten()
        .copied()
        .collect())
}

/// `LatentAdd`, `LatentSubtract`, `LatentInterpolate` or `LatentBlend` of `a` and `b`:
/// `b` is first made to fit `a`'s shape (resized bilinearly, bicubically for the blend, and
/// repeated to `a`'s batch).
pub fn combine(a: &LatentBatch, b: &LatentBatch, how: Combination) -> Result<LatentBatch, ComputeError> {
    if let Combination::Blend(factor) = how {
        return blend(a, b, factor);
    }
    let b = reshape_to(a.shape, b, "bilinear", true)?;
    let data = match how {
        Combination::Add => a.data.iter().zip(&b).map(|(x, y)| x + y).collect(),
        Combination::Subtract => a.data.iter().zip(&b).map(|(x, y)| x - y).collect(),
        Combination::Interpolate(ratio) => interpolate(a.shape, &a.data, &b, ratio)?,
        Combination::Blend(_) => unreachable!("blended above"),
    };
    Ok(LatentBatch { data, ..a.clone() })
}

/// `LatentBlend`: `b` resized bicubically to `a`'s planes, then `a * factor + b * (1 -
/// factor)` broadcast over the batch as torch does (a batch of one meets every latent of the
/// other; other unequal batches fail, as in ComfyUI).
fn blend(a: &LatentBatch, b: &LatentBatch, factor: f64) -> Result<LatentBatch, ComputeError> {
    let tail = reshape_to(a.shape, b, "bicubic", false)?;
    let (na, nb) = (a.shape[0], b.shape[0]);
    if na != nb && na != 1 && nb != 1 {
        return Err(ComputeError::invalid(format!(
            "LatentBlend takes batches of equal size or of one, not {na} and {nb}"
        )));
    }
    let batch = na.max(nb);
    let per = a.data.len() / na as usize;
    let (keep, take) = (factor as f32, (1.0 - factor) as f32);
    let at = |data: &'_ [f32], n: u32, i: usize| data[if n == 1 { i % per } else { i }];
    let data = (0..batch as usize * per)
        .map(|i| at(&a.data, na, i) * keep + at(&tail, nb, i) * take)
        .collect();
    Ok(LatentBatch {
        shape: [batch, a.shape[1], a.shape[2], a.shape[3]],
        data,
        ..a.clone()
    })
}

/// torch's `nan_to_num`: NaN to 0, infinities to the largest finite values.
fn nan_to_num(v: f32) -> f32 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(f32::MIN, f32::MAX)
    }
}

/// The length of every latent vector (over the channels): `[batch, height, width]`.
fn norms([b, c, h, w]: [usize; 4], data: &[f32]) -> Vec<f32> {
    let plane = h * w;
    (0..b * plane)
        .map(|i| {
            let (n, p) = (i / plane, i % plane);
            (0..c)
                .map(|k| data[(n * c + k) * plane + p].powi(2))
                .sum::<f32>()
                .sqrt()
        })
        .collect()
}

/// `LatentInterpolate`'s torch code, norms included. Its norms (`[batch, h, w]`) broadcast
/// against `[batch, channels, h, w]` by their last three dimensions: the norm of latent `k`
/// meets channel `k`. That fits only a batch of one or of as many latents as channels;
/// ComfyUI fails on others, and so does this.
fn interpolate(shape: [u32; 4], a: &[f32], b: &[f32], ratio: f64) -> Result<Vec<f32>, ComputeError> {
    let shape = shape.map(|d| d as usize);
    let [batch, channels, h, w] = shape;
    if batch != 1 && batch != channels {
        return Err(ComputeError::invalid(format!(
            "LatentInterpolate takes a batch of 1 or of {channels} latents (as ComfyUI), not {batch}"
        )));
    }
    let plane = h * w;
    // The norm that meets value `i` in ComfyUI's broadcast.
    let norm_at = |norms: &[f32], i: usize| {
        let (k, p) = ((i / plane) % channels, i % plane);
        norms[if batch == 1 { p } else { k * plane + p }]
    };
    let (m1, m2) = (norms(shape, a), norms(shape, b));
    let (keep, take) = (ratio as f32, (1.0 - ratio) as f32);
    let t: Vec<f32> = (0..a.len())
        .map(|i| nan_to_num(a[i] / norm_at(&m1, i)) * keep + nan_to_num(b[i] / norm_at(&m2, i)) * take)
        .collect();
    let mt = norms(shape, &t);
    Ok((0..t.len())
        .map(|i| nan_to_num(t[i] / norm_at(&mt, i)) * (norm_at(&m1, i) * keep + norm_at(&m2, i) * take))
        .collect())
}

/// `LatentBatch`: `b` (resized to `a`'s planes) after `a`, with both batches' noise indices.
pub fn batch(a: &LatentBatch, b: &LatentBatch) -> Result<LatentBatch, ComputeError> {
    let tail = reshape_to(a.shape, b, "bilinear", false)?;
    let indices = |l: &LatentBatch| l.batch_index.clone().unwrap_or_else(|| (0..l.shape[0]).collect());
    let mut batch_index = indices(a);
    batch_index.extend(indices(b));
    let mut data = a.data.clone();
    data.extend(tail);
    Ok(LatentBatch {
        shape: [a.shape[0] + b.shape[0], a.shape[1], a.shape[2], a.shape[3]],
        data,
        batch_index: Some(batch_index),
        ..a.clone()
    })
}

/// `LatentCompositeMasked`: `source` pasted into `destination` at pixel `x`, `y` (cells are
/// 8 pixels), weighed by `mask` as `ImageCompositeMasked` weighs it (ComfyUI's `composite`
/// with a multiplier of 8). The destination's noise mask and indices are kept.
pub fn composite_masked(
    destination: &LatentBatch,
    source: &LatentBatch,
    (x, y): (u32, u32),
    resize_source: bool,
    mask: Option<&MaskBatch>,
    keep_going: &dyn Fn() -> bool,
) -> Result<LatentBatch, ComputeError> {
    if destination.shape[1] != source.shape[1] {
        return Err(ComputeError::invalid(format!(
            "latents of {} and {} channels cannot be composited",
            destination.shape[1], source.shape[1]
        )));
    }
    let (to, from) = (channels_last(destination), channels_last(source));
    let out = composite::composite(&to, &from, (x / 8, y / 8), resize_source, mask, keep_going)?;
    Ok(LatentBatch {
        data: channels_first(&out),
        ..destination.clone()
    })
}

/// A latent's planes as an image batch of as many channels, `[batch, h, w, channels]`.
fn channels_last(latent: &LatentBatch) -> ImageBatch {
    let [b, c, h, w] = latent.shape;
    let (plane, cu) = ((h * w) as usize, c as usize);
    let mut data = vec![0.0; latent.data.len()];
    for (i, v) in latent.data.iter().enumerate() {
        let (n, k, p) = (i / (plane * cu), (i / plane) % cu, i % plane);
        data[(n * plane + p) * cu + k] = *v;
    }
    ImageBatch {
        width: w,
        height: h,
        batch: b,
        channels: c,
        data,
    }
}

/// An image batch's values as latent planes, `[batch, channels, h, w]`.
fn channels_first(image: &ImageBatch) -> Vec<f32> {
    let (plane, c) = ((image.width * image.height) as usize, image.channels as usize);
    let mut data = vec![0.0; image.data.len()];
    for (i, v) in image.data.iter().enumerate() {
        let (n, p, k) = (i / (plane * c), (i / c) % plane, i % c);
        data[(n * c + k) * plane + p] = *v;
    }
    data
}

/// Applies `transform` to `latent`; a crop that leaves nothing fails.
pub fn transform(latent: &LatentBatch, transform: &Transform) -> Result<LatentBatch, ComputeError> {
    Ok(match *transform {
        Transform::Multiply(factor) => {
            let factor = factor as f32;
            LatentBatch {
                data: latent.data.iter().map(|v| v * factor).collect(),
                ..latent.clone()
            }
        }
        Transform::Crop { width, height, x, y } => crop(latent, width, height, x, y)?,
        Transform::Flip { horizontally } => remap(latent, latent.shape[2], latent.shape[3], |r, c, h, w| {
            if horizontally {
                (r, w - 1 - c)
            } else {
                (h - 1 - r, c)
            }
        }),
        Transform::Rotate(quarters) => rotate(latent, quarters % 4),
        Transform::SeedBehavior { fixed } => LatentBatch {
            batch_index: fixed.then(|| {
                let first = latent.batch_index.as_ref().map_or(0, |i| i[0]);
                vec![first; latent.shape[0] as usize]
            }),
            ..latent.clone()
        },
    })
}

/// `torch.rot90(samples, k, dims=[3, 2])`: clockwise quarter turns.
fn rotate(latent: &LatentBatch, quarters: u32) -> LatentBatch {
    let [_, _, h, w] = latent.shape;
    match quarters {
        1 => remap(latent, w, h, |r, c, h, _| (h - 1 - c, r)),
        2 => remap(latent, h, w, |r, c, h, w| (h - 1 - r, w - 1 - c)),
        3 => remap(latent, w, h, |r, c, _, w| (c, w - 1 - r)),
        _ => latent.clone(),
    }
}

/// A latent of planes `out_h` x `out_w` whose cell `(r, c)` is the source's cell
/// `from(r, c, h, w)` (`h`, `w`: the source's plane).
fn remap(
    latent: &LatentBatch,
    out_h: u32,
    out_w: u32,
    from: impl Fn(usize, usize, usize, usize) -> (usize, usize),
) -> LatentBatch {
    let [b, c, h, w] = latent.shape.map(|d| d as usize);
    let (oh, ow) = (out_h as usize, out_w as usize);
    let mut data = Vec::with_capacity(latent.data.len());
    for plane in latent.data.chunks_exact(h * w).take(b * c) {
        for r in 0..oh {
            for col in 0..ow {
                let (sr, sc) = from(r, col, h, w);
                data.push(plane[sr * w + sc]);
            }
        }
    }
    LatentBatch {
        shape: [b as u32, c as u32, out_h, out_w],
        data,
        ..latent.clone()
    }
}

/// Python's `start:stop` slice of a `len`-long axis, as a range.
fn py_slice(len: i64, start: i64, stop: i64) -> std::ops::Range<usize> {
    let clamp = |i: i64| if i < 0 { (i + len).max(0) } else { i.min(len) } as usize;
    let (from, to) = (clamp(start), clamp(stop));
    from..to.max(from)
}

/// `LatentCrop`: the cells of `width` x `height` pixels at `x`, `y`, the corner moved in so
/// that at least 8 cells remain, sliced as ComfyUI slices (a latent under 8 cells wide reads
/// from its end, as a negative Python index does).
fn crop(latent: &LatentBatch, width: u32, height: u32, x: u32, y: u32) -> Result<LatentBatch, ComputeError> {
    let [b, c, h, w] = latent.shape.map(i64::from);
    let x = i64::from(x / 8).min(w - 8);
    let y = i64::from(y / 8).min(h - 8);
    let rows = py_slice(h, y, i64::from(height / 8) + y);
    let cols = py_slice(w, x, i64::from(width / 8) + x);
    if rows.is_empty() || cols.is_empty() {
        return Err(ComputeError::invalid(format!(
            "cropping {width}x{height} pixels leaves nothing of a {}x{} pixel latent",
            w * 8,
            h * 8
        )));
    }
    let (hu, wu) = (h as usize, w as usize);
    let mut data = Vec::with_capacity((b * c) as usize * rows.len() * cols.len());
    for plane in latent.data.chunks_exact(hu * wu) {
        for r in rows.clone() {
            data.extend_from_slice(&plane[r * wu + cols.start..r * wu + cols.end]);
        }
    }
    let shape = [b as u32, c as u32, rows.len() as u32, cols.len() as u32];
    Ok(LatentBatch {
        shape,
        data,
        ..latent.clone()
    })
}

#[cfg(test)]
pub(crate) mod tests;
