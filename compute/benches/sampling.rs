//! Sampler throughput: `euler` steps per second with classifier-free guidance (one UNet call
//! on a batch of 2 per step, as ComfyUI's KSampler does), 512x512 image = 64x64 latent,
//! batch 1, on the tiny test UNet and on a full-size SD1.5 UNet with random weights (timing
//! does not depend on the weight values).
//!
//! `cargo bench -p weft-compute --bench sampling` prints candle's figures. With
//! `WEFT_BENCH_PYTHON=/path/to/python` (an interpreter with `torch` and `diffusers`), it also
//! runs `benches/sampling_torch.py` on the same architectures and inputs and prints the
//! ratio. `WEFT_BENCH_STEPS` (default 3) sets the timed steps; `WEFT_BENCH_MODELS` (default
//! `tiny,sd15`) picks the models.

use std::time::Instant;

use candle_core::{DType, Device, Tensor as CTensor};
use candle_nn::{VarBuilder, VarMap};
use weft_compute::models::{ModelConfig, Unet};
use weft_compute::sampling::{sample, ModelSampling, SamplerKind, Scheduler, StepControl, Tensor, ZeroNoise};
use weft_compute::text_to_image::GuidedUnet;

// The server's allocator: the kernels' speed depends on it (see weft-allocator).
weft_allocator::install!();

/// CPU seconds (user + system, all threads) this process has used so far; Linux only (0 elsewhere).
/// Reported next to wall time because the build machine is shared: CPU time per step is far
/// less sensitive to other load than wall time.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the ")" that ends the command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Fills every parameter with random values, as PyTorch's default initialisation does:
/// matrices and kernels normal with standard deviation 1/sqrt(fan-in), biases small,
/// normalisation scales 1. (A `VarMap` starts from zeros, which would leave the weights on
/// the kernel's shared zero page and time a model that never touches its 3.4 GB.)
fn randomize(varmap: &VarMap, device: &Device) -> anyhow::Result<()> {
    for (name, var) in varmap.data().lock().expect("var map lock").iter() {
        let dims = var.dims();
        let values = match dims {
            [_] if name.contains("norm") && name.ends_with("weight") => CTensor::ones(dims, DType::F32, device)?,
            [_] => CTensor::randn(0f32, 0.02, dims, device)?,
            [outputs, ..] => {
                let fan_in = (var.elem_count() / outputs.max(&1)).max(1);
                CTensor::randn(0f32, 1.0 / (fan_in as f32).sqrt(), dims, device)?
            }
            [] => continue,
        };
        var.set(&values)?;
    }
    Ok(())
}

/// Returns (steps per wall second, CPU seconds per step).
fn bench_candle(name: &str, cfg: &ModelConfig, steps: usize, device: &Device) -> anyhow::Result<(f64, f64)> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, device);
    // The first construction creates the variables, the second reads them once randomised
    // (the UNet stacks some weights into new tensors as it loads).
    Unet::new(vb.clone(), cfg)?;
    randomize(&varmap, device)?;
    let unet = Unet::new(vb, cfg)?;
    let params: usize = varmap.all_vars().iter().map(|v| v.elem_count()).sum();
    let cond = CTensor::randn(0f32, 1.0, (1, 77, cfg.context_dim), device)?;
    let uncond = CTensor::randn(0f32, 1.0, (1, 77, cfg.context_dim), device)?;
    let guided = GuidedUnet::new(&unet, &cond, &uncond, 7.5)?;
    let ms = ModelSampling::sd1();
    // One warm-up step (allocations, thread pools), then `steps` timed steps.
    let sigmas = weft_compute::sampling::ksampler_sigmas(&ms, Scheduler::Normal, SamplerKind::Euler, steps + 1, 1.0);
    let shape = vec![1, cfg.latent_channels, 64, 64];
    let x = weft_compute::sampling::seeded_noise(0, &shape);
    let x = x.with_data(x.data.iter().map(|v| v * sigmas[0]).collect());
    let mut started = None;
    let mut denoiser = |x: &Tensor, s: f32| guided.denoise(x, s);
    let mut cb = |info: &weft_compute::sampling::StepInfo<'_>| {
        // The callback runs after the step's model call; start the clock after the first.
        if info.step == 0 {
            started = Some((Instant::now(), cpu_seconds()));
        }
        StepControl::Continue
    };
    sample(SamplerKind::Euler, &mut denoiser, x, &sigmas, &mut ZeroNoise, &mut cb)?;
    let (t0, c0) = started.expect("ran");
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (cpu_seconds() - c0) / steps as f64;
    let rate = steps as f64 / secs;
    println!(
        "candle {name}: {params} UNet params, {steps} euler steps (cfg, batch 2 UNet) in {secs:.2}s = {rate:.4} \
         steps/s, {cpu:.2} CPU-s/step"
    );
    Ok((rate, cpu))
}

fn main() -> anyhow::Result<()> {
    let steps: usize = std::env::var("WEFT_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let models = std::env::var("WEFT_BENCH_MODELS").unwrap_or_else(|_| "tiny,sd15".into());
    let device = weft_compute::device::select_device();
    println!(
        "device: {}, {} threads available",
        weft_compute::device::describe(&device),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let python = std::env::var("WEFT_BENCH_PYTHON").ok();
    for name in models.split(',') {
        let cfg = match name {
            "tiny" => ModelConfig::tiny(),
            "sd15" => ModelConfig::sd1(),
            other => anyhow::bail!("unknown model {other}; use tiny or sd15"),
        };
        let (candle, candle_cpu) = bench_candle(name, &cfg, steps, &device)?;
        if let Some(py) = &python {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/sampling_torch.py");
            let out = std::process::Command::new(py)
                .args([script, name, &steps.to_string()])
                .output()?;
            anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            print!("{text}");
            let torch: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("steps_per_second="))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("no steps_per_second in torch output"))?;
            let torch_cpu: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix("cpu_seconds_per_step="))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(f64::NAN);
            println!(
                "ratio {name}: candle speed / torch speed = {:.3} by wall time, {:.3} by CPU time",
                candle / torch,
                torch_cpu / candle_cpu
            );
        }
    }
    Ok(())
}
