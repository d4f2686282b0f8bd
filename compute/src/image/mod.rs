//! Image batches and the pixel work done on them: creation, inversion, scaling and decoding
//! uploads (PNG encoding is in [`crate::codecs`]). Layout follows ComfyUI's `IMAGE`: float32 in 0..=1,
//! `[batch, height, width, channels]`.

use std::io::Cursor;

use image::{GenericImageView, ImageBuffer, Rgb, Rgb32FImage};

use super::ComputeError;

pub mod alpha;
pub mod blend;
pub mod canny;
pub mod composite;
pub mod filter;
pub mod noise;
pub mod pillow;
pub mod porter_duff;
pub mod resample;
pub mod stitch;
pub mod transform;

#[cfg(test)]
pub(crate) mod fixture;

/// Largest image side the host creates or scales to (ComfyUI's `MAX_RESOLUTION`).
pub const MAX_SIDE: u32 = 16384;
/// Largest number of float values one batch may hold (256 Mi floats = 1 GiB).
pub const MAX_VALUES: u64 = 256 * 1024 * 1024;

/// One image of a batch, viewed in place.
type FrameView<'a> = ImageBuffer<Rgb<f32>, &'a [f32]>;

/// A batch of RGB images.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageBatch {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Number of images.
    pub batch: u32,
    /// Channels per pixel (always 3 for images the host makes).
    pub channels: u32,
    /// `batch * height * width * channels` values, row-major.
    pub data: Vec<f32>,
}

/// A batch of masks, float32 in 0..=1, `[batch, height, width]`.
#[derive(Debug, Clone, PartialEq)]
pub struct MaskBatch {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Number of masks.
    pub batch: u32,
    /// `batch * height * width` values.
    pub data: Vec<f32>,
}

/// Refuses a batch with an empty or oversized side, or more than [`MAX_VALUES`] values.
pub(crate) fn check_size(width: u32, height: u32, batch: u32, channels: u32) -> Result<(), ComputeError> {
    if width == 0 || height == 0 || batch == 0 {
        return Err(ComputeError::invalid("image sides and batch size must be at least 1"));
    }
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(ComputeError::invalid(format!(
            "image sides must be at most {MAX_SIDE} pixels, got {width}x{height}"
        )));
    }
    let values = width as u64 * height as u64 * batch as u64 * channels as u64;
    if values > MAX_VALUES {
        return Err(ComputeError::TooLarge(format!(
            "a {batch}x{width}x{height} image batch exceeds the host's limit of {MAX_VALUES} values"
        )));
    }
    Ok(())
}

impl ImageBatch {
    /// Number of values in one image of the batch.
    pub(crate) fn frame_len(&self) -> usize {
        (self.width * self.height * self.channels) as usize
    }

    /// Image `index` of the batch as an RGB float image, borrowing the batch's pixels.
    fn frame(&self, index: u32) -> FrameView<'_> {
        let len = self.frame_len();
        let start = index as usize * len;
        ImageBuffer::from_raw(self.width, self.height, &self.data[start..start + len])
            .expect("frame length matches size")
    }
}

/// A batch of `batch` images of one colour (`0xRRGGBB`), as ComfyUI's `EmptyImage`.
pub fn empty(width: u32, height: u32, batch: u32, color: u32) -> Result<ImageBatch, ComputeError> {
    check_size(width, height, batch, 3)?;
    let rgb = [
        ((color >> 16) & 0xff) as f32 / 255.0,
        ((color >> 8) & 0xff) as f32 / 255.0,
        (color & 0xff) as f32 / 255.0,
    ];
    let pixels = width as usize * height as usize * batch as usize;
    let mut data = Vec::with_capacity(pixels * 3);
    for _ in 0..pixels {
        data.extend_from_slice(&rgb);
    }
    Ok(ImageBatch {
        width,
        height,
        batch,
        channels: 3,
        data,
    })
}

/// Every value `v` becomes `1 - v`, as ComfyUI's `ImageInvert`.
pub fn invert(image: &ImageBatch) -> ImageBatch {
    ImageBatch {
        data: image.data.iter().map(|v| 1.0 - v).collect(),
        ..*image
    }
}

/// Scaling filters, by ComfyUI's `upscale_method` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleMethod {
    /// `nearest-exact`.
    NearestExact,
    /// `bilinear`.
    Bilinear,
    /// `area`: the mean of the source pixels each target pixel covers.
    Area,
    /// `bicubic`.
    Bicubic,
    /// `lanczos`.
    Lanczos,
}

impl std::str::FromStr for ScaleMethod {
    type Err = ComputeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "nearest-exact" => Self::NearestExact,
            "bilinear" => Self::Bilinear,
            "area" => Self::Area,
            "bicubic" => Self::Bicubic,
            "lanczos" => Self::Lanczos,
            other => {
                return Err(ComputeError::invalid(format!(
                    "unknown upscale_method {other:?}; expected nearest-exact, bilinear, area, bicubic or lanczos"
                )))
            }
        })
    }
}

