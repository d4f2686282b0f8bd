//! The noise schedules of ComfyUI's custom-sampling nodes that `KSampler` has no scheduler
//! name for (`PolyexponentialScheduler`, `LaplaceScheduler`, `VPScheduler`,
//! `SDTurboScheduler`, `AlignYourStepsScheduler`), and the `SIGMAS` edits (`SplitSigmas`,
//! `SplitSigmasDenoise`, `FlipSigmas`, `SetFirstSigma`), in torch's float32 arithmetic.
//! Karras, exponential, beta and `BasicScheduler` reuse [`super::scheduler`].

use std::fmt;
use std::str::FromStr;

use super::model_sampling::{exp_f32, linspace_f32, linspace_f64, ModelSampling};
use super::scheduler::{pow_f32, UnknownName};

/// `get_sigmas_polyexponential(n, sigma_min, sigma_max, rho)`: a polynomial in log sigma.
pub fn polyexponential(n: usize, sigma_min: f64, sigma_max: f64, rho: f64) -> Vec<f32> {
    let span = (sigma_max.ln() - sigma_min.ln()) as f32;
    let low = sigma_min.ln() as f32;
    let mut out: Vec<f32> = linspace_f32(1.0, 0.0, n)
        .into_iter()
        .map(|ramp| exp_f32(pow_f32(ramp, rho as f32) * span + low))
        .collect();
    out.push(0.0);
    out
}

/// `get_sigmas_laplace(n, sigma_min, sigma_max, mu, beta)`: Laplace-distributed log sigmas,
/// clamped to the range. As in ComfyUI, no final 0 is appended.
pub fn laplace(n: usize, sigma_min: f64, sigma_max: f64, mu: f64, beta: f64) -> Vec<f32> {
    let epsilon = 1e-5f32;
    linspace_f32(0.0, 1.0, n)
        .into_iter()
        .map(|x| {
            let centred = 0.5 - x;
            let sign = if centred > 0.0 {
                1.0
            } else if centred < 0.0 {
                -1.0
            } else {
                0.0
            };
            let log = ((1.0 - 2.0 * centred.abs() + epsilon) as f64).ln() as f32;
            let lmb = mu as f32 - ((beta as f32) * sign) * log;
            exp_f32(lmb).clamp(sigma_min as f32, sigma_max as f32)
        })
        .collect()
}

/// `get_sigmas_vp(n, beta_d, beta_min, eps_s)`: a continuous VP schedule.
pub fn vp(n: usize, beta_d: f64, beta_min: f64, eps_s: f64) -> Vec<f32> {
    let mut out: Vec<f32> = linspace_f32(1.0, eps_s as f32, n)
        .into_iter()
        .map(|t| {
            let exponent = (beta_d as f32) * (t * t) / 2.0 + (beta_min as f32) * t;
            ((exponent as f64).exp_m1() as f32).sqrt()
        })
        .collect();
    out.push(0.0);
    out
}

/// `SDTurboScheduler`: `steps` of the timesteps 999, 899, ... 99, starting
/// `10 - int(10 * denoise)` of them in, as `ms`'s sigmas, and a final 0.
pub fn sd_turbo(ms: &ModelSampling, steps: usize, denoise: f64) -> Vec<f32> {
    let start = 10 - ((10.0 * denoise) as i64).clamp(0, 10) as usize;
    let mut out: Vec<f32> = (start..10)
        .take(steps)
        .map(|i| ms.sigma((999 - 100 * i) as f32))
        .collect();
    out.push(0.0);
    out
}

/// The model families `AlignYourStepsScheduler` has noise levels for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AysModel {
    /// Stable Diffusion 1.x.
    Sd1,
    /// SDXL.
    Sdxl,
    /// Stable Video Diffusion.
    Svd,
}

impl AysModel {
    /// Every family, in ComfyUI's order.
    pub const ALL: [AysModel; 3] = [AysModel::Sd1, AysModel::Sdxl, AysModel::Svd];

    /// ComfyUI's name (`model_type`).
    pub fn name(self) -> &'static str {
        match self {
            AysModel::Sd1 => "SD1",
            AysModel::Sdxl => "SDXL",
            AysModel::Svd => "SVD",
        }
    }

    /// The published 10-step noise levels (Align Your Steps, NVIDIA 2024), highest first.
    fn noise_levels(self) -> [f64; 11] {
        match self {
            AysModel::Sd1 => [
                14.6146412293,
                6.4745760956,
                3.8636745985,
                2.6946151520,
                1.8841921177,
                1.3943805092,
                0.9642583904,
                0.6523686016,
                0.3977456272,
                0.1515232662,
                0.0291671582,
            ],
            AysModel::Sdxl => [
                14.6146412293,
                6.3184485287,
                3.7681790315,
                2.1811480769,
                1.3405244945,
                0.8620721141,
                0.5550693289,
                0.3798540708,
                0.2332364134,
                0.1114188177,
                0.0291671582,
            ],
            AysModel::Svd => [
                700.00, 54.5, 15.886, 7.977, 4.248, 1.789, 0.981, 0.403, 0.173, 0.034, 0.002,
            ],
        }
    }
}

impl fmt::Display for AysModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AysModel {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AysModel::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownName {
                kind: "model type",
                name: s.to_string(),
                valid: AysModel::ALL.map(|m| m.name()).join(", "),
            })
    }
}

