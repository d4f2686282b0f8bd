//! weft's CLIP text transformer (OpenAI's ViT-L/14 text tower for SD1 and SDXL, OpenCLIP's
//! ViT-bigG/14 for SDXL): token and position embeddings, pre-norm encoder layers (causal
//! self-attention, quick-GELU or GELU MLP), a final layer norm and, for bigG, the projection
//! of the pooled output. Unlike candle-transformers' `ClipTextTransformer` it takes input embeddings
//! (textual-inversion vectors stand in for tokens there) and stops after any layer without
//! building a second model (`CLIPSetLastLayer`). Weights are read under candle's names, so
//! the checkpoint mapping of `layout.rs` serves both.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{layer_norm, LayerNorm, VarBuilder};

use crate::interrupt::Interrupt;
use crate::linear::Linear;
use crate::models::layout::{ClipActivation, ClipConfig};

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
    /// `text_projection` as `[in, out]`, for the pooled output.
    projection: Option<Tensor>,
}

/// What [`ClipText::encode`] gives: the chosen layer's output and, when asked, the pooled
/// output.
pub struct ClipOutput {
    /// `[b, n, width]`.
    pub hidden: Tensor,
    /// `[b, width]`: the final-normed last layer at each row's pooling position, through
    /// `text_projection`.
    pub pooled: Option<Tensor>,
}

