//! Write weft node plugins in Rust.
//!
//! A weft plugin is a WebAssembly component that targets the `plugin` world of
//! `weft:node@0.2.0`. This crate generates the bindings for that world and adds a
//! declarative [`node!`] macro, so that a node's definition (what `describe()` reports)
//! and its code come from one declaration and cannot drift apart. [`export_plugin!`]
//! then exports a list of nodes as the plugin.
//!
//! ```ignore
//! weft_sdk::node! {
//!     /// Joins two strings with a delimiter.
//!     pub struct StringConcatenate {
//!         display_name: "Concatenate",
//!         category: "utils/string",
//!         inputs {
//!             string_a: String = input::string().multiline(),
//!             string_b: String = input::string().multiline(),
//!             delimiter: String = input::string().default(""),
//!         }
//!         outputs { STRING: String }
//!         fn execute(ctx, inp) {
//!             Ok((format!("{}{}{}", inp.string_a, inp.delimiter, inp.string_b),))
//!         }
//!     }
//! }
//! weft_sdk::export_plugin!(StringConcatenate);
//! ```
//!
//! See the crate's `README.md` for the full guide.

mod context;
mod error;
mod handle;
pub mod input;
mod json;
mod macros;
mod node;
mod output;

/// Bindings generated from `wit/weft-node-0.2.0` (world `plugin`).
///
/// Most authors need only the re-exports at the crate root; the raw bindings are here
/// for anything the SDK does not wrap.
pub mod bindings {
    #![allow(missing_docs)]
    wit_bindgen::generate!({
        path: "../wit/weft-node-0.2.0",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "weft_sdk::bindings",
    });
}

/// Host-side Stable Diffusion: models, conditioning, latents, sampling, VAE.
pub use bindings::weft::node::diffusion;
/// Host calls every node may make: `progress` and `is_canceled` (prefer [`Context`]).
pub use bindings::weft::node::host;
/// Host-side image operations: `empty`, `invert`, `scale`, `load`, `load_mask`, and
/// ComfyUI's image nodes (`transform`, `blend`, `filter`, `composite`, `pad`, ...).
pub use bindings::weft::node::images;
/// Host-side mask operations: ComfyUI's mask nodes (`solid`, `invert`, `crop`, ...).
pub use bindings::weft::node::masks;
pub use bindings::weft::node::types::{
    ApngFrames, AssetRef, Audio, FileData, Handle, Image, InputSpec, Latent, Mask, NamedValue, NodeDef, NodeError,
    NodeResult, OutputFile, OutputKind, OutputSpec, Value,
};
pub use handle::{Clip, Conditioning, ControlNet, Guider, Model, Noise, Sampler, Sigmas, UpscaleModel, Vae};

pub use context::Context;
pub use input::{Input, InputType, InputValues, Spec};
pub use node::{describe, execute, Node, NodeEntry};
pub use output::{IntoOutputs, OutputType};
/// The codes a node fails with, shared with the host: [`NodeError::new`] takes one (or any
/// other snake_case code) and [`NodeError::error_code`] gives it back.
pub use weft_types::NodeErrorCode;

/// Everything a plugin usually needs, for `use weft_sdk::prelude::*`.
pub mod prelude {
    pub use crate::input;
    pub use crate::{
        diffusion, images, masks, AssetRef, Audio, Clip, Conditioning, Context, ControlNet, FileData, Guider, Handle,
        Image, Latent, Mask, Model, NodeError, Noise, OutputFile, OutputKind, Sampler, Sigmas, UpscaleModel, Vae,
    };
}

/// Support code for the macros; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::handle::handle_of_type;
    pub use crate::input::{input_spec, take_input};
    pub use crate::output::output_spec;

    /// An input's name as the workflow spells it: a raw identifier (`r#type`) without its
    /// `r#`.
    pub fn input_name(ident: &'static str) -> &'static str {
        ident.strip_prefix("r#").unwrap_or(ident)
    }

    /// Joins the lines of a doc comment into a description.
    pub fn doc_text(lines: &[&str]) -> String {
        let text: Vec<&str> = lines
            .iter()
            .flat_map(|l| l.split('\n'))
            .map(|l| l.strip_prefix(' ').unwrap_or(l).trim_end())
            .collect();
        text.join("\n").trim().to_string()
    }
}
