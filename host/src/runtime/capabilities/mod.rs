//! What a guest may import, one folder per capability, in the manner of Spin's factors.
//!
//! A capability is a type implementing [`Capability`]: it links its interfaces into the
//! linker, has its own operator configuration, and builds the state one call holds.
//! [`CallState`] composes those states, one field per capability, beside what every call
//! shares (the handle table and the limits). Adding a capability means adding a folder, its
//! `mod` line, and one line to the `capabilities!` list below.

use wasmtime::component::{Linker, ResourceTable};

use std::sync::Arc;
use std::time::Instant;

use super::call::{CallContext, Deadline};
use super::limits::{CallLimiter, HostcallBudget, Limits};
use super::memory::{Charge, JobMemory, MemoryLimit};

pub(crate) mod diffusion;
mod images;
mod music;
mod progress;
mod resources;
mod wasi;

pub use music::MusicConfig;
pub use wasi::Capabilities;

/// One host capability given to guests.
pub trait Capability {
    /// How the operator configures it, fixed when the runtime is built.
    type Config: Clone + Default + std::fmt::Debug;
    /// What one call holds.
    type State;

    /// Links the capability's interfaces.
    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()>;

    /// The state of a new call under `limits`, made for the job context `call` of a plugin
    /// granted `grants`.
    fn new_state(config: &Self::Config, limits: &Limits, call: &CallContext, grants: &Capabilities) -> Self::State;
}

/// Declares [`CallState`], [`CapabilityConfig`] and [`link_all`] from the list of
/// capabilities: `field: Type`, in link order.
macro_rules! capabilities {
    ($($(#[$doc:meta])* $field:ident: $capability:ty,)*) => {
        /// The state of one node call: a fresh one per call, dropped afterwards.
        pub struct CallState {
            /// Handles the guest holds, shared by every capability.
            pub table: ResourceTable,
            /// Memory, table and instance limits.
            pub limiter: CallLimiter,
            /// Bytes the guest has passed through host calls, against their cap.
            pub hostcalls: HostcallBudget,
            /// When the call must stop: its time limit or its job's cancel.
            pub(crate) deadline: Deadline,
            /// The job's budget of host-held values, which every value made is charged to.
            pub memory: Arc<JobMemory>,
            $($(#[$doc])* pub $field: <$capability as Capability>::State,)*
        }

        /// The operator's configuration of every capability.
        #[derive(Debug, Clone, Default)]
        pub struct CapabilityConfig {
            $($(#[$doc])* pub $field: <$capability as Capability>::Config,)*
        }

        impl CallState {
            /// The state of a new call under `limits`: every capability's, made from
            /// `config`, the job context `call` and the plugin's `grants`.
            pub fn new(config: &CapabilityConfig, limits: &Limits, call: &CallContext, grants: &Capabilities) -> Self {
                Self {
                    table: ResourceTable::new(),
                    limiter: CallLimiter::new(limits),
                    hostcalls: HostcallBudget::new(limits.hostcall_bytes),
                    deadline: Deadline::new(Instant::now() + limits.node_timeout, call.cancel.clone()),
                    memory: call.memory.clone(),
                    $($field: <$capability as Capability>::new_state(&config.$field, limits, call, grants),)*
                }
            }
        }

        /// Links every capability, in the order listed.
        pub(crate) fn link_all(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
            $(<$capability as Capability>::link(linker)
                .map_err(|e| e.context(concat!("linking capability ", stringify!($field))))?;)*
            Ok(())
        }
    };
}

capabilities! {
    /// WASI preview 2: the log streams, and only the files, network and environment granted.
    wasi: wasi::Wasi,
    /// `weft:node/types`: the host-held resources' accessors.
    resources: resources::Resources,
    /// `weft:node/host`: progress reports and cancellation checks.
    progress: progress::Progress,
    /// `weft:node/images`: pixel work on host-held images.
    images: images::Images,
    /// `weft:node/music`: music for a video.
    music: music::Music,
    /// `weft:node/diffusion` (0.2.0): models, text encoding, latents, sampling, VAE.
    diffusion: diffusion::Diffusion,
}

impl CallState {
    /// Reserves `bytes` of the job's host memory for `what`, before it is allocated; over
    /// a budget, the error traps the call as `node_memory_limit`.
    pub(crate) fn charge(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<Charge, MemoryLimit> {
        self.memory.charge(bytes, what)
    }
}
