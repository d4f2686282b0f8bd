//! Reading a ControlNet file in the layouts ComfyUI's `load_controlnet` reads: the original
//! one (`input_hint_block.*`, `zero_convs.*`, `middle_block_out.*` beside the UNet's
//! `input_blocks.*`, `middle_block.*`, `time_embed.*`, optionally under `control_model.`)
//! and diffusers' (`controlnet_cond_embedding.*`, `controlnet_down_blocks.*`,
//! `controlnet_mid_block.*`, `down_blocks.*`, ...). The layout of the copied UNet is detected
//! from the file as a UNet file's is ([`detect_unet`]). Any other file (T2I adapters,
//! control-LoRAs, union ControlNets, ControlNets of other families) is refused with what
//! was found.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use candle_core::Device;

use super::ControlNet;
use crate::models::layout::{ldm_to_candle, Component, ModelConfig, UNET_PREFIX};
use crate::models::safetensors::{CheckpointError, SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::models::separate::{detect_unet, UnetKeys};
use crate::models::storage;

/// How a ControlNet file names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlNetKeys {
    /// The original names, without a prefix (`zero_convs.0.0.weight`).
    Original,
    /// The original names under `control_model.` (the `.pth` files' layout).
    Prefixed,
    /// diffusers' names (`controlnet_down_blocks.0.weight`).
    Diffusers,
}

impl ControlNetKeys {
    /// The layout of `index`, as ComfyUI tells them apart; an error says what the file is
    /// when it is not a ControlNet weft can run.
    pub fn detect(index: &SafetensorsIndex) -> Result<ControlNetKeys, String> {
        let has = |k: &str| index.tensors.contains_key(k);
        let any = |p: &str| index.tensors.keys().any(|k| k.starts_with(p));
        if has("control_add_embedding.linear_1.bias") || has("task_embedding") {
            return Err("a union ControlNet (ControlNet++), which weft does not run yet".into());
        }
        if has("lora_controlnet") {
            return Err("a control-LoRA, which weft does not run".into());
        }
        if has("controlnet_cond_embedding.conv_in.weight") {
            return Ok(ControlNetKeys::Diffusers);
        }
        if has("control_model.zero_convs.0.0.weight") {
            if has("difference") {
                return Err("a difference ControlNet (weights relative to a model's), which weft does not run".into());
            }
            return Ok(ControlNetKeys::Prefixed);
        }
        if has("zero_convs.0.0.weight") {
            return Ok(ControlNetKeys::Original);
        }
        if any("controlnet_blocks.") || any("controlnet_x_embedder") {
            return Err(
                "a ControlNet for a transformer model (Flux, SD3, Qwen-Image, ...), which weft does not run".into(),
            );
        }
        if any("adapter.") || any("body.") || any("conv_in.") && !any("down_blocks.") {
            return Err("no ControlNet tensors (a T2I adapter or another kind of model?)".into());
        }
        Err("no ControlNet tensors (neither zero_convs.* nor controlnet_cond_embedding.*)".into())
    }

    /// The network's (diffusers') name for the file's tensor `key` in layout `cfg`, or
    /// `None` for a tensor the network does not read.
    fn network_name(self, key: &str, cfg: &ModelConfig) -> Option<String> {
        let bare = match self {
            ControlNetKeys::Diffusers => return diffusers_name(key),
            ControlNetKeys::Prefixed => key.strip_prefix("control_model.")?,
            ControlNetKeys::Original => key,
        };
        if let Some(rest) = bare.strip_prefix("input_hint_block.") {
            let (index, param) = rest.split_once('.')?;
            let index: usize = index.parse().ok()?;
            // Convolutions sit at the even indices 0..=14 (a SiLU between each two).
            if !index.is_multiple_of(2) || index > 14 {
                return None;
            }
            let conv = match index {
                0 => "conv_in".to_string(),
                14 => "conv_out".to_string(),
                n => format!("blocks.{}", n / 2 - 1),
            };
            return Some(format!("controlnet_cond_embedding.{conv}.{param}"));
        }
        if let Some(rest) = bare.strip_prefix("zero_convs.") {
            let (index, param) = rest.split_once(".0.")?;
            return Some(format!("controlnet_down_blocks.{index}.{param}"));
        }
        if let Some(param) = bare.strip_prefix("middle_block_out.0.") {
            return Some(format!("controlnet_mid_block.{param}"));
        }
        match ldm_to_candle(&format!("{UNET_PREFIX}{bare}"), cfg)? {
            (Component::Unet, name) => Some(name),
            _ => None,
        }
    }
}

