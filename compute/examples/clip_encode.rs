//! CLIP text-encoding time on the SD1.5-layout checkpoint: weft's CLIP text transformer on
//! one 77-token prompt (one chunk), against Hugging Face `transformers`' `CLIPTextModel` on
//! the same weights when `WEFT_BENCH_PYTHON` names an interpreter with `torch`,
//! `transformers` and `safetensors` (it runs `examples/clip_encode_torch.py`, 2 threads).
//!
//! `cargo run -p weft-compute --example clip_encode [CHECKPOINT]`; without a checkpoint the
//! seed-0 random one is written once into the cache directory (`weft models sd15-random`).
//! `WEFT_BENCH_RUNS` (default 5) sets the timed runs; the median is printed.

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use weft_compute::diffusion::lora::load_component;
use weft_compute::diffusion::prompt::encode_prompt;
use weft_compute::models::{ClipText, Component, ModelConfig};

mod support;

// The server's allocator: the kernels' speed depends on it (see weft-allocator).
weft_allocator::install!();

/// A prompt of 72 tokens: one chunk of 77 with the start, end and padding tokens.
fn prompt() -> String {
    "a lighthouse at dusk, oil painting, ".repeat(9)
}

fn main() -> anyhow::Result<()> {
    let checkpoint = support::checkpoint()?;
    let runs = support::runs(5);
    let cfg = ModelConfig::sd1();
    let tensors = load_component(&checkpoint, &cfg, Component::Clip(0), &Device::Cpu)?;
    let clip = ClipText::new(
        VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu),
        &cfg.text[0],
    )?;
    let text = prompt();
    let chunks = weft_compute::diffusion::prompt::tokenize(&text, None)?;
    anyhow::ensure!(chunks.len() == 1, "the prompt should fill one chunk");
    let (ours, ours_cpu) = support::time_runs(runs, || {
        encode_prompt(&clip, clip.layer_count(), &text, None)?;
        Ok(())
    })?;
    println!(
        "weft CLIP, 77 tokens, {} rayon threads: {ours:.1} ms wall (median of {runs}), {ours_cpu:.1} ms CPU per encode",
        rayon::current_num_threads()
    );
    let run_count = runs.to_string();
    let args = [checkpoint.as_os_str(), run_count.as_ref(), text.as_ref()];
    if let Some((theirs, theirs_cpu)) = support::torch_figures("clip_encode_torch.py", &args)? {
        println!(
            "transformers CLIPTextModel, 77 tokens, 2 threads: {theirs:.1} ms wall (median of {runs}), {theirs_cpu:.1} ms CPU per encode"
        );
        println!(
            "weft / PyTorch: {:.2} wall, {:.2} CPU",
            ours / theirs,
            ours_cpu / theirs_cpu
        );
    }
    Ok(())
}
