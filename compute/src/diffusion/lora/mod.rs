//! LoRA files as ComfyUI's `LoraLoader` reads them, for SD1, SDXL and the SDXL refiner.
//!
//! A file holds, for each patched weight, a low-rank pair under a key that names the weight
//! (see [`keys`] for the key forms): `<key>.lora_up.weight` (`[out, rank, ...]`) and
//! `<key>.lora_down.weight` (`[rank, in, ...]`), or the same pair spelled `_lora.up/down`,
//! `.lora.up/down`, `.lora_B/lora_A` (PEFT), `.lora_linear_layer.up/down`, and an optional
//! `<key>.alpha`. A patch adds `strength * alpha / rank * up @ down` to the weight, reshaped
//! to it (so a LoCon `[rank, in, k, k]` down patches a convolution), as ComfyUI does.
//!
//! Other adapters ComfyUI applies (DoRA's `dora_scale`, LoHa, LoKr, GLoRA, OFT, full
//! differences) are refused with an error that names them rather than applied wrongly, as
//! is a patch whose shape does not fit the model (a LoRA for another model family).

mod keys;
mod random;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::checkpoint::ModelError;
use crate::models::layout::{fit_to_network, ldm_to_candle, Component, Family, ModelConfig};
use crate::models::safetensors::{SafetensorsIndex, DEFAULT_MAX_HEADER};
pub use keys::{targets, Part, Target};
pub use random::write_random_lora;

/// One weight's low-rank update: `(shape, values)` of its up and down matrices.
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
    /// Keys with an adapter weft does not apply, and what it is.
    unsupported: BTreeMap<String, &'static str>,
}

/// Suffixes of a patch's (up, down) tensors, in the order ComfyUI prefers them when a key has
/// several: kohya's, diffusers' older two, PEFT's, Mochi's, transformers', PEFT's adapter.
const PAIRS: [(&str, &str); 7] = [
    (".lora_up.weight", ".lora_down.weight"),
    ("_lora.up.weight", "_lora.down.weight"),
    (".lora_B.weight", ".lora_A.weight"),
    (".lora.up.weight", ".lora.down.weight"),
    (".lora_B", ".lora_A"),
    (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"),
    (".lora_B.default.weight", ".lora_A.default.weight"),
];

/// Tensor suffixes of the adapters ComfyUI applies and weft does not, with what they are.
const UNSUPPORTED: [(&str, &str); 15] = [
    (".dora_scale", "a DoRA update (dora_scale)"),
    (".lora_mid.weight", "a LoCon update with a Tucker core (lora_mid)"),
    (".reshape_weight", "a reshaping LoRA (reshape_weight)"),
    (".hada_w1_a", "a LoHa update (hada_*)"),
    (".lokr_w1", "a LoKr update (lokr_*)"),
    (".lokr_w1_a", "a LoKr update (lokr_*)"),
    (".lokr_w2", "a LoKr update (lokr_*)"),
    (".lokr_w2_a", "a LoKr update (lokr_*)"),
    (".a1.weight", "a GLoRA update (a1/a2/b1/b2)"),
    (".oft_blocks", "an OFT update (oft_blocks)"),
    (".diff", "a full weight difference (diff)"),
    (".diff_b", "a bias difference (diff_b)"),
    (".w_norm", "a norm weight (w_norm)"),
    (".b_norm", "a norm bias (b_norm)"),
    (".set_weight", "a replacement weight (set_weight)"),
];

/// The family's name in messages.
fn family_name(family: Family) -> &'static str {
    match family {
        Family::Sd1 => "SD1.x",
        Family::Sdxl => "SDXL",
        Family::SdxlRefiner => "SDXL refiner",
        Family::Sd2 => "SD2.x",
    }
}

impl Patch {
    /// Whether this update fits a weight of `shape` (`[out, in, ...]`): `out` rows and as many
    /// values, with up's inner size the rank.
    fn fits(&self, shape: &[usize]) -> bool {
        let (up, down) = (&self.up.0, &self.down.0);
        let rank = down.first().copied().unwrap_or(0);
        let rows = up.first().copied().unwrap_or(0);
        let cols: usize = down.iter().skip(1).product();
        rank > 0
            && up.iter().skip(1).product::<usize>() == rank
            && shape.first() == Some(&rows)
            && rows.checked_mul(cols) == Some(shape.iter().product::<usize>())
    }

    /// `strength * alpha / rank * up @ down` as a `[out, in * k * k]` matrix.
    fn difference(&self, strength: f64, device: &Device) -> candle_core::Result<Tensor> {
        let rank = self.down.0[0];
        let rows = self.up.0[0];
        let cols = self.down.0.iter().skip(1).product::<usize>();
        let up = Tensor::from_slice(&self.up.1, (rows, rank), device)?;
        let down = Tensor::from_slice(&self.down.1, (rank, cols), device)?;
        let scale = strength * f64::from(self.alpha.unwrap_or(rank as f32)) / rank as f64;
        up.matmul(&down)? * scale
    }
}

