//! Host-side numeric work that nodes call instead of doing it in wasm: images today;
//! tensors, samplers, models and audio as the product grows. Nothing here knows about
//! wasm, jobs or HTTP.

pub mod attention;
pub mod conv;
pub mod device;
pub mod geglu;
pub mod image;
pub mod linear;
mod matmul;
pub mod models;
pub mod norm;
pub mod preview;
pub mod sampling;
mod simd;
pub mod text_to_image;
pub mod tokenizer;
pub mod vae;
pub mod values;

/// Why a compute operation failed. Each becomes a node error for the calling node.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// The arguments were out of range or malformed.
    #[error("{0}")]
    Invalid(String),
    /// The result would exceed a host limit.
    #[error("{0}")]
    TooLarge(String),
    /// The operation failed for another reason.
    #[error("{0}")]
    Failed(String),
}

impl ComputeError {
    /// An `Invalid` error with `message`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(message.into())
    }

    /// The node-error code for this failure.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_input",
            Self::TooLarge(_) => "value_too_large",
            Self::Failed(_) => "compute_failed",
        }
    }
}
