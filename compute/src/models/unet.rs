//! The denoising UNet of SD1.x and SDXL, written for weft's CPU path.
//!
//! Same architecture and parameter names as diffusers' `UNet2DConditionModel` (the names
//! [`super::ldm_to_candle`] maps checkpoints onto). Unlike candle-transformers' version, its
//! layers are weft's CPU kernels: fused attention ([`crate::attention`]: the 1 GiB
//! score matrix of 4096-token self-attention is never allocated), convolutions written NCHW
//! straight from one matrix product ([`crate::conv`]), group norm + SiLU in one pass
//! ([`crate::norm`]), biased linear layers ([`crate::linear`]) and a GEGLU
//! with the exact, erf-based GELU as PyTorch ([`crate::geglu`]; candle-transformers
//! uses the tanh approximation). On a GPU, group norm and GEGLU are weft's CUDA kernels
//! (`compute/src/cuda/`, with the `cuda` feature) and the rest candle's operations, in the
//! precision the UNet's weights were loaded in.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::{layer_norm, LayerNorm, VarBuilder};

use super::layout::{Heads, ModelConfig};
use super::working::{act, attention_scratch, conv_scratch, halved, resnet_bytes, Peak};
use crate::attention::attention;
use crate::conv::Conv2d;
use crate::geglu::geglu;
use crate::interrupt::Interrupt;
use crate::linear::Linear;
use crate::norm::GroupNorm;

/// Groups of every group norm.
pub(super) const GROUPS: usize = 32;

