//! Values as files: image batches as PNG (with text chunks, where ComfyUI keeps the
//! workflow) and latent batches as safetensors (as ComfyUI's `SaveLatent` writes them).

use super::image::ImageBatch;
use super::interrupt::Interrupt;
use super::values::LatentBatch;
use super::ComputeError;

/// Encodes image `index` of `image` as an 8-bit RGB PNG (RGBA for a 4-channel image), with `text` as tEXt chunks
/// (ComfyUI stores `prompt` and `workflow` there). Values are quantised as ComfyUI's
/// `SaveImage` does: `255 · v` in float32, clamped to 0..=255 and truncated.
pub fn encode_png(image: &ImageBatch, index: u32, text: &[(String, String)]) -> Result<Vec<u8>, ComputeError> {
    encode_png_interruptible(image, index, text, Interrupt::NEVER)
}

/// The PNG colour type of an image of `channels` channels.
fn png_color(channels: u32) -> Result<png::ColorType, ComputeError> {
    match channels {
        1 => Ok(png::ColorType::Grayscale),
        3 => Ok(png::ColorType::Rgb),
        4 => Ok(png::ColorType::Rgba),
        other => Err(ComputeError::invalid(format!(
            "cannot save an image of {other} channels as PNG"
        ))),
    }
}

/// Rows of pixel bytes an interruptible PNG encode converts and compresses between two
/// looks at its interrupt: about 1 MiB of them.
const PNG_STRIP_BYTES: usize = 1 << 20;

/// Images up to this many pixel bytes are encoded in one call (tens of milliseconds);
/// larger ones strip by strip.
const PNG_ONE_CALL_BYTES: usize = 16 << 20;

/// [`encode_png`], asking `stop` every [`PNG_STRIP_BYTES`] of rows (a few milliseconds of
/// work) of an image over [`PNG_ONE_CALL_BYTES`]; once it fires,
/// [`ComputeError::Interrupted`]. The pixels are the same either way (a strip-by-strip file
/// may split its compressed data differently).
pub fn encode_png_interruptible(
    image: &ImageBatch,
    index: u32,
    text: &[(String, String)],
    stop: Interrupt<'_>,
) -> Result<Vec<u8>, ComputeError> {
    if index >= image.batch {
        return Err(ComputeError::invalid(format!(
            "no image {index} in a batch of {}",
            image.batch
        )));
    }
    let len = image.frame_len();
    let start = index as usize * len;
    let pixels = &image.data[start..start + len];
    let failed = |e: &dyn std::fmt::Display| ComputeError::Failed(format!("png: {e}"));
    let mut out = Vec::with_capacity(len / 2 + 1024);
    {
        let mut encoder = png::Encoder::new(&mut out, image.width, image.height);
        encoder.set_color(png_color(image.channels)?);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_compression(png::Compression::Fast);
        for (key, value) in text {
            encoder
                .add_text_chunk(key.clone(), value.clone())
                .map_err(|e| failed(&e))?;
        }
        let mut writer = encoder.write_header().map_err(|e| failed(&e))?;
        if len <= PNG_ONE_CALL_BYTES {
            let bytes: Vec<u8> = pixels.iter().map(|v| (v * 255.0).clamp(0.0, 255.0) as u8).collect();
            writer.write_image_data(&bytes).map_err(|e| failed(&e))?;
            drop(writer);
            return Ok(out);
        }
        let mut stream = writer.stream_writer().map_err(|e| failed(&e))?;
        let row = (image.width as usize * image.channels as usize).max(1);
        let strip = (PNG_STRIP_BYTES / row).max(1) * row;
        let mut bytes = Vec::with_capacity(strip.min(pixels.len()));
        for rows in pixels.chunks(strip) {
            if stop.requested() {
                return Err(ComputeError::Interrupted);
            }
            bytes.clear();
            bytes.extend(rows.iter().map(|v| (v * 255.0).clamp(0.0, 255.0) as u8));
            std::io::Write::write_all(&mut stream, &bytes).map_err(|e| failed(&e))?;
        }
        stream.finish().map_err(|e| failed(&e))?;
    }
    Ok(out)
}

/// Frame `index` of `images` in 8 bits, as ComfyUI converts it (`clip(255 * x)`, truncated).
fn frame_u8(images: &ImageBatch, index: usize) -> Vec<u8> {
    let len = images.frame_len();
    images.data[index * len..(index + 1) * len]
        .iter()
        .map(|v| (v * 255.0).clamp(0.0, 255.0) as u8)
        .collect()
}

/// An APNG frame delay of `ms` milliseconds as the `(numerator, denominator)` of seconds
/// that fit its 16-bit fields: milliseconds, else hundredths, else whole seconds.
fn apng_delay(ms: u64) -> (u16, u16) {
    [(1, 1000u16), (10, 100), (1000, 1)]
        .iter()
        .find_map(|&(per, den)| u16::try_from(ms.div_ceil(per)).ok().map(|num| (num, den)))
        .unwrap_or((u16::MAX, 1))
}

