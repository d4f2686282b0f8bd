//! 16-bit PCM WAV: the one header writer, and samples as little-endian PCM. The engine
//! streams one RIFF/WAVE file as consecutive byte chunks (the header carries exact sizes
//! because the total frame count is known before rendering starts); [`encode_pcm16`] writes
//! a whole clip at once.

/// Size in bytes of the canonical PCM WAV header written by [`header`].
pub const HEADER_LEN: usize = 44;

/// Why a WAV header cannot be written: a size does not fit its 32-bit field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WavError {
    /// The PCM payload is larger than a RIFF file can say (4 GiB less the header).
    #[error("{0} bytes of audio do not fit a WAV file")]
    TooLong(u64),
    /// The channel count or sample rate makes the frame size or byte rate overflow.
    #[error("{channels} channels at {sample_rate} Hz do not fit a WAV header")]
    TooWide {
        /// Channels per frame.
        channels: u16,
        /// Frames per second.
        sample_rate: u32,
    },
}

/// Byte length of the PCM payload for `frames` frames of 16-bit audio.
pub fn data_len(frames: u64, channels: u16) -> u64 {
    frames * u64::from(channels) * 2
}

/// A 44-byte RIFF/WAVE header for `data_len` bytes of 16-bit PCM, with exact chunk sizes;
/// an error when a size does not fit its field.
pub fn header(sample_rate: u32, channels: u16, data_len: u64) -> Result<[u8; HEADER_LEN], WavError> {
    let data = u32::try_from(data_len)
        .ok()
        .filter(|d| d.checked_add(36).is_some())
        .ok_or(WavError::TooLong(data_len))?;
    let too_wide = WavError::TooWide { channels, sample_rate };
    let block_align = channels.checked_mul(2).ok_or(too_wide.clone())?;
    let byte_rate = sample_rate.checked_mul(u32::from(block_align)).ok_or(too_wide)?;
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&(data + 36).to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // PCM
    h[22..24].copy_from_slice(&channels.to_le_bytes());
    h[24..28].copy_from_slice(&sample_rate.to_le_bytes());
    h[28..32].copy_from_slice(&byte_rate.to_le_bytes());
    h[32..34].copy_from_slice(&block_align.to_le_bytes());
    h[34..36].copy_from_slice(&16u16.to_le_bytes());
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&data.to_le_bytes());
    Ok(h)
}

/// A whole WAV file of `samples` (interleaved by channel, floats in `[-1, 1]`, clamped).
pub fn encode_pcm16(sample_rate: u32, channels: u16, samples: &[f32]) -> Result<Vec<u8>, WavError> {
    let head = header(sample_rate, channels, samples.len() as u64 * 2)?;
    let mut out = Vec::with_capacity(HEADER_LEN + samples.len() * 2);
    out.extend_from_slice(&head);
    for s in samples {
        out.extend_from_slice(&to_i16(*s).to_le_bytes());
    }
    Ok(out)
}

/// Appends interleaved little-endian 16-bit samples converted from floats in
/// `[-1, 1]` (values outside are clamped).
pub fn push_pcm16(out: &mut Vec<u8>, left: &[f32], right: &[f32]) {
    out.reserve(left.len() * 4);
    for (l, r) in left.iter().zip(right) {
        out.extend_from_slice(&to_i16(*l).to_le_bytes());
        out.extend_from_slice(&to_i16(*r).to_le_bytes());
    }
}

fn to_i16(x: f32) -> i16 {
    let v = (x.clamp(-1.0, 1.0) * 32767.0).round();
    v as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_sizes_are_exact() {
        let h = header(44_100, 2, data_len(44_100, 2)).unwrap();
        assert_eq!(&h[0..4], b"RIFF");
        assert_eq!(u32::from_le_bytes(h[4..8].try_into().unwrap()), 36 + 176_400);
        assert_eq!(u32::from_le_bytes(h[40..44].try_into().unwrap()), 176_400);
        assert_eq!(u32::from_le_bytes(h[28..32].try_into().unwrap()), 176_400);
        assert_eq!(u16::from_le_bytes(h[32..34].try_into().unwrap()), 4);
    }

    #[test]
    fn sizes_that_do_not_fit_are_errors_not_panics() {
        assert!(header(44_100, 2, u64::from(u32::MAX) - 36).is_ok());
        assert_eq!(
            header(44_100, 2, u64::from(u32::MAX) - 35),
            Err(WavError::TooLong(u64::from(u32::MAX) - 35))
        );
        assert!(matches!(header(44_100, 2, 1 << 40), Err(WavError::TooLong(_))));
        assert!(matches!(header(44_100, u16::MAX, 0), Err(WavError::TooWide { .. })));
        assert!(matches!(header(u32::MAX, 2, 0), Err(WavError::TooWide { .. })));
    }

    #[test]
    fn pcm_clamps_and_interleaves() {
        let mut v = Vec::new();
        push_pcm16(&mut v, &[2.0, 0.0], &[-2.0, 0.5]);
        assert_eq!(v.len(), 8);
        assert_eq!(i16::from_le_bytes([v[0], v[1]]), 32767);
        assert_eq!(i16::from_le_bytes([v[2], v[3]]), -32767);
        assert_eq!(i16::from_le_bytes([v[6], v[7]]), 16384);
    }

    #[test]
    fn a_whole_clip_is_header_then_samples() {
        let bytes = encode_pcm16(8_000, 1, &[0.5, -1.5]).unwrap();
        assert_eq!(bytes.len(), HEADER_LEN + 4);
        assert_eq!(&bytes[..HEADER_LEN], &header(8_000, 1, 4).unwrap());
        assert_eq!(i16::from_le_bytes([bytes[44], bytes[45]]), 16384);
        assert_eq!(i16::from_le_bytes([bytes[46], bytes[47]]), -32767);
    }
}