/// The size [`scale`] makes of `image` for the requested `width` x `height`: a zero side
/// keeps the aspect ratio.
pub fn scaled_size(image: &ImageBatch, width: u32, height: u32) -> (u32, u32) {
    match (width, height) {
        (0, 0) => (image.width, image.height),
        (0, h) => (
            ((image.width as f64 * h as f64) / image.height as f64).round().max(1.0) as u32,
            h,
        ),
        (w, 0) => (
            w,
            ((image.height as f64 * w as f64) / image.width as f64).round().max(1.0) as u32,
        ),
        (w, h) => (w, h),
    }
}

/// Bytes [`scale`] holds at its peak besides its source: the result; the filter's
/// intermediate pass (RGBA floats, source width x target height, one image at a time); with
/// a batch, one resized image before it joins the result; with `center_crop`, the cropped
/// copy of one source image.
pub fn scale_peak_bytes(image: &ImageBatch, width: u32, height: u32, center_crop: bool) -> u64 {
    let (width, height) = scaled_size(image, width, height);
    let rgb = 3 * std::mem::size_of::<f32>() as u64;
    let resized = u64::from(width) * u64::from(height) * rgb;
    let result = resized * u64::from(image.batch);
    let pass = u64::from(image.width) * u64::from(height) * 4 * std::mem::size_of::<f32>() as u64;
    let staged = if image.batch > 1 { resized } else { 0 };
    let cropped = if center_crop {
        u64::from(image.width) * u64::from(image.height) * rgb
    } else {
        0
    };
    result + pass + staged + cropped
}

/// Resizes every image to `width` x `height`. A zero side keeps the aspect ratio; with
/// `center_crop` the source is first cropped to the target's aspect ratio, as ComfyUI does.
/// `keep_going` is asked before each image and every few million pixel-taps of filtering
/// inside one (~10 ms of work); when it says no, scaling stops with `None`.
pub fn scale(
    image: &ImageBatch,
    method: ScaleMethod,
    width: u32,
    height: u32,
    center_crop: bool,
    keep_going: &dyn Fn() -> bool,
) -> Result<Option<ImageBatch>, ComputeError> {
    let (width, height) = scaled_size(image, width, height);
    check_size(width, height, image.batch, 3)?;
    if image.channels != 3 {
        return Err(ComputeError::invalid("only 3-channel images can be scaled"));
    }
    let mut data = Vec::new();
    let mut work = Work::new(keep_going);
    for index in 0..image.batch {
        if !keep_going() {
            return Ok(None);
        }
        let frame = image.frame(index);
        let resized = match center_crop.then(|| crop_to_aspect(&frame, width, height)).flatten() {
            Some(cropped) => resize(&cropped, method, width, height, &mut work),
            None => resize(&frame, method, width, height, &mut work),
        };
        let Some(mut resized) = resized else {
            return Ok(None);
        };
        for v in &mut resized {
            *v = v.clamp(0.0, 1.0);
        }
        if image.batch == 1 {
            data = resized;
        } else {
            if data.is_empty() {
                data.reserve_exact(resized.len() * image.batch as usize);
            }
            data.extend_from_slice(&resized);
        }
    }
    Ok(Some(ImageBatch {
        width,
        height,
        batch: image.batch,
        channels: 3,
        data,
    }))
}

/// Pixel-taps (one source pixel weighed into one target pixel) between two questions to
/// the caller: about 10 ms of filtering.
const TAPS_PER_CHECK: u64 = 1 << 22;

/// Counts a long loop's work and asks the caller whether to go on every
/// [`TAPS_PER_CHECK`] of it.
pub(crate) struct Work<'a> {
    keep_going: &'a dyn Fn() -> bool,
    since_check: u64,
}

impl<'a> Work<'a> {
    /// Work for a caller who says whether to go on through `keep_going`.
    pub(crate) fn new(keep_going: &'a dyn Fn() -> bool) -> Self {
        Work {
            keep_going,
            since_check: 0,
        }
    }

    /// `taps` more done; false once the caller says stop.
    pub(crate) fn done(&mut self, taps: u64) -> bool {
        self.since_check += taps;
        if self.since_check < TAPS_PER_CHECK {
            return true;
        }
        self.since_check = 0;
        (self.keep_going)()
    }

    /// [`Work::done`] as a result: [`ComputeError::Interrupted`] once the caller says stop.
    pub(crate) fn step(&mut self, taps: u64) -> Result<(), ComputeError> {
        if self.done(taps) {
            Ok(())
        } else {
            Err(ComputeError::Interrupted)
        }
    }
}

