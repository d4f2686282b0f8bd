//! Host values into a contract version's WIT values and back, once for every version. What
//! the versions share (literals, assets, images, latents, masks, audio, output files) goes
//! through [`Shared`] and [`GuestFile`]; a version says only how its other host-held values
//! travel ([`Contract::lower_handle`], [`Contract::lift_handle`]) and how its plugin is
//! called.

use wasmtime::component::{Resource, ResourceTable};
use wasmtime::Store;

use crate::runtime::bindings::v0_2;
use crate::runtime::capabilities::CallState;
use crate::runtime::catalog::NodeDef;
use crate::runtime::value::{
    AssetRef, AudioRes, FileData, Handle, ImageRes, LatentRes, MaskRes, NodeFailure, NodeOutput, OutputFile,
    OutputKind, Value,
};

/// A value every contract version carries the same way.
pub(crate) enum Shared {
    Int(i64),
    Float(f64),
    Boolean(bool),
    Text(String),
    Json(String),
    Asset(AssetRef),
    Image(Resource<ImageRes>),
    Latent(Resource<LatentRes>),
    Mask(Resource<MaskRes>),
    Audio(Resource<AudioRes>),
}

/// An output file as every contract version returns it.
pub(crate) struct GuestFile {
    pub(crate) kind: OutputKind,
    pub(crate) filename_prefix: String,
    pub(crate) extension: String,
    pub(crate) content_type: String,
    pub(crate) data: GuestFileData,
    /// A preview, dropped after the preview retention (versions before 0.2.0: never).
    pub(crate) temporary: bool,
}

/// The content of a [`GuestFile`]: bytes the guest made, or a handle for the host to encode.
pub(crate) enum GuestFileData {
    Bytes(Vec<u8>),
    Png(Resource<ImageRes>),
    Wav(Resource<AudioRes>),
    Latent(Resource<LatentRes>),
    /// The frames of an animated PNG, with how long each shows and the zlib level.
    AnimatedPng {
        frames: Resource<ImageRes>,
        frame_ms: u32,
        compress_level: u8,
    },
}

/// One contract version's WIT types and calls, as the generic lowering sees them.
pub(crate) trait Contract {
    /// The pre-linked `plugin` world.
    type Pre;
    /// An instance of it.
    type Instance;
    /// The version's `value`.
    type Value;
    /// The version's `node-result`.
    type NodeResult;
    /// The version's `node-def`.
    type NodeDef;

    /// `value` as a [`Shared`] one, or back as it is when it is one of the version's own.
    fn shared(value: Self::Value) -> Result<Shared, Self::Value>;
    /// The version's value for `shared`.
    fn from_shared(shared: Shared) -> Self::Value;
    /// The result's values and files.
    fn into_parts(result: Self::NodeResult) -> (Vec<Self::Value>, Vec<GuestFile>);
    /// `handle` as the version carries it, pushed into `table`; a node failure when the
    /// version cannot carry its type.
    fn lower_handle(table: &mut ResourceTable, handle: Handle) -> wasmtime::Result<Result<Self::Value, NodeFailure>>;
    /// One of the version's own values (not a [`Shared`] one), taken back from `table`.
    fn lift_handle(table: &mut ResourceTable, value: Self::Value) -> wasmtime::Result<Handle>;
    /// `def` in the newest version's shape, which the catalogue reads.
    fn upgrade(def: Self::NodeDef) -> v0_2::wit::NodeDef;
    /// Instantiates the plugin in `store`.
    fn instantiate(pre: &Self::Pre, store: &mut Store<CallState>) -> wasmtime::Result<Self::Instance>;
    /// Calls the instance's `describe`.
    fn call_describe(instance: &Self::Instance, store: &mut Store<CallState>) -> wasmtime::Result<Vec<Self::NodeDef>>;
    /// Calls the instance's `execute`; `Ok(Err((code, message)))` is the guest's node error.
    fn call_execute(
        instance: &Self::Instance,
        store: &mut Store<CallState>,
        class: &str,
        inputs: Vec<(String, Self::Value)>,
    ) -> wasmtime::Result<Result<Self::NodeResult, (String, String)>>;
}

/// Instantiates the plugin in `store` and calls its `describe()`: `plugin`'s node classes.
pub(crate) fn describe<C: Contract>(
    pre: &C::Pre,
    store: &mut Store<CallState>,
    plugin: &str,
) -> wasmtime::Result<Vec<NodeDef>> {
    let instance = C::instantiate(pre, store)?;
    let defs = C::call_describe(&instance, store)?;
    defs.into_iter()
        .map(|d| NodeDef::from_wit(C::upgrade(d), plugin).map_err(wasmtime::Error::msg))
        .collect()
}

