//! The pixel operations between an upscale model's convolutions, on single CHW float32
//! images held in plain vectors, in parallel over rows of [`CHUNK`] values. Each computes
//! exactly what PyTorch does in float32 (no fused multiply-adds).

use rayon::prelude::*;

/// Values per parallel task.
const CHUNK: usize = 1 << 15;

/// `x` through a leaky ReLU of `slope`, in place: `x` where positive, `slope · x` elsewhere.
pub(super) fn leaky_relu(x: &mut [f32], slope: f32) {
    x.par_chunks_mut(CHUNK).for_each(|c| {
        c.iter_mut().filter(|v| **v < 0.0).for_each(|v| *v *= slope);
    });
}

/// `source` through a leaky ReLU of `slope`, written into `out` (of the same length).
pub(super) fn leaky_relu_into(source: &[f32], out: &mut [f32], slope: f32) {
    out.par_chunks_mut(CHUNK)
        .zip(source.par_chunks(CHUNK))
        .for_each(|(o, s)| {
            for (o, &s) in o.iter_mut().zip(s) {
                *o = if s < 0.0 { s * slope } else { s };
            }
        });
}

/// `x` through a per-channel PReLU (`weights[c]` for channel `c`), in place.
pub(super) fn prelu(x: &mut [f32], weights: &[f32]) {
    let plane = x.len() / weights.len().max(1);
    x.par_chunks_mut(plane.max(1)).zip(weights).for_each(|(c, &w)| {
        c.iter_mut().filter(|v| **v < 0.0).for_each(|v| *v *= w);
    });
}

/// `x ← x · scale + residual`, PyTorch's `x * scale + residual`: the product is rounded
/// before the sum.
pub(super) fn scale_add(x: &mut [f32], scale: f32, residual: &[f32]) {
    x.par_chunks_mut(CHUNK)
        .zip(residual.par_chunks(CHUNK))
        .for_each(|(x, r)| {
            for (x, &r) in x.iter_mut().zip(r) {
                let scaled = *x * scale;
                *x = scaled + r;
            }
        });
}

/// `x ← x + other`.
pub(super) fn add(x: &mut [f32], other: &[f32]) {
    x.par_chunks_mut(CHUNK)
        .zip(other.par_chunks(CHUNK))
        .for_each(|(x, o)| x.iter_mut().zip(o).for_each(|(x, &o)| *x += o));
}

/// The `channels` planes of `x` (`h × w`) enlarged `factor` times by repeating pixels:
/// nearest-neighbour interpolation by an integer factor.
pub(super) fn upsample_nearest(x: &[f32], channels: usize, (h, w): (usize, usize), factor: usize) -> Vec<f32> {
    let (ho, wo) = (h * factor, w * factor);
    let mut out = vec![0f32; channels * ho * wo];
    out.par_chunks_mut(wo).enumerate().for_each(|(row, o)| {
        let (c, y) = (row / ho, row % ho);
        let source = &x[(c * h + y / factor) * w..][..w];
        for (chunk, &v) in o.chunks_exact_mut(factor).zip(source) {
            chunk.fill(v);
        }
    });
    out
}

/// `x` (`channels × h × w`) padded at the bottom and right by `pad` rows and columns as
/// spandrel pads to a model's size requirements: reflected about the last row and column
/// for up to `size - 1` pixels (PyTorch's `reflect` mode), the rest repeating the edge of
/// that (`replicate`).
pub(super) fn pad(x: &[f32], channels: usize, (h, w): (usize, usize), pad: (usize, usize)) -> Vec<f32> {
    let (ho, wo) = (h + pad.0, w + pad.1);
    let source = |i: usize, n: usize, padding: usize| {
        let reflected = padding.min(n - 1);
        if i < n {
            i
        } else if i < n + reflected {
            2 * (n - 1) - i
        } else {
            n - 1 - reflected
        }
    };
    let mut out = vec![0f32; channels * ho * wo];
    out.par_chunks_mut(wo).enumerate().for_each(|(row, o)| {
        let (c, y) = (row / ho, source(row % ho, h, pad.0));
        let line = &x[(c * h + y) * w..][..w];
        for (i, v) in o.iter_mut().enumerate() {
            *v = line[source(i, w, pad.1)];
        }
    });
    out
}

/// `x` clamped to 0..=1 in place.
pub(super) fn clamp_unit(x: &mut [f32]) {
    x.par_chunks_mut(CHUNK)
        .for_each(|c| c.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0)));
}

/// PyTorch's `pixel_unshuffle`: `channels × h × w` into `channels·f² × h/f × w/f`, output
/// channel `c·f² + i·f + j` holding the pixels at offset `(i, j)` of each `f × f` block.
pub(super) fn pixel_unshuffle(x: &[f32], channels: usize, (h, w): (usize, usize), f: usize) -> Vec<f32> {
    let (ho, wo) = (h / f, w / f);
    let mut out = vec![0f32; channels * f * f * ho * wo];
    out.par_chunks_mut(wo).enumerate().for_each(|(row, o)| {
        let (plane, y) = (row / ho, row % ho);
        let (c, i, j) = (plane / (f * f), plane / f % f, plane % f);
        let source = &x[(c * h + y * f + i) * w..][..w];
        for (x, v) in o.iter_mut().enumerate() {
            *v = source[x * f + j];
        }
    });
    out
}

/// PyTorch's `pixel_shuffle`: `channels·f² × h × w` into `channels × h·f × w·f`.
pub(super) fn pixel_shuffle(x: &[f32], channels: usize, (h, w): (usize, usize), f: usize) -> Vec<f32> {
    let (ho, wo) = (h * f, w * f);
    let mut out = vec![0f32; channels * ho * wo];
    out.par_chunks_mut(wo).enumerate().for_each(|(row, o)| {
        let (c, y) = (row / ho, row % ho);
        let first_plane = c * f * f + (y % f) * f;
        for (xo, v) in o.iter_mut().enumerate() {
            let plane = first_plane + xo % f;
            *v = x[(plane * h + y / f) * w + xo / f];
        }
    });
    out
}

/// `x` (`channels × h × w`) cropped to its top-left `ho × wo`.
pub(super) fn crop(x: &[f32], channels: usize, (h, w): (usize, usize), (ho, wo): (usize, usize)) -> Vec<f32> {
    if (ho, wo) == (h, w) {
        return x.to_vec();
    }
    let mut out = Vec::with_capacity(channels * ho * wo);
    for c in 0..channels {
        for y in 0..ho {
            out.extend_from_slice(&x[(c * h + y) * w..][..wo]);
        }
    }
    out
}
