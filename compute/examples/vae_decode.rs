//! VAE decode time on the SD1.5-layout checkpoint: weft's autoencoder decoding one latent
//! (512x512 pixels by default), against diffusers' `AutoencoderKL` on the same weights when
//! `WEFT_BENCH_PYTHON` names an interpreter with `torch`, `diffusers` and `safetensors` (it
//! runs `examples/vae_decode_torch.py`, 2 threads).
//!
//! `cargo run --release -p weft-compute --example vae_decode [CHECKPOINT]`; without a
//! checkpoint the seed-0 random one is written once into the cache directory (`weft models
//! sd15-random`). `WEFT_BENCH_RUNS` (default 3) sets the timed runs and `WEFT_BENCH_SIZE`
//! (default 512) the image side; the median is printed.

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use weft_compute::diffusion::lora::load_component;
use weft_compute::models::{Component, ModelConfig, Sd1Vae};
use weft_compute::sampling::Tensor;

mod support;

// The server's allocator: the kernels' speed depends on it (see weft-allocator).
weft_allocator::install!();

fn main() -> anyhow::Result<()> {
    let checkpoint = support::checkpoint()?;
    let runs = support::runs(3);
    let size: usize = std::env::var("WEFT_BENCH_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    anyhow::ensure!(
        size >= 8 && size.is_multiple_of(8),
        "WEFT_BENCH_SIZE must be a multiple of 8"
    );
    let cfg = ModelConfig::sd1();
    let tensors = load_component(&checkpoint, &cfg, Component::Vae, &Device::Cpu)?;
    let vae = Sd1Vae::new(VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu), &cfg)?;
    let side = size / 8;
    // The values do not change the work.
    let latent = Tensor::new(
        vec![1, cfg.latent_channels, side, side],
        (0..cfg.latent_channels * side * side)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect(),
    );
    let (ours, ours_cpu) = support::time_runs(runs, || {
        weft_compute::vae::decode_with(&vae, &Device::Cpu, cfg.latent_channels, &latent)?;
        Ok(())
    })?;
    println!(
        "weft VAE decode, {size}x{size}, {} rayon threads: {ours:.0} ms wall (median of {runs}), {ours_cpu:.0} ms CPU per decode",
        rayon::current_num_threads()
    );
    let (run_count, side_text) = (runs.to_string(), size.to_string());
    let args = [checkpoint.as_os_str(), run_count.as_ref(), side_text.as_ref()];
    if let Some((theirs, theirs_cpu)) = support::torch_figures("vae_decode_torch.py", &args)? {
        println!(
            "diffusers AutoencoderKL decode, {size}x{size}, 2 threads: {theirs:.0} ms wall (median of {runs}), {theirs_cpu:.0} ms CPU per decode"
        );
        println!(
            "weft / PyTorch: {:.2} wall, {:.2} CPU",
            ours / theirs,
            ours_cpu / theirs_cpu
        );
    }
    Ok(())
}
