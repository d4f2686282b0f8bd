//! 2-D convolution with bias, laid out for one matrix product per image.
//!
//! On the CPU, `y[co, p] = Σ w[co, k] · col[k, p] + bias[co]` where `col` holds, for each
//! input channel and kernel tap, the channel's plane shifted by that tap (built in parallel,
//! one contiguous row at a time, in a per-thread buffer that is reused). The product writes
//! NCHW directly, starting from the bias, plus a per-image channel shift (the UNet's time
//! embedding) and a residual when given, so nothing is transposed or added afterwards; a 1×1
//! convolution multiplies the input itself, and can read or write the transformer blocks'
//! token layout (`[b, h·w, c]`) directly. candle's CPU convolution instead gathers its im2col
//! matrix one element at a time on one thread, in pixel-major order, and transposes the
//! result. 3×3 stride-1 convolutions of planes of at least 16×16 pixels go through
//! Winograd's transforms instead (the `winograd` module); the upscale models' slices
//! ([`Conv2d::forward_slice`]) of at least 32×32 pixels use the larger F(4×4, 3×3) tiles of
//! `winograd4`. Other devices use candle.

mod winograd;
mod winograd4;

use std::cell::RefCell;
use std::sync::OnceLock;

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder};
use rayon::prelude::*;

use super::interrupt::Interrupt;
use super::matmul::{matmul, View};
use super::weights::with_f32;
use super::{filled, par_init, repeated, with_buffer, CpuF32};

/// A square-kernel convolution with bias: `[b, cin, h, w] → [b, cout, h', w']`.
#[derive(Debug, Clone)]
pub(crate) struct Conv2d {
    weight: Tensor,
    bias: Tensor,
    stride: usize,
    padding: usize,
    /// The weights as `[(tap, cin), cout]`, made on first use by the pixel-major path.
    taps_major: OnceLock<Vec<f32>>,
}

/// Output positions from which a convolution runs pixel-major (see [`Conv2d::forward_fused`]).
/// Measured on SD1's shapes (2 threads, AVX-512): at 64x64 outputs the pixel-major product
/// runs at ~250 GFLOP/s against ~180 channel-major, at 32x32 about even, at 16x16 and below
/// channel-major wins (260 against 180).
const PIXEL_MAJOR_MIN_POSITIONS: usize = 2048;

/// Output channels of one task where a pixel-major result is turned back to NCHW: each
/// pixel's run of this many channels is one cache line.
const CHANNEL_BLOCK: usize = 16;

/// Rows per parallel task where an output is started from per-row values.
const ROWS_PER_TASK: usize = 64;

/// Multiply-adds of one product between two questions to the caller's interrupt: 2^30,
/// 5-10 ms on two cores. A large convolution's product is cut into pieces of about this
/// many (output positions, which a product computes independently, so the pieces give the
/// same bits as the whole), so that a VAE level at 2048x2048 (over a second per
/// convolution) stops within milliseconds of being asked.
const MACS_PER_CHECK: usize = 1 << 30;