/// The UNet: `forward(latent, timestep, context) -> eps`.
pub struct Unet {
    base_channels: usize,
    time_linear_1: Linear,
    time_linear_2: Linear,
    /// SDXL's `label_emb`: the size-conditioning vector's projection onto the time embedding.
    label_linears: Option<(Linear, Linear)>,
    conv_in: Conv2d,
    down: Vec<Level>,
    mid: Middle,
    up: Vec<Level>,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

/// One resolution level: residual blocks, each followed by a transformer where the level has
/// attention, then a down- or upsampling convolution except at the last level.
pub(super) struct Level {
    resnets: Vec<ResBlock>,
    transformers: Vec<Option<Transformer>>,
    resample: Option<Conv2d>,
}

/// What every transformer of a UNet shares: context width and head split.
#[derive(Clone, Copy)]
pub(super) struct TransformerShape {
    pub(super) context: usize,
    pub(super) heads: Heads,
}

impl Level {
    /// One residual block per entry of `inputs` (its input channels) to `cout` channels, each
    /// followed by a transformer of the depth `depths` gives it (none at 0); `resample` names
    /// the resampling convolution and its stride.
    fn new(
        vb: VarBuilder,
        (inputs, depths): (&[usize], &[usize]),
        cout: usize,
        shape: TransformerShape,
        time_dim: usize,
        resample: Option<(&str, usize)>,
    ) -> Result<Self> {
        let mut level = Level {
            resnets: Vec::with_capacity(inputs.len()),
            transformers: Vec::new(),
            resample: None,
        };
        for (j, (&cin, &depth)) in inputs.iter().zip(depths).enumerate() {
            level
                .resnets
                .push(ResBlock::new(vb.pp(format!("resnets.{j}")), cin, cout, time_dim)?);
            let t = (depth > 0)
                .then(|| Transformer::new(vb.pp(format!("attentions.{j}")), cout, depth, shape))
                .transpose()?;
            level.transformers.push(t);
        }
        if let Some((name, stride)) = resample {
            level.resample = Some(conv3x3(vb.pp(name), cout, cout, stride)?);
        }
        Ok(level)
    }
}

/// The middle block: residual block, transformer (where the layout has one), residual block.
pub(super) type Middle = (ResBlock, Option<Transformer>, ResBlock);

/// The down path of layout `cfg` (`down_blocks.*` under `vb`), shared by the UNet and the
/// ControlNet, which copies it.
pub(super) fn down_levels(vb: &VarBuilder, cfg: &ModelConfig, shape: TransformerShape) -> Result<Vec<Level>> {
    let base = cfg.model_channels;
    let time_dim = 4 * base;
    let channels: Vec<usize> = cfg.channel_mult.iter().map(|m| m * base).collect();
    let levels = channels.len();
    let mut down = Vec::with_capacity(levels);
    let mut cin = base;
    for (i, &cout) in channels.iter().enumerate() {
        let inputs: Vec<usize> = (0..cfg.num_res_blocks)
            .map(|j| if j == 0 { cin } else { cout })
            .collect();
        let depths: Vec<usize> = (0..cfg.num_res_blocks).map(|j| cfg.depth_down(i, j)).collect();
        let downsample = (i + 1 < levels).then_some(("downsamplers.0.conv", 2));
        let level = Level::new(
            vb.pp(format!("down_blocks.{i}")),
            (&inputs, &depths),
            cout,
            shape,
            time_dim,
            downsample,
        )?;
        down.push(level);
        cin = cout;
    }
    Ok(down)
}

/// The middle block of layout `cfg` (`mid_block.*` under `vb`).
pub(super) fn middle_block(vb: &VarBuilder, cfg: &ModelConfig, shape: TransformerShape) -> Result<Middle> {
    let base = cfg.model_channels;
    let time_dim = 4 * base;
    let last = cfg.channel_mult.last().map_or(base, |m| m * base);
    let vb_mid = vb.pp("mid_block");
    Ok((
        ResBlock::new(vb_mid.pp("resnets.0"), last, last, time_dim)?,
        cfg.transformer_depth_middle
            .map(|depth| Transformer::new(vb_mid.pp("attentions.0"), last, depth, shape))
            .transpose()?,
        ResBlock::new(vb_mid.pp("resnets.1"), last, last, time_dim)?,
    ))
}

/// Runs `h` through the down path `levels`, handing every block's output (each residual
/// block with its transformer, each downsampling) to `each`, in order; the last output.
pub(super) fn run_down(
    levels: &[Level],
    mut h: Tensor,
    (emb, context): (&Tensor, &Tensor),
    stop: Interrupt<'_>,
    mut each: impl FnMut(&Tensor) -> Result<()>,
) -> Result<Tensor> {
    for level in levels {
        for (j, resnet) in level.resnets.iter().enumerate() {
            stop.check()?;
            h = resnet.forward(&h, emb)?;
            if let Some(Some(t)) = level.transformers.get(j) {
                h = t.forward(&h, context, stop)?;
            }
            each(&h)?;
        }
        if let Some(conv) = &level.resample {
            stop.check()?;
            h = conv.forward(&h)?;
            each(&h)?;
        }
    }
    Ok(h)
}

/// Runs `h` through the middle block `mid`.
pub(super) fn run_middle(
    mid: &Middle,
    h: &Tensor,
    (emb, context): (&Tensor, &Tensor),
    stop: Interrupt<'_>,
) -> Result<Tensor> {
    stop.check()?;
    let mut h = mid.0.forward(h, emb)?;
    if let Some(t) = &mid.1 {
        h = t.forward(&h, context, stop)?;
    }
    stop.check()?;
    mid.2.forward(&h, emb)
}

/// What a ControlNet adds to a UNet pass (ComfyUI's `control` dictionary): one tensor per
/// skip connection, in the order the down path makes them (`output`), and one for the
/// middle block's output (`middle`). A `None` adds nothing there.
#[derive(Debug, Clone, Default)]
pub struct ControlResiduals {
    /// Added to the skip connections; aligned from the end, as ComfyUI pops both lists.
    pub output: Vec<Option<Tensor>>,
    /// Added to the middle block's output; the last one is used.
    pub middle: Vec<Option<Tensor>>,
}

pub(super) fn conv3x3(vb: VarBuilder, cin: usize, cout: usize, stride: usize) -> Result<Conv2d> {
    Conv2d::new(vb, cin, cout, 3, stride, 1)
}

pub(super) fn conv1x1(vb: VarBuilder, cin: usize, cout: usize) -> Result<Conv2d> {
    Conv2d::new(vb, cin, cout, 1, 1, 0)
}

impl Unet {
    /// Builds the UNet of `cfg` from `vb` (diffusers names: `conv_in`, `down_blocks.0...`).
    pub fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let base = cfg.model_channels;
        let time_dim = 4 * base;
        let channels: Vec<usize> = cfg.channel_mult.iter().map(|m| m * base).collect();
        let levels = channels.len();
        let shape = TransformerShape {
            context: cfg.context_dim,
            heads: cfg.heads,
        };

