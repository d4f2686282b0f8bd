//! Attention for heads of at most [`MAX_WIDTH`] columns (the tiny test UNet's are 4 wide).
//!
//! With so few columns a matrix product per block of scores spends its time packing, and
//! the softmax's `exp` is most of the work. Here each pair of query rows walks the head's
//! keys sixteen at a time in AVX-512 lanes: a first pass finds each row's largest score, a
//! second computes the scores again (in powers of two, less the maximum), their `exp2`
//! (with `vscalefps`, 9 instructions for sixteen values) and the weighted sum of the values.
//! No score is stored. Other CPUs take the general path.

use super::LANES;
use crate::matmul::View;

/// Heads at most this wide can run here.
pub(super) const MAX_WIDTH: usize = 8;

/// The columns a head of width `d` is padded to: 4 or [`MAX_WIDTH`].
pub(super) fn padded_width(d: usize) -> usize {
    if d <= 4 {
        4
    } else {
        MAX_WIDTH
    }
}

/// `m` keys rounded up to whole vectors.
pub(super) fn padded_keys(m: usize) -> usize {
    m.div_ceil(LANES) * LANES
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
/// [`MAX_WIDTH`]). Panics unless AVX-512 is [`available`](super::avx512_available); `kv` must be laid out as its doc says.
pub(super) fn attend(q: View<'_>, kv: Transposed<'_>, scale: f32, o: &mut [f32]) {
    assert!(super::avx512_available(), "the narrow attention kernel needs AVX-512");
    assert!(q.cols <= MAX_WIDTH && kv.m > 0 && o.len() == q.rows * q.cols);
    #[cfg(target_arch = "x86_64")]
    {
        let width = padded_width(q.cols);
        let padded = padded_keys(kv.m);
        assert!(kv.keys.len() == width * padded && kv.values.len() == width * padded);
        // SAFETY: `avx512_available` checked that the CPU has AVX-512F; the lengths were checked.
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
    use crate::attention::exp2_masked;
    use crate::matmul::View;

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
        let padded = super::padded_keys(kv.m);
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
}
