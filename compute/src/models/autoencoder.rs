//! The SD1.x KL autoencoder (the VAE), written on weft's CPU kernels.
//!
//! Same architecture and parameter names as diffusers' `AutoencoderKL` (the names
//! [`super::ldm_to_candle`] maps checkpoints onto): convolutions are
//! [`crate::conv::Conv2d`], group norms (with their SiLU) [`GroupNorm`], the
//! mid-block self-attention [`crate::attention::attention`] with one head. On other
//! devices each falls back to candle's operations.
//!
//! It replaces candle-transformers' `AutoEncoderKL`, whose CPU convolution (candle 0.9's
//! `conv2d_tiled`) reads a contiguous NCHW input as channels-last whenever the channel count
//! equals the height and the width: SD1's decoder has 256-channel 256x256 planes (in its
//! last level at 256x256 output, one level up at 512x512), which came out as horizontal
//! streaks, and the encoder has such planes too.

use candle_core::{DType, Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::working::{act, attention_scratch, conv_scratch, halved, resnet_bytes, Peak};
use super::ModelConfig;
use crate::attention::attention;
use crate::conv::Conv2d;
use crate::interrupt::Interrupt;
use crate::norm::GroupNorm;

/// Groups of every group norm.
const GROUPS: usize = 32;
/// Epsilon of every group norm of the autoencoder.
const EPS: f64 = 1e-6;

/// The autoencoder: images in `[-1, 1]` to latents (the posterior's mean) and back.
pub struct Sd1Vae {
    encoder: Encoder,
    quant_conv: Conv2d,
    post_quant_conv: Conv2d,
    decoder: Decoder,
    latent_channels: usize,
}

impl Sd1Vae {
    /// Builds the autoencoder of `cfg` from `vb` (diffusers names: `encoder.down_blocks.0...`,
    /// `decoder.up_blocks.0...`, `quant_conv`, `post_quant_conv`).
    pub fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let z = cfg.latent_channels;
        Ok(Sd1Vae {
            encoder: Encoder::new(vb.pp("encoder"), cfg)?,
            quant_conv: Conv2d::new(vb.pp("quant_conv"), 2 * z, 2 * z, 1, 1, 0)?,
            post_quant_conv: Conv2d::new(vb.pp("post_quant_conv"), z, z, 1, 1, 0)?,
            decoder: Decoder::new(vb.pp("decoder"), cfg)?,
            latent_channels: z,
        })
    }

    /// The mean of the posterior for images `x: [b, 3, h, w]` in `[-1, 1]`:
    /// `[b, latent, h/8, w/8]` for SD1 (ComfyUI encodes with the mean).
    pub fn encode(&self, x: &Tensor) -> Result<Tensor> {
        self.encode_interruptible(x, Interrupt::NEVER)
    }

    /// [`Sd1Vae::encode`], asking `stop` before every block and inside attention.
    pub fn encode_interruptible(&self, x: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        crate::on_workers(|| {
            let h = self.encoder.forward(&x.to_dtype(self.dtype())?, stop)?;
            stop.check()?;
            let moments = self.quant_conv.forward_fused(&h, None, None)?;
            moments
                .narrow(1, 0, self.latent_channels)?
                .to_dtype(DType::F32)?
                .contiguous()
        })
    }

    /// The images (`[b, 3, 8h, 8w]` for SD1, nominally in `[-1, 1]`) of latents
    /// `z: [b, latent, h, w]`.
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        self.decode_interruptible(z, Interrupt::NEVER)
    }

    /// [`Sd1Vae::decode`], asking `stop` before every block and inside attention.
    pub fn decode_interruptible(&self, z: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        crate::on_workers(|| {
            stop.check()?;
            let z = z.to_dtype(self.dtype())?;
            self.decoder
                .forward(&self.post_quant_conv.forward_fused(&z, None, None)?, stop)?
                .to_dtype(DType::F32)
        })
    }

    /// The dtype the autoencoder computes in (its weights').
    pub fn dtype(&self) -> DType {
        self.quant_conv.dtype()
    }
}