        let down = down_levels(&vb, cfg, shape)?;
        let mid = middle_block(&vb, cfg, shape)?;
        let last = *channels.last().unwrap_or(&base);

        let mut up = Vec::with_capacity(levels);
        let mut prev = last;
        for i in 0..levels {
            let level_index = levels - 1 - i;
            let cout = channels[level_index];
            // The skip connections of this level: the level's own outputs, then (for the last
            // resnet) the output of the level below it, or of conv_in at the top.
            let skip_last = if level_index == 0 {
                base
            } else {
                channels[level_index - 1]
            };
            let inputs: Vec<usize> = (0..=cfg.num_res_blocks)
                .map(|j| {
                    let from = if j == 0 { prev } else { cout };
                    from + if j == cfg.num_res_blocks { skip_last } else { cout }
                })
                .collect();
            let depths: Vec<usize> = (0..=cfg.num_res_blocks).map(|j| cfg.depth_up(level_index, j)).collect();
            let upsample = (i + 1 < levels).then_some(("upsamplers.0.conv", 1));
            let level = Level::new(
                vb.pp(format!("up_blocks.{i}")),
                (&inputs, &depths),
                cout,
                shape,
                time_dim,
                upsample,
            )?;
            up.push(level);
            prev = cout;
        }

        Ok(Unet {
            base_channels: base,
            time_linear_1: Linear::new(vb.pp("time_embedding.linear_1"), base, time_dim)?,
            time_linear_2: Linear::new(vb.pp("time_embedding.linear_2"), time_dim, time_dim)?,
            label_linears: match cfg.adm_in_channels {
                Some(adm) => Some((
                    Linear::new(vb.pp("add_embedding.linear_1"), adm, time_dim)?,
                    Linear::new(vb.pp("add_embedding.linear_2"), time_dim, time_dim)?,
                )),
                None => None,
            },
            conv_in: conv3x3(vb.pp("conv_in"), cfg.unet_in_channels(), base, 1)?,
            down,
            mid,
            up,
            norm_out: GroupNorm::new(vb.pp("conv_norm_out"), GROUPS, base, 1e-5, true)?,
            conv_out: conv3x3(vb.pp("conv_out"), base, cfg.latent_channels, 1)?,
        })
    }

    /// The dtype the UNet computes in (its weights').
    pub fn dtype(&self) -> DType {
        self.conv_in.dtype()
    }

    /// The predicted noise for `x: [b, c, h, w]` at `timestep` (the same for the whole
    /// batch) under `context: [b, tokens, context_dim]` and, for models with a label
    /// embedding (SDXL), the conditioning vector `y: [b, adm_in_channels]`. The inputs are
    /// cast to [`Unet::dtype`] and the output is float32.
    pub fn forward(&self, x: &Tensor, timestep: f64, context: &Tensor, y: Option<&Tensor>) -> Result<Tensor> {
        self.forward_interruptible(x, timestep, (context, y), Interrupt::NEVER)
    }

    /// [`Unet::forward`], asking `stop` before every block (residual block, transformer,
    /// resampling convolution) and inside attention; once it fires, the pass ends with its
    /// error (see [`Interrupt::requested`]).
    pub fn forward_interruptible(
        &self,
        x: &Tensor,
        timestep: f64,
        (context, y): (&Tensor, Option<&Tensor>),
        stop: Interrupt<'_>,
    ) -> Result<Tensor> {
        crate::on_workers(|| self.forward_here(x, timestep, (context, y), None, stop))
    }

