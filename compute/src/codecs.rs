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
