//! ComfyUI's schedulers (`comfy.samplers.calculate_sigmas`) and KSampler's step handling.

use std::fmt;
use std::str::FromStr;

use super::beta_dist::beta_ppf;
use super::model_sampling::{exp_f32, linspace_f32, ModelSampling};
use super::SamplerKind;

/// A noise schedule, named as in ComfyUI's `SCHEDULER_NAMES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheduler {
    /// `simple`: evenly spaced entries of the model's sigma table.
    Simple,
    /// `sgm_uniform`: uniform timesteps, last one dropped.
    SgmUniform,
    /// `karras`: Karras et al. (2022), rho = 7.
    Karras,
    /// `exponential`: uniform in log sigma.
    Exponential,
    /// `ddim_uniform`: DDIM's uniform timestep stride.
    DdimUniform,
    /// `beta`: Beta(0.6, 0.6) quantiles of the timestep range.
    Beta,
    /// `normal`: uniform timesteps.
    Normal,
    /// `linear_quadratic`: Mochi's linear-then-quadratic schedule.
    LinearQuadratic,
    /// `kl_optimal`: tan-interpolated schedule (AYS paper).
    KlOptimal,
}

impl Scheduler {
    /// Every scheduler, in ComfyUI's order.
    pub const ALL: [Scheduler; 9] = [
        Scheduler::Simple,
        Scheduler::SgmUniform,
        Scheduler::Karras,
        Scheduler::Exponential,
        Scheduler::DdimUniform,
        Scheduler::Beta,
        Scheduler::Normal,
        Scheduler::LinearQuadratic,
        Scheduler::KlOptimal,
    ];

    /// The ComfyUI name.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Simple => "simple",
            Scheduler::SgmUniform => "sgm_uniform",
            Scheduler::Karras => "karras",
            Scheduler::Exponential => "exponential",
            Scheduler::DdimUniform => "ddim_uniform",
            Scheduler::Beta => "beta",
            Scheduler::Normal => "normal",
            Scheduler::LinearQuadratic => "linear_quadratic",
            Scheduler::KlOptimal => "kl_optimal",
        }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown scheduler or sampler name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown {kind} '{name}'; valid names: {valid}")]
pub struct UnknownName {
    /// "scheduler" or "sampler".
    pub kind: &'static str,
    /// The name that was given.
    pub name: String,
    /// Comma-separated valid names.
    pub valid: String,
}

