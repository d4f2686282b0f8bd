//! Image batches and the pixel work done on them: creation, inversion, scaling, decoding
//! uploads and PNG encoding. Layout follows ComfyUI's `IMAGE`: float32 in 0..=1,
//! `[batch, height, width, channels]`.

use std::io::Cursor;

use image::{imageops::FilterType, ImageBuffer, Rgb, Rgb32FImage};

use super::ComputeError;

/// Largest image side the host creates or scales to (ComfyUI's `MAX_RESOLUTION`).
pub const MAX_SIDE: u32 = 16384;
/// Largest number of float values one batch may hold (256 Mi floats = 1 GiB).
pub const MAX_VALUES: u64 = 256 * 1024 * 1024;

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
    fn frame_len(&self) -> usize {
        (self.width * self.height * self.channels) as usize
    }

    /// Image `index` of the batch as an RGB float image.
    fn frame(&self, index: u32) -> Rgb32FImage {
        let len = self.frame_len();
        let start = index as usize * len;
        let pixels = self.data[start..start + len].to_vec();
        ImageBuffer::from_raw(self.width, self.height, pixels).expect("frame length matches size")
    }

    /// Encodes image `index` of the batch as an 8-bit RGB PNG, with `text` as tEXt chunks
    /// (ComfyUI stores `prompt` and `workflow` there). Values are quantised as ComfyUI's
    /// `SaveImage` does: `255 · v` in float32, clamped to 0..=255 and truncated.
    pub fn encode_png(&self, index: u32, text: &[(String, String)]) -> Result<Vec<u8>, ComputeError> {
        if index >= self.batch {
            return Err(ComputeError::invalid(format!(
                "no image {index} in a batch of {}",
                self.batch
            )));
        }
        let len = self.frame_len();
        let start = index as usize * len;
        let bytes: Vec<u8> = self.data[start..start + len]
            .iter()
            .map(|v| (v * 255.0).clamp(0.0, 255.0) as u8)
            .collect();
        let mut out = Vec::with_capacity(bytes.len() / 2 + 1024);
        {
            let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            encoder.set_compression(png::Compression::Fast);
            for (key, value) in text {
                encoder
                    .add_text_chunk(key.clone(), value.clone())
                    .map_err(|e| ComputeError::Failed(format!("png text chunk: {e}")))?;
            }
            let mut writer = encoder
                .write_header()
                .map_err(|e| ComputeError::Failed(e.to_string()))?;
            writer
                .write_image_data(&bytes)
                .map_err(|e| ComputeError::Failed(e.to_string()))?;
        }
        Ok(out)
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

/// Resizes every image to `width` x `height`. A zero side keeps the aspect ratio; with
/// `center_crop` the source is first cropped to the target's aspect ratio, as ComfyUI does.
pub fn scale(
    image: &ImageBatch,
    method: ScaleMethod,
    width: u32,
    height: u32,
    center_crop: bool,
) -> Result<ImageBatch, ComputeError> {
    let (width, height) = match (width, height) {
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
    };
    check_size(width, height, image.batch, 3)?;
    if image.channels != 3 {
        return Err(ComputeError::invalid("only 3-channel images can be scaled"));
    }
    let mut data = Vec::with_capacity(width as usize * height as usize * image.batch as usize * 3);
    for index in 0..image.batch {
        let mut frame = image.frame(index);
        if center_crop {
            frame = crop_to_aspect(&frame, width, height);
        }
        let resized = match method {
            ScaleMethod::Area => area_resize(&frame, width, height),
            ScaleMethod::NearestExact => image::imageops::resize(&frame, width, height, FilterType::Nearest),
            ScaleMethod::Bilinear => image::imageops::resize(&frame, width, height, FilterType::Triangle),
            ScaleMethod::Bicubic => image::imageops::resize(&frame, width, height, FilterType::CatmullRom),
            ScaleMethod::Lanczos => image::imageops::resize(&frame, width, height, FilterType::Lanczos3),
        };
        data.extend(resized.into_raw().into_iter().map(|v| v.clamp(0.0, 1.0)));
    }
    Ok(ImageBatch {
        width,
        height,
        batch: image.batch,
        channels: 3,
        data,
    })
}

fn crop_to_aspect(frame: &Rgb32FImage, width: u32, height: u32) -> Rgb32FImage {
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
        return frame.clone();
    };
    image::imageops::crop_imm(frame, x, y, w, h).to_image()
}

/// Box-filter resize: each target pixel is the area-weighted mean of the source pixels it
/// covers (torch's `adaptive_avg_pool2d`, which ComfyUI's `area` uses).
fn area_resize(frame: &Rgb32FImage, width: u32, height: u32) -> Rgb32FImage {
    let (sw, sh) = frame.dimensions();
    let mut out: Rgb32FImage = ImageBuffer::new(width, height);
    for ty in 0..height {
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
    out
}

/// Decodes an uploaded image file (PNG, JPEG, ...): RGB pixels, and a mask that is 1 where
/// the image is transparent (ComfyUI's `LoadImage`; 0 everywhere without alpha).
pub fn decode(bytes: &[u8]) -> Result<(ImageBatch, MaskBatch), ComputeError> {
    let reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ComputeError::invalid(format!("cannot read image: {e}")))?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_VALUES);
    let mut reader = reader;
    reader.limits(limits);
    let decoded = reader
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
        let half = scale(&img, ScaleMethod::Area, 4, 0, false).unwrap();
        assert_eq!((half.width, half.height), (4, 2));
        assert!((half.data[0] - 128.0 / 255.0).abs() < 1e-6);
        let cropped = scale(&img, ScaleMethod::Bilinear, 2, 2, true).unwrap();
        assert_eq!((cropped.width, cropped.height), (2, 2));
    }

    #[test]
    fn png_round_trips_through_decode() {
        let img = empty(3, 5, 1, 0x00ff00).unwrap();
        let png = img.encode_png(0, &[("prompt".into(), "{}".into())]).unwrap();
        let (back, mask) = decode(&png).unwrap();
        assert_eq!((back.width, back.height), (3, 5));
        assert_eq!(&back.data[..3], &[0.0, 1.0, 0.0]);
        assert!(mask.data.iter().all(|m| *m == 0.0));
        assert!(decode(b"not an image").is_err());
    }
}
