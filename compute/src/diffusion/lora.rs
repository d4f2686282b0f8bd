//! LoRA files in the kohya / A1111 layout that ComfyUI loads: for each patched weight
//! `<key>.lora_down.weight` (`[rank, in, ...]`), `<key>.lora_up.weight` (`[out, rank, ...]`)
//! and an optional `<key>.alpha`, where `<key>` is `lora_unet_` or `lora_te_` and the weight's
//! module path with `_` for `.` (diffusers-style or original-layout names). A patch adds
//! `strength * alpha / rank * up @ down` to the weight, as ComfyUI does.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::checkpoint::ModelError;
use crate::models::layout::{checkpoint_layout, fit_to_network, ldm_to_candle, Component, ModelConfig, UNET_PREFIX};
use crate::models::safetensors::{SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::sampling::TorchGenerator;

/// One weight's low-rank update.
#[derive(Debug, Clone)]
struct Patch {
    up: (Vec<usize>, Vec<f32>),
    down: (Vec<usize>, Vec<f32>),
    alpha: Option<f32>,
}

/// A LoRA file's patches, by key.
#[derive(Debug, Clone)]
pub struct Lora {
    /// The file's name, for messages.
    pub name: String,
    patches: BTreeMap<String, Patch>,
}

/// Suffixes of a patch's tensors: (up, down), kohya's and diffusers' spellings.
const PAIRS: [(&str, &str); 2] = [
    (".lora_up.weight", ".lora_down.weight"),
    (".lora.up.weight", ".lora.down.weight"),
];

impl Lora {
    /// Reads the LoRA at `path` (called `name` in messages).
    pub fn read(path: &Path, name: &str) -> Result<Lora, ModelError> {
        let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)
            .map_err(|e| ModelError::from_checkpoint(&e, path, name))?;
        let read = |tensor: &str| -> Result<(Vec<usize>, Vec<f32>), ModelError> {
            let shape = index.tensors[tensor].shape.clone();
            let data = index
                .read_f32(tensor)
                .map_err(|e| ModelError::from_checkpoint(&e, path, name))?;
            Ok((shape, data))
        };
        let mut patches = BTreeMap::new();
        for tensor in index.tensors.keys() {
            for (up, down) in PAIRS {
                let Some(key) = tensor.strip_suffix(up) else {
                    continue;
                };
                let down_name = format!("{key}{down}");
                if !index.tensors.contains_key(&down_name) {
                    continue;
                }
                let alpha_name = format!("{key}.alpha");
                let alpha = match index.tensors.contains_key(&alpha_name) {
                    true => read(&alpha_name)?.1.first().copied(),
                    false => None,
                };
                patches.insert(
                    key.to_string(),
                    Patch {
                        up: read(tensor)?,
                        down: read(&down_name)?,
                        alpha,
                    },
                );
            }
        }
        if patches.is_empty() {
            return Err(ModelError::Invalid(format!(
                "{name}: not a LoRA (no lora_up / lora_down weights)"
            )));
        }
        Ok(Lora {
            name: name.to_string(),
            patches,
        })
    }

    /// An error unless some of this LoRA's patches fit a model of layout `cfg`.
    pub fn check_fits(&self, cfg: &ModelConfig) -> Result<(), ModelError> {
        let targets = targets(cfg);
        if self.patches.keys().any(|k| targets.contains_key(k)) {
            Ok(())
        } else {
            Err(ModelError::Invalid(format!(
                "{}: none of its weights fit this model (a LoRA for another model?)",
                self.name
            )))
        }
    }

    /// Adds this LoRA's patches for `component` to `tensors` (candle names), at `strength`.
    /// Returns how many weights changed.
    pub fn apply(
        &self,
        strength: f64,
        component: Component,
        cfg: &ModelConfig,
        tensors: &mut HashMap<String, Tensor>,
    ) -> Result<usize, ModelError> {
        let fail = |e: candle_core::Error| ModelError::Failed(format!("{}: applying: {e}", self.name));
        let mut applied = 0;
        let mut targets = targets(cfg);
        for (key, patch) in &self.patches {
            let Some((target_component, target)) = targets.remove(key) else {
                continue;
            };
            if target_component != component {
                continue;
            }
            let Some(weight) = tensors.get(&target) else {
                continue;
            };
            let (up_shape, down_shape) = (&patch.up.0, &patch.down.0);
            let rank = down_shape.first().copied().unwrap_or(0);
            let rows = up_shape.first().copied().unwrap_or(0);
            let cols: usize = down_shape.iter().skip(1).product();
            let fits = rank > 0
                && up_shape.iter().skip(1).product::<usize>() == rank
                && rows * cols == weight.elem_count()
                && weight.dims().first() == Some(&rows);
            if !fits {
                return Err(ModelError::Invalid(format!(
                    "{}: {key} is {up_shape:?} x {down_shape:?}, which does not fit the model's {:?} (a LoRA for another model?)",
                    self.name,
                    weight.dims()
                )));
            }
            let device = weight.device();
            let up = Tensor::from_slice(&patch.up.1, (rows, rank), device).map_err(fail)?;
            let down = Tensor::from_slice(&patch.down.1, (rank, cols), device).map_err(fail)?;
            let scale = strength * f64::from(patch.alpha.unwrap_or(rank as f32)) / rank as f64;
            let diff = up.matmul(&down).and_then(|d| d.reshape(weight.dims())).map_err(fail)?;
            let patched = (weight.to_dtype(DType::F32).map_err(fail)? + (diff * scale).map_err(fail)?).map_err(fail)?;
            tensors.insert(target, patched);
            applied += 1;
        }
        Ok(applied)
    }
}