    /// [`Unet::forward_interruptible`] with a ControlNet's residuals added to the skip
    /// connections and the middle block's output, as ComfyUI's `apply_control` adds them.
    pub fn forward_controlled(
        &self,
        x: &Tensor,
        timestep: f64,
        (context, y): (&Tensor, Option<&Tensor>),
        control: Option<&ControlResiduals>,
        stop: Interrupt<'_>,
    ) -> Result<Tensor> {
        crate::on_workers(|| self.forward_here(x, timestep, (context, y), control, stop))
    }

    /// The time embedding, plus the label embedding of `y` where the model has one.
    fn embedding(&self, x: &Tensor, timestep: f64, y: Option<&Tensor>) -> Result<Tensor> {
        let batch = x.dim(0)?;
        let emb = timestep_embedding(timestep, self.base_channels, batch, x)?;
        let emb = self
            .time_linear_2
            .forward(&candle_nn::ops::silu(&self.time_linear_1.forward(&emb)?)?)?;
        match (&self.label_linears, y) {
            (None, None) => Ok(emb),
            (Some((first, second)), Some(y)) => {
                let label = second.forward(&candle_nn::ops::silu(&first.forward(&y.to_dtype(emb.dtype())?)?)?)?;
                emb + label
            }
            (Some(_), None) => candle_core::bail!("this UNet needs a conditioning vector (SDXL's size conditioning)"),
            (None, Some(_)) => candle_core::bail!("this UNet takes no conditioning vector"),
        }
    }

    fn forward_here(
        &self,
        x: &Tensor,
        timestep: f64,
        (context, y): (&Tensor, Option<&Tensor>),
        control: Option<&ControlResiduals>,
        stop: Interrupt<'_>,
    ) -> Result<Tensor> {
        stop.check()?;
        let (x, context) = (&x.to_dtype(self.dtype())?, &context.to_dtype(self.dtype())?);
        let emb = self.embedding(x, timestep, y)?;
        // Every residual block projects silu(emb); compute it once.
        let emb = candle_nn::ops::silu(&emb)?;

        let h = self.conv_in.forward(x)?;
        let mut skips = vec![h.clone()];
        let h = run_down(&self.down, h, (&emb, context), stop, |h| {
            skips.push(h.clone());
            Ok(())
        })?;
        let mut h = run_middle(&self.mid, &h, (&emb, context), stop)?;
        if let Some(control) = control {
            add_control(&mut skips, &mut h, control)?;
        }
        for level in &self.up {
            for (j, resnet) in level.resnets.iter().enumerate() {
                stop.check()?;
                let skip = skips
                    .pop()
                    .ok_or_else(|| candle_core::Error::Msg("UNet: skip connections exhausted".into()))?;
                h = resnet.forward(&Tensor::cat(&[&h, &skip], 1)?, &emb)?;
                if let Some(Some(t)) = level.transformers.get(j) {
                    h = t.forward(&h, context, stop)?;
                }
            }
            if let Some(conv) = &level.resample {
                stop.check()?;
                // Upsample to the size of the skip this level's successor consumes, so that
                // odd sizes (which the stride-2 convolutions round up) line up.
                let (th, tw) = match skips.last() {
                    Some(s) => (s.dim(2)?, s.dim(3)?),
                    None => (2 * h.dim(2)?, 2 * h.dim(3)?),
                };
                h = conv.forward(&h.upsample_nearest2d(th, tw)?)?;
            }
        }
        stop.check()?;
        self.conv_out.forward(&self.norm_out.forward(&h)?)?.to_dtype(DType::F32)
    }
}

