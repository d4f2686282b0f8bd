//! The text encoder behind a `CLIP` handle: a checkpoint's CLIP or one loaded from its own
//! files (`CLIPLoader`, `DualCLIPLoader`), optionally stopped at an
//! earlier layer (`CLIPSetLastLayer`) or with LoRAs applied, and `CLIPTextEncode`'s encoding
//! with ComfyUI's prompt syntax ([`super::prompt`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use candle_core::Tensor;
use candle_nn::VarBuilder;

use super::checkpoint::ModelError;
use super::lora::Lora;
use super::prompt::{encode_with, tokenize, tokenize_for, EmbeddingLookup, EncodeSpec};
use super::source::Source;
use crate::interrupt::Interrupt;
use crate::models::layout::Component;
use crate::models::{CheckpointModels, ClipText, TextModels};
use crate::ComputeError;

/// A checkpoint's text encoders, run up to one of their layers, with LoRAs applied.
pub struct TextEncoder {
    /// The text encoders as loaded, with their layout and device.
    pub models: Arc<TextModels>,
    /// The file the encoders were loaded from (a checkpoint, or the first encoder's file).
    pub source: PathBuf,
    /// How to read the encoders' weights again, to patch them with LoRAs.
    origin: Source,
    /// The last layer used by every encoder (`CLIPSetLastLayer`): -1 is the last one, -2 the
    /// one before, ...; `None` for each encoder's own default (SD1: -1, SDXL: -2).
    pub last_layer: Option<i32>,
    /// The LoRAs applied, with their strengths.
    pub loras: Vec<(Arc<Lora>, f64)>,
    patched: OnceLock<Result<Arc<Vec<ClipText>>, String>>,
}

/// The text each of SDXL's encoders reads (`CLIPTextEncodeSDXL`'s `text_l` and `text_g`).
#[derive(Debug, Clone, Copy)]
pub struct EncoderTexts<'a> {
    /// For CLIP ViT-L (SD1's only encoder).
    pub clip_l: &'a str,
    /// For OpenCLIP bigG.
    pub clip_g: &'a str,
}