impl ClipText {
    /// Reads the weights of encoder `cfg` from `vb` (Hugging Face's names, under which
    /// [`super::ldm_to_candle`] puts both layouts: `text_model.*`, and
    /// `text_projection.weight` `[out, in]` or `text_projection.in_out` `[in, out]`).
    pub fn new(vb: VarBuilder, cfg: &ClipConfig) -> Result<Self> {
        let d = cfg.width;
        let text = vb.pp("text_model");
        let embeddings = text.pp("embeddings");
        let layers = (0..cfg.layers)
            .map(|i| EncoderLayer::new(text.pp(format!("encoder.layers.{i}")), cfg))
            .collect::<Result<_>>()?;
        let projection = match cfg.projection {
            false => None,
            true if vb.contains_tensor("text_projection.in_out") => Some(vb.get((d, d), "text_projection.in_out")?),
            true => Some(vb.get((d, d), "text_projection.weight")?.t()?.contiguous()?),
        };
        Ok(ClipText {
            token_embedding: embeddings.get((cfg.vocab, d), "token_embedding.weight")?,
            position_embedding: embeddings.get((cfg.positions, d), "position_embedding.weight")?,
            layers,
            final_norm: layer_norm(d, EPS, text.pp("final_layer_norm"))?,
            heads: cfg.heads,
            projection,
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

    /// The dtype the encoder computes in (its weights').
    pub fn dtype(&self) -> DType {
        self.token_embedding.dtype()
    }

    /// The input embeddings of token ids `ids`, float32 whatever the encoder computes in (so
    /// that they mix with textual-inversion vectors): `[ids.len(), width]`.
    pub fn token_embeddings(&self, ids: &[u32]) -> Result<Tensor> {
        let vocab = self.token_embedding.dim(0)?;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            candle_core::bail!("token id {bad} is outside the vocabulary of {vocab}");
        }
        let ids = Tensor::new(ids, self.token_embedding.device())?;
        self.token_embedding.index_select(&ids, 0)?.to_dtype(DType::F32)
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
        Ok(self.encode(embeds, layers, true, None, stop)?.hidden)
    }

    /// The output of the first `layers` encoder layers on `embeds` (`[b, n, width]`), with
    /// the final layer norm when `norm_hidden`; with `pooled_at` (a position per row) also
    /// the pooled output, which runs every layer. `stop` is asked before every layer. The
    /// outputs are float32 whatever the encoder computes in.
    pub fn encode(
        &self,
        embeds: &Tensor,
        layers: usize,
        norm_hidden: bool,
        pooled_at: Option<&[usize]>,
        stop: Interrupt<'_>,
    ) -> Result<ClipOutput> {
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
        let mut x = embeds.to_dtype(self.dtype())?.broadcast_add(&positions)?;
        let mask = causal_mask(n, embeds.device())?.to_dtype(self.dtype())?;
        let run = if pooled_at.is_some() { self.layers.len() } else { layers };
        let mut hidden = None;
        for (i, layer) in self.layers[..run].iter().enumerate() {
            stop.check()?;
            x = layer.forward(&x, &mask, self.heads)?;
            if i + 1 == layers {
                hidden = Some(x.clone());
            }
        }
        let hidden = hidden.unwrap_or_else(|| x.clone());
        let hidden = if norm_hidden {
            self.final_norm.forward(&hidden)?
        } else {
            hidden
        };
        let pooled = match pooled_at {
            Some(at) => Some(self.pooled(&x, at)?.to_dtype(DType::F32)?),
            None => None,
        };
        Ok(ClipOutput {
            hidden: hidden.to_dtype(DType::F32)?,
            pooled,
        })
    }

    /// The final-normed `last` (`[b, n, width]`) at each row's position in `at`, through the
    /// projection when the encoder has one: `[b, width]`.
    fn pooled(&self, last: &Tensor, at: &[usize]) -> Result<Tensor> {
        let (b, n, _) = last.dims3()?;
        if at.len() != b || at.iter().any(|&p| p >= n) {
            candle_core::bail!("pooling positions {at:?} do not fit {b} rows of {n} tokens");
        }
        let rows = at
            .iter()
            .enumerate()
            .map(|(row, &p)| last.get(row)?.narrow(0, p, 1))
            .collect::<Result<Vec<_>>>()?;
        let picked = self.final_norm.forward(&Tensor::cat(&rows, 0)?)?;
        match &self.projection {
            Some(p) => picked.matmul(p),
            None => Ok(picked),
        }
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
    activation: ClipActivation,
}

impl EncoderLayer {
    fn new(vb: VarBuilder, cfg: &ClipConfig) -> Result<Self> {
        let (d, intermediate) = (cfg.width, cfg.intermediate);
        let attn = vb.pp("self_attn");
        // OpenCLIP stores q, k and v stacked already; Hugging Face's names keep them apart.
        let qkv = if attn.contains_tensor("in_proj.weight") {
            Linear::new(attn.pp("in_proj"), d, 3 * d)?
        } else {
            let parts = [(attn.pp("q_proj"), d), (attn.pp("k_proj"), d), (attn.pp("v_proj"), d)];
            Linear::stacked(&parts, d)?
        };
        Ok(EncoderLayer {
            norm1: layer_norm(d, EPS, vb.pp("layer_norm1"))?,
            qkv,
            out: Linear::new(attn.pp("out_proj"), d, d)?,
            norm2: layer_norm(d, EPS, vb.pp("layer_norm2"))?,
            fc1: Linear::new(vb.pp("mlp.fc1"), d, intermediate)?,
            fc2: Linear::new(vb.pp("mlp.fc2"), intermediate, d)?,
            width: d,
            activation: cfg.activation,
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
        let hidden = match self.activation {
            ClipActivation::QuickGelu => (&hidden * candle_nn::ops::sigmoid(&(&hidden * 1.702)?)?)?,
            ClipActivation::Gelu => hidden.gelu_erf()?,
        };
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
    use crate::models::loader::tiny_test_models;
    use candle_core::DType;
    use candle_transformers::models::clip::text_model::{Activation, ClipTextConfig, ClipTextTransformer};

    /// Same weights through candle-transformers' CLIP and this one.
    #[test]
    fn matches_candle_transformers_clip() {
        let (dir, models) = tiny_test_models(3).unwrap();
        let cfg = &models.config.text[0];
        let path = dir.path().join("tiny.safetensors");
        let tensors = crate::diffusion::lora::load_component(
            &path,
            &models.config,
            crate::models::Component::Clip(0),
            &models.device,
        )
        .unwrap();
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &models.device);
        let config = ClipTextConfig {
            vocab_size: cfg.vocab,
            embed_dim: cfg.width,
            activation: Activation::QuickGelu,
            intermediate_size: cfg.intermediate,
            max_position_embeddings: cfg.positions,
            pad_with: None,
            num_hidden_layers: cfg.layers,
            num_attention_heads: cfg.heads,
            projection_dim: cfg.width,
        };
        let candle = ClipTextTransformer::new(vb.pp("text_model"), &config).unwrap();
        let ids = Tensor::new(&[[49406u32, 320, 1125, 539, 320, 2368, 49407, 49407]], &models.device).unwrap();
        let theirs = candle.forward_with_mask(&ids, usize::MAX).unwrap();
        let ours = models.text[0].forward(&ids).unwrap();
        assert_eq!(ours.dims(), &[1, 8, cfg.width]);
        let diff = crate::max_abs_diff(&ours, &theirs);
        assert!(diff < 1e-4, "differs from candle's CLIP by {diff}");
        // Stopping early uses fewer layers; bad shapes are errors, not panics.
        let embeds = models.text[0]
            .token_embeddings(&[49406, 320, 49407])
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let one = models.text[0].forward_embeddings(&embeds, 1).unwrap();
        let two = models.text[0].forward_embeddings(&embeds, 2).unwrap();
        assert!(crate::max_abs_diff(&one, &two) > 0.0);
        assert!(models.text[0].forward_embeddings(&embeds, 0).is_err());
        assert!(models.text[0].forward_embeddings(&embeds, 3).is_err());
        assert!(models.text[0].token_embeddings(&[60_000]).is_err());
        let long = Tensor::zeros((1, 78, cfg.width), DType::F32, &models.device).unwrap();
        assert!(models.text[0].forward_embeddings(&long, 2).is_err());
    }
}
