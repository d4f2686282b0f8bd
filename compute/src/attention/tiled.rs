//! Attention for heads wider than the narrow kernel's and at most [`MAX_WIDTH`] columns
//! (SD1's 64×64 level: 40) on AVX-512 CPUs.
//!
//! A matrix product per block of scores packs its operands on every call, and with 40
//! columns that packing, the score block's trip through memory and the separate softmax
//! pass cost about as much as the arithmetic. Here six query rows meet 64 keys at a time in
//! registers: their 6 × 64 scores are 24 accumulators filled by one rank-1 update per
//! column, become probabilities in place (in powers of two, a running maximum per row as
//! in flash attention), and are weighted into the rows' outputs, also held in registers for
//! the block. Blocks of [`BLOCK_ROWS`] query rows take turns on each 64-key block, so the
//! keys and values of a block are read from L1 by all of them.

use super::LANES;
use crate::matmul::View;

/// Heads at most this wide can run here.
pub(super) const MAX_WIDTH: usize = 64;

/// Keys per block: four vectors of scores per query row.
pub(super) const KEYS: usize = 64;

/// Query rows per register tile.
const ROWS: usize = 6;

/// Query rows that take turns on each block of keys (their running state, 50 KiB for 40
/// columns, stays in L2).
const BLOCK_ROWS: usize = 32 * ROWS;

/// `d` rounded up to whole vectors: the row length of [`Tiled::values`].
pub(super) fn padded_width(d: usize) -> usize {
    d.div_ceil(LANES) * LANES
}

/// `m` keys rounded up to whole blocks.
pub(super) fn padded_keys(m: usize) -> usize {
    m.div_ceil(KEYS) * KEYS
}

/// One head's keys and values for the kernel, zero past the head's `m` keys and `d`
/// columns: `keys` transposed block by block, `padded_keys(m) / KEYS` blocks of `d × KEYS`
/// (column `c` of key `j` at `(j / KEYS) · d · KEYS + c · KEYS + j % KEYS`: a block's keys
/// are adjacent, and its columns do not compete for the same cache sets); `values`
/// row-major, `padded_keys(m) × padded_width(d)`.
pub(super) struct Tiled<'a> {
    /// The keys.
    pub keys: &'a [f32],
    /// The values.
    pub values: &'a [f32],
    /// How many keys there are (at least one).
    pub m: usize,
}