/// Instantiates the plugin in `store` and runs node `class` on `inputs`. `Err` is a trap or
/// host error (the caller classifies it); `Ok(Err)` a failure already named.
pub(crate) fn execute<C: Contract>(
    pre: &C::Pre,
    store: &mut Store<CallState>,
    class: &str,
    inputs: Vec<(String, Value)>,
    returned_limit: usize,
) -> wasmtime::Result<Result<NodeOutput, NodeFailure>> {
    let instance = C::instantiate(pre, store)?;
    let mut cost = class.len();
    let mut lowered = Vec::with_capacity(inputs.len());
    for (name, value) in inputs {
        cost += name.len() + value.copy_cost();
        match lower::<C>(&mut store.data_mut().core.table, value)? {
            Ok(value) => lowered.push((name, value)),
            Err(failure) => return Ok(Err(failure)),
        }
    }
    store.data_mut().core.hostcalls.charge(cost)?;
    let result = match C::call_execute(&instance, store, class, lowered)? {
        Ok(result) => result,
        Err((code, message)) => return Ok(Err(NodeFailure::from_guest(code, message))),
    };
    lift_result::<C>(&mut store.data_mut().core.table, result, returned_limit)
}

/// A guest's `node-result` as a host [`NodeOutput`]: values lifted, file handles taken back
/// from `table`, and everything the guest had copied out counted against `returned_limit`.
/// Forged or stale handles are errors, never panics.
pub(crate) fn lift_result<C: Contract>(
    table: &mut ResourceTable,
    result: C::NodeResult,
    returned_limit: usize,
) -> wasmtime::Result<Result<NodeOutput, NodeFailure>> {
    let (outputs, guest_files) = C::into_parts(result);
    let mut values = Vec::with_capacity(outputs.len());
    let mut returned = 0usize;
    for value in outputs {
        let value = lift::<C>(table, value)?;
        returned += value.copy_cost();
        values.push(value);
    }
    let mut files = Vec::with_capacity(guest_files.len());
    for file in guest_files {
        returned += file.filename_prefix.len() + file.extension.len() + file.content_type.len();
        let data = match file.data {
            GuestFileData::Bytes(bytes) => {
                returned += bytes.len();
                FileData::Bytes(bytes)
            }
            GuestFileData::Png(image) => FileData::Png(table.delete(image)?.0),
            GuestFileData::Wav(audio) => FileData::Wav(table.delete(audio)?.0),
            GuestFileData::Latent(latent) => FileData::Latent(table.delete(latent)?.0),
            GuestFileData::AnimatedPng {
                frames,
                frame_ms,
                compress_level,
            } => FileData::AnimatedPng {
                frames: table.delete(frames)?.0,
                frame_ms,
                compress_level,
            },
        };
        files.push(OutputFile {
            kind: file.kind,
            filename_prefix: file.filename_prefix,
            extension: file.extension,
            content_type: file.content_type,
            data,
            temporary: file.temporary,
        });
    }
    if returned > returned_limit {
        return Ok(Err(NodeFailure::output_too_large(returned, returned_limit)));
    }
    Ok(Ok(NodeOutput { values, files }))
}

/// A host value as the guest sees it: literals copied, large values as new handles in
/// `table`. A host-held type the version has no way to carry is a node failure.
pub(crate) fn lower<C: Contract>(
    table: &mut ResourceTable,
    value: Value,
) -> wasmtime::Result<Result<C::Value, NodeFailure>> {
    let shared = match value {
        Value::Int(v) => Shared::Int(v),
        Value::Float(v) => Shared::Float(v),
        Value::Bool(v) => Shared::Boolean(v),
        Value::Text(v) => Shared::Text(v),
        Value::Json(v) => Shared::Json(v.to_string()),
        Value::Asset(a) => Shared::Asset(a),
        Value::Image(v) => Shared::Image(table.push(ImageRes(v))?),
        Value::Latent(v) => Shared::Latent(table.push(LatentRes(v))?),
        Value::Mask(v) => Shared::Mask(table.push(MaskRes(v))?),
        Value::Audio(v) => Shared::Audio(table.push(AudioRes(v))?),
        Value::Handle(h) => return C::lower_handle(table, h),
    };
    Ok(Ok(C::from_shared(shared)))
}

/// A guest's returned value as a host value; handles are taken back from `table`.
fn lift<C: Contract>(table: &mut ResourceTable, value: C::Value) -> wasmtime::Result<Value> {
    let shared = match C::shared(value) {
        Ok(shared) => shared,
        Err(own) => return Ok(Value::Handle(C::lift_handle(table, own)?)),
    };
    Ok(match shared {
        Shared::Int(v) => Value::Int(v),
        Shared::Float(v) => Value::Float(v),
        Shared::Boolean(v) => Value::Bool(v),
        Shared::Text(v) => Value::Text(v),
        Shared::Json(v) => {
            Value::Json(serde_json::from_str(&v).map_err(|e| wasmtime::format_err!("node returned invalid JSON: {e}"))?)
        }
        Shared::Asset(a) => Value::Asset(a),
        Shared::Image(r) => Value::Image(table.delete(r)?.0),
        Shared::Latent(r) => Value::Latent(table.delete(r)?.0),
        Shared::Mask(r) => Value::Mask(table.delete(r)?.0),
        Shared::Audio(r) => Value::Audio(table.delete(r)?.0),
    })
}

