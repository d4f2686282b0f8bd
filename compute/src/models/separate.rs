//! Networks kept in files of their own, as ComfyUI's `UNETLoader`, `CLIPLoader` and
//! `DualCLIPLoader` read them: a UNet alone (ComfyUI's layout without a prefix, with the
//! checkpoint's `model.diffusion_model.` prefix, or diffusers' names), and CLIP text encoders
//! in Hugging Face transformers' `CLIPTextModel` layout (optionally under `clip_l.` /
//! `clip_g.`). Every tensor is given the name and shape it has when the network is loaded
//! from a checkpoint, so a network loaded here computes exactly as the checkpoint's; bigG's
//! separate q, k, v become OpenCLIP's stacked `in_proj` and its `[out, in]`
//! `text_projection.weight` becomes OpenCLIP's `[in, out]` matrix.
//!
//! [`write_split`] writes a checkpoint's networks in these layouts (for tests and
//! `weft models split`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use candle_core::{DType, Device, Tensor};

use super::layout::{
    clip_layout, count_depths_by, ldm_to_candle, unet_layout, vae_layout, Block, ClipConfig, ClipNames, ModelConfig,
    UNET_PREFIX, VAE_PREFIX,
};
use super::safetensors::{write_f32_safetensors, Dtype, SafetensorsIndex};
use super::storage::read_tensor;

/// How a UNet file names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnetKeys {
    /// ComfyUI's (LDM) names without a prefix: `input_blocks.0.0.weight`.
    Bare,
    /// The checkpoint's names: `model.diffusion_model.input_blocks.0.0.weight`.
    Prefixed,
    /// diffusers' names: `conv_in.weight`, `down_blocks.0.resnets.0.conv1.weight`.
    Diffusers,
}

impl UnetKeys {
    /// The key style of the UNet file `index`, or `None` when it has no UNet tensors.
    pub fn detect(index: &SafetensorsIndex) -> Option<UnetKeys> {
        let has = |p: &str| index.tensors.keys().any(|k| k.starts_with(p));
        if has(UNET_PREFIX) {
            Some(UnetKeys::Prefixed)
        } else if has("input_blocks.") && has("time_embed.") {
            Some(UnetKeys::Bare)
        } else if has("down_blocks.") && has("time_embedding.") {
            Some(UnetKeys::Diffusers)
        } else {
            None
        }
    }

    /// The file's name for the UNet tensor the checkpoint calls `model.diffusion_model.{ldm}`
    /// in layout `cfg`.
    fn file_name(self, ldm: &str, cfg: &ModelConfig) -> Option<String> {
        match self {
            UnetKeys::Bare => Some(ldm.to_string()),
            UnetKeys::Prefixed => Some(format!("{UNET_PREFIX}{ldm}")),
            UnetKeys::Diffusers => ldm_to_candle(&format!("{UNET_PREFIX}{ldm}"), cfg).map(|(_, n)| n),
        }
    }
}

/// Where a UNet file keeps block `block`'s transformer blocks (`...transformer_blocks.`).
fn transformer_prefix(keys: UnetKeys, block: Block) -> String {
    let ldm = block.ldm_name();
    match keys {
        UnetKeys::Bare => format!("{ldm}.transformer_blocks."),
        UnetKeys::Prefixed => format!("{UNET_PREFIX}{ldm}.transformer_blocks."),
        UnetKeys::Diffusers => format!("{}.transformer_blocks.", block.diffusers_name()),
    }
}

/// The second dimension of the first tensor of `index` whose name ends with `suffix`.
fn width_ending(index: &SafetensorsIndex, suffix: &str) -> Option<usize> {
    index
        .tensors
        .iter()
        .find(|(k, _)| k.ends_with(suffix))
        .and_then(|(_, t)| t.shape.get(1).copied())
}

