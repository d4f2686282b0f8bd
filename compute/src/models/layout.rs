//! SD1.x single-file ("original" / LDM) checkpoint layout: expected tensors, architecture
//! detection, and the mapping from LDM names to the diffusers-style names that
//! candle-transformers' `stable_diffusion` UNet / VAE / CLIP modules request.

use std::collections::BTreeMap;
use std::path::Path;

use super::safetensors::{CheckpointError, Dtype, SafetensorsIndex};

/// UNet prefix in original checkpoints.
pub const UNET_PREFIX: &str = "model.diffusion_model.";
/// VAE prefix in original checkpoints.
pub const VAE_PREFIX: &str = "first_stage_model.";
/// CLIP text encoder prefix in SD1 checkpoints.
pub const CLIP_PREFIX: &str = "cond_stage_model.transformer.";
/// SDXL's CLIP ViT-L prefix.
pub const SDXL_CLIP_L_PREFIX: &str = "conditioner.embedders.0.transformer.";
/// SDXL's OpenCLIP bigG prefix.
pub const SDXL_CLIP_G_PREFIX: &str = "conditioner.embedders.1.model.";
/// The SDXL refiner's OpenCLIP bigG prefix.
pub const REFINER_CLIP_G_PREFIX: &str = "conditioner.embedders.0.model.";
/// SD2's OpenCLIP ViT-H prefix.
pub const SD2_CLIP_H_PREFIX: &str = "cond_stage_model.model.";
/// The UNet tensor (without the UNet prefix) whose spread tells an SD2 v-prediction
/// checkpoint from an eps one, as ComfyUI tells them apart.
pub const SD2_V_PROBE: &str = "output_blocks.11.1.transformer_blocks.0.norm1.bias";
/// The population standard deviation of [`SD2_V_PROBE`] above which an SD2 checkpoint
/// predicts v.
pub const SD2_V_STD: f32 = 0.09;

/// The model families weft runs, as ComfyUI's model detection names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Stable Diffusion 1.x: one CLIP ViT-L, 768-wide context.
    Sd1,
    /// SDXL base and its distilled variants: CLIP ViT-L and OpenCLIP ViT-bigG, 2048-wide
    /// context, size conditioning.
    Sdxl,
    /// The SDXL refiner: OpenCLIP ViT-bigG alone, aesthetic-score conditioning.
    SdxlRefiner,
    /// Stable Diffusion 2.x: OpenCLIP ViT-H alone, 1024-wide context, linear projections,
    /// 64-wide heads; eps or v prediction.
    Sd2,
}

/// How the UNet's attention is split into heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heads {
    /// A fixed number of heads at every width (SD1: 8).
    Count(usize),
    /// Heads of a fixed width (SDXL: 64 channels each).
    Width(usize),
}

impl Heads {
    /// The number of heads at `channels`.
    pub fn at(self, channels: usize) -> usize {
        match self {
            Heads::Count(n) => n,
            Heads::Width(w) => (channels / w).max(1),
        }
    }
}

/// The activation of a text encoder's MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClipActivation {
    /// `x * sigmoid(1.702 x)` (OpenAI's CLIP).
    QuickGelu,
    /// The exact, erf-based GELU (OpenCLIP's bigG and ViT-H).
    Gelu,
}

/// How a text encoder's tensors are named in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClipNames {
    /// Hugging Face's `text_model.*` names (CLIP ViT-L).
    HuggingFace,
    /// OpenCLIP's names (`transformer.resblocks.*`, stacked `in_proj_weight`,
    /// `text_projection` stored `[in, out]`).
    OpenClip,
}

/// One CLIP text encoder of a checkpoint and how ComfyUI uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipConfig {
    /// ComfyUI's name for it, the key of its embeddings: `clip_l` or `clip_g`.
    pub name: &'static str,
    /// Its tensors' prefix in a single-file checkpoint.
    pub prefix: &'static str,
    /// How its tensors are named there.
    pub names: ClipNames,
    /// Vocabulary (49408).
    pub vocab: usize,
    /// Positions (77).
    pub positions: usize,
    /// Width (768 for ViT-L, 1280 for bigG).
    pub width: usize,
    /// Encoder layers (12, 32).
    pub layers: usize,
    /// Attention heads (12, 20).
    pub heads: usize,
    /// MLP width (3072, 5120).
    pub intermediate: usize,
    /// MLP activation.
    pub activation: ClipActivation,
    /// Whether it has a `text_projection` and gives a pooled output.
    pub projection: bool,
    /// The layer whose output is the encoding by default: -1 is the last, -2 the one before.
    pub default_layer: i32,
    /// Whether the final layer norm is applied to the chosen layer's output (SD1's CLIP) or
    /// not (SDXL's two encoders).
    pub norm_hidden: bool,
    /// The token that fills a prompt's chunk after its end token: the end token itself
    /// (49407) for CLIP ViT-L, 0 for SDXL's bigG.
    pub pad_token: u32,
}

impl ClipConfig {
    /// OpenAI's CLIP ViT-L/14 text tower under `prefix`, as SD1 uses it (last layer, final
    /// norm applied).
    pub fn vit_l(prefix: &'static str) -> Self {
        ClipConfig {
            name: "clip_l",
            prefix,
            names: ClipNames::HuggingFace,
            vocab: 49408,
            positions: 77,
            width: 768,
            layers: 12,
            heads: 12,
            intermediate: 3072,
            activation: ClipActivation::QuickGelu,
            projection: false,
            default_layer: -1,
            norm_hidden: true,
            pad_token: 49407,
        }
    }

    /// CLIP ViT-L as SDXL uses it: the penultimate layer, without the final norm.
    pub fn vit_l_sdxl(prefix: &'static str) -> Self {
        ClipConfig {
            default_layer: -2,
            norm_hidden: false,
            ..ClipConfig::vit_l(prefix)
        }
    }

    /// OpenCLIP ViT-bigG/14 as SDXL uses it: the penultimate layer without the final norm,
    /// and the pooled output through `text_projection`.
    pub fn big_g(prefix: &'static str) -> Self {
        ClipConfig {
            name: "clip_g",
            prefix,
            names: ClipNames::OpenClip,
            vocab: 49408,
            positions: 77,
            width: 1280,
            layers: 32,
            heads: 20,
            intermediate: 5120,
            activation: ClipActivation::Gelu,
            projection: true,
            default_layer: -2,
            norm_hidden: false,
            pad_token: 0,
        }
    }

    /// OpenCLIP ViT-H/14 as SD2 uses it (`clip_h`): the penultimate layer with the final
    /// norm applied, padded with 0, no pooled output.
    pub fn vit_h(prefix: &'static str) -> Self {
        ClipConfig {
            name: "clip_h",
            width: 1024,
            layers: 24,
            heads: 16,
            intermediate: 4096,
            projection: false,
            norm_hidden: true,
            ..ClipConfig::big_g(prefix)
        }
    }
}

/// Hyper-parameters that determine a checkpoint's tensor layout and how its networks run.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The model family.
    pub family: Family,
    /// UNet base channels (320).
    pub model_channels: usize,
    /// UNet channel multipliers per level ([1, 2, 4, 4]).
    pub channel_mult: Vec<usize>,
    /// Residual blocks per level (2).
    pub num_res_blocks: usize,
    /// Transformer blocks after each residual block of the down path, level by level
    /// (ComfyUI's `transformer_depth`; SD1: `[1, 1, 1, 1, 1, 1, 0, 0]`).
    pub transformer_depth: Vec<usize>,
    /// Transformer blocks in the middle block; `None` for a middle block of two residual
    /// blocks alone.
    pub transformer_depth_middle: Option<usize>,
    /// Transformer blocks after each residual block of the up path, listed from level 0
    /// (ComfyUI's `transformer_depth_output`; the up path reads it from the end).
    pub transformer_depth_output: Vec<usize>,
    /// How attention is split into heads.
    pub heads: Heads,
    /// Whether transformers project in and out with linear layers (SDXL) rather than 1x1
    /// convolutions (SD1).
    pub linear_projection: bool,
    /// Width of the vector added to the time embedding through `label_emb` (SDXL: 2816).
    pub adm_in_channels: Option<usize>,
    /// Text embedding width (768; SDXL: 2048, its two encoders side by side).
    pub context_dim: usize,
    /// Latent channels (4).
    pub latent_channels: usize,
    /// VAE base channels (128).
    pub vae_channels: usize,
    /// VAE channel multipliers ([1, 2, 4, 4]).
    pub vae_mult: Vec<usize>,
    /// VAE residual blocks per level (2).
    pub vae_res_blocks: usize,
    /// The text encoders, in the order their outputs are concatenated.
    pub text: Vec<ClipConfig>,
    /// Whether the UNet predicts v rather than the noise (SD2's 768-v checkpoints): its own
    /// model sampling is then v-prediction over the same discrete schedule.
    pub v_prediction: bool,
    /// Whether the UNet is an inpainting UNet (ComfyUI: more than 4 input channels): its
    /// input is the noisy latent, the mask and the masked image's latent, side by side
    /// ([`ModelConfig::unet_in_channels`]).
    pub inpainting: bool,
}