/// The [`Contract`] items that only rename, for the generated bindings module `$b`: its
/// types and calls, and [`Shared`] values, output kinds and files to and from its WIT types,
/// which every version spells the same. `$temporary` reads an output file's `temporary` flag
/// (a version without one passes `|_| false`); the match arms after it convert the file data
/// variants that only some versions have.
macro_rules! shared_variants {
    ($b:ident, $temporary:expr $(, $($data_arm:tt)*)?) => {
        type Pre = $b::PluginPre<CallState>;
        type Instance = $b::Plugin;
        type Value = $b::wit::Value;
        type NodeResult = $b::wit::NodeResult;
        type NodeDef = $b::wit::NodeDef;

        fn instantiate(pre: &Self::Pre, store: &mut Store<CallState>) -> wasmtime::Result<$b::Plugin> {
            pre.instantiate(store)
        }

        fn call_describe(
            instance: &$b::Plugin,
            store: &mut Store<CallState>,
        ) -> wasmtime::Result<Vec<$b::wit::NodeDef>> {
            instance.call_describe(store)
        }

        fn call_execute(
            instance: &$b::Plugin,
            store: &mut Store<CallState>,
            class: &str,
            inputs: Vec<(String, $b::wit::Value)>,
        ) -> wasmtime::Result<Result<$b::wit::NodeResult, (String, String)>> {
            let inputs: Vec<_> = inputs
                .into_iter()
                .map(|(name, value)| $b::wit::NamedValue { name, value })
                .collect();
            Ok(instance
                .call_execute(store, class, &inputs)?
                .map_err(|e| (e.code, e.message)))
        }

        fn shared(value: $b::wit::Value) -> Result<Shared, $b::wit::Value> {
            Ok(match value {
                $b::wit::Value::Int(v) => Shared::Int(v),
                $b::wit::Value::Float(v) => Shared::Float(v),
                $b::wit::Value::Boolean(v) => Shared::Boolean(v),
                $b::wit::Value::Text(v) => Shared::Text(v),
                $b::wit::Value::Json(v) => Shared::Json(v),
                $b::wit::Value::Asset(a) => Shared::Asset(crate::runtime::value::AssetRef {
                    id: a.id,
                    hash: a.hash,
                    file_path: a.file_path,
                }),
                $b::wit::Value::Image(r) => Shared::Image(r),
                $b::wit::Value::Latent(r) => Shared::Latent(r),
                $b::wit::Value::Mask(r) => Shared::Mask(r),
                $b::wit::Value::Audio(r) => Shared::Audio(r),
                own => return Err(own),
            })
        }

        fn from_shared(shared: Shared) -> $b::wit::Value {
            match shared {
                Shared::Int(v) => $b::wit::Value::Int(v),
                Shared::Float(v) => $b::wit::Value::Float(v),
                Shared::Boolean(v) => $b::wit::Value::Boolean(v),
                Shared::Text(v) => $b::wit::Value::Text(v),
                Shared::Json(v) => $b::wit::Value::Json(v),
                Shared::Asset(a) => $b::wit::Value::Asset($b::wit::AssetRef {
                    id: a.id,
                    hash: a.hash,
                    file_path: a.file_path,
                }),
                Shared::Image(r) => $b::wit::Value::Image(r),
                Shared::Latent(r) => $b::wit::Value::Latent(r),
                Shared::Mask(r) => $b::wit::Value::Mask(r),
                Shared::Audio(r) => $b::wit::Value::Audio(r),
            }
        }

        fn into_parts(result: $b::wit::NodeResult) -> (Vec<$b::wit::Value>, Vec<GuestFile>) {
            use crate::runtime::value::OutputKind;
            let files = result
                .files
                .into_iter()
                .map(|file| GuestFile {
                    temporary: ($temporary)(&file),
                    kind: match file.kind {
                        $b::wit::OutputKind::Image => OutputKind::Image,
                        $b::wit::OutputKind::Video => OutputKind::Video,
                        $b::wit::OutputKind::Audio => OutputKind::Audio,
                        $b::wit::OutputKind::Text => OutputKind::Text,
                        $b::wit::OutputKind::File => OutputKind::File,
                        $b::wit::OutputKind::Latent => OutputKind::Latent,
                    },
                    filename_prefix: file.filename_prefix,
                    extension: file.extension,
                    content_type: file.content_type,
                    data: match file.data {
                        $b::wit::FileData::Bytes(bytes) => GuestFileData::Bytes(bytes),
                        $b::wit::FileData::Png(image) => GuestFileData::Png(image),
                        $b::wit::FileData::Wav(audio) => GuestFileData::Wav(audio),
                        $b::wit::FileData::Latent(latent) => GuestFileData::Latent(latent),
                        $($($data_arm)*)?
                    },
                })
                .collect();
            (result.outputs, files)
        }
    };
}

pub(crate) use shared_variants;
