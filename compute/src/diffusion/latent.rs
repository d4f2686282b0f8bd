//! ComfyUI's latent nodes on [`LatentBatch`]es: empty latents, upscaling, compositing,
//! batch slicing and repetition, noise masks, and reading `.latent` files.

use std::sync::Arc;

use crate::image::MaskBatch;
use crate::resize::{resize_planes, Mode};
use crate::values::LatentBatch;
use crate::ComputeError;

/// Channels of an SD1 latent.
pub const LATENT_CHANNELS: u32 = 4;
/// Pixels per latent cell (SD1's VAE downscales by 8).
pub const PIXELS_PER_CELL: u32 = 8;
/// Most values one latent batch may hold (64 Mi floats = 256 MiB).
pub const MAX_VALUES: u64 = 64 * 1024 * 1024;
/// SD1's latent scale: latents in files without a format version were saved scaled by it.
const SD1_SCALE_FACTOR: f32 = 0.18215;

fn checked_len(shape: [u32; 4]) -> Result<usize, ComputeError> {
    if shape.contains(&0) {
        return Err(ComputeError::invalid(format!(
            "a latent needs every size at least 1, got {shape:?}"
        )));
    }
    let values: u64 = shape.iter().map(|&d| u64::from(d)).product();
    if values > MAX_VALUES {
        return Err(ComputeError::TooLarge(format!(
            "a {shape:?} latent exceeds the host's limit of {MAX_VALUES} values"
        )));
    }
    Ok(values as usize)
}

/// A latent with `shape` and `data` and nothing else.
pub fn plain(shape: [u32; 4], data: Vec<f32>) -> LatentBatch {
    LatentBatch {
        shape,
        data,
        noise_mask: None,
        batch_index: None,
    }
}

/// `EmptyLatentImage`: `batch` zero latents for a `width` x `height` image.
pub fn empty(width: u32, height: u32, batch: u32) -> Result<LatentBatch, ComputeError> {
    let shape = [
        batch,
        LATENT_CHANNELS,
        height / PIXELS_PER_CELL,
        width / PIXELS_PER_CELL,
    ];
    let len = checked_len(shape)?;
    Ok(plain(shape, vec![0.0; len]))
}

/// `LatentUpscale`'s resize to `width` x `height` latent cells; with `center_crop` the
/// source is first cropped to the target's aspect ratio. The noise mask and batch indices
/// are kept.
pub fn scale(
    latent: &LatentBatch,
    method: &str,
    width: u32,
    height: u32,
    center_crop: bool,
) -> Result<LatentBatch, ComputeError> {
    let mode: Mode = method.parse()?;
    let [b, c, h, w] = latent.shape;
    let shape = [b, c, height, width];
    checked_len(shape)?;
    let (mut data, mut h, mut w) = (latent.data.clone(), h as usize, w as usize);
    if center_crop {
        let (x, y, cw, ch) = crate::image::resample::center_crop(w, h, width as usize, height as usize);
        data = data
            .chunks_exact(h * w)
            .flat_map(|plane| plane.chunks_exact(w).skip(y).take(ch).flat_map(|row| &row[x..x + cw]))
            .copied()
            .collect();
        (h, w) = (ch, cw);
    }
    let data = resize_planes(&data, h, w, height as usize, width as usize, mode);
    Ok(LatentBatch {
        shape,
        data,
        ..latent.clone()
    })
}

/// `LatentComposite`: `source` pasted into `destination` at latent cell `x`, `y`, its edges
/// (those not on the destination's border) blended in over `feather` cells.
pub fn composite(
    destination: &LatentBatch,
    source: &LatentBatch,
    x: u32,
    y: u32,
    feather: u32,
) -> Result<LatentBatch, ComputeError> {
    let [db, dc, dh, dw] = destination.shape.map(|d| d as usize);
    let [sb, sc, sh, sw] = source.shape.map(|d| d as usize);
    if sc != dc || (sb != db && sb != 1) {
        return Err(ComputeError::invalid(format!(
            "cannot composite a {:?} latent into a {:?} one",
            source.shape, destination.shape
        )));
    }
    let (x, y, feather) = (x as usize, y as usize, feather as usize);
    let mut out = destination.clone();
    if x >= dw || y >= dh {
        return Ok(out);
    }
    // The part of the source that fits.
    let (h, w) = (sh.min(dh - y), sw.min(dw - x));
    let mask = |r: usize, col: usize| -> f32 {
        let mut m = 1.0f32;
        for t in 0..feather {
            let ramp = (1.0 / feather as f32) * (t + 1) as f32;
            if y != 0 && r == t {
                m *= ramp;
            }
            if y + h < dh && r == h - 1 - t {
                m *= ramp;
            }
            if x != 0 && col == t {
                m *= ramp;
            }
            if x + w < dw && col == w - 1 - t {
                m *= ramp;
            }
        }
        m
    };
    for b in 0..db {
        let sbi = if sb == 1 { 0 } else { b };
        for c in 0..dc {
            for r in 0..h {
                for col in 0..w {
                    let d = ((b * dc + c) * dh + y + r) * dw + x + col;
                    let s = source.data[((sbi * sc + c) * sh + r) * sw + col];
                    out.data[d] = if feather == 0 {
                        s
                    } else {
                        let m = mask(r, col);
                        s * m + out.data[d] * (1.0 - m)
                    };
                }
            }
        }
    }
    Ok(out)
}