/// Per-block depths of `levels` levels of `blocks` residual blocks, from per-level depths.
fn per_block(depths: &[usize], blocks: usize) -> Vec<usize> {
    depths.iter().flat_map(|&d| std::iter::repeat_n(d, blocks)).collect()
}

impl ModelConfig {
    /// Stable Diffusion 1.x.
    pub fn sd1() -> Self {
        ModelConfig {
            family: Family::Sd1,
            model_channels: 320,
            channel_mult: vec![1, 2, 4, 4],
            num_res_blocks: 2,
            transformer_depth: per_block(&[1, 1, 1, 0], 2),
            transformer_depth_middle: Some(1),
            transformer_depth_output: per_block(&[1, 1, 1, 0], 3),
            heads: Heads::Count(8),
            linear_projection: false,
            adm_in_channels: None,
            context_dim: 768,
            latent_channels: 4,
            vae_channels: 128,
            vae_mult: vec![1, 2, 4, 4],
            vae_res_blocks: 2,
            text: vec![ClipConfig::vit_l(CLIP_PREFIX)],
            v_prediction: false,
            inpainting: false,
        }
    }

    /// SDXL base 1.0 (ComfyUI's `SDXL`).
    pub fn sdxl() -> Self {
        ModelConfig {
            family: Family::Sdxl,
            channel_mult: vec![1, 2, 4],
            transformer_depth: per_block(&[0, 2, 10], 2),
            transformer_depth_middle: Some(10),
            transformer_depth_output: per_block(&[0, 2, 10], 3),
            heads: Heads::Width(64),
            linear_projection: true,
            adm_in_channels: Some(2816),
            context_dim: 2048,
            text: vec![
                ClipConfig::vit_l_sdxl(SDXL_CLIP_L_PREFIX),
                ClipConfig::big_g(SDXL_CLIP_G_PREFIX),
            ],
            ..ModelConfig::sd1()
        }
    }

    /// The SDXL refiner (ComfyUI's `SDXLRefiner`): four levels of 384 channels, OpenCLIP
    /// bigG alone under `conditioner.embedders.0.model.`, aesthetic-score conditioning.
    pub fn sdxl_refiner() -> Self {
        ModelConfig {
            family: Family::SdxlRefiner,
            model_channels: 384,
            transformer_depth: per_block(&[0, 4, 4, 0], 2),
            transformer_depth_middle: Some(4),
            transformer_depth_output: per_block(&[0, 4, 4, 0], 3),
            heads: Heads::Width(64),
            linear_projection: true,
            adm_in_channels: Some(2560),
            context_dim: 1280,
            text: vec![ClipConfig::big_g(REFINER_CLIP_G_PREFIX)],
            ..ModelConfig::sd1()
        }
    }

    /// A tiny model with the same structure (for tests): 32-channel UNet with two levels,
    /// 32-channel VAE, 2-layer 32-wide CLIP with CLIP's full 49408-token vocabulary (so the
    /// real tokenizer's ids can drive it).
    pub fn tiny() -> Self {
        let clip = ClipConfig {
            width: 32,
            layers: 2,
            heads: 2,
            intermediate: 64,
            ..ClipConfig::vit_l(CLIP_PREFIX)
        };
        ModelConfig {
            family: Family::Sd1,
            model_channels: 32,
            channel_mult: vec![1, 2],
            num_res_blocks: 1,
            transformer_depth: vec![1, 0],
            transformer_depth_middle: Some(1),
            transformer_depth_output: vec![1, 1, 0, 0],
            heads: Heads::Count(8),
            linear_projection: false,
            adm_in_channels: None,
            context_dim: 32,
            latent_channels: 4,
            vae_channels: 32,
            vae_mult: vec![1, 2],
            vae_res_blocks: 1,
            text: vec![clip],
            v_prediction: false,
            inpainting: false,
        }
    }

    /// A tiny SDXL (for tests): SDXL's structure (no attention at the first level, deeper
    /// transformers below, 16-wide heads, linear projections, size conditioning, both text
    /// encoders) at small widths.
    pub fn tiny_sdxl() -> Self {
        let clip_l = ClipConfig {
            width: 32,
            layers: 3,
            heads: 2,
            intermediate: 64,
            ..ClipConfig::vit_l_sdxl(SDXL_CLIP_L_PREFIX)
        };
        let clip_g = ClipConfig {
            width: 48,
            layers: 3,
            heads: 3,
            intermediate: 96,
            ..ClipConfig::big_g(SDXL_CLIP_G_PREFIX)
        };
        ModelConfig {
            family: Family::Sdxl,
            model_channels: 32,
            channel_mult: vec![1, 2, 2],
            num_res_blocks: 2,
            transformer_depth: per_block(&[0, 1, 2], 2),
            transformer_depth_middle: Some(2),
            transformer_depth_output: per_block(&[0, 1, 2], 3),
            heads: Heads::Width(16),
            linear_projection: true,
            adm_in_channels: Some(48 + 6 * ADM_SIZE_WIDTH),
            context_dim: 32 + 48,
            text: vec![clip_l, clip_g],
            ..ModelConfig::tiny()
        }
    }

    /// A tiny SDXL refiner (for tests): the refiner's structure (four levels, attention in
    /// the middle two, bigG alone under the refiner's prefix, aesthetic-score conditioning)
    /// at small widths; its text encoder is `tiny_sdxl`'s bigG.
    pub fn tiny_sdxl_refiner() -> Self {
        let sdxl = ModelConfig::tiny_sdxl();
        let clip_g = ClipConfig {
            prefix: REFINER_CLIP_G_PREFIX,
            ..sdxl.text[1].clone()
        };
        ModelConfig {
            family: Family::SdxlRefiner,
            channel_mult: vec![1, 2, 2, 2],
            transformer_depth: per_block(&[0, 1, 1, 0], 2),
            transformer_depth_middle: Some(1),
            transformer_depth_output: per_block(&[0, 1, 1, 0], 3),
            adm_in_channels: Some(clip_g.width + 5 * ADM_SIZE_WIDTH),
            context_dim: clip_g.width,
            text: vec![clip_g],
            ..sdxl
        }
    }

    /// Stable Diffusion 2.x (ComfyUI's `SD20`), eps prediction: SD1's UNet with linear
    /// projections, 64-wide heads and a 1024-wide context from OpenCLIP ViT-H.
    pub fn sd2() -> Self {
        ModelConfig {
            family: Family::Sd2,
            heads: Heads::Width(64),
            linear_projection: true,
            context_dim: 1024,
            text: vec![ClipConfig::vit_h(SD2_CLIP_H_PREFIX)],
            ..ModelConfig::sd1()
        }
    }

    /// A tiny SD2 (for tests), eps prediction: SD2's structure (four levels of two residual
    /// blocks, attention at the first three, so [`SD2_V_PROBE`] exists; linear projections;
    /// 16-wide heads; ViT-H-style text encoder under SD2's prefix) at small widths, with
    /// `tiny`'s VAE.
    pub fn tiny_sd2() -> Self {
        let clip_h = ClipConfig {
            width: 32,
            layers: 3,
            heads: 2,
            intermediate: 64,
            ..ClipConfig::vit_h(SD2_CLIP_H_PREFIX)
        };
        ModelConfig {
            family: Family::Sd2,
            channel_mult: vec![1, 1, 2, 2],
            num_res_blocks: 2,
            transformer_depth: per_block(&[1, 1, 1, 0], 2),
            transformer_depth_middle: Some(1),
            transformer_depth_output: per_block(&[1, 1, 1, 0], 3),
            heads: Heads::Width(16),
            linear_projection: true,
            context_dim: clip_h.width,
            text: vec![clip_h],
            ..ModelConfig::tiny()
        }
    }

