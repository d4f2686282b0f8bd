//! What a guest may import. Each capability links its own interfaces into the linker and
//! keeps its per-call state in [`CallState`]; the runtime iterates over them instead of
//! knowing each one. Adding a capability means adding a module here and a line to [`ALL`].

use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::invoke::CallContext;
use super::limits::CallLimiter;

mod audio;
pub mod diffusion;
mod images;
mod progress;
mod resources;
mod since_v0_2;

/// The state of one node call: a fresh one per call, dropped afterwards.
pub struct CallState {
    /// Handles the guest holds.
    pub table: ResourceTable,
    /// The guest's WASI view: log streams, and only what its grants allow.
    pub wasi: WasiCtx,
    /// Memory, table and instance limits.
    pub limiter: CallLimiter,
    /// Who is calling, where progress and logs go, and how to cancel.
    pub call: CallContext,
    /// Bytes the guest has passed through host calls so far.
    pub hostcall_bytes: usize,
    /// The cap on `hostcall_bytes`.
    pub hostcall_limit: usize,
    /// Set when the guest went over `hostcall_limit`.
    pub hostcall_hit: bool,
    /// The video-to-music engine of `weft:node/music`, when the server has one.
    pub music: Option<std::sync::Arc<weft_v2m::Engine>>,
    /// The diffusion capability's part: shared models, the call's deadline.
    pub diffusion: diffusion::DiffusionState,
}

impl CallState {
    /// Counts `bytes` against the host-call budget; an error (which traps the guest) when
    /// the budget is spent.
    pub fn charge(&mut self, bytes: usize) -> wasmtime::Result<()> {
        self.hostcall_bytes = self.hostcall_bytes.saturating_add(bytes);
        if self.hostcall_bytes > self.hostcall_limit {
            self.hostcall_hit = true;
            wasmtime::bail!("host-call byte limit of {} bytes exceeded", self.hostcall_limit);
        }
        Ok(())
    }
}

impl CallState {
    /// The bytes of an asset the workflow referenced, or the node error for a missing one.
    pub fn read_asset(
        &self,
        asset: crate::runtime::bindings::wit::AssetRef,
    ) -> Result<Vec<u8>, crate::runtime::bindings::wit::NodeError> {
        let reference = crate::runtime::value::AssetRef {
            id: asset.id,
            hash: asset.hash,
            file_path: asset.file_path,
        };
        self.call
            .assets
            .read(&reference)
            .map_err(|message| crate::runtime::bindings::wit::NodeError {
                code: "missing_asset".into(),
                message,
            })
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// A set of imports offered to guests.
pub type LinkFn = fn(&mut Linker<CallState>) -> wasmtime::Result<()>;

/// Every capability, in link order.
pub const ALL: &[(&str, LinkFn)] = &[
    ("wasi", link_wasi),
    ("resources", |l| {
        super::bindings::weft::node::types::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("progress", |l| {
        super::bindings::weft::node::host::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("images", |l| {
        super::bindings::weft::node::images::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("music", |l| {
        super::bindings::weft::node::music::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("resources@0.2.0", |l| {
        super::worlds::v0_2::weft::node::types::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("progress@0.2.0", |l| {
        super::worlds::v0_2::weft::node::host::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("images@0.2.0", |l| {
        super::worlds::v0_2::weft::node::images::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("music@0.2.0", |l| {
        super::worlds::v0_2::weft::node::music::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
    ("diffusion", |l| {
        super::worlds::v0_2::weft::node::diffusion::add_to_linker::<_, HasSelf<CallState>>(l, |s| s)
    }),
];

/// WASI preview 2, which every Rust or Python guest imports. What it can reach is decided
/// per call by the [`WasiCtx`]: by default no files, no network and no environment.
fn link_wasi(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)
}

/// Links every capability.
pub fn link_all(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    for (name, link) in ALL {
        link(linker).map_err(|e| e.context(format!("linking capability {name}")))?;
    }
    Ok(())
}