/// The layout of the UNet file `index` (keys in style `keys`), from its context and
/// label-embedding widths as ComfyUI's detection reads them, with SDXL's transformer depths
/// counted from the file (distilled SDXL models); weft's tiny test layouts are recognised
/// too. An error says what was found.
pub fn detect_unet(index: &SafetensorsIndex, keys: UnetKeys) -> Result<ModelConfig, String> {
    let context = width_ending(index, ".attn2.to_k.weight");
    let adm_name = match keys {
        UnetKeys::Diffusers => "add_embedding.linear_1.weight",
        _ => "label_emb.0.0.weight",
    };
    let adm = width_ending(index, adm_name);
    let tiny = [
        ModelConfig::tiny(),
        ModelConfig::tiny_sdxl(),
        ModelConfig::tiny_sdxl_refiner(),
    ];
    let channels =
        width_ending(index, "time_embed.0.weight").or_else(|| width_ending(index, "time_embedding.linear_1.weight"));
    if let Some(small) = tiny
        .into_iter()
        .find(|t| Some(t.context_dim) == context && t.adm_in_channels == adm && Some(t.model_channels) == channels)
    {
        return Ok(small);
    }
    let mut cfg = match (context, adm) {
        (Some(768), None) => return Ok(ModelConfig::sd1()),
        (Some(2048), Some(2816)) => ModelConfig::sdxl(),
        (Some(1280), Some(2560)) => ModelConfig::sdxl_refiner(),
        (Some(1024), _) => return Err("a Stable Diffusion 2.x UNet (1024-wide context)".into()),
        (None, _) => return Err("no UNet attention layers found".into()),
        (Some(c), None) => return Err(format!("a UNet with {c}-wide context")),
        (Some(c), Some(a)) => return Err(format!("a UNet with {c}-wide context and {a}-wide label embedding")),
    };
    count_depths_by(index, &mut cfg, |block| transformer_prefix(keys, block))?;
    Ok(cfg)
}

/// An error unless every tensor of `expected` is in `index` (under `file_name`'s name) with
/// its shape and a float type.
fn check_tensors(
    index: &SafetensorsIndex,
    expected: impl IntoIterator<Item = (String, Vec<usize>)>,
    file_name: impl Fn(&str) -> Option<String>,
) -> Result<(), String> {
    let mut problems = BTreeMap::new();
    for (name, shape) in expected {
        let Some(key) = file_name(&name) else {
            problems.insert(name, "not mapped".to_string());
            continue;
        };
        match index.tensors.get(&key) {
            None => {
                problems.insert(key, format!("missing, expected {shape:?}"));
            }
            Some(t) if t.shape != shape => {
                problems.insert(key, format!("shape {:?}, expected {shape:?}", t.shape));
            }
            Some(t) if !matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) => {
                problems.insert(key, format!("dtype {}, expected F32, F16 or BF16", t.dtype.name()));
            }
            Some(_) => {}
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let examples: Vec<String> = problems.iter().take(3).map(|(k, v)| format!("{k} ({v})")).collect();
    Err(format!(
        "{} tensors missing or mis-shaped, e.g. {}",
        problems.len(),
        examples.join("; ")
    ))
}

/// An error unless the UNet file `index` (keys `keys`) has every tensor of layout `cfg`.
pub fn check_unet(index: &SafetensorsIndex, cfg: &ModelConfig, keys: UnetKeys) -> Result<(), String> {
    check_tensors(index, unet_layout(cfg), |n| keys.file_name(n, cfg))
}

/// The UNet tensors of file `index` (keys `keys`, layout `cfg`) under the names weft's UNet
/// reads, in `dtype` on `device`.
pub fn unet_tensors(
    index: &SafetensorsIndex,
    cfg: &ModelConfig,
    keys: UnetKeys,
    device: &Device,
    dtype: DType,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for (ldm, _) in unet_layout(cfg) {
        let (Some(name), Some((_, target))) = (
            keys.file_name(&ldm, cfg),
            ldm_to_candle(&format!("{UNET_PREFIX}{ldm}"), cfg),
        ) else {
            return Err(anyhow!("UNet tensor {ldm} has no name in this layout"));
        };
        let t = read_tensor(index, &name, &target, device, dtype)?;
        out.insert(target, t);
    }
    Ok(out)
}

/// Which CLIP text encoder a text-encoder file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipFile {
    /// The prefix of its keys (`""`, `clip_l.` or `clip_g.`).
    pub prefix: String,
    /// CLIP ViT-L (`false`) or OpenCLIP bigG (`true`).
    pub big_g: bool,
    /// Its width.
    pub width: usize,
    /// Its encoder layers.
    pub layers: usize,
}

