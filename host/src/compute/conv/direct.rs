//! 3×3, stride-1, padding-1 convolutions computed directly on NCHW images with AVX-512: the
//! UNet's and the VAE's main cost.
//!
//! The general path copies every pixel's 3×3×cin neighbourhood into a column matrix (47 MB
//! for SD1's largest) and multiplies it; here the product reads the (zero-padded) input
//! planes in place instead. Sixteen adjacent pixels of one input row, shifted by a tap, are
//! one vector; a register block holds four such vectors (64 output pixels) by six output
//! channels, and every (input channel, tap) adds one rank-1 update with the weights
//! broadcast. Input channels go in chunks of [`CHANNELS_PER_PASS`] so that the planes' rows
//! a pixel block reads stay in L1 while all of a task's output channels use them.

use rayon::prelude::*;

use crate::compute::{par_init, with_buffer};

/// Pixels per register block: four vectors of sixteen.
const PIXELS: usize = 64;

/// Output channels per register block.
const CHANNELS: usize = 6;

/// Output channels per parallel task (a multiple of [`CHANNELS`]).
const TASK_CHANNELS: usize = 6 * CHANNELS;

/// Input channels per pass over a task's pixel blocks.
const CHANNELS_PER_PASS: usize = 16;

/// Whether [`accumulate`] handles a `kernel` convolution with `stride` and `padding` of
/// `input` (`h × w`) planes on this CPU.
pub(super) fn applies(input: (usize, usize), kernel: (usize, usize), stride: usize, padding: usize) -> bool {
    let (h, w) = input;
    kernel == (3, 3)
        && stride == 1
        && padding == 1
        && w % 16 == 0
        && (h * w) % PIXELS == 0
        && std::arch::is_x86_feature_detected!("avx512f")
}

/// Adds the convolution of `x` (`[b, cin, h, w]`) by `weight` (`[cout, cin, 3, 3]`) to `out`
/// (`[b, cout, h, w]`). Panics unless [`applies`].
pub(super) fn accumulate(x: &[f32], weight: &[f32], (b, cin, h, w): (usize, usize, usize, usize), out: &mut [f32]) {
    assert!(applies((h, w), (3, 3), 1, 1));
    let p = h * w;
    let cout = out.len() / (b * p);
    assert!(x.len() == b * cin * p && weight.len() == cout * cin * 9 && out.len() == b * cout * p);
    let geometry = Planes { h, w, cin };
    let padded = geometry.pad(x);
    out.par_chunks_mut(cout * p)
        .zip(padded.par_chunks(cin * geometry.plane()))
        .for_each(|(out, image)| {
            out.par_chunks_mut(TASK_CHANNELS * p)
                .enumerate()
                .for_each(|(task, out)| {
                    let first = task * TASK_CHANNELS;
                    let filters = &weight[first * cin * 9..][..out.len() / p * cin * 9];
                    with_buffer(&PACKED, |packed| {
                        pack(filters, cin, packed);
                        // SAFETY: `applies` checked that the CPU has AVX-512F; the slices'
                        // lengths are those `task` expects.
                        unsafe { avx512::task(image, &geometry, packed, out) }
                    });
                });
        });
}

