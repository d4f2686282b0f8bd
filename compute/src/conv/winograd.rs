//! 3×3, stride-1, padding-1 convolutions by Winograd's minimal filtering F(2×2, 3×3)
//! (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2015).
//!
//! Each 2×2 block of output pixels (a tile) comes from the 4×4 input patch around it. In the
//! Winograd domain, patch `d` becomes `Bᵀ d B` and filter `g` becomes `G g Gᵀ` (both 4×4),
//! their element-wise product summed over input channels is 16 matrix products (one per
//! point of the 4×4 domain: output channels × input channels times input channels × tiles),
//! and `Aᵀ m A` turns each tile's 16 sums back into its 2×2 pixels. That is 16
//! multiplications per tile and channel pair where the direct convolution needs 36: the
//! products do 4/9 of the direct arithmetic, at the cost of three passes over memory (the
//! transforms) that a direct convolution does not make. The transforms use only additions and
//! halvings, so the results stay within float rounding of the direct ones.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use crate::interrupt::Interrupt;
use crate::matmul::{matmul, View};
use crate::with_buffer;

/// Points of the Winograd domain: a 4×4 patch per tile.
const POINTS: usize = 16;

/// Output pixels per image from which the transforms pay for themselves. Measured on SD1's
/// shapes (2 threads, AVX-512): 16×16 planes take 40-45% less time than with the direct
/// AVX-512 kernel this replaced, 8×8 ones twice the time of the column-matrix product
/// (transforming 1280×1280 filters alone takes as long as that product).
const MIN_POSITIONS: usize = 16 * 16;

/// Floats of transformed inputs (or products) per pass over a batch's tiles: larger images
/// (the VAE decoder's 512×512 planes would need 1 GiB) go in several passes.
const MAX_BUFFERED: usize = 16 << 20;

/// Whether [`accumulate`] handles a `kernel` convolution with `stride` and `padding` of
/// `input` (`h × w`) planes.
pub(super) fn applies(input: (usize, usize), kernel: (usize, usize), stride: usize, padding: usize) -> bool {
    kernel == (3, 3) && stride == 1 && padding == 1 && input.0 * input.1 >= MIN_POSITIONS
}

