//! ComfyUI's `lanczos` resize (`comfy.utils.lanczos`): each image through 8-bit Pillow.
//! The floats become bytes (`255 v` clipped and truncated), Pillow resamples them with its
//! fixed-point Lanczos filter (rows first, then columns; RGBA premultiplied by its alpha
//! on the way), and the bytes come back as `k / 255`. Pillow's `Resample.c` and the
//! premultiplication of `Convert.c`, operation for operation.

use super::{check_size, ImageBatch, Work};
use crate::ComputeError;

/// Fraction bits of Pillow's fixed-point filter weights (`PRECISION_BITS`).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Half-width of Pillow's Lanczos filter, in source pixels at scale 1.
const SUPPORT: f64 = 3.0;

/// Pillow's `sinc_filter`.
fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

/// Pillow's `lanczos_filter`: a sinc windowed by a sinc three times wider.
fn lanczos(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc(x) * sinc(x / 3.0)
    } else {
        0.0
    }
}

/// For each of `out_size` target pixels along an axis of `in_size` source pixels, the
/// first source pixel it reads and its fixed-point weights (`precompute_coeffs`, then
/// `normalize_coeffs_8bpc`).
fn coefficients(in_size: u32, out_size: u32) -> Vec<(usize, Vec<i32>)> {
    let scale = f64::from(in_size as f32) / f64::from(out_size);
    let filter_scale = scale.max(1.0);
    let support = SUPPORT * filter_scale;
    let unit = f64::from(1u32 << PRECISION_BITS);
    (0..out_size)
        .map(|xx| {
            let center = (f64::from(xx) + 0.5) * scale;
            let ss = 1.0 / filter_scale;
            let xmin = ((center - support + 0.5) as i32).max(0);
            let xmax = ((center + support + 0.5) as i32).min(in_size as i32) - xmin;
            let weights: Vec<f64> = (0..xmax.max(0))
                .map(|x| lanczos((f64::from(x + xmin) - center + 0.5) * ss))
                .collect();
            let total: f64 = weights.iter().fold(0.0, |a, w| a + w);
            let fixed = weights
                .iter()
                .map(|w| {
                    let w = if total != 0.0 { w / total } else { *w };
                    if w < 0.0 {
                        (-0.5 + w * unit) as i32
                    } else {
                        (0.5 + w * unit) as i32
                    }
                })
                .collect();
            (xmin as usize, fixed)
        })
        .collect()
}

/// Pillow's `clip8`: the fixed-point sum back to a byte.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// A frame of bytes, `channels` per pixel.
struct Bytes {
    width: usize,
    height: usize,
    channels: usize,
    data: Vec<u8>,
}

/// `ImagingResampleHorizontal_8bpc`: every row resampled to `width` columns.
fn horizontal(src: &Bytes, width: u32, work: &mut Work<'_>) -> Result<Bytes, ComputeError> {
    let taps = coefficients(src.width as u32, width);
    let c = src.channels;
    let mut data = Vec::with_capacity(width as usize * src.height * c);
    for row in src.data.chunks_exact(src.width * c) {
        for (xmin, weights) in &taps {
            for ch in 0..c {
                let mut sum = 1i32 << (PRECISION_BITS - 1);
                for (i, k) in weights.iter().enumerate() {
                    sum += i32::from(row[(xmin + i) * c + ch]) * k;
                }
                data.push(clip8(sum));
            }
        }
        work.step(taps.iter().map(|(_, w)| w.len() as u64).sum::<u64>() * c as u64)?;
    }
    Ok(Bytes {
        width: width as usize,
        data,
        ..*src
    })
}

/// `ImagingResampleVertical_8bpc`: every column resampled to `height` rows.
fn vertical(src: &Bytes, height: u32, work: &mut Work<'_>) -> Result<Bytes, ComputeError> {
    let taps = coefficients(src.height as u32, height);
    let line = src.width * src.channels;
    let mut data = Vec::with_capacity(line * height as usize);
    for (ymin, weights) in &taps {
        for x in 0..line {
            let mut sum = 1i32 << (PRECISION_BITS - 1);
            for (i, k) in weights.iter().enumerate() {
                sum += i32::from(src.data[(ymin + i) * line + x]) * k;
            }
            data.push(clip8(sum));
        }
        work.step(weights.len() as u64 * line as u64)?;
    }
    Ok(Bytes {
        height: height as usize,
        data,
        ..*src
    })
}

