//! Scaled dot-product attention, `softmax(q kᵀ · scale) v`, for the UNet's transformer blocks.
//!
//! On the CPU it runs fused: each task takes a block of query rows of one head, computes
//! their scores with a matrix product, turns them into probabilities in place (vectorised
//! `exp`), and multiplies by `v`, all in a per-thread scratch row block. The full score
//! matrix (heads × tokens × tokens: 1 GiB for SD1 at 512×512) is never materialised, and
//! blocks run in parallel on rayon's pool. Other devices use candle's matmul and softmax.

use std::cell::RefCell;

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::contiguous_f32;
use super::matmul::{matmul, View};
use super::simd::{self, exp, Kernel};

/// Query rows per task: a 64 × 4096 score block is 1 MiB, which stays in cache.
const ROWS: usize = 64;

/// `softmax(q kᵀ · scale) v` for `q: [bh, n, d]`, `k, v: [bh, m, d]`; returns `[bh, n, d]`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    if q.device().is_cpu() && q.dtype() == DType::F32 {
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        return q.apply_op3_no_bwd(&k, &v, &FusedAttention { scale: scale as f32 });
    }
    let scores = (q.matmul(&k.t()?)? * scale)?;
    candle_nn::ops::softmax_last_dim(&scores)?.matmul(v)
}

/// The CPU kernel behind [`attention`].
struct FusedAttention {
    scale: f32,
}

thread_local! {
    /// Each worker's score block, reused across tasks and calls.
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

impl CustomOp3 for FusedAttention {
    fn name(&self) -> &'static str {
        "fused-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (bh, n, d) = ql.shape().dims3()?;
        let (kbh, m, kd) = kl.shape().dims3()?;
        if kbh != bh || kd != d || vl.shape().dims3()? != (bh, m, d) {
            candle_core::bail!(
                "attention: q {:?}, k {:?} and v {:?} do not match",
                ql.shape(),
                kl.shape(),
                vl.shape()
            );
        }
        let (q, k, v) = (
            contiguous_f32(qs, ql, "attention")?,
            contiguous_f32(ks, kl, "attention")?,
            contiguous_f32(vs, vl, "attention")?,
        );
        let mut out = vec![0f32; bh * n * d];
        if out.is_empty() || m == 0 {
            return Ok((CpuStorage::F32(out), ql.shape().clone()));
        }
        out.par_chunks_mut(n * d).enumerate().for_each(|(head, out_head)| {
            let (kh, vh) = (&k[head * m * d..][..m * d], &v[head * m * d..][..m * d]);
            out_head.par_chunks_mut(ROWS * d).enumerate().for_each(|(block, o)| {
                let rows = o.len() / d;
                let qb = &q[head * n * d + block * ROWS * d..][..rows * d];
                SCORES.with_borrow_mut(|scores| {
                    scores.resize(ROWS * m, 0.0);
                    let block = Block {
                        qb,
                        kh,
                        vh,
                        rows,
                        m,
                        d,
                        scale: self.scale,
                    };
                    attend_block(block, o, &mut scores[..rows * m]);
                });
            });
        });
        Ok((CpuStorage::F32(out), ql.shape().clone()))
    }
}

/// One block of query rows of one head and that head's keys and values.
struct Block<'a> {
    qb: &'a [f32],
    kh: &'a [f32],
    vh: &'a [f32],
    rows: usize,
    m: usize,
    d: usize,
    scale: f32,
}

/// `o[rows×d] = softmax(qb[rows×d] · khᵀ · scale) · vh[m×d]`, with `scores` as the `rows×m`
/// scratch.
fn attend_block(b: Block<'_>, o: &mut [f32], scores: &mut [f32]) {
    let Block {
        qb,
        kh,
        vh,
        rows,
        m,
        d,
        scale,
    } = b;
    matmul(
        scores,
        View::rows(qb, rows, d),
        View::rows(kh, m, d).t(),
        scale,
        false,
        false,
    );
    let mut inverse_sums = [0f32; ROWS];
    for (row, inverse) in scores.chunks_exact_mut(m).zip(inverse_sums.iter_mut()) {
        *inverse = 1.0 / softmax_numerators(row);
    }
    matmul(o, View::rows(scores, rows, m), View::rows(vh, m, d), 1.0, false, false);
    for (row, inverse) in o.chunks_exact_mut(d).zip(inverse_sums) {
        row.iter_mut().for_each(|x| *x *= inverse);
    }
}

