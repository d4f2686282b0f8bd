//! The ComfyUI type names of weft's node inputs and outputs, in one table shared by the
//! server (catalogue, workflow validation, value types) and the node SDK (the types a node's
//! Rust signature maps to), and the codes a node fails with ([`NodeErrorCode`]).
//! Dependency-free (`alloc` only), so it builds for the host and for wasm guests.
//!
//! A name is what `describe()` reports and `/object_info` shows, and what a workflow link
//! is checked against: an output of one type may feed an input of the same type.

#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;

mod error_code;

pub use error_code::{NodeErrorCode, MAX_CODE_BYTES};

/// A whole number (64-bit).
pub const INT: &str = "INT";
/// A floating-point number (64-bit).
pub const FLOAT: &str = "FLOAT";
/// A string.
pub const STRING: &str = "STRING";
/// `true` or `false`.
pub const BOOLEAN: &str = "BOOLEAN";
/// One of a fixed list of strings, given with the input's declaration.
pub const COMBO: &str = "COMBO";
/// Any JSON value.
pub const JSON: &str = "JSON";
/// Any type: an input of this type accepts every output, and an output of it feeds any input.
pub const ANY: &str = "*";
/// A reference to an uploaded asset. In a workflow it is written
/// `{"__type": "core/ASSET", "info": {"id": ...}}`.
pub const ASSET: &str = "core/ASSET";
/// A batch of images, held by the host.
pub const IMAGE: &str = "IMAGE";
/// A batch of latents, held by the host.
pub const LATENT: &str = "LATENT";
/// A batch of masks, held by the host.
pub const MASK: &str = "MASK";
/// An audio clip, held by the host.
pub const AUDIO: &str = "AUDIO";
/// A diffusion model, held by the host.
pub const MODEL: &str = "MODEL";
/// A text encoder, held by the host.
pub const CLIP: &str = "CLIP";
/// An image autoencoder, held by the host.
pub const VAE: &str = "VAE";
/// Encoded prompts, held by the host.
pub const CONDITIONING: &str = "CONDITIONING";

/// The types whose values only the host holds (a guest sees a handle). A workflow cannot
/// write one as a literal: it must come from a link to another node's output.
pub const HANDLES: &[&str] = &[IMAGE, LATENT, MASK, AUDIO, MODEL, CLIP, VAE, CONDITIONING];

/// Whether `type_name` is one of the [`HANDLES`].
pub fn is_handle(type_name: &str) -> bool {
    HANDLES.contains(&type_name)
}