impl Unet {
    /// Bytes a forward pass of the UNet of `cfg` allocates at its peak (weights aside) for
    /// `batch` latents of `height` x `width` cells under `tokens` context tokens: its input
    /// and output, the skip connections held from the down path to the up path, the largest
    /// block's temporaries on top of them (a transformer's feed-forward is 8 channels wide
    /// per channel, and with its input, projections and output 15 activations live at once;
    /// an up-path residual block reads the concatenation of its input and a skip), and the
    /// convolution and attention kernels' scratch. Attention never holds its score matrix
    /// (see [`crate::attention`]), so the count grows with the pixels, not their square.
    pub fn working_bytes(cfg: &ModelConfig, batch: usize, (height, width): (usize, usize), tokens: usize) -> u64 {
        let (base, lc) = (cfg.model_channels, cfg.latent_channels);
        let channels: Vec<usize> = cfg.channel_mult.iter().map(|m| m * base).collect();
        let mut sizes = vec![(height, width)];
        while sizes.len() < channels.len() {
            sizes.push(halved(sizes[sizes.len() - 1]));
        }
        let a = |c: usize, level: usize| act(batch, c, sizes[level]);
        let transformer = |c: usize, level: usize| {
            transformer_bytes(batch, (c, cfg.heads.at(c)), sizes[level], (tokens, cfg.context_dim))
        };
        let mut peak = Peak::default();
        // The input batch, its copy in the UNet's dtype, the output and the sampler's view
        // of it; the context.
        let cin_first = cfg.unet_in_channels();
        peak.hold(4 * a(lc, 0) + a(cin_first, 0) + batch as u64 * (tokens * cfg.context_dim) as u64 * 4);
        peak.during(a(base, 0) + conv_scratch(batch, (cin_first, base), sizes[0], 3, 1));
        peak.hold(a(base, 0));
        let mut skips = vec![(base, 0)];
        let mut cin = base;
        for (level, &c) in channels.iter().enumerate() {
            for j in 0..cfg.num_res_blocks {
                peak.during(resnet_bytes(batch, (cin, c), sizes[level]));
                peak.hold(a(c, level));
                if cfg.depth_down(level, j) > 0 {
                    peak.during(transformer(c, level));
                }
                skips.push((c, level));
                cin = c;
            }
            if level + 1 < channels.len() {
                peak.during(a(c, level + 1) + conv_scratch(batch, (c, c), sizes[level], 3, 2));
                peak.hold(a(c, level + 1));
                skips.push((c, level + 1));
            }
        }
        let last = channels.len() - 1;
        peak.during(resnet_bytes(batch, (cin, cin), sizes[last]));
        peak.hold(a(cin, last));
        let middle = match cfg.transformer_depth_middle {
            Some(_) => transformer(cin, last),
            None => 0,
        };
        peak.during(middle.max(resnet_bytes(batch, (cin, cin), sizes[last])));
        let (mut current, mut level) = (cin, last);
        for (i, &c) in channels.iter().enumerate().rev() {
            for j in 0..=cfg.num_res_blocks {
                let Some((skip, _)) = skips.pop() else { break };
                let input = current + skip;
                peak.during(a(input, i) + resnet_bytes(batch, (input, c), sizes[i]));
                peak.release(a(current, level) + a(skip, i));
                peak.hold(a(c, i));
                (current, level) = (c, i);
                if cfg.depth_up(i, j) > 0 {
                    peak.during(transformer(c, i));
                }
            }
            if let Some(&(_, to)) = skips.last() {
                peak.during(2 * a(c, to) + conv_scratch(batch, (c, c), sizes[to], 3, 1));
                peak.release(a(c, i));
                peak.hold(a(c, to));
                level = to;
            }
        }
        peak.during(a(base, 0) + a(lc, 0) + conv_scratch(batch, (base, lc), sizes[0], 3, 1));
        peak.peak()
    }
}

