//! Group normalisation, optionally followed by SiLU, as one operation.
//!
//! On the CPU each (batch item, group) is one parallel task: two passes over the group for
//! its mean and variance (the group stays in cache), one vectorised pass that applies the
//! per-channel scale and shift and the SiLU. candle's `GroupNorm` and `silu` take about ten
//! mostly single-threaded passes over the tensor for the same result. Other devices use
//! them.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Module, Result, Shape, Tensor};
use candle_nn::VarBuilder;

use super::simd::{self, exp, Kernel};
use super::{contiguous_f32, filled, par_init};

/// `GroupNorm(groups, channels, eps)` with learned `weight` and `bias`, then SiLU if asked.
#[derive(Debug, Clone)]
pub(crate) struct GroupNorm {
    weight: Tensor,
    bias: Tensor,
    groups: usize,
    eps: f64,
    silu: bool,
}

impl GroupNorm {
    /// Reads `weight` and `bias` (`[channels]`) from `vb`.
    pub(crate) fn new(vb: VarBuilder, groups: usize, channels: usize, eps: f64, silu: bool) -> Result<Self> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            candle_core::bail!("group norm: {channels} channels do not split into {groups} groups");
        }
        Ok(GroupNorm {
            weight: vb.get(channels, "weight")?,
            bias: vb.get(channels, "bias")?,
            groups,
            eps,
            silu,
        })
    }
}

impl Module for GroupNorm {
    /// `x: [b, channels, ...]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let kernel = (x.device().is_cpu() && x.dtype() == DType::F32) || x.device().is_cuda();
        if kernel && x.rank() >= 2 {
            let op = FusedGroupNorm {
                groups: self.groups,
                eps: self.eps as f32,
                silu: self.silu,
            };
            return x.contiguous()?.apply_op3_no_bwd(&self.weight, &self.bias, &op);
        }
        let channels = self.weight.dim(0)?;
        let norm = candle_nn::GroupNorm::new(self.weight.clone(), self.bias.clone(), channels, self.groups, self.eps)?;
        let y = norm.forward(x)?;
        if self.silu {
            candle_nn::ops::silu(&y)
        } else {
            Ok(y)
        }
    }
}

/// The CPU kernel behind [`GroupNorm`].
struct FusedGroupNorm {
    groups: usize,
    eps: f32,
    silu: bool,
}

impl CustomOp3 for FusedGroupNorm {
    fn name(&self) -> &'static str {
        "fused-group-norm"
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
        let dims = xl.shape().dims();
        let channels = dims[1];
        if wl.shape().dims() != [channels] || bl.shape().dims() != [channels] {
            candle_core::bail!("group norm: {channels} channels but weight {:?}", wl.shape());
        }
        let (x, weight, bias) = (
            contiguous_f32(xs, xl, "group norm")?,
            contiguous_f32(ws, wl, "group norm")?,
            contiguous_f32(bs, bl, "group norm")?,
        );
        let spatial: usize = dims[2..].iter().product();
        let per_group = channels / self.groups;
        let group_len = per_group * spatial;
        let out = par_init(x.len(), group_len, |task, out| {
            // Overwritten channel by channel below; zeroed (in cache) to be written through.
            let out = filled(out, 0.0);
            let x = &x[task * group_len..][..out.len()];
            let first_channel = (task % self.groups) * per_group;
            let (mean, inv_std) = simd::run(Moments(x, self.eps));
            for (c, (out, x)) in out.chunks_mut(spatial).zip(x.chunks(spatial)).enumerate() {
                let scale = inv_std * weight[first_channel + c];
                let shift = bias[first_channel + c] - mean * scale;
                simd::run(ScaleShift {
                    x,
                    out,
                    scale,
                    shift,
                    silu: self.silu,
                });
            }
            out
        });
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
        bs: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let kernel = crate::cuda::GroupNormKernel {
            groups: self.groups,
            eps: self.eps,
            silu: self.silu,
        };
        crate::cuda::map3(&kernel, (xs, xl), (ws, wl), (bs, bl))
    }
}

/// Lanes kept apart so that the sums vectorise.
const LANES: usize = 16;

/// Mean and `1 / sqrt(variance + eps)` of a slice (two passes, accumulated in `f64` lanes).
struct Moments<'a>(&'a [f32], f32);

