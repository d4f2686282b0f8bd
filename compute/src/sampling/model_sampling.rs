//! ComfyUI's model sampling: a model's sigma table, how sigmas map to its timesteps, and what
//! its output means. SD1 and SDXL default to the discrete linear schedule with EPS
//! prediction; `ModelSamplingDiscrete` and `ModelSamplingContinuousEDM` patch in others.

use std::fmt;
use std::str::FromStr;

use super::prediction::Prediction;

/// Sigma table of a model, stored as float32 like ComfyUI's buffers, with the model's
/// timestep mapping and prediction type.
#[derive(Debug, Clone)]
pub struct ModelSampling {
    sigmas: Vec<f32>,
    log_sigmas: Vec<f32>,
    timing: Timing,
    prediction: Prediction,
    sigma_data: f32,
}

/// How sigmas map to the timesteps the model is conditioned on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Timing {
    /// The index of the nearest table entry (`ModelSamplingDiscrete`).
    Discrete,
    /// The original timestep of the nearest entry of a table that kept one timestep in
    /// `skip` (`ModelSamplingDiscreteDistilled`, LCM's 50 of 1000).
    Distilled {
        /// Original timesteps per kept entry.
        skip: usize,
    },
    /// `0.25 * ln(sigma)` (`ModelSamplingContinuousEDM`).
    Continuous,
}

/// The `sampling` choices of ComfyUI's `ModelSamplingDiscrete` node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiscreteSampling {
    /// `eps`: noise prediction.
    Eps,
    /// `v_prediction`: velocity prediction.
    VPrediction,
    /// `lcm`: a latent consistency model, over 50 of the 1000 timesteps.
    Lcm,
    /// `x0`: the model predicts the clean sample.
    X0,
    /// `img_to_img`: the clean sample from an unscaled input.
    ImgToImg,
}

impl DiscreteSampling {
    /// Every choice, in ComfyUI's order.
    pub const ALL: [DiscreteSampling; 5] = [
        DiscreteSampling::Eps,
        DiscreteSampling::VPrediction,
        DiscreteSampling::Lcm,
        DiscreteSampling::X0,
        DiscreteSampling::ImgToImg,
    ];

    /// The ComfyUI name.
    pub fn name(self) -> &'static str {
        match self {
            DiscreteSampling::Eps => "eps",
            DiscreteSampling::VPrediction => "v_prediction",
            DiscreteSampling::Lcm => "lcm",
            DiscreteSampling::X0 => "x0",
            DiscreteSampling::ImgToImg => "img_to_img",
        }
    }

    fn prediction(self) -> Prediction {
        match self {
            DiscreteSampling::Eps => Prediction::Eps,
            DiscreteSampling::VPrediction => Prediction::V,
            DiscreteSampling::Lcm => Prediction::Lcm,
            DiscreteSampling::X0 => Prediction::X0,
            DiscreteSampling::ImgToImg => Prediction::ImgToImg,
        }
    }
}

/// The `sampling` choices of ComfyUI's `ModelSamplingContinuousEDM` node that weft runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdmSampling {
    /// `v_prediction`: velocity prediction, `sigma_data` 1.
    VPrediction,
    /// `edm`: EDM preconditioning, `sigma_data` 0.5.
    Edm,
    /// `edm_playground_v2.5`: EDM preconditioning, `sigma_data` 0.5, with Playground
    /// v2.5's latent format (which the model, not this table, carries).
    EdmPlayground25,
    /// `eps`: noise prediction, `sigma_data` 1.
    Eps,
}

impl EdmSampling {
    /// Every choice, in ComfyUI's order.
    pub const ALL: [EdmSampling; 4] = [
        EdmSampling::VPrediction,
        EdmSampling::Edm,
        EdmSampling::EdmPlayground25,
        EdmSampling::Eps,
    ];

    /// The ComfyUI name.
    pub fn name(self) -> &'static str {
        match self {
            EdmSampling::VPrediction => "v_prediction",
            EdmSampling::Edm => "edm",
            EdmSampling::EdmPlayground25 => "edm_playground_v2.5",
            EdmSampling::Eps => "eps",
        }
    }

    fn prediction_and_sigma_data(self) -> (Prediction, f32) {
        match self {
            EdmSampling::VPrediction => (Prediction::V, 1.0),
            EdmSampling::Edm | EdmSampling::EdmPlayground25 => (Prediction::Edm, 0.5),
            EdmSampling::Eps => (Prediction::Eps, 1.0),
        }
    }
}

