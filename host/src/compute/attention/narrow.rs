//! Attention for heads of at most [`MAX_WIDTH`] columns (the tiny test UNet's are 4 wide).
//!
//! With so few columns a matrix product per block of scores spends its time packing, and
//! the softmax's `exp` is most of the work. Here each pair of query rows walks the head's
//! keys sixteen at a time in AVX-512 lanes: a first pass finds each row's largest score, a
//! second computes the scores again (in powers of two, less the maximum), their `exp2`
//! (with `vscalefps`, 9 instructions for sixteen values) and the weighted sum of the values.
//! No score is stored. Other CPUs take the general path.

use crate::compute::matmul::View;

/// Heads at most this wide can run here.
pub(super) const MAX_WIDTH: usize = 8;

/// Keys per vector.
pub(super) const LANES: usize = 16;

/// Whether this CPU has the instructions the kernel needs.
pub(super) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The columns a head of width `d` is padded to: 4 or [`MAX_WIDTH`].
pub(super) fn padded_width(d: usize) -> usize {
    if d <= 4 {
        4
    } else {
        MAX_WIDTH
    }
}

/// One head's keys and values, each transposed to `width × padded`: column `c` of key `j`
/// at `c * padded + j`, zero beyond the head's columns and its `m` keys; `padded` is `m`
/// rounded up to whole vectors and `width` is [`padded_width`] of the head's.
pub(super) struct Transposed<'a> {
    /// The keys.
    pub keys: &'a [f32],
    /// The values.
    pub values: &'a [f32],
    /// How many keys there are (at least one).
    pub m: usize,
}

