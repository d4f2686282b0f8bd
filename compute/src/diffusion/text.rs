//! The text encoder behind a `CLIP` handle: a checkpoint's CLIP, optionally stopped at an
//! earlier layer (`CLIPSetLastLayer`) or with LoRAs applied, and `CLIPTextEncode`'s encoding
//! with ComfyUI's prompt syntax ([`super::prompt`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Tensor};
use candle_nn::VarBuilder;

use super::checkpoint::ModelError;
use super::lora::{load_component, Lora};
use super::prompt::{encode_with, tokenize, EmbeddingLookup, EncodeSpec};
use crate::interrupt::Interrupt;
use crate::models::sd1::Component;
use crate::models::{ClipText, Sd1Models};
use crate::ComputeError;

/// A checkpoint's text encoders, run up to one of their layers, with LoRAs applied.
pub struct TextEncoder {
    /// The checkpoint's networks.
    pub models: Arc<Sd1Models>,
    /// The checkpoint file, to build encoders patched with LoRAs from.
    pub source: PathBuf,
    /// The last layer used by every encoder (`CLIPSetLastLayer`): -1 is the last one, -2 the
    /// one before, ...; `None` for each encoder's own default (SD1: -1, SDXL: -2).
    pub last_layer: Option<i32>,
    /// The LoRAs applied, with their strengths.
    pub loras: Vec<(Arc<Lora>, f64)>,
    patched: OnceLock<Result<Arc<Vec<ClipText>>, String>>,
}

/// A prompt's encoding.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// `[1, 77 * chunks, context_dim]`: the encoders' outputs side by side.
    pub context: Tensor,
    /// `[1, width]`: the pooled output of the encoder that has one (SDXL's bigG).
    pub pooled: Option<Tensor>,
}

impl TextEncoder {
    /// The whole encoder of `models`, loaded from `source`.
    pub fn new(models: Arc<Sd1Models>, source: PathBuf) -> Self {
        TextEncoder {
            models,
            source,
            last_layer: None,
            loras: Vec::new(),
            patched: OnceLock::new(),
        }
    }

    /// This encoder stopping at layer `last_layer` (-1 is the last one), as
    /// `CLIPSetLastLayer`; an error for 0 or more layers back than the shallowest encoder has.
    pub fn with_last_layer(&self, last_layer: i32) -> Result<TextEncoder, ComputeError> {
        let layers = self.models.config.text.iter().map(|c| c.layers).min().unwrap_or(0) as i32;
        if last_layer >= 0 || last_layer < -layers {
            return Err(ComputeError::invalid(format!(
                "stop_at_clip_layer must be between -{layers} and -1, got {last_layer}"
            )));
        }
        Ok(TextEncoder {
            last_layer: Some(last_layer),
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

    /// `CLIPTextEncode`: `text` with ComfyUI's prompt syntax through every encoder, as
    /// ComfyUI does: SD1's CLIP with the final layer norm on the chosen layer, SDXL's two
    /// without it and side by side (ViT-L first), with bigG's pooled output. `embeddings`
    /// resolves `embedding:NAME` words. `stop` is asked before every layer (then
    /// [`ComputeError::Interrupted`]).
    pub fn encode(
        &self,
        text: &str,
        embeddings: Option<&dyn EmbeddingLookup>,
        stop: Interrupt<'_>,
    ) -> Result<Encoded, ComputeError> {
        self.encode_each(&[text], embeddings, stop)
    }

    /// [`TextEncoder::encode`] with a text per encoder (`CLIPTextEncodeSDXL`'s `text_l` and
    /// `text_g`); one text serves them all.
    pub fn encode_each(
        &self,
        texts: &[&str],
        embeddings: Option<&dyn EmbeddingLookup>,
        stop: Interrupt<'_>,
    ) -> Result<Encoded, ComputeError> {
        let patched;
        let clips: &[ClipText] = if self.loras.is_empty() {
            &self.models.text
        } else {
            patched = self
                .patched
                .get_or_init(|| self.patch().map(Arc::new).map_err(|e| format!("{e:#}")))
                .as_ref()
                .map_err(|e| ComputeError::Failed(format!("text encoding: {e}")))?;
            patched
        };
        let mut contexts = Vec::with_capacity(clips.len());
        let mut pooled = None;
        for (i, (clip, cfg)) in clips.iter().zip(&self.models.config.text).enumerate() {
            let text = texts.get(i).or(texts.first()).copied().unwrap_or("");
            let layer = self.last_layer.unwrap_or(cfg.default_layer);
            let spec = EncodeSpec {
                layers: (cfg.layers as i32 + layer + 1).max(1) as usize,
                norm_hidden: cfg.norm_hidden,
                pad_token: cfg.pad_token,
                pooled: cfg.projection,
            };
            let chunks = tokenize(text, embeddings)?;
            let (hidden, this_pooled) = encode_with(clip, &spec, &chunks, stop)?;
            contexts.push(hidden);
            pooled = pooled.or(this_pooled);
        }
        let context = join_contexts(contexts)?;
        Ok(Encoded { context, pooled })
    }

    /// The checkpoint's text encoders with the LoRAs applied (their weights loaded again and
    /// patched).
    fn patch(&self) -> anyhow::Result<Vec<ClipText>> {
        let cfg = &self.models.config;
        let mut clips = Vec::with_capacity(cfg.text.len());
        for (i, clip) in cfg.text.iter().enumerate() {
            let component = Component::Clip(i);
            let mut tensors = load_component(&self.source, cfg, component, &self.models.device)?;
            for (lora, strength) in &self.loras {
                lora.apply(*strength, component, cfg, &mut tensors)?;
            }
            let vb = VarBuilder::from_tensors(tensors, DType::F32, &self.models.device);
            clips.push(ClipText::new(vb, clip)?);
        }
        Ok(clips)
    }
}

/// The encoders' outputs side by side along the width; texts of different chunk counts
/// are refused (ComfyUI requires them equal too).
fn join_contexts(contexts: Vec<Tensor>) -> Result<Tensor, ComputeError> {
    let failed = |e: candle_core::Error| ComputeError::Failed(format!("text encoding: {e}"));
    if contexts.len() == 1 {
        return Ok(contexts.into_iter().next().expect("one context"));
    }
    let tokens: Vec<usize> = contexts
        .iter()
        .map(|c| c.dim(1))
        .collect::<Result<_, _>>()
        .map_err(failed)?;
    if tokens.windows(2).any(|w| w[0] != w[1]) {
        return Err(ComputeError::invalid(format!(
            "the texts for the two encoders make {tokens:?} tokens; they must be as long in chunks of 75"
        )));
    }
    Tensor::cat(&contexts, 2).map_err(failed)
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
        let a = full.encode("a red apple", None, Interrupt::NEVER).unwrap().context;
        assert_eq!(a.dims(), &[1, 77, 32]);
        let skip = full.with_last_layer(-2).unwrap();
        let b = skip.encode("a red apple", None, Interrupt::NEVER).unwrap().context;
        assert_eq!(b.dims(), a.dims());
        assert!(crate::max_abs_diff(&a, &b) > 0.0);
        // Stopping at the last layer is the whole encoder.
        let same = full
            .with_last_layer(-1)
            .unwrap()
            .encode("a red apple", None, Interrupt::NEVER)
            .unwrap()
            .context;
        assert_eq!(crate::max_abs_diff(&a, &same), 0.0);
        assert!(full.with_last_layer(0).is_err());
        assert!(full.with_last_layer(-3).is_err());
    }
}