    /// Whether the UNet's down path has attention at `level`.
    pub fn level_has_attention(&self, level: usize) -> bool {
        (0..self.num_res_blocks).any(|j| self.depth_down(level, j) > 0)
    }

    /// Transformer blocks after residual block `j` of level `level` on the down path.
    pub fn depth_down(&self, level: usize, j: usize) -> usize {
        self.transformer_depth
            .get(level * self.num_res_blocks + j)
            .copied()
            .unwrap_or(0)
    }

    /// Transformer blocks after residual block `j` of level `level` on the up path.
    pub fn depth_up(&self, level: usize, j: usize) -> usize {
        self.transformer_depth_output
            .get(level * (self.num_res_blocks + 1) + j)
            .copied()
            .unwrap_or(0)
    }

    /// The channels the UNet's input convolution reads: the latent's, plus for an
    /// inpainting UNet one for the mask and the masked image's latent (ComfyUI's
    /// `concat_keys` `mask`, `masked_image`).
    pub fn unet_in_channels(&self) -> usize {
        match self.inpainting {
            true => 2 * self.latent_channels + 1,
            false => self.latent_channels,
        }
    }

    /// The projection of this family's latents onto RGB for previews.
    pub fn latent_rgb(&self) -> &'static crate::preview::LatentRgb {
        match self.family {
            Family::Sd1 | Family::Sd2 => &crate::preview::SD15_LATENT_RGB,
            Family::Sdxl | Family::SdxlRefiner => &crate::preview::SDXL_LATENT_RGB,
        }
    }

    /// The factor from the VAE's latent space to the UNet's (ComfyUI's latent format
    /// `scale_factor`): 0.18215 for SD1 and SD2, 0.13025 for SDXL.
    pub fn latent_scale(&self) -> f32 {
        match self.family {
            Family::Sd1 | Family::Sd2 => 0.18215,
            Family::Sdxl | Family::SdxlRefiner => 0.13025,
        }
    }
}

/// Width of the sinusoidal embedding of each of SDXL's size numbers (ComfyUI's
/// `Timestep(256)`).
pub const ADM_SIZE_WIDTH: usize = 256;

/// Which sub-model a tensor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    /// The denoising UNet.
    Unet,
    /// The autoencoder.
    Vae,
    /// Text encoder `n` of the configuration's `text`.
    Clip(usize),
}

type Layout = Vec<(String, Vec<usize>)>;

fn push(out: &mut Layout, name: String, shape: &[usize]) {
    out.push((name, shape.to_vec()));
}

fn wb(out: &mut Layout, p: &str, w: &[usize], b: usize) {
    push(out, format!("{p}.weight"), w);
    push(out, format!("{p}.bias"), &[b]);
}

fn unet_resblock(out: &mut Layout, p: &str, cin: usize, cout: usize, temb: usize) {
    wb(out, &format!("{p}.in_layers.0"), &[cin], cin);
    wb(out, &format!("{p}.in_layers.2"), &[cout, cin, 3, 3], cout);
    wb(out, &format!("{p}.emb_layers.1"), &[cout, temb], cout);
    wb(out, &format!("{p}.out_layers.0"), &[cout], cout);
    wb(out, &format!("{p}.out_layers.3"), &[cout, cout, 3, 3], cout);
    if cin != cout {
        wb(out, &format!("{p}.skip_connection"), &[cout, cin, 1, 1], cout);
    }
}

/// A spatial transformer of `depth` blocks over `c` channels attending to a `ctx`-wide
/// context; `linear` projections are `[c, c]` matrices rather than 1x1 convolutions.
fn unet_transformer(out: &mut Layout, p: &str, c: usize, ctx: usize, depth: usize, linear: bool) {
    let projection: &[usize] = if linear { &[c, c] } else { &[c, c, 1, 1] };
    wb(out, &format!("{p}.norm"), &[c], c);
    wb(out, &format!("{p}.proj_in"), projection, c);
    for block in 0..depth {
        let t = format!("{p}.transformer_blocks.{block}");
        for a in ["attn1", "attn2"] {
            let kv = if a == "attn1" { c } else { ctx };
            push(out, format!("{t}.{a}.to_q.weight"), &[c, c]);
            push(out, format!("{t}.{a}.to_k.weight"), &[c, kv]);
            push(out, format!("{t}.{a}.to_v.weight"), &[c, kv]);
            wb(out, &format!("{t}.{a}.to_out.0"), &[c, c], c);
        }
        wb(out, &format!("{t}.ff.net.0.proj"), &[c * 8, c], c * 8);
        wb(out, &format!("{t}.ff.net.2"), &[c, c * 4], c);
        for n in ["norm1", "norm2", "norm3"] {
            wb(out, &format!("{t}.{n}"), &[c], c);
        }
    }
    wb(out, &format!("{p}.proj_out"), projection, c);
}

/// The UNet tensors of an original checkpoint (names without the `model.diffusion_model.`
/// prefix) with their shapes.
pub fn unet_layout(cfg: &ModelConfig) -> Layout {
    let mut out = Vec::new();
    let ch = cfg.model_channels;
    let temb = 4 * ch;
    let lc = cfg.latent_channels;
    let (ctx, linear) = (cfg.context_dim, cfg.linear_projection);
    wb(&mut out, "time_embed.0", &[temb, ch], temb);
    wb(&mut out, "time_embed.2", &[temb, temb], temb);
    if let Some(adm) = cfg.adm_in_channels {
        wb(&mut out, "label_emb.0.0", &[temb, adm], temb);
        wb(&mut out, "label_emb.0.2", &[temb, temb], temb);
    }
    wb(&mut out, "input_blocks.0.0", &[ch, cfg.unet_in_channels(), 3, 3], ch);
    let mut chans = vec![ch];
    let mut cur = ch;
    let mut n = 1;
    let levels = cfg.channel_mult.len();
    for (level, &mult) in cfg.channel_mult.iter().enumerate() {
        for j in 0..cfg.num_res_blocks {
            let c = mult * ch;
            unet_resblock(&mut out, &format!("input_blocks.{n}.0"), cur, c, temb);
            cur = c;
            let depth = cfg.depth_down(level, j);
            if depth > 0 {
                unet_transformer(&mut out, &format!("input_blocks.{n}.1"), cur, ctx, depth, linear);
            }
            chans.push(cur);
            n += 1;
        }
        if level + 1 != levels {
            wb(&mut out, &format!("input_blocks.{n}.0.op"), &[cur, cur, 3, 3], cur);
            chans.push(cur);
            n += 1;
        }
    }
    unet_resblock(&mut out, "middle_block.0", cur, cur, temb);
    match cfg.transformer_depth_middle {
        Some(depth) => {
            unet_transformer(&mut out, "middle_block.1", cur, ctx, depth, linear);
            unet_resblock(&mut out, "middle_block.2", cur, cur, temb);
        }
        None => unet_resblock(&mut out, "middle_block.1", cur, cur, temb),
    }
    let mut n = 0;
    for (level, &mult) in cfg.channel_mult.iter().enumerate().rev() {
        for i in 0..=cfg.num_res_blocks {
            let skip = chans.pop().expect("skip channels");
            let c = mult * ch;
            unet_resblock(&mut out, &format!("output_blocks.{n}.0"), cur + skip, c, temb);
            cur = c;
            let mut idx = 1;
            let depth = cfg.depth_up(level, i);
            if depth > 0 {
                unet_transformer(&mut out, &format!("output_blocks.{n}.1"), cur, ctx, depth, linear);
                idx = 2;
            }
            if level != 0 && i == cfg.num_res_blocks {
                wb(
                    &mut out,
                    &format!("output_blocks.{n}.{idx}.conv"),
                    &[cur, cur, 3, 3],
                    cur,
                );
            }
            n += 1;
        }
    }
    wb(&mut out, "out.0", &[ch], ch);
    wb(&mut out, "out.2", &[lc, ch, 3, 3], lc);
    out
}