/// A `sampling` name a model-sampling node does not know.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown sampling '{name}' for {node}; valid names: {valid}")]
pub struct UnknownSampling {
    /// The node whose choices were asked for.
    pub node: &'static str,
    /// The name that was given.
    pub name: String,
    /// Comma-separated valid names.
    pub valid: String,
}

fn parse_choice<T: Copy>(
    node: &'static str,
    all: &[T],
    name_of: fn(T) -> &'static str,
    s: &str,
) -> Result<T, UnknownSampling> {
    all.iter()
        .copied()
        .find(|&k| name_of(k) == s)
        .ok_or_else(|| UnknownSampling {
            node,
            name: s.to_string(),
            valid: all.iter().map(|&k| name_of(k)).collect::<Vec<_>>().join(", "),
        })
}

impl FromStr for DiscreteSampling {
    type Err = UnknownSampling;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_choice("ModelSamplingDiscrete", &Self::ALL, Self::name, s)
    }
}

impl FromStr for EdmSampling {
    type Err = UnknownSampling;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_choice("ModelSamplingContinuousEDM", &Self::ALL, Self::name, s)
    }
}

impl fmt::Display for DiscreteSampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for EdmSampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Timesteps of the discrete schedules (SD1, SDXL).
const DISCRETE_TIMESTEPS: usize = 1000;
/// The timesteps LCM was distilled to.
const LCM_TIMESTEPS: usize = 50;
/// Entries of a continuous model's sigma table (kept for the table-based schedulers).
const CONTINUOUS_TABLE_LEN: usize = 1000;
/// The last `alphas_cumprod` of a zero-terminal-SNR schedule: ComfyUI's stand-in for 0,
/// which keeps the last sigma finite.
const ZSNR_LAST_ALPHA_BAR: f64 = 4.897_345_189_085_343_5e-8;

impl ModelSampling {
    /// SD1.x defaults: linear beta schedule 0.00085..0.012 over 1000 timesteps.
    pub fn sd1() -> Self {
        Self::linear(DISCRETE_TIMESTEPS, 0.00085, 0.012)
    }

    /// `make_beta_schedule("linear")` with EPS prediction: betas =
    /// linspace(sqrt(start), sqrt(end), n)^2 in float64.
    pub fn linear(timesteps: usize, linear_start: f64, linear_end: f64) -> Self {
        Self::from_sigmas_f64(&linear_sigmas_f64(timesteps, linear_start, linear_end))
    }

    /// Builds the float32 buffers from a float64 sigma table (log taken in float64), with
    /// EPS prediction.
    pub fn from_sigmas_f64(sigmas: &[f64]) -> Self {
        ModelSampling {
            sigmas: sigmas.iter().map(|&s| s as f32).collect(),
            log_sigmas: sigmas.iter().map(|&s| s.ln() as f32).collect(),
            timing: Timing::Discrete,
            prediction: Prediction::Eps,
            sigma_data: 1.0,
        }
    }

    /// What ComfyUI's `ModelSamplingDiscrete` node (0.3.64) makes for an SD1 or SDXL model:
    /// the linear schedule, rescaled to zero terminal SNR in float64 when `zsnr`, with
    /// `sampling`'s prediction; `lcm` keeps every 20th timestep of the float32 table.
    pub fn discrete(sampling: DiscreteSampling, zsnr: bool) -> Self {
        let mut sigmas = linear_sigmas_f64(DISCRETE_TIMESTEPS, 0.00085, 0.012);
        if zsnr {
            rescale_zero_terminal_snr(&mut sigmas);
        }
        let mut ms = Self::from_sigmas_f64(&sigmas);
        ms.prediction = sampling.prediction();
        if sampling == DiscreteSampling::Lcm {
            let skip = DISCRETE_TIMESTEPS / LCM_TIMESTEPS;
            let kept: Vec<f32> = (0..LCM_TIMESTEPS).map(|k| ms.sigmas[k * skip + skip - 1]).collect();
            ms.log_sigmas = kept.iter().map(|&s| ln_f32(s)).collect();
            ms.sigmas = kept;
            ms.timing = Timing::Distilled { skip };
        }
        ms
    }