/// `frame` resized to `width` x `height` with `method`, as RGB values; `None` when `work`
/// was told to stop.
fn resize<C: std::ops::Deref<Target = [f32]>>(
    frame: &ImageBuffer<Rgb<f32>, C>,
    method: ScaleMethod,
    width: u32,
    height: u32,
    work: &mut Work<'_>,
) -> Option<Vec<f32>> {
    let (kernel, support): (fn(f32) -> f32, f32) = match method {
        ScaleMethod::Area => return area_resize(frame, width, height, work).map(Rgb32FImage::into_raw),
        ScaleMethod::NearestExact => (|_| 1.0, 0.0),
        ScaleMethod::Bilinear => (triangle, 1.0),
        ScaleMethod::Bicubic => (catmull_rom, 2.0),
        ScaleMethod::Lanczos => (lanczos3, 3.0),
    };
    let (sw, sh) = frame.dimensions();
    if (sw, sh) == (width, height) {
        return Some(frame.as_raw().to_vec());
    }
    let filter = Filter { kernel, support };
    let columns = vertical_pass(frame.as_raw(), (sw, sh), height, &filter, work)?;
    horizontal_pass(&columns, (sw, height), width, &filter, work)
}

/// A separable resampling filter: its kernel, and its half-width in target pixels.
struct Filter {
    kernel: fn(f32) -> f32,
    support: f32,
}

impl Filter {
    /// For each of `to` target positions along an axis of `from` source pixels, the first
    /// source pixel it reads and the normalised weights of those it reads: the `image`
    /// crate's `resize` (its `vertical_sample` and `horizontal_sample`), operation for
    /// operation, so that results are the same to the bit.
    fn taps(&self, from: u32, to: u32) -> Vec<(u32, Vec<f32>)> {
        let ratio = from as f32 / to as f32;
        let sratio = if ratio < 1.0 { 1.0 } else { ratio };
        let src_support = self.support * sratio;
        (0..to)
            .map(|out| {
                let input = (out as f32 + 0.5) * ratio;
                let left = ((input - src_support).floor() as i64).clamp(0, i64::from(from) - 1) as u32;
                let right = ((input + src_support).ceil() as i64).clamp(i64::from(left) + 1, i64::from(from)) as u32;
                let input = input - 0.5;
                let mut weights: Vec<f32> = (left..right)
                    .map(|i| (self.kernel)((i as f32 - input) / sratio))
                    .collect();
                let sum: f32 = weights.iter().fold(0.0, |a, w| a + w);
                weights.iter_mut().for_each(|w| *w /= sum);
                (left, weights)
            })
            .collect()
    }
}

/// The source's columns resampled to `to` rows (RGB, `sw` x `to`).
fn vertical_pass(
    pixels: &[f32],
    (sw, sh): (u32, u32),
    to: u32,
    filter: &Filter,
    work: &mut Work<'_>,
) -> Option<Vec<f32>> {
    let row = sw as usize * 3;
    let mut out = vec![0f32; row * to as usize];
    for ((left, weights), target) in filter.taps(sh, to).iter().zip(out.chunks_exact_mut(row)) {
        for x in 0..sw as usize {
            let mut t = [0f32; 3];
            for (i, w) in weights.iter().enumerate() {
                let p = &pixels[(*left as usize + i) * row + x * 3..][..3];
                for c in 0..3 {
                    t[c] += p[c] * w;
                }
            }
            target[x * 3..x * 3 + 3].copy_from_slice(&t);
        }
        if !work.done(u64::from(sw) * weights.len() as u64) {
            return None;
        }
    }
    Some(out)
}

/// The rows of `columns` (`sw` x `h`) resampled to `to` columns and clamped to 0..=1.
fn horizontal_pass(
    columns: &[f32],
    (sw, h): (u32, u32),
    to: u32,
    filter: &Filter,
    work: &mut Work<'_>,
) -> Option<Vec<f32>> {
    let taps = filter.taps(sw, to);
    let per_row: u64 = taps.iter().map(|(_, w)| w.len() as u64).sum();
    let (row, out_row) = (sw as usize * 3, to as usize * 3);
    let mut out = vec![0f32; out_row * h as usize];
    for (source, target) in columns.chunks_exact(row).zip(out.chunks_exact_mut(out_row)) {
        for ((left, weights), pixel) in taps.iter().zip(target.chunks_exact_mut(3)) {
            let mut t = [0f32; 3];
            for (i, w) in weights.iter().enumerate() {
                let p = &source[(*left as usize + i) * 3..][..3];
                for c in 0..3 {
                    t[c] += p[c] * w;
                }
            }
            for c in 0..3 {
                pixel[c] = t[c].clamp(0.0, 1.0);
            }
        }
        if !work.done(per_row) {
            return None;
        }
    }
    Some(out)
}

