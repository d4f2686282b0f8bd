//! 3×3, stride-1, padding-1 convolutions by Winograd's F(4×4, 3×3) (Lavin and Gray, 2015),
//! for the upscale models' wide planes: each 4×4 block of output pixels comes from the 6×6
//! input patch around it; in the Winograd domain the patch is `Bᵀ d B`, the filter `G g Gᵀ`
//! (both 6×6), their products summed over input channels are 36 matrix products, and `Aᵀ m A`
//! gives the 16 pixels. That is 36 multiplications per block and channel pair where
//! F(2×2, 3×3) (the `winograd` module) needs 64 and the direct convolution 144, and the
//! transforms move 2.25 values per pixel instead of 4. The interpolation points are 0, ±1,
//! ±2 and ∞, whose transforms stay within a few float roundings of the direct sums.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use crate::interrupt::Interrupt;
use crate::matmul::{matmul, View};
use crate::with_buffer;

/// Points of the Winograd domain: a 6×6 patch per tile.
const POINTS: usize = 36;

/// Output pixels per image from which the transforms pay for themselves.
const MIN_POSITIONS: usize = 32 * 32;

/// Floats of transformed inputs (or products) per pass over the tiles (at least one row of
/// tiles): passes of one or a few rows stay in the caches between the transforms and the
/// products. On RRDBNet at 512x512 (2 threads, AVX-512), 1 Mi-float passes ran 14% faster
/// than 16 Mi ones, 256 Ki (one row of tiles for its widest layers) 19%.
const MAX_BUFFERED: usize = 1 << 18;

/// Whether [`accumulate`] handles a `kernel` convolution with `stride` and `padding` of
/// `input` (`h × w`) planes.
pub(super) fn applies(input: (usize, usize), kernel: (usize, usize), stride: usize, padding: usize) -> bool {
    kernel == (3, 3) && stride == 1 && padding == 1 && input.0 * input.1 >= MIN_POSITIONS
}

/// A thread's buffers, kept between calls.
#[derive(Default)]
struct Buffers {
    /// The transformed filters, `[POINTS, cout, cin]`.
    filters: Vec<f32>,
    /// The transformed input patches, `[POINTS, cin, tiles]`.
    inputs: Vec<f32>,
    /// The products, `[POINTS, cout, tiles]`.
    products: Vec<f32>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = RefCell::new(Buffers::default());
}

/// How the planes are cut into 4×4 tiles.
struct Tiling {
    h: usize,
    w: usize,
    rows: usize,
    cols: usize,
}

