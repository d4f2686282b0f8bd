//! weft's CLIP text transformer (OpenAI's ViT-L/14 text tower for SD1): token and position
//! embeddings, pre-norm encoder layers (causal self-attention, quick-GELU MLP) and a final
//! layer norm. Unlike candle-transformers' `ClipTextTransformer` it takes input embeddings
//! (textual-inversion vectors stand in for tokens there) and stops after any layer without
//! building a second model (`CLIPSetLastLayer`). Weights are read under candle's names, so
//! the checkpoint mapping of `sd1.rs` serves both.

use candle_core::{Module, Result, Tensor};
use candle_nn::{layer_norm, LayerNorm, VarBuilder};

use crate::interrupt::Interrupt;
use crate::linear::Linear;
use crate::models::sd1::Sd1Config;

/// CLIP's layer-norm epsilon.
const EPS: f64 = 1e-5;

/// A CLIP text transformer.
#[derive(Debug, Clone)]
pub struct ClipText {
    token_embedding: Tensor,
    position_embedding: Tensor,
    layers: Vec<EncoderLayer>,
    final_norm: LayerNorm,
    heads: usize,
}

impl ClipText {
    /// Reads the weights of layout `cfg` from `vb` (candle's `text_model` names).
    pub fn new(vb: VarBuilder, cfg: &Sd1Config) -> Result<Self> {
        let d = cfg.context_dim;
        let embeddings = vb.pp("embeddings");
        let layers = (0..cfg.clip_layers)
            .map(|i| EncoderLayer::new(vb.pp(format!("encoder.layers.{i}")), d, cfg.clip_intermediate))
            .collect::<Result<_>>()?;
        Ok(ClipText {
            token_embedding: embeddings.get((cfg.clip_vocab, d), "token_embedding.weight")?,
            position_embedding: embeddings.get((cfg.clip_positions, d), "position_embedding.weight")?,
            layers,
            final_norm: layer_norm(d, EPS, vb.pp("final_layer_norm"))?,
            heads: cfg.clip_heads,
        })
    }

    /// Encoder layers.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Width of a token's embedding (SD1's context dimension).
    pub fn width(&self) -> usize {
        self.token_embedding.dim(1).unwrap_or(0)
    }

    /// Token positions the model has embeddings for.
    pub fn positions(&self) -> usize {
        self.position_embedding.dim(0).unwrap_or(0)
    }

    /// The input embeddings of token ids `ids`: `[ids.len(), width]`.
    pub fn token_embeddings(&self, ids: &[u32]) -> Result<Tensor> {
        let vocab = self.token_embedding.dim(0)?;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            candle_core::bail!("token id {bad} is outside the vocabulary of {vocab}");
        }
        let ids = Tensor::new(ids, self.token_embedding.device())?;
        self.token_embedding.index_select(&ids, 0)
    }

    /// The whole transformer on token ids `ids` (`[b, n]`): `[b, n, width]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, n) = ids.dims2()?;
        let flat: Vec<u32> = ids.flatten_all()?.to_vec1()?;
        let embeds = self.token_embeddings(&flat)?.reshape((b, n, self.width()))?;
        self.forward_embeddings(&embeds, self.layers.len())
    }

    /// The transformer on input embeddings `embeds` (`[b, n, width]`, `n` at most
    /// [`ClipText::positions`]), stopped after its first `layers` encoder layers, with the
    /// final layer norm applied to that layer's output (as ComfyUI's SD1 CLIP does).
    pub fn forward_embeddings(&self, embeds: &Tensor, layers: usize) -> Result<Tensor> {
        self.forward_embeddings_interruptible(embeds, layers, Interrupt::NEVER)
    }

    /// [`ClipText::forward_embeddings`], asking `stop` before every encoder layer.
    pub fn forward_embeddings_interruptible(
        &self,
        embeds: &Tensor,
        layers: usize,
        stop: Interrupt<'_>,
    ) -> Result<Tensor> {
        let (_, n, d) = embeds.dims3()?;
        if n > self.positions() || d != self.width() || layers == 0 || layers > self.layers.len() {
            candle_core::bail!(
                "CLIP takes up to {} tokens of width {} through 1 to {} layers, got {:?} through {layers}",
                self.positions(),
                self.width(),
                self.layers.len(),
                embeds.dims()
            );
        }
        let positions = self.position_embedding.narrow(0, 0, n)?;
        let mut x = embeds.broadcast_add(&positions)?;
        let mask = causal_mask(n, embeds.device())?;
        for layer in &self.layers[..layers] {
            stop.check()?;
            x = layer.forward(&x, &mask, self.heads)?;
        }
        self.final_norm.forward(&x)
    }
}

