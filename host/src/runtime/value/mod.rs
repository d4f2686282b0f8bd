//! Values flowing between nodes on the host side, the resource wrappers a guest holds
//! handles to, and what a node call gives back: its [`NodeOutput`] or its [`NodeFailure`].
//! Large values are `Arc`s: passing one from node to node never copies it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use weft_types as types;

use weft_compute::image::{ImageBatch, MaskBatch};
use weft_compute::values::{AudioClip, LatentBatch, Opaque};

use super::memory::{Charge, Held};

mod failure;
mod output;

pub use failure::NodeFailure;
pub use output::{FileData, NodeOutput, OutputFile, OutputKind};

/// A `core/ASSET` reference from a workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssetRef {
    /// Asset UUID.
    pub id: String,
    /// `blake3:<hex>`, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// File path, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_path: Option<String>,
}

/// One value produced by a node or given as a literal.
#[derive(Debug, Clone)]
pub enum Value {
    /// `INT`.
    Int(i64),
    /// `FLOAT`.
    Float(f64),
    /// `BOOLEAN`.
    Bool(bool),
    /// `STRING` or a combo choice.
    Text(String),
    /// Any other JSON literal.
    Json(serde_json::Value),
    /// A `core/ASSET` reference.
    Asset(AssetRef),
    /// `IMAGE`.
    Image(Arc<Held<ImageBatch>>),
    /// `LATENT`.
    Latent(Arc<Held<LatentBatch>>),
    /// `MASK`.
    Mask(Arc<Held<MaskBatch>>),
    /// `AUDIO`.
    Audio(Arc<Held<AudioClip>>),
    /// Any other host-held type, by name: `MODEL`, `CLIP`, `VAE`, `CONDITIONING`, ...
    Handle(Handle),
}

/// A host-held value of a type with no resource of its own in the contract (`MODEL`,
/// `CLIP`, `VAE`, `CONDITIONING`, and any type ComfyUI adds): its ComfyUI type name and its
/// payload. Cloning shares the payload.
#[derive(Debug, Clone)]
pub struct Handle {
    /// ComfyUI type name, for example `MODEL`.
    pub type_name: Arc<str>,
    /// What the host keeps for it, with the job memory it is charged (models, which live
    /// in the model cache, are charged nothing).
    pub object: Arc<Held<Opaque>>,
}

impl Handle {
    /// A handle of type `type_name` holding `object`, paid for by `charge`.
    pub fn new(type_name: &str, object: Opaque, charge: Charge) -> Self {
        Handle {
            type_name: type_name.into(),
            object: Arc::new(Held::new(object, charge)),
        }
    }
}

impl Value {
    /// The ComfyUI type name of this value.
    pub fn type_name(&self) -> &str {
        match self {
            Value::Int(_) => types::INT,
            Value::Float(_) => types::FLOAT,
            Value::Bool(_) => types::BOOLEAN,
            Value::Text(_) => types::STRING,
            Value::Json(_) => types::JSON,
            Value::Asset(_) => types::ASSET,
            Value::Image(_) => types::IMAGE,
            Value::Latent(_) => types::LATENT,
            Value::Mask(_) => types::MASK,
            Value::Audio(_) => types::AUDIO,
            Value::Handle(h) => &h.type_name,
        }
    }

    /// A stable fingerprint of this value for cache keys: literals by content, host-held
    /// values by identity (they are only ever produced by nodes that have their own keys).
    pub fn fingerprint(&self, hasher: &mut blake3::Hasher) {
        hasher.update(self.type_name().as_bytes());
        match self {
            Value::Int(v) => hasher.update(&v.to_le_bytes()),
            Value::Float(v) => hasher.update(&v.to_bits().to_le_bytes()),
            Value::Bool(v) => hasher.update(&[*v as u8]),
            Value::Text(v) => hasher.update(v.as_bytes()),
            Value::Json(v) => hasher.update(v.to_string().as_bytes()),
            Value::Asset(a) => hasher.update(a.id.as_bytes()),
            Value::Image(v) => hasher.update(&(Arc::as_ptr(v) as usize).to_le_bytes()),
            Value::Latent(v) => hasher.update(&(Arc::as_ptr(v) as usize).to_le_bytes()),
            Value::Mask(v) => hasher.update(&(Arc::as_ptr(v) as usize).to_le_bytes()),
            Value::Audio(v) => hasher.update(&(Arc::as_ptr(v) as usize).to_le_bytes()),
            Value::Handle(h) => hasher.update(&(Arc::as_ptr(&h.object) as usize).to_le_bytes()),
        };
    }

    /// Bytes this value costs to copy into or out of a guest (handles cost nothing).
    pub fn copy_cost(&self) -> usize {
        match self {
            Value::Text(s) => s.len(),
            Value::Json(v) => v.to_string().len(),
            Value::Asset(a) => {
                a.id.len() + a.hash.as_ref().map_or(0, String::len) + a.file_path.as_ref().map_or(0, String::len)
            }
            _ => 8,
        }
    }

    /// The value as JSON, for text outputs and previews; host-held values become a summary.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Value::Int(v) => json!(v),
            Value::Float(v) => json!(v),
            Value::Bool(v) => json!(v),
            Value::Text(v) => json!(v),
            Value::Json(v) => v.clone(),
            Value::Asset(a) => json!({"__type": types::ASSET, "info": a}),
            other => json!({"type": other.type_name()}),
        }
    }
}

/// Host side of the `image` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct ImageRes(pub Arc<Held<ImageBatch>>);
/// Host side of the `latent` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct LatentRes(pub Arc<Held<LatentBatch>>);
/// Host side of the `mask` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct MaskRes(pub Arc<Held<MaskBatch>>);
/// Host side of the `audio` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct AudioRes(pub Arc<Held<AudioClip>>);
/// Host side of the `model` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct ModelRes(pub Arc<Held<Opaque>>);
/// Host side of the `clip` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct ClipRes(pub Arc<Held<Opaque>>);
/// Host side of the `vae` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct VaeRes(pub Arc<Held<Opaque>>);
/// Host side of the `conditioning` resource.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct ConditioningRes(pub Arc<Held<Opaque>>);
/// Host side of the `handle` resource (`weft:node@0.2.0` on).
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named in `bindgen!`, whose generated modules re-export it
pub struct HandleRes(pub Handle);