impl Sd1Vae {
    /// Bytes [`Sd1Vae::decode`] (with `crate::vae::decode_with`'s conversion to an image
    /// batch) allocates at its peak, weights aside, for `batch` latents of `height` x
    /// `width` cells: the mid block's single-head attention over every cell (every worker
    /// copies the whole of its keys and values: 1,024 floats per cell for SD1), then each
    /// level's residual blocks and the upsampling (the input, its nearest-neighbour copy at
    /// twice the size and the convolution's output), the widest levels at full size.
    pub fn decode_working_bytes(cfg: &ModelConfig, batch: usize, (height, width): (usize, usize)) -> u64 {
        let channels: Vec<usize> = cfg.vae_mult.iter().rev().map(|m| m * cfg.vae_channels).collect();
        let lc = cfg.latent_channels;
        let mut size = (height, width);
        let mut peak = Peak::default();
        peak.hold(2 * act(batch, lc, size));
        let mut cin = channels[0];
        peak.during(act(batch, cin, size) + conv_scratch(batch, (lc, cin), size, 3, 1));
        peak.hold(act(batch, cin, size));
        peak.during(mid_bytes(batch, cin, size));
        for (i, &cout) in channels.iter().enumerate() {
            for _ in 0..=cfg.vae_res_blocks {
                peak.during(resnet_bytes(batch, (cin, cout), size));
                peak.release(act(batch, cin, size));
                peak.hold(act(batch, cout, size));
                cin = cout;
            }
            if i + 1 < channels.len() {
                let up = (2 * size.0, 2 * size.1);
                peak.during(2 * act(batch, cout, up) + conv_scratch(batch, (cout, cout), up, 3, 1));
                peak.release(act(batch, cout, size));
                peak.hold(act(batch, cout, up));
                size = up;
            }
        }
        peak.during(act(batch, cin + 3, size) + conv_scratch(batch, (cin, 3), size, 3, 1));
        // Scaled, clamped and permuted into the image batch: up to seven 3-channel copies.
        peak.release(act(batch, cin, size));
        peak.during(7 * act(batch, 3, size));
        peak.peak()
    }

    /// Bytes [`Sd1Vae::encode`] (with `crate::vae::encode_with`'s conversion from an image
    /// batch) allocates at its peak, weights aside, for `batch` images of `height` x
    /// `width` pixels: the scaled input, each level's residual blocks, the downsampling
    /// (two zero-padded copies, the column matrix of the stride-2 convolution and its
    /// output), and the mid block's attention over the smallest level's pixels.
    pub fn encode_working_bytes(cfg: &ModelConfig, batch: usize, (height, width): (usize, usize)) -> u64 {
        let channels: Vec<usize> = cfg.vae_mult.iter().map(|m| m * cfg.vae_channels).collect();
        let mut size = (height, width);
        let mut peak = Peak::default();
        peak.during(4 * act(batch, 3, size));
        peak.hold(act(batch, 3, size));
        let mut cin = cfg.vae_channels;
        peak.during(act(batch, cin, size) + conv_scratch(batch, (3, cin), size, 3, 1));
        peak.hold(act(batch, cin, size));
        for (i, &cout) in channels.iter().enumerate() {
            for _ in 0..cfg.vae_res_blocks {
                peak.during(resnet_bytes(batch, (cin, cout), size));
                peak.release(act(batch, cin, size));
                peak.hold(act(batch, cout, size));
                cin = cout;
            }
            if i + 1 < channels.len() {
                let padded = (size.0 + 1, size.1 + 1);
                let down = halved(size);
                let conv = act(batch, cout, down) + conv_scratch(batch, (cout, cout), padded, 3, 2);
                peak.during(2 * act(batch, cout, padded) + conv);
                peak.release(act(batch, cout, size));
                peak.hold(act(batch, cout, down));
                size = down;
            }
        }
        peak.during(mid_bytes(batch, cin, size));
        let lc = cfg.latent_channels;
        peak.during(act(batch, cin + 5 * lc, size) + conv_scratch(batch, (cin, 2 * lc), size, 3, 1));
        peak.peak()
    }
}

/// Bytes of the mid block over `batch` x `size` pixels of `c` channels while it runs,
/// besides its input: its residual blocks, or its attention (the norm's output, q, k and v
/// as tokens, the output before and after it is laid out, the projection) with every
/// worker's copy of the keys and values.
fn mid_bytes(batch: usize, c: usize, size: (usize, usize)) -> u64 {
    let attention = 7 * act(batch, c, size) + attention_scratch(size.0 * size.1, c);
    resnet_bytes(batch, (c, c), size).max(attention)
}