fn vae_resblock(out: &mut Layout, p: &str, cin: usize, cout: usize) {
    wb(out, &format!("{p}.norm1"), &[cin], cin);
    wb(out, &format!("{p}.conv1"), &[cout, cin, 3, 3], cout);
    wb(out, &format!("{p}.norm2"), &[cout], cout);
    wb(out, &format!("{p}.conv2"), &[cout, cout, 3, 3], cout);
    if cin != cout {
        wb(out, &format!("{p}.nin_shortcut"), &[cout, cin, 1, 1], cout);
    }
}

fn vae_mid(out: &mut Layout, p: &str, c: usize) {
    vae_resblock(out, &format!("{p}.mid.block_1"), c, c);
    wb(out, &format!("{p}.mid.attn_1.norm"), &[c], c);
    for n in ["q", "k", "v", "proj_out"] {
        wb(out, &format!("{p}.mid.attn_1.{n}"), &[c, c, 1, 1], c);
    }
    vae_resblock(out, &format!("{p}.mid.block_2"), c, c);
}

/// The VAE tensors (names without `first_stage_model.`) with their shapes.
pub fn vae_layout(cfg: &ModelConfig) -> Layout {
    let mut out = Vec::new();
    let ch = cfg.vae_channels;
    let z = cfg.latent_channels;
    let levels = cfg.vae_mult.len();
    wb(&mut out, "encoder.conv_in", &[ch, 3, 3, 3], ch);
    let mut cur = ch;
    for (i, &m) in cfg.vae_mult.iter().enumerate() {
        let c = ch * m;
        for j in 0..cfg.vae_res_blocks {
            vae_resblock(&mut out, &format!("encoder.down.{i}.block.{j}"), cur, c);
            cur = c;
        }
        if i + 1 != levels {
            wb(
                &mut out,
                &format!("encoder.down.{i}.downsample.conv"),
                &[cur, cur, 3, 3],
                cur,
            );
        }
    }
    vae_mid(&mut out, "encoder", cur);
    wb(&mut out, "encoder.norm_out", &[cur], cur);
    wb(&mut out, "encoder.conv_out", &[2 * z, cur, 3, 3], 2 * z);

    let top = ch * cfg.vae_mult[levels - 1];
    wb(&mut out, "decoder.conv_in", &[top, z, 3, 3], top);
    vae_mid(&mut out, "decoder", top);
    let mut cur = top;
    for (i, &m) in cfg.vae_mult.iter().enumerate().rev() {
        let c = ch * m;
        for j in 0..=cfg.vae_res_blocks {
            vae_resblock(&mut out, &format!("decoder.up.{i}.block.{j}"), cur, c);
            cur = c;
        }
        if i != 0 {
            wb(
                &mut out,
                &format!("decoder.up.{i}.upsample.conv"),
                &[cur, cur, 3, 3],
                cur,
            );
        }
    }
    wb(&mut out, "decoder.norm_out", &[cur], cur);
    wb(&mut out, "decoder.conv_out", &[3, cur, 3, 3], 3);
    wb(&mut out, "quant_conv", &[2 * z, 2 * z, 1, 1], 2 * z);
    wb(&mut out, "post_quant_conv", &[z, z, 1, 1], z);
    out
}

/// The tensors of text encoder `clip`, in its checkpoint names (without its prefix).
pub fn clip_layout(clip: &ClipConfig) -> Layout {
    match clip.names {
        ClipNames::HuggingFace => hugging_face_clip_layout(clip),
        ClipNames::OpenClip => open_clip_layout(clip),
    }
}

fn hugging_face_clip_layout(clip: &ClipConfig) -> Layout {
    let mut out = Vec::new();
    let (d, mlp) = (clip.width, clip.intermediate);
    push(
        &mut out,
        "text_model.embeddings.token_embedding.weight".into(),
        &[clip.vocab, d],
    );
    push(
        &mut out,
        "text_model.embeddings.position_embedding.weight".into(),
        &[clip.positions, d],
    );
    for l in 0..clip.layers {
        let p = format!("text_model.encoder.layers.{l}");
        for n in ["q_proj", "k_proj", "v_proj", "out_proj"] {
            wb(&mut out, &format!("{p}.self_attn.{n}"), &[d, d], d);
        }
        wb(&mut out, &format!("{p}.layer_norm1"), &[d], d);
        wb(&mut out, &format!("{p}.mlp.fc1"), &[mlp, d], mlp);
        wb(&mut out, &format!("{p}.mlp.fc2"), &[d, mlp], d);
        wb(&mut out, &format!("{p}.layer_norm2"), &[d], d);
    }
    wb(&mut out, "text_model.final_layer_norm", &[d], d);
    if clip.projection {
        push(&mut out, "text_projection.weight".into(), &[d, d]);
    }
    out
}

fn open_clip_layout(clip: &ClipConfig) -> Layout {
    let mut out = Vec::new();
    let (d, mlp) = (clip.width, clip.intermediate);
    push(&mut out, "token_embedding.weight".into(), &[clip.vocab, d]);
    push(&mut out, "positional_embedding".into(), &[clip.positions, d]);
    for l in 0..clip.layers {
        let p = format!("transformer.resblocks.{l}");
        push(&mut out, format!("{p}.attn.in_proj_weight"), &[3 * d, d]);
        push(&mut out, format!("{p}.attn.in_proj_bias"), &[3 * d]);
        wb(&mut out, &format!("{p}.attn.out_proj"), &[d, d], d);
        wb(&mut out, &format!("{p}.ln_1"), &[d], d);
        wb(&mut out, &format!("{p}.mlp.c_fc"), &[mlp, d], mlp);
        wb(&mut out, &format!("{p}.mlp.c_proj"), &[d, mlp], d);
        wb(&mut out, &format!("{p}.ln_2"), &[d], d);
    }
    wb(&mut out, "ln_final", &[d], d);
    if clip.projection {
        push(&mut out, "text_projection".into(), &[d, d]);
    }
    out
}

/// Every tensor of an original-layout checkpoint with full names and shapes.
pub fn checkpoint_layout(cfg: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let mut all = Vec::new();
    for (n, s) in unet_layout(cfg) {
        all.push((format!("{UNET_PREFIX}{n}"), s));
    }
    for (n, s) in vae_layout(cfg) {
        all.push((format!("{VAE_PREFIX}{n}"), s));
    }
    for clip in &cfg.text {
        for (n, s) in clip_layout(clip) {
            all.push((format!("{}{n}", clip.prefix), s));
        }
    }
    all
}

/// Maps an original (LDM) checkpoint tensor name to its component and the diffusers-style name
/// weft's networks read; `None` for tensors the models do not use (EMA weights, buffers,
/// `logit_scale`).
pub fn ldm_to_candle(name: &str, cfg: &ModelConfig) -> Option<(Component, String)> {
    if let Some(rest) = name.strip_prefix(UNET_PREFIX) {
        return unet_name(rest, cfg).map(|n| (Component::Unet, n));
    }
    if let Some(rest) = name.strip_prefix(VAE_PREFIX) {
        return vae_name(rest, cfg).map(|n| (Component::Vae, n));
    }
    cfg.text.iter().enumerate().find_map(|(i, clip)| {
        let rest = name.strip_prefix(clip.prefix)?;
        let mapped = match clip.names {
            ClipNames::HuggingFace => hugging_face_clip_name(rest),
            ClipNames::OpenClip => open_clip_name(rest),
        };
        mapped.map(|n| (Component::Clip(i), n))
    })
}

/// `tensor`, stored under `target`, in the shape weft's network reads: a transformer's linear
/// `proj_in`/`proj_out` `[c, c]` becomes the `[c, c, 1, 1]` of the 1x1 convolution it equals.
pub fn fit_to_network(target: &str, tensor: candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    let shape = network_shape(target, tensor.dims());
    if shape == tensor.dims() {
        Ok(tensor)
    } else {
        tensor.reshape(shape)
    }
}

