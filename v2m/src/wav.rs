//! Streaming WAV container: one RIFF/WAVE file emitted as consecutive byte
//! chunks. The header carries exact sizes because the total frame count is
//! known before rendering starts.

/// Size in bytes of the canonical PCM WAV header written by [`header`].
pub const HEADER_LEN: usize = 44;

/// Byte length of the PCM payload for `frames` frames of 16-bit audio.
pub fn data_len(frames: u64, channels: u16) -> u64 {
    frames * u64::from(channels) * 2
}

/// Builds a 44-byte RIFF/WAVE header for 16-bit PCM with exact chunk sizes.
///
/// Panics if the payload does not fit the 32-bit RIFF size fields; callers
/// bound durations far below that (6 minutes of stereo is ~64 MB).
pub fn header(sample_rate: u32, channels: u16, frames: u64) -> [u8; HEADER_LEN] {
    let data = data_len(frames, channels);
    let data = u32::try_from(data).expect("WAV payload exceeds 4 GiB");
    let riff = data.checked_add(36).expect("WAV payload exceeds 4 GiB");
    let block_align = channels * 2;
    let byte_rate = sample_rate * u32::from(block_align);
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&riff.to_le_bytes());
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
    h
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
        let h = header(44_100, 2, 44_100);
        assert_eq!(&h[0..4], b"RIFF");
        assert_eq!(u32::from_le_bytes(h[4..8].try_into().unwrap()), 36 + 176_400);
        assert_eq!(u32::from_le_bytes(h[40..44].try_into().unwrap()), 176_400);
        assert_eq!(u32::from_le_bytes(h[28..32].try_into().unwrap()), 176_400);
        assert_eq!(u16::from_le_bytes(h[32..34].try_into().unwrap()), 4);
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
}
