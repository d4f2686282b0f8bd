//! `weft:node@0.1.0`: the frozen first contract, through the generic lowering. Of the
//! host-held types without a resource of their own, it knows `MODEL`, `CLIP`, `VAE` and
//! `CONDITIONING`; a value of any other type cannot be passed to its plugins.

use std::sync::Arc;

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::Store;
use weft_compute::values::Opaque;
use weft_types::NodeErrorCode;

use super::lowering::{shared_variants, Contract, GuestFile, GuestFileData, Shared};
use crate::runtime::bindings::v0_1::{self, wit};
use crate::runtime::bindings::v0_2::wit as next;
use crate::runtime::capabilities::CallState;
use crate::runtime::memory::Held;
use crate::runtime::value::{ClipRes, ConditioningRes, Handle, ModelRes, NodeFailure, VaeRes};

/// The `weft:node@0.1.0` contract.
pub(crate) struct V0_1;

impl Contract for V0_1 {
    shared_variants!(v0_1, |_: &v0_1::wit::OutputFile| false);

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

    fn lower_handle(table: &mut ResourceTable, h: Handle) -> wasmtime::Result<Result<wit::Value, NodeFailure>> {
        Ok(Ok(match &*h.type_name {
            "MODEL" => wit::Value::Model(table.push(ModelRes(h.object))?),
            "CLIP" => wit::Value::Clip(table.push(ClipRes(h.object))?),
            "VAE" => wit::Value::Vae(table.push(VaeRes(h.object))?),
            "CONDITIONING" => wit::Value::Conditioning(table.push(ConditioningRes(h.object))?),
            other => {
                return Ok(Err(NodeFailure::new(
                    NodeErrorCode::NodeExecutionError,
                    format!("this node's plugin targets weft:node@0.1.0, which cannot receive {other} values"),
                )))
            }
        }))
    }

    fn lift_handle(table: &mut ResourceTable, value: wit::Value) -> wasmtime::Result<Handle> {
        fn handle(type_name: &str, object: Arc<Held<Opaque>>) -> Handle {
            Handle {
                type_name: type_name.into(),
                object,
            }
        }
        fn take<T: 'static>(table: &mut ResourceTable, r: Resource<T>) -> wasmtime::Result<T> {
            Ok(table.delete(r)?)
        }
        Ok(match value {
            wit::Value::Model(r) => handle("MODEL", take(table, r)?.0),
            wit::Value::Clip(r) => handle("CLIP", take(table, r)?.0),
            wit::Value::Vae(r) => handle("VAE", take(table, r)?.0),
            wit::Value::Conditioning(r) => handle("CONDITIONING", take(table, r)?.0),
            _ => wasmtime::bail!("a weft:node@0.1.0 value of a shared type reached the handle lifting"),
        })
    }
}
