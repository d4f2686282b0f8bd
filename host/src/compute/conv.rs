//! 2-D convolution with bias, laid out for one matrix product per image.
//!
//! On the CPU, `y[co, p] = Σ w[co, k] · col[k, p] + bias[co]` where `col` holds, for each
//! input channel and kernel tap, the channel's plane shifted by that tap (built in parallel,
//! one contiguous row at a time). The product writes NCHW directly, starting from the bias,
//! so nothing is transposed or added afterwards; a 1×1 convolution multiplies the input
//! itself. candle's CPU convolution instead gathers its im2col matrix one element at a time
//! on one thread, in pixel-major order, and transposes the result. Other devices use candle.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder};
use rayon::prelude::*;

use super::contiguous_f32;
use super::matmul::{matmul, View};

/// A square-kernel convolution with bias: `[b, cin, h, w] → [b, cout, h', w']`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
}

impl Conv2d {
    /// Reads `weight` (`[cout, cin, k, k]`) and `bias` (`[cout]`) from `vb`.
    pub fn new(vb: VarBuilder, cin: usize, cout: usize, kernel: usize, stride: usize, padding: usize) -> Result<Self> {
        if stride == 0 {
            candle_core::bail!("conv2d: stride must be at least 1");
        }
        Ok(Conv2d {
            weight: vb.get((cout, cin, kernel, kernel), "weight")?,
            bias: vb.get(cout, "bias")?,
            stride,
            padding,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.device().is_cpu() && x.dtype() == DType::F32 {
            let op = MatmulConv {
                stride: self.stride,
                padding: self.padding,
            };
            return x.contiguous()?.apply_op3_no_bwd(&self.weight, &self.bias, &op);
        }
        let cfg = Conv2dConfig {
            padding: self.padding,
            stride: self.stride,
            ..Default::default()
        };
        candle_nn::Conv2d::new(self.weight.clone(), Some(self.bias.clone()), cfg).forward(x)
    }
}

/// The CPU kernel behind [`Conv2d`].
struct MatmulConv {
    stride: usize,
    padding: usize,
}

impl CustomOp3 for MatmulConv {
    fn name(&self) -> &'static str {
        "matmul-conv2d"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, cin, h, w) = xl.shape().dims4()?;
        let (cout, wcin, kh, kw) = wl.shape().dims4()?;
        if wcin != cin || bl.shape().dims() != [cout] {
            candle_core::bail!(
                "conv2d: input {:?}, weight {:?}, bias {:?}",
                xl.shape(),
                wl.shape(),
                bl.shape()
            );
        }
        if cin == 0 || h == 0 || w == 0 || kh == 0 || kw == 0 {
            candle_core::bail!("conv2d: empty input {:?} or kernel {:?}", xl.shape(), wl.shape());
        }
        let (s, pad) = (self.stride, self.padding);
        if h + 2 * pad < kh || w + 2 * pad < kw {
            candle_core::bail!("conv2d: a {kh}x{kw} kernel does not fit a padded {h}x{w} input");
        }
        let (ho, wo) = ((h + 2 * pad - kh) / s + 1, (w + 2 * pad - kw) / s + 1);
        let (x, weight, bias) = (
            contiguous_f32(xs, xl, "conv2d")?,
            contiguous_f32(ws, wl, "conv2d")?,
            contiguous_f32(bs, bl, "conv2d")?,
        );
        let (k, p) = (cin * kh * kw, ho * wo);
        let mut out = vec![0f32; b * cout * p];
        if out.is_empty() {
            return Ok((CpuStorage::F32(out), Shape::from((b, cout, ho, wo))));
        }
        let direct = kh == 1 && kw == 1 && s == 1 && pad == 0;
        // One column matrix, refilled for each image of the batch.
        let mut columns = if direct { Vec::new() } else { vec![0f32; k * p] };
        for (image, y) in x.chunks_exact(cin * h * w).zip(out.chunks_exact_mut(cout * p)) {
            let col: &[f32] = if direct {
                image
            } else {
                columns.par_chunks_mut(kh * kw * p).enumerate().for_each(|(c, rows)| {
                    let plane = &image[c * h * w..][..h * w];
                    fill_columns(plane, rows, (h, w), kw, (ho, wo), s, pad);
                });
                &columns
            };
            for (row, &b) in y.chunks_exact_mut(p).zip(bias) {
                row.fill(b);
            }
            matmul(y, View::rows(weight, cout, k), View::rows(col, k, p), 1.0, true, true);
        }
        Ok((CpuStorage::F32(out), Shape::from((b, cout, ho, wo))))
    }
}