thread_local! {
    /// The calling thread's column matrix, kept between calls: SD1's largest is 47 MB, and
    /// allocating it afresh each time costs a page fault per 4 KiB.
    static COLUMNS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The pixel-major path's input image (`[h·w, cin]`) and products (`[b, h'·w', cout]`).
    static PIXEL_MAJOR: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Conv2d {
    /// The dtype the convolution computes in: its weights' on a GPU; float32 on the CPU,
    /// where half-precision weights are widened per call.
    pub(crate) fn dtype(&self) -> DType {
        if self.weight.device().is_cpu() {
            DType::F32
        } else {
            self.weight.dtype()
        }
    }

    /// Reads `weight` (`[cout, cin, k, k]`) and `bias` (`[cout]`) from `vb`.
    pub(crate) fn new(
        vb: VarBuilder,
        cin: usize,
        cout: usize,
        kernel: usize,
        stride: usize,
        padding: usize,
    ) -> Result<Self> {
        if stride == 0 {
            candle_core::bail!("conv2d: stride must be at least 1");
        }
        Ok(Conv2d {
            weight: vb.get((cout, cin, kernel, kernel), "weight")?,
            bias: vb.get(cout, "bias")?,
            stride,
            padding,
            taps_major: OnceLock::new(),
        })
    }

    /// A stride-1 convolution padded to keep the size, from `weight` (`[cout, cin, k, k]`,
    /// odd `k`) and `bias` (`[cout]`) already in hand (float32 on the CPU).
    pub(crate) fn same(weight: Tensor, bias: Tensor) -> Result<Self> {
        let (_, _, k, kw) = weight.dims4()?;
        if k != kw || k % 2 == 0 {
            candle_core::bail!("conv2d: a {k}x{kw} kernel does not keep the size");
        }
        Ok(Conv2d {
            weight,
            bias,
            stride: 1,
            padding: k / 2,
            taps_major: OnceLock::new(),
        })
    }

    /// The geometry of this convolution over `cin` channels of `input` pixels with a
    /// `kernel`-sized weight; fails when the kernel does not fit the padded input.
    fn geometry(&self, cin: usize, (h, w): (usize, usize), (kh, kw): (usize, usize)) -> Result<Geometry> {
        let (s, pad) = (self.stride, self.padding);
        if h + 2 * pad < kh || w + 2 * pad < kw {
            candle_core::bail!("conv2d: a {kh}x{kw} kernel does not fit a padded {h}x{w} input");
        }
        Ok(Geometry {
            cin,
            input: (h, w),
            kernel: (kh, kw),
            output: ((h + 2 * pad - kh) / s + 1, (w + 2 * pad - kw) / s + 1),
            stride: s,
            pad,
        })
    }

    /// Output channels.
    pub(crate) fn out_channels(&self) -> usize {
        self.weight.dims().first().copied().unwrap_or(0)
    }

    /// Input channels.
    pub(crate) fn in_channels(&self) -> usize {
        self.weight.dims().get(1).copied().unwrap_or(0)
    }

    /// The convolution of the contiguous NCHW float32 images `x` (`[b, cin, h, w]`) on the
    /// CPU, without tensors: the upscale models' dense blocks convolve a prefix of their
    /// feature buffer in place. 3×3 convolutions of planes of at least 32×32 pixels run by
    /// Winograd's F(4×4, 3×3). Asks `stop` as [`forward_interruptible`](Self::forward_interruptible).
    pub(crate) fn forward_slice(
        &self,
        x: &[f32],
        (b, cin, h, w): (usize, usize, usize, usize),
        stop: Interrupt<'_>,
    ) -> Result<Vec<f32>> {
        let (cout, wcin, kh, kw) = self.weight.dims4()?;
        if wcin != cin || x.len() != b * cin * h * w || cin == 0 || h == 0 || w == 0 {
            candle_core::bail!("conv2d: input {b}x{cin}x{h}x{w} for weight {:?}", self.weight.shape());
        }
        let (s, pad) = (self.stride, self.padding);
        let geometry = self.geometry(cin, (h, w), (kh, kw))?;
        let (ho, wo) = geometry.output;
        let start = Start::new(&self.bias, None, None, (b, cout, ho * wo))?;
        with_f32(&self.weight, "conv2d", |weight| {
            if winograd4::applies((h, w), (kh, kw), s, pad) {
                let mut out = start.output()?;
                winograd4::accumulate(x, weight, (b, cin, h, w), &mut out, stop)?;
                return Ok(out);
            }
            self.product(x, weight, &start, &geometry, (b, cout), (stop, MACS_PER_CHECK))
        })
    }

    /// `conv(x) + shift + residual`: `shift` is `[b, cout]`, added to every position of each
    /// image's channel; `residual` has the output's shape.
    ///
    /// Large outputs run pixel-major: the image is turned channels-last, its columns are
    /// filled one pixel's `(tap, channel)` run at a time (contiguous copies), the product
    /// gives `[h'·w', cout]`, and that is turned back to NCHW in the same pass that adds the
    /// bias, shift and residual. At SD1's 64x64 level the product runs about 35% faster that
    /// way than channel-major, which more than pays for the two transposes.
    pub(crate) fn forward_fused(
        &self,
        x: &Tensor,
        shift: Option<&Tensor>,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.forward_interruptible(x, shift, residual, Interrupt::NEVER)
    }

    /// [`forward_fused`](Self::forward_fused), asking `stop` between images, Winograd passes
    /// and pieces of [`MACS_PER_CHECK`] multiply-adds of the product; an error once it fires.
    pub(crate) fn forward_interruptible(
        &self,
        x: &Tensor,
        shift: Option<&Tensor>,
        residual: Option<&Tensor>,
        stop: Interrupt<'_>,
    ) -> Result<Tensor> {
        self.forward_in_pieces(x, shift, residual, stop, MACS_PER_CHECK)
    }

    /// [`forward_interruptible`](Self::forward_interruptible) with pieces of about
    /// `macs_per_check` multiply-adds.
    fn forward_in_pieces(
        &self,
        x: &Tensor,
        shift: Option<&Tensor>,
        residual: Option<&Tensor>,
        stop: Interrupt<'_>,
        macs_per_check: usize,
    ) -> Result<Tensor> {
        if !(x.device().is_cpu() && x.dtype() == DType::F32) {
            let cfg = Conv2dConfig {
                padding: self.padding,
                stride: self.stride,
                ..Default::default()
            };
            let mut y = candle_nn::Conv2d::new(self.weight.clone(), Some(self.bias.clone()), cfg).forward(x)?;
            if let Some(shift) = shift {
                y = y.broadcast_add(&shift.unsqueeze(2)?.unsqueeze(3)?)?;
            }
            if let Some(residual) = residual {
                y = (y + residual)?;
            }
            return Ok(y);
        }
        let (b, cin, h, w) = x.dims4()?;
        let (cout, wcin, kh, kw) = self.weight.dims4()?;
        if wcin != cin {
            candle_core::bail!("conv2d: input {:?} for weight {:?}", x.shape(), self.weight.shape());
        }
        if cin == 0 || h == 0 || w == 0 {
            candle_core::bail!("conv2d: empty input {:?}", x.shape());
        }
        let geometry = self.geometry(cin, (h, w), (kh, kw))?;
        let (ho, wo) = geometry.output;
        let p = ho * wo;
        let x = x.contiguous()?;
        let input = CpuF32::new(&x, "conv2d")?;
        let start = Start::new(&self.bias, shift, residual, (b, cout, p))?;
        let x = input.contiguous("conv2d")?;
        let out = with_f32(&self.weight, "conv2d", |weight| {
            self.product(x, weight, &start, &geometry, (b, cout), (stop, macs_per_check))
        })?;
        Tensor::from_vec(out, (b, cout, ho, wo), self.weight.device())
    }

    /// The convolution of the images `x` (`b` of them) with `weight` (`[cout, cin, kh, kw]`,
    /// float32), started from `start`: Winograd's, pixel-major or channel-major, asking
    /// `stop` between pieces of about `macs_per_check` multiply-adds.
    fn product(
        &self,
        x: &[f32],
        weight: &[f32],
        start: &Start<'_>,
        g: &Geometry,
        (b, cout): (usize, usize),
        (stop, macs_per_check): (Interrupt<'_>, usize),
    ) -> Result<Vec<f32>> {
        let (cin, (h, w), (kh, kw), (ho, wo), s, pad) = (g.cin, g.input, g.kernel, g.output, g.stride, g.pad);
        let p = ho * wo;
        let k = cin * kh * kw;
        if winograd::applies((h, w), (kh, kw), s, pad) {
            let mut out = start.output()?;
            winograd::accumulate(x, weight, (b, cin, h, w), &mut out, stop)?;
            return Ok(out);
        }
        let one_by_one = kh == 1 && kw == 1 && s == 1 && pad == 0;
        if !one_by_one && p >= PIXEL_MAJOR_MIN_POSITIONS && cout >= CHANNEL_BLOCK {
            // Float32 weights keep their pixel-major copy; half ones make it per call.
            let per_call;
            let taps_major: &[f32] = if self.weight.dtype() == DType::F32 {
                self.taps_major.get_or_init(|| taps_major(weight, cout, cin, kh * kw))
            } else {
                per_call = taps_major(weight, cout, cin, kh * kw);
                &per_call
            };
            // Output rows per piece of the product, each with its own column rows.
            let rows = (macs_per_check / (wo * k * cout).max(1)).clamp(1, ho);
            let out = with_buffer(&PIXEL_MAJOR, |(pixels, products)| {
                products.resize(products.len().max(b * p * cout), 0.0);
                let products = &mut products[..b * p * cout];
                with_buffer(&COLUMNS, |columns| {
                    columns.resize(columns.len().max(rows * wo * k), 0.0);
                    for (image, y) in x.chunks_exact(cin * h * w).zip(products.chunks_exact_mut(p * cout)) {
                        stop.check()?;
                        channels_last(image, cin, h * w, pixels);
                        for (piece, y) in y.chunks_mut(rows * wo * cout).enumerate() {
                            stop.check()?;
                            let positions = y.len() / cout;
                            let columns = &mut columns[..positions * k];
                            fill_pixel_columns(pixels, columns, g, piece * rows);
                            let cols = View::rows(columns, positions, k);
                            matmul(y, cout, cols, View::rows(taps_major, k, cout), 1.0, false, true);
                        }
                    }
                    Ok::<_, candle_core::Error>(())
                })?;
                start.output_from_pixel_major(products)
            })?;
            return Ok(out);
        }
        let mut out = start.output()?;
        // Output positions per piece of the product: a multiple of 64, for whole vectors.
        let piece = (macs_per_check / (cout * k).max(1)).max(1).next_multiple_of(64).min(p);
        with_buffer(&COLUMNS, |columns| {
            if !one_by_one {
                // Every element is overwritten by `fill_columns`; only growth is zeroed.
                columns.resize(columns.len().max(k * p), 0.0);
            }
            for (image, y) in x.chunks_exact(cin * h * w).zip(out.chunks_exact_mut(cout * p)) {
                stop.check()?;
                // A 1×1 convolution multiplies the image itself.
                let rhs: &[f32] = if one_by_one {
                    image
                } else {
                    let columns = &mut columns[..k * p];
                    columns.par_chunks_mut(kh * kw * p).enumerate().for_each(|(c, rows)| {
                        let plane = &image[c * h * w..][..h * w];
                        fill_columns(plane, rows, (h, w), kw, (ho, wo), s, pad);
                    });
                    columns
                };
                // Pieces of `piece` columns (output positions) of the product.
                for first in (0..p).step_by(piece) {
                    if first > 0 {
                        stop.check()?;
                    }
                    let n = piece.min(p - first);
                    let rhs = View {
                        data: &rhs[first..],
                        rows: k,
                        cols: n,
                        row_stride: p,
                        col_stride: 1,
                    };
                    matmul(&mut y[first..], p, View::rows(weight, cout, k), rhs, 1.0, true, true);
                }
            }
            Ok::<_, candle_core::Error>(())
        })?;
        Ok(out)
    }

    /// A 1×1 convolution from NCHW `x` to tokens `[b, h·w, cout]`, the layout of the
    /// transformer blocks (the transpose is folded into the product).
    pub(crate) fn forward_to_tokens(&self, x: &Tensor) -> Result<Tensor> {
        let (b, cin, h, w) = x.dims4()?;
        let cout = self.pointwise(cin)?;
        if !(x.device().is_cpu() && x.dtype() == DType::F32) {
            return self.forward(x)?.flatten_from(2)?.transpose(1, 2)?.contiguous();
        }
        let p = h * w;
        let x = x.contiguous()?;
        let input = CpuF32::new(&x, "conv2d")?;
        let biases = CpuF32::new(&self.bias, "conv2d")?;
        let (x, bias) = (input.contiguous("conv2d")?, biases.contiguous("conv2d")?);
        let mut out = par_init(b * p * cout, cout * ROWS_PER_TASK, |_, y| repeated(y, bias));
        with_f32(&self.weight, "conv2d", |weight| {
            for (image, y) in x.chunks_exact(cin * p).zip(out.chunks_exact_mut(p * cout)) {
                // Tokens × input channels is the image's transpose: rows 1 apart, columns p
                // apart.
                let tokens = View {
                    data: image,
                    rows: p,
                    cols: cin,
                    row_stride: 1,
                    col_stride: p,
                };
                matmul(y, cout, tokens, View::rows(weight, cout, cin).t(), 1.0, true, true);
            }
            Ok(())
        })?;
        Tensor::from_vec(out, (b, p, cout), self.weight.device())
    }

    /// A 1×1 convolution from tokens `[b, h·w, cin]` back to NCHW `[b, cout, h, w]`, plus
    /// `residual` (of the output's shape).
    pub(crate) fn forward_from_tokens(
        &self,
        tokens: &Tensor,
        (h, w): (usize, usize),
        residual: &Tensor,
    ) -> Result<Tensor> {
        let (b, p, cin) = tokens.dims3()?;
        let cout = self.pointwise(cin)?;
        if p != h * w {
            candle_core::bail!("conv2d: {p} tokens do not form a {h}x{w} image");
        }
        if !(tokens.device().is_cpu() && tokens.dtype() == DType::F32) {
            let spatial = tokens.transpose(1, 2)?.reshape((b, cin, h, w))?;
            return self.forward(&spatial)? + residual;
        }
        let tokens = tokens.contiguous()?;
        let input = CpuF32::new(&tokens, "conv2d")?;
        let start = Start::new(&self.bias, None, Some(residual), (b, cout, p))?;
        let mut out = start.output()?;
        let t = input.contiguous("conv2d")?;
        with_f32(&self.weight, "conv2d", |weight| {
            for (image, y) in t.chunks_exact(p * cin).zip(out.chunks_exact_mut(cout * p)) {
                let image = View::rows(image, p, cin).t();
                matmul(y, p, View::rows(weight, cout, cin), image, 1.0, true, true);
            }
            Ok(())
        })?;
        Tensor::from_vec(out, (b, cout, h, w), self.weight.device())
    }

    /// The output channels of this convolution if it is a 1×1 one over `cin` channels.
    fn pointwise(&self, cin: usize) -> Result<usize> {
        let (cout, wcin, kh, kw) = self.weight.dims4()?;
        if (kh, kw, self.stride, self.padding) != (1, 1, 1, 0) || wcin != cin {
            candle_core::bail!(
                "conv2d: a token projection needs a 1x1 kernel over {cin} channels, not {:?}",
                self.weight.shape()
            );
        }
        Ok(cout)
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_fused(x, None, None)
    }
}

/// What an NCHW output starts from before the product accumulates onto it: the bias, plus a
/// per-image channel shift and a residual when given.
struct Start<'a> {
    bias: CpuF32<'a>,
    shift: Option<CpuF32<'a>>,
    residual: Option<CpuF32<'a>>,
    /// Images, channels, positions per channel.
    dims: (usize, usize, usize),
}

impl<'a> Start<'a> {
    fn new(
        bias: &'a Tensor,
        shift: Option<&'a Tensor>,
        residual: Option<&'a Tensor>,
        (b, cout, p): (usize, usize, usize),
    ) -> Result<Self> {
        if bias.dims() != [cout] {
            candle_core::bail!("conv2d: bias {:?} for {cout} channels", bias.shape());
        }
        if let Some(shift) = shift {
            if shift.dims() != [b, cout] || !shift.is_contiguous() {
                candle_core::bail!("conv2d: shift {:?} for {b} images of {cout} channels", shift.shape());
            }
        }
        if let Some(residual) = residual {
            if residual.elem_count() != b * cout * p || residual.dim(0)? != b || residual.dim(1)? != cout {
                candle_core::bail!(
                    "conv2d: residual {:?} for an output of {b}x{cout}x{p}",
                    residual.shape()
                );
            }
            if !residual.is_contiguous() {
                candle_core::bail!("conv2d: the residual must be contiguous");
            }
        }
        Ok(Start {
            bias: CpuF32::new(bias, "conv2d")?,
            shift: shift.map(|t| CpuF32::new(t, "conv2d")).transpose()?,
            residual: residual.map(|t| CpuF32::new(t, "conv2d")).transpose()?,
            dims: (b, cout, p),
        })
    }

    /// The NCHW output of pixel-major `products` (`[b, positions, cout]`) plus the bias,
    /// shift and residual; each task turns [`CHANNEL_BLOCK`] channels (or fewer, whatever
    /// divides the channel count) of one image.
    fn output_from_pixel_major(&self, products: &[f32]) -> Result<Vec<f32>> {
        let (b, cout, p) = self.dims;
        let bias = self.bias.contiguous("conv2d")?;
        let shift = self.shift.as_ref().map(|s| s.contiguous("conv2d")).transpose()?;
        let residual = self.residual.as_ref().map(|r| r.contiguous("conv2d")).transpose()?;
        let block = (1..=CHANNEL_BLOCK).rev().find(|n| cout % n == 0).unwrap_or(1);
        Ok(par_init(b * cout * p, block * p, |task, out| {
            let out = filled(out, 0.0);
            let first_row = task * block;
            let (image, first_channel) = (first_row / cout, first_row % cout);
            let mut values = [0f32; CHANNEL_BLOCK];
            for (j, value) in values.iter_mut().enumerate().take(block) {
                *value = bias[first_channel + j] + shift.map_or(0.0, |s| s[first_row + j]);
            }
            let products = &products[image * p * cout..][..p * cout];
            for (position, pixel) in products.chunks_exact(cout).enumerate() {
                for (j, &y) in pixel[first_channel..first_channel + block].iter().enumerate() {
                    out[j * p + position] = y + values[j];
                }
            }
            if let Some(r) = residual {
                let r = &r[first_row * p..][..block * p];
                out.iter_mut().zip(r).for_each(|(y, r)| *y += r);
            }
            out
        }))
    }

    /// The starting output, filled in parallel, one channel row per task.
    fn output(&self) -> Result<Vec<f32>> {
        let (b, cout, p) = self.dims;
        let bias = self.bias.contiguous("conv2d")?;
        let shift = self.shift.as_ref().map(|s| s.contiguous("conv2d")).transpose()?;
        let residual = self.residual.as_ref().map(|r| r.contiguous("conv2d")).transpose()?;
        Ok(par_init(b * cout * p, p, |row, y| {
            let value = bias[row % cout] + shift.map_or(0.0, |s| s[row]);
            match residual {
                Some(r) => {
                    let y = y.write_copy_of_slice(&r[row * p..][..p]);
                    y.iter_mut().for_each(|y| *y += value);
                    y
                }
                None => filled(y, value),
            }
        }))
    }
}

/// `weight` (`[cout, cin, taps]`) as `[(tap, cin), cout]`, the pixel-major product's right
/// side.
fn taps_major(weight: &[f32], cout: usize, cin: usize, taps: usize) -> Vec<f32> {
    let mut out = vec![0f32; weight.len()];
    for (co, filters) in weight.chunks_exact(cin * taps).enumerate() {
        for (c, filter) in filters.chunks_exact(taps).enumerate() {
            for (tap, &value) in filter.iter().enumerate() {
                out[(tap * cin + c) * cout + co] = value;
            }
        }
    }
    out
}

/// `image` (`[cin, positions]`) as `[positions, cin]` in `into`, in parallel blocks of 16
/// positions (one cache line of each channel per block).
fn channels_last(image: &[f32], cin: usize, positions: usize, into: &mut Vec<f32>) {
    into.resize(into.len().max(positions * cin), 0.0);
    into[..positions * cin]
        .par_chunks_mut(16 * cin)
        .enumerate()
        .for_each(|(block, out)| {
            let first = block * 16;
            let count = out.len() / cin;
            for (c, plane) in image.chunks_exact(positions).enumerate() {
                for (j, &v) in plane[first..first + count].iter().enumerate() {
                    out[j * cin + c] = v;
                }
            }
        });
}

/// The shapes of one convolution.
struct Geometry {
    cin: usize,
    input: (usize, usize),
    kernel: (usize, usize),
    output: (usize, usize),
    stride: usize,
    pad: usize,
}

/// The pixel-major column matrix (`[h'·w', (tap, cin)]`) from a channels-last image: each
/// output pixel's row is, tap by tap, the input pixel under that tap (its `cin` channels,
/// one contiguous copy) or zeros in the padding. `columns` holds the rows of the output
/// rows from `first_row` on (as many as it has room for). One parallel task per output row.
fn fill_pixel_columns(pixels: &[f32], columns: &mut [f32], g: &Geometry, first_row: usize) {
    let ((h, w), (kh, kw), (_, wo), cin) = (g.input, g.kernel, g.output, g.cin);
    let row_len = kh * kw * cin;
    columns
        .par_chunks_mut(wo * row_len)
        .enumerate()
        .for_each(|(row, out_row)| {
            let oy = first_row + row;
            for (ox, pixel) in out_row.chunks_exact_mut(row_len).enumerate() {
                for (tap, segment) in pixel.chunks_exact_mut(cin).enumerate() {
                    let sy = (oy * g.stride + tap / kw) as isize - g.pad as isize;
                    let sx = (ox * g.stride + tap % kw) as isize - g.pad as isize;
                    if sy < 0 || sx < 0 || sy >= h as isize || sx >= w as isize {
                        segment.fill(0.0);
                    } else {
                        let at = (sy as usize * w + sx as usize) * cin;
                        segment.copy_from_slice(&pixels[at..at + cin]);
                    }
                }
            }
        });
}

/// The `kh·kw` rows of one input channel's column block: row `(i, j)` is the plane shifted
/// by tap `(i, j)`, sampled at the output positions (zeros where the tap falls in padding).
fn fill_columns(
    plane: &[f32],
    rows: &mut [f32],
    (h, w): (usize, usize),
    kw: usize,
    (ho, wo): (usize, usize),
    stride: usize,
    pad: usize,
) {
    for (tap, row) in rows.chunks_exact_mut(ho * wo).enumerate() {
        let (i, j) = (tap / kw, tap % kw);
        for (oy, out) in row.chunks_exact_mut(wo).enumerate() {
            let sy = (oy * stride + i) as isize - pad as isize;
            if sy < 0 || sy >= h as isize {
                out.fill(0.0);
                continue;
            }
            let src = &plane[sy as usize * w..][..w];
            // Output columns whose source column sx = ox·stride + j - pad lies inside 0..w.
            let first = (pad.saturating_sub(j)).div_ceil(stride).min(wo);
            let last = ((w + pad).saturating_sub(j)).div_ceil(stride).clamp(first, wo);
            out[..first].fill(0.0);
            out[last..].fill(0.0);
            if stride == 1 {
                let start = first + j - pad;
                out[first..last].copy_from_slice(&src[start..start + (last - first)]);
            } else {
                for (ox, o) in out.iter_mut().enumerate().take(last).skip(first) {
                    *o = src[ox * stride + j - pad];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A convolution with random weights.
    fn random_conv(cin: usize, cout: usize, kernel: usize, stride: usize, padding: usize) -> Conv2d {
        let dev = Device::Cpu;
        Conv2d {
            weight: Tensor::randn(0f32, 1.0, (cout, cin, kernel, kernel), &dev).unwrap(),
            bias: Tensor::randn(0f32, 1.0, cout, &dev).unwrap(),
            stride,
            padding,
            taps_major: OnceLock::new(),
        }
    }

    /// candle's convolution with the same weights.
    fn reference(conv: &Conv2d, x: &Tensor) -> Tensor {
        let cfg = Conv2dConfig {
            padding: conv.padding,
            stride: conv.stride,
            ..Default::default()
        };
        candle_nn::Conv2d::new(conv.weight.clone(), Some(conv.bias.clone()), cfg)
            .forward(x)
            .unwrap()
    }

    fn compare(shape: (usize, usize, usize, usize), cout: usize, kernel: usize, stride: usize, padding: usize) {
        let ours = random_conv(shape.1, cout, kernel, stride, padding);
        let x = Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap();
        let got = ours.forward(&x).unwrap();
        let want = reference(&ours, &x);
        assert_eq!(got.dims(), want.dims(), "{shape:?} k{kernel} s{stride} p{padding}");
        let diff = crate::max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{shape:?} k{kernel} s{stride} p{padding}: {diff}");
    }

    #[test]
    fn equals_candle_conv2d() {
        compare((2, 5, 9, 7), 6, 3, 1, 1); // the UNet's 3x3 convolutions
        compare((2, 5, 9, 7), 6, 3, 2, 1); // its downsampling, odd sizes
        compare((1, 8, 6, 6), 3, 1, 1, 0); // 1x1 projections: no column matrix
        compare((1, 3, 8, 5), 4, 3, 1, 0); // no padding
        compare((1, 2, 7, 7), 3, 5, 2, 2); // a larger kernel and stride
        compare((1, 2, 4, 4), 3, 3, 3, 2); // padding wider than the stride covers
    }

    /// `forward_fused` with a shift and a residual against candle's convolution plus both,
    /// for `cin → cout` on `(b, h, w)` inputs.
    fn compare_fused((b, cin, h, w): (usize, usize, usize, usize), cout: usize, kernel: usize, padding: usize) {
        let dev = Device::Cpu;
        let conv = random_conv(cin, cout, kernel, 1, padding);
        let x = Tensor::randn(0f32, 1.0, (b, cin, h, w), &dev).unwrap();
        let shift = Tensor::randn(0f32, 1.0, (b, cout), &dev).unwrap();
        let out = conv.forward(&x).unwrap();
        let residual = Tensor::randn(0f32, 1.0, out.dims(), &dev).unwrap();
        let got = conv.forward_fused(&x, Some(&shift), Some(&residual)).unwrap();
        let want = reference(&conv, &x)
            .broadcast_add(&shift.unsqueeze(2).unwrap().unsqueeze(3).unwrap())
            .unwrap()
            .add(&residual)
            .unwrap();
        let diff = crate::max_abs_diff(&got, &want);
        assert!(diff < 1e-4, "{cin}->{cout} k{kernel} on {h}x{w}: {diff}");
    }

    /// Half-precision weights give exactly what their float32 values give, on every path:
    /// channel-major, Winograd, pixel-major (stride 2 at 48x48 outputs), 1x1 and the token
    /// layouts.
    #[test]
    fn half_weights_compute_on_their_exact_float32_values() {
        let dev = Device::Cpu;
        for dtype in [DType::F16, DType::BF16] {
            let cases = [(5, 6, 3, 1, 9), (4, 32, 3, 1, 48), (3, 16, 3, 2, 96), (8, 6, 1, 1, 9)];
            for (cin, cout, kernel, stride, size) in cases {
                let mut half = random_conv(cin, cout, kernel, stride, kernel / 2);
                half.weight = half.weight.to_dtype(dtype).unwrap();
                let mut widened = half.clone();
                widened.weight = half.weight.to_dtype(DType::F32).unwrap();
                let x = Tensor::randn(0f32, 1.0, (2, cin, size, size), &dev).unwrap();
                let (got, want) = (half.forward(&x).unwrap(), widened.forward(&x).unwrap());
                assert_eq!(
                    crate::max_abs_diff(&got, &want),
                    0.0,
                    "{dtype:?} {cin}->{cout} k{kernel} {size}"
                );
                assert_eq!(half.dtype(), DType::F32);
                if kernel == 1 {
                    let tokens = half.forward_to_tokens(&x).unwrap();
                    let want_tokens = widened.forward_to_tokens(&x).unwrap();
                    assert_eq!(crate::max_abs_diff(&tokens, &want_tokens), 0.0);
                    let tokens = Tensor::randn(0f32, 1.0, (2, size * size, cin), &dev).unwrap();
                    let residual = Tensor::randn(0f32, 1.0, (2, cout, size, size), &dev).unwrap();
                    let back = half.forward_from_tokens(&tokens, (size, size), &residual).unwrap();
                    let want_back = widened.forward_from_tokens(&tokens, (size, size), &residual).unwrap();
                    assert_eq!(crate::max_abs_diff(&back, &want_back), 0.0);
                }
            }
        }
    }

    #[test]
    fn shift_and_residual_are_added() {
        compare_fused((2, 5, 7, 9), 6, 3, 1);
        compare_fused((2, 5, 7, 9), 6, 1, 0);
    }

    /// 3x3 stride-1 convolutions of at least `winograd::MIN_POSITIONS` pixels go through
    /// Winograd's transforms: even and odd sizes, a shift and a residual.
    #[test]
    fn winograd_equals_candle_conv2d() {
        compare((2, 5, 33, 35), 6, 3, 1, 1);
        compare((1, 17, 32, 32), 9, 3, 1, 1);
        compare((1, 3, 64, 17), 2, 3, 1, 1);
        compare((1, 40, 16, 16), 43, 3, 1, 1);
        compare_fused((2, 4, 32, 33), 5, 3, 1);
    }

    /// Outputs of at least `PIXEL_MAJOR_MIN_POSITIONS` positions that Winograd's transforms
    /// do not take (no padding, a stride) run pixel-major: channel counts that 16 does and
    /// does not divide, a shift and a residual.
    #[test]
    fn pixel_major_equals_candle_conv2d() {
        compare((2, 3, 48, 50), 16, 3, 1, 0);
        compare((1, 5, 47, 50), 20, 3, 1, 0);
        compare((1, 3, 96, 97), 18, 3, 2, 1);
        compare_fused((2, 4, 48, 50), 32, 3, 0);
    }

    #[test]
    fn token_projections_fold_the_transposes() {
        let dev = Device::Cpu;
        let conv = random_conv(5, 5, 1, 1, 0);
        let x = Tensor::randn(0f32, 1.0, (2, 5, 3, 4), &dev).unwrap();
        let tokens = conv.forward_to_tokens(&x).unwrap();
        let want = conv
            .forward(&x)
            .unwrap()
            .flatten_from(2)
            .unwrap()
            .transpose(1, 2)
            .unwrap();
        assert_eq!(tokens.dims(), [2, 12, 5]);
        assert!(crate::max_abs_diff(&tokens, &want) < 1e-5);

        let residual = Tensor::randn(0f32, 1.0, (2, 5, 3, 4), &dev).unwrap();
        let back = conv.forward_from_tokens(&tokens, (3, 4), &residual).unwrap();
        let spatial = tokens.transpose(1, 2).unwrap().reshape((2, 5, 3, 4)).unwrap();
        let want = (conv.forward(&spatial).unwrap() + &residual).unwrap();
        assert!(crate::max_abs_diff(&back, &want) < 1e-5);

        // Only 1x1 convolutions project tokens; the token count must form the image.
        assert!(random_conv(5, 5, 3, 1, 1).forward_to_tokens(&x).is_err());
        assert!(conv.forward_from_tokens(&tokens, (4, 4), &residual).is_err());
    }

    /// The product cut into pieces (of output rows pixel-major, of output positions
    /// channel-major, for 1x1 convolutions too) gives the same bits as in one piece.
    #[test]
    fn pieces_of_the_product_give_the_same_bits() {
        let dev = Device::Cpu;
        // (input shape, cout, kernel, stride, padding): pixel-major, a 1x1 convolution and
        // channel-major with a column matrix (too few output channels for pixel-major).
        for (shape, cout, kernel, stride, padding) in [
            ((2, 5, 96, 97), 18, 3, 2, 1),
            ((1, 4, 64, 64), 32, 3, 1, 0),
            ((2, 24, 50, 47), 20, 1, 1, 0),
            ((1, 6, 40, 41), 7, 3, 2, 1),
        ] {
            let conv = random_conv(shape.1, cout, kernel, stride, padding);
            let x = Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
            let whole = conv
                .forward_in_pieces(&x, None, None, Interrupt::NEVER, usize::MAX)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for macs in [1, 5_000, 300_000] {
                let pieces = conv
                    .forward_in_pieces(&x, None, None, Interrupt::NEVER, macs)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                let same = whole.iter().zip(&pieces).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{shape:?} -> {cout} k{kernel} s{stride}: pieces of {macs} differ");
            }
        }
    }

    /// An interrupt that fires once it has been asked `checks` times.
    fn after(checks: usize) -> impl Fn() -> bool + Sync {
        let asked = std::sync::atomic::AtomicUsize::new(0);
        move || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= checks
    }

    /// A convolution stops part way, between Winograd passes or pieces of its product, once
    /// its interrupt fires, on every path; it runs to the end when it does not.
    #[test]
    fn an_interrupt_stops_a_convolution_part_way() {
        let dev = Device::Cpu;
        for (shape, cout, kernel, stride, padding) in [
            ((1, 4, 64, 64), 8, 3, 1, 1),   // Winograd
            ((1, 4, 64, 64), 32, 3, 1, 0),  // pixel-major
            ((1, 24, 50, 47), 20, 1, 1, 0), // 1x1
            ((1, 6, 40, 41), 7, 3, 2, 1),   // channel-major
        ] {
            let conv = random_conv(shape.1, cout, kernel, stride, padding);
            let x = Tensor::randn(0f32, 1.0, shape, &dev).unwrap();
            for checks in [0, 1, 2] {
                let stop = after(checks);
                let stopped = if kernel == 3 && stride == 1 && padding == 1 {
                    // Passes of a row of tiles each: one per check.
                    let (x, weight) = (x.flatten_all().unwrap(), conv.weight.flatten_all().unwrap());
                    let (x, weight) = (x.to_vec1::<f32>().unwrap(), weight.to_vec1::<f32>().unwrap());
                    let mut out = vec![0f32; cout * 64 * 64];
                    winograd::accumulate_within(&x, &weight, (1, 4, 64, 64), &mut out, 1, Interrupt::new(&stop))
                        .is_err()
                } else {
                    conv.forward_in_pieces(&x, None, None, Interrupt::new(&stop), 1)
                        .is_err()
                };
                assert!(stopped, "{shape:?} k{kernel} ran on after {checks} checks");
            }
            let stop = after(usize::MAX);
            assert!(conv
                .forward_interruptible(&x, None, None, Interrupt::new(&stop))
                .is_ok());
            let fired = || true;
            assert!(conv
                .forward_interruptible(&x, None, None, Interrupt::new(&fired))
                .is_err());
        }
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let dev = Device::Cpu;
        let conv = Conv2d {
            weight: Tensor::zeros((4, 3, 3, 3), DType::F32, &dev).unwrap(),
            bias: Tensor::zeros(4, DType::F32, &dev).unwrap(),
            stride: 1,
            padding: 0,
            taps_major: OnceLock::new(),
        };
        let wrong_channels = Tensor::zeros((1, 2, 8, 8), DType::F32, &dev).unwrap();
        assert!(conv.forward(&wrong_channels).is_err());
        let too_small = Tensor::zeros((1, 3, 2, 2), DType::F32, &dev).unwrap();
        assert!(conv.forward(&too_small).is_err());
        let empty = Tensor::zeros((1, 3, 0, 8), DType::F32, &dev).unwrap();
        assert!(conv.forward(&empty).is_err());
        let x = Tensor::zeros((1, 3, 4, 4), DType::F32, &dev).unwrap();
        let wrong_shift = Tensor::zeros((1, 3), DType::F32, &dev).unwrap();
        assert!(conv.forward_fused(&x, Some(&wrong_shift), None).is_err());
        let wrong_residual = Tensor::zeros((1, 4, 3, 3), DType::F32, &dev).unwrap();
        assert!(conv.forward_fused(&x, None, Some(&wrong_residual)).is_err());
    }
}
