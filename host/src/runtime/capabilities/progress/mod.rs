//! `weft:node/host`: progress reports and cancellation checks.

mod v0_2_face;

use std::sync::Arc;

use wasmtime::component::Linker;

use super::{own, CallState, Capabilities, Capability, CapabilityCtx, Own};
use crate::runtime::bindings::v0_1::weft::node::host::{add_to_linker, Host};
use crate::runtime::bindings::v0_2;
use crate::runtime::call::{CallContext, CancelToken, ProgressSink};
use crate::runtime::guest_text::{bounded, PROGRESS_MESSAGE_BYTES};

/// The progress capability.
pub struct Progress;

/// What a call reports progress to, and how it learns it was canceled.
pub struct ProgressState {
    sink: Arc<dyn ProgressSink>,
    cancel: CancelToken,
}

impl Capability for Progress {
    type Config = ();
    type State = ProgressState;

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        add_to_linker::<_, Own<Self>>(linker, own::<Self>)?;
        v0_2::weft::node::host::add_to_linker::<_, Own<Self>>(linker, own::<Self>)
    }

    fn new_state(_: &(), _: &crate::runtime::limits::Limits, call: &CallContext, _: &Capabilities) -> ProgressState {
        ProgressState {
            sink: call.progress.clone(),
            cancel: call.cancel.clone(),
        }
    }
}

impl Host for CapabilityCtx<'_, ProgressState> {
    fn progress(&mut self, step: u32, steps: u32, message: Option<String>) -> wasmtime::Result<()> {
        self.core.hostcalls.charge(message.as_ref().map_or(0, String::len))?;
        let message = message.map(|m| bounded(m, PROGRESS_MESSAGE_BYTES));
        self.state.sink.report(step, steps.max(step), message);
        Ok(())
    }

    fn is_canceled(&mut self) -> wasmtime::Result<bool> {
        Ok(self.state.cancel.is_canceled())
    }
}
