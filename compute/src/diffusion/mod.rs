//! What ComfyUI's Stable Diffusion nodes compute, on SD1 networks: checkpoints by layout,
//! text encoding with an earlier last layer, LoRAs, conditioning lists, latent batches and their
//! operations, `KSampler` with areas, strengths and noise masks, and VAE encoding and
//! decoding with ComfyUI's cropping and inpainting. Nothing here knows about wasm, jobs or
//! HTTP; the runtime's `diffusion` capability exposes it to nodes by handle.

pub mod adm;
pub mod autoencoder;
pub mod checkpoint;
pub mod conditioning;
pub mod control;
pub mod controlnet;
pub mod custom_sampling;
pub mod guidance;
pub mod inpaint;
pub mod ksampler;
pub mod latent;
pub mod latent_ops;
pub mod lora;
pub mod model;
pub mod placement;
pub mod prompt;
pub mod separate;
pub mod source;
pub mod text;
pub mod vae;

pub use autoencoder::{write_random_vae, Autoencoder, StandaloneVae};
pub use checkpoint::{detect_layout, load_checkpoint, ModelError};
pub use conditioning::{Area, CondEntry, Conditioning, SizeConditioning};
pub use control::Control;
pub use controlnet::{load_controlnet, ControlSettings};
pub use custom_sampling::{sample_custom, CustomSampler, Guider, GuiderKind, NoiseSpec, Sigmas};
pub use inpaint::{inpaint_model_conditioning, InpaintConditioning};
pub use ksampler::{ksample, run_sampling, SampleFailure, SampleSettings, Sampled, SamplingRun};
pub use lora::{write_random_lora, Lora};
pub use model::{DiffusionModel, LatentFormat};
pub use separate::{load_clip, load_unet, ClipKind, WEIGHT_DTYPES};
pub use text::{Encoded, EncoderTexts, TextEncoder};
