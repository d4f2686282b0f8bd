//! CLIP text-encoding time on the SD1.5-layout checkpoint: weft's CLIP text transformer on
//! one 77-token prompt (one chunk), against Hugging Face `transformers`' `CLIPTextModel` on
//! the same weights when `WEFT_BENCH_PYTHON` names an interpreter with `torch`,
//! `transformers` and `safetensors` (it runs `examples/clip_encode_torch.py`, 2 threads).
//!
//! `cargo run -p weft-compute --example clip_encode [CHECKPOINT]`; without a checkpoint the
//! seed-0 random one is written once into the cache directory (`weft models sd15-random`).
//! `WEFT_BENCH_RUNS` (default 5) sets the timed runs; the median is printed.

use std::path::PathBuf;
use std::time::Instant;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use weft_compute::diffusion::lora::load_component;
use weft_compute::diffusion::prompt::encode_prompt;
use weft_compute::models::{sd15_random, ClipText, Component, Sd1Config};

// The server's allocator: the kernels' speed depends on it (see weft-allocator).
weft_allocator::install!();

/// A prompt of 72 tokens: one chunk of 77 with the start, end and padding tokens.
fn prompt() -> String {
    "a lighthouse at dusk, oil painting, ".repeat(9)
}

/// CPU seconds (user + system, all threads) this process has used so far; Linux only (0
/// elsewhere). Printed next to wall time: on a shared machine it moves far less with load.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let checkpoint = match std::env::args().nth(1) {
        Some(path) => PathBuf::from(path),
        None => sd15_random::cached_seed0(&sd15_random::cache_dir())?,
    };
    let runs: usize = std::env::var("WEFT_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let cfg = Sd1Config::sd1();
    let tensors = load_component(&checkpoint, &cfg, Component::Clip, &Device::Cpu)?;
    let clip = ClipText::new(
        VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu).pp("text_model"),
        &cfg,
    )?;
    let text = prompt();
    let chunks = weft_compute::diffusion::prompt::tokenize(&text, None)?;
    anyhow::ensure!(chunks.len() == 1, "the prompt should fill one chunk");
    encode_prompt(&clip, clip.layer_count(), &text, None)?;
    let cpu_before = cpu_seconds();
    let times: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            encode_prompt(&clip, clip.layer_count(), &text, None).map(|_| started.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<Result<_, _>>()?;
    let ours = median(times);
    let ours_cpu = (cpu_seconds() - cpu_before) * 1e3 / runs as f64;
    println!(
        "weft CLIP, 77 tokens, {} rayon threads: {ours:.1} ms wall (median of {runs}), {ours_cpu:.1} ms CPU per encode",
        rayon::current_num_threads()
    );
    if let Ok(python) = std::env::var("WEFT_BENCH_PYTHON") {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/clip_encode_torch.py");
        let out = std::process::Command::new(python)
            .arg(&script)
            .arg(&checkpoint)
            .arg(runs.to_string())
            .arg(&text)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let figure = |key: &str| -> anyhow::Result<f64> {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("no {key} from {}: {stdout}", script.display()))
        };
        let (theirs, theirs_cpu) = (figure("ms=")?, figure("cpu_ms=")?);
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