/// A diffusers ControlNet tensor the network reads, under its own name.
fn diffusers_name(key: &str) -> Option<String> {
    const READ: [&str; 8] = [
        "controlnet_cond_embedding.",
        "controlnet_down_blocks.",
        "controlnet_mid_block.",
        "conv_in.",
        "time_embedding.",
        "add_embedding.",
        "down_blocks.",
        "mid_block.",
    ];
    READ.iter().any(|p| key.starts_with(p)).then(|| key.to_string())
}

/// A ControlNet loaded from a file.
pub struct ControlNetFile {
    /// The network.
    pub net: ControlNet,
    /// The layout the file was in.
    pub keys: ControlNetKeys,
    /// Whether its outputs are averaged over each plane (ComfyUI's `global_average_pooling`,
    /// which it turns on for files whose name ends `_shuffle` or `_shuffle_fp16`).
    pub global_average_pooling: bool,
    /// Bytes of weights held.
    pub bytes: u64,
}

/// Loads the ControlNet file at `path` onto `device`, in the precision the UNet gets there
/// ([`crate::device::precisions`]). Errors are [`CheckpointError`]s (a malformed file, or
/// `WrongArch` naming what the file holds) inside the `anyhow::Error`.
pub fn load(path: &Path, device: &Device) -> Result<ControlNetFile> {
    let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)?;
    let wrong = |detail: String| CheckpointError::WrongArch {
        path: path.to_path_buf(),
        detail,
    };
    let keys = ControlNetKeys::detect(&index).map_err(wrong)?;
    let cfg = detect_config(&index, keys).map_err(wrong)?;
    let hint_channels = hint_channels(&index, keys).ok_or_else(|| wrong("no hint encoder input convolution".into()))?;
    let dtype = crate::device::precisions(device).unet.dtype();
    let mut tensors = HashMap::new();
    for key in index.tensors.keys() {
        if let Some(target) = keys.network_name(key, &cfg) {
            let tensor = storage::read_tensor(&index, key, &target, device, dtype)?;
            tensors.insert(target, tensor);
        }
    }
    let bytes = tensors
        .values()
        .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
        .sum();
    let vb = storage::var_builder(tensors, dtype, device);
    let net = ControlNet::new(vb, &cfg, hint_channels)
        .map_err(|e| wrong(format!("not a complete ControlNet of the detected layout: {e}")))?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    Ok(ControlNetFile {
        net,
        keys,
        global_average_pooling: stem.ends_with("_shuffle") || stem.ends_with("_shuffle_fp16"),
        bytes,
    })
}

/// The copied UNet's layout: the file's UNet tensors looked at as a UNet file's.
fn detect_config(index: &SafetensorsIndex, keys: ControlNetKeys) -> Result<ModelConfig, String> {
    let cfg = match keys {
        ControlNetKeys::Diffusers => detect_unet(index, UnetKeys::Diffusers)?,
        ControlNetKeys::Original => detect_unet(index, UnetKeys::Bare)?,
        ControlNetKeys::Prefixed => {
            let mut bare = index.clone();
            bare.tensors = index
                .tensors
                .iter()
                .filter_map(|(k, v)| Some((k.strip_prefix("control_model.")?.to_string(), v.clone())))
                .collect();
            detect_unet(&bare, UnetKeys::Bare)?
        }
    };
    if cfg.family == crate::models::layout::Family::Sd2 {
        return Err("a Stable Diffusion 2.x ControlNet, which weft does not run".into());
    }
    Ok(cfg)
}

/// Channels of the control image: the hint encoder's first convolution's input width.
fn hint_channels(index: &SafetensorsIndex, keys: ControlNetKeys) -> Option<usize> {
    let name = match keys {
        ControlNetKeys::Diffusers => "controlnet_cond_embedding.conv_in.weight",
        ControlNetKeys::Prefixed => "control_model.input_hint_block.0.weight",
        ControlNetKeys::Original => "input_hint_block.0.weight",
    };
    index.tensors.get(name)?.shape.get(1).copied()
}

/// The file's name for every network tensor, for writing a ControlNet in `keys`' layout
/// from its original (unprefixed) names: used by tests and fixtures to write both layouts.
pub fn rename_original(key: &str, keys: ControlNetKeys, cfg: &ModelConfig) -> Option<String> {
    match keys {
        ControlNetKeys::Original => Some(key.to_string()),
        ControlNetKeys::Prefixed => Some(format!("control_model.{key}")),
        ControlNetKeys::Diffusers => ControlNetKeys::Original.network_name(key, cfg),
    }
}