/// Adds `control`'s residuals to `skips` (aligned from the end) and the middle block's
/// output `h`, as ComfyUI's `apply_control` does when the up path pops them.
fn add_control(skips: &mut [Tensor], h: &mut Tensor, control: &ControlResiduals) -> Result<()> {
    if let Some(Some(middle)) = control.middle.last() {
        *h = (&*h + middle.to_dtype(h.dtype())?)?;
    }
    for (skip, residual) in skips.iter_mut().rev().zip(control.output.iter().rev()) {
        if let Some(residual) = residual {
            *skip = (&*skip + residual.to_dtype(skip.dtype())?)?;
        }
    }
    Ok(())
}

/// Bytes of a spatial transformer over `batch` x `size` pixels of `c` channels while it
/// runs (split into `heads`), besides its input, under a context of `(tokens, width)`: during the feed-forward,
/// the tokens, the first norm's output (kept for the block), the 8c-wide projection, the
/// 4c-wide GEGLU and the new tokens (15c); during self-attention, the stacked q/k/v, the
/// heads' outputs before and after they are laid side by side and the projection (8c),
/// with every worker's copy of one head's keys and values.
fn transformer_bytes(
    batch: usize,
    (c, heads): (usize, usize),
    size: (usize, usize),
    (tokens, width): (usize, usize),
) -> u64 {
    let a = |k: usize| act(batch, k * c, size);
    let context = 2 * (batch * tokens * (c + width)) as u64 * 4;
    let attention = a(8) + attention_scratch(size.0 * size.1, c / heads);
    a(15).max(attention) + context
}

/// Sinusoidal embedding of `timestep`, `[cos | sin]` of `timestep · 10000^(-i/half)`, as
/// ComfyUI's `timestep_embedding` (and diffusers with `flip_sin_to_cos`); `[batch, dim]`.
pub(super) fn timestep_embedding(timestep: f64, dim: usize, batch: usize, like: &Tensor) -> Result<Tensor> {
    let half = dim / 2;
    let mut row = vec![0f32; dim];
    for i in 0..half {
        let freq = (-(10000f64.ln()) * i as f64 / half as f64).exp();
        let arg = timestep * freq;
        row[i] = arg.cos() as f32;
        row[half + i] = arg.sin() as f32;
    }
    Tensor::from_vec(row.repeat(batch), (batch, dim), like.device())?.to_dtype(like.dtype())
}

/// Residual block: two group-norm/SiLU/3×3-conv stages with the time embedding added in
/// between, plus a 1×1 shortcut when the channel count changes.
pub(super) struct ResBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    time_proj: Linear,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

impl ResBlock {
    pub(super) fn new(vb: VarBuilder, cin: usize, cout: usize, time_dim: usize) -> Result<Self> {
        Ok(ResBlock {
            norm1: GroupNorm::new(vb.pp("norm1"), GROUPS, cin, 1e-5, true)?,
            conv1: conv3x3(vb.pp("conv1"), cin, cout, 1)?,
            time_proj: Linear::new(vb.pp("time_emb_proj"), time_dim, cout)?,
            norm2: GroupNorm::new(vb.pp("norm2"), GROUPS, cout, 1e-5, true)?,
            conv2: conv3x3(vb.pp("conv2"), cout, cout, 1)?,
            shortcut: if cin == cout {
                None
            } else {
                Some(conv1x1(vb.pp("conv_shortcut"), cin, cout)?)
            },
        })
    }

    /// `emb` is `silu(time embedding)`, `[b, time_dim]`. The time projection is added as
    /// part of `conv1` and the residual as part of `conv2`.
    pub(super) fn forward(&self, x: &Tensor, emb: &Tensor) -> Result<Tensor> {
        let shift = self.time_proj.forward(emb)?;
        let h = self.conv1.forward_fused(&self.norm1.forward(x)?, Some(&shift), None)?;
        let residual = match &self.shortcut {
            Some(conv) => conv.forward(x)?,
            None => x.clone(),
        };
        self.conv2
            .forward_fused(&self.norm2.forward(&h)?, None, Some(&residual))
    }
}