/// The shape weft's network reads a tensor of `shape` stored under `target` in (see
/// [`fit_to_network`]).
pub fn network_shape(target: &str, shape: &[usize]) -> Vec<usize> {
    let projection = target.ends_with("proj_in.weight") || target.ends_with("proj_out.weight");
    match *shape {
        [out, inputs] if projection => vec![out, inputs, 1, 1],
        _ => shape.to_vec(),
    }
}

fn hugging_face_clip_name(rest: &str) -> Option<String> {
    if rest.ends_with("position_ids") || rest == "logit_scale" {
        return None;
    }
    if rest.starts_with("text_model.") || rest.starts_with("text_projection.") {
        return Some(rest.to_string());
    }
    // Older transformers versions saved CLIPTextModel without the `text_model.` level.
    Some(format!("text_model.{rest}"))
}

/// OpenCLIP's text-tower names onto Hugging Face's, which [`super::ClipText`] reads; the
/// stacked `in_proj` and the `[in, out]` projection keep their own names.
fn open_clip_name(rest: &str) -> Option<String> {
    let whole = [
        ("token_embedding.weight", "text_model.embeddings.token_embedding.weight"),
        (
            "positional_embedding",
            "text_model.embeddings.position_embedding.weight",
        ),
        ("text_projection", "text_projection.in_out"),
    ];
    if let Some((_, to)) = whole.iter().find(|(from, _)| *from == rest) {
        return Some(to.to_string());
    }
    if let Some(t) = rest.strip_prefix("ln_final.") {
        return Some(format!("text_model.final_layer_norm.{t}"));
    }
    let (layer, t) = split_idx(rest.strip_prefix("transformer.resblocks.")?)?;
    let inner = [
        ("ln_1.", "layer_norm1."),
        ("ln_2.", "layer_norm2."),
        ("attn.in_proj_weight", "self_attn.in_proj.weight"),
        ("attn.in_proj_bias", "self_attn.in_proj.bias"),
        ("attn.out_proj.", "self_attn.out_proj."),
        ("mlp.c_fc.", "mlp.fc1."),
        ("mlp.c_proj.", "mlp.fc2."),
    ];
    let mapped = inner
        .iter()
        .find_map(|(a, b)| t.strip_prefix(a).map(|tail| format!("{b}{tail}")))?;
    Some(format!("text_model.encoder.layers.{layer}.{mapped}"))
}

fn resnet_inner(rest: &str) -> Option<String> {
    let map = [
        ("in_layers.0.", "norm1."),
        ("in_layers.2.", "conv1."),
        ("emb_layers.1.", "time_emb_proj."),
        ("out_layers.0.", "norm2."),
        ("out_layers.3.", "conv2."),
        ("skip_connection.", "conv_shortcut."),
    ];
    map.iter()
        .find_map(|(a, b)| rest.strip_prefix(a).map(|t| format!("{b}{t}")))
}

fn split_idx(s: &str) -> Option<(usize, &str)> {
    let (num, rest) = s.split_once('.')?;
    Some((num.parse().ok()?, rest))
}

fn unet_name(rest: &str, cfg: &ModelConfig) -> Option<String> {
    let simple = [
        ("time_embed.0.", "time_embedding.linear_1."),
        ("time_embed.2.", "time_embedding.linear_2."),
        ("input_blocks.0.0.", "conv_in."),
        ("label_emb.0.0.", "add_embedding.linear_1."),
        ("label_emb.0.2.", "add_embedding.linear_2."),
        ("out.0.", "conv_norm_out."),
        ("out.2.", "conv_out."),
    ];
    if let Some(n) = simple
        .iter()
        .find_map(|(a, b)| rest.strip_prefix(a).map(|t| format!("{b}{t}")))
    {
        return Some(n);
    }
    let lpb = cfg.num_res_blocks;
    if let Some(r) = rest.strip_prefix("middle_block.") {
        let (i, t) = split_idx(r)?;
        let attention = cfg.transformer_depth_middle.is_some();
        return match (i, attention) {
            (0, _) => Some(format!("mid_block.resnets.0.{}", resnet_inner(t)?)),
            (1, true) => Some(format!("mid_block.attentions.0.{t}")),
            (1, false) | (2, true) => Some(format!("mid_block.resnets.1.{}", resnet_inner(t)?)),
            _ => None,
        };
    }
    if let Some(r) = rest.strip_prefix("input_blocks.") {
        let (n, t) = split_idx(r)?;
        if n == 0 {
            return None;
        }
        let block = (n - 1) / (lpb + 1);
        let layer = (n - 1) % (lpb + 1);
        let (sub, t) = split_idx(t)?;
        if layer == lpb {
            // Downsampler.
            let t = t.strip_prefix("op.")?;
            return Some(format!("down_blocks.{block}.downsamplers.0.conv.{t}"));
        }
        return match sub {
            0 => Some(format!("down_blocks.{block}.resnets.{layer}.{}", resnet_inner(t)?)),
            1 => Some(format!("down_blocks.{block}.attentions.{layer}.{t}")),
            _ => None,
        };
    }
    if let Some(r) = rest.strip_prefix("output_blocks.") {
        let (n, t) = split_idx(r)?;
        let block = n / (lpb + 1);
        let layer = n % (lpb + 1);
        let (sub, t) = split_idx(t)?;
        if sub == 0 {
            return Some(format!("up_blocks.{block}.resnets.{layer}.{}", resnet_inner(t)?));
        }
        if let Some(tt) = t.strip_prefix("conv.") {
            return Some(format!("up_blocks.{block}.upsamplers.0.conv.{tt}"));
        }
        if sub == 1 {
            return Some(format!("up_blocks.{block}.attentions.{layer}.{t}"));
        }
        return None;
    }
    None
}

fn vae_name(rest: &str, cfg: &ModelConfig) -> Option<String> {
    let levels = cfg.vae_mult.len();
    let (part, r) = rest.split_once('.').unwrap_or((rest, ""));
    if part == "quant_conv" || part == "post_quant_conv" {
        return Some(rest.to_string());
    }
    if part != "encoder" && part != "decoder" {
        return None;
    }
    let vres = |t: &str| -> Option<String> {
        Some(match t.strip_prefix("nin_shortcut.") {
            Some(x) => format!("conv_shortcut.{x}"),
            None => t.to_string(),
        })
    };
    let mapped = if let Some(t) = r.strip_prefix("norm_out.") {
        format!("conv_norm_out.{t}")
    } else if r.starts_with("conv_in.") || r.starts_with("conv_out.") {
        r.to_string()
    } else if let Some(t) = r.strip_prefix("mid.block_1.") {
        format!("mid_block.resnets.0.{}", vres(t)?)
    } else if let Some(t) = r.strip_prefix("mid.block_2.") {
        format!("mid_block.resnets.1.{}", vres(t)?)
    } else if let Some(t) = r.strip_prefix("mid.attn_1.") {
        let (n, tail) = t.split_once('.')?;
        let n = match n {
            "norm" => "group_norm",
            "q" => "query",
            "k" => "key",
            "v" => "value",
            "proj_out" => "proj_attn",
            _ => return None,
        };
        format!("mid_block.attentions.0.{n}.{tail}")
    } else if let Some(t) = r.strip_prefix("down.") {
        let (i, t) = split_idx(t)?;
        if let Some(t) = t.strip_prefix("block.") {
            let (j, t) = split_idx(t)?;
            format!("down_blocks.{i}.resnets.{j}.{}", vres(t)?)
        } else {
            let t = t.strip_prefix("downsample.conv.")?;
            format!("down_blocks.{i}.downsamplers.0.conv.{t}")
        }
    } else if let Some(t) = r.strip_prefix("up.") {
        let (i, t) = split_idx(t)?;
        let ui = levels.checked_sub(1 + i)?;
        if let Some(t) = t.strip_prefix("block.") {
            let (j, t) = split_idx(t)?;
            format!("up_blocks.{ui}.resnets.{j}.{}", vres(t)?)
        } else {
            let t = t.strip_prefix("upsample.conv.")?;
            format!("up_blocks.{ui}.upsamplers.0.conv.{t}")
        }
    } else {
        return None;
    };
    Some(format!("{part}.{mapped}"))
}

