//! GEGLU, the gated activation of the transformer blocks' feed-forward layer:
//! `[.., 2n] → [.., n]`, `a · gelu(g)` where `a` and `g` are the two halves of the last
//! dimension and `gelu` is the exact, erf-based GELU (as PyTorch's default).
//!
//! On the CPU it is one parallel, vectorised pass over the rows (candle would split the
//! tensor into two strided views, run a scalar `erf` on one thread and multiply with a
//! strided copy). Other devices use candle's ops.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, D};

use super::simd::{self, exp, Kernel};
use super::{contiguous_f32, filled, par_init};

/// `a · gelu(g)` for `x = [a | g]` along the last dimension.
pub(crate) fn geglu(x: &Tensor) -> Result<Tensor> {
    if (x.device().is_cpu() && x.dtype() == DType::F32) || x.device().is_cuda() {
        return x.contiguous()?.apply_op1_no_bwd(&FusedGeglu);
    }
    let halves = x.chunk(2, D::Minus1)?;
    &halves[0] * halves[1].gelu_erf()?
}

/// The CPU kernel behind [`geglu`].
struct FusedGeglu;

impl CustomOp1 for FusedGeglu {
    fn name(&self) -> &'static str {
        "fused-geglu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(storage, layout, "geglu")?;
        let mut dims = layout.shape().dims().to_vec();
        let width = dims.last().copied().unwrap_or(0);
        if width % 2 != 0 {
            candle_core::bail!("geglu: the last dimension ({width}) must be even");
        }
        let half = width / 2;
        if let Some(last) = dims.last_mut() {
            *last = half;
        }
        let out = par_init(x.len() / 2, half, |row, out| {
            // Written by the kernel; zeroed (in cache) to be written through.
            let out = filled(out, 0.0);
            let (a, g) = x[row * width..][..width].split_at(half);
            simd::run(GatedGelu { a, g, out });
            out
        });
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let mut dims = layout.shape().dims().to_vec();
        if let Some(last) = dims.last_mut() {
            *last /= 2;
        }
        crate::cuda::map1(&crate::cuda::GegluKernel, (storage, layout), Shape::from(dims))
    }
}

/// `out = a · gelu(g)` over one row.
struct GatedGelu<'a> {
    a: &'a [f32],
    g: &'a [f32],
    out: &'a mut [f32],
}

impl Kernel for GatedGelu<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        for ((o, &a), &g) in self.out.iter_mut().zip(self.a).zip(self.g) {
            *o = a * 0.5 * g * (1.0 + erf(g * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// `erf(x)` to within 1.5e-7 (Abramowitz and Stegun 7.1.26), branch-free so that loops over
/// it vectorise.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / z.mul_add(0.327_591_1, 1.0);
    let poly = t * t.mul_add(
        t.mul_add(
            t.mul_add(t.mul_add(1.061_405_4, -1.453_152), 1.421_413_8),
            -0.284_496_74,
        ),
        0.254_829_6,
    );
    let magnitude = 1.0 - poly * exp(-z * z);
    magnitude.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Isa;
    use candle_core::Device;

    #[test]
    fn erf_is_accurate() {
        // Reference values of erf.
        for (x, want) in [
            (0.0f32, 0.0f32),
            (0.1, 0.112_462_92),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
            (3.5, 0.999_999_3),
            (-1.0, -0.842_700_8),
            (10.0, 1.0),
        ] {
            assert!((erf(x) - want).abs() < 3e-7, "erf({x}) = {} not {want}", erf(x));
        }
    }

    #[test]
    fn equals_candle_chunk_gelu_erf_mul() {
        let dev = Device::Cpu;
        for shape in [(2, 7, 10), (1, 3, 34), (4, 1, 2)] {
            let x = Tensor::randn(0f32, 2.0, shape, &dev).unwrap();
            let got = geglu(&x).unwrap();
            let halves = x.chunk(2, D::Minus1).unwrap();
            let want = (&halves[0] * halves[1].gelu_erf().unwrap()).unwrap();
            assert_eq!(got.dims(), want.dims());
            let diff = crate::max_abs_diff(&got, &want);
            assert!(diff < 1e-5, "{shape:?}: {diff}");
        }
    }

    #[test]
    fn every_available_isa_agrees() {
        let a: Vec<f32> = (0..37).map(|i| i as f32 * 0.3 - 5.0).collect();
        let g: Vec<f32> = (0..37).map(|i| 4.0 - i as f32 * 0.25).collect();
        let mut want = vec![0f32; 37];
        simd::run_on(
            Isa::Portable,
            GatedGelu {
                a: &a,
                g: &g,
                out: &mut want,
            },
        );
        for isa in Isa::available() {
            let mut got = vec![0f32; 37];
            simd::run_on(
                isa,
                GatedGelu {
                    a: &a,
                    g: &g,
                    out: &mut got,
                },
            );
            for (x, y) in got.iter().zip(&want) {
                assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{isa:?}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn an_odd_last_dimension_is_an_error() {
        let x = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        assert!(geglu(&x).is_err());
    }
}