impl<'a> EncoderTexts<'a> {
    /// The text for the encoder ComfyUI calls `name`.
    fn for_encoder(&self, name: &str) -> &'a str {
        if name == "clip_g" {
            self.clip_g
        } else {
            self.clip_l
        }
    }
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
    pub fn new(models: Arc<CheckpointModels>, source: PathBuf) -> Self {
        let origin = Source::Checkpoint(source.clone());
        Self::from_parts(Arc::new(models.text_part()), source, origin)
    }

    /// The encoders `models` loaded from their own files, one `(path, key prefix)` per encoder
    /// in order (`CLIPLoader`, `DualCLIPLoader`).
    pub fn from_files(models: Arc<TextModels>, files: Vec<(PathBuf, String)>) -> Self {
        let source = files.first().map(|(p, _)| p.clone()).unwrap_or_default();
        Self::from_parts(models, source, Source::Text(files))
    }

    fn from_parts(models: Arc<TextModels>, source: PathBuf, origin: Source) -> Self {
        TextEncoder {
            models,
            source,
            origin,
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
            ..TextEncoder::from_parts(self.models.clone(), self.source.clone(), self.origin.clone())
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
            ..TextEncoder::from_parts(self.models.clone(), self.source.clone(), self.origin.clone())
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
        let texts = EncoderTexts {
            clip_l: text,
            clip_g: text,
        };
        self.encode_each(texts, embeddings, stop)
    }

    /// [`TextEncoder::encode`] with a text per encoder, as `CLIPTextEncodeSDXL` gives them.
    /// Texts of fewer chunks are padded with the empty prompt's chunk, as ComfyUI does.
    pub fn encode_each(
        &self,
        texts: EncoderTexts<'_>,
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
        let configs = &self.models.config.text;
        let mut chunks = configs
            .iter()
            .map(|cfg| tokenize_for(texts.for_encoder(cfg.name), embeddings, cfg.name))
            .collect::<Result<Vec<_>, _>>()?;
        let longest = chunks.iter().map(Vec::len).max().unwrap_or(0);
        let empty = tokenize("", None)?;
        for each in &mut chunks {
            while each.len() < longest {
                each.extend(empty.iter().cloned());
            }
        }
        let mut contexts = Vec::with_capacity(clips.len());
        let mut pooled = None;
        for ((clip, cfg), chunks) in clips.iter().zip(configs).zip(&chunks) {
            let layer = self.last_layer.unwrap_or(cfg.default_layer);
            let spec = EncodeSpec {
                layers: (cfg.layers as i32 + layer + 1).max(1) as usize,
                norm_hidden: cfg.norm_hidden,
                pad_token: cfg.pad_token,
                pooled: cfg.projection,
            };
            let (hidden, this_pooled) = encode_with(clip, &spec, chunks, stop)?;
            contexts.push(hidden);
            pooled = pooled.or(this_pooled);
        }
        let failed = |e: candle_core::Error| ComputeError::Failed(format!("text encoding: {e}"));
        let context = Tensor::cat(&contexts, 2).map_err(failed)?;
        Ok(Encoded { context, pooled })
    }

    /// The checkpoint's text encoders with the LoRAs applied (their weights loaded again and
    /// patched).
    fn patch(&self) -> anyhow::Result<Vec<ClipText>> {
        let cfg = &self.models.config;
        let mut clips = Vec::with_capacity(cfg.text.len());
        for (i, clip) in cfg.text.iter().enumerate() {
            let component = Component::Clip(i);
            let mut tensors = self.origin.load_component(cfg, component, &self.models.device)?;
            for (lora, strength) in &self.loras {
                lora.apply(*strength, component, cfg, &mut tensors)?;
            }
            let vb = VarBuilder::from_tensors(tensors, self.models.precisions.text.dtype(), &self.models.device);
            clips.push(ClipText::new(vb, clip)?);
        }
        Ok(clips)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::loader::tiny_test_models;

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

    /// An SDXL embedding holds a `clip_l` and a `clip_g` tensor; each encoder reads its own.
    #[test]
    fn sdxl_embeddings_give_each_encoder_its_own_vectors() {
        use crate::diffusion::prompt::Embedding;
        use crate::models::safetensors::write_f32_safetensors;
        struct Folder(std::path::PathBuf);
        impl EmbeddingLookup for Folder {
            fn find_for(&self, name: &str, key: &str) -> Result<Option<Embedding>, ComputeError> {
                Embedding::load(&self.0.join(format!("{name}.safetensors")), name, key).map(Some)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-sdxl.safetensors");
        let cfg = crate::models::ModelConfig::tiny_sdxl();
        crate::models::write_random_checkpoint(&path, &cfg, 2).unwrap();
        let models = crate::models::load_models(&path, &cfg, &candle_core::Device::Cpu).unwrap();
        let encoder = TextEncoder::new(Arc::new(models), path);
        let tensors = vec![
            ("clip_l".to_string(), vec![1, 32], vec![0.01; 32]),
            ("clip_g".to_string(), vec![1, 48], vec![0.02; 48]),
        ];
        write_f32_safetensors(&dir.path().join("style.safetensors"), &tensors, &Default::default()).unwrap();
        let folder = Folder(dir.path().to_path_buf());
        let with = encoder
            .encode("a embedding:style", Some(&folder), Interrupt::NEVER)
            .unwrap();
        let without = encoder.encode("a", Some(&folder), Interrupt::NEVER).unwrap();
        assert_eq!(with.context.dims(), &[1, 77, 80]);
        assert!(crate::max_abs_diff(&with.context, &without.context) > 0.0);
        // A file with ViT-L vectors alone does not fit bigG: a clear error, not a panic.
        let only_l = vec![("clip_l".to_string(), vec![1, 32], vec![0.01; 32])];
        write_f32_safetensors(&dir.path().join("sd1.safetensors"), &only_l, &Default::default()).unwrap();
        let refused = encoder.encode("a embedding:sd1", Some(&folder), Interrupt::NEVER);
        assert!(matches!(refused, Err(ComputeError::Invalid(_))), "{:?}", refused.err());
    }
}