/// The frames of `images` as `(first image, milliseconds)`: runs of equal 8-bit frames
/// become one frame shown for the run's time, as Pillow merges them. Holds two frames at a
/// time; asks `stop` between frames.
fn frame_runs(images: &ImageBatch, frame_ms: u64, stop: Interrupt<'_>) -> Result<Vec<(usize, u64)>, ComputeError> {
    let mut runs: Vec<(usize, u64)> = Vec::new();
    let mut previous: Option<Vec<u8>> = None;
    for index in 0..images.batch as usize {
        if stop.requested() {
            return Err(ComputeError::Interrupted);
        }
        let frame = frame_u8(images, index);
        match runs.last_mut() {
            Some((_, ms)) if previous.as_ref() == Some(&frame) => *ms += frame_ms,
            _ => runs.push((index, frame_ms)),
        }
        previous = Some(frame);
    }
    Ok(runs)
}

/// `text` as JSON's `ensure_ascii` writes it: every character past ASCII as `\uXXXX` escapes
/// (UTF-16, surrogate pairs past the first plane). JSON text stays the same value.
fn ascii_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// Encodes every image of `images` as the frames of one animated PNG, as ComfyUI's
/// `SaveAnimatedPNG` has Pillow write it: each frame shown `frame_ms` milliseconds, looping
/// forever, zlib level `compress_level` (0-9), and each `(key, json)` of `text` in a private
/// `comf` chunk after the image data (`key`, a zero byte, the JSON in ASCII). Consecutive
/// equal frames become one longer frame, and a single frame is a plain PNG, as Pillow does.
/// Asks `stop` between frames.
pub fn encode_apng(
    images: &ImageBatch,
    frame_ms: u64,
    compress_level: u8,
    text: &[(String, String)],
    stop: Interrupt<'_>,
) -> Result<Vec<u8>, ComputeError> {
    let failed = |e: &dyn std::fmt::Display| ComputeError::Failed(format!("apng: {e}"));
    let runs = frame_runs(images, frame_ms, stop)?;
    if runs.is_empty() {
        return Err(ComputeError::invalid("an animation needs at least one frame"));
    }
    let mut out = Vec::with_capacity(images.frame_len() / 2 + 1024);
    let mut encoder = png::Encoder::new(&mut out, images.width, images.height);
    encoder.set_color(png_color(images.channels)?);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_deflate_compression(match compress_level {
        0 => png::DeflateCompression::NoCompression,
        level => png::DeflateCompression::Level(level.min(9)),
    });
    let animated = runs.len() > 1;
    if animated {
        let count = u32::try_from(runs.len()).map_err(|e| failed(&e))?;
        encoder.set_animated(count, 0).map_err(|e| failed(&e))?;
    }
    let mut writer = encoder.write_header().map_err(|e| failed(&e))?;
    for &(index, ms) in &runs {
        if stop.requested() {
            return Err(ComputeError::Interrupted);
        }
        if animated {
            let (num, den) = apng_delay(ms);
            writer.set_frame_delay(num, den).map_err(|e| failed(&e))?;
        }
        writer
            .write_image_data(&frame_u8(images, index))
            .map_err(|e| failed(&e))?;
    }
    for (key, json) in text {
        let chunk = [key.as_bytes(), b"\0", ascii_json(json).as_bytes()].concat();
        writer
            .write_chunk(png::chunk::ChunkType(*b"comf"), &chunk)
            .map_err(|e| failed(&e))?;
    }
    writer.finish().map_err(|e| failed(&e))?;
    Ok(out)
}