/// Model family guessed from a checkpoint's tensor names and shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arch {
    /// Stable Diffusion 1.x (CLIP ViT-L text encoder, 768-wide context).
    Sd1,
    /// Stable Diffusion 2.x (OpenCLIP, 1024-wide context).
    Sd2,
    /// SDXL base or a distilled SDXL (two text encoders, 2816-wide label embedding).
    Sdxl,
    /// The SDXL refiner (OpenCLIP bigG alone, 2560-wide label embedding).
    SdxlRefiner,
    /// Anything else (component-only files, LoRAs, other families), with what was found.
    Unknown(String),
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arch::Sd1 => f.write_str("Stable Diffusion 1.x"),
            Arch::Sd2 => f.write_str("Stable Diffusion 2.x"),
            Arch::Sdxl => f.write_str("SDXL"),
            Arch::SdxlRefiner => f.write_str("the SDXL refiner"),
            Arch::Unknown(found) => write!(f, "no known model family ({found})"),
        }
    }
}

/// The second dimension of tensor `name`, if the file has it.
fn width_of(index: &SafetensorsIndex, name: &str) -> Option<usize> {
    index.tensors.get(name).and_then(|t| t.shape.get(1).copied())
}

/// Detects the model family from the UNet's context and label-embedding widths, as
/// ComfyUI's model detection does.
pub fn detect_arch(index: &SafetensorsIndex) -> Arch {
    let any_prefix = |p: &str| index.tensors.keys().any(|k| k.starts_with(p));
    let context = index
        .tensors
        .iter()
        .find(|(k, _)| k.starts_with(UNET_PREFIX) && k.ends_with(".attn2.to_k.weight"))
        .and_then(|(_, t)| t.shape.get(1).copied());
    let adm = width_of(index, &format!("{UNET_PREFIX}label_emb.0.0.weight"));
    match (context, adm) {
        (Some(2048), Some(2816)) => return Arch::Sdxl,
        (Some(1280), Some(2560)) => return Arch::SdxlRefiner,
        (Some(1024), _) => return Arch::Sd2,
        (Some(768), None) if any_prefix(CLIP_PREFIX) => return Arch::Sd1,
        _ => {}
    }
    let n = index.tensors.len();
    let first = index.tensors.keys().next().cloned().unwrap_or_default();
    let unet = match (context, adm) {
        (None, _) => "no UNet".to_string(),
        (Some(c), None) => format!("a UNet with {c}-wide context"),
        (Some(c), Some(a)) => format!("a UNet with {c}-wide context and {a}-wide label embedding"),
    };
    Arch::Unknown(format!("{n} tensors, {unet}, first '{first}'"))
}

/// The configuration of the checkpoint `index` describes: its family's, with the
/// transformer depths counted from the file for the SDXL family (so distilled SDXL models
/// such as SSD-1B and Vega load too). An error names the family found when weft cannot run it.
pub fn detect_config(index: &SafetensorsIndex) -> Result<ModelConfig, String> {
    let mut cfg = match detect_arch(index) {
        Arch::Sd1 => {
            let mut cfg = ModelConfig::sd1();
            cfg.inpainting = detect_inpainting(index, &cfg)?;
            return Ok(cfg);
        }
        Arch::Sdxl => ModelConfig::sdxl(),
        Arch::SdxlRefiner => ModelConfig::sdxl_refiner(),
        Arch::Sd2 => return sd2_config(index),
        other => {
            return Err(format!(
                "{other}; weft runs Stable Diffusion 1.x and 2.x, SDXL and the SDXL refiner"
            ))
        }
    };
    count_transformer_depths(index, &mut cfg)?;
    cfg.inpainting = detect_inpainting(index, &cfg)?;
    Ok(cfg)
}

/// Whether the UNet of `index`, of family `cfg`, is an inpainting UNet, from its input
/// convolution's input channels: the latent's (text-to-image) or the latent's, the mask's
/// and the masked image's (ComfyUI's `in_channels` 9). Other counts are refused by name.
fn detect_inpainting(index: &SafetensorsIndex, cfg: &ModelConfig) -> Result<bool, String> {
    let name = format!("{UNET_PREFIX}input_blocks.0.0.weight");
    let inpainting = ModelConfig {
        inpainting: true,
        ..cfg.clone()
    };
    match width_of(index, &name) {
        None => Err(format!("a UNet without {name}")),
        Some(c) if c == cfg.unet_in_channels() => Ok(false),
        Some(c) if c == inpainting.unet_in_channels() => Ok(true),
        Some(c) => Err(format!(
            "a UNet whose input convolution takes {c} channels; weft runs UNets of {} (text to image) or {} (inpainting) input channels",
            cfg.unet_in_channels(),
            inpainting.unet_in_channels()
        )),
    }
}

/// The configuration of the SD2 checkpoint `index`: transformer depths counted from the
/// file, the prediction read from it ([`sd2_predicts_v`]), inpainting UNets detected. The
/// unCLIP (label embedding) variant is refused.
fn sd2_config(index: &SafetensorsIndex) -> Result<ModelConfig, String> {
    if let Some(adm) = width_of(index, &format!("{UNET_PREFIX}label_emb.0.0.weight")) {
        return Err(format!(
            "Stable Diffusion 2.1 unCLIP (a {adm}-wide image embedding); weft runs SD2 text-to-image checkpoints, not unCLIP"
        ));
    }
    let mut cfg = ModelConfig::sd2();
    count_transformer_depths(index, &mut cfg)?;
    cfg.inpainting = detect_inpainting(index, &cfg)?;
    // As ComfyUI: only a 4-channel SD2 UNet may predict v; inpainting ones predict the noise.
    cfg.v_prediction = !cfg.inpainting && sd2_predicts_v(index)?;
    Ok(cfg)
}

/// Whether the SD2 checkpoint `index` predicts v: the population standard deviation of
/// [`SD2_V_PROBE`] is above [`SD2_V_STD`] (ComfyUI's test). A file without that tensor
/// predicts the noise.
pub fn sd2_predicts_v(index: &SafetensorsIndex) -> Result<bool, String> {
    let name = format!("{UNET_PREFIX}{SD2_V_PROBE}");
    if !index.tensors.contains_key(&name) {
        return Ok(false);
    }
    let values = index.read_f32(&name).map_err(|e| e.to_string())?;
    if values.is_empty() {
        return Ok(false);
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let variance = values.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / n;
    Ok(variance.sqrt() > f64::from(SD2_V_STD))
}

/// The most transformer blocks one UNet block may have (SDXL's deepest has 10): a file
/// that claims more is refused before a layout of that size is built.
const MAX_TRANSFORMER_DEPTH: usize = 64;

/// A UNet block that may hold transformer blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// Residual block `j` of level `level` of the down path.
    Down {
        /// The level.
        level: usize,
        /// The block in the level.
        j: usize,
        /// Residual blocks per level.
        blocks: usize,
    },
    /// Block `j` of up block `up` (up blocks are numbered from the bottom level).
    Up {
        /// The up block.
        up: usize,
        /// The block in it.
        j: usize,
        /// Residual blocks per level.
        blocks: usize,
    },
    /// The middle block.
    Middle,
}

impl Block {
    /// Its attention's original (LDM) name: `input_blocks.4.1`, `output_blocks.2.1`,
    /// `middle_block.1`.
    pub fn ldm_name(self) -> String {
        match self {
            Block::Down { level, j, blocks } => format!("input_blocks.{}.1", 1 + level * (blocks + 1) + j),
            Block::Up { up, j, blocks } => format!("output_blocks.{}.1", up * (blocks + 1) + j),
            Block::Middle => "middle_block.1".to_string(),
        }
    }

    /// Its attention's diffusers name: `down_blocks.1.attentions.0`, `mid_block.attentions.0`.
    pub fn diffusers_name(self) -> String {
        match self {
            Block::Down { level, j, .. } => format!("down_blocks.{level}.attentions.{j}"),
            Block::Up { up, j, .. } => format!("up_blocks.{up}.attentions.{j}"),
            Block::Middle => "mid_block.attentions.0".to_string(),
        }
    }
}