    /// What ComfyUI's `ModelSamplingContinuousEDM` node makes: 1000 sigmas evenly spaced
    /// in log space from `sigma_min` to `sigma_max` (float32), timesteps `0.25 * ln(sigma)`,
    /// with `sampling`'s prediction and `sigma_data`. The range must be finite with
    /// `0 < sigma_min < sigma_max`.
    pub fn continuous_edm(sampling: EdmSampling, sigma_min: f64, sigma_max: f64) -> Result<Self, String> {
        if !(sigma_min.is_finite() && sigma_max.is_finite() && sigma_min > 0.0 && sigma_min < sigma_max) {
            return Err(format!(
                "sigma_min and sigma_max must be finite with 0 < sigma_min < sigma_max, got sigma_min \
                 {sigma_min} and sigma_max {sigma_max}"
            ));
        }
        let (prediction, sigma_data) = sampling.prediction_and_sigma_data();
        let logs = linspace_f32(sigma_min.ln() as f32, sigma_max.ln() as f32, CONTINUOUS_TABLE_LEN);
        let sigmas: Vec<f32> = logs.into_iter().map(exp_f32).collect();
        Ok(ModelSampling {
            log_sigmas: sigmas.iter().map(|&s| ln_f32(s)).collect(),
            sigmas,
            timing: Timing::Continuous,
            prediction,
            sigma_data,
        })
    }

    /// The float32 sigma table, ascending.
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// The float32 log-sigma table.
    pub fn log_sigmas(&self) -> &[f32] {
        &self.log_sigmas
    }

    /// What the model's output means.
    pub fn prediction(&self) -> Prediction {
        self.prediction
    }

    /// The data's standard deviation the input scaling assumes (1, or 0.5 for EDM).
    pub fn sigma_data(&self) -> f32 {
        self.sigma_data
    }

    /// Smallest sigma (`sigmas[0]`).
    pub fn sigma_min(&self) -> f32 {
        self.sigmas[0]
    }

    /// Largest sigma (`sigmas[-1]`).
    pub fn sigma_max(&self) -> f32 {
        *self.sigmas.last().expect("non-empty sigma table")
    }

    /// The model's timestep for `sigma` (ComfyUI `timestep`): the nearest table index in log
    /// space (first on ties), its original timestep for a distilled table, or
    /// `0.25 * ln(sigma)` for a continuous model.
    pub fn timestep(&self, sigma: f32) -> f32 {
        match self.timing {
            Timing::Discrete => self.nearest(sigma) as f32,
            Timing::Distilled { skip } => (self.nearest(sigma) * skip + (skip - 1)) as f32,
            Timing::Continuous => 0.25 * ln_f32(sigma),
        }
    }

    fn nearest(&self, sigma: f32) -> usize {
        let ls = ln_f32(sigma);
        let mut best = 0;
        let mut best_d = f32::INFINITY;
        for (i, &l) in self.log_sigmas.iter().enumerate() {
            let d = (ls - l).abs();
            if d < best_d {
                best_d = d;
                best = i;
            }
        }
        best
    }

    /// Sigma at a timestep (ComfyUI `sigma`): linear interpolation of the log sigmas at a
    /// fractional table index, or `exp(timestep / 0.25)` for a continuous model.
    pub fn sigma(&self, timestep: f32) -> f32 {
        let index = match self.timing {
            Timing::Discrete => timestep,
            Timing::Distilled { skip } => (timestep - (skip - 1) as f32) / skip as f32,
            Timing::Continuous => return exp_f32(timestep / 0.25),
        };
        let t = index.clamp(0.0, (self.sigmas.len() - 1) as f32);
        let lo = t.floor() as usize;
        let hi = t.ceil() as usize;
        let w = t - t.floor();
        let log_sigma = (1.0 - w) * self.log_sigmas[lo] + w * self.log_sigmas[hi];
        exp_f32(log_sigma)
    }

    /// ComfyUI's `percent_to_sigma`: the sigma `percent` of the way through sampling, for a
    /// conditioning's timestep range (0 is above every sigma, 1 is 0).
    pub fn percent_to_sigma(&self, percent: f64) -> f32 {
        if percent <= 0.0 {
            return 999_999_999.9;
        }
        if percent >= 1.0 {
            return 0.0;
        }
        let rest = 1.0 - percent;
        match self.timing {
            Timing::Continuous => {
                let low = f64::from(self.sigma_min()).ln();
                ((f64::from(self.sigma_max()).ln() - low) * rest + low).exp() as f32
            }
            _ => self.sigma((rest * 999.0) as f32),
        }
    }

    /// The model's input for the noisy `x` at `sigma` (`calculate_input`).
    pub fn calculate_input(&self, sigma: f32, x: &[f32]) -> Vec<f32> {
        self.prediction.input(sigma, self.sigma_data, x)
    }