/// Encodes `latent` as ComfyUI's `SaveLatent` writes it: a safetensors file with the
/// `latent_tensor` and the empty `latent_format_version_0` marker, which tells `LoadLatent`
/// that the values are not scaled.
pub fn encode_latent(latent: &LatentBatch) -> Vec<u8> {
    let bytes = latent.data.len() * 4;
    let header = serde_json::json!({
        "latent_tensor": {"dtype": "F32", "shape": latent.shape, "data_offsets": [0, bytes]},
        "latent_format_version_0": {"dtype": "F32", "shape": [0], "data_offsets": [bytes, bytes]}
    })
    .to_string();
    let mut header = header.into_bytes();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + header.len() + bytes);
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(&header);
    for v in &latent.data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_animated_png_merges_equal_frames_and_times_each_as_pillow_does() {
        let frame = |v: f32| vec![v; 2 * 3 * 3];
        let data = [frame(0.0), frame(0.0), frame(0.5), frame(1.0)].concat();
        let images = ImageBatch {
            width: 2,
            height: 3,
            batch: 4,
            channels: 3,
            data,
        };
        let apng = encode_apng(&images, 166, 4, &[], Interrupt::NEVER).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(&apng)).read_info().unwrap();
        let control = reader.info().animation_control.unwrap();
        assert_eq!((control.num_frames, control.num_plays), (3, 0));
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let mut seen = Vec::new();
        while let Ok(out) = reader.next_frame(&mut buf) {
            let fctl = *reader.info().frame_control().unwrap();
            seen.push((buf[..out.buffer_size()][0], fctl.delay_num, fctl.delay_den));
        }
        assert_eq!(seen, [(0, 332, 1000), (127, 166, 1000), (255, 166, 1000)]);
        let still = ImageBatch {
            batch: 1,
            data: frame(0.5),
            ..images
        };
        let png = encode_apng(&still, 166, 4, &[], Interrupt::NEVER).unwrap();
        let reader = png::Decoder::new(std::io::Cursor::new(&png)).read_info().unwrap();
        assert!(reader.info().animation_control.is_none(), "one frame is a plain PNG");
    }

    #[test]
    fn the_workflow_goes_after_the_frames_in_a_comf_chunk_in_ascii() {
        let images = ImageBatch {
            width: 1,
            height: 1,
            batch: 2,
            channels: 3,
            data: vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0],
        };
        let text = [("prompt".to_string(), r#"{"a":"é😀"}"#.to_string())];
        let apng = encode_apng(&images, 100, 1, &text, Interrupt::NEVER).unwrap();
        let expected = [b"comf".as_slice(), b"prompt\0", br#"{"a":"\u00e9\ud83d\ude00"}"#].concat();
        let at = apng
            .windows(expected.len())
            .position(|w| w == expected)
            .expect("a comf chunk");
        let last_data = apng.windows(4).rposition(|w| w == b"fdAT").unwrap();
        assert!(at > last_data, "the chunk follows the image data");
    }

    #[test]
    fn apng_delays_too_long_for_milliseconds_fall_back_to_coarser_units() {
        assert_eq!(apng_delay(166), (166, 1000));
        assert_eq!(apng_delay(100_000), (10_000, 100));
        assert_eq!(apng_delay(10_000_000), (10_000, 1));
    }
    use crate::image::{decode, decode_peak_bytes, empty};

    #[test]
    fn a_large_png_encoded_strip_by_strip_has_the_same_pixels_and_stops_when_told() {
        let (w, h) = (2400u32, 2400u32);
        let image = ImageBatch {
            width: w,
            height: h,
            batch: 1,
            channels: 3,
            data: (0..(w * h * 3) as usize)
                .map(|i| ((i * 7919) % 256) as f32 / 255.0)
                .collect(),
        };
        assert!(
            image.frame_len() > PNG_ONE_CALL_BYTES,
            "the test image takes the strip path"
        );
        let png = encode_png(&image, 0, &[]).unwrap();
        let (back, _) = decode(&png, decode_peak_bytes(&png).unwrap()).unwrap();
        assert_eq!(
            back.data,
            image
                .data
                .iter()
                .map(|v| ((v * 255.0) as u8) as f32 / 255.0)
                .collect::<Vec<_>>()
        );
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 2;
        let stopped = encode_png_interruptible(&image, 0, &[], Interrupt::new(&stop));
        assert!(matches!(stopped, Err(ComputeError::Interrupted)), "{stopped:?}");
    }

    #[test]
    fn png_round_trips_through_decode() {
        let img = empty(3, 5, 1, 0x00ff00).unwrap();
        let png = encode_png(&img, 0, &[("prompt".into(), "{}".into())]).unwrap();
        assert_eq!(decode_peak_bytes(&png).unwrap(), 3 * 5 * 48);
        let (back, mask) = decode(&png, decode_peak_bytes(&png).unwrap()).unwrap();
        assert_eq!((back.width, back.height), (3, 5));
        assert_eq!(&back.data[..3], &[0.0, 1.0, 0.0]);
        assert!(mask.data.iter().all(|m| *m == 0.0));
        assert!(decode(b"not an image", 1 << 20).is_err());
        assert!(decode_peak_bytes(b"not an image").is_err());
        assert!(encode_png(&img, 1, &[]).is_err(), "no image 1 in a batch of 1");
    }

    #[test]
    fn latents_are_safetensors_as_comfyui_saves_them() {
        let latent = LatentBatch {
            shape: [1, 4, 1, 2],
            data: (0..8).map(|i| i as f32).collect(),
            noise_mask: None,
            batch_index: None,
        };
        let bytes = encode_latent(&latent);
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(header_len % 8, 0);
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
        assert_eq!(header["latent_tensor"]["dtype"], "F32");
        assert_eq!(header["latent_tensor"]["shape"], serde_json::json!([1, 4, 1, 2]));
        assert_eq!(header["latent_tensor"]["data_offsets"], serde_json::json!([0, 32]));
        assert_eq!(header["latent_format_version_0"]["shape"], serde_json::json!([0]));
        let data = &bytes[8 + header_len..];
        assert_eq!(data.len(), 32);
        assert_eq!(f32::from_le_bytes(data[28..32].try_into().unwrap()), 7.0);
    }
}
