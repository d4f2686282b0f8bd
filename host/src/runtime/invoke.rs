//! One node call: a fresh `Store` with its limits, the guest's inputs lowered to handles,
//! the call, and every way it can fail turned into a [`NodeFailure`].

use std::time::Instant;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::{Store, Trap, UpdateDeadline};

use super::bindings::wit;
use super::call::CallContext;
use super::capabilities::CallState;
use super::registry::LoadedPlugin;
use super::value::*;
use super::Runtime;

/// What a node returned.
#[derive(Debug, Clone)]
pub struct NodeOutput {
    /// One value per declared output.
    pub values: Vec<Value>,
    /// Files to commit as job outputs.
    pub files: Vec<OutputFile>,
}

/// Why a node call failed. `code` is the interface's `JobError.code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    /// `node_execution_error`, or the specific limit: `node_timeout`, `node_memory_limit`,
    /// `node_stack_overflow`, `node_hostcall_limit`, `node_output_too_large`, `node_panic`,
    /// `node_trap`, `canceled`.
    pub code: String,
    /// What happened, for people.
    pub message: String,
    /// The wasm backtrace, when the guest trapped.
    pub traceback: Option<String>,
}

impl NodeFailure {
    fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            traceback: None,
        }
    }
}

/// Why the epoch callback stopped a guest.
#[derive(Debug, thiserror::Error)]
enum Interrupt {
    #[error("the node ran past its time limit")]
    Timeout,
    #[error("the job was canceled")]
    Canceled,
}

impl Runtime {
    /// Runs node `class` with `inputs`, in a fresh store, under the runtime's limits.
    /// Blocking: call it from a blocking thread.
    pub fn call(
        &self,
        class: &str,
        inputs: Vec<(String, Value)>,
        ctx: &CallContext,
    ) -> Result<NodeOutput, NodeFailure> {
        let plugin = self
            .plugin_for(class)
            .ok_or_else(|| NodeFailure::new("node_execution_error", format!("no plugin defines class {class:?}")))?;
        if ctx.cancel.is_canceled() {
            return Err(NodeFailure::new("canceled", "the job was canceled"));
        }
        let log_mark = ctx.log.written();
        let mut store = self.new_store(plugin, ctx);
        let result = self.run_call(&mut store, plugin, class, inputs);
        match result {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(failure)) => Err(failure),
            Err(error) => Err(classify(error, store.data(), &ctx.log.since(log_mark))),
        }
    }

    /// A store for one call, with its limits and its deadline.
    pub(super) fn new_store(&self, plugin: &LoadedPlugin, call: &CallContext) -> Store<CallState> {
        let state = CallState::new(&self.capabilities, &self.limits, call, &plugin.grants);
        let cancel = call.cancel.clone();
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        let deadline = Instant::now() + self.limits.node_timeout;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if cancel.is_canceled() {
                return Err(Interrupt::Canceled.into());
            }
            if Instant::now() >= deadline {
                return Err(Interrupt::Timeout.into());
            }
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
        let instance = plugin.pre.instantiate(&mut *store)?;
        let mut cost = class.len();
        let mut lowered = Vec::with_capacity(inputs.len());
        for (name, value) in inputs {
            cost += name.len() + value.copy_cost();
            let value = lower(store.data_mut(), value)?;
            lowered.push(wit::NamedValue { name, value });
        }
        store.data_mut().hostcalls.charge(cost)?;
        let result = instance.call_execute(&mut *store, class, &lowered)?;
        let result = match result {
            Ok(result) => result,
            Err(e) => {
                let message = if e.code.is_empty() || e.code == "node_execution_error" {
                    e.message
                } else {
                    format!("{} ({})", e.message, e.code)
                };
                return Ok(Err(NodeFailure::new("node_execution_error", message)));
            }
        };
        let state = store.data_mut();
        let mut values = Vec::with_capacity(result.outputs.len());
        let mut returned = 0usize;
        for value in result.outputs {
            let value = lift(state, value)?;
            returned += value.copy_cost();
            values.push(value);
        }
        let mut files = Vec::with_capacity(result.files.len());
        for file in result.files {
            returned += file.filename_prefix.len() + file.extension.len() + file.content_type.len();
            let data = match file.data {
                wit::FileData::Bytes(bytes) => {
                    returned += bytes.len();
                    FileData::Bytes(bytes)
                }
                wit::FileData::Png(image) => FileData::Png(state.table.delete(image)?.0),
                wit::FileData::Wav(audio) => FileData::Wav(state.table.delete(audio)?.0),
                wit::FileData::Latent(latent) => FileData::Latent(state.table.delete(latent)?.0),
            };
            files.push(OutputFile {
                kind: output_kind(file.kind),
                filename_prefix: file.filename_prefix,
                extension: file.extension,
                content_type: file.content_type,
                data,
            });
        }
        if returned > self.limits.hostcall_bytes {
            return Ok(Err(NodeFailure::new(
                "node_output_too_large",
                format!(
                    "the node returned {returned} bytes; the limit is {} bytes",
                    self.limits.hostcall_bytes
                ),
            )));
        }
        Ok(Ok(NodeOutput { values, files }))
    }
}