impl FromStr for Scheduler {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scheduler::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownName {
                kind: "scheduler",
                name: s.to_string(),
                valid: Scheduler::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// `comfy.samplers.calculate_sigmas(model_sampling, scheduler, steps)`: float32 sigmas, normally
/// `steps + 1` long and ending in 0 (ComfyUI quirks kept: `ddim_uniform` can return more).
pub fn sigmas(ms: &ModelSampling, scheduler: Scheduler, steps: usize) -> Vec<f32> {
    if steps == 0 {
        return Vec::new();
    }
    match scheduler {
        Scheduler::Simple => simple(ms, steps),
        Scheduler::SgmUniform => normal(ms, steps, true),
        Scheduler::Karras => karras(steps, ms.sigma_min().into(), ms.sigma_max().into(), 7.0),
        Scheduler::Exponential => exponential(steps, ms.sigma_min().into(), ms.sigma_max().into()),
        Scheduler::DdimUniform => ddim_uniform(ms, steps),
        Scheduler::Beta => beta(ms, steps, 0.6, 0.6),
        Scheduler::Normal => normal(ms, steps, false),
        Scheduler::LinearQuadratic => linear_quadratic(ms, steps, 0.025),
        Scheduler::KlOptimal => kl_optimal(steps, ms.sigma_min(), ms.sigma_max()),
    }
}

/// KSampler's sigmas: `calculate_sigmas` with the discard-penultimate rule for `sampler`, and
/// `denoise < 1` handled like `KSampler.set_steps` (compute `int(steps / denoise)` steps and keep
/// the last `steps + 1` entries). `denoise <= 0` gives an empty schedule.
pub fn ksampler_sigmas(
    ms: &ModelSampling,
    scheduler: Scheduler,
    sampler: SamplerKind,
    steps: usize,
    denoise: f64,
) -> Vec<f32> {
    let calc = |steps: usize| {
        if sampler.discards_penultimate_sigma() {
            let s = sigmas(ms, scheduler, steps + 1);
            if s.len() < 2 {
                return s;
            }
            let mut out = s[..s.len() - 2].to_vec();
            out.push(s[s.len() - 1]);
            out
        } else {
            sigmas(ms, scheduler, steps)
        }
    };
    if denoise > 0.9999 {
        calc(steps)
    } else if denoise <= 0.0 {
        Vec::new()
    } else {
        let new_steps = (steps as f64 / denoise) as usize;
        let s = calc(new_steps);
        let keep = (steps + 1).min(s.len());
        s[s.len() - keep..].to_vec()
    }
}

fn simple(ms: &ModelSampling, steps: usize) -> Vec<f32> {
    let table = ms.sigmas();
    let ss = table.len() as f64 / steps as f64;
    let mut out: Vec<f32> = (0..steps)
        .map(|x| table[table.len() - 1 - (x as f64 * ss) as usize])
        .collect();
    out.push(0.0);
    out
}

fn ddim_uniform(ms: &ModelSampling, mut steps: usize) -> Vec<f32> {
    let table = ms.sigmas();
    let mut x = 1;
    let mut sigs = Vec::new();
    if (table[x] as f64).abs() <= 1e-5 {
        steps += 1;
    } else {
        sigs.push(0.0f32);
    }
    let ss = (table.len() / steps).max(1);
    while x < table.len() {
        sigs.push(table[x]);
        x += ss;
    }
    sigs.reverse();
    sigs
}

fn normal(ms: &ModelSampling, mut steps: usize, sgm: bool) -> Vec<f32> {
    let start = ms.timestep(ms.sigma_max());
    let end = ms.timestep(ms.sigma_min());
    let mut append_zero = true;
    let timesteps = if sgm {
        let mut t = linspace_f32(start, end, steps + 1);
        t.pop();
        t
    } else {
        if (ms.sigma(end) as f64).abs() <= 1e-5 {
            steps += 1;
            append_zero = false;
        }
        linspace_f32(start, end, steps)
    };
    let mut out: Vec<f32> = timesteps.iter().map(|&t| ms.sigma(t)).collect();
    if append_zero {
        out.push(0.0);
    }
    out
}

/// `get_sigmas_karras(n, sigma_min, sigma_max, rho)` with torch's float32 arithmetic.
pub fn karras(n: usize, sigma_min: f64, sigma_max: f64, rho: f64) -> Vec<f32> {
    let ramp = linspace_f32(0.0, 1.0, n);
    let min_inv_rho = sigma_min.powf(1.0 / rho);
    let max_inv_rho = sigma_max.powf(1.0 / rho);
    let diff = (min_inv_rho - max_inv_rho) as f32;
    let max32 = max_inv_rho as f32;
    let mut out: Vec<f32> = ramp
        .iter()
        .map(|&r| {
            let base = max32 + r * diff;
            pow_f32(base, rho as f32)
        })
        .collect();
    out.push(0.0);
    out
}

/// `get_sigmas_exponential(n, sigma_min, sigma_max)` with torch's float32 arithmetic.
pub fn exponential(n: usize, sigma_min: f64, sigma_max: f64) -> Vec<f32> {
    let start = sigma_max.ln() as f32;
    let end = sigma_min.ln() as f32;
    let mut out: Vec<f32> = linspace_f32(start, end, n).into_iter().map(exp_f32).collect();
    out.push(0.0);
    out
}

/// `beta_scheduler(model_sampling, steps, alpha, beta)`: the timesteps at Beta(`alpha`, `beta`)
/// quantiles, repeats dropped.
pub fn beta(ms: &ModelSampling, steps: usize, alpha: f64, beta: f64) -> Vec<f32> {
    let table = ms.sigmas();
    let total = (table.len() - 1) as f64;
    let step = 1.0 / steps as f64;
    let mut out = Vec::new();
    let mut last_t = -1.0f64;
    for i in 0..steps {
        let ts = 1.0 - (i as f64 * step + 0.0);
        let t = (beta_ppf(ts, alpha, beta) * total).round_ties_even();
        if t != last_t {
            out.push(table[t as usize]);
        }
        last_t = t;
    }
    out.push(0.0);
    out
}

fn linear_quadratic(ms: &ModelSampling, steps: usize, threshold_noise: f64) -> Vec<f32> {
    let schedule: Vec<f64> = if steps == 1 {
        vec![1.0, 0.0]
    } else {
        let linear_steps = steps / 2;
        let ls = linear_steps as f64;
        let mut sched: Vec<f64> = (0..linear_steps).map(|i| i as f64 * threshold_noise / ls).collect();
        let diff = ls - threshold_noise * steps as f64;
        let quadratic_steps = (steps - linear_steps) as f64;
        let quadratic_coef = diff / (ls * quadratic_steps.powi(2));
        let linear_coef = threshold_noise / ls - 2.0 * diff / quadratic_steps.powi(2);
        let constant = quadratic_coef * ls.powi(2);
        for i in linear_steps..steps {
            let i = i as f64;
            sched.push(quadratic_coef * i.powi(2) + linear_coef * i + constant);
        }
        sched.push(1.0);
        sched.into_iter().map(|x| 1.0 - x).collect()
    };
    let smax = ms.sigma_max();
    schedule.into_iter().map(|x| (x as f32) * smax).collect()
}

/// `kl_optimal_scheduler(n, sigma_min, sigma_max)`; `n == 1` gives `[NaN, 0]` like ComfyUI.
pub fn kl_optimal(n: usize, sigma_min: f32, sigma_max: f32) -> Vec<f32> {
    let atan_min = (sigma_min as f64).atan() as f32;
    let atan_max = (sigma_max as f64).atan() as f32;
    let denom = (n as f32) - 1.0;
    let mut out: Vec<f32> = (0..n)
        .map(|i| {
            let adj = i as f32 / denom;
            let v = adj * atan_min + (1.0 - adj) * atan_max;
            (v as f64).tan() as f32
        })
        .collect();
    out.push(0.0);
    out
}

/// float32 `pow` rounded from float64.
pub(crate) fn pow_f32(x: f32, y: f32) -> f32 {
    (x as f64).powf(y as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_names() {
        assert_eq!("karras".parse::<Scheduler>().unwrap(), Scheduler::Karras);
        let err = "nope".parse::<Scheduler>().unwrap_err().to_string();
        assert!(err.contains("kl_optimal"), "{err}");
    }

    #[test]
    fn lengths() {
        let ms = ModelSampling::sd1();
        for s in Scheduler::ALL {
            let v = sigmas(&ms, s, 10);
            assert!(v.len() >= 11, "{s}: {}", v.len());
            assert_eq!(*v.last().unwrap(), 0.0);
        }
        assert_eq!(sigmas(&ms, Scheduler::DdimUniform, 30).len(), 32);
    }

    #[test]
    fn denoise_keeps_tail() {
        let ms = ModelSampling::sd1();
        let full = sigmas(&ms, Scheduler::Karras, 40);
        let part = ksampler_sigmas(&ms, Scheduler::Karras, SamplerKind::Euler, 20, 0.5);
        assert_eq!(part, full[full.len() - 21..]);
    }
}
