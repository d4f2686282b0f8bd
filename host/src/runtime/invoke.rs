//! One node call: a fresh `Store` with its limits, the guest's inputs lowered to handles,
//! the call, and every way it can fail turned into a [`NodeFailure`].

use wasmtime::{Store, Trap, UpdateDeadline};

use weft_types::NodeErrorCode;

use super::call::{CallContext, Interrupt};
use super::capabilities::CallState;
use super::memory::MemoryLimit;
use super::registry::LoadedPlugin;
use super::value::{NodeFailure, NodeOutput, Value};
use super::Runtime;

/// What wasmtime's host-copy budget allows beyond [`Limits::hostcall_bytes`](super::Limits)
/// for the bookkeeping it counts besides the bytes themselves; what passes that is
/// `node_output_too_large`, and what passes only ours is reported by our own check.
const HOSTCALL_FUEL_SLACK: usize = 1 << 20;

/// Part of the message of wasmtime's error for a copy over its host-copy budget (its type
/// is private).
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";

impl Runtime {
    /// Runs node `class` with `inputs`, in a fresh store, under the runtime's limits.
    /// Blocking: call it from a blocking thread.
    pub fn call(
        &self,
        class: &str,
        inputs: Vec<(String, Value)>,
        ctx: &CallContext,
    ) -> Result<NodeOutput, NodeFailure> {
        let plugin = self.plugin_for(class).ok_or_else(|| {
            NodeFailure::new(
                NodeErrorCode::NodeExecutionError,
                format!("no plugin defines class {class:?}"),
            )
        })?;
        if ctx.cancel.is_canceled() {
            return Err(NodeFailure::new(NodeErrorCode::Canceled, "the job was canceled"));
        }
        let log_mark = ctx.log.written();
        let mut store = self.new_store(plugin, ctx);
        let result = self.run_call(&mut store, plugin, class, inputs);
        match result {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(failure)) => Err(failure.bounded()),
            Err(error) => Err(classify(error, store.data(), &ctx.log.since(log_mark)).bounded()),
        }
    }

    /// A store for one call, with its limits and its deadline.
    pub(super) fn new_store(&self, plugin: &LoadedPlugin, call: &CallContext) -> Store<CallState> {
        let state = CallState::new(&self.capabilities, &self.limits, call, &plugin.grants);
        let deadline = state.core.deadline.clone();
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        // wasmtime's own cap on what one call copies from the guest (128 MiB by default)
        // follows ours, so a result over it is reported as too large, not as a trap.
        store.set_hostcall_fuel(self.limits.hostcall_bytes.saturating_add(HOSTCALL_FUEL_SLACK));
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            deadline.check()?;
            Ok(UpdateDeadline::Continue(1))
        });
        store
    }

    fn run_call(
        &self,
        store: &mut Store<CallState>,
        plugin: &LoadedPlugin,
        class: &str,
        inputs: Vec<(String, Value)>,
    ) -> wasmtime::Result<Result<NodeOutput, NodeFailure>> {
        plugin.pre.execute(store, class, inputs, self.limits.hostcall_bytes)
    }
}

/// Turns a trap or host error into the failure a caller sees, naming the limit that was hit.
fn classify(error: wasmtime::Error, state: &CallState, new_log: &str) -> NodeFailure {
    let traceback = error.downcast_ref::<wasmtime::WasmBacktrace>().map(|bt| bt.to_string());
    let trap = error.downcast_ref::<Trap>().copied();
    let mut failure = if let Some(interrupt) = error.downcast_ref::<Interrupt>() {
        match interrupt {
            Interrupt::Timeout => NodeFailure::new(NodeErrorCode::NodeTimeout, interrupt.to_string()),
            Interrupt::Canceled => NodeFailure::new(NodeErrorCode::Canceled, interrupt.to_string()),
        }
    } else if let Some(limit) = error.downcast_ref::<MemoryLimit>() {
        NodeFailure::new(MemoryLimit::CODE, limit.to_string())
    } else if error.chain().any(|e| e.to_string().contains(HOSTCALL_FUEL_EXHAUSTED)) {
        NodeFailure::new(
            NodeErrorCode::NodeOutputTooLarge,
            format!(
                "the node passed more than {} bytes in one copy between it and the host",
                state.core.hostcalls.limit
            ),
        )
    } else if state.limiter.memory_hit {
        NodeFailure::new(
            NodeErrorCode::NodeMemoryLimit,
            "the node tried to grow its memory past the limit",
        )
    } else if state.limiter.table_hit {
        NodeFailure::new(
            NodeErrorCode::NodeMemoryLimit,
            "the node tried to grow a table past the limit",
        )
    } else if state.core.hostcalls.hit {
        NodeFailure::new(
            NodeErrorCode::NodeHostcallLimit,
            format!(
                "the node passed more than {} bytes through host calls",
                state.core.hostcalls.limit
            ),
        )
    } else if trap == Some(Trap::StackOverflow) || (trap == Some(Trap::MemoryOutOfBounds) && runaway_recursion(&error))
    {
        NodeFailure::new(
            NodeErrorCode::NodeStackOverflow,
            "the node overflowed its stack (too deep recursion)",
        )
    } else if let Some(panic) = panic_message(new_log) {
        NodeFailure::new(NodeErrorCode::NodePanic, format!("the node panicked: {panic}"))
    } else if let Some(trap) = trap {
        NodeFailure::new(NodeErrorCode::NodeTrap, format!("the node trapped: {trap}"))
    } else {
        NodeFailure::new(NodeErrorCode::NodeExecutionError, format!("{error:#}"))
    };
    failure.traceback = traceback;
    failure
}

/// Whether a trap's backtrace is one function calling itself over and over. Languages
/// that keep their stack in linear memory (Rust, C) overflow it into an out-of-bounds
/// access before wasm's own stack runs out, so this is how their stack overflow looks.
fn runaway_recursion(error: &wasmtime::Error) -> bool {
    let Some(backtrace) = error.downcast_ref::<wasmtime::WasmBacktrace>() else {
        return false;
    };
    let frames = backtrace.frames();
    frames.len() >= 16 && frames[1..16].iter().all(|f| f.func_index() == frames[1].func_index())
}

/// The message of a Rust guest panic, from the stderr lines the call wrote.
fn panic_message(log: &str) -> Option<String> {
    let line = log.lines().rev().find(|l| l.contains("panicked at"))?;
    let after = log.split(line).nth(1).unwrap_or("");
    let message = after.lines().find(|l| !l.trim().is_empty()).unwrap_or(line);
    Some(message.trim().to_string())
}