/// Convert.c's `MULDIV255`: `a * b / 255`, rounded as Pillow rounds it.
fn muldiv255(a: u8, b: u8) -> u8 {
    let t = u32::from(a) * u32::from(b) + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// RGBA to Pillow's premultiplied RGBa (`rgbA2rgba`).
fn premultiply(frame: &mut Bytes) {
    for p in frame.data.chunks_exact_mut(4) {
        let alpha = p[3];
        for v in &mut p[..3] {
            *v = muldiv255(*v, alpha);
        }
    }
}

/// Premultiplied RGBa back to RGBA (`rgba2rgbA`): colours of a fully clear or fully
/// opaque pixel kept, others divided by alpha (truncating) and clipped.
fn unpremultiply(frame: &mut Bytes) {
    for p in frame.data.chunks_exact_mut(4) {
        let alpha = u32::from(p[3]);
        if alpha == 0 || alpha == 255 {
            continue;
        }
        for v in &mut p[..3] {
            *v = (255 * u32::from(*v) / alpha).min(255) as u8;
        }
    }
}

/// `Image.resize(size, LANCZOS)` of one 8-bit frame: the same size is a copy; RGBA is
/// resampled premultiplied; rows are resampled before columns, each only when its size
/// changes.
fn resize_frame(mut frame: Bytes, width: u32, height: u32, work: &mut Work<'_>) -> Result<Bytes, ComputeError> {
    if (frame.width, frame.height) == (width as usize, height as usize) {
        return Ok(frame);
    }
    let rgba = frame.channels == 4;
    if rgba {
        premultiply(&mut frame);
    }
    if frame.width != width as usize {
        frame = horizontal(&frame, width, work)?;
    }
    if frame.height != height as usize {
        frame = vertical(&frame, height, work)?;
    }
    if rgba {
        unpremultiply(&mut frame);
    }
    Ok(frame)
}

/// Bytes [`resize`] holds at its peak besides its source: the result, and one frame's
/// bytes before, between and after its two passes.
pub fn resize_peak_bytes(image: &ImageBatch, width: u32, height: u32) -> u64 {
    let c = u64::from(image.channels);
    let target = u64::from(width) * u64::from(height) * c;
    let source = u64::from(image.width) * u64::from(image.height) * c;
    let between = u64::from(width) * u64::from(image.height) * c;
    target * u64::from(image.batch) * 4 + source + between + target
}

/// ComfyUI's `lanczos(samples, width, height)`: every image resized to `width` x `height`
/// through 8-bit Pillow. Images have 3 (RGB) or 4 (RGBA) channels. `keep_going` is asked
/// every few million filter taps; when it says no the result is
/// [`ComputeError::Interrupted`].
pub fn resize(
    image: &ImageBatch,
    width: u32,
    height: u32,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    if !matches!(image.channels, 3 | 4) {
        return Err(ComputeError::invalid(format!(
            "a lanczos resize needs RGB or RGBA images, got {} channels",
            image.channels
        )));
    }
    if width == 0 || height == 0 {
        return Err(ComputeError::invalid(format!(
            "cannot resize to {width}x{height}: height and width must be at least 1"
        )));
    }
    check_size(width, height, image.batch, image.channels)?;
    let mut work = Work::new(keep_going);
    let mut data =
        Vec::with_capacity(width as usize * height as usize * image.batch as usize * image.channels as usize);
    for frame in image.data.chunks_exact(image.frame_len()) {
        let mut bytes = Vec::with_capacity(frame.len());
        for row in frame.chunks(image.width as usize * image.channels as usize) {
            bytes.extend(row.iter().map(|v| (255.0f32 * v).clamp(0.0, 255.0) as u8));
            work.step(row.len() as u64)?;
        }
        let bytes = Bytes {
            width: image.width as usize,
            height: image.height as usize,
            channels: image.channels as usize,
            data: bytes,
        };
        let resized = resize_frame(bytes, width, height, &mut work)?;
        data.extend(resized.data.iter().map(|&k| f32::from(k) / 255.0));
    }
    Ok(ImageBatch {
        width,
        height,
        data,
        ..*image
    })
}