/// Masks `mask` repeated or cut to `count`, as torch's `repeat` then a slice.
fn masks_for(mask: &MaskBatch, count: usize) -> MaskBatch {
    let plane = (mask.width * mask.height) as usize;
    let data = mask
        .data
        .chunks_exact(plane)
        .cycle()
        .take(count)
        .flatten()
        .copied()
        .collect();
    MaskBatch {
        batch: count as u32,
        data,
        ..mask.clone()
    }
}

/// `LatentFromBatch`: `length` latents from `batch_index` on (both clamped to the batch).
pub fn from_batch(latent: &LatentBatch, batch_index: u32, length: u32) -> LatentBatch {
    let [b, c, h, w] = latent.shape;
    let start = batch_index.min(b - 1);
    let length = length.min(b - start).max(1);
    let per = (c * h * w) as usize;
    let data = latent.data[start as usize * per..(start + length) as usize * per].to_vec();
    let noise_mask = latent.noise_mask.as_ref().map(|m| {
        if m.batch == 1 {
            m.clone()
        } else {
            let full = if m.batch < b {
                masks_for(m, b as usize)
            } else {
                (**m).clone()
            };
            let plane = (m.width * m.height) as usize;
            Arc::new(MaskBatch {
                batch: length,
                data: full.data[start as usize * plane..(start + length) as usize * plane].to_vec(),
                ..full
            })
        }
    });
    let batch_index = Some(match &latent.batch_index {
        Some(indices) => indices[start as usize..(start + length) as usize].to_vec(),
        None => (start..start + length).collect(),
    });
    LatentBatch {
        shape: [length, c, h, w],
        data,
        noise_mask,
        batch_index,
    }
}

/// `RepeatLatentBatch`: the batch repeated `amount` times.
pub fn repeat(latent: &LatentBatch, amount: u32) -> Result<LatentBatch, ComputeError> {
    let [b, c, h, w] = latent.shape;
    let shape = [b * amount, c, h, w];
    checked_len(shape)?;
    let data = latent.data.repeat(amount as usize);
    let noise_mask = latent.noise_mask.as_ref().map(|m| {
        if m.batch > 1 {
            let full = if m.batch < b {
                masks_for(m, b as usize)
            } else {
                (**m).clone()
            };
            Arc::new(masks_for(&full, full.batch as usize * amount as usize))
        } else {
            m.clone()
        }
    });
    let batch_index = latent.batch_index.as_ref().map(|indices| {
        let offset = indices.iter().max().copied().unwrap_or(0) - indices.iter().min().copied().unwrap_or(0) + 1;
        let mut all = indices.clone();
        for i in 1..amount {
            all.extend(indices.iter().map(|x| x + i * offset));
        }
        all
    });
    Ok(LatentBatch {
        shape,
        data,
        noise_mask,
        batch_index,
    })
}

/// `SetLatentNoiseMask`: `latent` with `mask` as its noise mask.
pub fn with_noise_mask(latent: &LatentBatch, mask: Arc<MaskBatch>) -> LatentBatch {
    LatentBatch {
        noise_mask: Some(mask),
        ..latent.clone()
    }
}