/// The `image` crate's Lanczos kernel with a window of 3.
fn lanczos3(x: f32) -> f32 {
    let sinc = |t: f32| {
        let a = t * std::f32::consts::PI;
        if t == 0.0 {
            1.0
        } else {
            a.sin() / a
        }
    };
    if x.abs() < 3.0 {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

/// The `image` crate's Catmull-Rom cubic (its `bc_cubic_spline` with b = 0, c = 0.5).
fn catmull_rom(x: f32) -> f32 {
    let (b, c) = (0.0f32, 0.5f32);
    let a = x.abs();
    let k = if a < 1.0 {
        (12.0 - 9.0 * b - 6.0 * c) * a.powi(3) + (-18.0 + 12.0 * b + 6.0 * c) * a.powi(2) + (6.0 - 2.0 * b)
    } else if a < 2.0 {
        (-b - 6.0 * c) * a.powi(3)
            + (6.0 * b + 30.0 * c) * a.powi(2)
            + (-12.0 * b - 48.0 * c) * a
            + (8.0 * b + 24.0 * c)
    } else {
        0.0
    };
    k / 6.0
}

/// The triangle (bilinear) kernel.
fn triangle(x: f32) -> f32 {
    if x.abs() < 1.0 {
        1.0 - x.abs()
    } else {
        0.0
    }
}

/// The centre of `frame` cut to the aspect ratio of `width` x `height`; none when it
/// already has it.
fn crop_to_aspect(frame: &FrameView<'_>, width: u32, height: u32) -> Option<Rgb32FImage> {
    let (sw, sh) = frame.dimensions();
    let old = sw as f64 / sh as f64;
    let new = width as f64 / height as f64;
    let (x, y, w, h) = if old > new {
        let w = ((sh as f64) * new).round().max(1.0) as u32;
        ((sw - w) / 2, 0, w, sh)
    } else if old < new {
        let h = ((sw as f64) / new).round().max(1.0) as u32;
        (0, (sh - h) / 2, sw, h)
    } else {
        return None;
    };
    let pixels: &[f32] = frame.as_raw();
    let (row, stride) = (w as usize * 3, sw as usize * 3);
    let mut cropped = Vec::with_capacity(row * h as usize);
    for line in y..y + h {
        let start = line as usize * stride + x as usize * 3;
        cropped.extend_from_slice(&pixels[start..start + row]);
    }
    Some(ImageBuffer::from_raw(w, h, cropped).expect("cropped length matches size"))
}

/// Box-filter resize: each target pixel is the area-weighted mean of the source pixels it
/// covers (torch's `adaptive_avg_pool2d`, which ComfyUI's `area` uses).
fn area_resize<I: GenericImageView<Pixel = Rgb<f32>>>(
    frame: &I,
    width: u32,
    height: u32,
    work: &mut Work<'_>,
) -> Option<Rgb32FImage> {
    let (sw, sh) = frame.dimensions();
    let mut out: Rgb32FImage = ImageBuffer::new(width, height);
    for ty in 0..height {
        let taps = u64::from(sw.max(width)) * u64::from(sh.div_ceil(height).max(1));
        if !work.done(taps) {
            return None;
        }
        let y0 = (ty as u64 * sh as u64 / height as u64) as u32;
        let y1 = (((ty as u64 + 1) * sh as u64).div_ceil(height as u64) as u32).max(y0 + 1);
        for tx in 0..width {
            let x0 = (tx as u64 * sw as u64 / width as u64) as u32;
            let x1 = (((tx as u64 + 1) * sw as u64).div_ceil(width as u64) as u32).max(x0 + 1);
            let mut sum = [0f32; 3];
            for sy in y0..y1.min(sh) {
                for sx in x0..x1.min(sw) {
                    let p = frame.get_pixel(sx, sy);
                    for c in 0..3 {
                        sum[c] += p[c];
                    }
                }
            }
            let n = ((y1.min(sh) - y0) * (x1.min(sw) - x0)) as f32;
            out.put_pixel(tx, ty, Rgb([sum[0] / n, sum[1] / n, sum[2] / n]));
        }
    }
    Some(out)
}

/// A reader of an uploaded image file that refuses sides over [`MAX_SIDE`] and decoder
/// allocations over `max_alloc` bytes.
fn reader(bytes: &[u8], max_alloc: u64) -> Result<image::ImageReader<Cursor<&[u8]>>, ComputeError> {
    let mut reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ComputeError::invalid(format!("cannot read image: {e}")))?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(max_alloc);
    reader.limits(limits);
    Ok(reader)
}

/// Bytes [`decode`] holds at its peak for the image file `bytes`, read from its header
/// without decoding: the decoded pixels (at most 16 bytes each, RGBA float), their float
/// RGBA copy, and the RGB image and mask it returns.
pub fn decode_peak_bytes(bytes: &[u8]) -> Result<u64, ComputeError> {
    let (width, height) = reader(bytes, MAX_VALUES)?
        .into_dimensions()
        .map_err(|e| ComputeError::invalid(format!("cannot read image: {e}")))?;
    check_size(width, height, 1, 3)?;
    let pixels = u64::from(width) * u64::from(height);
    Ok(pixels * (16 + 16 + 12 + 4))
}

/// Decodes an uploaded image file (PNG, JPEG, ...): RGB pixels, and a mask that is 1 where
/// the image is transparent (ComfyUI's `LoadImage`; 0 everywhere without alpha). The
/// decoder may allocate at most `max_alloc` bytes (the caller's budget).
pub fn decode(bytes: &[u8], max_alloc: u64) -> Result<(ImageBatch, MaskBatch), ComputeError> {
    let decoded = decode_interruptible(bytes, max_alloc, &|| true)?;
    Ok(decoded.expect("decoding stops only when told to"))
}

/// Decoded bytes (PNG rows) or converted pixels between two questions to the caller: a few
/// milliseconds of inflating, unfiltering or converting.
const BYTES_PER_CHECK: usize = 1 << 20;

/// [`decode`], asking `keep_going` every [`BYTES_PER_CHECK`] of work: a PNG is decoded row
/// by row, and every format's pixels are converted a stretch of rows at a time. JPEG and
/// WebP files are decoded by one call into their codecs, which have no incremental API;
/// `keep_going` is asked before and after it. When it says no, decoding stops with `None`.
pub fn decode_interruptible(
    bytes: &[u8],
    max_alloc: u64,
    keep_going: &dyn Fn() -> bool,
) -> Result<Option<(ImageBatch, MaskBatch)>, ComputeError> {
    let max_alloc = max_alloc.min(MAX_VALUES);
    let reader = reader(bytes, max_alloc)?;
    if reader.format() == Some(image::ImageFormat::Png) {
        return png_rows(bytes, max_alloc, keep_going);
    }
    if !keep_going() {
        return Ok(None);
    }
    let decoded = reader
        .decode()
        .map_err(|e| ComputeError::invalid(format!("cannot decode image: {e}")))?;
    if !keep_going() {
        return Ok(None);
    }
    let rgba = decoded.to_rgba32f();
    let (width, height) = rgba.dimensions();
    check_size(width, height, 1, 3)?;
    let has_alpha = decoded.color().has_alpha();
    let mut out = Decoded::new(width, height);
    let rows_per_check = (BYTES_PER_CHECK / (width as usize * 16)).max(1);
    for (row, pixels) in rgba.as_raw().chunks_exact(width as usize * 4).enumerate() {
        if row % rows_per_check == 0 && row > 0 && !keep_going() {
            return Ok(None);
        }
        for p in pixels.chunks_exact(4) {
            out.push([p[0], p[1], p[2]], if has_alpha { 1.0 - p[3] } else { 0.0 });
        }
    }
    Ok(Some(out.finish()))
}

/// The image and mask [`decode`] returns, filled pixel by pixel.
struct Decoded {
    width: u32,
    height: u32,
    data: Vec<f32>,
    mask: Vec<f32>,
}

impl Decoded {
    fn new(width: u32, height: u32) -> Self {
        let pixels = width as usize * height as usize;
        Decoded {
            width,
            height,
            data: Vec::with_capacity(pixels * 3),
            mask: Vec::with_capacity(pixels),
        }
    }

    fn push(&mut self, rgb: [f32; 3], mask: f32) {
        self.data.extend_from_slice(&rgb);
        self.mask.push(mask);
    }

    fn finish(self) -> (ImageBatch, MaskBatch) {
        let (width, height) = (self.width, self.height);
        (
            ImageBatch {
                width,
                height,
                batch: 1,
                channels: 3,
                data: self.data,
            },
            MaskBatch {
                width,
                height,
                batch: 1,
                data: self.mask,
            },
        )
    }
}

/// A PNG file decoded as the `image` crate decodes it (the `png` crate expanding palettes,
/// low bit depths and transparency chunks; 16-bit samples kept; the decoded frame within
/// `max_alloc` bytes) and converted as its `to_rgba32f` does (`v / MAX` clamped, grey
/// copied to red, green and blue), to the same bits, but row by row: `keep_going` is asked
/// every [`BYTES_PER_CHECK`] of decoded rows. Interlaced files are decoded pass row by pass
/// row into the whole frame, then converted.
fn png_rows(
    bytes: &[u8],
    max_alloc: u64,
    keep_going: &dyn Fn() -> bool,
) -> Result<Option<(ImageBatch, MaskBatch)>, ComputeError> {
    let failed = |e: png::DecodingError| ComputeError::invalid(format!("cannot decode image: {e}"));
    let limit = usize::try_from(max_alloc).unwrap_or(usize::MAX);
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), png::Limits { bytes: limit });
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().map_err(failed)?;
    let (width, height) = (reader.info().width, reader.info().height);
    check_size(width, height, 1, 3)?;
    let (color, depth) = reader.output_color_type();
    let samples = color.samples();
    let wide = match depth {
        png::BitDepth::Eight => false,
        png::BitDepth::Sixteen => true,
        other => {
            return Err(ComputeError::invalid(format!(
                "cannot decode image: {other:?} bit samples of {color:?} after expansion"
            )))
        }
    };
    if color == png::ColorType::Indexed {
        return Err(ComputeError::invalid("cannot decode image: an unexpanded palette"));
    }
    let frame = reader
        .output_buffer_size()
        .ok_or_else(|| failed(png::DecodingError::LimitsExceeded))?;
    if frame as u64 > max_alloc {
        return Err(ComputeError::invalid(format!(
            "cannot decode image: its {width}x{height} pixels need {frame} bytes, over the limit of {max_alloc}"
        )));
    }
    let line = reader
        .output_line_size(width)
        .ok_or_else(|| failed(png::DecodingError::LimitsExceeded))?;
    let has_alpha = matches!(color, png::ColorType::GrayscaleAlpha | png::ColorType::Rgba);
    // Each row goes through the `image` crate's own conversion (as a one-row image), so that
    // grey and 16-bit samples come out as its `to_rgba32f` makes them.
    let convert = |row: &[u8], out: &mut Decoded| -> Result<(), ComputeError> {
        use image::DynamicImage as I;
        let bad = || ComputeError::invalid("cannot decode image: a row of the wrong length");
        let row = if wide {
            let values: Vec<u16> = row.chunks_exact(2).map(|b| u16::from_be_bytes([b[0], b[1]])).collect();
            match samples {
                1 => ImageBuffer::from_raw(width, 1, values).map(I::ImageLuma16),
                2 => ImageBuffer::from_raw(width, 1, values).map(I::ImageLumaA16),
                3 => ImageBuffer::from_raw(width, 1, values).map(I::ImageRgb16),
                _ => ImageBuffer::from_raw(width, 1, values).map(I::ImageRgba16),
            }
        } else {
            let values = row.to_vec();
            match samples {
                1 => ImageBuffer::from_raw(width, 1, values).map(I::ImageLuma8),
                2 => ImageBuffer::from_raw(width, 1, values).map(I::ImageLumaA8),
                3 => ImageBuffer::from_raw(width, 1, values).map(I::ImageRgb8),
                _ => ImageBuffer::from_raw(width, 1, values).map(I::ImageRgba8),
            }
        }
        .ok_or_else(bad)?;
        for p in row.to_rgba32f().pixels() {
            out.push([p[0], p[1], p[2]], if has_alpha { 1.0 - p[3] } else { 0.0 });
        }
        Ok(())
    };
    debug_assert_eq!(has_alpha, matches!(samples, 2 | 4));
    let rows_per_check = (BYTES_PER_CHECK / line.max(1)).max(1);
    let mut out = Decoded::new(width, height);
    if reader.info().interlaced {
        let mut whole = vec![0u8; frame];
        let bits_per_pixel = (samples * if wide { 16 } else { 8 }) as u8;
        let mut rows = 0;
        while let Some(row) = reader.next_interlaced_row().map_err(failed)? {
            let png::InterlaceInfo::Adam7(pass) = row.interlace() else {
                return Err(ComputeError::invalid(
                    "cannot decode image: a plain row in an interlaced file",
                ));
            };
            png::expand_interlaced_row(&mut whole, line, row.data(), pass, bits_per_pixel);
            rows += 1;
            if rows % rows_per_check == 0 && !keep_going() {
                return Ok(None);
            }
        }
        for (y, row) in whole.chunks_exact(line).enumerate() {
            if y % rows_per_check == 0 && y > 0 && !keep_going() {
                return Ok(None);
            }
            convert(row, &mut out)?;
        }
    } else {
        let mut row = vec![0u8; line];
        for y in 0..height as usize {
            if y % rows_per_check == 0 && y > 0 && !keep_going() {
                return Ok(None);
            }
            if reader.read_row(&mut row).map_err(failed)?.is_none() {
                return Err(ComputeError::invalid("cannot decode image: the image data ended early"));
            }
            convert(&row, &mut out)?;
        }
        // Past the last row, as the whole-frame decode does: the rest of the image data
        // is read and checked.
        if reader.read_row(&mut row).map_err(failed)?.is_some() {
            return Err(ComputeError::invalid("cannot decode image: more rows than its height"));
        }
    }
    Ok(Some(out.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_fills_the_colour_and_invert_complements_it() {
        let img = empty(4, 2, 2, 0xff0000).unwrap();
        assert_eq!(img.data.len(), 4 * 2 * 2 * 3);
        assert_eq!(&img.data[..3], &[1.0, 0.0, 0.0]);
        let inv = invert(&img);
        assert_eq!(&inv.data[..3], &[0.0, 1.0, 1.0]);
    }

    #[test]
    fn oversized_and_zero_images_are_refused() {
        assert!(empty(0, 4, 1, 0).is_err());
        assert!(empty(MAX_SIDE + 1, 4, 1, 0).is_err());
        assert!(matches!(empty(16384, 16384, 4096, 0), Err(ComputeError::TooLarge(_))));
    }

    #[test]
    fn scale_keeps_aspect_with_a_zero_side_and_area_averages() {
        let img = empty(8, 4, 1, 0x808080).unwrap();
        let half = scale(&img, ScaleMethod::Area, 4, 0, false, &|| true).unwrap().unwrap();
        assert_eq!((half.width, half.height), (4, 2));
        assert!((half.data[0] - 128.0 / 255.0).abs() < 1e-6);
        let cropped = scale(&img, ScaleMethod::Bilinear, 2, 2, true, &|| true)
            .unwrap()
            .unwrap();
        assert_eq!((cropped.width, cropped.height), (2, 2));
        assert!(scale(&img, ScaleMethod::Lanczos, 16, 16, false, &|| false)
            .unwrap()
            .is_none());
        // Every filter gives the `image` crate's results to the bit, up and down.
        let mut noisy = empty(37, 23, 1, 0).unwrap();
        for (i, v) in noisy.data.iter_mut().enumerate() {
            *v = ((i * 7919) % 1000) as f32 / 999.0;
        }
        let filters = [
            (ScaleMethod::NearestExact, image::imageops::FilterType::Nearest),
            (ScaleMethod::Bilinear, image::imageops::FilterType::Triangle),
            (ScaleMethod::Bicubic, image::imageops::FilterType::CatmullRom),
            (ScaleMethod::Lanczos, image::imageops::FilterType::Lanczos3),
        ];
        for (method, filter) in filters {
            for (w, h) in [(80, 51), (11, 7), (37, 9)] {
                let ours = scale(&noisy, method, w, h, false, &|| true).unwrap().unwrap();
                let theirs = image::imageops::resize(&noisy.frame(0), w, h, filter);
                let theirs: Vec<f32> = theirs.into_raw().iter().map(|v| v.clamp(0.0, 1.0)).collect();
                assert_eq!(ours.data, theirs, "{method:?} to {w}x{h}");
            }
        }
        // A stop inside one image: a large one asks long before it is done.
        let big = empty(2048, 1024, 1, 0x808080).unwrap();
        let asked = std::cell::Cell::new(0);
        let stop_soon = || {
            asked.set(asked.get() + 1);
            asked.get() < 3
        };
        assert!(scale(&big, ScaleMethod::Lanczos, 4096, 2048, false, &stop_soon)
            .unwrap()
            .is_none());
        assert_eq!(asked.get(), 3, "stopped at the first no");
        // 8x4 to 4x2: the result, and the pass of 8 source columns by 2 target rows (RGBA).
        assert_eq!(scale_peak_bytes(&img, 4, 0, false), 4 * 2 * 12 + 8 * 2 * 16);
    }

    /// The `image` crate's decode, which [`decode`] replaced for PNG files: its results.
    fn image_crate_decode(bytes: &[u8]) -> (Vec<f32>, Vec<f32>) {
        let decoded = image::load_from_memory(bytes).unwrap();
        let has_alpha = decoded.color().has_alpha();
        let rgba = decoded.to_rgba32f();
        let data = rgba.pixels().flat_map(|p| [p[0], p[1], p[2]]).collect();
        let mask = rgba
            .pixels()
            .map(|p| if has_alpha { 1.0 - p[3] } else { 0.0 })
            .collect();
        (data, mask)
    }

    fn png_file(
        width: u32,
        height: u32,
        color: png::ColorType,
        depth: png::BitDepth,
        extra: &[u8],
        data: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(color);
        encoder.set_depth(depth);
        if color == png::ColorType::Indexed {
            encoder.set_palette((0..=255u8).flat_map(|i| [i, 255 - i, i / 2]).collect::<Vec<_>>());
        }
        if !extra.is_empty() {
            encoder.set_trns(extra.to_vec());
        }
        encoder.write_header().unwrap().write_image_data(data).unwrap();
        out
    }

    /// An Adam7-interlaced 8-bit RGB PNG of `pixels`, written by hand (stored deflate blocks).
    fn interlaced_rgb8(width: u32, height: u32, pixels: &[u8]) -> Vec<u8> {
        fn crc(bytes: &[u8]) -> u32 {
            let mut c = !0u32;
            for &b in bytes {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 == 1 { 0xedb8_8320 ^ (c >> 1) } else { c >> 1 };
                }
            }
            !c
        }
        fn chunk(out: &mut Vec<u8>, kind: &[u8], data: &[u8]) {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let start = out.len();
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            let sum = crc(&out[start..]);
            out.extend_from_slice(&sum.to_be_bytes());
        }
        let (w, h) = (width as usize, height as usize);
        let mut raw = Vec::new();
        for (x0, y0, dx, dy) in [
            (0, 0, 8, 8),
            (4, 0, 8, 8),
            (0, 4, 4, 8),
            (2, 0, 4, 4),
            (0, 2, 2, 4),
            (1, 0, 2, 2),
            (0, 1, 1, 2),
        ] {
            if x0 >= w || y0 >= h {
                continue;
            }
            for y in (y0..h).step_by(dy) {
                raw.push(0);
                for x in (x0..w).step_by(dx) {
                    raw.extend_from_slice(&pixels[(y * w + x) * 3..][..3]);
                }
            }
        }
        let mut zlib = vec![0x78, 0x01];
        let blocks: Vec<&[u8]> = raw.chunks(0xffff).collect();
        for (i, block) in blocks.iter().enumerate() {
            zlib.push(u8::from(i + 1 == blocks.len()));
            zlib.extend_from_slice(&(block.len() as u16).to_le_bytes());
            zlib.extend_from_slice(&(!(block.len() as u16)).to_le_bytes());
            zlib.extend_from_slice(block);
        }
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in &raw {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        zlib.extend_from_slice(&((b << 16) | a).to_be_bytes());
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut header = Vec::new();
        header.extend_from_slice(&width.to_be_bytes());
        header.extend_from_slice(&height.to_be_bytes());
        header.extend_from_slice(&[8, 2, 0, 0, 1]);
        chunk(&mut out, b"IHDR", &header);
        chunk(&mut out, b"IDAT", &zlib);
        chunk(&mut out, b"IEND", &[]);
        out
    }

    /// PNG files of every colour type and depth, with transparency chunks and interlaced,
    /// decode row by row to the bits the `image` crate's decode gives.
    #[test]
    fn png_rows_decode_to_the_image_crates_bits() {
        use png::{BitDepth as D, ColorType as C};
        let (w, h) = (13u32, 11u32);
        let bytes = |n: usize| (0..n).map(|i| (i * 73 % 251) as u8).collect::<Vec<u8>>();
        let px = (w * h) as usize;
        let files = [
            png_file(w, h, C::Grayscale, D::Eight, &[], &bytes(px)),
            png_file(w, h, C::Grayscale, D::Sixteen, &[], &bytes(px * 2)),
            png_file(
                w,
                h,
                C::Grayscale,
                D::One,
                &[],
                &bytes(px.div_ceil(8) + h as usize)[..(w as usize).div_ceil(8) * h as usize],
            ),
            png_file(w, h, C::GrayscaleAlpha, D::Eight, &[], &bytes(px * 2)),
            png_file(w, h, C::GrayscaleAlpha, D::Sixteen, &[], &bytes(px * 4)),
            png_file(w, h, C::Rgb, D::Eight, &[], &bytes(px * 3)),
            png_file(w, h, C::Rgb, D::Eight, &[0, 146, 0, 219, 0, 36], &bytes(px * 3)),
            png_file(w, h, C::Rgb, D::Sixteen, &[], &bytes(px * 6)),
            png_file(w, h, C::Rgba, D::Eight, &[], &bytes(px * 4)),
            png_file(w, h, C::Rgba, D::Sixteen, &[], &bytes(px * 8)),
            png_file(w, h, C::Indexed, D::Eight, &[], &bytes(px)),
            png_file(w, h, C::Indexed, D::Eight, &[7, 200, 0], &bytes(px)),
            interlaced_rgb8(w, h, &bytes(px * 3)),
            interlaced_rgb8(1, 1, &[9, 8, 7]),
        ];
        for (i, file) in files.iter().enumerate() {
            let (image, mask) = decode(file, 1 << 20).unwrap();
            let (data, want_mask) = image_crate_decode(file);
            let same =
                |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(&image.data, &data), "file {i}: pixels differ");
            assert!(same(&mask.data, &want_mask), "file {i}: masks differ");
        }
        // A truncated file fails as one, and a decode told to stop stops.
        let file = &files[5];
        assert!(decode(&file[..file.len() - 20], 1 << 20).is_err());
        assert!(matches!(
            decode_interruptible(file, 1 << 20, &|| false),
            Ok(None) | Ok(Some(_))
        ));
        let big = png_file(512, 4096, C::Rgb, D::Eight, &[], &bytes(512 * 4096 * 3));
        assert!(decode_interruptible(&big, 1 << 30, &|| false).unwrap().is_none());
        let interlaced = interlaced_rgb8(1024, 1024, &bytes(1024 * 1024 * 3));
        assert!(decode_interruptible(&interlaced, 1 << 30, &|| false).unwrap().is_none());
        let jpeg = {
            let mut out = std::io::Cursor::new(Vec::new());
            image::RgbImage::from_raw(64, 64, bytes(64 * 64 * 3))
                .unwrap()
                .write_to(&mut out, image::ImageFormat::Jpeg)
                .unwrap();
            out.into_inner()
        };
        assert!(decode_interruptible(&jpeg, 1 << 30, &|| false).unwrap().is_none());
        assert!(decode(&jpeg, 1 << 30).is_ok());
        // The decoded frame must fit the allocation limit, as the `image` crate's must.
        assert!(decode(&big, 1 << 20).is_err());
    }
}
