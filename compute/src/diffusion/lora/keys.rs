//! The LoRA key names ComfyUI accepts for each weight of a model, and where each one's update
//! goes in weft's tensors.
//!
//! UNet weights answer to their original (LDM) name and their diffusers name, each in several
//! spellings: kohya's `lora_unet_<name with _>`, the generic `diffusion_model.<name>`,
//! SimpleTuner's `lycoris_<diffusers name with _>`, and diffusers' own
//! `[unet.]<diffusers name>` with attention projections as `processor.to_q` ... `processor.to_out`.
//! weft's UNet tensors carry the diffusers names ComfyUI derives from the UNet's configuration
//! (SDXL's `down_blocks.0` has no attentions, so its first transformer is
//! `down_blocks.1.attentions.0`).
//!
//! Text-encoder weights answer to their Hugging Face name: kohya's `lora_te_` (SD1, and ViT-L
//! in SDXL too), `lora_te1_` (ViT-L) and `lora_te2_` (SDXL's bigG; the refiner's bigG alone
//! is `lora_te_` and `lora_prior_te_`), diffusers' `text_encoder.` / `text_encoder_2.`, and the
//! generic `text_encoders.clip_l.transformer.` / `text_encoders.clip_g.transformer.`. weft keeps
//! bigG's attention input as OpenCLIP's stacked `in_proj` (q, k, v rows one after the other)
//! and its projection as OpenCLIP's `[in, out]` matrix, so a q/k/v update goes to a third of
//! the rows and a projection update is transposed.

use std::collections::BTreeMap;

use crate::models::layout::{checkpoint_layout, ldm_to_candle, Component, ModelConfig, UNET_PREFIX};

/// The part of a weft tensor a LoRA key's update covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The whole tensor.
    Whole,
    /// One third of a stacked `in_proj` weight's rows: 0 for q, 1 for k, 2 for v.
    Third(usize),
    /// The whole tensor, stored transposed (bigG's `[in, out]` text projection).
    Transposed,
}

/// Where the update of one LoRA key goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The sub-model holding the weight.
    pub component: Component,
    /// The weight's weft (candle) name.
    pub tensor: String,
    /// Which part of it the update covers.
    pub part: Part,
    /// The shape of the weight the update is for, as the LoRA sees it (`[out, in]` or
    /// `[out, in, kh, kw]`; a third of the rows for [`Part::Third`]).
    pub shape: Vec<usize>,
}

/// The modules of a text encoder layer that kohya's names cover, Hugging Face name first.
const KOHYA_CLIP_MODULES: [&str; 6] = [
    "mlp.fc1",
    "mlp.fc2",
    "self_attn.k_proj",
    "self_attn.q_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
];

/// Text encoder layers ComfyUI's kohya names reach.
const KOHYA_CLIP_LAYERS: usize = 32;

/// Every LoRA key a model of layout `cfg` answers to, with where its update goes.
pub fn targets(cfg: &ModelConfig) -> BTreeMap<String, Target> {
    let mut out = BTreeMap::new();
    let has_clip_l = cfg.text.iter().any(|c| c.name == "clip_l");
    for (ldm, shape) in checkpoint_layout(cfg) {
        let Some((component, candle)) = ldm_to_candle(&ldm, cfg) else {
            continue;
        };
        match component {
            Component::Unet => unet_keys(&mut out, &ldm, &candle, &shape),
            Component::Clip(i) => {
                let encoder = cfg.text[i].name;
                for (hf, part, shape) in clip_parts(&candle, &shape) {
                    let target = Target {
                        component,
                        tensor: candle.clone(),
                        part,
                        shape,
                    };
                    for key in clip_keys(encoder, has_clip_l, &hf) {
                        out.insert(key, target.clone());
                    }
                }
            }
            Component::Vae => {}
        }
    }
    out
}

/// `name` as one word of a kohya key: dots become underscores.
fn flat(name: &str) -> String {
    name.replace('.', "_")
}