fn conv3x3(vb: VarBuilder, cin: usize, cout: usize) -> Result<Conv2d> {
    Conv2d::new(vb, cin, cout, 3, 1, 1)
}

/// Images to the posterior's moments, before `quant_conv`.
struct Encoder {
    conv_in: Conv2d,
    /// Per level: its residual blocks, then a downsampling convolution except at the last.
    down: Vec<(Vec<ResBlock>, Option<Conv2d>)>,
    mid: MidBlock,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl Encoder {
    fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let channels: Vec<usize> = cfg.vae_mult.iter().map(|m| m * cfg.vae_channels).collect();
        let mut down = Vec::with_capacity(channels.len());
        let mut cin = cfg.vae_channels;
        for (i, &cout) in channels.iter().enumerate() {
            let level = vb.pp(format!("down_blocks.{i}"));
            let resnets = (0..cfg.vae_res_blocks)
                .map(|j| ResBlock::new(level.pp(format!("resnets.{j}")), if j == 0 { cin } else { cout }, cout))
                .collect::<Result<Vec<_>>>()?;
            let downsample = if i + 1 < channels.len() {
                Some(Conv2d::new(level.pp("downsamplers.0.conv"), cout, cout, 3, 2, 0)?)
            } else {
                None
            };
            down.push((resnets, downsample));
            cin = cout;
        }
        Ok(Encoder {
            conv_in: conv3x3(vb.pp("conv_in"), 3, cfg.vae_channels)?,
            down,
            mid: MidBlock::new(vb.pp("mid_block"), cin)?,
            norm_out: GroupNorm::new(vb.pp("conv_norm_out"), GROUPS, cin, EPS, true)?,
            conv_out: conv3x3(vb.pp("conv_out"), cin, 2 * cfg.latent_channels)?,
        })
    }

    fn forward(&self, x: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        stop.check()?;
        let mut h = self.conv_in.forward_interruptible(x, None, None, stop)?;
        for (resnets, downsample) in &self.down {
            for resnet in resnets {
                stop.check()?;
                h = resnet.forward(&h, stop)?;
            }
            if let Some(conv) = downsample {
                stop.check()?;
                // One zero row and column after the plane, then a 3x3 stride-2 convolution
                // without padding (the original LDM downsampling).
                let padded = h.pad_with_zeros(2, 0, 1)?.pad_with_zeros(3, 0, 1)?;
                h = conv.forward_interruptible(&padded, None, None, stop)?;
            }
        }
        let h = self.mid.forward(&h, stop)?;
        stop.check()?;
        self.conv_out
            .forward_interruptible(&self.norm_out.forward(&h)?, None, None, stop)
    }
}

/// Latents (after `post_quant_conv`) to images.
struct Decoder {
    conv_in: Conv2d,
    mid: MidBlock,
    /// Per level, widest first: its residual blocks, then an upsampling convolution except
    /// at the last.
    up: Vec<(Vec<ResBlock>, Option<Conv2d>)>,
    norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl Decoder {
    fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let channels: Vec<usize> = cfg.vae_mult.iter().rev().map(|m| m * cfg.vae_channels).collect();
        let top = channels[0];
        let mut up = Vec::with_capacity(channels.len());
        let mut cin = top;
        for (i, &cout) in channels.iter().enumerate() {
            let level = vb.pp(format!("up_blocks.{i}"));
            let resnets = (0..=cfg.vae_res_blocks)
                .map(|j| ResBlock::new(level.pp(format!("resnets.{j}")), if j == 0 { cin } else { cout }, cout))
                .collect::<Result<Vec<_>>>()?;
            let upsample = if i + 1 < channels.len() {
                Some(conv3x3(level.pp("upsamplers.0.conv"), cout, cout)?)
            } else {
                None
            };
            up.push((resnets, upsample));
            cin = cout;
        }
        Ok(Decoder {
            conv_in: conv3x3(vb.pp("conv_in"), cfg.latent_channels, top)?,
            mid: MidBlock::new(vb.pp("mid_block"), top)?,
            up,
            norm_out: GroupNorm::new(vb.pp("conv_norm_out"), GROUPS, cin, EPS, true)?,
            conv_out: conv3x3(vb.pp("conv_out"), cin, 3)?,
        })
    }