/// The `kh·kw` rows of one input channel's column block: row `(i, j)` is the plane shifted
/// by tap `(i, j)`, sampled at the output positions (zeros where the tap falls in padding).
fn fill_columns(
    plane: &[f32],
    rows: &mut [f32],
    (h, w): (usize, usize),
    kw: usize,
    (ho, wo): (usize, usize),
    stride: usize,
    pad: usize,
) {
    for (tap, row) in rows.chunks_exact_mut(ho * wo).enumerate() {
        let (i, j) = (tap / kw, tap % kw);
        for (oy, out) in row.chunks_exact_mut(wo).enumerate() {
            let sy = (oy * stride + i) as isize - pad as isize;
            if sy < 0 || sy >= h as isize {
                out.fill(0.0);
                continue;
            }
            let src = &plane[sy as usize * w..][..w];
            // Output columns whose source column sx = ox·stride + j - pad lies inside 0..w.
            let first = (pad.saturating_sub(j)).div_ceil(stride).min(wo);
            let last = ((w + pad).saturating_sub(j)).div_ceil(stride).clamp(first, wo);
            out[..first].fill(0.0);
            out[last..].fill(0.0);
            if stride == 1 {
                let start = first + j - pad;
                out[first..last].copy_from_slice(&src[start..start + (last - first)]);
            } else {
                for (ox, o) in out.iter_mut().enumerate().take(last).skip(first) {
                    *o = src[ox * stride + j - pad];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn compare(shape: (usize, usize, usize, usize), cout: usize, kernel: usize, stride: usize, padding: usize) {
        let dev = Device::Cpu;
        let cin = shape.1;
        let ours = Conv2d {
            weight: Tensor::randn(0f32, 1.0, (cout, cin, kernel, kernel), &dev).unwrap(),
            bias: Tensor::randn(0f32, 1.0, cout, &dev).unwrap(),
            stride,
            padding,
        };
        let x = Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
        let got = ours.forward(&x).unwrap();
        let cfg = Conv2dConfig {
            padding,
            stride,
            ..Default::default()
        };
        let want = candle_nn::Conv2d::new(ours.weight.clone(), Some(ours.bias.clone()), cfg)
            .forward(&x)
            .unwrap();
        assert_eq!(got.dims(), want.dims(), "{shape:?} k{kernel} s{stride} p{padding}");
        let diff = crate::compute::max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{shape:?} k{kernel} s{stride} p{padding}: {diff}");
    }

    #[test]
    fn equals_candle_conv2d() {
        compare((2, 5, 9, 7), 6, 3, 1, 1); // the UNet's 3x3 convolutions
        compare((2, 5, 9, 7), 6, 3, 2, 1); // its downsampling, odd sizes
        compare((1, 8, 6, 6), 3, 1, 1, 0); // 1x1 projections: no column matrix
        compare((1, 3, 8, 5), 4, 3, 1, 0); // no padding
        compare((1, 2, 7, 7), 3, 5, 2, 2); // a larger kernel and stride
        compare((1, 2, 4, 4), 3, 3, 3, 2); // padding wider than the stride covers
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let dev = Device::Cpu;
        let conv = Conv2d {
            weight: Tensor::zeros((4, 3, 3, 3), DType::F32, &dev).unwrap(),
            bias: Tensor::zeros(4, DType::F32, &dev).unwrap(),
            stride: 1,
            padding: 0,
        };
        let wrong_channels = Tensor::zeros((1, 2, 8, 8), DType::F32, &dev).unwrap();
        assert!(conv.forward(&wrong_channels).is_err());
        let too_small = Tensor::zeros((1, 3, 2, 2), DType::F32, &dev).unwrap();
        assert!(conv.forward(&too_small).is_err());
        let empty = Tensor::zeros((1, 3, 0, 8), DType::F32, &dev).unwrap();
        assert!(conv.forward(&empty).is_err());
    }
}