impl Kernel for Moments<'_> {
    type Output = (f32, f32);

    #[inline(always)]
    fn run(self) -> (f32, f32) {
        let (x, eps) = (self.0, self.1);
        let n = x.len() as f64;
        let mut lanes = [0f64; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                *lane += f64::from(v);
            }
        }
        let rest: f64 = chunks.remainder().iter().map(|&v| f64::from(v)).sum();
        let mean = (lanes.iter().sum::<f64>() + rest) / n;
        let mut lanes = [0f64; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (lane, &v) in lanes.iter_mut().zip(chunk) {
                let centred = f64::from(v) - mean;
                *lane += centred * centred;
            }
        }
        let rest: f64 = chunks.remainder().iter().map(|&v| (f64::from(v) - mean).powi(2)).sum();
        let variance = (lanes.iter().sum::<f64>() + rest) / n;
        (mean as f32, (1.0 / (variance + f64::from(eps)).sqrt()) as f32)
    }
}

/// `out = x · scale + shift`, then SiLU (`y / (1 + e^-y)`) if `silu`.
struct ScaleShift<'a> {
    x: &'a [f32],
    out: &'a mut [f32],
    scale: f32,
    shift: f32,
    silu: bool,
}

impl Kernel for ScaleShift<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let (scale, shift) = (self.scale, self.shift);
        if self.silu {
            for (o, &v) in self.out.iter_mut().zip(self.x) {
                let y = v.mul_add(scale, shift);
                *o = y / (1.0 + exp(-y));
            }
        } else {
            for (o, &v) in self.out.iter_mut().zip(self.x) {
                *o = v.mul_add(scale, shift);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use candle_nn::VarMap;

    /// Group norm (+ SiLU) of `x` computed in `f64`, element by element.
    fn reference(x: &[f32], shape: &[usize], groups: usize, weight: &[f32], bias: &[f32], silu: bool) -> Vec<f32> {
        let (channels, spatial) = (shape[1], shape[2..].iter().product::<usize>());
        let group_len = channels / groups * spatial;
        let mut out = Vec::with_capacity(x.len());
        for (g, group) in x.chunks(group_len).enumerate() {
            let n = group.len() as f64;
            let mean = group.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let var = group.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
            for (i, &v) in group.iter().enumerate() {
                let c = (g % groups) * (channels / groups) + i / spatial;
                let y = (f64::from(v) - mean) / (var + 1e-5).sqrt() * f64::from(weight[c]) + f64::from(bias[c]);
                out.push(if silu { y / (1.0 + (-y).exp()) } else { y } as f32);
            }
        }
        out
    }

    fn compare(shape: &[usize], groups: usize, silu: bool) {
        let dev = Device::Cpu;
        let channels = shape[1];
        // Non-trivial affine parameters.
        let weight = Tensor::randn(1f32, 0.5, channels, &dev).unwrap();
        let bias = Tensor::randn(0f32, 0.5, channels, &dev).unwrap();
        let ours = GroupNorm {
            weight: weight.clone(),
            bias: bias.clone(),
            groups,
            eps: 1e-5,
            silu,
        };
        // An offset that makes a one-pass or single-precision sum lose accuracy.
        let x = (Tensor::randn(0f32, 3.0, shape, &dev).unwrap() + 50.0).unwrap();
        let got = ours
            .forward(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let want = reference(
            &x.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            shape,
            groups,
            &weight.to_vec1::<f32>().unwrap(),
            &bias.to_vec1::<f32>().unwrap(),
            silu,
        );
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(diff < 2e-5, "{shape:?} groups {groups} silu {silu}: {diff}");
    }

    /// Other devices take candle's group norm and SiLU; on the CPU they agree with the fused op
    /// (loosely: candle sums in single precision).
    #[test]
    fn the_candle_fallback_agrees() {
        let dev = Device::Cpu;
        let weight = Tensor::randn(1f32, 0.5, 64, &dev).unwrap();
        let bias = Tensor::randn(0f32, 0.5, 64, &dev).unwrap();
        let ours = GroupNorm {
            weight: weight.clone(),
            bias: bias.clone(),
            groups: 32,
            eps: 1e-5,
            silu: true,
        };
        let x = Tensor::randn(0f32, 1.0, (2, 64, 9, 7), &dev).unwrap();
        let theirs = candle_nn::GroupNorm::new(weight, bias, 64, 32, 1e-5).unwrap();
        let want = candle_nn::ops::silu(&theirs.forward(&x).unwrap()).unwrap();
        assert!(crate::max_abs_diff(&ours.forward(&x).unwrap(), &want) < 1e-4);
    }

    #[test]
    fn matches_a_double_precision_reference() {
        compare(&[2, 64, 9, 7], 32, true);
        compare(&[2, 64, 9, 7], 32, false);
        compare(&[1, 6, 5], 3, true);
        compare(&[3, 32, 16, 16], 1, true);
    }

    #[test]
    fn channels_that_do_not_split_into_groups_are_an_error() {
        let vb = VarBuilder::from_varmap(&VarMap::new(), DType::F32, &Device::Cpu);
        assert!(GroupNorm::new(vb, 32, 48, 1e-5, false).is_err());
    }
}