    fn forward(&self, z: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let mut h = self
            .mid
            .forward(&self.conv_in.forward_interruptible(z, None, None, stop)?, stop)?;
        for (resnets, upsample) in &self.up {
            for resnet in resnets {
                stop.check()?;
                h = resnet.forward(&h, stop)?;
            }
            if let Some(conv) = upsample {
                stop.check()?;
                let (_, _, height, width) = h.dims4()?;
                let upsampled = h.upsample_nearest2d(2 * height, 2 * width)?;
                h = conv.forward_interruptible(&upsampled, None, None, stop)?;
            }
        }
        stop.check()?;
        self.conv_out
            .forward_interruptible(&self.norm_out.forward(&h)?, None, None, stop)
    }
}

/// Residual block without a time embedding: two group-norm/SiLU/3x3-convolution stages, plus a
/// 1x1 shortcut when the channel count changes (the residual is added by `conv2`).
struct ResBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    norm2: GroupNorm,
    conv2: Conv2d,
    shortcut: Option<Conv2d>,
}

impl ResBlock {
    fn new(vb: VarBuilder, cin: usize, cout: usize) -> Result<Self> {
        Ok(ResBlock {
            norm1: GroupNorm::new(vb.pp("norm1"), GROUPS, cin, EPS, true)?,
            conv1: conv3x3(vb.pp("conv1"), cin, cout)?,
            norm2: GroupNorm::new(vb.pp("norm2"), GROUPS, cout, EPS, true)?,
            conv2: conv3x3(vb.pp("conv2"), cout, cout)?,
            shortcut: if cin == cout {
                None
            } else {
                Some(Conv2d::new(vb.pp("conv_shortcut"), cin, cout, 1, 1, 0)?)
            },
        })
    }

    /// The block on `x`, asking `stop` inside each convolution.
    fn forward(&self, x: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let h = self
            .conv1
            .forward_interruptible(&self.norm1.forward(x)?, None, None, stop)?;
        let residual = match &self.shortcut {
            Some(conv) => conv.forward_interruptible(x, None, None, stop)?,
            None => x.clone(),
        };
        self.conv2
            .forward_interruptible(&self.norm2.forward(&h)?, None, Some(&residual), stop)
    }
}

/// Residual block, single-head self-attention over the pixels, residual block.
struct MidBlock {
    resnet_1: ResBlock,
    attention: SelfAttention,
    resnet_2: ResBlock,
}

impl MidBlock {
    fn new(vb: VarBuilder, channels: usize) -> Result<Self> {
        Ok(MidBlock {
            resnet_1: ResBlock::new(vb.pp("resnets.0"), channels, channels)?,
            attention: SelfAttention::new(vb.pp("attentions.0"), channels)?,
            resnet_2: ResBlock::new(vb.pp("resnets.1"), channels, channels)?,
        })
    }

    fn forward(&self, x: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        stop.check()?;
        let h = self.resnet_1.forward(x, stop)?;
        stop.check()?;
        let h = self.attention.forward(&h, stop)?;
        stop.check()?;
        self.resnet_2.forward(&h, stop)
    }
}

/// `x + proj(attention(q, k, v))` with one head over the `h·w` pixels of the group-normed
/// `x`; the projections are 1x1 convolutions, which read and write the token layout.
struct SelfAttention {
    norm: GroupNorm,
    query: Conv2d,
    key: Conv2d,
    value: Conv2d,
    proj: Conv2d,
    channels: usize,
}

impl SelfAttention {
    fn new(vb: VarBuilder, channels: usize) -> Result<Self> {
        let project = |name: &str| Conv2d::new(vb.pp(name), channels, channels, 1, 1, 0);
        Ok(SelfAttention {
            norm: GroupNorm::new(vb.pp("group_norm"), GROUPS, channels, EPS, false)?,
            query: project("query")?,
            key: project("key")?,
            value: project("value")?,
            proj: project("proj_attn")?,
            channels,
        })
    }