thread_local! {
    /// The calling thread's packed filters of one task.
    static PACKED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The input's geometry: `cin` planes of `h × w`, each stored zero-padded to `(h + 2) ×
/// (w + 2)`.
struct Planes {
    h: usize,
    w: usize,
    cin: usize,
}

impl Planes {
    /// Floats per padded plane.
    fn plane(&self) -> usize {
        (self.h + 2) * self.row()
    }

    /// Floats per padded row.
    fn row(&self) -> usize {
        self.w + 2
    }

    /// `x`'s planes with a border of zeros, built in parallel, one plane per task.
    fn pad(&self, x: &[f32]) -> Vec<f32> {
        let (h, w, row) = (self.h, self.w, self.row());
        let planes = x.len() / (h * w);
        par_init(planes * self.plane(), self.plane(), |index, plane| {
            let plane = crate::compute::filled(plane, 0.0);
            let source = &x[index * h * w..][..h * w];
            for (y, line) in source.chunks_exact(w).enumerate() {
                plane[(y + 1) * row + 1..][..w].copy_from_slice(line);
            }
            plane
        })
    }
}

/// `filters` (`[channels, cin, 9]`) as register blocks of [`CHANNELS`] output channels,
/// each `[cin, 9, CHANNELS]`, zero past the last channel.
fn pack(filters: &[f32], cin: usize, packed: &mut Vec<f32>) {
    let channels = filters.len() / (cin * 9);
    let blocks = channels.div_ceil(CHANNELS);
    packed.clear();
    packed.resize(blocks * cin * 9 * CHANNELS, 0.0);
    for (co, filter) in filters.chunks_exact(cin * 9).enumerate() {
        let block = &mut packed[co / CHANNELS * cin * 9 * CHANNELS..][..cin * 9 * CHANNELS];
        for (k, &value) in filter.iter().enumerate() {
            block[k * CHANNELS + co % CHANNELS] = value;
        }
    }
}

mod avx512 {
    use std::arch::x86_64::*;

    use super::{Planes, CHANNELS, CHANNELS_PER_PASS, PIXELS};

    /// Vectors per register block.
    const VECTORS: usize = PIXELS / 16;

    /// Adds one image's convolution for one task's output channels to `out` (`[channels,
    /// h·w]`), from the image's padded planes and the task's `packed` filters.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `image` must hold `cin` padded planes, `packed` the
    /// task's filters as [`super::pack`] lays them out, `out` a whole number of channels.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn task(image: &[f32], planes: &Planes, packed: &[f32], out: &mut [f32]) {
        let p = planes.h * planes.w;
        let channels = out.len() / p;
        assert!(image.len() == planes.cin * planes.plane());
        assert!(packed.len() == channels.div_ceil(CHANNELS) * planes.cin * 9 * CHANNELS);
        for first_channel in (0..planes.cin).step_by(CHANNELS_PER_PASS) {
            let pass = CHANNELS_PER_PASS.min(planes.cin - first_channel);
            for first_pixel in (0..p).step_by(PIXELS) {
                // Where each vector's first pixel reads tap (0, 0) in a padded plane.
                let mut starts = [0usize; VECTORS];
                for (i, start) in starts.iter_mut().enumerate() {
                    let pixel = first_pixel + 16 * i;
                    *start = pixel / planes.w * planes.row() + pixel % planes.w;
                }
                for (block, filters) in packed.chunks_exact(planes.cin * 9 * CHANNELS).enumerate() {
                    let rows = CHANNELS.min(channels - block * CHANNELS);
                    let filters = &filters[first_channel * 9 * CHANNELS..][..pass * 9 * CHANNELS];
                    let input = &image[first_channel * planes.plane()..][..pass * planes.plane()];
                    // SAFETY: as the caller promised, and the block's rows and pixels lie
                    // within `out`.
                    unsafe {
                        block_update(
                            input,
                            planes,
                            &starts,
                            filters,
                            &mut out[block * CHANNELS * p..],
                            rows,
                            p,
                            first_pixel,
                        )
                    };
                }
            }
        }
    }

    /// Adds `pass` input channels' contribution to a register block: the `rows` output
    /// channels at `out` (rows `p` apart), pixels `first_pixel ..+ PIXELS`.
    ///
    /// # Safety
    /// AVX-512F; `input` holds `filters.len() / (9 · CHANNELS)` padded planes, every start
    /// plus the furthest tap lies within a plane, and `out` holds `rows` rows of `p`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block_update(
        input: &[f32],
        planes: &Planes,
        starts: &[usize; VECTORS],
        filters: &[f32],
        out: &mut [f32],
        rows: usize,
        p: usize,
        first_pixel: usize,
    ) {
        let (plane, row) = (planes.plane(), planes.row());
        let mut acc = [[_mm512_setzero_ps(); VECTORS]; CHANNELS];
        for (j, acc) in acc.iter_mut().enumerate().take(rows) {
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: row `j < rows` of `out`, within `p` (64 | p).
                *acc = unsafe { _mm512_loadu_ps(out.as_ptr().add(j * p + first_pixel + 16 * i)) };
            }
        }
        // The taps' offsets in a padded plane, walked as a slice: unrolling the nine taps
        // lets the compiler hoist loads past the register file.
        let taps: [usize; 9] = std::array::from_fn(|tap| tap / 3 * row + tap % 3);
        let taps: &[usize] = std::hint::black_box(&taps);
        let (input, mut weights) = (input.as_ptr(), filters.as_ptr());
        for channel in 0..filters.len() / (9 * CHANNELS) {
            for &tap in taps {
                let offset = channel * plane + tap;
                let mut pixels = [_mm512_setzero_ps(); VECTORS];
                for (vector, start) in pixels.iter_mut().zip(starts) {
                    // SAFETY: a start plus the furthest tap plus 16 is at most a plane.
                    *vector = unsafe { _mm512_loadu_ps(input.add(start + offset)) };
                }
                for (j, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `filters` holds `CHANNELS` values per (channel, tap).
                    let weight = _mm512_set1_ps(unsafe { *weights.add(j) });
                    for (acc, &vector) in acc.iter_mut().zip(&pixels) {
                        *acc = _mm512_fmadd_ps(vector, weight, *acc);
                    }
                }
                // SAFETY: one past the last (channel, tap) at most.
                weights = unsafe { weights.add(CHANNELS) };
            }
        }
        for (j, acc) in acc.iter().enumerate().take(rows) {
            for (i, acc) in acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(j * p + first_pixel + 16 * i), *acc) };
            }
        }
    }
}