/// Replaces `row` by `exp(row - max(row))` and returns the sum.
fn softmax_numerators(row: &mut [f32]) -> f32 {
    simd::run(SoftmaxNumerators(row))
}

/// Lanes the loops below keep apart so that the compiler vectorises them.
const LANES: usize = 16;

/// [`softmax_numerators`] as a [`Kernel`].
struct SoftmaxNumerators<'a>(&'a mut [f32]);

impl Kernel for SoftmaxNumerators<'_> {
    type Output = f32;

    #[inline(always)]
    fn run(self) -> f32 {
        let row = self.0;
        let mut maxes = [f32::NEG_INFINITY; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (mx, &x) in maxes.iter_mut().zip(chunk) {
                *mx = if x > *mx { x } else { *mx };
            }
        }
        let max = chunks
            .remainder()
            .iter()
            .chain(&maxes)
            .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
        let mut sums = [0f32; LANES];
        let mut chunks = row.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            for (sum, x) in sums.iter_mut().zip(chunk.iter_mut()) {
                *x = exp(*x - max);
                *sum += *x;
            }
        }
        let mut sum: f32 = sums.iter().sum();
        for x in chunks.into_remainder() {
            *x = exp(*x - max);
            sum += *x;
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::simd::Isa;
    use candle_core::Device;

    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Tensor {
        let scores = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
        candle_nn::ops::softmax_last_dim(&scores).unwrap().matmul(v).unwrap()
    }

    /// Every instruction set this CPU has gives the portable loop's numerators and sum.
    #[test]
    fn softmax_variants_agree() {
        let row: Vec<f32> = (0..1003).map(|i| ((i * 7919) % 1000) as f32 * 0.013 - 6.0).collect();
        let mut want = row.clone();
        let want_sum = simd::run_on(Isa::Portable, SoftmaxNumerators(&mut want));
        for isa in Isa::available() {
            let mut got = row.clone();
            let sum = simd::run_on(isa, SoftmaxNumerators(&mut got));
            assert!(
                (sum - want_sum).abs() <= 1e-5 * want_sum,
                "{isa:?}: {sum} vs {want_sum}"
            );
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-6 * w.max(1e-30), "{isa:?}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn fused_attention_equals_matmul_softmax_matmul() {
        let dev = Device::Cpu;
        // Odd sizes: a partial row block, a row length that is not a multiple of the lanes.
        for &(bh, n, m, d) in &[(3, 130, 77, 40), (2, 64, 64, 4), (1, 5, 300, 8), (16, 257, 257, 1)] {
            let q = Tensor::randn(0f32, 1.0, (bh, n, d), &dev).unwrap();
            let k = Tensor::randn(0f32, 1.0, (bh, m, d), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (bh, m, d), &dev).unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let got = attention(&q, &k, &v, scale).unwrap();
            let want = reference(&q, &k, &v, scale);
            assert_eq!(got.dims(), want.dims());
            let diff = crate::compute::max_abs_diff(&got, &want);
            assert!(diff < 1e-5, "{bh} {n} {m} {d}: {diff}");
        }
    }

    #[test]
    fn large_scores_do_not_overflow() {
        let dev = Device::Cpu;
        let q = (Tensor::randn(0f32, 1.0, (1, 9, 16), &dev).unwrap() * 100.0).unwrap();
        let k = (Tensor::randn(0f32, 1.0, (1, 33, 16), &dev).unwrap() * 100.0).unwrap();
        let v = Tensor::randn(0f32, 1.0, (1, 33, 16), &dev).unwrap();
        let got = attention(&q, &k, &v, 1.0).unwrap();
        let want = reference(&q, &k, &v, 1.0);
        let diff = crate::compute::max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{diff}");
    }

    #[test]
    fn mismatched_shapes_are_an_error_not_a_panic() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((2, 4, 8), DType::F32, &dev).unwrap();
        let k = Tensor::zeros((2, 5, 8), DType::F32, &dev).unwrap();
        let v = Tensor::zeros((2, 6, 8), DType::F32, &dev).unwrap();
        assert!(attention(&q, &k, &v, 1.0).is_err());
    }
}
