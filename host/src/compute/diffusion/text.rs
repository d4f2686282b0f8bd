//! The text encoder behind a `CLIP` handle: a checkpoint's CLIP, optionally stopped at an
//! earlier layer (`CLIPSetLastLayer`), and `CLIPTextEncode`'s encoding.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::clip::text_model::ClipTextTransformer;

use super::super::models::candle_sd1::clip_config;
use super::super::models::sd1::{ldm_to_candle, Component};
use super::super::models::Sd1Models;
use super::super::tokenizer::ClipTokenizer;
use super::super::{on_workers, ComputeError};

/// A checkpoint's text encoder, run up to one of its layers.
pub struct TextEncoder {
    /// The checkpoint's networks.
    pub models: Arc<Sd1Models>,
    /// The checkpoint file, to build a shortened encoder from.
    pub source: PathBuf,
    /// The last layer used: -1 is the last one, -2 the one before, ...
    pub last_layer: i32,
    shortened: OnceLock<Result<Arc<ClipTextTransformer>, String>>,
}

impl TextEncoder {
    /// The whole encoder of `models`, loaded from `source`.
    pub fn new(models: Arc<Sd1Models>, source: PathBuf) -> Self {
        TextEncoder {
            models,
            source,
            last_layer: -1,
            shortened: OnceLock::new(),
        }
    }

    /// This encoder stopping at layer `last_layer` (-1 is the last one), as
    /// `CLIPSetLastLayer`; an error for 0 or more layers back than there are.
    pub fn with_last_layer(&self, last_layer: i32) -> Result<TextEncoder, ComputeError> {
        let layers = self.models.config.clip_layers as i32;
        if last_layer >= 0 || last_layer < -layers {
            return Err(ComputeError::invalid(format!(
                "stop_at_clip_layer must be between -{layers} and -1, got {last_layer}"
            )));
        }
        Ok(TextEncoder {
            last_layer,
            ..TextEncoder::new(self.models.clone(), self.source.clone())
        })
    }

    /// `CLIPTextEncode`: `text` encoded as `[1, 77, context_dim]` float32, the final layer
    /// norm applied to the chosen layer's output (ComfyUI's SD1 CLIP).
    pub fn encode(&self, text: &str) -> Result<Tensor, ComputeError> {
        let failed = |e: &dyn std::fmt::Display| ComputeError::Failed(format!("text encoding: {e}"));
        if self.last_layer == -1 {
            return super::super::text_to_image::encode_text(&self.models, text).map_err(|e| failed(&e));
        }
        let clip = self
            .shortened
            .get_or_init(|| self.build_shortened().map(Arc::new).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| failed(e))?;
        let ids = ClipTokenizer::shared().encode_padded(text);
        let run = || -> candle_core::Result<Tensor> {
            let ids = Tensor::new(ids.as_slice(), &self.models.device)?.unsqueeze(0)?;
            on_workers(|| clip.forward_with_mask(&ids, usize::MAX))
        };
        run().map_err(|e| failed(&e))
    }

    /// A CLIP of the checkpoint's first `layers + last_layer + 1` layers: candle's encoder
    /// cannot stop early, so the layers are loaded again (shared with nothing).
    fn build_shortened(&self) -> anyhow::Result<ClipTextTransformer> {
        let cfg = &self.models.config;
        let mut config = clip_config(cfg);
        config.num_hidden_layers = (cfg.clip_layers as i32 + self.last_layer + 1) as usize;
        // SAFETY: a checkpoint the cache validated and loaded; like every mmap-based loader
        // this assumes the operator does not rewrite it while it is mapped.
        let mm = unsafe { candle_core::safetensors::MmapedSafetensors::new(&self.source) }
            .with_context(|| format!("memory-mapping {}", self.source.display()))?;
        let mut tensors = HashMap::new();
        for (name, _) in mm.tensors() {
            if let Some((Component::Clip, target)) = ldm_to_candle(&name, cfg) {
                let t = mm.load(&name, &self.models.device)?.to_dtype(DType::F32)?;
                tensors.insert(target, t);
            }
        }
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &self.models.device);
        Ok(ClipTextTransformer::new(vb.pp("text_model"), &config)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::models::candle_sd1::tiny_test_models;

    #[test]
    fn earlier_layers_give_other_encodings() {
        let (dir, models) = tiny_test_models(7).unwrap();
        let path = dir.path().join("tiny.safetensors");
        let full = TextEncoder::new(Arc::new(models), path);
        let a = full.encode("a red apple").unwrap();
        assert_eq!(a.dims(), &[1, 77, 32]);
        let skip = full.with_last_layer(-2).unwrap();
        let b = skip.encode("a red apple").unwrap();
        assert_eq!(b.dims(), a.dims());
        assert!(crate::compute::max_abs_diff(&a, &b) > 0.0);
        // Stopping at the last layer is the whole encoder.
        let same = full.with_last_layer(-1).unwrap().encode("a red apple").unwrap();
        assert_eq!(crate::compute::max_abs_diff(&a, &same), 0.0);
        assert!(full.with_last_layer(0).is_err());
        assert!(full.with_last_layer(-3).is_err());
    }
}
