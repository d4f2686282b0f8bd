//! Multi-head scaled dot-product attention, `softmax(q kᵀ · scale) v` per head, for the
//! UNet's transformer blocks.
//!
//! On the CPU it runs fused, one parallel task per (image, head): the head's keys and values
//! are copied out of the projections' `[b, tokens, heads·d]` layout (possibly columns of one
//! stacked projection) into a per-thread buffer that stays in cache, then for each block of
//! query rows (read in place) the scores come from one matrix product, become probabilities
//! in place (vectorised `exp`), and multiply `v`. The full score matrix (heads × tokens ×
//! tokens: 1 GiB for SD1 at 512×512) is never materialised. The heads' outputs are laid side
//! by side at the end. On AVX-512 CPUs, heads of at most 8 columns take the `narrow` module's
//! kernel and heads of at most 64 the `tiled` one's. Other devices use candle's matmul and
//! softmax.

use std::cell::RefCell;

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{DType, Result, Tensor};

mod narrow;
mod tiled;

use super::interrupt::Interrupt;
use super::matmul::{matmul, View};
use super::simd::{self, exp, Kernel};
use super::{filled, par_init, with_buffer, CpuF32};

/// Floats per AVX-512 vector: the lanes of the intrinsics kernels, and those the portable
/// softmax loop keeps apart so that the compiler vectorises it.
const LANES: usize = 16;

/// Query rows per block: fewer, larger blocks repack the head's keys and values less often.
const ROWS: usize = 256;

/// Keys per step of the running softmax: a `ROWS × KEYS` score block (512 KiB) stays in the
/// core's L2 cache between the two products.
const KEYS: usize = 512;