/// Transformer blocks under `prefix` (`...input_blocks.3.1.transformer_blocks.`): the
/// blocks `0..n` the file has, or an error for gaps or more than [`MAX_TRANSFORMER_DEPTH`].
fn transformer_blocks(index: &SafetensorsIndex, prefix: &str) -> Result<usize, String> {
    let found: std::collections::BTreeSet<usize> = index
        .tensors
        .keys()
        .filter_map(|k| k.strip_prefix(prefix)?.split('.').next()?.parse::<usize>().ok())
        .collect();
    let depth = found.last().map_or(0, |last| last + 1);
    if depth > MAX_TRANSFORMER_DEPTH || found.len() != depth {
        return Err(format!(
            "{prefix} has transformer blocks {:?}; a UNet block has 0 to {MAX_TRANSFORMER_DEPTH}, numbered from 0",
            found.iter().take(8).collect::<Vec<_>>()
        ));
    }
    Ok(depth)
}

/// Sets `cfg`'s transformer depths to those the checkpoint has.
fn count_transformer_depths(index: &SafetensorsIndex, cfg: &mut ModelConfig) -> Result<(), String> {
    count_depths_by(index, cfg, |block| {
        format!("{UNET_PREFIX}{}.transformer_blocks.", block.ldm_name())
    })
}

/// Sets `cfg`'s transformer depths to those the file has, where `prefix` names each block's
/// transformer blocks (`....transformer_blocks.`) in the file.
pub fn count_depths_by(
    index: &SafetensorsIndex,
    cfg: &mut ModelConfig,
    prefix: impl Fn(Block) -> String,
) -> Result<(), String> {
    let (levels, blocks) = (cfg.channel_mult.len(), cfg.num_res_blocks);
    for level in 0..levels {
        for j in 0..blocks {
            cfg.transformer_depth[level * blocks + j] =
                transformer_blocks(index, &prefix(Block::Down { level, j, blocks }))?;
        }
        for j in 0..=blocks {
            let up = levels - 1 - level;
            cfg.transformer_depth_output[level * (blocks + 1) + j] =
                transformer_blocks(index, &prefix(Block::Up { up, j, blocks }))?;
        }
    }
    let middle = transformer_blocks(index, &prefix(Block::Middle))?;
    cfg.transformer_depth_middle = (middle > 0).then_some(middle);
    Ok(())
}

/// Checks that `path` is a complete original-layout checkpoint of layout `cfg`; returns its
/// index.
pub fn open_checkpoint(path: &Path, cfg: &ModelConfig, max_header: u64) -> Result<SafetensorsIndex, CheckpointError> {
    let index = SafetensorsIndex::open(path, max_header)?;
    let stock = [
        ModelConfig::sd1(),
        ModelConfig::sdxl(),
        ModelConfig::sdxl_refiner(),
        ModelConfig::sd2(),
    ];
    if stock
        .iter()
        .any(|s| s.family == cfg.family && s.model_channels == cfg.model_channels)
    {
        let found = detect_arch(&index);
        let expected = match cfg.family {
            Family::Sd1 => Arch::Sd1,
            Family::Sdxl => Arch::Sdxl,
            Family::SdxlRefiner => Arch::SdxlRefiner,
            Family::Sd2 => Arch::Sd2,
        };
        if found != expected {
            return Err(CheckpointError::WrongArch {
                path: path.to_path_buf(),
                detail: format!("expected {expected}, found {found}"),
            });
        }
    }
    let mut problems: BTreeMap<String, String> = BTreeMap::new();
    for (name, shape) in checkpoint_layout(cfg) {
        let want_shape = shape.clone();
        match index.tensors.get(&name) {
            None => {
                // Some CLIP exports lack the `text_model.` level.
                let alt = name.replacen("transformer.text_model.", "transformer.", 1);
                match index.tensors.get(&alt) {
                    Some(t) if t.shape == want_shape => {}
                    _ => {
                        problems.insert(name, format!("missing, expected {want_shape:?}"));
                    }
                }
            }
            Some(t) if t.shape != want_shape => {
                problems.insert(name, format!("shape {:?}, expected {want_shape:?}", t.shape));
            }
            Some(t) if !matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) => {
                problems.insert(name, format!("dtype {}, expected F32, F16 or BF16", t.dtype.name()));
            }
            Some(_) => {}
        }
    }
    if !problems.is_empty() {
        let examples = problems
            .iter()
            .take(3)
            .map(|(k, v)| format!("{k} ({v})"))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(CheckpointError::MissingKeys {
            path: path.to_path_buf(),
            count: problems.len(),
            examples,
        });
    }
    Ok(index)
}