/// `o[rows × d] = softmax(q · kᵀ · scale) · v` for the head `q` (`rows × d`, `d ≤`
/// [`MAX_WIDTH`]). Panics unless [`available`]; `kv` must be laid out as its doc says.
pub(super) fn attend(q: View<'_>, kv: Transposed<'_>, scale: f32, o: &mut [f32]) {
    assert!(available(), "the narrow attention kernel needs AVX-512");
    assert!(q.cols <= MAX_WIDTH && kv.m > 0 && o.len() == q.rows * q.cols);
    #[cfg(target_arch = "x86_64")]
    {
        let width = padded_width(q.cols);
        let padded = kv.m.div_ceil(LANES) * LANES;
        assert!(kv.keys.len() == width * padded && kv.values.len() == width * padded);
        // SAFETY: `available` checked that the CPU has AVX-512F; the lengths were checked.
        unsafe {
            match width {
                4 => avx512::attend::<4>(q, kv, scale, o),
                _ => avx512::attend::<MAX_WIDTH>(q, kv, scale, o),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Transposed, LANES};
    use crate::compute::matmul::View;

    /// Query rows that share each load of keys and values.
    const ROWS: usize = 2;

    /// [`super::attend`] for heads padded to `D` columns.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `kv` must hold `D × padded` values each, `padded` being
    /// `kv.m` rounded up to a multiple of [`LANES`], and `o` `q.rows × q.cols`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn attend<const D: usize>(q: View<'_>, kv: Transposed<'_>, scale: f32, o: &mut [f32]) {
        let d = q.cols;
        let padded = kv.m.div_ceil(LANES) * LANES;
        let vectors = padded / LANES;
        // Lanes of the last vector past the last key take no part.
        let valid = kv.m - (vectors - 1) * LANES;
        let tail: __mmask16 = if valid == LANES { !0 } else { (1 << valid) - 1 };
        let (keys, values) = (kv.keys.as_ptr(), kv.values.as_ptr());
        for first in (0..q.rows).step_by(ROWS) {
            // The rows' queries times the scale and log2(e) (so that the scores come out in
            // powers of two), broadcast, zero past `d`; a missing last row repeats the one
            // before and is not written.
            let mut queries = [[_mm512_setzero_ps(); D]; ROWS];
            for (r, query) in queries.iter_mut().enumerate() {
                let row = (first + r).min(q.rows - 1);
                for (c, &x) in q.data[row * q.row_stride..][..d].iter().enumerate() {
                    query[c] = _mm512_set1_ps(x * scale * std::f32::consts::LOG2_E);
                }
            }
            // Each row's scores against keys `v·LANES ..`, plus `start`.
            let scores = |v: usize, start: [__m512; ROWS]| -> [__m512; ROWS] {
                let mut scores = start;
                for c in 0..D {
                    // SAFETY: vector `v < vectors` of column `c < D` lies within the
                    // `D × padded` keys.
                    let key = unsafe { _mm512_loadu_ps(keys.add(c * padded + v * LANES)) };
                    for (s, query) in scores.iter_mut().zip(&queries) {
                        *s = _mm512_fmadd_ps(query[c], key, *s);
                    }
                }
                scores
            };
            let mut maxes = [_mm512_set1_ps(f32::NEG_INFINITY); ROWS];
            for v in 0..vectors {
                let mask = if v + 1 == vectors { tail } else { !0 };
                for (max, s) in maxes.iter_mut().zip(scores(v, [_mm512_setzero_ps(); ROWS])) {
                    *max = _mm512_mask_max_ps(*max, mask, *max, s);
                }
            }
            let minus_maxes = maxes.map(|m| _mm512_set1_ps(-_mm512_reduce_max_ps(m)));
            let mut sums = [_mm512_setzero_ps(); ROWS];
            let mut outs = [[_mm512_setzero_ps(); D]; ROWS];
            for v in 0..vectors {
                let mask = if v + 1 == vectors { tail } else { !0 };
                let mut value = [_mm512_setzero_ps(); D];
                for (c, value) in value.iter_mut().enumerate() {
                    // SAFETY: as for the keys.
                    *value = unsafe { _mm512_loadu_ps(values.add(c * padded + v * LANES)) };
                }
                let rows = sums.iter_mut().zip(&mut outs);
                for ((sum, out), s) in rows.zip(scores(v, minus_maxes)) {
                    let p = exp2_masked(s, mask);
                    *sum = _mm512_add_ps(*sum, p);
                    for (o, value) in out.iter_mut().zip(&value) {
                        *o = _mm512_fmadd_ps(p, *value, *o);
                    }
                }
            }
            for r in 0..ROWS.min(q.rows - first) {
                let inverse = 1.0 / _mm512_reduce_add_ps(sums[r]);
                for (x, out) in o[(first + r) * d..][..d].iter_mut().zip(&outs[r]) {
                    *x = _mm512_reduce_add_ps(*out) * inverse;
                }
            }
        }
    }

    /// `2^x` for `x ≤ 0` in the lanes of `mask`, zero in the others: `x = n + f` with `n`
    /// whole and `|f| ≤ 1/2`, a degree-6 polynomial for `2^f` (fitted for relative error,
    /// within 1e-7), scaled by `2^n` with `vscalefps`, which also gives 0 below the smallest
    /// float. `x` must not be -∞ or NaN.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) fn exp2_masked(x: __m512, mask: __mmask16) -> __m512 {
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
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn exp2_is_within_two_ulp_and_masked_lanes_are_zero() {
        if !available() {
            return;
        }
        // SAFETY: the CPU has AVX-512F (checked above).
        let (worst, masked) = unsafe { worst_exp2_error() };
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(masked, [0.0; 8]);
    }

    /// The worst relative error of `exp2_masked` over [-126, 0], and the upper half of one
    /// result masked to the lower eight lanes.
    #[target_feature(enable = "avx512f")]
    unsafe fn worst_exp2_error() -> (f64, [f32; 8]) {
        use std::arch::x86_64::*;
        let mut worst = 0f64;
        let mut lanes = [0f32; LANES];
        for i in 0..100_000 {
            let x: [f32; LANES] = std::array::from_fn(|l| -126.0 * ((i * LANES + l) as f32 / (100_000 * LANES) as f32));
            // SAFETY: both arrays hold `LANES` floats.
            unsafe {
                let got = avx512::exp2_masked(_mm512_loadu_ps(x.as_ptr()), !0);
                _mm512_storeu_ps(lanes.as_mut_ptr(), got);
            }
            for (&got, &x) in lanes.iter().zip(&x) {
                let want = (x as f64).exp2();
                worst = worst.max(((got as f64 - want) / want).abs());
            }
        }
        // SAFETY: as above.
        unsafe {
            let got = avx512::exp2_masked(_mm512_set1_ps(-1.5), 0x00ff);
            _mm512_storeu_ps(lanes.as_mut_ptr(), got);
        }
        (worst, lanes[8..].try_into().unwrap())
    }
}
