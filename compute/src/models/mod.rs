//! Model files for SD1.x: validated single-file safetensors checkpoints in the original (LDM)
//! layout, architecture detection, and the name mapping onto candle-transformers'
//! `stable_diffusion` UNet / VAE / CLIP. See `DESIGN.md` next to this file.

pub mod autoencoder;
pub mod cache;
pub mod candle_sd1;
pub mod clip_text;
pub mod random_checkpoint;
pub mod safetensors;
pub mod sd1;
pub mod unet;
mod working;

pub use autoencoder::Sd1Vae;
pub use cache::ModelCache;
pub use candle_sd1::{load_sd1, load_sd1_with_config, Sd1Models};
pub use clip_text::ClipText;
pub use safetensors::{CheckpointError, Dtype, SafetensorsIndex, TensorInfo, DEFAULT_MAX_HEADER};
pub use sd1::{
    checkpoint_layout, detect_arch, ldm_to_candle, open_sd1, write_random_checkpoint, Arch, Component, Sd1Config,
};
pub use unet::Sd1Unet;
