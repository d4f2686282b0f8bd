//! WASI preview 2, which every Rust or Python guest imports. What it can reach is decided
//! per call from the plugin's [`Capabilities`]: by default no files, no network and no
//! environment; stdout and stderr go to the job's log. Its blocking waits end at the
//! call's deadline or cancel, as guest code does (see `blocking.rs`).

use wasmtime::component::Linker;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::{CallState, Capability, CapabilityCtx, HasCapability};
use crate::runtime::call::CallContext;

mod blocking;
mod grants;

pub use grants::Capabilities;

/// The WASI capability.
pub struct Wasi;

impl Capability for Wasi {
    type Config = ();
    type State = WasiCtx;

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        wasmtime_wasi::p2::add_to_linker_sync(linker)?;
        blocking::link(linker)
    }

    fn new_state(_: &(), _: &crate::runtime::limits::Limits, call: &CallContext, grants: &Capabilities) -> WasiCtx {
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(call.log.clone()).stderr(call.log.clone());
        grants.apply(&mut wasi);
        wasi.build()
    }
}

/// wasmtime-wasi links against store data that is a `WasiView`: the call state, through
/// this capability's projection (its `WasiCtx` and the shared table).
impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let CapabilityCtx { core, state } = HasCapability::<Wasi>::capability(self);
        WasiCtxView {
            ctx: state,
            table: &mut core.table,
        }
    }
}
