//! ControlNet for SD1.x (ComfyUI's `comfy.cldm.cldm.ControlNet`): a copy of the UNet's time
//! embedding, input convolution, down path and middle block, with a hint encoder (eight
//! convolutions, three of them halving, from the control image to the UNet's base width,
//! added after the input convolution) and a 1x1 "zero" convolution on every block's output.
//! Its outputs are [`ControlResiduals`] for [`Unet::forward_controlled`](super::Unet).
//!
//! The blocks are the UNet's own ([`super::unet`]); parameters use diffusers' names, as the
//! UNet's do. [`load`] reads a file in either of the layouts ComfyUI's `load_controlnet`
//! reads (the original one, with or without `control_model.`, and diffusers').

mod load;

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::layout::ModelConfig;
use super::unet::{
    conv1x1, conv3x3, down_levels, middle_block, run_down, run_middle, timestep_embedding, ControlResiduals, Level,
    Middle, TransformerShape,
};
use crate::conv::Conv2d;
use crate::interrupt::Interrupt;
use crate::linear::Linear;

pub use load::{load, rename_original, ControlNetFile, ControlNetKeys};

/// The hint encoder's convolutions: output channels and stride; a SiLU follows each but the
/// last, which outputs the UNet's base width.
const HINT_CONVS: [(usize, usize); 7] = [(16, 1), (16, 1), (32, 2), (32, 1), (96, 2), (96, 1), (256, 2)];

/// A ControlNet: `forward(latent, hint, timestep, context) -> residuals`.
pub struct ControlNet {
    config: ModelConfig,
    hint_channels: usize,
    time_linear_1: Linear,
    time_linear_2: Linear,
    label_linears: Option<(Linear, Linear)>,
    hint: Vec<Conv2d>,
    conv_in: Conv2d,
    down: Vec<Level>,
    mid: Middle,
    zero_convs: Vec<Conv2d>,
    mid_out: Conv2d,
}

impl ControlNet {
    /// Builds the ControlNet of UNet layout `cfg` over a `hint_channels`-channel control
    /// image from `vb` (diffusers' names: `controlnet_cond_embedding.*`,
    /// `controlnet_down_blocks.*`, `controlnet_mid_block`, and the UNet's).
    pub fn new(vb: VarBuilder, cfg: &ModelConfig, hint_channels: usize) -> Result<Self> {
        let base = cfg.model_channels;
        let time_dim = 4 * base;
        let shape = TransformerShape {
            context: cfg.context_dim,
            heads: cfg.heads,
        };
        let embedding = vb.pp("controlnet_cond_embedding");
        let mut hint = Vec::with_capacity(HINT_CONVS.len() + 1);
        let mut cin = hint_channels;
        for (i, &(cout, stride)) in HINT_CONVS.iter().enumerate() {
            let name = if i == 0 {
                "conv_in".to_string()
            } else {
                format!("blocks.{}", i - 1)
            };
            hint.push(conv3x3(embedding.pp(name), cin, cout, stride)?);
            cin = cout;
        }
        hint.push(conv3x3(embedding.pp("conv_out"), cin, base, 1)?);
        let down = down_levels(&vb, cfg, shape)?;
        let mut zero_channels = vec![base];
        for (level, m) in cfg.channel_mult.iter().enumerate() {
            zero_channels.extend(std::iter::repeat_n(m * base, cfg.num_res_blocks));
            if level + 1 < cfg.channel_mult.len() {
                zero_channels.push(m * base);
            }
        }
        let zero_convs = zero_channels
            .iter()
            .enumerate()
            .map(|(i, &c)| conv1x1(vb.pp(format!("controlnet_down_blocks.{i}")), c, c))
            .collect::<Result<_>>()?;
        let last = cfg.channel_mult.last().map_or(base, |m| m * base);
        Ok(ControlNet {
            config: cfg.clone(),
            hint_channels,
            time_linear_1: Linear::new(vb.pp("time_embedding.linear_1"), base, time_dim)?,
            time_linear_2: Linear::new(vb.pp("time_embedding.linear_2"), time_dim, time_dim)?,
            label_linears: match cfg.adm_in_channels {
                Some(adm) => Some((
                    Linear::new(vb.pp("add_embedding.linear_1"), adm, time_dim)?,
                    Linear::new(vb.pp("add_embedding.linear_2"), time_dim, time_dim)?,
                )),
                None => None,
            },
            hint,
            conv_in: conv3x3(vb.pp("conv_in"), cfg.latent_channels, base, 1)?,
            down,
            mid: middle_block(&vb, cfg, shape)?,
            zero_convs,
            mid_out: conv1x1(vb.pp("controlnet_mid_block"), last, last)?,
        })
    }

