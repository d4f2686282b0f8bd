//! The part of a call every capability shares: the handle table, the host-call byte
//! budget, the deadline and the job's memory.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::ResourceTable;

use crate::runtime::call::{CallContext, Deadline};
use crate::runtime::limits::{HostcallBudget, Limits};
use crate::runtime::memory::{Charge, JobMemory, MemoryLimit};

/// What every capability of one call shares.
pub struct CallCore {
    /// Handles the guest holds, shared by every capability.
    pub table: ResourceTable,
    /// Bytes the guest has passed through host calls, against their cap.
    pub hostcalls: HostcallBudget,
    /// When the call must stop: its time limit or its job's cancel.
    pub(crate) deadline: Deadline,
    /// The job's budget of host-held values, which every value made is charged to.
    pub memory: Arc<JobMemory>,
}

impl CallCore {
    /// The core of a new call under `limits`, for the job context `call`.
    pub(crate) fn new(limits: &Limits, call: &CallContext) -> Self {
        Self {
            table: ResourceTable::new(),
            hostcalls: HostcallBudget::new(limits.hostcall_bytes),
            deadline: Deadline::new(Instant::now() + limits.node_timeout, call.cancel.clone()),
            memory: call.memory.clone(),
        }
    }

    /// Reserves `bytes` of the job's host memory for `what`, before it is allocated; over
    /// a budget, the error traps the call as `node_memory_limit`.
    pub(crate) fn charge(&self, bytes: u64, what: impl FnOnce() -> String) -> Result<Charge, MemoryLimit> {
        self.memory.charge(bytes, what)
    }
}
