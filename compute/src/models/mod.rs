//! Model files for SD1.x and SDXL: validated single-file safetensors checkpoints in the
//! original (LDM) layout, family detection, the name mapping onto weft's UNet, VAE and CLIP
//! text transformers, and the networks themselves. See `DESIGN.md` next to this file.

pub mod autoencoder;
pub mod cache;
pub mod clip_text;
pub mod controlnet;
pub mod layout;
pub mod loader;
pub mod random_checkpoint;
pub mod safetensors;
pub mod separate;
mod storage;
pub mod unet;
mod working;

pub use autoencoder::Sd1Vae;
pub use cache::ModelCache;
pub use clip_text::ClipText;
pub use controlnet::ControlNet;
pub use layout::{
    checkpoint_layout, detect_arch, ldm_to_candle, open_checkpoint, write_random_checkpoint, Arch, Component,
    ModelConfig,
};
pub use loader::{load_models, load_sd1, CheckpointModels, TextModels, UnetModels};
pub use safetensors::{CheckpointError, Dtype, SafetensorsIndex, TensorInfo, DEFAULT_MAX_HEADER};
pub use unet::{ControlResiduals, Unet};
