//! Typed host-held values. The contract passes every host-held type that has no resource
//! of its own as a generic [`Handle`] named by its ComfyUI type; a typed wrapper makes a
//! node's inputs and outputs say which type they carry, and checks it on the way in.
//!
//! `Model`, `Clip`, `Vae`, `Conditioning`, `UpscaleModel`, `ControlNet` and the custom-sampling types `Sampler`,
//! `Sigmas`, `Noise` and `Guider` are defined here. Declare any other type in
//! one line with [`handle_type!`](crate::handle_type):
//! `weft_sdk::handle_type!(/// Noise levels. pub struct Sigmas = "SIGMAS");`

use crate::Handle;

/// Declares a typed wrapper around a [`Handle`] of one ComfyUI type, usable as a node
/// input and output: `weft_sdk::handle_type!(/// Docs. pub struct Sigmas = "SIGMAS");`.
#[macro_export]
macro_rules! handle_type {
    ($(#[$meta:meta])* $vis:vis struct $name:ident = $type_name:literal) => {
        $(#[$meta])*
        $vis struct $name(pub $crate::Handle);

        impl $name {
            /// The ComfyUI type name.
            pub const TYPE_NAME: &'static str = $type_name;

            /// The handle inside.
            pub fn handle(&self) -> &$crate::Handle {
                &self.0
            }
        }

        impl $crate::InputType for $name {
            const TYPE_NAME: &'static str = $type_name;

            fn from_value(name: &str, value: $crate::Value) -> ::std::result::Result<Self, $crate::NodeError> {
                $crate::__private::handle_of_type(name, value, $type_name).map($name)
            }
        }

        impl $crate::OutputType for $name {
            const TYPE_NAME: &'static str = $type_name;

            fn into_value(self) -> $crate::Value {
                $crate::Value::Handle(self.0)
            }
        }
    };
}

/// The handle given for input `name` when it holds a `type_name`; `invalid_input` otherwise.
pub fn handle_of_type(name: &str, value: crate::Value, type_name: &str) -> Result<Handle, crate::NodeError> {
    match value {
        crate::Value::Handle(h) if h.type_name() == type_name => Ok(h),
        other => Err(crate::NodeError::invalid_input(format!(
            "input `{name}`: expected {type_name}, got {}",
            crate::input::value_type_name(&other)
        ))),
    }
}

handle_type!(
    /// A diffusion model (ComfyUI's `MODEL`).
    pub struct Model = "MODEL"
);
handle_type!(
    /// A text encoder (ComfyUI's `CLIP`).
    pub struct Clip = "CLIP"
);
handle_type!(
    /// An image autoencoder (ComfyUI's `VAE`).
    pub struct Vae = "VAE"
);
handle_type!(
    /// Encoded text conditioning (ComfyUI's `CONDITIONING`).
    pub struct Conditioning = "CONDITIONING"
);
handle_type!(
    /// An image upscale model (ComfyUI's `UPSCALE_MODEL`).
    pub struct UpscaleModel = "UPSCALE_MODEL"
);
handle_type!(
    /// A ControlNet (ComfyUI's `CONTROL_NET`).
    pub struct ControlNet = "CONTROL_NET"
);
handle_type!(
    /// A sampler with its own parameters (ComfyUI's `SAMPLER`).
    pub struct Sampler = "SAMPLER"
);
handle_type!(
    /// Noise levels to sample through (ComfyUI's `SIGMAS`).
    pub struct Sigmas = "SIGMAS"
);
handle_type!(
    /// The initial noise of a sampling run (ComfyUI's `NOISE`).
    pub struct Noise = "NOISE"
);
handle_type!(
    /// A model with the conditioning it is guided by (ComfyUI's `GUIDER`).
    pub struct Guider = "GUIDER"
);
