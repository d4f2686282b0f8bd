//! `weft models`: SD1.x checkpoints on the compute engine, and test checkpoints, from the command
//! line.

use std::path::PathBuf;

use clap::Subcommand;
use weft_compute::models::random_checkpoint;
use weft_compute::{codecs, device, diffusion, models, sampling, text_to_image};

/// The `weft models` subcommands.
#[derive(Subcommand)]
pub(crate) enum ModelsCommand {
    /// Writes a tiny random-weight SD1.x checkpoint in the single-file original layout.
    TinySd {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Writes a tiny random-weight SDXL checkpoint in the single-file layout (both text
    /// encoders, size conditioning; small widths).
    TinySdxl {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Writes a tiny random-weight SDXL refiner checkpoint in the single-file layout.
    TinySdxlRefiner {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Writes a tiny random-weight Stable Diffusion 2.x checkpoint in the single-file layout
    /// (OpenCLIP ViT-H-style text encoder, linear projections; small widths), eps
    /// prediction unless `--v-prediction`.
    TinySd2 {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Mark it a v-prediction checkpoint (SD2 768-v), as ComfyUI tells them apart: the
        /// biases of `output_blocks.11.1.transformer_blocks.0.norm1` get a spread above 0.09.
        #[arg(long)]
        v_prediction: bool,
    },
    /// Writes a checkpoint's networks as the separate files ComfyUI's `UNETLoader`,
    /// `CLIPLoader` / `DualCLIPLoader` and `VAELoader` read: `<stem>_unet`, `<stem>_clip_l`
    /// and/or `<stem>_clip_g` (Hugging Face layout) and `<stem>_vae`, float32.
    Split {
        /// The checkpoint (.safetensors, SD1.x, SDXL or the refiner; weft's tiny ones too).
        #[arg(long)]
        checkpoint: PathBuf,
        /// Directory to write the files into.
        #[arg(long)]
        out_dir: PathBuf,
    },
    /// Writes the deterministic random-weight checkpoint with the exact SD1.5 layout (2.1 GB,
    /// float16; seed 0 is the checkpoint of the ComfyUI parity vectors).
    Sd15Random {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Element type of the weights: fp16, or fp32 (twice the size).
        #[arg(long, default_value = "fp16")]
        dtype: random_checkpoint::Precision,
    },
    /// Writes the deterministic random-weight checkpoint with the exact SD1.5 inpainting
    /// layout (a UNet of 9 input channels; 2.1 GB, float16; seed 0 is the checkpoint of the
    /// inpainting parity checks).
    Sd15InpaintRandom {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Element type of the weights: fp16, or fp32 (twice the size).
        #[arg(long, default_value = "fp16")]
        dtype: random_checkpoint::Precision,
    },
    /// Writes the deterministic random-weight checkpoint with the exact SDXL base layout (6.9 GB,
    /// float16; seed 0 is the checkpoint of the SDXL parity checks).
    SdxlRandom {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Element type of the weights: fp16, or fp32 (twice the size).
        #[arg(long, default_value = "fp16")]
        dtype: random_checkpoint::Precision,
    },
    /// Writes a tiny random-weight standalone VAE (original layout) for `weft models tiny-sd`
    /// checkpoints, for the `vae` models folder.
    TinyVae {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Writes a tiny random LoRA (kohya layout) that fits `weft models tiny-sd` checkpoints,
    /// or with `--sdxl` `weft models tiny-sdxl` ones.
    TinyLora {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Rank of every patch.
        #[arg(long, default_value_t = 4)]
        rank: usize,
        /// Fit the tiny SDXL instead, with kohya's SDXL names: the UNet's original names with
        /// LoCon convolutions, `lora_te1_` and `lora_te2_` for its two text encoders.
        #[arg(long)]
        sdxl: bool,
    },
    /// Writes a tiny random textual-inversion embedding (A1111 `emb_params` layout) that
    /// fits `weft models tiny-sd` checkpoints, for the `embeddings` models folder.
    TinyEmbedding {
        /// Output .safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Seed of the random vectors.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Tokens the embedding stands for.
        #[arg(long, default_value_t = 2)]
        vectors: usize,
    },
    /// Text to image with an SD1.x checkpoint on the compute core (CPU, or CUDA when built
    /// with `--features cuda`); writes a PNG with the parameters in a `parameters` text chunk.
    Generate(GenerateArgs),
}

/// The arguments of `weft models generate`.
#[derive(clap::Args)]
pub(crate) struct GenerateArgs {
    /// The .safetensors checkpoint (original single-file layout).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The checkpoint has the tiny test layout (`weft models tiny-sd`).
    #[arg(long)]
    tiny: bool,
    /// Positive prompt.
    #[arg(long, default_value = "")]
    prompt: String,
    /// Negative prompt.
    #[arg(long, default_value = "")]
    negative: String,
    /// Noise seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sampler steps.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Guidance scale.
    #[arg(long, default_value_t = 8.0)]
    cfg: f32,
    /// Image width (a multiple of 8; of 2 with --tiny).
    #[arg(long, default_value_t = 512)]
    width: u32,
    /// Image height.
    #[arg(long, default_value_t = 512)]
    height: u32,
    /// Sampler, by ComfyUI name.
    #[arg(long, default_value = "euler")]
    sampler: String,
    /// Scheduler, by ComfyUI name.
    #[arg(long, default_value = "normal")]
    scheduler: String,
    /// Output PNG.
    #[arg(long)]
    out: PathBuf,
}

impl ModelsCommand {
    /// Runs the subcommand.
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            ModelsCommand::TinySd { out, seed } => tiny(&models::ModelConfig::tiny(), "SD1", out, seed),
            ModelsCommand::TinySdxl { out, seed } => tiny(&models::ModelConfig::tiny_sdxl(), "SDXL", out, seed),
            ModelsCommand::TinySdxlRefiner { out, seed } => {
                tiny(&models::ModelConfig::tiny_sdxl_refiner(), "SDXL refiner", out, seed)
            }
            ModelsCommand::TinySd2 {
                out,
                seed,
                v_prediction,
            } => {
                let config = models::ModelConfig {
                    v_prediction,
                    ..models::ModelConfig::tiny_sd2()
                };
                let what = if v_prediction { "SD2 (v-prediction)" } else { "SD2" };
                tiny(&config, what, out, seed)
            }
            ModelsCommand::Split { checkpoint, out_dir } => split(&checkpoint, &out_dir),
            ModelsCommand::Sd15Random { out, seed, dtype } => write_recipe(&random_checkpoint::SD15, out, seed, dtype),
            ModelsCommand::Sd15InpaintRandom { out, seed, dtype } => {
                write_recipe(&random_checkpoint::SD15_INPAINT, out, seed, dtype)
            }
            ModelsCommand::SdxlRandom { out, seed, dtype } => write_recipe(&random_checkpoint::SDXL, out, seed, dtype),
            ModelsCommand::TinyVae { out, seed } => tiny_vae(out, seed),
            ModelsCommand::TinyLora { out, seed, rank, sdxl } => tiny_lora(out, seed, rank, sdxl),
            ModelsCommand::TinyEmbedding { out, seed, vectors } => tiny_embedding(out, seed, vectors),
            ModelsCommand::Generate(args) => generate(args),
        }
    }
}

/// Writes a tiny random-weight checkpoint of layout `config` (family `what`).
fn tiny(config: &models::ModelConfig, what: &str, out: PathBuf, seed: u64) -> anyhow::Result<()> {
    models::write_random_checkpoint(&out, config, seed)?;
    println!("wrote a tiny random-weight {what} checkpoint to {}", out.display());
    Ok(())
}

/// Writes the networks of `checkpoint` into `out_dir` as separate files.
fn split(checkpoint: &std::path::Path, out_dir: &std::path::Path) -> anyhow::Result<()> {
    let config = diffusion::detect_layout(checkpoint)?;
    let index = models::SafetensorsIndex::open(checkpoint, models::DEFAULT_MAX_HEADER)?;
    let stem = checkpoint
        .file_stem()
        .and_then(|s| s.to_str())
        .ok_or_else(|| anyhow::anyhow!("{}: no file name", checkpoint.display()))?;
    let files = models::separate::write_split(&index, &config, out_dir, stem)?;
    println!("{}", files.unet.display());
    for (_, path) in &files.text {
        println!("{}", path.display());
    }
    println!("{}", files.vae.display());
    Ok(())
}

/// Writes a random checkpoint of `recipe` (the SD1.5 or SDXL layout).
fn write_recipe(
    recipe: &random_checkpoint::Recipe,
    out: PathBuf,
    seed: u64,
    dtype: random_checkpoint::Precision,
) -> anyhow::Result<()> {
    let written = recipe.write(&out, seed, dtype)?;
    println!("{}: {written:?}", out.display());
    Ok(())
}

/// Writes the tiny random standalone VAE.
fn tiny_vae(out: PathBuf, seed: u64) -> anyhow::Result<()> {
    diffusion::write_random_vae(&out, &models::ModelConfig::tiny(), seed)?;
    println!("wrote a tiny random-weight VAE to {}", out.display());
    Ok(())
}

/// Writes the tiny random LoRA, for the tiny SD1 checkpoint or with `sdxl` the tiny SDXL one.
fn tiny_lora(out: PathBuf, seed: u64, rank: usize, sdxl: bool) -> anyhow::Result<()> {
    let (cfg, family) = match sdxl {
        true => (models::ModelConfig::tiny_sdxl(), "SDXL"),
        false => (models::ModelConfig::tiny(), "SD1"),
    };
    diffusion::write_random_lora(&out, &cfg, seed, rank.max(1))?;
    println!("wrote a tiny random {family} LoRA to {}", out.display());
    Ok(())
}

/// Writes the tiny random embedding.
fn tiny_embedding(out: PathBuf, seed: u64, vectors: usize) -> anyhow::Result<()> {
    let width = models::ModelConfig::tiny().context_dim;
    diffusion::prompt::write_random_embedding(&out, width, vectors.clamp(1, 75), seed)?;
    println!("wrote a tiny random embedding to {}", out.display());
    Ok(())
}

/// Loads the checkpoint, runs text to image with progress on stderr, and writes the PNG.
fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let layout = if args.tiny {
        models::ModelConfig::tiny()
    } else {
        models::ModelConfig::sd1()
    };
    let device = device::select_device();
    let m = models::load_models(&args.checkpoint, &layout, &device)?;
    let req = text_to_image::TextToImage {
        prompt: args.prompt,
        negative: args.negative,
        width: args.width,
        height: args.height,
        seed: args.seed,
        steps: args.steps,
        cfg: args.cfg,
        sampler: args
            .sampler
            .parse::<sampling::SamplerKind>()
            .map_err(|e| anyhow::anyhow!("{e}"))?,
        scheduler: args
            .scheduler
            .parse::<sampling::Scheduler>()
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    };
    let image = text_to_image::text_to_image(&m, &req, &mut |s| {
        eprintln!("step {}/{} sigma {:.4}", s.step + 1, s.total, s.sigma);
        sampling::StepControl::Continue
    })?;
    let params = format!("{req:?}");
    std::fs::write(
        &args.out,
        codecs::encode_png(&image, 0, &[("parameters".to_string(), params)])?,
    )?;
    println!("wrote {}x{} image to {}", image.width, image.height, args.out.display());
    Ok(())
}
