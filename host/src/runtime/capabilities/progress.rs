//! `weft:node/host`: progress reports and cancellation checks.

use super::CallState;
use crate::runtime::bindings::weft::node::host::Host;

impl Host for CallState {
    fn progress(&mut self, step: u32, steps: u32, message: Option<String>) -> wasmtime::Result<()> {
        self.charge(message.as_ref().map_or(0, String::len))?;
        self.call.progress.report(step, steps.max(step), message);
        Ok(())
    }

    fn is_canceled(&mut self) -> wasmtime::Result<bool> {
        Ok(self.call.cancel.is_canceled())
    }
}