    /// The denoised prediction from the model's `output` for the noisy `input` at `sigma`
    /// (`calculate_denoised`).
    pub fn calculate_denoised(&self, sigma: f32, output: &[f32], input: &[f32]) -> Vec<f32> {
        let timestep = match self.prediction {
            Prediction::Lcm => self.timestep(sigma),
            _ => 0.0,
        };
        self.prediction
            .denoised(sigma, self.sigma_data, timestep, output, input)
    }

    /// KSAMPLER's `max_denoise` test: `sigma` equals `sigma_max` within 1e-5 relative, or
    /// exceeds it.
    pub fn is_max_denoise(&self, sigma: f32) -> bool {
        let (m, s) = (self.sigma_max() as f64, sigma as f64);
        (m - s).abs() <= 1e-5 * m.abs().max(s.abs()) || s > m
    }

    /// EPS noise scaling (every prediction here uses it): `noise * sigma + latent` (or
    /// `noise * sqrt(1 + sigma^2) + latent` when `max_denoise`), as KSAMPLER applies before
    /// sampling.
    pub fn noise_scaling(&self, sigma: f32, noise: &[f32], latent: &[f32], max_denoise: bool) -> Vec<f32> {
        let scale = if max_denoise {
            sqrt_f32(1.0 + sigma * sigma)
        } else {
            sigma
        };
        noise.iter().zip(latent).map(|(&n, &l)| n * scale + l).collect()
    }
}

/// The float64 sigmas of the linear beta schedule (`make_beta_schedule("linear")`, then
/// `sqrt((1 - alphas_cumprod) / alphas_cumprod)`).
fn linear_sigmas_f64(timesteps: usize, linear_start: f64, linear_end: f64) -> Vec<f64> {
    let mut cumprod = 1.0f64;
    linspace_f64(linear_start.sqrt(), linear_end.sqrt(), timesteps)
        .into_iter()
        .map(|b| {
            cumprod *= 1.0 - b * b;
            ((1.0 - cumprod) / cumprod).sqrt()
        })
        .collect()
}

/// `rescale_zero_terminal_snr_sigmas` (float64): `sqrt(alphas_cumprod)` shifted so the last
/// is 0 and scaled so the first keeps its value, the last `alphas_cumprod` then set to
/// [`ZSNR_LAST_ALPHA_BAR`].
fn rescale_zero_terminal_snr(sigmas: &mut [f64]) {
    let Some(&last_sigma) = sigmas.last() else {
        return;
    };
    let root_alpha_bar = |s: f64| (1.0 / (s * s + 1.0)).sqrt();
    let first = root_alpha_bar(sigmas[0]);
    let last = root_alpha_bar(last_sigma);
    let factor = first / (first - last);
    let n = sigmas.len();
    for (i, s) in sigmas.iter_mut().enumerate() {
        let shifted = (root_alpha_bar(*s) - last) * factor;
        let alpha_bar = if i + 1 == n {
            ZSNR_LAST_ALPHA_BAR
        } else {
            shifted * shifted
        };
        *s = ((1.0 - alpha_bar) / alpha_bar).sqrt();
    }
}

/// float32 `log`, correctly rounded.
pub(crate) fn ln_f32(x: f32) -> f32 {
    (x as f64).ln() as f32
}

/// float32 `exp`, correctly rounded.
pub(crate) fn exp_f32(x: f32) -> f32 {
    (x as f64).exp() as f32
}

/// float32 `sqrt` (IEEE).
pub(crate) fn sqrt_f32(x: f32) -> f32 {
    x.sqrt()
}

/// `torch.linspace` for float64 (same structure as the float32 kernel).
pub(crate) fn linspace_f64(start: f64, end: f64, n: usize) -> Vec<f64> {
    if n == 0 {
        return Vec::new();
    }
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f64;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f64, start)
            } else {
                (-step).mul_add((n - 1 - i) as f64, end)
            }
        })
        .collect()
}

/// `torch.linspace` for float32 as computed by torch's AVX2 kernels: `step = (end-start)/(n-1)` in
/// float32, then `fma(step, i, start)` for the first half and `fma(-step, n-1-i, end)` after.
pub(crate) fn linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    if n == 0 {
        return Vec::new();
    }
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    let half = n / 2;
    (0..n)
        .map(|i| {
            if i < half {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sd1_endpoints() {
        let ms = ModelSampling::sd1();
        assert_eq!(ms.sigmas().len(), 1000);
        assert_eq!(ms.sigma_min(), 0.029_167_158_f32);
        assert_eq!(ms.sigma_max(), 14.614_641_f32);
        assert_eq!(ms.timestep(ms.sigma_max()), 999.0);
        assert_eq!(ms.timestep(ms.sigma_min()), 0.0);
    }
}