/// Spatial transformer: group norm, projection to tokens (a 1×1 convolution, or SDXL's
/// linear layer, which is the same product), `depth` transformer blocks, projection back,
/// residual.
pub(super) struct Transformer {
    norm: GroupNorm,
    proj_in: Conv2d,
    blocks: Vec<TransformerBlock>,
    proj_out: Conv2d,
}

/// Self-attention, cross-attention on the context and a GEGLU feed-forward, each pre-normed
/// and added to its input.
struct TransformerBlock {
    norm1: LayerNorm,
    attn1: Attention,
    norm2: LayerNorm,
    attn2: Attention,
    norm3: LayerNorm,
    ff_in: Linear,
    ff_out: Linear,
}

impl Transformer {
    fn new(vb: VarBuilder, channels: usize, depth: usize, shape: TransformerShape) -> Result<Self> {
        let heads = shape.heads.at(channels);
        let blocks = (0..depth)
            .map(|i| {
                let block = vb.pp(format!("transformer_blocks.{i}"));
                Ok(TransformerBlock {
                    norm1: layer_norm(channels, 1e-5, block.pp("norm1"))?,
                    attn1: Attention::new(block.pp("attn1"), channels, heads, None)?,
                    norm2: layer_norm(channels, 1e-5, block.pp("norm2"))?,
                    attn2: Attention::new(block.pp("attn2"), channels, heads, Some(shape.context))?,
                    norm3: layer_norm(channels, 1e-5, block.pp("norm3"))?,
                    ff_in: Linear::new(block.pp("ff.net.0.proj"), channels, 8 * channels)?,
                    ff_out: Linear::new(block.pp("ff.net.2"), 4 * channels, channels)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Transformer {
            norm: GroupNorm::new(vb.pp("norm"), GROUPS, channels, 1e-6, false)?,
            proj_in: conv1x1(vb.pp("proj_in"), channels, channels)?,
            blocks,
            proj_out: conv1x1(vb.pp("proj_out"), channels, channels)?,
        })
    }

    /// Tokens stay `[b, h·w, c]` from `proj_in` to `proj_out`, which fold the transposes
    /// into their products; each residual is added by the layer before it.
    pub(super) fn forward(&self, x: &Tensor, context: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let mut t = self.proj_in.forward_to_tokens(&self.norm.forward(x)?)?;
        for block in &self.blocks {
            t = block.forward(&t, context, stop)?;
        }
        self.proj_out.forward_from_tokens(&t, (h, w), x)
    }
}

impl TransformerBlock {
    fn forward(&self, t: &Tensor, context: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let normed = self.norm1.forward(t)?;
        let t = self.attn1.forward(&normed, &normed, t, stop)?;
        stop.check()?;
        let t = self.attn2.forward(&self.norm2.forward(&t)?, context, &t, stop)?;
        stop.check()?;
        let projected = self.ff_in.forward(&self.norm3.forward(&t)?)?;
        self.ff_out.forward_add(&geglu(&projected)?, &t)
    }
}

/// Multi-head attention. Self-attention stacks its query, key and value
/// projections into one product; cross-attention stacks key and value (of the context).
struct Attention {
    /// `[q | k | v]` of the input for self-attention, `q` alone for cross-attention.
    to_q: Linear,
    /// `[k | v]` of the context, for cross-attention.
    to_kv: Option<Linear>,
    to_out: Linear,
    channels: usize,
    heads: usize,
}

impl Attention {
    /// Self-attention when `context_dim` is `None`.
    fn new(vb: VarBuilder, dim: usize, heads: usize, context_dim: Option<usize>) -> Result<Self> {
        let (to_q, to_kv) = match context_dim {
            None => {
                let parts = [(vb.pp("to_q"), dim), (vb.pp("to_k"), dim), (vb.pp("to_v"), dim)];
                (Linear::stacked_without_bias(&parts, dim)?, None)
            }
            Some(context_dim) => {
                let kv = [(vb.pp("to_k"), dim), (vb.pp("to_v"), dim)];
                (
                    Linear::stacked_without_bias(&[(vb.pp("to_q"), dim)], dim)?,
                    Some(Linear::stacked_without_bias(&kv, context_dim)?),
                )
            }
        };
        Ok(Attention {
            to_q,
            to_kv,
            to_out: Linear::new(vb.pp("to_out.0"), dim, dim)?,
            channels: dim,
            heads,
        })
    }

    /// `residual + attention(x, context)`; `context` is only read by cross-attention.
    fn forward(&self, x: &Tensor, context: &Tensor, residual: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let c = self.channels;
        let projected = self.to_q.forward(x)?;
        let (q, k, v) = match &self.to_kv {
            None => (
                projected.narrow(2, 0, c)?,
                projected.narrow(2, c, c)?,
                projected.narrow(2, 2 * c, c)?,
            ),
            Some(to_kv) => {
                let kv = to_kv.forward(context)?;
                (projected, kv.narrow(2, 0, c)?, kv.narrow(2, c, c)?)
            }
        };
        let scale = 1.0 / ((c / self.heads) as f64).sqrt();
        self.to_out
            .forward_add(&attention(&q, &k, &v, self.heads, scale, stop)?, residual)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;
    use candle_transformers::models::stable_diffusion::unet_2d::{
        BlockConfig, UNet2DConditionModel, UNet2DConditionModelConfig,
    };

    /// candle-transformers' configuration of the same UNet.
    fn unet_config(cfg: &ModelConfig) -> UNet2DConditionModelConfig {
        let blocks = cfg
            .channel_mult
            .iter()
            .enumerate()
            .map(|(level, &m)| BlockConfig {
                out_channels: m * cfg.model_channels,
                use_cross_attn: cfg.level_has_attention(level).then_some(1),
                attention_head_dim: 8,
            })
            .collect();
        UNet2DConditionModelConfig {
            blocks,
            layers_per_block: cfg.num_res_blocks,
            cross_attention_dim: cfg.context_dim,
            use_linear_projection: false,
            ..Default::default()
        }
    }

    /// Same weights through candle-transformers' UNet and this one: equal up to the GELU
    /// difference (tanh approximation there, exact here) and float reassociation.
    #[test]
    fn matches_candle_transformers_unet() {
        let dev = Device::Cpu;
        let mut cfg = ModelConfig::tiny();
        // Three levels and two resnets per level cover every skip-connection rule; an odd
        // latent size covers the upsampling to the skip's size.
        cfg.channel_mult = vec![1, 2, 2];
        cfg.num_res_blocks = 2;
        cfg.transformer_depth = vec![1, 1, 1, 1, 0, 0];
        cfg.transformer_depth_output = vec![1, 1, 1, 1, 1, 1, 0, 0, 0];
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let theirs = UNet2DConditionModel::new(vb.clone(), 4, 4, false, unet_config(&cfg)).unwrap();
        let ours = Unet::new(vb, &cfg).unwrap();
        for (h, w) in [(16, 16), (13, 10)] {
            let x = Tensor::randn(0f32, 1.0, (2, 4, h, w), &dev).unwrap();
            let ctx = Tensor::randn(0f32, 1.0, (2, 77, cfg.context_dim), &dev).unwrap();
            let want = theirs.forward(&x, 421.0, &ctx).unwrap();
            let got = ours.forward(&x, 421.0, &ctx, None).unwrap();
            assert_eq!(got.dims(), want.dims());
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let diff = crate::max_abs_diff(&got, &want);
            assert!(scale > 0.1, "a degenerate output proves nothing: {scale}");
            assert!(
                diff < 1e-3 * scale,
                "{h}x{w}: max difference {diff} against max |eps| {scale}"
            );
        }
    }

    #[test]
    fn missing_weights_are_an_error() {
        let vb = VarBuilder::from_tensors(Default::default(), DType::F32, &Device::Cpu);
        assert!(Unet::new(vb, &ModelConfig::tiny()).is_err());
    }
}