/// Writes a random-weight checkpoint in the original single-file layout for `cfg`
/// (weights ~ N(0, 0.02) from torch's seeded generator; norms at 1 / 0). For an SD2 `cfg`
/// that predicts v, [`SD2_V_PROBE`] gets values of standard deviation 0.2, which marks the
/// file as v-prediction.
pub fn write_random_checkpoint(path: &Path, cfg: &ModelConfig, seed: u64) -> std::io::Result<()> {
    let mut g = super::super::sampling::TorchGenerator::new(seed);
    let probe = (cfg.family == Family::Sd2 && cfg.v_prediction).then(|| format!("{UNET_PREFIX}{SD2_V_PROBE}"));
    let tensors: Vec<(String, Vec<usize>, Vec<f32>)> = checkpoint_layout(cfg)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let is_norm = name.contains("norm") && shape.len() == 1;
            let data = if probe.as_deref() == Some(name.as_str()) {
                g.randn(n).into_iter().map(|v| v * 0.2).collect()
            } else if is_norm {
                vec![if name.ends_with(".weight") { 1.0 } else { 0.0 }; n]
            } else {
                g.randn(n).into_iter().map(|v| v * 0.02).collect()
            };
            (name, shape, data)
        })
        .collect();
    let mut meta = BTreeMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    meta.insert(
        "weft.generator".to_string(),
        "random sd1-layout test checkpoint".to_string(),
    );
    super::safetensors::write_f32_safetensors(path, &tensors, &meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sd1_layout_size() {
        let layout = checkpoint_layout(&ModelConfig::sd1());
        let unet: usize = unet_layout(&ModelConfig::sd1())
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        // SD1.x UNet has 859,520,964 parameters.
        assert_eq!(unet, 859_520_964);
        let vae: usize = vae_layout(&ModelConfig::sd1())
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum();
        // AutoencoderKL (kl-f8): 83,653,863 parameters.
        assert_eq!(vae, 83_653_863);
        assert!(layout.len() > 1000);
    }

    #[test]
    fn names_map_uniquely() {
        for cfg in [ModelConfig::sd1(), ModelConfig::tiny()] {
            let mut seen = std::collections::BTreeSet::new();
            for (name, _) in checkpoint_layout(&cfg) {
                let (c, n) = ldm_to_candle(&name, &cfg).unwrap_or_else(|| panic!("unmapped {name}"));
                assert!(seen.insert((c, n.clone())), "duplicate target {n} from {name}");
            }
        }
        let cfg = ModelConfig::sd1();
        let m = |s: &str| ldm_to_candle(s, &cfg).unwrap().1;
        assert_eq!(
            m("model.diffusion_model.input_blocks.3.0.op.weight"),
            "down_blocks.0.downsamplers.0.conv.weight"
        );
        assert_eq!(
            m("model.diffusion_model.output_blocks.2.1.conv.bias"),
            "up_blocks.0.upsamplers.0.conv.bias"
        );
        assert_eq!(
            m("model.diffusion_model.output_blocks.5.2.conv.weight"),
            "up_blocks.1.upsamplers.0.conv.weight"
        );
        assert_eq!(
            m("model.diffusion_model.input_blocks.4.0.skip_connection.weight"),
            "down_blocks.1.resnets.0.conv_shortcut.weight"
        );
        assert_eq!(
            m("first_stage_model.decoder.up.3.block.0.conv1.weight"),
            "decoder.up_blocks.0.resnets.0.conv1.weight"
        );
        assert_eq!(
            m("first_stage_model.encoder.mid.attn_1.q.weight"),
            "encoder.mid_block.attentions.0.query.weight"
        );
    }

    #[test]
    fn tiny_checkpoint_round_trip() {
        let dir = std::env::temp_dir().join(format!("weft-sd1-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("tiny.safetensors");
        let cfg = ModelConfig::tiny();
        write_random_checkpoint(&p, &cfg, 1).unwrap();
        let idx = open_checkpoint(&p, &cfg, super::super::safetensors::DEFAULT_MAX_HEADER).unwrap();
        assert_eq!(idx.tensors.len(), checkpoint_layout(&cfg).len());
        // The full SD1 check rejects it (wrong shapes / arch).
        assert!(open_checkpoint(&p, &ModelConfig::sd1(), 1 << 30).is_err());
    }

    /// A float16 checkpoint with `layout`'s header whose data is a hole in the file: the
    /// header is all detection reads, and the file takes no disk space.
    fn sparse_checkpoint(dir: &Path, name: &str, layout: &[(String, Vec<usize>)]) -> std::path::PathBuf {
        let mut header = serde_json::Map::new();
        let mut offset = 0u64;
        for (key, shape) in layout {
            let bytes = shape.iter().product::<usize>() as u64 * 2;
            header.insert(
                key.clone(),
                serde_json::json!({"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
            );
            offset += bytes;
        }
        let mut json = serde_json::to_vec(&header).unwrap();
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let path = dir.join(name);
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&json);
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(bytes.len() as u64 + offset).unwrap();
        path
    }

    fn index_of(path: &Path) -> SafetensorsIndex {
        SafetensorsIndex::open(path, super::super::safetensors::DEFAULT_MAX_HEADER).unwrap()
    }

    #[test]
    fn sdxl_layouts_have_the_real_models_sizes() {
        let params = |layout: Layout| layout.iter().map(|(_, s)| s.iter().product::<usize>()).sum::<usize>();
        // ComfyUI's SDXL UNet (with its label embedding) and refiner UNet.
        assert_eq!(params(unet_layout(&ModelConfig::sdxl())), 2_567_463_684);
        assert_eq!(params(unet_layout(&ModelConfig::sdxl_refiner())), 2_259_526_660);
        let sdxl = ModelConfig::sdxl();
        // CLIP ViT-L's text tower without a projection, and bigG's with its projection.
        assert_eq!(params(clip_layout(&sdxl.text[0])), 123_060_480);
        assert_eq!(params(clip_layout(&sdxl.text[1])), 694_659_840);
        assert_eq!(checkpoint_layout(&sdxl).len(), 2_515 - 2);
        // SD2's UNet, and OpenCLIP ViT-H's text tower without its projection.
        let sd2 = ModelConfig::sd2();
        assert_eq!(params(unet_layout(&sd2)), 865_910_724);
        assert_eq!(params(clip_layout(&sd2.text[0])), 354_032_640 - 1024 * 1024);
    }

    #[test]
    fn sd2_prediction_is_read_from_the_probe_bias() {
        let dir = tempfile::tempdir().unwrap();
        for v_prediction in [false, true] {
            let cfg = ModelConfig {
                v_prediction,
                ..ModelConfig::tiny_sd2()
            };
            let path = dir.path().join(format!("sd2-{v_prediction}.safetensors"));
            write_random_checkpoint(&path, &cfg, 5).unwrap();
            let index = open_checkpoint(&path, &cfg, super::super::safetensors::DEFAULT_MAX_HEADER).unwrap();
            assert_eq!(sd2_predicts_v(&index).unwrap(), v_prediction);
        }
    }

    #[test]
    fn families_are_detected_from_keys_and_shapes() {
        let dir = tempfile::tempdir().unwrap();
        for (name, cfg, arch) in [
            ("sd1", ModelConfig::sd1(), Arch::Sd1),
            ("sdxl", ModelConfig::sdxl(), Arch::Sdxl),
            ("refiner", ModelConfig::sdxl_refiner(), Arch::SdxlRefiner),
            // A hole reads as zeros: the probe's spread is 0, so eps.
            ("sd2", ModelConfig::sd2(), Arch::Sd2),
        ] {
            let index = index_of(&sparse_checkpoint(dir.path(), name, &checkpoint_layout(&cfg)));
            assert_eq!(detect_arch(&index), arch, "{name}");
            assert_eq!(detect_config(&index).unwrap(), cfg, "{name}");
        }
        // A distilled SDXL (SSD-1B's depths): the depths come from the file.
        let mut ssd = ModelConfig::sdxl();
        ssd.transformer_depth = vec![0, 0, 2, 2, 4, 4];
        ssd.transformer_depth_output = vec![0, 0, 0, 1, 1, 2, 10, 4, 4];
        let index = index_of(&sparse_checkpoint(dir.path(), "ssd", &checkpoint_layout(&ssd)));
        assert_eq!(detect_config(&index).unwrap(), ssd);
        // A file claiming a huge or gappy depth is refused before any layout is built.
        let mut hostile = checkpoint_layout(&ModelConfig::sdxl());
        hostile.push((
            format!("{UNET_PREFIX}input_blocks.4.1.transformer_blocks.999999999.norm1.weight"),
            vec![640],
        ));
        let index = index_of(&sparse_checkpoint(dir.path(), "hostile", &hostile));
        let refused = detect_config(&index).unwrap_err();
        assert!(refused.contains("transformer blocks"), "{refused}");
        // SD2's unCLIP (label embedding) and inpainting (9 input channels) variants are
        // named, and refused.
        let unclip = ModelConfig {
            adm_in_channels: Some(1536),
            ..ModelConfig::sd2()
        };
        let index = index_of(&sparse_checkpoint(dir.path(), "unclip", &checkpoint_layout(&unclip)));
        assert_eq!(detect_arch(&index), Arch::Sd2);
        let refused = detect_config(&index).unwrap_err();
        assert!(refused.contains("unCLIP"), "{refused}");
        // Inpainting UNets (9 input channels) are detected in every family; other input
        // widths are refused by name.
        for base in [ModelConfig::sd1(), ModelConfig::sd2(), ModelConfig::sdxl()] {
            let inpainting = ModelConfig {
                inpainting: true,
                ..base.clone()
            };
            let index = index_of(&sparse_checkpoint(
                dir.path(),
                "inpainting",
                &checkpoint_layout(&inpainting),
            ));
            assert_eq!(detect_config(&index).unwrap(), inpainting);
            let conv_in = format!("{UNET_PREFIX}input_blocks.0.0.weight");
            let mut layout = checkpoint_layout(&base);
            layout
                .iter_mut()
                .filter(|(n, _)| *n == conv_in)
                .for_each(|(_, s)| s[1] = 7);
            let index = index_of(&sparse_checkpoint(dir.path(), "seven", &layout));
            let refused = detect_config(&index).unwrap_err();
            assert!(refused.contains("takes 7 channels"), "{refused}");
        }
        // A file without a UNet says what it has.
        let layout = clip_layout(&ModelConfig::sdxl().text[1]);
        let index = index_of(&sparse_checkpoint(dir.path(), "clip", &layout));
        let refused = detect_config(&index).unwrap_err();
        assert!(refused.contains("no UNet") && refused.contains("tensors"), "{refused}");
    }

    #[test]
    fn sdxl_names_map_onto_the_networks() {
        for cfg in [
            ModelConfig::sdxl(),
            ModelConfig::sdxl_refiner(),
            ModelConfig::tiny_sdxl(),
        ] {
            let unused = super::super::loader::verify_mapping(&cfg).unwrap();
            assert!(unused.is_empty(), "{:?}: never read: {unused:?}", cfg.family);
        }
        let cfg = ModelConfig::sdxl();
        let m = |s: &str| ldm_to_candle(s, &cfg);
        assert_eq!(
            m("conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_weight"),
            Some((
                Component::Clip(1),
                "text_model.encoder.layers.31.self_attn.in_proj.weight".into()
            ))
        );
        assert_eq!(
            m("conditioner.embedders.0.transformer.text_model.final_layer_norm.bias"),
            Some((Component::Clip(0), "text_model.final_layer_norm.bias".into()))
        );
        assert_eq!(
            m("model.diffusion_model.label_emb.0.2.weight"),
            Some((Component::Unet, "add_embedding.linear_2.weight".into()))
        );
        // The two tensors ComfyUI consumes and ignores.
        assert_eq!(m("conditioner.embedders.1.model.logit_scale"), None);
        assert_eq!(
            m("conditioner.embedders.0.transformer.text_model.embeddings.position_ids"),
            None
        );
    }
}
