//! What the timing examples share: the checkpoint, the run count, CPU time, medians, and
//! the PyTorch side run as a child process.

use std::path::{Path, PathBuf};

use weft_compute::models::random_checkpoint;

/// The checkpoint named by the first argument, else the seed-0 random SD1.5 one, written
/// once into the cache directory (`weft models sd15-random`).
pub(crate) fn checkpoint() -> anyhow::Result<PathBuf> {
    match std::env::args().nth(1) {
        Some(path) => Ok(PathBuf::from(path)),
        None => random_checkpoint::SD15.cached_seed0(&random_checkpoint::cache_dir()),
    }
}

/// Timed runs: `WEFT_BENCH_RUNS`, default `default`, at least one.
pub(crate) fn runs(default: usize) -> usize {
    std::env::var("WEFT_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
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

/// The median of `v` (not empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `f` once to warm up, then `runs` times: the median wall milliseconds and the CPU
/// milliseconds per run.
pub(crate) fn time_runs(runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<(f64, f64)> {
    f()?;
    let cpu_before = cpu_seconds();
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = std::time::Instant::now();
        f()?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(times), (cpu_seconds() - cpu_before) * 1e3 / runs as f64))
}

/// When `WEFT_BENCH_PYTHON` names an interpreter, runs `examples/SCRIPT` with `args` and
/// returns the `ms=` and `cpu_ms=` figures it prints.
pub(crate) fn torch_figures(script: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<Option<(f64, f64)>> {
    let Ok(python) = std::env::var("WEFT_BENCH_PYTHON") else {
        return Ok(None);
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(script);
    let out = std::process::Command::new(python).arg(&script).args(args).output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let figure = |key: &str| -> anyhow::Result<f64> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no {key} from {}: {stdout}", script.display()))
    };
    Ok(Some((figure("ms=")?, figure("cpu_ms=")?)))
}