/// `text.with.dots` as a LoRA key part (`text_with_dots`), without a trailing `.weight`.
fn key_part(name: &str) -> Option<String> {
    Some(name.strip_suffix(".weight")?.replace('.', "_"))
}

/// The LoRA keys the weights of layout `cfg` answer to, with their component and candle name.
fn targets(cfg: &ModelConfig) -> HashMap<String, (Component, String)> {
    let mut out = HashMap::new();
    for (ldm, _) in checkpoint_layout(cfg) {
        let Some((component, candle)) = ldm_to_candle(&ldm, cfg) else {
            continue;
        };
        let Some(diffusers) = key_part(&candle) else {
            continue;
        };
        match component {
            Component::Unet => {
                out.insert(format!("lora_unet_{diffusers}"), (component, candle.clone()));
                if let Some(original) = ldm.strip_prefix(UNET_PREFIX).and_then(key_part) {
                    out.insert(format!("lora_unet_{original}"), (component, candle));
                }
            }
            Component::Clip(i) => {
                // kohya's names: `lora_te_` for a single text encoder, `lora_te1_` and
                // `lora_te2_` for SDXL's two.
                let te = if cfg.text.len() == 1 {
                    String::new()
                } else {
                    (i + 1).to_string()
                };
                out.insert(format!("lora_te{te}_{diffusers}"), (component, candle));
            }
            Component::Vae => {}
        }
    }
    out
}

/// The tensors of `component` in the checkpoint at `path`, by candle name, float32 on `device`.
pub fn load_component(
    path: &Path,
    cfg: &ModelConfig,
    component: Component,
    device: &Device,
) -> anyhow::Result<HashMap<String, Tensor>> {
    // SAFETY: a checkpoint the model cache validated and loaded; like every mmap-based loader
    // this assumes the operator does not rewrite it while it is mapped.
    let mm = unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }?;
    let mut tensors = HashMap::new();
    for (name, _) in mm.tensors() {
        if let Some((c, target)) = ldm_to_candle(&name, cfg) {
            if c == component {
                let tensor = fit_to_network(&target, mm.load(&name, device)?.to_dtype(DType::F32)?)?;
                tensors.insert(target, tensor);
            }
        }
    }
    Ok(tensors)
}