/// Adds the convolution of `x` (`[b, cin, h, w]`) by `weight` (`[cout, cin, 3, 3]`) to `out`
/// (`[b, cout, h, w]`), asking `stop` before each pass over the tiles. Panics unless the
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
fn accumulate_within(
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
        rows: h.div_ceil(4),
        cols: w.div_ceil(4),
    };
    let per_pass = (max_buffered / (POINTS * tiling.cols * cin.max(cout))).max(1);
    let all_rows = b * tiling.rows;
    with_buffer(&BUFFERS, |buffers| {
        let filters = sized(&mut buffers.filters, POINTS * cout * cin);
        transform_filters(weight, (cout, cin), filters);
        for first in (0..all_rows).step_by(per_pass) {
            stop.check()?;
            let rows = first..all_rows.min(first + per_pass);
            let tiles = rows.len() * tiling.cols;
            let inputs = sized(&mut buffers.inputs, cin * POINTS * tiles);
            transform_inputs(x, cin, &tiling, rows.clone(), inputs);
            let products = sized(&mut buffers.products, cout * POINTS * tiles);
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

/// `G g Gᵀ` of every filter into `filters` (`[POINTS, cout, cin]`).
fn transform_filters(weight: &[f32], (cout, cin): (usize, usize), filters: &mut [f32]) {
    let transformed: Vec<[f32; POINTS]> = weight
        .par_chunks_exact(9)
        .map(|g| {
            let mut down = [[0f32; 3]; 6];
            for (l, column) in (0..3).map(|l| [g[l], g[3 + l], g[6 + l]]).enumerate() {
                for (i, v) in apply_g(column).into_iter().enumerate() {
                    down[i][l] = v;
                }
            }
            let mut out = [0f32; POINTS];
            for (i, row) in down.iter().enumerate() {
                out[i * 6..][..6].copy_from_slice(&apply_g(*row));
            }
            out
        })
        .collect();
    filters.par_chunks_mut(cout * cin).enumerate().for_each(|(point, f)| {
        for (o, t) in f.iter_mut().zip(&transformed) {
            *o = t[point];
        }
    });
}

/// `G` applied to three values.
fn apply_g([a, b, c]: [f32; 3]) -> [f32; 6] {
    [
        a / 4.0,
        -(a + b + c) / 6.0,
        -(a - b + c) / 6.0,
        a / 24.0 + b / 12.0 + c / 6.0,
        a / 24.0 - b / 12.0 + c / 6.0,
        c,
    ]
}

/// `Bᵀ` applied to six values.
fn apply_bt(d: [f32; 6]) -> [f32; 6] {
    [
        4.0 * d[0] - 5.0 * d[2] + d[4],
        -4.0 * d[1] - 4.0 * d[2] + d[3] + d[4],
        4.0 * d[1] - 4.0 * d[2] - d[3] + d[4],
        -2.0 * d[1] - d[2] + 2.0 * d[3] + d[4],
        2.0 * d[1] - d[2] - 2.0 * d[3] + d[4],
        4.0 * d[1] - 5.0 * d[3] + d[5],
    ]
}

/// `Aᵀ` applied to six values.
fn apply_at(m: [f32; 6]) -> [f32; 4] {
    [
        m[0] + m[1] + m[2] + m[3] + m[4],
        m[1] - m[2] + 2.0 * (m[3] - m[4]),
        m[1] + m[2] + 4.0 * (m[3] + m[4]),
        m[1] - m[2] + 8.0 * (m[3] - m[4]) + m[5],
    ]
}

/// `transform` applied element-wise across the six runs `d` into the runs `out` (all of
/// `len` values): one vectorisable pass.
fn across<const N: usize>(d: [&[f32]; 6], out: [&mut [f32]; N], len: usize, transform: fn([f32; 6]) -> [f32; N]) {
    let d = d.map(|d| &d[..len]);
    let mut out = out.map(|o| &mut o[..len]);
    for n in 0..len {
        let v = transform([d[0][n], d[1][n], d[2][n], d[3][n], d[4][n], d[5][n]]);
        for (o, v) in out.iter_mut().zip(v) {
            o[n] = v;
        }
    }
}

/// `Bᵀ d B` of every tile's 6×6 input patch (zero outside the planes) into `inputs`
/// (`[POINTS, cin, tiles]`), one input channel per task, for the tile rows `rows` (over
/// all images in order). Down the patch, `Bᵀ` combines six whole padded rows; across, each
/// combined row is split into its six phases (values `4t + k` for tile `t`) so that `B`
/// combines whole runs over the tiles too.
fn transform_inputs(x: &[f32], cin: usize, tiling: &Tiling, rows: Range<usize>, inputs: &mut [f32]) {
    let (h, w, cols) = (tiling.h, tiling.w, tiling.cols);
    let tiles = inputs.len() / (cin * POINTS);
    let width = 4 * cols + 2;
    let mut per_point: Vec<std::slice::ChunksExactMut<'_, f32>> = inputs
        .chunks_exact_mut(cin * tiles)
        .map(|p| p.chunks_exact_mut(tiles))
        .collect();
    let channels: Vec<Vec<&mut [f32]>> = (0..cin)
        .map(|_| {
            per_point
                .iter_mut()
                .map(|p| p.next().expect("cin rows per point"))
                .collect()
        })
        .collect();
    channels.into_par_iter().enumerate().for_each(|(c, mut to)| {
        let mut padded = vec![0f32; 6 * width];
        let mut combined = vec![0f32; 6 * width];
        let mut phases = vec![0f32; 6 * cols];
        for (pass_row, row) in rows.clone().enumerate() {
            let (image, tile_row) = (row / tiling.rows, row % tiling.rows);
            let plane = &x[(image * cin + c) * h * w..][..h * w];
            for (k, line) in padded.chunks_exact_mut(width).enumerate() {
                line.fill(0.0);
                let y = (4 * tile_row + k) as isize - 1;
                if (0..h as isize).contains(&y) {
                    line[1..=w].copy_from_slice(&plane[y as usize * w..][..w]);
                }
            }
            let d: Vec<&[f32]> = padded.chunks_exact(width).collect();
            let out: Vec<&mut [f32]> = combined.chunks_exact_mut(width).collect();
            across(
                [d[0], d[1], d[2], d[3], d[4], d[5]],
                <[&mut [f32]; 6]>::try_from(out).expect("six rows"),
                width,
                apply_bt,
            );
            let first = pass_row * cols;
            for (i, line) in combined.chunks_exact(width).enumerate() {
                for (k, phase) in phases.chunks_exact_mut(cols).enumerate() {
                    for (t, v) in phase.iter_mut().enumerate() {
                        *v = line[4 * t + k];
                    }
                }
                let ph: Vec<&[f32]> = phases.chunks_exact(cols).collect();
                let [t0, t1, t2, t3, t4, t5] = &mut to[i * 6..][..6] else {
                    unreachable!("six points per row of the patch")
                };
                let outs = [t0, t1, t2, t3, t4, t5].map(|t| &mut t[first..][..cols]);
                across([ph[0], ph[1], ph[2], ph[3], ph[4], ph[5]], outs, cols, apply_bt);
            }
        }
    });
}

/// Adds `Aᵀ m A` of every tile's 36 sums in `products` (`[POINTS, cout, tiles]`) to its
/// 4×4 output pixels in `out` (`[b, cout, h, w]`), one output plane per task: `Aᵀ` down
/// each of the six columns of sums (runs over the tiles), then across each of the four
/// rows, whose four phases are interleaved into the output rows.
fn add_outputs(products: &[f32], cout: usize, tiling: &Tiling, rows: Range<usize>, out: &mut [f32]) {
    let (h, w, cols) = (tiling.h, tiling.w, tiling.cols);
    let tiles = products.len() / (cout * POINTS);
    let images = rows.start / tiling.rows..(rows.end - 1) / tiling.rows + 1;
    let planes = &mut out[images.start * cout * h * w..images.end * cout * h * w];
    planes.par_chunks_mut(h * w).enumerate().for_each(|(plane, out)| {
        let (image, channel) = (images.start + plane / cout, plane % cout);
        let image_rows = image * tiling.rows..(image + 1) * tiling.rows;
        // Per output row r of a tile and column j of the sums, a run over the tiles.
        let mut down = vec![0f32; 24 * cols];
        let mut pixels = vec![0f32; 4 * cols];
        for row in rows.start.max(image_rows.start)..rows.end.min(image_rows.end) {
            let (tile_row, first) = (row - image_rows.start, (row - rows.start) * cols);
            let m: [&[f32]; POINTS] =
                std::array::from_fn(|point| &products[(point * cout + channel) * tiles + first..][..cols]);
            {
                let mut runs: Vec<&mut [f32]> = down.chunks_exact_mut(cols).collect();
                for j in 0..6 {
                    // Rows r of column j sit at r * 6 + j.
                    let mut outs = runs.iter_mut().skip(j).step_by(6).map(|r| &mut **r);
                    let outs: [&mut [f32]; 4] = std::array::from_fn(|_| outs.next().expect("four rows"));
                    across(
                        [m[j], m[6 + j], m[12 + j], m[18 + j], m[24 + j], m[30 + j]],
                        outs,
                        cols,
                        apply_at,
                    );
                }
            }
            for r in 0..4 {
                let y = 4 * tile_row + r;
                if y >= h {
                    break;
                }
                let d: Vec<&[f32]> = down[r * 6 * cols..][..6 * cols].chunks_exact(cols).collect();
                let outs: Vec<&mut [f32]> = pixels.chunks_exact_mut(cols).collect();
                let outs = <[&mut [f32]; 4]>::try_from(outs).expect("four phases");
                across([d[0], d[1], d[2], d[3], d[4], d[5]], outs, cols, apply_at);
                let line = &mut out[y * w..][..w];
                for (q, phase) in pixels.chunks_exact(cols).enumerate() {
                    for (t, &v) in phase.iter().enumerate() {
                        if let Some(o) = line.get_mut(4 * t + q) {
                            *o += v;
                        }
                    }
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct convolution in float64, zero-padded by one.
    fn direct(x: &[f32], weight: &[f32], (b, cin, h, w): (usize, usize, usize, usize), cout: usize) -> Vec<f64> {
        let mut out = vec![0f64; b * cout * h * w];
        for (i, o) in out.iter_mut().enumerate() {
            let (n, co, y, xx) = (i / (cout * h * w), i / (h * w) % cout, i / w % h, i % w);
            for c in 0..cin {
                for k in 0..9 {
                    let (sy, sx) = (y as isize + (k / 3) as isize - 1, xx as isize + (k % 3) as isize - 1);
                    if (0..h as isize).contains(&sy) && (0..w as isize).contains(&sx) {
                        let v = x[((n * cin + c) * h + sy as usize) * w + sx as usize];
                        *o += f64::from(v) * f64::from(weight[(co * cin + c) * 9 + k]);
                    }
                }
            }
        }
        out
    }

    #[test]
    fn equals_the_direct_convolution_within_float_rounding() {
        // Odd sizes: the last row and column of tiles overhang the planes.
        let (b, cin, cout, h, w) = (2, 24, 5, 35, 41);
        let x: Vec<f32> = (0..b * cin * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let weight: Vec<f32> = (0..cout * cin * 9)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 200.0)
            .collect();
        let want = direct(&x, &weight, (b, cin, h, w), cout);
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        // One pass, then passes of one and of four rows of tiles (some spanning two images).
        for rows in [usize::MAX, 1, 4] {
            let budget = rows.saturating_mul(POINTS * 11 * cin);
            let mut out = vec![0.25f32; b * cout * h * w];
            accumulate_within(&x, &weight, (b, cin, h, w), &mut out, budget, Interrupt::NEVER).unwrap();
            for (got, want) in out.iter().zip(&want) {
                let error = (f64::from(*got) - 0.25 - want).abs();
                assert!(error <= 1e-5 * scale, "{rows} rows a pass: {got} vs {}", want + 0.25);
            }
        }
    }
}
