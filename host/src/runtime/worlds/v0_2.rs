//! `weft:node@0.2.0`: host bindings generated from `wit/weft-node-0.2.0`, and the lowering of
//! host values into its `value` variant and back. Host-held types without a resource of
//! their own travel as `handle`s named by their ComfyUI type, so new types need no new
//! contract.

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::Store;

use super::super::capabilities::CallState;
use super::super::catalog::NodeDef as HostNodeDef;
use super::super::invoke::{NodeFailure, NodeOutput};
use super::super::value::*;

wasmtime::component::bindgen!({
    path: "../wit/weft-node-0.2.0",
    world: "plugin",
    with: {
        "weft:node/types.image": crate::runtime::value::ImageRes,
        "weft:node/types.latent": crate::runtime::value::LatentRes,
        "weft:node/types.mask": crate::runtime::value::MaskRes,
        "weft:node/types.audio": crate::runtime::value::AudioRes,
        "weft:node/types.handle": crate::runtime::value::HandleRes,
    },
    imports: { default: trappable },
});

pub(crate) use weft::node::types as wit;

/// Calls the plugin's `describe()`.
pub(crate) fn describe(
    pre: &PluginPre<CallState>,
    store: &mut Store<CallState>,
    plugin: &str,
) -> wasmtime::Result<Vec<HostNodeDef>> {
    let instance = pre.instantiate(&mut *store)?;
    let defs = instance.call_describe(&mut *store)?;
    defs.into_iter()
        .map(|d| HostNodeDef::from_wit(d, plugin).map_err(wasmtime::Error::msg))
        .collect()
}

/// Runs node `class` on `inputs`.
pub(crate) fn execute(
    pre: &PluginPre<CallState>,
    store: &mut Store<CallState>,
    class: &str,
    inputs: Vec<(String, Value)>,
    returned_limit: usize,
) -> wasmtime::Result<Result<NodeOutput, NodeFailure>> {
    let instance = pre.instantiate(&mut *store)?;
    let mut cost = class.len();
    let mut lowered = Vec::with_capacity(inputs.len());
    for (name, value) in inputs {
        cost += name.len() + value.copy_cost();
        let value = lower(&mut store.data_mut().table, value)?;
        lowered.push(wit::NamedValue { name, value });
    }
    store.data_mut().hostcalls.charge(cost)?;
    let result = match instance.call_execute(&mut *store, class, &lowered)? {
        Ok(result) => result,
        Err(e) => return Ok(Err(super::guest_error(e.code, e.message))),
    };
    lift_result(&mut store.data_mut().table, result, returned_limit)
}

/// A guest's `node-result` as a host [`NodeOutput`]: values lifted, file handles taken back
/// from `table`, and everything the guest had copied out counted against `returned_limit`.
/// Forged or stale handles are errors, never panics.
pub(crate) fn lift_result(
    table: &mut ResourceTable,
    result: wit::NodeResult,
    returned_limit: usize,
) -> wasmtime::Result<Result<NodeOutput, NodeFailure>> {
    let mut values = Vec::with_capacity(result.outputs.len());
    let mut returned = 0usize;
    for value in result.outputs {
        let value = lift(table, value)?;
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
            wit::FileData::Png(image) => FileData::Png(table.delete(image)?.0),
            wit::FileData::Wav(audio) => FileData::Wav(table.delete(audio)?.0),
            wit::FileData::Latent(latent) => FileData::Latent(table.delete(latent)?.0),
        };
        files.push(OutputFile {
            kind: output_kind(file.kind),
            filename_prefix: file.filename_prefix,
            extension: file.extension,
            content_type: file.content_type,
            data,
        });
    }
    if returned > returned_limit {
        return Ok(Err(super::too_large(returned, returned_limit)));
    }
    Ok(Ok(NodeOutput { values, files }))
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
pub(crate) fn lower(table: &mut ResourceTable, value: Value) -> wasmtime::Result<wit::Value> {
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
        Value::Handle(h) => wit::Value::Handle(table.push(HandleRes(h))?),
    })
}

/// A guest's returned value as a host value; handles are taken back from the table.
fn lift(table: &mut ResourceTable, value: wit::Value) -> wasmtime::Result<Value> {
    fn take<T: 'static>(table: &mut ResourceTable, r: Resource<T>) -> wasmtime::Result<T> {
        Ok(table.delete(r)?)
    }
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
        wit::Value::Handle(r) => Value::Handle(take(table, r)?.0),
    })
}

/// A 0.2.0 asset reference as the 0.1.0 implementations take it.
pub(crate) fn asset_to_v0_1(a: wit::AssetRef) -> crate::runtime::bindings::wit::AssetRef {
    crate::runtime::bindings::wit::AssetRef {
        id: a.id,
        hash: a.hash,
        file_path: a.file_path,
    }
}

/// A 0.1.0 implementation's node error as 0.2.0 returns it.
pub(crate) fn error_from_v0_1(e: crate::runtime::bindings::wit::NodeError) -> wit::NodeError {
    wit::NodeError {
        code: e.code,
        message: e.message,
    }
}