    fn forward(&self, x: &Tensor, stop: Interrupt<'_>) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let normed = self.norm.forward(x)?;
        let q = self.query.forward_to_tokens(&normed)?;
        let k = self.key.forward_to_tokens(&normed)?;
        let v = self.value.forward_to_tokens(&normed)?;
        let scale = 1.0 / (self.channels as f64).sqrt();
        self.proj
            .forward_from_tokens(&attention(&q, &k, &v, 1, scale, stop)?, (h, w), x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;
    use candle_transformers::models::stable_diffusion::vae::AutoEncoderKL;

    /// Same weights through candle-transformers' autoencoder and this one, on shapes where
    /// candle's convolution is right (no plane whose channel count equals its sides).
    #[test]
    fn matches_candle_transformers_vae() {
        let dev = Device::Cpu;
        let cfg = ModelConfig::tiny();
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let theirs = AutoEncoderKL::new(vb, 3, 3, super::super::loader::vae_config(&cfg)).unwrap();
        // Random biases and norm parameters too, so that every term is exercised; candle's
        // posterior keeps its mean private, so its log-variance is pinned at -1e4 (a zero
        // standard deviation: sampling gives the mean). Ours reads only the mean's half.
        let z = cfg.latent_channels;
        for (name, var) in varmap.data().lock().unwrap().iter() {
            let value = match name.as_str() {
                "quant_conv.weight" => {
                    let w = var.as_tensor().narrow(0, 0, z).unwrap();
                    Tensor::cat(&[&w, &w.zeros_like().unwrap()], 0).unwrap()
                }
                "quant_conv.bias" => Tensor::cat(
                    &[
                        &Tensor::randn(0f32, 0.5, z, &dev).unwrap(),
                        &Tensor::full(-1e4f32, z, &dev).unwrap(),
                    ],
                    0,
                )
                .unwrap(),
                _ if var.dims().len() == 1 => Tensor::randn(0f32, 0.5, var.dims(), &dev).unwrap(),
                _ => continue,
            };
            var.set(&value).unwrap();
        }
        // candle made the attention projections linear ([c, c]); checkpoints hold them as
        // 1x1 convolutions ([c, c, 1, 1]), as this autoencoder reads them.
        let tensors = varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(name, var)| {
                let t = var.as_tensor();
                let t = match t.dims() {
                    &[rows, cols] => t.reshape((rows, cols, 1, 1)).unwrap(),
                    _ => t.clone(),
                };
                (name.clone(), t)
            })
            .collect();
        let ours = Sd1Vae::new(VarBuilder::from_tensors(tensors, DType::F32, &dev), &cfg).unwrap();
        let compare = |what: &str, got: Tensor, want: Tensor| {
            assert_eq!(got.dims(), want.dims(), "{what}");
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(scale > 0.1, "{what}: a degenerate output proves nothing: {scale}");
            let diff = crate::max_abs_diff(&got, &want);
            assert!(diff < 1e-4 * scale.max(1.0), "{what}: {diff} against {scale}");
        };
        // Planes of at least 16x16 pixels take the Winograd convolutions.
        let latent = Tensor::randn(0f32, 1.0, (2, z, 10, 14), &dev).unwrap();
        compare("decode", ours.decode(&latent).unwrap(), theirs.decode(&latent).unwrap());
        let x = Tensor::randn(0f32, 1.0, (2, 3, 20, 28), &dev).unwrap();
        compare(
            "encode",
            ours.encode(&x).unwrap(),
            theirs.encode(&x).unwrap().sample().unwrap(),
        );
    }

    /// The case that broke candle-transformers' autoencoder: a convolution over planes whose
    /// channel count equals their sides.
    #[test]
    fn planes_as_wide_as_their_channels() {
        let dev = Device::Cpu;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let ours = conv3x3(vb.pp("c"), 16, 8).unwrap();
        let x = Tensor::randn(0f32, 1.0, (1, 16, 16, 16), &dev).unwrap();
        let got = ours.forward(&x).unwrap();
        // candle reads a non-contiguous input correctly: the reference.
        let weight = varmap.data().lock().unwrap()["c.weight"].as_tensor().clone();
        let bias = varmap.data().lock().unwrap()["c.bias"].as_tensor().clone();
        let strided = x
            .permute((0, 2, 3, 1))
            .unwrap()
            .contiguous()
            .unwrap()
            .permute((0, 3, 1, 2))
            .unwrap();
        let want = strided
            .conv2d(&weight, 1, 1, 1, 1)
            .unwrap()
            .broadcast_add(&bias.reshape((1, 8, 1, 1)).unwrap())
            .unwrap();
        assert!(crate::max_abs_diff(&got, &want) < 1e-4);
    }
}