/// The text encoder in the Hugging Face layout file `index`: ViT-L or bigG told apart as
/// ComfyUI does (bigG has 32 layers and a text projection; weft's tiny test encoders are
/// told by their widths), with its width and depth. An error says what the file holds.
pub fn detect_clip(index: &SafetensorsIndex) -> Result<ClipFile, String> {
    let marker = "text_model.final_layer_norm.weight";
    let Some((key, info)) = index.tensors.iter().find(|(k, _)| k.ends_with(marker)) else {
        return Err(format!(
            "not a CLIP text encoder in the Hugging Face layout ({marker} missing; {} tensors, first '{}')",
            index.tensors.len(),
            index.tensors.keys().next().map(String::as_str).unwrap_or("")
        ));
    };
    let prefix = key.strip_suffix(marker).unwrap_or_default().to_string();
    if !["", "clip_l.", "clip_g."].contains(&prefix.as_str()) {
        return Err(format!("text-encoder keys under the unknown prefix '{prefix}'"));
    }
    let width = info.shape.first().copied().unwrap_or(0);
    let layer_prefix = format!("{prefix}text_model.encoder.layers.");
    let layers = index
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix(&layer_prefix)?.split('.').next()?.parse::<usize>().ok())
        .max()
        .map_or(0, |last| last + 1);
    let projection = index.tensors.contains_key(&format!("{prefix}text_projection.weight"));
    let big_g = match width {
        1280 => true,
        768 => false,
        // weft's tiny test encoders: ViT-L 32 wide, bigG 48 wide.
        48 => true,
        32 => false,
        other => {
            return Err(format!(
                "a {other}-wide text encoder of {layers} layers (neither CLIP ViT-L nor OpenCLIP bigG)"
            ))
        }
    };
    if big_g && !projection {
        return Err(format!(
            "a {width}-wide text encoder without text_projection.weight (OpenCLIP bigG has one)"
        ));
    }
    Ok(ClipFile {
        prefix,
        big_g,
        width,
        layers,
    })
}

/// `clip` as a Hugging Face layout file holds it.
fn hugging_face_twin(clip: &ClipConfig) -> ClipConfig {
    ClipConfig {
        names: ClipNames::HuggingFace,
        ..clip.clone()
    }
}

/// An error unless the text-encoder file `index` (keys under `prefix`) has every tensor of
/// encoder `clip` in the Hugging Face layout.
pub fn check_clip(index: &SafetensorsIndex, prefix: &str, clip: &ClipConfig) -> Result<(), String> {
    check_tensors(index, clip_layout(&hugging_face_twin(clip)), |n| {
        Some(format!("{prefix}{n}"))
    })
}

/// The tensors of encoder `clip` from the Hugging Face layout file `index` (keys under
/// `prefix`), under the names and shapes weft's CLIP reads when loading the checkpoint
/// layout `clip` describes (bigG: q, k, v stacked into `in_proj`, the projection as `[in, out]`).
pub fn clip_tensors(
    index: &SafetensorsIndex,
    prefix: &str,
    clip: &ClipConfig,
    device: &Device,
    dtype: DType,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    let stacked = clip.names == ClipNames::OpenClip;
    for (name, _) in clip_layout(&hugging_face_twin(clip)) {
        let key = format!("{prefix}{name}");
        let t = read_tensor(index, &key, &name, device, dtype)?;
        if stacked && name == "text_projection.weight" {
            out.insert("text_projection.in_out".to_string(), t.t()?.contiguous()?);
        } else {
            out.insert(name, t);
        }
    }
    if stacked {
        for l in 0..clip.layers {
            let p = format!("text_model.encoder.layers.{l}.self_attn");
            for part in ["weight", "bias"] {
                let qkv = ["q_proj", "k_proj", "v_proj"].map(|n| {
                    out.remove(&format!("{p}.{n}.{part}"))
                        .ok_or_else(|| anyhow!("{p}.{n}.{part} missing"))
                });
                let [q, k, v] = qkv;
                out.insert(format!("{p}.in_proj.{part}"), Tensor::cat(&[q?, k?, v?], 0)?);
            }
        }
    }
    Ok(out)
}

