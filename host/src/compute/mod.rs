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

/// The contiguous `f32` data of a CPU storage with layout `layout`, for the custom operations
/// of weft's CPU kernels (`op` names the operation in the error).
pub(crate) fn contiguous_f32<'a>(
    storage: &'a candle_core::CpuStorage,
    layout: &candle_core::Layout,
    op: &str,
) -> candle_core::Result<&'a [f32]> {
    let data = storage.as_slice::<f32>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: inputs must be contiguous"),
    }
}

/// The largest absolute difference between two tensors of one shape, for tests.
#[cfg(test)]
pub(crate) fn max_abs_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("tensors of one shape")
}