/// `softmax(q kᵀ · scale) v` over `heads` heads for `q: [b, n, heads·d]` and
/// `k, v: [b, m, heads·d]`; returns `[b, n, heads·d]`, the heads side by side. The inputs'
/// rows may be strided (columns of a wider tensor) as long as each row's elements are
/// adjacent.
///
/// `stop` is asked every [`rows_per_check`] query rows of each head (every ~10 ms of work
/// however many keys there are); once it fires, the call returns its error.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    heads: usize,
    scale: f64,
    stop: Interrupt<'_>,
) -> Result<Tensor> {
    let (b, n, width) = q.dims3()?;
    let (kb, m, kwidth) = k.dims3()?;
    if heads == 0 || width % heads != 0 || kb != b || kwidth != width || v.dims3()? != (b, m, width) {
        candle_core::bail!(
            "attention: q {:?}, k {:?} and v {:?} do not match for {heads} heads",
            q.shape(),
            k.shape(),
            v.shape()
        );
    }
    let d = width / heads;
    #[cfg(feature = "cuda")]
    if q.device().is_cuda()
        && crate::cuda::FlashAttention::supports(q.dtype(), d)
        && crate::cuda::flash_attention_enabled()
    {
        let op = crate::cuda::FlashAttention {
            heads,
            scale: scale as f32,
        };
        return rows_adjacent(q)?.apply_op3_no_bwd(&rows_adjacent(k)?, &rows_adjacent(v)?, &op);
    }
    if !(q.device().is_cpu() && q.dtype() == DType::F32) {
        let split = |x: &Tensor, tokens: usize| {
            x.reshape((b, tokens, heads, d))?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((b * heads, tokens, d))
        };
        let (qh, kh, vh) = (split(q, n)?, split(k, m)?, split(v, m)?);
        // Scaled before the product: float16 scores stay in range.
        let scores = (qh * scale)?.matmul(&kh.t()?)?;
        let o = candle_nn::ops::softmax_last_dim(&scores)?.matmul(&vh)?;
        return o.reshape((b, heads, n, d))?.transpose(1, 2)?.reshape((b, n, width));
    }
    let (q, k, v) = (rows_adjacent(q)?, rows_adjacent(k)?, rows_adjacent(v)?);
    let (qs, ks, vs) = (
        CpuF32::new(&q, "attention")?,
        CpuF32::new(&k, "attention")?,
        CpuF32::new(&v, "attention")?,
    );
    let (q, k, v) = (Heads::new(&qs), Heads::new(&ks), Heads::new(&vs));
    // One task per (image, head), whose keys and values stay in cache for all its query
    // blocks; the heads' outputs are laid side by side at the end.
    let scale = scale as f32;
    let narrow = d <= narrow::MAX_WIDTH && avx512_available();
    let tiled = !narrow && d <= tiled::MAX_WIDTH && avx512_available();
    let stopped = AtomicBool::new(false);
    let chunk = rows_per_check(m, d);
    let per_head = par_init(b * heads * n * d, n * d, |task, o| {
        // Overwritten below; zeroing the chunk (in cache) gives a `&mut [f32]` to write into.
        let o = filled(o, 0.0);
        if m == 0 {
            return o;
        }
        let (image, cols) = (task / heads, (task % heads) * d..(task % heads + 1) * d);
        with_buffer(&SCRATCH, |Scratch { keys, values, scores }| {
            // Query rows `first..` in chunks, with a check of `stop` before each.
            let mut chunks = |attend: &mut AttendChunk<'_>| {
                for (index, ob) in o.chunks_mut(chunk * d).enumerate() {
                    if stopped.load(Ordering::Relaxed) || stop.requested() {
                        stopped.store(true, Ordering::Relaxed);
                        return;
                    }
                    let rows = ob.len() / d;
                    attend(q.view(image, index * chunk, rows, cols.clone()), ob, scores);
                }
            };
            if narrow {
                let (width, padded) = (narrow::padded_width(d), narrow::padded_keys(m));
                k.gather_transposed(image, cols.clone(), (padded, width), padded, keys);
                v.gather_transposed(image, cols.clone(), (padded, width), padded, values);
                chunks(&mut |q, ob, _| {
                    let kv = narrow::Transposed { keys, values, m };
                    narrow::attend(q, kv, scale, ob);
                });
                return;
            }
            if tiled {
                let padded = tiled::padded_keys(m);
                k.gather_transposed(image, cols.clone(), (padded, d), tiled::KEYS, keys);
                v.gather(image, cols.clone(), (padded, tiled::padded_width(d)), values);
                chunks(&mut |q, ob, scores| {
                    let kv = tiled::Tiled { keys, values, m };
                    tiled::attend(q, kv, scale, ob, scores);
                });
                return;
            }
            k.gather(image, cols.clone(), (m, d), keys);
            v.gather(image, cols.clone(), (m, d), values);
            chunks(&mut |q, ob, scores| {
                scores.resize(ROWS * KEYS, 0.0);
                for (block, ob) in ob.chunks_mut(ROWS * d).enumerate() {
                    let rows = ob.len() / d;
                    let q = View {
                        data: &q.data[block * ROWS * q.row_stride..],
                        rows,
                        ..q
                    };
                    attend_block(Block { q, keys, values, scale }, ob, scores);
                }
            });
        });
        o
    });
    if stopped.load(Ordering::Relaxed) {
        stop.check()?;
        candle_core::bail!("attention: interrupted");
    }
    // Head by head into their columns: chunk `i` is head `i % heads` of token `i / heads`.
    let out = par_init(b * n * width, d, |i, o| {
        let (row, head) = (i / heads, i % heads);
        let (image, token) = (row / n, row % n);
        o.write_copy_of_slice(&per_head[((image * heads + head) * n + token) * d..][..d])
    });
    Tensor::from_vec(out, (b, n, width), &candle_core::Device::Cpu)
}

/// One kernel's work on a chunk of query rows: the rows, their output and the scores scratch.
type AttendChunk<'a> = dyn FnMut(View<'_>, &mut [f32], &mut Vec<f32>) + 'a;

/// Multiply-adds of scores between two checks of the caller's interrupt: 2^27, about
/// 10 ms of one core's work.
const CHECK_WORK: usize = 1 << 27;

