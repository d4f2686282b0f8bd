//! SD1.x discrete-time model sampling (ComfyUI `ModelSamplingDiscrete` with EPS prediction).

/// Sigma table of a discrete-time (DDPM-style) model, stored as float32 like ComfyUI's buffers.
#[derive(Debug, Clone)]
pub struct ModelSampling {
    sigmas: Vec<f32>,
    log_sigmas: Vec<f32>,
}

impl ModelSampling {
    /// SD1.x defaults: linear beta schedule 0.00085..0.012 over 1000 timesteps.
    pub fn sd1() -> Self {
        Self::linear(1000, 0.00085, 0.012)
    }

    /// `make_beta_schedule("linear")`: betas = linspace(sqrt(start), sqrt(end), n)^2 in float64.
    pub fn linear(timesteps: usize, linear_start: f64, linear_end: f64) -> Self {
        let betas: Vec<f64> = linspace_f64(linear_start.sqrt(), linear_end.sqrt(), timesteps)
            .into_iter()
            .map(|b| b * b)
            .collect();
        let mut cumprod = 1.0f64;
        let mut sigmas64 = Vec::with_capacity(timesteps);
        for b in betas {
            cumprod *= 1.0 - b;
            sigmas64.push(((1.0 - cumprod) / cumprod).sqrt());
        }
        Self::from_sigmas_f64(&sigmas64)
    }

    /// Builds the float32 buffers from a float64 sigma table (log taken in float64).
    pub fn from_sigmas_f64(sigmas: &[f64]) -> Self {
        ModelSampling {
            sigmas: sigmas.iter().map(|&s| s as f32).collect(),
            log_sigmas: sigmas.iter().map(|&s| s.ln() as f32).collect(),
        }
    }

    /// The float32 sigma table, ascending (index = timestep).
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// The float32 log-sigma table.
    pub fn log_sigmas(&self) -> &[f32] {
        &self.log_sigmas
    }

    /// Smallest sigma (`sigmas[0]`).
    pub fn sigma_min(&self) -> f32 {
        self.sigmas[0]
    }

    /// Largest sigma (`sigmas[-1]`).
    pub fn sigma_max(&self) -> f32 {
        *self.sigmas.last().expect("non-empty sigma table")
    }

    /// Nearest timestep index to `sigma` in log space (ComfyUI `timestep`, first index on ties).
    pub fn timestep(&self, sigma: f32) -> usize {
        let ls = crate_log_f32(sigma);
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

    /// Sigma at a fractional timestep by linear interpolation of log sigmas (ComfyUI `sigma`).
    pub fn sigma(&self, timestep: f32) -> f32 {
        let t = timestep.clamp(0.0, (self.sigmas.len() - 1) as f32);
        let lo = t.floor() as usize;
        let hi = t.ceil() as usize;
        let w = t - t.floor();
        let log_sigma = (1.0 - w) * self.log_sigmas[lo] + w * self.log_sigmas[hi];
        exp_f32(log_sigma)
    }

    /// KSAMPLER's `max_denoise` test: `sigma` equals `sigma_max` within 1e-5 relative, or
    /// exceeds it.
    pub fn is_max_denoise(&self, sigma: f32) -> bool {
        let (m, s) = (self.sigma_max() as f64, sigma as f64);
        (m - s).abs() <= 1e-5 * m.abs().max(s.abs()) || s > m
    }

    /// EPS noise scaling: `noise * sigma + latent` (or `noise * sqrt(1 + sigma^2) + latent`
    /// when `max_denoise`), as KSAMPLER applies before sampling.
    pub fn noise_scaling(&self, sigma: f32, noise: &[f32], latent: &[f32], max_denoise: bool) -> Vec<f32> {
        let scale = if max_denoise {
            sqrt_f32(1.0 + sigma * sigma)
        } else {
            sigma
        };
        noise.iter().zip(latent).map(|(&n, &l)| n * scale + l).collect()
    }
}

fn crate_log_f32(x: f32) -> f32 {
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
        assert_eq!(ms.timestep(ms.sigma_max()), 999);
        assert_eq!(ms.timestep(ms.sigma_min()), 0);
    }
}
