//! What a guest may import, one folder per capability, in the manner of Spin's factors: a
//! capability reaches its own state and the small core every call shares, never another
//! capability's state.
//!
//! A capability is a type implementing [`Capability`]: it links its interfaces into the
//! linker, has its own operator configuration, and builds the state one call holds. Its
//! host functions are implemented on [`CapabilityCtx<'_, Self::State>`](CapabilityCtx):
//! that state beside the [`CallCore`] (the handle table, the host-call byte budget, the
//! deadline and the job's memory). [`CallState`] composes every capability's state with the
//! core, and hands each capability its projection ([`Own`]). Adding a capability means
//! adding a folder, its `mod` line, and one line to the `capabilities!` list in `state.rs`.

use std::marker::PhantomData;

use wasmtime::component::{HasData, Linker};

use super::call::CallContext;
use super::limits::Limits;

mod core_state;
pub(crate) mod diffusion;
mod images;
mod music;
mod progress;
mod resources;
mod state;
mod wasi;

pub(crate) use core_state::CallCore;
pub use music::MusicConfig;
pub use state::CapabilityConfig;
pub(crate) use state::{link_all, CallState};
pub use wasi::Capabilities;

/// One host capability given to guests.
pub trait Capability: 'static {
    /// How the operator configures it, fixed when the runtime is built.
    type Config: Clone + Default + std::fmt::Debug;
    /// What one call holds.
    type State: Send + 'static;

    /// Links the capability's interfaces; their host functions reach the call through
    /// [`own::<Self>`](own) only.
    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()>;

    /// The state of a new call under `limits`, made for the job context `call` of a plugin
    /// granted `grants`.
    fn new_state(config: &Self::Config, limits: &Limits, call: &CallContext, grants: &Capabilities) -> Self::State;
}

/// What one capability's host functions see of a call: the shared core and its own state.
pub(crate) struct CapabilityCtx<'a, S> {
    /// The handle table, byte budget, deadline and job memory every capability shares.
    pub(crate) core: &'a mut CallCore,
    /// This capability's state.
    pub(crate) state: &'a mut S,
}

/// Store data that holds capability `C`'s state: its projection for `C`'s host functions.
/// [`CallState`] implements it once per capability.
pub(crate) trait HasCapability<C: Capability> {
    /// `C`'s view of the call.
    fn capability(&mut self) -> CapabilityCtx<'_, C::State>;
}

/// The `HasData` of capability `C`'s generated `add_to_linker`s: its host functions are
/// implemented on [`CapabilityCtx`] of its state.
pub(crate) struct Own<C>(PhantomData<fn() -> C>);

impl<C: Capability> HasData for Own<C> {
    type Data<'a> = CapabilityCtx<'a, C::State>;
}

/// Capability `C`'s projection of the call state, the getter its `add_to_linker`s take.
pub(crate) fn own<C: Capability>(state: &mut CallState) -> CapabilityCtx<'_, C::State>
where
    CallState: HasCapability<C>,
{
    state.capability()
}

#[cfg(test)]
mod tests {
    use weft_compute::diffusion::ModelError;
    use weft_compute::ComputeError;
    use weft_types::NodeErrorCode;
    use weft_v2m::V2mError;

    /// The codes the host functions pass on from compute, the model loader and
    /// video-to-music are all named in the shared enum, so the documented list is complete.
    #[test]
    fn every_code_a_host_function_returns_is_a_named_node_error_code() {
        let text = || String::from("x");
        let codes = [
            ComputeError::Invalid(text()).code(),
            ComputeError::TooLarge(text()).code(),
            ComputeError::Failed(text()).code(),
            ComputeError::Interrupted.code(),
            ModelError::NotFound(text()).code(),
            ModelError::Invalid(text()).code(),
            ModelError::Failed(text()).code(),
            V2mError::MissingVideo.code(),
            V2mError::UnreadableVideo(text()).code(),
            V2mError::VideoTooLong {
                duration_s: 2.0,
                max_duration_s: 1.0,
            }
            .code(),
            V2mError::TooManyCopies { requested: 2, max: 1 }.code(),
            V2mError::SoundFont(text()).code(),
            V2mError::GenerationFailed(text()).code(),
        ];
        for code in codes {
            assert!(
                !matches!(NodeErrorCode::parse(code), NodeErrorCode::Other(_)),
                "{code} has no NodeErrorCode variant"
            );
        }
    }
}