/// `0` on and below the diagonal, `-inf` above: token `i` sees tokens `0..=i`.
fn causal_mask(n: usize, device: &candle_core::Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..n)
        .flat_map(|i| (0..n).map(move |j| if j > i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(values, (n, n), device)
}

/// One pre-norm encoder layer: causal self-attention and a quick-GELU MLP, each added to
/// its input.
#[derive(Debug, Clone)]
struct EncoderLayer {
    norm1: LayerNorm,
    /// `[q | k | v]` projections stacked into one product.
    qkv: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    width: usize,
}

impl EncoderLayer {
    fn new(vb: VarBuilder, d: usize, intermediate: usize) -> Result<Self> {
        let attn = vb.pp("self_attn");
        let parts = [(attn.pp("q_proj"), d), (attn.pp("k_proj"), d), (attn.pp("v_proj"), d)];
        Ok(EncoderLayer {
            norm1: layer_norm(d, EPS, vb.pp("layer_norm1"))?,
            qkv: Linear::stacked(&parts, d)?,
            out: Linear::new(attn.pp("out_proj"), d, d)?,
            norm2: layer_norm(d, EPS, vb.pp("layer_norm2"))?,
            fc1: Linear::new(vb.pp("mlp.fc1"), d, intermediate)?,
            fc2: Linear::new(vb.pp("mlp.fc2"), intermediate, d)?,
            width: d,
        })
    }

    fn forward(&self, x: &Tensor, mask: &Tensor, heads: usize) -> Result<Tensor> {
        let d = self.width;
        let qkv = self.qkv.forward(&self.norm1.forward(x)?)?;
        let attended = causal_attention(
            &qkv.narrow(2, 0, d)?,
            &qkv.narrow(2, d, d)?,
            &qkv.narrow(2, 2 * d, d)?,
            mask,
            heads,
        )?;
        let x = self.out.forward_add(&attended, x)?;
        let hidden = self.fc1.forward(&self.norm2.forward(&x)?)?;
        let hidden = (&hidden * candle_nn::ops::sigmoid(&(&hidden * 1.702)?)?)?;
        self.fc2.forward_add(&hidden, &x)
    }
}

/// `softmax(q kᵀ / √d + mask) v` per head for `[b, n, heads·d]` inputs.
fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, n, width) = q.dims3()?;
    let d = width / heads;
    let split = |x: &Tensor| {
        x.reshape((b, n, heads, d))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * heads, n, d))
    };
    let (q, k, v) = (split(q)?, split(k)?, split(v)?);
    let scores = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
    let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(mask)?)?;
    probs
        .matmul(&v)?
        .reshape((b, heads, n, d))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((b, n, width))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::candle_sd1::tiny_test_models;
    use candle_core::DType;
    use candle_transformers::models::clip::text_model::{Activation, ClipTextConfig, ClipTextTransformer};

    /// Same weights through candle-transformers' CLIP and this one.
    #[test]
    fn matches_candle_transformers_clip() {
        let (dir, models) = tiny_test_models(3).unwrap();
        let cfg = &models.config;
        let path = dir.path().join("tiny.safetensors");
        let tensors =
            crate::diffusion::lora::load_component(&path, cfg, crate::models::Component::Clip, &models.device).unwrap();
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &models.device);
        let config = ClipTextConfig {
            vocab_size: cfg.clip_vocab,
            embed_dim: cfg.context_dim,
            activation: Activation::QuickGelu,
            intermediate_size: cfg.clip_intermediate,
            max_position_embeddings: cfg.clip_positions,
            pad_with: None,
            num_hidden_layers: cfg.clip_layers,
            num_attention_heads: cfg.clip_heads,
            projection_dim: cfg.context_dim,
        };
        let candle = ClipTextTransformer::new(vb.pp("text_model"), &config).unwrap();
        let ids = Tensor::new(&[[49406u32, 320, 1125, 539, 320, 2368, 49407, 49407]], &models.device).unwrap();
        let theirs = candle.forward_with_mask(&ids, usize::MAX).unwrap();
        let ours = models.clip.forward(&ids).unwrap();
        assert_eq!(ours.dims(), &[1, 8, cfg.context_dim]);
        let diff = crate::max_abs_diff(&ours, &theirs);
        assert!(diff < 1e-4, "differs from candle's CLIP by {diff}");
        // Stopping early uses fewer layers; bad shapes are errors, not panics.
        let embeds = models
            .clip
            .token_embeddings(&[49406, 320, 49407])
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let one = models.clip.forward_embeddings(&embeds, 1).unwrap();
        let two = models.clip.forward_embeddings(&embeds, 2).unwrap();
        assert!(crate::max_abs_diff(&one, &two) > 0.0);
        assert!(models.clip.forward_embeddings(&embeds, 0).is_err());
        assert!(models.clip.forward_embeddings(&embeds, 3).is_err());
        assert!(models.clip.token_embeddings(&[60_000]).is_err());
        let long = Tensor::zeros((1, 78, cfg.context_dim), DType::F32, &models.device).unwrap();
        assert!(models.clip.forward_embeddings(&long, 2).is_err());
    }
}