    /// The UNet layout this ControlNet copies.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Channels of the control image it reads (3 for an RGB hint).
    pub fn hint_channels(&self) -> usize {
        self.hint_channels
    }

    /// The dtype it computes in (its weights').
    pub fn dtype(&self) -> DType {
        self.conv_in.dtype()
    }

    /// The residuals for the UNet pass over `x: [b, c, h, w]` (already scaled as the UNet
    /// reads it) at `timestep`, guided by `hint: [b, hint_channels, 8h, 8w]` under
    /// `context` and, for models with a label embedding, `y`; float32. Asks `stop` between
    /// blocks.
    pub fn forward(
        &self,
        (x, hint): (&Tensor, &Tensor),
        timestep: f64,
        (context, y): (&Tensor, Option<&Tensor>),
        stop: Interrupt<'_>,
    ) -> Result<ControlResiduals> {
        crate::on_workers(|| self.forward_here((x, hint), timestep, (context, y), stop))
    }

    fn forward_here(
        &self,
        (x, hint): (&Tensor, &Tensor),
        timestep: f64,
        (context, y): (&Tensor, Option<&Tensor>),
        stop: Interrupt<'_>,
    ) -> Result<ControlResiduals> {
        stop.check()?;
        let dtype = self.dtype();
        let (x, context) = (&x.to_dtype(dtype)?, &context.to_dtype(dtype)?);
        let emb = timestep_embedding(timestep, self.config.model_channels, x.dim(0)?, x)?;
        let mut emb = self
            .time_linear_2
            .forward(&candle_nn::ops::silu(&self.time_linear_1.forward(&emb)?)?)?;
        let guided = self.encode_hint(&hint.to_dtype(dtype)?, stop)?;
        match (&self.label_linears, y) {
            (Some((first, second)), Some(y)) => {
                let label = second.forward(&candle_nn::ops::silu(&first.forward(&y.to_dtype(dtype)?)?)?)?;
                emb = (emb + label)?;
            }
            (Some(_), None) => candle_core::bail!("this ControlNet needs a conditioning vector (SDXL's)"),
            _ => {}
        }
        let emb = candle_nn::ops::silu(&emb)?;
        let h = self.conv_in.forward(x)?.broadcast_add(&guided)?;
        let mut zero = self.zero_convs.iter();
        let mut output = Vec::with_capacity(self.zero_convs.len());
        let mut project = |h: &Tensor| -> Result<()> {
            let conv = zero
                .next()
                .ok_or_else(|| candle_core::Error::Msg("ControlNet: more blocks than zero convolutions".into()))?;
            output.push(Some(conv.forward(h)?.to_dtype(DType::F32)?));
            Ok(())
        };
        project(&h)?;
        let h = run_down(&self.down, h, (&emb, context), stop, &mut project)?;
        let h = run_middle(&self.mid, &h, (&emb, context), stop)?;
        let middle = self.mid_out.forward(&h)?.to_dtype(DType::F32)?;
        Ok(ControlResiduals {
            output,
            middle: vec![Some(middle)],
        })
    }

    /// The hint encoder's output: the control image at the latent's size and the UNet's
    /// base width.
    fn encode_hint(&self, hint: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let mut h = hint.clone();
        for (i, conv) in self.hint.iter().enumerate() {
            stop.check()?;
            h = conv.forward(&h)?;
            if i + 1 < self.hint.len() {
                h = candle_nn::ops::silu(&h)?;
            }
        }
        Ok(h)
    }

    /// Bytes a forward pass allocates at its peak for `batch` latents of `height` x `width`
    /// cells under `tokens` context tokens: the UNet's down path and middle block (bounded
    /// by the whole UNet's count), the hint encoder's largest activations and the residuals.
    pub fn working_bytes(&self, batch: usize, (height, width): (usize, usize), tokens: usize) -> u64 {
        let unet = super::Unet::working_bytes(&self.config, batch, (height, width), tokens);
        let pixels = (batch * height * width * 64) as u64;
        let hint = pixels * (self.hint_channels + 2 * 16) as u64 * 4;
        unet + hint
    }
}

#[cfg(test)]
pub(crate) mod tests;