/// Query rows of one head between two checks of the interrupt for `m` keys of `d` columns:
/// about [`CHECK_WORK`] multiply-adds, in whole blocks of the kernels' rows (192, the tiled
/// kernel's cache block, or 6, its register block, at least).
fn rows_per_check(m: usize, d: usize) -> usize {
    let rows = CHECK_WORK / (m * d).max(1);
    if rows >= 192 {
        rows / 192 * 192
    } else {
        rows.max(1).div_ceil(6) * 6
    }
}

/// `x` itself when each of its rows is adjacent in memory, else a contiguous copy.
fn rows_adjacent(x: &Tensor) -> Result<Tensor> {
    if x.stride()[2] == 1 {
        Ok(x.clone())
    } else {
        x.contiguous()
    }
}

/// Whether this CPU has the instructions the AVX-512 kernels need.
fn avx512_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `2^x` for `x ≤ 0` in the lanes of `mask`, zero in the others: `x = n + f` with `n`
/// whole and `|f| ≤ 1/2`, a degree-6 polynomial for `2^f` (fitted for relative error,
/// within 1e-7), scaled by `2^n` with `vscalefps`, which also gives 0 below the smallest
/// float. `x` must not be -∞ or NaN.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn exp2_masked(x: std::arch::x86_64::__m512, mask: std::arch::x86_64::__mmask16) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(1.535_336_2e-4);
    for coefficient in [
        1.339_887_5e-3,
        9.618_437e-3,
        5.550_332_4e-2,
        2.402_264_8e-1,
        6.931_472e-1,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(coefficient));
    }
    _mm512_maskz_scalef_ps(mask, p, n)
}

/// A worker's buffers, reused across tasks and calls.
#[derive(Default)]
struct Scratch {
    /// One head's keys, `m × d` (transposed and padded for the AVX-512 kernels).
    keys: Vec<f32>,
    /// One head's values, laid out as the keys.
    values: Vec<f32>,
    /// A block's scores, `ROWS × KEYS` (the tiled kernel's running state).
    scores: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { keys: Vec::new(), values: Vec::new(), scores: Vec::new() })
    };
}

/// One of `q`, `k`, `v`: `[b, tokens, heads·d]` with adjacent elements in each row.
struct Heads<'a> {
    data: &'a [f32],
    /// Rows (tokens) per image.
    rows: usize,
    image_stride: usize,
    row_stride: usize,
}

impl<'a> Heads<'a> {
    fn new(x: &'a CpuF32<'_>) -> Self {
        let strides = x.strides();
        Heads {
            data: x.data(),
            rows: x.dims()[1],
            image_stride: strides[0],
            row_stride: strides[1],
        }
    }

    /// Copies columns `cols` of `image`'s rows into `into`, row-major `rows × width` and
    /// zero past the columns and the tensor's rows (`rows` and `width` at least theirs).
    fn gather(&self, image: usize, cols: std::ops::Range<usize>, (rows, width): (usize, usize), into: &mut Vec<f32>) {
        into.clear();
        into.resize(rows * width, 0.0);
        for (row, to) in into.chunks_exact_mut(width).take(self.rows).enumerate() {
            to[..cols.len()]
                .copy_from_slice(&self.data[image * self.image_stride + row * self.row_stride..][cols.clone()]);
        }
    }

    /// Copies columns `cols` of `image`'s rows into `into` transposed in blocks of `block`
    /// rows, `rows / block` blocks of `width × block` (column `c` of row `j` at
    /// `(j / block) · width · block + c · block + j % block`), zero past the columns and the
    /// tensor's rows. `rows` must be a multiple of `block`.
    fn gather_transposed(
        &self,
        image: usize,
        cols: std::ops::Range<usize>,
        (rows, width): (usize, usize),
        block: usize,
        into: &mut Vec<f32>,
    ) {
        into.clear();
        into.resize(width * rows, 0.0);
        for row in 0..self.rows {
            let src = &self.data[image * self.image_stride + row * self.row_stride..][cols.clone()];
            let to = &mut into[(row / block) * width * block + row % block..];
            for (c, &x) in src.iter().enumerate() {
                to[c * block] = x;
            }
        }
    }