/// `weight` with `diff` (`[out, in...]` as the LoRA sees the weight) added to `part` of it.
fn add_update(weight: &Tensor, diff: &Tensor, part: Part) -> candle_core::Result<Tensor> {
    let weight = weight.to_dtype(DType::F32)?;
    match part {
        Part::Whole => &weight + diff.reshape(weight.dims())?,
        Part::Transposed => &weight + diff.t()?.contiguous()?.reshape(weight.dims())?,
        Part::Third(i) => {
            let rows = weight.dim(0)? / 3;
            let mut pieces = Vec::with_capacity(3);
            for j in 0..3 {
                let piece = weight.narrow(0, j * rows, rows)?;
                pieces.push(if j == i {
                    (&piece + diff.reshape(piece.dims())?)?
                } else {
                    piece
                });
            }
            Tensor::cat(&pieces, 0)
        }
    }
}

/// The key and form index of tensor `tensor` if it is the up half of a pair `index` holds.
fn up_of_pair(index: &SafetensorsIndex, tensor: &str) -> Option<(String, usize)> {
    PAIRS.iter().enumerate().find_map(|(i, (up, down))| {
        let key = tensor.strip_suffix(up)?;
        index
            .tensors
            .contains_key(&format!("{key}{down}"))
            .then(|| (key.to_string(), i))
    })
}

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
        // Each key's preferred pair form, and the keys of adapters weft does not apply.
        let mut forms: BTreeMap<String, usize> = BTreeMap::new();
        let mut unsupported = BTreeMap::new();
        for tensor in index.tensors.keys() {
            if let Some((key, form)) = up_of_pair(&index, tensor) {
                let best = forms.entry(key).or_insert(form);
                *best = (*best).min(form);
            }
            for (suffix, kind) in UNSUPPORTED {
                if let Some(key) = tensor.strip_suffix(suffix) {
                    unsupported.insert(key.to_string(), kind);
                }
            }
        }
        let mut patches = BTreeMap::new();
        for (key, form) in forms {
            let (up, down) = PAIRS[form];
            let alpha_name = format!("{key}.alpha");
            let alpha = match index.tensors.contains_key(&alpha_name) {
                true => read(&alpha_name)?.1.first().copied(),
                false => None,
            };
            let patch = Patch {
                up: read(&format!("{key}{up}"))?,
                down: read(&format!("{key}{down}"))?,
                alpha,
            };
            patches.insert(key, patch);
        }
        if patches.is_empty() {
            let detail = match unsupported.values().next() {
                Some(kind) => format!("it holds {kind}, which weft does not apply"),
                None => "no lora_up / lora_down weights".to_string(),
            };
            return Err(ModelError::Invalid(format!(
                "{name}: not a LoRA weft can apply ({detail})"
            )));
        }
        Ok(Lora {
            name: name.to_string(),
            patches,
            unsupported,
        })
    }

    /// An error unless this LoRA fits a model of layout `cfg`: some of its patches are for
    /// the model's weights, every such patch has the weight's shape, and none of them is an
    /// adapter weft does not apply.
    pub fn check_fits(&self, cfg: &ModelConfig) -> Result<(), ModelError> {
        let targets = targets(cfg);
        if let Some((key, kind)) = self.unsupported.iter().find(|(key, _)| targets.contains_key(*key)) {
            return Err(ModelError::Invalid(format!(
                "{}: {key} is {kind}, which weft does not apply (it applies LoRA and LoCon up/down pairs)",
                self.name
            )));
        }
        let mut fitting = 0;
        for (key, patch) in &self.patches {
            if let Some(target) = targets.get(key) {
                self.check_patch(key, patch, target, cfg)?;
                fitting += 1;
            }
        }
        if fitting == 0 {
            return Err(ModelError::Invalid(format!(
                "{}: none of its weights fit this {} model (a LoRA for another model?)",
                self.name,
                family_name(cfg.family)
            )));
        }
        Ok(())
    }

    /// An error unless `patch` (for `key`) fits `target`.
    fn check_patch(&self, key: &str, patch: &Patch, target: &Target, cfg: &ModelConfig) -> Result<(), ModelError> {
        if patch.fits(&target.shape) {
            return Ok(());
        }
        Err(ModelError::Invalid(format!(
            "{}: {key} is a {:?} x {:?} update, which does not fit the {} model's {} {:?} (a LoRA for another model?)",
            self.name,
            patch.up.0,
            patch.down.0,
            family_name(cfg.family),
            target.tensor,
            target.shape
        )))
    }

    /// Adds this LoRA's patches for `component` to `tensors` (candle names), at `strength`.
    /// Returns how many updates were added (none at strength 0, which changes nothing).
    pub fn apply(
        &self,
        strength: f64,
        component: Component,
        cfg: &ModelConfig,
        tensors: &mut HashMap<String, Tensor>,
    ) -> Result<usize, ModelError> {
        let fail = |e: candle_core::Error| ModelError::Failed(format!("{}: applying: {e}", self.name));
        let mut applied = 0;
        let targets = targets(cfg);
        for (key, patch) in &self.patches {
            let Some(target) = targets.get(key).filter(|t| t.component == component) else {
                continue;
            };
            self.check_patch(key, patch, target, cfg)?;
            let Some(weight) = tensors.get(&target.tensor) else {
                continue;
            };
            if strength == 0.0 {
                continue;
            }
            let diff = patch.difference(strength, weight.device()).map_err(fail)?;
            let patched = add_update(weight, &diff, target.part).map_err(fail)?;
            tensors.insert(target.tensor.clone(), patched);
            applied += 1;
        }
        Ok(applied)
    }
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
