//! The state of one call, composed from the list of capabilities. Its capability fields are
//! private to this module: a capability reaches only its own, through [`HasCapability`].

use wasmtime::component::Linker;

use super::{CallCore, Capabilities, Capability, CapabilityCtx, HasCapability};
use crate::runtime::call::CallContext;
use crate::runtime::limits::{CallLimiter, Limits};

/// Declares [`CallState`], [`CapabilityConfig`], the projections and [`link_all`] from the
/// list of capabilities: `field: Type`, in link order.
macro_rules! capabilities {
    ($($(#[$doc:meta])* $field:ident: $capability:ty,)*) => {
        /// The state of one node call: a fresh one per call, dropped afterwards.
        pub struct CallState {
            /// What every capability shares.
            pub core: CallCore,
            /// Memory, table and instance limits.
            pub limiter: CallLimiter,
            $($(#[$doc])* $field: <$capability as Capability>::State,)*
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
                    core: CallCore::new(limits, call),
                    limiter: CallLimiter::new(limits),
                    $($field: <$capability as Capability>::new_state(&config.$field, limits, call, grants),)*
                }
            }
        }

        $(impl HasCapability<$capability> for CallState {
            fn capability(&mut self) -> CapabilityCtx<'_, <$capability as Capability>::State> {
                CapabilityCtx {
                    core: &mut self.core,
                    state: &mut self.$field,
                }
            }
        })*

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
    wasi: super::wasi::Wasi,
    /// `weft:node/types`: the host-held resources' accessors.
    resources: super::resources::Resources,
    /// `weft:node/host`: progress reports and cancellation checks.
    progress: super::progress::Progress,
    /// `weft:node/images`: pixel work on host-held images.
    images: super::images::Images,
    /// `weft:node/music`: music for a video.
    music: super::music::Music,
    /// `weft:node/diffusion` (0.2.0): models, text encoding, latents, sampling, VAE.
    diffusion: super::diffusion::Diffusion,
}