    /// Rows `first..first + rows` of `image`, columns `cols`.
    fn view(&self, image: usize, first: usize, rows: usize, cols: std::ops::Range<usize>) -> View<'a> {
        View {
            data: &self.data[image * self.image_stride + first * self.row_stride + cols.start..],
            rows,
            cols: cols.len(),
            row_stride: self.row_stride,
            col_stride: 1,
        }
    }
}

/// A block of query rows of one head, and that head's keys and values (`m × d` each).
struct Block<'a> {
    q: View<'a>,
    keys: &'a [f32],
    values: &'a [f32],
    scale: f32,
}

/// `o[rows × d] = softmax(q · kᵀ · scale) · v`, [`KEYS`] keys at a time with a running
/// softmax: each row keeps its largest score so far and the sum of its numerators; when a
/// later block raises the maximum, the row's partial output and sum are scaled down by
/// `exp(old − new)`. `scores` is the `ROWS × KEYS` scratch.
fn attend_block(b: Block<'_>, o: &mut [f32], scores: &mut [f32]) {
    let (rows, d) = (b.q.rows, b.q.cols);
    let m = b.keys.len() / d.max(1);
    let mut maxes = [f32::NEG_INFINITY; ROWS];
    let mut sums = [0f32; ROWS];
    for first in (0..m).step_by(KEYS) {
        let count = KEYS.min(m - first);
        let scores = &mut scores[..rows * count];
        let keys = View::rows(&b.keys[first * d..], count, d);
        matmul(scores, count, b.q, keys.t(), b.scale, false, false);
        for (r, row) in scores.chunks_exact_mut(count).enumerate() {
            let (max, sum) = softmax_numerators(row, maxes[r]);
            if maxes[r] != f32::NEG_INFINITY && max > maxes[r] {
                let factor = exp(maxes[r] - max);
                sums[r] *= factor;
                o[r * d..][..d].iter_mut().for_each(|x| *x *= factor);
            }
            maxes[r] = max;
            sums[r] += sum;
        }
        let values = View::rows(&b.values[first * d..], count, d);
        matmul(o, d, View::rows(scores, rows, count), values, 1.0, first > 0, false);
    }
    for (row, sum) in o.chunks_exact_mut(d).zip(sums) {
        let inverse = 1.0 / sum;
        row.iter_mut().for_each(|x| *x *= inverse);
    }
}

/// Replaces `row` by `exp(row - max)` where `max` is the larger of `floor` and the row's
/// largest element; returns `max` and the sum.
fn softmax_numerators(row: &mut [f32], floor: f32) -> (f32, f32) {
    simd::run(SoftmaxNumerators { row, floor })
}

/// [`softmax_numerators`] as a [`Kernel`].
struct SoftmaxNumerators<'a> {
    row: &'a mut [f32],
    floor: f32,
}

