//! The host-held payloads behind the WIT resources that have no operations yet. They are
//! shaped now so that the contract is stable; the diffusion and audio work fills them in.

use std::any::Any;
use std::sync::Arc;

/// A batch of latents, `[batch, channels, height/8, width/8]`, float32: ComfyUI's `LATENT`
/// dictionary (`samples`, `noise_mask`, `batch_index`).
#[derive(Debug, Clone, PartialEq)]
pub struct LatentBatch {
    /// `[batch, channels, height, width]` of the latent tensor itself.
    pub shape: [u32; 4],
    /// Row-major values.
    pub data: Vec<f32>,
    /// Where sampling may change the latent (1) or must keep it (0), at pixel resolution:
    /// one mask, or one per latent of the batch. Set by `SetLatentNoiseMask` and inpainting.
    pub noise_mask: Option<std::sync::Arc<crate::image::MaskBatch>>,
    /// Which noise of a seed each latent of the batch gets (`LatentFromBatch`,
    /// `RepeatLatentBatch`); none means latent `i` gets noise `i`.
    pub batch_index: Option<Vec<u32>>,
}

/// A clip of audio, float32 samples interleaved by channel.
#[derive(Debug, Clone, PartialEq)]
pub struct AudioClip {
    /// Samples per second per channel.
    pub sample_rate: u32,
    /// Number of channels.
    pub channels: u32,
    /// `frames * channels` samples.
    pub samples: Vec<f32>,
}

impl AudioClip {
    /// Number of sample frames.
    pub fn frames(&self) -> u64 {
        if self.channels == 0 {
            0
        } else {
            (self.samples.len() / self.channels as usize) as u64
        }
    }
}

/// A loaded model-like object (MODEL, CLIP, VAE, CONDITIONING) that nodes pass along by
/// handle. `payload` is whatever the compute backend keeps for it.
#[derive(Clone)]
pub struct Opaque {
    /// Where it came from, for example a checkpoint name.
    pub name: String,
    /// How many entries it holds (CONDITIONING's `len`), where that means something.
    pub len: u32,
    /// The backend's data.
    pub payload: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for Opaque {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opaque")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish()
    }
}