fn output_kind(kind: wit::OutputKind) -> OutputKind {
    match kind {
        wit::OutputKind::Image => OutputKind::Image,
        wit::OutputKind::Video => OutputKind::Video,
        wit::OutputKind::Audio => OutputKind::Audio,
        wit::OutputKind::Text => OutputKind::Text,
        wit::OutputKind::File => OutputKind::File,
        wit::OutputKind::Latent => OutputKind::Latent,
    }
}

/// A host value as the guest sees it: literals copied, large values as new handles.
fn lower(state: &mut CallState, value: Value) -> wasmtime::Result<wit::Value> {
    let table = &mut state.table;
    Ok(match value {
        Value::Int(v) => wit::Value::Int(v),
        Value::Float(v) => wit::Value::Float(v),
        Value::Bool(v) => wit::Value::Boolean(v),
        Value::Text(v) => wit::Value::Text(v),
        Value::Json(v) => wit::Value::Json(v.to_string()),
        Value::Asset(a) => wit::Value::Asset(wit::AssetRef {
            id: a.id,
            hash: a.hash,
            file_path: a.file_path,
        }),
        Value::Image(v) => wit::Value::Image(table.push(ImageRes(v))?),
        Value::Latent(v) => wit::Value::Latent(table.push(LatentRes(v))?),
        Value::Mask(v) => wit::Value::Mask(table.push(MaskRes(v))?),
        Value::Audio(v) => wit::Value::Audio(table.push(AudioRes(v))?),
        Value::Model(v) => wit::Value::Model(table.push(ModelRes(v))?),
        Value::Clip(v) => wit::Value::Clip(table.push(ClipRes(v))?),
        Value::Vae(v) => wit::Value::Vae(table.push(VaeRes(v))?),
        Value::Conditioning(v) => wit::Value::Conditioning(table.push(ConditioningRes(v))?),
    })
}

/// A guest's returned value as a host value; handles are taken back from the table.
fn lift(state: &mut CallState, value: wit::Value) -> wasmtime::Result<Value> {
    fn take<T: 'static>(table: &mut ResourceTable, r: Resource<T>) -> wasmtime::Result<T> {
        Ok(table.delete(r)?)
    }
    let table = &mut state.table;
    Ok(match value {
        wit::Value::Int(v) => Value::Int(v),
        wit::Value::Float(v) => Value::Float(v),
        wit::Value::Boolean(v) => Value::Bool(v),
        wit::Value::Text(v) => Value::Text(v),
        wit::Value::Json(v) => {
            Value::Json(serde_json::from_str(&v).map_err(|e| wasmtime::format_err!("node returned invalid JSON: {e}"))?)
        }
        wit::Value::Asset(a) => Value::Asset(AssetRef {
            id: a.id,
            hash: a.hash,
            file_path: a.file_path,
        }),
        wit::Value::Image(r) => Value::Image(take(table, r)?.0),
        wit::Value::Latent(r) => Value::Latent(take(table, r)?.0),
        wit::Value::Mask(r) => Value::Mask(take(table, r)?.0),
        wit::Value::Audio(r) => Value::Audio(take(table, r)?.0),
        wit::Value::Model(r) => Value::Model(take(table, r)?.0),
        wit::Value::Clip(r) => Value::Clip(take(table, r)?.0),
        wit::Value::Vae(r) => Value::Vae(take(table, r)?.0),
        wit::Value::Conditioning(r) => Value::Conditioning(take(table, r)?.0),
    })
}

/// Turns a trap or host error into the failure a caller sees, naming the limit that was hit.
fn classify(error: wasmtime::Error, state: &CallState, new_log: &str) -> NodeFailure {
    let traceback = error.downcast_ref::<wasmtime::WasmBacktrace>().map(|bt| bt.to_string());
    let trap = error.downcast_ref::<Trap>().copied();
    let mut failure = if let Some(interrupt) = error.downcast_ref::<Interrupt>() {
        match interrupt {
            Interrupt::Timeout => NodeFailure::new("node_timeout", interrupt.to_string()),
            Interrupt::Canceled => NodeFailure::new("canceled", interrupt.to_string()),
        }
    } else if state.limiter.memory_hit {
        NodeFailure::new("node_memory_limit", "the node tried to grow its memory past the limit")
    } else if state.limiter.table_hit {
        NodeFailure::new("node_memory_limit", "the node tried to grow a table past the limit")
    } else if state.hostcalls.hit {
        NodeFailure::new(
            "node_hostcall_limit",
            format!(
                "the node passed more than {} bytes through host calls",
                state.hostcalls.limit
            ),
        )
    } else if trap == Some(Trap::StackOverflow) || (trap == Some(Trap::MemoryOutOfBounds) && runaway_recursion(&error))
    {
        NodeFailure::new(
            "node_stack_overflow",
            "the node overflowed its stack (too deep recursion)",
        )
    } else if let Some(panic) = panic_message(new_log) {
        NodeFailure::new("node_panic", format!("the node panicked: {panic}"))
    } else if let Some(trap) = trap {
        NodeFailure::new("node_trap", format!("the node trapped: {trap}"))
    } else {
        NodeFailure::new("node_execution_error", format!("{error:#}"))
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
