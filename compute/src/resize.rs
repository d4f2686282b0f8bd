//! Resizing of `[batch, channels, height, width]` planes as torch's
//! `F.interpolate(..., align_corners=False)` does it, which ComfyUI's latent upscales, mask
//! reshapes and image nodes use: `nearest-exact`, `bilinear`, `bicubic` (a = -0.75, no
//! antialiasing) and `area` (adaptive average pooling). The image nodes' interleaved-channel
//! resize (`image::resample`) takes its taps from here.

use crate::ComputeError;

/// An interpolation mode, by ComfyUI's `upscale_method` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `nearest-exact`.
    NearestExact,
    /// `bilinear`.
    Bilinear,
    /// `bicubic`.
    Bicubic,
    /// `area`.
    Area,
}

impl std::str::FromStr for Mode {
    type Err = ComputeError;
    fn from_str(s: &str) -> Result<Self, ComputeError> {
        Ok(match s {
            "nearest-exact" => Mode::NearestExact,
            "bilinear" => Mode::Bilinear,
            "bicubic" => Mode::Bicubic,
            "area" => Mode::Area,
            "bislerp" => return Err(ComputeError::invalid("upscale_method bislerp is not supported yet")),
            other => {
                return Err(ComputeError::invalid(format!(
                    "unknown upscale_method {other:?}; expected nearest-exact, bilinear, area, bicubic or bislerp"
                )))
            }
        })
    }
}

/// Resizes every `height` x `width` plane of `data` (planes one after the other) to
/// `out_h` x `out_w`.
pub fn resize_planes(data: &[f32], height: usize, width: usize, out_h: usize, out_w: usize, mode: Mode) -> Vec<f32> {
    let plane = height * width;
    if plane == 0 {
        return Vec::new();
    }
    let rows = taps(height, out_h, mode);
    let cols = taps(width, out_w, mode);
    let mut out = Vec::with_capacity(data.len() / plane * out_h * out_w);
    for src in data.chunks_exact(plane) {
        for (ys, wy) in &rows {
            for (xs, wx) in &cols {
                let mut acc = 0f32;
                for (&y, &ky) in ys.iter().zip(wy) {
                    let mut row = 0f32;
                    for (&x, &kx) in xs.iter().zip(wx) {
                        row += src[y * width + x] * kx;
                    }
                    acc += row * ky;
                }
                out.push(acc);
            }
        }
    }
    out
}

/// For each output index along one axis: the input indices it reads and their weights, as
/// torch computes them in float32.
pub(crate) fn taps(input: usize, output: usize, mode: Mode) -> Vec<(Vec<usize>, Vec<f32>)> {
    let scale = input as f32 / output as f32;
    let last = input - 1;
    (0..output)
        .map(|dst| match mode {
            Mode::NearestExact => {
                let src = (((dst as f32 + 0.5) * scale).floor() as usize).min(last);
                (vec![src], vec![1.0])
            }
            Mode::Bilinear => {
                let src = (scale * (dst as f32 + 0.5) - 0.5).max(0.0);
                let i0 = (src as usize).min(last);
                let i1 = if i0 < last { i0 + 1 } else { i0 };
                let l1 = src - i0 as f32;
                (vec![i0, i1], vec![1.0 - l1, l1])
            }
            Mode::Bicubic => {
                let src = scale * (dst as f32 + 0.5) - 0.5;
                let base = src.floor();
                let t = src - base;
                let idx = |k: i64| (base as i64 + k).clamp(0, last as i64) as usize;
                (vec![idx(-1), idx(0), idx(1), idx(2)], cubic_weights(t).to_vec())
            }
            Mode::Area => {
                let start = dst * input / output;
                let end = ((dst + 1) * input).div_ceil(output);
                let n = (end - start) as f32;
                ((start..end).collect(), vec![1.0 / n; end - start])
            }
        })
        .collect()
}

/// Keys' cubic convolution weights with a = -0.75, as torch's bicubic.
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    // As torch computes them: the last from `(1 - t) + 1`, which may round unlike `2 - t`.
    [far(t + 1.0), near(t), near(1.0 - t), far((1.0 - t) + 1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_sizes_keep_values() {
        let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
        for mode in [Mode::NearestExact, Mode::Bilinear, Mode::Bicubic, Mode::Area] {
            let out = resize_planes(&data, 3, 4, 3, 4, mode);
            for (a, b) in out.iter().zip(&data) {
                assert!((a - b).abs() < 1e-5, "{mode:?}");
            }
        }
    }

    #[test]
    fn known_values() {
        // torch: F.interpolate(tensor([[[[0., 1.], [2., 3.]]]]), size=(4, 4), mode="bilinear")
        let out = resize_planes(&[0.0, 1.0, 2.0, 3.0], 2, 2, 4, 4, Mode::Bilinear);
        let first_row = [0.0, 0.25, 0.75, 1.0];
        for (a, b) in out[..4].iter().zip(first_row) {
            assert!((a - b).abs() < 1e-6);
        }
        // Nearest-exact doubling repeats each value twice.
        let out = resize_planes(&[1.0, 2.0], 1, 2, 1, 4, Mode::NearestExact);
        assert_eq!(out, vec![1.0, 1.0, 2.0, 2.0]);
        // Area halving averages pairs.
        let out = resize_planes(&[1.0, 3.0, 5.0, 7.0], 1, 4, 1, 2, Mode::Area);
        assert_eq!(out, vec![2.0, 6.0]);
        assert!("bislerp".parse::<Mode>().is_err());
    }
}