/// Tensors to write: name, shape, float32 values.
type Written = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Reads a checkpoint tensor by name: its shape and float32 values.
type ReadTensor<'a> = &'a dyn Fn(&str) -> Result<(Vec<usize>, Vec<f32>)>;

/// The files [`write_split`] wrote.
#[derive(Debug, Clone)]
pub struct SplitFiles {
    /// The UNet, ComfyUI's names without a prefix.
    pub unet: PathBuf,
    /// The text encoders in the order of the configuration's `text`, Hugging Face layout,
    /// each with its ComfyUI name (`clip_l`, `clip_g`).
    pub text: Vec<(&'static str, PathBuf)>,
    /// The autoencoder, original names without a prefix.
    pub vae: PathBuf,
}

/// Writes the networks of the checkpoint `index` (layout `cfg`) into `dir` as separate files
/// named `{stem}_unet.safetensors`, `{stem}_clip_l.safetensors` / `{stem}_clip_g.safetensors`
/// and `{stem}_vae.safetensors`, float32: the UNet in ComfyUI's `diffusion_models` layout
/// (no prefix), the text encoders in Hugging Face's `CLIPTextModel` layout (bigG's q, k, v
/// apart and its projection as a Linear weight `[out, in]`), the VAE without its prefix.
pub fn write_split(index: &SafetensorsIndex, cfg: &ModelConfig, dir: &Path, stem: &str) -> Result<SplitFiles> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    let read = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
        let info = index.tensors.get(name).ok_or_else(|| anyhow!("{name} missing"))?;
        Ok((info.shape.clone(), index.read_f32(name)?))
    };
    let write = |file: &str, tensors: Written| -> Result<PathBuf> {
        let path = dir.join(format!("{stem}_{file}.safetensors"));
        write_f32_safetensors(&path, &tensors, &BTreeMap::new()).with_context(|| path.display().to_string())?;
        Ok(path)
    };
    let mut unet = Vec::new();
    for (n, _) in unet_layout(cfg) {
        let (shape, data) = read(&format!("{UNET_PREFIX}{n}"))?;
        unet.push((n, shape, data));
    }
    let mut vae = Vec::new();
    for (n, _) in vae_layout(cfg) {
        let (shape, data) = read(&format!("{VAE_PREFIX}{n}"))?;
        vae.push((n, shape, data));
    }
    let mut text = Vec::new();
    for clip in &cfg.text {
        let tensors = hugging_face_tensors(clip, &read)?;
        text.push((clip.name, write(clip.name, tensors)?));
    }
    Ok(SplitFiles {
        unet: write("unet", unet)?,
        text,
        vae: write("vae", vae)?,
    })
}

/// Encoder `clip` of a checkpoint (read with `read`) in Hugging Face's layout.
fn hugging_face_tensors(clip: &ClipConfig, read: ReadTensor<'_>) -> Result<Written> {
    let mut out = Vec::new();
    for (n, _) in clip_layout(clip) {
        let (shape, data) = read(&format!("{}{n}", clip.prefix))?;
        let (_, mapped) = ldm_to_candle(&format!("{}{n}", clip.prefix), &single(clip))
            .ok_or_else(|| anyhow!("unmapped text-encoder tensor {n}"))?;
        if let Some(stem) = mapped
            .strip_suffix(".in_proj.weight")
            .or(mapped.strip_suffix(".in_proj.bias"))
        {
            let part = if mapped.ends_with("weight") { "weight" } else { "bias" };
            let rows = shape[0] / 3;
            let per = data.len() / 3;
            for (i, p) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                let mut s = shape.clone();
                s[0] = rows;
                out.push((format!("{stem}.{p}.{part}"), s, data[i * per..(i + 1) * per].to_vec()));
            }
        } else if mapped == "text_projection.in_out" {
            let (rows, cols) = (shape[0], shape[1]);
            let transposed = (0..cols * rows).map(|i| data[(i % rows) * cols + i / rows]).collect();
            out.push(("text_projection.weight".to_string(), vec![cols, rows], transposed));
        } else {
            out.push((mapped, shape, data));
        }
    }
    Ok(out)
}

/// A configuration with `clip` as its only text encoder (to map its names).
fn single(clip: &ClipConfig) -> ModelConfig {
    ModelConfig {
        text: vec![clip.clone()],
        ..ModelConfig::tiny()
    }
}
