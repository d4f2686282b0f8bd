//! `weft:node@0.2.0`, through the generic lowering. Host-held types without a resource of
//! their own travel as `handle`s named by their ComfyUI type, so new types need no new
//! contract.

use wasmtime::component::ResourceTable;
use wasmtime::Store;

use super::lowering::{shared_variants, Contract, GuestFile, GuestFileData, Shared};
use crate::runtime::bindings::v0_2;
pub(crate) use crate::runtime::bindings::v0_2::wit;
use crate::runtime::capabilities::CallState;
use crate::runtime::value::{Handle, HandleRes, NodeFailure};

/// The `weft:node@0.2.0` contract.
pub(crate) struct V0_2;

impl Contract for V0_2 {
    shared_variants!(
        v0_2,
        |file: &v0_2::wit::OutputFile| file.temporary,
        v0_2::wit::FileData::AnimatedPng(apng) => GuestFileData::AnimatedPng {
            frames: apng.frames,
            frame_ms: apng.frame_ms,
            compress_level: apng.compress_level,
        },
    );

    fn upgrade(def: wit::NodeDef) -> wit::NodeDef {
        def
    }

    fn lower_handle(table: &mut ResourceTable, h: Handle) -> wasmtime::Result<Result<wit::Value, NodeFailure>> {
        Ok(Ok(wit::Value::Handle(table.push(HandleRes(h))?)))
    }

    fn lift_handle(table: &mut ResourceTable, value: wit::Value) -> wasmtime::Result<Handle> {
        match value {
            wit::Value::Handle(r) => Ok(table.delete(r)?.0),
            _ => wasmtime::bail!("a weft:node@0.2.0 value of a shared type reached the handle lifting"),
        }
    }
}
