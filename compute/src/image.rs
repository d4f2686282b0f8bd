//! Image batches and the pixel work done on them: creation, inversion, scaling and decoding
//! uploads (PNG encoding is in [`crate::codecs`]). Layout follows ComfyUI's `IMAGE`: float32 in 0..=1,
//! `[batch, height, width, channels]`.

use std::io::Cursor;

use image::{GenericImageView, ImageBuffer, Rgb, Rgb32FImage};

use super::ComputeError;

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

fn check_size(width: u32, height: u32, batch: u32, channels: u32) -> Result<(), ComputeError> {
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
struct Work<'a> {
    keep_going: &'a dyn Fn() -> bool,
    since_check: u64,
}

impl<'a> Work<'a> {
    fn new(keep_going: &'a dyn Fn() -> bool) -> Self {
        Work {
            keep_going,
            since_check: 0,
        }
    }

    /// `taps` more done; false once the caller says stop.
    fn done(&mut self, taps: u64) -> bool {
        self.since_check += taps;
        if self.since_check < TAPS_PER_CHECK {
            return true;
        }
        self.since_check = 0;
        (self.keep_going)()
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
    let decoded = reader(bytes, max_alloc.min(MAX_VALUES))?
        .decode()
        .map_err(|e| ComputeError::invalid(format!("cannot decode image: {e}")))?;
    let rgba = decoded.to_rgba32f();
    let (width, height) = rgba.dimensions();
    check_size(width, height, 1, 3)?;
    let has_alpha = decoded.color().has_alpha();
    let mut data = Vec::with_capacity(width as usize * height as usize * 3);
    let mut mask = Vec::with_capacity(width as usize * height as usize);
    for p in rgba.pixels() {
        data.extend_from_slice(&[p[0], p[1], p[2]]);
        mask.push(if has_alpha { 1.0 - p[3] } else { 0.0 });
    }
    Ok((
        ImageBatch {
            width,
            height,
            batch: 1,
            channels: 3,
            data,
        },
        MaskBatch {
            width,
            height,
            batch: 1,
            data: mask,
        },
    ))
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
}