/// The keys of UNet weight `ldm` (weft name `candle`, file shape `shape`).
fn unet_keys(out: &mut BTreeMap<String, Target>, ldm: &str, candle: &str, shape: &[usize]) {
    let (Some(original), Some(diffusers)) = (
        ldm.strip_prefix(UNET_PREFIX).and_then(|n| n.strip_suffix(".weight")),
        candle.strip_suffix(".weight"),
    ) else {
        return;
    };
    let target = Target {
        component: Component::Unet,
        tensor: candle.to_string(),
        part: Part::Whole,
        shape: shape.to_vec(),
    };
    let mut keys = vec![
        format!("lora_unet_{}", flat(original)),
        format!("diffusion_model.{original}"),
    ];
    let mut names = vec![diffusers.to_string()];
    // ComfyUI's diffusers map names the label embedding both ways.
    if let Some(rest) = diffusers.strip_prefix("add_embedding.") {
        names.push(format!("class_embedding.{rest}"));
    }
    for name in names {
        keys.push(format!("lora_unet_{}", flat(&name)));
        keys.push(format!("lycoris_{}", flat(&name)));
        let mut processor = name.replace(".to_", ".processor.to_");
        if processor.ends_with(".to_out.0") {
            processor.truncate(processor.len() - 2);
        }
        keys.push(format!("unet.{processor}"));
        keys.push(processor);
    }
    for key in keys {
        out.insert(key, target.clone());
    }
}

/// The Hugging Face names (without `.weight`) a text encoder weight stands for, with the part
/// of it each covers and that part's shape: bigG's stacked `in_proj` is q, k and v, its
/// `[in, out]` projection is `text_projection` transposed; biases have none.
fn clip_parts(candle: &str, shape: &[usize]) -> Vec<(String, Part, Vec<usize>)> {
    if let Some(layer) = candle.strip_suffix("self_attn.in_proj.weight") {
        let third = vec![shape[0] / 3, shape[1]];
        return ["q", "k", "v"]
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("{layer}self_attn.{p}_proj"), Part::Third(i), third.clone()))
            .collect();
    }
    if candle == "text_projection.in_out" {
        return vec![("text_projection".into(), Part::Transposed, vec![shape[1], shape[0]])];
    }
    match candle.strip_suffix(".weight") {
        Some(name) => vec![(name.to_string(), Part::Whole, shape.to_vec())],
        None => Vec::new(),
    }
}

/// The keys of Hugging Face weight `hf` of text encoder `encoder` (`clip_l` or `clip_g`),
/// in a model that has a `clip_l` or not.
fn clip_keys(encoder: &str, has_clip_l: bool, hf: &str) -> Vec<String> {
    let mut keys = vec![format!("text_encoders.{encoder}.transformer.{hf}")];
    if hf == "text_projection" {
        match encoder {
            "clip_g" => keys.extend([
                "lora_prior_te_text_projection".into(),
                "lora_te2_text_projection".into(),
            ]),
            _ => keys.push("lora_te1_text_projection".into()),
        }
        return keys;
    }
    let Some((layer, module)) = hf
        .strip_prefix("text_model.encoder.layers.")
        .and_then(|rest| rest.split_once('.'))
    else {
        return keys;
    };
    let kohya_layer = layer.parse::<usize>().is_ok_and(|l| l < KOHYA_CLIP_LAYERS);
    if !kohya_layer || !KOHYA_CLIP_MODULES.contains(&module) {
        return keys;
    }
    let kohya = flat(hf);
    let (prefixes, diffusers): (&[&str], &str) = match (encoder, has_clip_l) {
        ("clip_g", true) => (&["lora_te2_"], "text_encoder_2."),
        ("clip_g", false) => (&["lora_te_", "lora_prior_te_"], "text_encoder."),
        _ => (&["lora_te_", "lora_te1_"], "text_encoder."),
    };
    keys.extend(prefixes.iter().map(|p| format!("{p}{kohya}")));
    keys.push(format!("{diffusers}{hf}"));
    keys
}
