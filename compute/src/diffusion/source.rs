//! Where the networks behind a `MODEL` or `CLIP` handle were read from, to read them again
//! when LoRAs are applied: a checkpoint, or a network's own files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::lora::load_component;
use crate::models::layout::{Component, ModelConfig};
use crate::models::safetensors::{SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::models::separate::{clip_tensors, unet_tensors, UnetKeys};

/// Where a network's weights are read from again, to rebuild it with LoRAs.
#[derive(Debug, Clone)]
pub enum Source {
    /// A single-file checkpoint.
    Checkpoint(PathBuf),
    /// A UNet file, its keys in the given style.
    Unet(PathBuf, UnetKeys),
    /// Text-encoder files, one `(path, key prefix)` per encoder of the layout's `text`.
    Text(Vec<(PathBuf, String)>),
}

impl Source {
    /// The float32 tensors of network `component` of layout `cfg`, under the names weft's
    /// networks read, on `device`.
    pub fn load_component(
        &self,
        cfg: &ModelConfig,
        component: Component,
        device: &Device,
    ) -> anyhow::Result<HashMap<String, Tensor>> {
        let open = |path: &Path| SafetensorsIndex::open(path, DEFAULT_MAX_HEADER);
        match (self, component) {
            (Source::Checkpoint(path), _) => load_component(path, cfg, component, device),
            (Source::Unet(path, keys), Component::Unet) => unet_tensors(&open(path)?, cfg, *keys, device, DType::F32),
            (Source::Text(files), Component::Clip(i)) => {
                let ((path, prefix), clip) = files
                    .get(i)
                    .zip(cfg.text.get(i))
                    .ok_or_else(|| anyhow::anyhow!("no text encoder {i} in these files"))?;
                clip_tensors(&open(path)?, prefix, clip, device, DType::F32)
            }
            (_, component) => anyhow::bail!("these files hold no {component:?}"),
        }
    }
}