impl Kernel for SoftmaxNumerators<'_> {
    type Output = (f32, f32);

    #[inline(always)]
    fn run(self) -> (f32, f32) {
        let row = self.row;
        let mut maxes = [self.floor; LANES];
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
        (max, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Isa;
    use candle_core::Device;

    /// Head by head with candle's matmul and softmax.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize, scale: f64) -> Tensor {
        let d = q.dim(2).unwrap() / heads;
        let outs: Vec<Tensor> = (0..heads)
            .map(|h| {
                let (qh, kh, vh) = (
                    q.narrow(2, h * d, d).unwrap().contiguous().unwrap(),
                    k.narrow(2, h * d, d).unwrap().contiguous().unwrap(),
                    v.narrow(2, h * d, d).unwrap().contiguous().unwrap(),
                );
                let scores = (qh.matmul(&kh.t().unwrap()).unwrap() * scale).unwrap();
                candle_nn::ops::softmax_last_dim(&scores).unwrap().matmul(&vh).unwrap()
            })
            .collect();
        Tensor::cat(&outs, 2).unwrap()
    }

    /// Every instruction set this CPU has gives the portable loop's numerators and sum.
    #[test]
    fn softmax_variants_agree() {
        let row: Vec<f32> = (0..1003).map(|i| ((i * 7919) % 1000) as f32 * 0.013 - 6.0).collect();
        let mut want = row.clone();
        fn numerators(row: &mut [f32], floor: f32) -> SoftmaxNumerators<'_> {
            SoftmaxNumerators { row, floor }
        }
        let (want_max, want_sum) = simd::run_on(Isa::Portable, numerators(&mut want, f32::NEG_INFINITY));
        assert_eq!(want_max, row.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        for isa in Isa::available() {
            let mut got = row.clone();
            let (max, sum) = simd::run_on(isa, numerators(&mut got, f32::NEG_INFINITY));
            assert_eq!(max, want_max);
            assert!(
                (sum - want_sum).abs() <= 1e-5 * want_sum,
                "{isa:?}: {sum} vs {want_sum}"
            );
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-6 * w.max(1e-30), "{isa:?}: {g} vs {w}");
            }
        }
        // A floor above every element is the maximum used.
        let mut floored = row.clone();
        let (max, _) = simd::run(numerators(&mut floored, 100.0));
        assert_eq!(max, 100.0);
        assert!((floored[0] - exp(row[0] - 100.0)).abs() <= 1e-6 * floored[0]);
    }

    #[test]
    fn fused_attention_equals_matmul_softmax_matmul() {
        let dev = Device::Cpu;
        // Odd sizes: a partial row block, a row length that is not a multiple of the lanes.
        // On AVX-512 CPUs, heads of 1 to 8 columns take the narrow kernel, 9 to 64 the tiled
        // one (whole and partial vectors, blocks of keys and of query rows), wider the
        // general path.
        for &(b, heads, n, m, d) in &[
            (3, 2, 130, 77, 40),
            (2, 1, 64, 64, 4),
            (1, 3, 5, 300, 8),
            (2, 8, 257, 257, 1),
            (1, 2, 400, 129, 16),
            (2, 1, 7, 1, 24),
            (1, 1, 193, 64, 64),
            (1, 2, 33, 65, 9),
            (1, 1, 20, 40, 72),
        ] {
            let q = Tensor::randn(0f32, 1.0, (b, n, heads * d), &dev).unwrap();
            let k = Tensor::randn(0f32, 1.0, (b, m, heads * d), &dev).unwrap();
            let v = Tensor::randn(0f32, 1.0, (b, m, heads * d), &dev).unwrap();
            let scale = 1.0 / (d as f64).sqrt();
            let got = attention(&q, &k, &v, heads, scale, Interrupt::NEVER).unwrap();
            let want = reference(&q, &k, &v, heads, scale);
            assert_eq!(got.dims(), want.dims());
            let diff = crate::max_abs_diff(&got, &want);
            assert!(diff < 1e-5, "{b} {heads} {n} {m} {d}: {diff}");
        }
    }

    #[test]
    fn heads_are_read_from_columns_of_a_stacked_projection() {
        let dev = Device::Cpu;
        let (heads, d) = (4, 6);
        let qkv = Tensor::randn(0f32, 1.0, (2, 70, 3 * heads * d), &dev).unwrap();
        let part = |i: usize| qkv.narrow(2, i * heads * d, heads * d).unwrap();
        let (q, k, v) = (part(0), part(1), part(2));
        assert!(!q.is_contiguous());
        let got = attention(&q, &k, &v, heads, 0.3, Interrupt::NEVER).unwrap();
        let want = reference(&q, &k, &v, heads, 0.3);
        assert!(crate::max_abs_diff(&got, &want) < 1e-5);
    }

    #[test]
    fn large_scores_do_not_overflow() {
        let dev = Device::Cpu;
        // A head for the general path, the tiled kernel and the narrow one.
        for width in [80, 16, 4] {
            let q = (Tensor::randn(0f32, 1.0, (1, 9, width), &dev).unwrap() * 100.0).unwrap();
            let k = (Tensor::randn(0f32, 1.0, (1, 33, width), &dev).unwrap() * 100.0).unwrap();
            let v = Tensor::randn(0f32, 1.0, (1, 33, width), &dev).unwrap();
            let got = attention(&q, &k, &v, 1, 1.0, Interrupt::NEVER).unwrap();
            let want = reference(&q, &k, &v, 1, 1.0);
            let diff = crate::max_abs_diff(&got, &want);
            assert!(diff < 1e-4, "width {width}: {diff}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp2_is_within_two_ulp_and_masked_lanes_are_zero() {
        if !avx512_available() {
            return;
        }
        // SAFETY: the CPU has AVX-512F (checked above).
        let (worst, masked) = unsafe { worst_exp2_error() };
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(masked, [0.0; 8]);
    }

    /// The worst relative error of `exp2_masked` over [-126, 0], and the upper half of one
    /// result masked to the lower eight lanes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn worst_exp2_error() -> (f64, [f32; 8]) {
        use std::arch::x86_64::*;
        let mut worst = 0f64;
        let mut lanes = [0f32; LANES];
        for i in 0..100_000 {
            let x: [f32; LANES] = std::array::from_fn(|l| -126.0 * ((i * LANES + l) as f32 / (100_000 * LANES) as f32));
            // SAFETY: both arrays hold `LANES` floats.
            unsafe {
                let got = exp2_masked(_mm512_loadu_ps(x.as_ptr()), !0);
                _mm512_storeu_ps(lanes.as_mut_ptr(), got);
            }
            for (&got, &x) in lanes.iter().zip(&x) {
                let want = (x as f64).exp2();
                worst = worst.max(((got as f64 - want) / want).abs());
            }
        }
        // SAFETY: as above.
        unsafe {
            let got = exp2_masked(_mm512_set1_ps(-1.5), 0x00ff);
            _mm512_storeu_ps(lanes.as_mut_ptr(), got);
        }
        (worst, lanes[8..].try_into().unwrap())
    }

    #[test]
    fn mismatched_shapes_are_an_error_not_a_panic() {
        let dev = Device::Cpu;
        let q = Tensor::zeros((2, 4, 8), DType::F32, &dev).unwrap();
        let k = Tensor::zeros((2, 5, 8), DType::F32, &dev).unwrap();
        let v = Tensor::zeros((2, 6, 8), DType::F32, &dev).unwrap();
        assert!(attention(&q, &k, &v, 2, 1.0, Interrupt::NEVER).is_err());
        assert!(attention(&q, &k, &k, 3, 1.0, Interrupt::NEVER).is_err());
        assert!(attention(&q, &k, &k, 0, 1.0, Interrupt::NEVER).is_err());
    }

    #[test]
    fn an_interrupt_stops_attention_between_query_blocks() {
        let dev = Device::Cpu;
        for d in [4, 40, 80] {
            let q = Tensor::randn(0f32, 1.0, (1, 2000, 2 * d), &dev).unwrap();
            let asked = std::sync::atomic::AtomicUsize::new(0);
            let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1;
            let stopped = attention(&q, &q, &q, 2, 0.1, Interrupt::new(&stop));
            assert!(stopped.is_err(), "heads of {d} columns ran on");
            assert!(attention(&q, &q, &q, 2, 0.1, Interrupt::NEVER).is_ok());
        }
        assert_eq!(rows_per_check(4096, 40), 768);
        assert_eq!(rows_per_check(4 << 20, 4), 12);
        assert_eq!(rows_per_check(1 << 30, 512), 6);
    }
}