/// `AlignYourStepsScheduler`: the family's noise levels, interpolated log-linearly to
/// `steps + 1` values when `steps` is not 10, the last `round(steps * denoise) + 1` kept and
/// the final one set to 0. `denoise <= 0` gives no sigmas.
pub fn align_your_steps(model: AysModel, steps: usize, denoise: f64) -> Vec<f32> {
    if denoise <= 0.0 {
        return Vec::new();
    }
    let total = if denoise < 1.0 {
        (steps as f64 * denoise).round_ties_even() as usize
    } else {
        steps
    };
    let levels = model.noise_levels();
    let mut sigmas: Vec<f64> = if steps + 1 == levels.len() {
        levels.to_vec()
    } else {
        loglinear_interp(&levels, steps + 1)
    };
    let keep = (total + 1).min(sigmas.len());
    sigmas.drain(..sigmas.len() - keep);
    if let Some(last) = sigmas.last_mut() {
        *last = 0.0;
    }
    sigmas.into_iter().map(|s| s as f32).collect()
}

/// The log of `levels` (highest first) interpolated linearly, as numpy's `interp`, at `count`
/// evenly spaced points.
fn loglinear_interp(levels: &[f64], count: usize) -> Vec<f64> {
    let ys: Vec<f64> = levels.iter().rev().map(|v| v.ln()).collect();
    let xs = linspace_f64(0.0, 1.0, levels.len());
    let mut out: Vec<f64> = linspace_f64(0.0, 1.0, count)
        .into_iter()
        .map(|x| {
            let i = xs.partition_point(|&p| p <= x).clamp(1, xs.len() - 1);
            let (x0, x1, y0, y1) = (xs[i - 1], xs[i], ys[i - 1], ys[i]);
            let slope = (y1 - y0) / (x1 - x0);
            (slope * (x - x0) + y0).exp()
        })
        .collect();
    out.reverse();
    out
}

/// `SplitSigmas`: the sigmas up to and including `step`, and those from `step` on (they
/// share that sigma).
pub fn split(sigmas: &[f32], step: usize) -> (Vec<f32>, Vec<f32>) {
    let high = sigmas[..(step + 1).min(sigmas.len())].to_vec();
    let low = sigmas[step.min(sigmas.len())..].to_vec();
    (high, low)
}

/// `SplitSigmasDenoise`: the last `round(steps * denoise)` steps as the low part, the rest as
/// the high part, exactly as ComfyUI slices (`sigmas[:-n]`, `sigmas[-(n + 1):]`).
pub fn split_denoise(sigmas: &[f32], denoise: f64) -> (Vec<f32>, Vec<f32>) {
    let steps = sigmas.len().saturating_sub(1);
    let total = (steps as f64 * denoise).round_ties_even() as usize;
    // Python's `x[:-0]` is empty.
    let high = if total == 0 {
        Vec::new()
    } else {
        sigmas[..sigmas.len().saturating_sub(total)].to_vec()
    };
    let low = sigmas[sigmas.len().saturating_sub(total + 1)..].to_vec();
    (high, low)
}

/// `FlipSigmas`: the sigmas reversed, a leading 0 made 0.0001.
pub fn flip(sigmas: &[f32]) -> Vec<f32> {
    let mut out: Vec<f32> = sigmas.iter().rev().copied().collect();
    if let Some(first) = out.first_mut() {
        if *first == 0.0 {
            *first = 0.0001;
        }
    }
    out
}

/// `SetFirstSigma`: the sigmas with the first one replaced by `sigma`.
pub fn set_first(sigmas: &[f32], sigma: f64) -> Vec<f32> {
    let mut out = sigmas.to_vec();
    if let Some(first) = out.first_mut() {
        *first = sigma as f32;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_slice_as_python_does() {
        let s = [5.0f32, 4.0, 3.0, 2.0, 0.0];
        assert_eq!(split(&s, 2), (vec![5.0, 4.0, 3.0], vec![3.0, 2.0, 0.0]));
        assert_eq!(split(&s, 9), (s.to_vec(), vec![]));
        assert_eq!(split_denoise(&s, 0.5), (vec![5.0, 4.0, 3.0], vec![3.0, 2.0, 0.0]));
        assert_eq!(split_denoise(&s, 0.0), (vec![], vec![0.0]));
        assert_eq!(split_denoise(&s, 1.0), (vec![5.0], s.to_vec()));
        assert_eq!(split_denoise(&[], 1.0), (vec![], vec![]));
        assert_eq!(flip(&s), vec![0.0001, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(set_first(&s, 9.0)[0], 9.0);
        assert!(flip(&[]).is_empty());
    }

    #[test]
    fn align_your_steps_keeps_the_table_at_ten_steps() {
        let ten = align_your_steps(AysModel::Sdxl, 10, 1.0);
        assert_eq!(ten.len(), 11);
        assert_eq!(ten[0], 14.614_641_f32);
        assert_eq!(*ten.last().unwrap(), 0.0);
        let twenty = align_your_steps(AysModel::Sd1, 20, 1.0);
        assert_eq!(twenty.len(), 21);
        assert!(twenty.windows(2).all(|w| w[0] > w[1]));
        assert_eq!(align_your_steps(AysModel::Sd1, 20, 0.5).len(), 11);
        assert!(align_your_steps(AysModel::Sd1, 20, 0.0).is_empty());
    }
}
