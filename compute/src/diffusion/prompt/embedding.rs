//! Textual-inversion embeddings: vectors that stand in for tokens of the text encoder's
//! input, read from safetensors files in the layouts ComfyUI's `load_embed` accepts.

use std::collections::BTreeMap;
use std::path::Path;

use crate::models::safetensors::{write_f32_safetensors, SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::sampling::TorchGenerator;
use crate::ComputeError;

/// The key ComfyUI reads a CLIP ViT-L embedding from when a file holds several (SD1's
/// encoder, and SDXL's first); SDXL's bigG reads `clip_g`.
pub const CLIP_L_KEY: &str = "clip_l";

/// Most vectors one embedding may hold (A1111 trains at most 75: one chunk).
const MAX_VECTORS: usize = 75 * 4;

/// A textual-inversion embedding: `rows` vectors of `width` values.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedding {
    /// The name the prompt used.
    pub name: String,
    /// The vectors, row after row.
    pub vectors: Vec<f32>,
    /// Values per vector.
    pub width: usize,
}

impl Embedding {
    /// How many tokens the embedding stands for.
    pub fn rows(&self) -> usize {
        self.vectors.len().checked_div(self.width).unwrap_or(0)
    }

    /// Vector `row`.
    pub fn row(&self, row: usize) -> &[f32] {
        &self.vectors[row * self.width..(row + 1) * self.width]
    }

    /// Reads the embedding `name` for the text encoder ComfyUI calls `key` (`clip_l`,
    /// `clip_g`) from the safetensors file at `path`, choosing the tensor as ComfyUI does:
    /// `key` when present, else the `bundle_emb.*.string_to_param.*` (then
    /// `bundle_emb.*.<key>`) tensors of a LoRA bundle, else the first tensor by name
    /// (A1111's `emb_params`, or `string_to_param.*`).
    pub fn load(path: &Path, name: &str, key: &str) -> Result<Embedding, ComputeError> {
        let bad = |e: &dyn std::fmt::Display| ComputeError::invalid(format!("embedding {name:?}: {e}"));
        let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER).map_err(|e| bad(&e))?;
        let names: Vec<&String> = if index.tensors.contains_key(key) {
            index.tensors.keys().filter(|k| *k == key).collect()
        } else {
            let bundled = |suffix: &dyn Fn(&str) -> bool| -> Vec<&String> {
                index
                    .tensors
                    .keys()
                    .filter(|k| k.starts_with("bundle_emb.") && suffix(k))
                    .collect()
            };
            let mut chosen = bundled(&|k| k.contains(".string_to_param."));
            if chosen.is_empty() {
                chosen = bundled(&|k| k.strip_suffix(key).is_some_and(|rest| rest.ends_with('.')));
            }
            if chosen.is_empty() {
                chosen = index.tensors.keys().take(1).collect();
            }
            chosen
        };
        if names.is_empty() {
            return Err(bad(&"the file holds no tensors"));
        }
        let mut vectors = Vec::new();
        let mut width = None;
        for key in names {
            let info = &index.tensors[key];
            let w = match info.shape.as_slice() {
                [w] | [_, w] => *w,
                other => return Err(bad(&format!("tensor {key} has shape {other:?}, not [vectors, width]"))),
            };
            if width.is_some_and(|have| have != w) || w == 0 {
                return Err(bad(&format!("tensor {key} has width {w}, unlike the others")));
            }
            width = Some(w);
            vectors.extend(index.read_f32(key).map_err(|e| bad(&e))?);
        }
        let width = width.unwrap_or(0);
        let embedding = Embedding {
            name: name.to_string(),
            vectors,
            width,
        };
        if embedding.rows() == 0 || embedding.rows() > MAX_VECTORS {
            return Err(bad(&format!(
                "{} vectors; an embedding has 1 to {MAX_VECTORS}",
                embedding.rows()
            )));
        }
        if embedding.vectors.iter().any(|v| !v.is_finite()) {
            return Err(bad(&"the vectors hold non-finite values"));
        }
        Ok(embedding)
    }
}