/// `o[rows × d] = softmax(q · kᵀ · scale) · v` for the head `q` (`rows × d`, `d ≤`
/// [`MAX_WIDTH`]); `state` is scratch space. Panics unless AVX-512 is
/// [`available`](super::avx512_available); `kv` must be laid out as its doc says.
pub(super) fn attend(q: View<'_>, kv: Tiled<'_>, scale: f32, o: &mut [f32], state: &mut Vec<f32>) {
    assert!(super::avx512_available(), "the tiled attention kernel needs AVX-512");
    let (d, padded) = (q.cols, padded_keys(kv.m));
    assert!(d <= MAX_WIDTH && kv.m > 0 && o.len() == q.rows * d);
    assert!(kv.keys.len() == d * padded && kv.values.len() == padded * padded_width(d));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F (asserted); the lengths were checked.
    unsafe {
        match padded_width(d) / LANES {
            1 => avx512::attend::<1>(q, kv, scale, o, state),
            2 => avx512::attend::<2>(q, kv, scale, o, state),
            3 => avx512::attend::<3>(q, kv, scale, o, state),
            _ => avx512::attend::<4>(q, kv, scale, o, state),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{padded_keys, Tiled, BLOCK_ROWS, KEYS, LANES, ROWS};
    use crate::attention::exp2_masked;
    use crate::matmul::View;

    /// Vectors of scores per query row in a block.
    const KEY_VECTORS: usize = KEYS / LANES;

    /// The running state of a block's query rows.
    struct Rows<'a> {
        /// Queries times the scale and log2(e), `d` per row, zero past the last row.
        queries: &'a [f32],
        /// Weighted sums of values so far, `NV · LANES` per row.
        outs: &'a mut [f32],
        /// Sums of the weights so far, a vector of partial sums per row.
        sums: &'a mut [f32],
        /// Largest score so far per row (in powers of two).
        maxes: &'a mut [f32],
    }

    /// [`super::attend`] for heads padded to `NV` vectors.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `kv` and `o` must have the lengths `super::attend`
    /// checks.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn attend<const NV: usize>(
        q: View<'_>,
        kv: Tiled<'_>,
        scale: f32,
        o: &mut [f32],
        state: &mut Vec<f32>,
    ) {
        let d = q.cols;
        let width = NV * LANES;
        let padded = padded_keys(kv.m);
        let factor = scale * std::f32::consts::LOG2_E;
        for first in (0..q.rows).step_by(BLOCK_ROWS) {
            let rows = BLOCK_ROWS.min(q.rows - first);
            let tiles = rows.div_ceil(ROWS);
            let slots = tiles * ROWS;
            state.clear();
            state.resize(slots * (d + width + LANES + 1), 0.0);
            let (queries, rest) = state.split_at_mut(slots * d);
            let (outs, rest) = rest.split_at_mut(slots * width);
            let (sums, maxes) = rest.split_at_mut(slots * LANES);
            maxes.fill(f32::NEG_INFINITY);
            for (r, query) in queries.chunks_exact_mut(d).take(rows).enumerate() {
                let row = &q.data[(first + r) * q.row_stride..][..d];
                query.iter_mut().zip(row).for_each(|(to, &x)| *to = x * factor);
            }
            let mut state = Rows {
                queries,
                outs,
                sums,
                maxes,
            };
            for block in 0..padded / KEYS {
                let valid = (kv.m - block * KEYS).min(KEYS);
                let masks: [__mmask16; KEY_VECTORS] = std::array::from_fn(|v| {
                    let lanes = valid.saturating_sub(v * LANES).min(LANES);
                    ((1u32 << lanes) - 1) as __mmask16
                });
                // SAFETY: block `block` of the keys and of the `padded × width` values.
                let (keys, values) = unsafe {
                    (
                        kv.keys.as_ptr().add(block * d * KEYS),
                        kv.values.as_ptr().add(block * KEYS * width),
                    )
                };
                for tile in 0..tiles {
                    // SAFETY: `keys` and `values` point at a whole block, as `tile` needs.
                    unsafe { self::tile::<NV>(&mut state, tile, d, (keys, values), valid, masks) };
                }
            }
            for r in 0..rows {
                let sum: f32 = state.sums[r * LANES..][..LANES].iter().sum();
                let inverse = 1.0 / sum;
                let out = &state.outs[r * width..][..d];
                let to = &mut o[(first + r) * d..][..d];
                to.iter_mut().zip(out).for_each(|(to, &x)| *to = x * inverse);
            }
        }
    }

    /// One tile of [`ROWS`] query rows against one block of keys: `keys` points at the
    /// block's keys (`d × KEYS`, transposed), `values` at its first value row (`NV`
    /// vectors long); `valid` of the block's keys exist, the lanes of `masks`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `keys` must reach `d` columns of [`KEYS`] floats and
    /// `values` [`KEYS`] rows.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const NV: usize>(
        state: &mut Rows<'_>,
        tile: usize,
        d: usize,
        (keys, values): (*const f32, *const f32),
        valid: usize,
        masks: [__mmask16; KEY_VECTORS],
    ) {
        let width = NV * LANES;
        let queries = state.queries[tile * ROWS * d..][..ROWS * d].as_ptr();
        // Scores: one rank-1 update per column.
        let mut scores = [[_mm512_setzero_ps(); KEY_VECTORS]; ROWS];
        for c in 0..d {
            // SAFETY: column `c < d` of the block.
            let key: [__m512; KEY_VECTORS] =
                std::array::from_fn(|v| unsafe { _mm512_loadu_ps(keys.add(c * KEYS + v * LANES)) });
            for (r, row) in scores.iter_mut().enumerate() {
                // SAFETY: row `r < ROWS`, column `c < d` of the tile's queries.
                let query = _mm512_set1_ps(unsafe { *queries.add(r * d + c) });
                for (s, key) in row.iter_mut().zip(&key) {
                    *s = _mm512_fmadd_ps(query, *key, *s);
                }
            }
        }
        // Probabilities against each row's running maximum; a raised maximum scales the
        // row's sums so far down.
        let mut weights = [[0f32; KEYS]; ROWS];
        for (r, (row, weights)) in scores.iter().zip(&mut weights).enumerate() {
            let slot = tile * ROWS + r;
            let mut top = _mm512_set1_ps(f32::NEG_INFINITY);
            for (s, &mask) in row.iter().zip(&masks) {
                top = _mm512_mask_max_ps(top, mask, top, *s);
            }
            let top = _mm512_reduce_max_ps(top);
            let old = state.maxes[slot];
            let out = &mut state.outs[slot * width..][..width];
            let sums = &mut state.sums[slot * LANES..][..LANES];
            if top > old {
                let shrink = (old - top).exp2();
                out.iter_mut().chain(sums.iter_mut()).for_each(|x| *x *= shrink);
                state.maxes[slot] = top;
            }
            let minus_max = _mm512_set1_ps(-state.maxes[slot]);
            // SAFETY: `sums` holds `LANES` floats, `weights` `KEYS`.
            unsafe {
                let mut sum = _mm512_loadu_ps(sums.as_ptr());
                for (v, (s, &mask)) in row.iter().zip(&masks).enumerate() {
                    let p = exp2_masked(_mm512_add_ps(*s, minus_max), mask);
                    sum = _mm512_add_ps(sum, p);
                    _mm512_storeu_ps(weights.as_mut_ptr().add(v * LANES), p);
                }
                _mm512_storeu_ps(sums.as_mut_ptr(), sum);
            }
        }
        // Weighted values: one rank-1 update per key.
        let outs = &mut state.outs[tile * ROWS * width..][..ROWS * width];
        // SAFETY: `outs` holds `ROWS` rows of `NV` vectors.
        let mut acc: [[__m512; NV]; ROWS] = std::array::from_fn(|r| {
            std::array::from_fn(|v| unsafe { _mm512_loadu_ps(outs.as_ptr().add(r * width + v * LANES)) })
        });
        for key in 0..valid.min(KEYS) {
            // SAFETY: row `key < KEYS` of the block's values.
            let value: [__m512; NV] =
                std::array::from_fn(|v| unsafe { _mm512_loadu_ps(values.add(key * width + v * LANES)) });
            for (row, weights) in acc.iter_mut().zip(&weights) {
                // SAFETY: `key < KEYS`.
                let weight = _mm512_set1_ps(unsafe { *weights.get_unchecked(key) });
                for (a, value) in row.iter_mut().zip(&value) {
                    *a = _mm512_fmadd_ps(weight, *value, *a);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, a) in row.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(outs.as_mut_ptr().add(r * width + v * LANES), *a) };
            }
        }
    }
}
