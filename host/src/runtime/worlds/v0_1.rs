//! `weft:node@0.1.0`: the frozen first contract. Its bindings are [`crate::runtime::bindings`];
//! here host values are lowered into its `value` variant and its results lifted back. Of
//! the host-held types without a resource of their own, it knows `MODEL`, `CLIP`, `VAE`
//! and `CONDITIONING`; a value of any other type cannot be passed to its plugins.

use std::sync::Arc;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::Store;

use super::super::bindings::{wit, PluginPre};
use super::super::capabilities::CallState;
use super::super::catalog::NodeDef;
use super::super::invoke::{NodeFailure, NodeOutput};
use super::super::value::*;
use super::v0_2::wit as next;

/// Calls the plugin's `describe()`.
pub(crate) fn describe(
    pre: &PluginPre<CallState>,
    store: &mut Store<CallState>,
    plugin: &str,
) -> wasmtime::Result<Vec<NodeDef>> {
    let instance = pre.instantiate(&mut *store)?;
    let defs = instance.call_describe(&mut *store)?;
    defs.into_iter()
        .map(|d| NodeDef::from_wit(upgrade(d), plugin).map_err(wasmtime::Error::msg))
        .collect()
}

/// A 0.1.0 node definition in 0.2.0's shape (which only adds fields).
fn upgrade(def: wit::NodeDef) -> next::NodeDef {
    next::NodeDef {
        class_type: def.class_type,
        display_name: def.display_name,
        category: def.category,
        description: def.description,
        inputs: def
            .inputs
            .into_iter()
            .map(|i| next::InputSpec {
                name: i.name,
                type_name: i.type_name,
                required: i.required,
                default: i.default,
                min: i.min,
                max: i.max,
                step: i.step,
                options: i.options,
                multiline: i.multiline,
                tooltip: i.tooltip,
                model_folder: None,
            })
            .collect(),
        outputs: def
            .outputs
            .into_iter()
            .map(|o| next::OutputSpec {
                type_name: o.type_name,
                name: o.name,
                is_list: o.is_list,
                tooltip: o.tooltip,
            })
            .collect(),
        output_node: def.output_node,
        deterministic: def.deterministic,
    }
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
        let value = match lower(store.data_mut(), value)? {
            Ok(value) => value,
            Err(failure) => return Ok(Err(failure)),
        };
        lowered.push(wit::NamedValue { name, value });
    }
    store.data_mut().hostcalls.charge(cost)?;
    let result = match instance.call_execute(&mut *store, class, &lowered)? {
        Ok(result) => result,
        Err(e) => return Ok(Err(super::guest_error(e.code, e.message))),
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

/// A host value as the guest sees it: literals copied, large values as new handles. A
/// host-held type this contract has no resource for is a node failure.
fn lower(state: &mut CallState, value: Value) -> wasmtime::Result<Result<wit::Value, NodeFailure>> {
    let table = &mut state.table;
    Ok(Ok(match value {
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
        Value::Handle(h) => match &*h.type_name {
            "MODEL" => wit::Value::Model(table.push(ModelRes(h.object))?),
            "CLIP" => wit::Value::Clip(table.push(ClipRes(h.object))?),
            "VAE" => wit::Value::Vae(table.push(VaeRes(h.object))?),
            "CONDITIONING" => wit::Value::Conditioning(table.push(ConditioningRes(h.object))?),
            other => {
                return Ok(Err(NodeFailure::new(
                    "node_execution_error",
                    format!("this node's plugin targets weft:node@0.1.0, which cannot receive {other} values"),
                )))
            }
        },
    }))
}

/// A guest's returned value as a host value; handles are taken back from the table.
fn lift(state: &mut CallState, value: wit::Value) -> wasmtime::Result<Value> {
    fn take<T: 'static>(table: &mut ResourceTable, r: Resource<T>) -> wasmtime::Result<T> {
        Ok(table.delete(r)?)
    }
    fn handle(type_name: &str, object: Arc<crate::runtime::memory::Held<weft_compute::values::Opaque>>) -> Value {
        Value::Handle(Handle {
            type_name: type_name.into(),
            object,
        })
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
        wit::Value::Model(r) => handle("MODEL", take(table, r)?.0),
        wit::Value::Clip(r) => handle("CLIP", take(table, r)?.0),
        wit::Value::Vae(r) => handle("VAE", take(table, r)?.0),
        wit::Value::Conditioning(r) => handle("CONDITIONING", take(table, r)?.0),
    })
}
