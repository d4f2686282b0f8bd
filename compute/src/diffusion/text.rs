//! The text encoder behind a `CLIP` handle: a checkpoint's CLIP, optionally stopped at an
//! earlier layer (`CLIPSetLastLayer`) or with LoRAs applied, and `CLIPTextEncode`'s encoding
//! with ComfyUI's prompt syntax ([`super::prompt`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use super::checkpoint::ModelError;
use super::lora::{load_component, Lora};
use super::prompt::{encode_prompt_interruptible, EmbeddingLookup};
use crate::interrupt::Interrupt;
use crate::models::sd1::Component;
use crate::models::{ClipText, Sd1Models};
use crate::ComputeError;

/// A checkpoint's text encoder, run up to one of its layers, with LoRAs applied.
pub struct TextEncoder {
    /// The checkpoint's networks.
    pub models: Arc<Sd1Models>,
    /// The checkpoint file, to build an encoder patched with LoRAs from.
    pub source: PathBuf,
    /// The last layer used: -1 is the last one, -2 the one before, ...
    pub last_layer: i32,
    /// The LoRAs applied, with their strengths.
    pub loras: Vec<(Arc<Lora>, f64)>,
    patched: OnceLock<Result<Arc<ClipText>, String>>,
}

impl TextEncoder {
    /// The whole encoder of `models`, loaded from `source`.
    pub fn new(models: Arc<Sd1Models>, source: PathBuf) -> Self {
        TextEncoder {
            models,
            source,
            last_layer: -1,
            loras: Vec::new(),
            patched: OnceLock::new(),
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
            loras: self.loras.clone(),
            ..TextEncoder::new(self.models.clone(), self.source.clone())
        })
    }

    /// This encoder with `lora` added at `strength` (`LoraLoader`).
    pub fn with_lora(&self, lora: Arc<Lora>, strength: f64) -> Result<TextEncoder, ModelError> {
        lora.check_fits(&self.models.config)?;
        let mut loras = self.loras.clone();
        loras.push((lora, strength));
        Ok(TextEncoder {
            last_layer: self.last_layer,
            loras,
            ..TextEncoder::new(self.models.clone(), self.source.clone())
        })
    }

    /// `CLIPTextEncode`: `text` with ComfyUI's prompt syntax encoded as
    /// `[1, 77 * chunks, context_dim]` float32, the final layer norm applied to the chosen
    /// layer's output (ComfyUI's SD1 CLIP); `embeddings` resolves `embedding:NAME` words.
    /// `stop` is asked before every layer (then [`ComputeError::Interrupted`]).
    pub fn encode(
        &self,
        text: &str,
        embeddings: Option<&dyn EmbeddingLookup>,
        stop: Interrupt<'_>,
    ) -> Result<Tensor, ComputeError> {
        let layers = (self.models.config.clip_layers as i32 + self.last_layer + 1) as usize;
        if self.loras.is_empty() {
            return encode_prompt_interruptible(&self.models.clip, layers, text, embeddings, stop);
        }
        let clip = self
            .patched
            .get_or_init(|| self.patch().map(Arc::new).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| ComputeError::Failed(format!("text encoding: {e}")))?;
        encode_prompt_interruptible(clip, layers, text, embeddings, stop)
    }

    /// The checkpoint's CLIP with the LoRAs applied (its weights loaded again and patched).
    fn patch(&self) -> anyhow::Result<ClipText> {
        let cfg = &self.models.config;
        let mut tensors = load_component(&self.source, cfg, Component::Clip, &self.models.device)?;
        for (lora, strength) in &self.loras {
            lora.apply(*strength, Component::Clip, cfg, &mut tensors)?;
        }
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &self.models.device);
        Ok(ClipText::new(vb.pp("text_model"), cfg)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::candle_sd1::tiny_test_models;

    #[test]
    fn earlier_layers_give_other_encodings() {
        let (dir, models) = tiny_test_models(7).unwrap();
        let path = dir.path().join("tiny.safetensors");
        let full = TextEncoder::new(Arc::new(models), path);
        let a = full.encode("a red apple", None, Interrupt::NEVER).unwrap();
        assert_eq!(a.dims(), &[1, 77, 32]);
        let skip = full.with_last_layer(-2).unwrap();
        let b = skip.encode("a red apple", None, Interrupt::NEVER).unwrap();
        assert_eq!(b.dims(), a.dims());
        assert!(crate::max_abs_diff(&a, &b) > 0.0);
        // Stopping at the last layer is the whole encoder.
        let same = full
            .with_last_layer(-1)
            .unwrap()
            .encode("a red apple", None, Interrupt::NEVER)
            .unwrap();
        assert_eq!(crate::max_abs_diff(&a, &same), 0.0);
        assert!(full.with_last_layer(0).is_err());
        assert!(full.with_last_layer(-3).is_err());
    }
}