/// Writes a random kohya-layout LoRA of rank `rank` for layout `cfg`: every linear and 1x1
/// convolution weight of the UNet's transformer blocks and of the text encoder's layers,
/// `alpha` equal to the rank.
pub fn write_random_lora(path: &Path, cfg: &ModelConfig, seed: u64, rank: usize) -> std::io::Result<()> {
    let mut g = TorchGenerator::new(seed);
    let mut tensors = Vec::new();
    for (ldm, shape) in checkpoint_layout(cfg) {
        let Some((component, candle)) = ldm_to_candle(&ldm, cfg) else {
            continue;
        };
        let prefix = match component {
            Component::Unet if candle.contains(".attentions.") => "lora_unet",
            Component::Clip(_) if candle.contains(".layers.") => "lora_te",
            _ => continue,
        };
        let (rows, cols, conv) = match shape.as_slice() {
            [rows, cols] => (*rows, *cols, false),
            [rows, cols, 1, 1] => (*rows, *cols, true),
            _ => continue,
        };
        let Some(part) = key_part(&candle) else {
            continue;
        };
        let key = format!("{prefix}_{part}");
        let mut draw = |n: usize| g.randn(n).into_iter().map(|v| v * 0.2).collect::<Vec<f32>>();
        let (down_shape, up_shape) = if conv {
            (vec![rank, cols, 1, 1], vec![rows, rank, 1, 1])
        } else {
            (vec![rank, cols], vec![rows, rank])
        };
        tensors.push((format!("{key}.lora_down.weight"), down_shape, draw(rank * cols)));
        tensors.push((format!("{key}.lora_up.weight"), up_shape, draw(rows * rank)));
        tensors.push((format!("{key}.alpha"), vec![], vec![rank as f32]));
    }
    let mut meta = BTreeMap::new();
    meta.insert(
        "weft.generator".to_string(),
        "random kohya-layout test LoRA".to_string(),
    );
    crate::models::safetensors::write_f32_safetensors(path, &tensors, &meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_loras_fit_their_layout_and_not_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-lora.safetensors");
        write_random_lora(&path, &ModelConfig::tiny(), 1, 4).unwrap();
        let lora = Lora::read(&path, "tiny-lora.safetensors").unwrap();
        lora.check_fits(&ModelConfig::tiny()).unwrap();
        assert_eq!(
            lora.check_fits(&ModelConfig::sd1()).map_err(|e| e.code()),
            Ok(()),
            "names are shared"
        );

        let ckpt = dir.path().join("tiny.safetensors");
        crate::models::write_random_checkpoint(&ckpt, &ModelConfig::tiny(), 2).unwrap();
        let cfg = ModelConfig::tiny();
        let mut unet = load_component(&ckpt, &cfg, Component::Unet, &Device::Cpu).unwrap();
        let before = unet.clone();
        let changed = lora.apply(1.0, Component::Unet, &cfg, &mut unet).unwrap();
        assert!(changed > 0);
        let moved = unet
            .iter()
            .filter(|(k, v)| crate::max_abs_diff(v, &before[*k]) > 0.0)
            .count();
        assert_eq!(moved, changed);
        // At strength 0 nothing moves.
        let mut same = before.clone();
        lora.apply(0.0, Component::Unet, &cfg, &mut same).unwrap();
        assert!(same.iter().all(|(k, v)| crate::max_abs_diff(v, &before[k]) == 0.0));
        // Shapes of another layout are refused.
        let sd1_shaped = dir.path().join("sd1-lora.safetensors");
        write_random_lora(&sd1_shaped, &ModelConfig::sd1(), 1, 1).unwrap();
        let other = Lora::read(&sd1_shaped, "sd1-lora.safetensors").unwrap();
        let mut unet = before.clone();
        assert_eq!(
            other.apply(1.0, Component::Unet, &cfg, &mut unet).unwrap_err().code(),
            "invalid_model"
        );

        // A file without LoRA weights, or with none that fit, is refused.
        let junk = dir.path().join("junk.safetensors");
        crate::models::safetensors::write_f32_safetensors(
            &junk,
            &[("lora_unet_nothing_here.lora_down.weight".into(), vec![1, 1], vec![0.0])],
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(Lora::read(&junk, "junk").unwrap_err().code(), "invalid_model");
        let stray = dir.path().join("stray.safetensors");
        crate::models::safetensors::write_f32_safetensors(
            &stray,
            &[
                ("lora_unet_nowhere.lora_down.weight".into(), vec![1, 1], vec![0.0]),
                ("lora_unet_nowhere.lora_up.weight".into(), vec![1, 1], vec![0.0]),
            ],
            &BTreeMap::new(),
        )
        .unwrap();
        let stray = Lora::read(&stray, "stray").unwrap();
        assert_eq!(stray.check_fits(&cfg).unwrap_err().code(), "invalid_model");
    }
}