/// Finds the textual-inversion embeddings a prompt names (`embedding:NAME`).
pub trait EmbeddingLookup {
    /// The embedding called `name` for the text encoder ComfyUI calls `key` (`clip_l`,
    /// `clip_g`; see [`Embedding::load`]); `Ok(None)` when there is none by that name, an
    /// error when the name is not allowed or its file cannot be read.
    fn find_for(&self, name: &str, key: &str) -> Result<Option<Embedding>, ComputeError>;

    /// The embedding called `name` for CLIP ViT-L.
    fn find(&self, name: &str) -> Result<Option<Embedding>, ComputeError> {
        self.find_for(name, CLIP_L_KEY)
    }
}

/// Writes a random A1111-layout embedding (`emb_params`, `[vectors, width]`, values of
/// CLIP token-embedding scale) for tests.
pub fn write_random_embedding(path: &Path, width: usize, vectors: usize, seed: u64) -> std::io::Result<()> {
    let values: Vec<f32> = TorchGenerator::new(seed)
        .randn(width * vectors)
        .into_iter()
        .map(|v| v * 0.02)
        .collect();
    let mut meta = BTreeMap::new();
    meta.insert(
        "weft.generator".to_string(),
        "random textual-inversion test embedding".to_string(),
    );
    write_f32_safetensors(path, &[("emb_params".to_string(), vec![vectors, width], values)], &meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_comfyui_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let write = |file: &str, tensors: &[(&str, Vec<usize>, Vec<f32>)]| {
            let path = dir.path().join(file);
            let tensors: Vec<_> = tensors
                .iter()
                .map(|(n, s, v)| (n.to_string(), s.clone(), v.clone()))
                .collect();
            write_f32_safetensors(&path, &tensors, &BTreeMap::new()).unwrap();
            path
        };
        let a1111 = write_random_embedding(&dir.path().join("a.safetensors"), 4, 3, 1);
        a1111.unwrap();
        let e = Embedding::load(&dir.path().join("a.safetensors"), "a", CLIP_L_KEY).unwrap();
        assert_eq!((e.rows(), e.width), (3, 4));
        let p = write(
            "b.safetensors",
            &[("string_to_param.*", vec![4], vec![1.0, 2.0, 3.0, 4.0])],
        );
        let e = Embedding::load(&p, "b", CLIP_L_KEY).unwrap();
        assert_eq!((e.rows(), e.row(0)), (1, &[1.0, 2.0, 3.0, 4.0][..]));
        // clip_l wins over clip_g (an SDXL embedding's SD1 half).
        let p = write(
            "c.safetensors",
            &[
                ("clip_g", vec![1, 2], vec![9.0, 9.0]),
                ("clip_l", vec![1, 4], vec![1.0; 4]),
            ],
        );
        assert_eq!(Embedding::load(&p, "c", CLIP_L_KEY).unwrap().vectors, vec![1.0; 4]);
        // SDXL's bigG reads its own half.
        assert_eq!(Embedding::load(&p, "c", "clip_g").unwrap().vectors, vec![9.0; 2]);
        // A LoRA bundle's embeddings, concatenated.
        let p = write(
            "d.safetensors",
            &[
                ("bundle_emb.x.string_to_param.*", vec![1, 2], vec![1.0, 2.0]),
                ("bundle_emb.y.string_to_param.*", vec![1, 2], vec![3.0, 4.0]),
                ("lora_te_x.alpha", vec![], vec![1.0]),
            ],
        );
        assert_eq!(
            Embedding::load(&p, "d", CLIP_L_KEY).unwrap().vectors,
            vec![1.0, 2.0, 3.0, 4.0]
        );
        // Bad files are errors.
        let p = write("e.safetensors", &[("x", vec![1, 1, 2], vec![1.0, 2.0])]);
        assert!(Embedding::load(&p, "e", CLIP_L_KEY).is_err());
        let p = write("f.safetensors", &[("x", vec![1, 2], vec![f32::NAN, 2.0])]);
        assert!(Embedding::load(&p, "f", CLIP_L_KEY).is_err());
        let p = write("g.safetensors", &[]);
        assert!(Embedding::load(&p, "g", CLIP_L_KEY).is_err());
        std::fs::write(dir.path().join("h.safetensors"), b"\x10\0\0\0\0\0\0\0{").unwrap();
        assert!(Embedding::load(&dir.path().join("h.safetensors"), "h", CLIP_L_KEY).is_err());
    }
}