/// `LoadLatent`: the `latent_tensor` of a ComfyUI `.latent` file (safetensors). Files without
/// a `latent_format_version_0` entry hold latents scaled by SD1's factor, which is undone.
pub fn read_latent_file(bytes: &[u8]) -> Result<LatentBatch, ComputeError> {
    let bad = |why: &str| ComputeError::invalid(format!("not a ComfyUI .latent file: {why}"));
    let header_len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| bad("too short"))?;
    let data_start = 8usize
        .checked_add(usize::try_from(header_len).map_err(|_| bad("header too large"))?)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| bad("header runs past the end"))?;
    let header: serde_json::Value =
        serde_json::from_slice(&bytes[8..data_start]).map_err(|e| bad(&format!("header is not JSON: {e}")))?;
    let entry = header.get("latent_tensor").ok_or_else(|| bad("no latent_tensor"))?;
    let shape: Vec<u32> = serde_json::from_value(entry["shape"].clone()).map_err(|_| bad("bad shape"))?;
    let shape: [u32; 4] = shape
        .try_into()
        .map_err(|_| bad("latent_tensor is not 4-dimensional"))?;
    let offsets: [usize; 2] =
        serde_json::from_value(entry["data_offsets"].clone()).map_err(|_| bad("bad data_offsets"))?;
    let len = checked_len(shape)?;
    let raw = bytes
        .get(data_start + offsets[0]..data_start + offsets[1])
        .filter(|_| offsets[0] <= offsets[1])
        .ok_or_else(|| bad("tensor data runs past the end"))?;
    let mut data: Vec<f32> = match entry["dtype"].as_str() {
        Some("F32") if raw.len() == len * 4 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect(),
        Some("F16") if raw.len() == len * 2 => raw
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Some("BF16") if raw.len() == len * 2 => raw
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => return Err(bad("latent_tensor is not F32, F16 or BF16 of its shape")),
    };
    if header.get("latent_format_version_0").is_none() {
        for v in &mut data {
            *v *= 1.0 / SD1_SCALE_FACTOR;
        }
    }
    Ok(plain(shape, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(shape: [u32; 4]) -> LatentBatch {
        let n: u32 = shape.iter().product();
        plain(shape, (0..n).map(|v| v as f32).collect())
    }

    #[test]
    fn empty_latent_is_an_eighth_of_the_image() {
        let l = empty(512, 256, 2).unwrap();
        assert_eq!(l.shape, [2, 4, 32, 64]);
        assert!(l.data.iter().all(|&v| v == 0.0));
        assert!(empty(65535 * 8, 65535 * 8, 1).is_err());
    }

    #[test]
    fn batch_slicing_and_repetition_track_noise_indices() {
        let l = ramp([3, 1, 1, 2]);
        let one = from_batch(&l, 1, 5);
        assert_eq!(one.shape, [2, 1, 1, 2]);
        assert_eq!(one.data, vec![2.0, 3.0, 4.0, 5.0]);
        assert_eq!(one.batch_index, Some(vec![1, 2]));
        let again = repeat(&one, 2).unwrap();
        assert_eq!(again.shape[0], 4);
        assert_eq!(again.batch_index, Some(vec![1, 2, 3, 4]));
        assert_eq!(repeat(&l, 2).unwrap().batch_index, None);
    }

    #[test]
    fn composite_pastes_and_feathers() {
        let dest = plain([1, 1, 4, 4], vec![0.0; 16]);
        let src = plain([1, 1, 2, 2], vec![1.0; 4]);
        let out = composite(&dest, &src, 1, 1, 0).unwrap();
        assert_eq!(out.data[5], 1.0);
        assert_eq!(out.data[0], 0.0);
        let soft = composite(&dest, &src, 1, 1, 2).unwrap();
        assert!(soft.data[5] > 0.0 && soft.data[5] < 1.0);
    }

    #[test]
    fn latent_files_round_trip_and_unscale_old_ones() {
        let header = br#"{"latent_tensor":{"dtype":"F32","shape":[1,1,1,2],"data_offsets":[0,8]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        file.extend_from_slice(&1.0f32.to_le_bytes());
        file.extend_from_slice(&2.0f32.to_le_bytes());
        let l = read_latent_file(&file).unwrap();
        assert!((l.data[0] - 1.0 / 0.18215).abs() < 1e-5);
        // With the format marker the values are read as they are.
        let header = br#"{"latent_tensor":{"dtype":"F32","shape":[1,1,1,1],"data_offsets":[0,4]},"latent_format_version_0":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}"#;
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header);
        file.extend_from_slice(&3.0f32.to_le_bytes());
        assert_eq!(read_latent_file(&file).unwrap().data, vec![3.0]);
        assert!(read_latent_file(b"short").is_err());
    }
}