/// A thread's buffers, kept between calls (SD1's largest, its 2560→1280 filters in the
/// Winograd domain, is 210 MB).
#[derive(Default)]
struct Buffers {
    /// The transformed filters, `[POINTS, cout, cin]`.
    filters: Vec<f32>,
    /// The transformed input patches, `[POINTS, cin, tiles]` (tiles of all images).
    inputs: Vec<f32>,
    /// The products, `[POINTS, cout, tiles]`.
    products: Vec<f32>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// Adds the convolution of `x` (`[b, cin, h, w]`) by `weight` (`[cout, cin, 3, 3]`) to `out`
/// (`[b, cout, h, w]`), asking `stop` before each pass over the tiles (at most
/// [`MAX_BUFFERED`] transformed inputs: 16 products of up to 2^20 input channel-tiles each,
/// tens of milliseconds); an error, with `out` part done, once it fires. Panics unless the
/// lengths agree.
pub(super) fn accumulate(
    x: &[f32],
    weight: &[f32],
    dims: (usize, usize, usize, usize),
    out: &mut [f32],
    stop: Interrupt<'_>,
) -> candle_core::Result<()> {
    accumulate_within(x, weight, dims, out, MAX_BUFFERED, stop)
}

/// [`accumulate`] with at most `max_buffered` floats of transformed inputs per pass (at
/// least a row of tiles).
pub(super) fn accumulate_within(
    x: &[f32],
    weight: &[f32],
    (b, cin, h, w): (usize, usize, usize, usize),
    out: &mut [f32],
    max_buffered: usize,
    stop: Interrupt<'_>,
) -> candle_core::Result<()> {
    let p = h * w;
    let cout = out.len() / (b * p).max(1);
    assert!(x.len() == b * cin * p && weight.len() == cout * cin * 9 && out.len() == b * cout * p);
    if out.is_empty() || cin == 0 {
        return Ok(());
    }
    let tiling = Tiling {
        h,
        w,
        rows: h.div_ceil(2),
        cols: w.div_ceil(2),
    };
    // Rows of tiles (of all images, in order) per pass, within the buffers' budget.
    let per_pass = (max_buffered / (POINTS * tiling.cols * cin.max(cout))).max(1);
    let all_rows = b * tiling.rows;
    with_buffer(&BUFFERS, |buffers| {
        let filters = sized(&mut buffers.filters, cout * POINTS * cin);
        transform_filters(weight, (cout, cin), filters);
        for first in (0..all_rows).step_by(per_pass) {
            stop.check()?;
            let rows = first..all_rows.min(first + per_pass);
            let tiles = rows.len() * tiling.cols;
            let inputs = sized(&mut buffers.inputs, cin * POINTS * tiles);
            transform_inputs(x, cin, &tiling, rows.clone(), inputs);
            let products = sized(&mut buffers.products, cout * POINTS * tiles);
            // Point by point: on SD1's shapes these contiguous products run 5-20% faster
            // than products over every 16th row of point-interleaved buffers.
            for (point, products) in products.chunks_exact_mut(cout * tiles).enumerate() {
                let lhs = View::rows(&filters[point * cout * cin..], cout, cin);
                let rhs = View::rows(&inputs[point * cin * tiles..], cin, tiles);
                matmul(products, tiles, lhs, rhs, 1.0, false, true);
            }
            add_outputs(products, cout, &tiling, rows, out);
        }
        Ok(())
    })
}

/// The first `len` elements of `buffer`, grown (with zeros) when it is shorter.
fn sized(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buffer.len() < len {
        buffer.resize(len, 0.0);
    }
    &mut buffer[..len]
}

/// `buffer` (`[POINTS, rows, len]`) as one bundle per row index, each bundle that row of
/// every point: what one parallel task writes.
fn bundles(buffer: &mut [f32], rows: usize, len: usize) -> Vec<[&mut [f32]; POINTS]> {
    let mut points: Vec<_> = buffer
        .chunks_exact_mut(rows * len)
        .map(|p| p.chunks_exact_mut(len))
        .collect();
    (0..rows)
        .map(|_| std::array::from_fn(|point| points[point].next().expect("every point has `rows` rows")))
        .collect()
}

/// How the planes are cut into 2×2 tiles: `rows × cols` tiles cover `h × w` pixels (the
/// last row or column of tiles overhangs an odd size).
struct Tiling {
    h: usize,
    w: usize,
    rows: usize,
    cols: usize,
}

/// `G g Gᵀ` of every 3×3 filter `g` in `weight` (`[cout, cin, 3, 3]`) into `filters`
/// (`[POINTS, cout, cin]`), one output channel per task.
fn transform_filters(weight: &[f32], (cout, cin): (usize, usize), filters: &mut [f32]) {
    bundles(filters, cout, cin)
        .into_par_iter()
        .zip(weight.par_chunks(cin * 9))
        .for_each(|(to, filters)| {
            // Tap-major, so that every step below is a run over the input channels: tap `k`
            // of channel `c` at `k * cin + c`.
            let mut taps = vec![0f32; 9 * cin];
            for (c, filter) in filters.chunks_exact(9).enumerate() {
                for (k, &value) in filter.iter().enumerate() {
                    taps[k * cin + c] = value;
                }
            }
            let tap = |k: usize| &taps[k * cin..][..cin];
            // `G g`: row `i` of it, column `l`, at `(i * 3 + l) * cin`.
            let mut down = vec![0f32; 12 * cin];
            for l in 0..3 {
                for i in 0..4 {
                    apply_g(
                        i,
                        [tap(l), tap(3 + l), tap(6 + l)],
                        &mut down[(i * 3 + l) * cin..][..cin],
                    );
                }
            }
            // `(G g) Gᵀ`.
            for i in 0..4 {
                let row = |l: usize| &down[(i * 3 + l) * cin..][..cin];
                for j in 0..4 {
                    apply_g(j, [row(0), row(1), row(2)], to[i * 4 + j]);
                }
            }
        });
}

/// Row `i` of `G` applied to three runs: `out = x0`, `(x0 + x1 + x2) / 2`,
/// `(x0 - x1 + x2) / 2` or `x2` for `i` = 0, 1, 2, 3.
fn apply_g(i: usize, [x0, x1, x2]: [&[f32]; 3], out: &mut [f32]) {
    match i {
        0 => out.copy_from_slice(x0),
        3 => out.copy_from_slice(x2),
        _ => {
            let sign = if i == 1 { 1.0 } else { -1.0 };
            for (o, ((&a, &b), &c)) in out.iter_mut().zip(x0.iter().zip(x1).zip(x2)) {
                *o = 0.5 * (a + sign * b + c);
            }
        }
    }
}

/// `Bᵀ d B` of every tile's 4×4 input patch `d` (zero outside the planes) of `x` (`[b, cin,
/// h, w]`) into `inputs` (`[POINTS, cin, tiles]`), one input channel per task. A patch's
/// columns alternate between the even and odd columns of the zero-padded rows, so each row
/// is split into its even and odd halves once, and every output point is then a run of
/// additions over consecutive tiles. `rows` are the rows of tiles to transform, counted over
/// all images in order.
fn transform_inputs(x: &[f32], cin: usize, tiling: &Tiling, rows: Range<usize>, inputs: &mut [f32]) {
    let (h, w, cols) = (tiling.h, tiling.w, tiling.cols);
    let tiles = inputs.len() / (cin * POINTS);
    bundles(inputs, cin, tiles)
        .into_par_iter()
        .enumerate()
        .for_each(|(c, mut to)| {
            // Four padded rows split into even and odd halves, then their `Bᵀ` combinations.
            let mut halves = vec![0f32; 16 * (cols + 1)];
            let (padded, combined) = halves.split_at_mut(8 * (cols + 1));
            for (pass_row, row) in rows.clone().enumerate() {
                let (image, tile_row) = (row / tiling.rows, row % tiling.rows);
                let plane = &x[(image * cin + c) * h * w..][..h * w];
                for (k, half) in padded.chunks_exact_mut(2 * (cols + 1)).enumerate() {
                    let (even, odd) = half.split_at_mut(cols + 1);
                    split_padded_row(plane, (h, w), (2 * tile_row + k) as isize - 1, even, odd);
                }
                let row = |k: usize| &padded[k * 2 * (cols + 1)..][..2 * (cols + 1)];
                // `Bᵀ` down the patch's rows: d0 - d2, d1 + d2, d2 - d1, d1 - d3.
                for (i, out) in combined.chunks_exact_mut(2 * (cols + 1)).enumerate() {
                    let (a, b, sign) = match i {
                        0 => (row(0), row(2), -1.0),
                        1 => (row(1), row(2), 1.0),
                        2 => (row(2), row(1), -1.0),
                        _ => (row(1), row(3), -1.0),
                    };
                    out.iter_mut()
                        .zip(a.iter().zip(b))
                        .for_each(|(o, (&a, &b))| *o = a + sign * b);
                }
                let first = pass_row * cols;
                // `B` across: x0 - x2, x1 + x2, x2 - x1, x1 - x3 with x0, x2 the even halves
                // at tiles t and t + 1, x1, x3 the odd ones.
                for (i, row) in combined.chunks_exact(2 * (cols + 1)).enumerate() {
                    let (even, odd) = row.split_at(cols + 1);
                    let [to0, to1, to2, to3] = &mut to[i * 4..][..4] else {
                        unreachable!("four points per row of the patch")
                    };
                    let [to0, to1, to2, to3] = [to0, to1, to2, to3].map(|to| &mut to[first..][..cols]);
                    for t in 0..cols {
                        let (e0, e1, o0, o1) = (even[t], even[t + 1], odd[t], odd[t + 1]);
                        to0[t] = e0 - e1;
                        to1[t] = o0 + e1;
                        to2[t] = e1 - o0;
                        to3[t] = o0 - o1;
                    }
                }
            }
        });
}

/// Row `y` of `plane` (`h × w`) padded with one zero on the left and as many on the right
/// as the halves need, split into its `even` and `odd` columns (zeros for a row outside
/// the plane).
fn split_padded_row(plane: &[f32], (h, w): (usize, usize), y: isize, even: &mut [f32], odd: &mut [f32]) {
    even.fill(0.0);
    odd.fill(0.0);
    if y < 0 || y >= h as isize {
        return;
    }
    // Padded column `j` holds input column `j - 1`.
    for (x, &value) in plane[y as usize * w..][..w].iter().enumerate() {
        let j = x + 1;
        if j % 2 == 0 {
            even[j / 2] = value;
        } else {
            odd[j / 2] = value;
        }
    }
}

/// Adds `Aᵀ m A` of every tile's 16 sums `m` in `products` (`[POINTS, cout, tiles]`) to its
/// 2×2 output pixels in `out` (`[b, cout, h, w]`), one output plane per task, for the
/// tiles of `rows` (counted over all images in order).
fn add_outputs(products: &[f32], cout: usize, tiling: &Tiling, rows: Range<usize>, out: &mut [f32]) {
    let (h, w, cols) = (tiling.h, tiling.w, tiling.cols);
    let tiles = products.len() / (cout * POINTS);
    let images = rows.start / tiling.rows..(rows.end - 1) / tiling.rows + 1;
    let planes = &mut out[images.start * cout * h * w..images.end * cout * h * w];
    planes.par_chunks_mut(h * w).enumerate().for_each(|(plane, out)| {
        let (image, channel) = (images.start + plane / cout, plane % cout);
        let image_rows = image * tiling.rows..(image + 1) * tiling.rows;
        for row in rows.start.max(image_rows.start)..rows.end.min(image_rows.end) {
            let (tile_row, first) = (row - image_rows.start, (row - rows.start) * cols);
            let m: [&[f32]; POINTS] =
                std::array::from_fn(|point| &products[(point * cout + channel) * tiles + first..][..cols]);
            // `Aᵀ` down: m0 + m1 + m2 and m1 - m2 - m3 per column, then `A` across the same way.
            let pixel = |t: usize| {
                let column = |j: usize| {
                    let (m0, m1, m2, m3) = (m[j][t], m[4 + j][t], m[8 + j][t], m[12 + j][t]);
                    (m0 + m1 + m2, m1 - m2 - m3)
                };
                let (c0, c1, c2, c3) = (column(0), column(1), column(2), column(3));
                [
                    [c0.0 + c1.0 + c2.0, c1.0 - c2.0 - c3.0],
                    [c0.1 + c1.1 + c2.1, c1.1 - c2.1 - c3.1],
                ]
            };
            let (upper, lower) = out[2 * tile_row * w..].split_at_mut(w);
            let mut lower = (2 * tile_row + 1 < h).then(|| &mut lower[..w]);
            // Whole tiles, then the overhanging one of an odd width (its left column only).
            for t in 0..w / 2 {
                let [top, bottom] = pixel(t);
                upper[2 * t] += top[0];
                upper[2 * t + 1] += top[1];
                if let Some(lower) = lower.as_deref_mut() {
                    lower[2 * t] += bottom[0];
                    lower[2 * t + 1] += bottom[1];
                }
            }
            if w % 2 == 1 {
                let [top, bottom] = pixel(cols - 1);
                upper[w - 1] += top[0];
                if let Some(lower) = lower {
                    lower[w - 1] += bottom[0];
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Passes over a few rows of tiles at a time (rows of one image, and rows spanning two)
    /// give the one-pass result.
    #[test]
    fn passes_over_rows_of_tiles_equal_one_pass() {
        let (b, cin, cout, h, w) = (2, 3, 4, 7, 6);
        let x: Vec<f32> = (0..b * cin * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let weight: Vec<f32> = (0..cout * cin * 9)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 40.0)
            .collect();
        let mut whole = vec![0.5f32; b * cout * h * w];
        accumulate_within(&x, &weight, (b, cin, h, w), &mut whole, usize::MAX, Interrupt::NEVER).unwrap();
        let per_row = POINTS * 3 * cout.max(cin);
        for rows in [1, 3] {
            let mut parts = vec![0.5f32; b * cout * h * w];
            accumulate_within(
                &x,
                &weight,
                (b, cin, h, w),
                &mut parts,
                rows * per_row,
                Interrupt::NEVER,
            )
            .unwrap();
            for (got, want) in parts.iter().zip(&whole) {
                assert!((got - want).abs() <= 1e-5, "{rows} rows per pass: {got} vs {want}");
            }
        }
    }
}
