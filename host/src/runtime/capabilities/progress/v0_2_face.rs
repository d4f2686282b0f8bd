//! The `weft:node@0.2.0` face of `host`: the same calls as 0.1.0.

use super::ProgressState;
use crate::runtime::bindings::v0_1::weft::node as v1;
use crate::runtime::bindings::v0_2::weft::node as v2;
use crate::runtime::capabilities::CapabilityCtx;

impl v2::host::Host for CapabilityCtx<'_, ProgressState> {
    fn progress(&mut self, step: u32, steps: u32, message: Option<String>) -> wasmtime::Result<()> {
        v1::host::Host::progress(self, step, steps, message)
    }
    fn is_canceled(&mut self) -> wasmtime::Result<bool> {
        v1::host::Host::is_canceled(self)
    }
}
