//! Random LoRAs for tests, in the layouts LoRA trainers write.

use std::collections::BTreeMap;
use std::path::Path;

use super::keys::targets;
use crate::models::layout::{checkpoint_layout, ldm_to_candle, Component, Family, ModelConfig};
use crate::sampling::TorchGenerator;

/// Writes a random kohya-layout LoRA of rank `rank` for layout `cfg`, `alpha` equal to the
/// rank.
///
/// For SD1 it patches every linear and 1x1 convolution weight of the UNet's transformers
/// (diffusers names, `lora_unet_down_blocks_0_attentions_0_...`) and of the text encoder's
/// layers (`lora_te_...`). For SDXL and the refiner it is what kohya's scripts write for
/// those: the UNet's transformer weights under their original names
/// (`lora_unet_input_blocks_4_1_...`), the residual blocks' 3x3 convolutions as LoCon
/// patches (`[rank, in, 3, 3]` down, `[out, rank, 1, 1]` up), and the q/k/v/out projections
/// and MLPs of both text encoders (`lora_te1_...` for ViT-L, `lora_te2_...` for bigG;
/// `lora_te_...` for the refiner's bigG).
pub fn write_random_lora(path: &Path, cfg: &ModelConfig, seed: u64, rank: usize) -> std::io::Result<()> {
    let modules = match cfg.family {
        Family::Sd1 | Family::Sd2 => sd1_modules(cfg),
        Family::Sdxl | Family::SdxlRefiner => kohya_sdxl_modules(cfg),
    };
    let mut g = TorchGenerator::new(seed);
    let mut draw = |n: usize| g.randn(n).into_iter().map(|v| v * 0.2).collect::<Vec<f32>>();
    let mut tensors = Vec::new();
    for (key, shape) in modules {
        let (down_shape, up_shape) = match shape.as_slice() {
            [rows, cols] => (vec![rank, *cols], vec![*rows, rank]),
            [rows, cols, kh, kw] => (vec![rank, *cols, *kh, *kw], vec![*rows, rank, 1, 1]),
            _ => continue,
        };
        let down = draw(down_shape.iter().product());
        let up = draw(up_shape.iter().product());
        tensors.push((format!("{key}.lora_down.weight"), down_shape, down));
        tensors.push((format!("{key}.lora_up.weight"), up_shape, up));
        tensors.push((format!("{key}.alpha"), vec![], vec![rank as f32]));
    }
    let mut meta = BTreeMap::new();
    meta.insert(
        "weft.generator".to_string(),
        "random kohya-layout test LoRA".to_string(),
    );
    crate::models::safetensors::write_f32_safetensors(path, &tensors, &meta)
}

/// SD1's patched weights, in checkpoint order: `lora_unet_` and `lora_te_` with weft's
/// (diffusers) names, with their shapes.
fn sd1_modules(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    for (ldm, shape) in checkpoint_layout(cfg) {
        let Some((component, candle)) = ldm_to_candle(&ldm, cfg) else {
            continue;
        };
        let prefix = match component {
            Component::Unet if candle.contains(".attentions.") => "lora_unet",
            Component::Clip(_) if candle.contains(".layers.") => "lora_te",
            _ => continue,
        };
        let linear = matches!(shape.as_slice(), [_, _] | [_, _, 1, 1]);
        if let (true, Some(name)) = (linear, candle.strip_suffix(".weight")) {
            out.push((format!("{prefix}_{}", name.replace('.', "_")), shape));
        }
    }
    out
}

/// SDXL's patched weights as kohya names them, sorted by key, with the shapes the LoRA sees.
fn kohya_sdxl_modules(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let text_prefixes: &[&str] = if cfg.text.len() > 1 {
        &["lora_te1_text_model_", "lora_te2_text_model_"]
    } else {
        &["lora_te_text_model_"]
    };
    let original = |key: &str| {
        key.strip_prefix("lora_unet_").is_some_and(|n| {
            ["input_blocks_", "middle_block_", "output_blocks_"]
                .iter()
                .any(|b| n.starts_with(b))
        })
    };
    targets(cfg)
        .into_iter()
        .filter(|(key, target)| match target.component {
            Component::Unet => {
                let transformer = target.tensor.contains(".attentions.") && target.shape.len() == 2;
                let conv =
                    target.tensor.contains(".resnets.") && target.shape.len() == 4 && target.shape[2..] == [3, 3];
                original(key) && (transformer || conv)
            }
            Component::Clip(_) => text_prefixes.iter().any(|p| key.starts_with(p)),
            Component::Vae => false,
        })
        .map(|(key, target)| (key, target.shape))
        .collect()
}
