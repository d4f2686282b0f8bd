//! k-diffusion samplers as ComfyUI runs them (default keyword arguments), in float32 with torch's
//! operation order. Scalar functions of sigmas (log, exp, expm1, sqrt, pow) are computed in
//! float64 and rounded, i.e. correctly rounded float32 values; torch's own CPU float32 functions
//! are occasionally 1 ulp off those, which perturbs results by ~1e-7..1e-6.

use std::fmt;
use std::str::FromStr;

use super::noise::NoiseSource;
use super::scheduler::UnknownName;
use super::{Denoiser, Tensor};

mod extra;

/// A sampler, named as in ComfyUI's `KSAMPLER_NAMES` (plus `ddim`, `uni_pc`, `uni_pc_bh2`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SamplerKind {
    /// `euler`
    Euler,
    /// `euler_ancestral`
    EulerAncestral,
    /// `heun`
    Heun,
    /// `heunpp2`
    Heunpp2,
    /// `dpm_2`
    Dpm2,
    /// `dpm_2_ancestral`
    Dpm2Ancestral,
    /// `lms` (order 4)
    Lms,
    /// `dpm_fast`
    DpmFast,
    /// `dpm_adaptive`
    DpmAdaptive,
    /// `dpmpp_2s_ancestral`
    Dpmpp2sAncestral,
    /// `dpmpp_sde` (noise from the injected [`NoiseSource`], not a Brownian tree)
    DpmppSde,
    /// `dpmpp_2m`
    Dpmpp2m,
    /// `dpmpp_2m_sde` (midpoint)
    Dpmpp2mSde,
    /// `dpmpp_2m_sde_heun`
    Dpmpp2mSdeHeun,
    /// `dpmpp_3m_sde`
    Dpmpp3mSde,
    /// `ddpm`
    Ddpm,
    /// `lcm`
    Lcm,
    /// `ipndm`
    Ipndm,
    /// `ipndm_v`
    IpndmV,
    /// `deis` (tab mode, order 3)
    Deis,
    /// `ddim` (ComfyUI runs Euler for it)
    Ddim,
    /// `uni_pc` (bh1)
    UniPc,
    /// `uni_pc_bh2`
    UniPcBh2,
    /// `res_multistep`
    ResMultistep,
    /// `res_multistep_ancestral`
    ResMultistepAncestral,
    /// `gradient_estimation`
    GradientEstimation,
    /// `er_sde`
    ErSde,
    /// `seeds_2`
    Seeds2,
    /// `seeds_3`
    Seeds3,
    /// `sa_solver`
    SaSolver,
    /// `sa_solver_pece`
    SaSolverPece,
}

impl SamplerKind {
    /// Every supported sampler.
    pub const ALL: [SamplerKind; 31] = [
        SamplerKind::Euler,
        SamplerKind::EulerAncestral,
        SamplerKind::Heun,
        SamplerKind::Heunpp2,
        SamplerKind::Dpm2,
        SamplerKind::Dpm2Ancestral,
        SamplerKind::Lms,
        SamplerKind::DpmFast,
        SamplerKind::DpmAdaptive,
        SamplerKind::Dpmpp2sAncestral,
        SamplerKind::DpmppSde,
        SamplerKind::Dpmpp2m,
        SamplerKind::Dpmpp2mSde,
        SamplerKind::Dpmpp2mSdeHeun,
        SamplerKind::Dpmpp3mSde,
        SamplerKind::Ddpm,
        SamplerKind::Lcm,
        SamplerKind::Ipndm,
        SamplerKind::IpndmV,
        SamplerKind::Deis,
        SamplerKind::Ddim,
        SamplerKind::UniPc,
        SamplerKind::UniPcBh2,
        SamplerKind::ResMultistep,
        SamplerKind::ResMultistepAncestral,
        SamplerKind::GradientEstimation,
        SamplerKind::ErSde,
        SamplerKind::Seeds2,
        SamplerKind::Seeds3,
        SamplerKind::SaSolver,
        SamplerKind::SaSolverPece,
    ];

    /// The ComfyUI name.
    pub fn name(self) -> &'static str {
        use SamplerKind::*;
        match self {
            Euler => "euler",
            EulerAncestral => "euler_ancestral",
            Heun => "heun",
            Heunpp2 => "heunpp2",
            Dpm2 => "dpm_2",
            Dpm2Ancestral => "dpm_2_ancestral",
            Lms => "lms",
            DpmFast => "dpm_fast",
            DpmAdaptive => "dpm_adaptive",
            Dpmpp2sAncestral => "dpmpp_2s_ancestral",
            DpmppSde => "dpmpp_sde",
            Dpmpp2m => "dpmpp_2m",
            Dpmpp2mSde => "dpmpp_2m_sde",
            Dpmpp2mSdeHeun => "dpmpp_2m_sde_heun",
            Dpmpp3mSde => "dpmpp_3m_sde",
            Ddpm => "ddpm",
            Lcm => "lcm",
            Ipndm => "ipndm",
            IpndmV => "ipndm_v",
            Deis => "deis",
            Ddim => "ddim",
            UniPc => "uni_pc",
            UniPcBh2 => "uni_pc_bh2",
            ResMultistep => "res_multistep",
            ResMultistepAncestral => "res_multistep_ancestral",
            GradientEstimation => "gradient_estimation",
            ErSde => "er_sde",
            Seeds2 => "seeds_2",
            Seeds3 => "seeds_3",
            SaSolver => "sa_solver",
            SaSolverPece => "sa_solver_pece",
        }
    }

    /// KSampler computes one extra step and drops the penultimate sigma for these samplers.
    pub fn discards_penultimate_sigma(self) -> bool {
        matches!(
            self,
            SamplerKind::Dpm2 | SamplerKind::Dpm2Ancestral | SamplerKind::UniPc | SamplerKind::UniPcBh2
        )
    }
}

impl fmt::Display for SamplerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SamplerKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The *_gpu variants only differ in where ComfyUI's default Brownian-tree noise is made.
        let base = match s {
            "dpmpp_sde_gpu" => "dpmpp_sde",
            "dpmpp_2m_sde_gpu" => "dpmpp_2m_sde",
            "dpmpp_2m_sde_heun_gpu" => "dpmpp_2m_sde_heun",
            "dpmpp_3m_sde_gpu" => "dpmpp_3m_sde",
            other => other,
        };
        SamplerKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == base)
            .ok_or_else(|| UnknownName {
                kind: "sampler",
                name: s.to_string(),
                valid: SamplerKind::ALL.map(|k| k.name()).join(", "),
            })
    }
}

/// What the per-step callback sees (ComfyUI's callback dict).
#[derive(Debug)]
pub struct StepInfo<'a> {
    /// Step index, 0-based.
    pub step: usize,
    /// Number of steps (`sigmas.len() - 1`; for `dpm_fast`/`dpm_adaptive` their own step count).
    pub total: usize,
    /// Sigma at the start of the step.
    pub sigma: f32,
    /// Sigma the model was evaluated at (differs from `sigma` only with churn).
    pub sigma_hat: f32,
    /// The sampler state at the start of the step.
    pub x: &'a Tensor,
    /// The model's denoised prediction at the start of the step.
    pub denoised: &'a Tensor,
}

/// Returned by the step callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepControl {
    /// Keep sampling.
    Continue,
    /// Cancel; [`sample`] returns [`SampleError::Cancelled`].
    Stop,
}

/// Why sampling did not finish.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// The callback asked to stop at this step.
    #[error("sampling cancelled at step {step}")]
    Cancelled {
        /// Step at which the callback returned [`StepControl::Stop`].
        step: usize,
    },
    /// The denoiser failed.
    #[error("denoiser failed: {0:#}")]
    Model(anyhow::Error),
    /// The noise source failed.
    #[error("noise source failed: {0:#}")]
    Noise(anyhow::Error),
    /// Bad arguments (shape mismatch, empty or invalid sigmas).
    #[error("invalid sampler input: {0}")]
    Invalid(String),
}

/// A sampler's own parameters, as ComfyUI's `Sampler*` nodes set them (`SamplerEulerAncestral`,
/// `SamplerDPMPP_SDE`, `SamplerLMS`, ...). [`Default`] is k-diffusion's keyword defaults,
/// which `KSampler` uses. Samplers without a parameter ignore it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerOptions {
    /// Ancestral noise strength (`eta`): 0 makes the ancestral and SDE samplers deterministic.
    pub eta: f64,
    /// Scale of the noise added (`s_noise`).
    pub s_noise: f64,
    /// `dpmpp_sde`'s intermediate step, as a fraction of each step in log sigma (`r`).
    pub r: f64,
    /// `lms`'s order (how many past derivatives it combines).
    pub order: usize,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            eta: 1.0,
            s_noise: 1.0,
            r: 0.5,
            order: 4,
        }
    }
}

impl SamplerOptions {
    /// Whether the SDE samplers add noise at all (ComfyUI skips it when `eta` or `s_noise` is 0).
    fn adds_noise(&self) -> bool {
        self.eta > 0.0 && self.s_noise > 0.0
    }
}

/// Runs `kind` from the noisy latent `x` (already scaled to `sigmas[0]`) down the schedule
/// `sigmas`, calling `callback` once per step. Returns the final latent.
pub fn sample(
    kind: SamplerKind,
    denoiser: &mut dyn Denoiser,
    x: Tensor,
    sigmas: &[f32],
    noise: &mut dyn NoiseSource,
    callback: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
) -> Result<Tensor, SampleError> {
    sample_with(kind, &SamplerOptions::default(), denoiser, x, sigmas, noise, callback)
}

/// [`sample`] with the sampler's own parameters `options` (ComfyUI's `Sampler*` nodes).
pub fn sample_with(
    kind: SamplerKind,
    options: &SamplerOptions,
    denoiser: &mut dyn Denoiser,
    x: Tensor,
    sigmas: &[f32],
    noise: &mut dyn NoiseSource,
    callback: &mut dyn FnMut(&StepInfo<'_>) -> StepControl,
) -> Result<Tensor, SampleError> {
    if sigmas.len() <= 1 {
        return Ok(x);
    }
    if sigmas.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return Err(SampleError::Invalid(format!(
            "sigmas must be finite and non-negative: {sigmas:?}"
        )));
    }
    let shape = x.shape.clone();
    let mut run = Run {
        model: denoiser,
        noise,
        callback,
        shape,
        total: sigmas.len() - 1,
        options: *options,
    };
    let x = x.data;
    use SamplerKind::*;
    let out = match kind {
        Euler | Ddim => euler(&mut run, x, sigmas)?,
        EulerAncestral => euler_ancestral(&mut run, x, sigmas)?,
        Heun => heun(&mut run, x, sigmas)?,
        Heunpp2 => heunpp2(&mut run, x, sigmas)?,
        Dpm2 => dpm_2(&mut run, x, sigmas)?,
        Dpm2Ancestral => dpm_2_ancestral(&mut run, x, sigmas)?,
        Lms => lms(&mut run, x, sigmas, options.order.max(1))?,
        Dpmpp2sAncestral => dpmpp_2s_ancestral(&mut run, x, sigmas)?,
        DpmppSde => dpmpp_sde(&mut run, x, sigmas)?,
        Dpmpp2m => dpmpp_2m(&mut run, x, sigmas)?,
        Dpmpp2mSde => dpmpp_2m_sde(&mut run, x, sigmas, false)?,
        Dpmpp2mSdeHeun => dpmpp_2m_sde(&mut run, x, sigmas, true)?,
        Dpmpp3mSde => dpmpp_3m_sde(&mut run, x, sigmas)?,
        Ddpm => ddpm(&mut run, x, sigmas)?,
        Lcm => lcm(&mut run, x, sigmas)?,
        Ipndm => ipndm(&mut run, x, sigmas)?,
        IpndmV => ipndm_v(&mut run, x, sigmas)?,
        Deis => deis(&mut run, x, sigmas)?,
        DpmFast => extra::dpm_fast(&mut run, x, sigmas)?,
        DpmAdaptive => extra::dpm_adaptive(&mut run, x, sigmas)?,
        UniPc => extra::uni_pc(&mut run, x, sigmas, false)?,
        UniPcBh2 => extra::uni_pc(&mut run, x, sigmas, true)?,
        ResMultistep => extra::res_multistep(&mut run, x, sigmas, 0.0)?,
        ResMultistepAncestral => extra::res_multistep(&mut run, x, sigmas, 1.0)?,
        GradientEstimation => extra::gradient_estimation(&mut run, x, sigmas)?,
        ErSde => extra::er_sde(&mut run, x, sigmas)?,
        Seeds2 => extra::seeds_2(&mut run, x, sigmas)?,
        Seeds3 => extra::seeds_3(&mut run, x, sigmas)?,
        SaSolver => extra::sa_solver(&mut run, x, sigmas, false)?,
        SaSolverPece => extra::sa_solver(&mut run, x, sigmas, true)?,
    };
    Ok(Tensor::new(run.shape, out))
}

pub(crate) type V = Vec<f32>;

pub(crate) struct Run<'a> {
    model: &'a mut dyn Denoiser,
    noise: &'a mut dyn NoiseSource,
    callback: &'a mut dyn FnMut(&StepInfo<'_>) -> StepControl,
    shape: Vec<usize>,
    pub(crate) total: usize,
    /// The sampler's own parameters.
    pub(crate) options: SamplerOptions,
}

impl Run<'_> {
    pub(crate) fn model(&mut self, x: &[f32], sigma: f32) -> Result<V, SampleError> {
        let t = Tensor::new(self.shape.clone(), x.to_vec());
        let out = self.model.denoise(&t, sigma).map_err(SampleError::Model)?;
        if out.data.len() != x.len() {
            return Err(SampleError::Model(anyhow::anyhow!(
                "denoiser returned {} elements for an input of {}",
                out.data.len(),
                x.len()
            )));
        }
        Ok(out.data)
    }

    pub(crate) fn noise(&mut self, sigma: f32, sigma_next: f32) -> Result<V, SampleError> {
        let t = self
            .noise
            .sample(sigma, sigma_next, &self.shape)
            .map_err(SampleError::Noise)?;
        if t.data.len() != self.shape.iter().product::<usize>() {
            return Err(SampleError::Noise(anyhow::anyhow!(
                "noise source returned {} elements for shape {:?}",
                t.data.len(),
                self.shape
            )));
        }
        Ok(t.data)
    }

    pub(crate) fn step(
        &mut self,
        i: usize,
        sigma: f32,
        sigma_hat: f32,
        x: &[f32],
        denoised: &[f32],
    ) -> Result<(), SampleError> {
        let x = Tensor::new(self.shape.clone(), x.to_vec());
        let d = Tensor::new(self.shape.clone(), denoised.to_vec());
        let info = StepInfo {
            step: i,
            total: self.total,
            sigma,
            sigma_hat,
            x: &x,
            denoised: &d,
        };
        match (self.callback)(&info) {
            StepControl::Continue => Ok(()),
            StepControl::Stop => Err(SampleError::Cancelled { step: i }),
        }
    }
}

// ---- float32 scalar helpers (correctly rounded via f64) ----

pub(crate) fn ln(x: f32) -> f32 {
    (x as f64).ln() as f32
}
pub(crate) fn exp(x: f32) -> f32 {
    (x as f64).exp() as f32
}
pub(crate) fn expm1(x: f32) -> f32 {
    (x as f64).exp_m1() as f32
}
pub(crate) fn sqrt(x: f32) -> f32 {
    x.sqrt()
}

// ---- elementwise helpers: each op rounds once, like separate torch ops ----

/// `a * s`
pub(crate) fn scale(a: &[f32], s: f32) -> V {
    a.iter().map(|&v| v * s).collect()
}
/// `a + b`
pub(crate) fn add(a: &[f32], b: &[f32]) -> V {
    a.iter().zip(b).map(|(&x, &y)| x + y).collect()
}
/// `a - b`
pub(crate) fn sub(a: &[f32], b: &[f32]) -> V {
    a.iter().zip(b).map(|(&x, &y)| x - y).collect()
}
/// `a + b * s`
pub(crate) fn add_scaled(a: &[f32], b: &[f32], s: f32) -> V {
    a.iter().zip(b).map(|(&x, &y)| x + y * s).collect()
}
/// `a * sa + b * sb`
pub(crate) fn lin2(a: &[f32], sa: f32, b: &[f32], sb: f32) -> V {
    a.iter().zip(b).map(|(&x, &y)| x * sa + y * sb).collect()
}
/// `a * sa - b * sb`
pub(crate) fn lin2_sub(a: &[f32], sa: f32, b: &[f32], sb: f32) -> V {
    a.iter().zip(b).map(|(&x, &y)| x * sa - y * sb).collect()
}
/// `(x - denoised) / sigma`
pub(crate) fn to_d(x: &[f32], sigma: f32, denoised: &[f32]) -> V {
    x.iter().zip(denoised).map(|(&a, &b)| (a - b) / sigma).collect()
}

/// k-diffusion `get_ancestral_step` in float32: `(sigma_down, sigma_up)`.
pub(crate) fn ancestral_step(from: f32, to: f32, eta: f32) -> (f32, f32) {
    if eta == 0.0 {
        return (to, 0.0);
    }
    let to2 = to * to;
    let from2 = from * from;
    let v = eta * sqrt(to2 * (from2 - to2) / from2);
    let up = if v < to { v } else { to };
    let down = sqrt(to2 - up * up);
    (down, up)
}

fn euler(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    for i in 0..s.len() - 1 {
        let sigma_hat = s[i];
        let den = r.model(&x, sigma_hat)?;
        let d = to_d(&x, sigma_hat, &den);
        r.step(i, s[i], sigma_hat, &x, &den)?;
        let dt = s[i + 1] - sigma_hat;
        x = add_scaled(&x, &d, dt);
    }
    Ok(x)
}

fn euler_ancestral(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let (eta, s_noise) = (r.options.eta as f32, r.options.s_noise as f32);
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        let (down, up) = ancestral_step(s[i], s[i + 1], eta);
        r.step(i, s[i], s[i], &x, &den)?;
        if down == 0.0 {
            x = den;
        } else {
            let d = to_d(&x, s[i], &den);
            let dt = down - s[i];
            let n = r.noise(s[i], s[i + 1])?;
            x = x
                .iter()
                .zip(&d)
                .zip(&n)
                .map(|((&xv, &dv), &nv)| (xv + dv * dt) + (nv * s_noise) * up)
                .collect();
        }
    }
    Ok(x)
}

fn heun(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    for i in 0..s.len() - 1 {
        let sigma_hat = s[i];
        let den = r.model(&x, sigma_hat)?;
        let d = to_d(&x, sigma_hat, &den);
        r.step(i, s[i], sigma_hat, &x, &den)?;
        let dt = s[i + 1] - sigma_hat;
        if s[i + 1] == 0.0 {
            x = add_scaled(&x, &d, dt);
        } else {
            let x2 = add_scaled(&x, &d, dt);
            let den2 = r.model(&x2, s[i + 1])?;
            let d2 = to_d(&x2, s[i + 1], &den2);
            x = x
                .iter()
                .zip(d.iter().zip(&d2))
                .map(|(&xv, (&a, &b))| xv + ((a + b) / 2.0) * dt)
                .collect();
        }
    }
    Ok(x)
}

fn heunpp2(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let s_end = s[s.len() - 1];
    for i in 0..s.len() - 1 {
        let sigma_hat = s[i];
        let den = r.model(&x, sigma_hat)?;
        let d = to_d(&x, sigma_hat, &den);
        r.step(i, s[i], sigma_hat, &x, &den)?;
        let dt = s[i + 1] - sigma_hat;
        if s[i + 1] == s_end {
            x = add_scaled(&x, &d, dt);
        } else if s[i + 2] == s_end {
            let x2 = add_scaled(&x, &d, dt);
            let den2 = r.model(&x2, s[i + 1])?;
            let d2 = to_d(&x2, s[i + 1], &den2);
            let w = 2.0 * s[0];
            let w2 = s[i + 1] / w;
            let w1 = 1.0 - w2;
            let dp = lin2(&d, w1, &d2, w2);
            x = add_scaled(&x, &dp, dt);
        } else {
            let x2 = add_scaled(&x, &d, dt);
            let den2 = r.model(&x2, s[i + 1])?;
            let d2 = to_d(&x2, s[i + 1], &den2);
            let dt2 = s[i + 2] - s[i + 1];
            let x3 = add_scaled(&x2, &d2, dt2);
            let den3 = r.model(&x3, s[i + 2])?;
            let d3 = to_d(&x3, s[i + 2], &den3);
            let w = 3.0 * s[0];
            let w2 = s[i + 1] / w;
            let w3 = s[i + 2] / w;
            let w1 = 1.0 - w2 - w3;
            let dp: V = d
                .iter()
                .zip(&d2)
                .zip(&d3)
                .map(|((&a, &b), &c)| (w1 * a + w2 * b) + w3 * c)
                .collect();
            x = add_scaled(&x, &dp, dt);
        }
    }
    Ok(x)
}

/// torch `lerp` for 0-dim float32 with weight 0.5.
fn lerp_half(a: f32, b: f32) -> f32 {
    let diff = b - a;
    b - diff * 0.5
}

fn dpm_2(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    for i in 0..s.len() - 1 {
        let sigma_hat = s[i];
        let den = r.model(&x, sigma_hat)?;
        let d = to_d(&x, sigma_hat, &den);
        r.step(i, s[i], sigma_hat, &x, &den)?;
        if s[i + 1] == 0.0 {
            let dt = s[i + 1] - sigma_hat;
            x = add_scaled(&x, &d, dt);
        } else {
            let sigma_mid = exp(lerp_half(ln(sigma_hat), ln(s[i + 1])));
            let dt1 = sigma_mid - sigma_hat;
            let dt2 = s[i + 1] - sigma_hat;
            let x2 = add_scaled(&x, &d, dt1);
            let den2 = r.model(&x2, sigma_mid)?;
            let d2 = to_d(&x2, sigma_mid, &den2);
            x = add_scaled(&x, &d2, dt2);
        }
    }
    Ok(x)
}

fn dpm_2_ancestral(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        let (down, up) = ancestral_step(s[i], s[i + 1], 1.0);
        r.step(i, s[i], s[i], &x, &den)?;
        let d = to_d(&x, s[i], &den);
        if down == 0.0 {
            let dt = down - s[i];
            x = add_scaled(&x, &d, dt);
        } else {
            let sigma_mid = exp(lerp_half(ln(s[i]), ln(down)));
            let dt1 = sigma_mid - s[i];
            let dt2 = down - s[i];
            let x2 = add_scaled(&x, &d, dt1);
            let den2 = r.model(&x2, sigma_mid)?;
            let d2 = to_d(&x2, sigma_mid, &den2);
            x = add_scaled(&x, &d2, dt2);
            let n = r.noise(s[i], s[i + 1])?;
            x = add_scaled(&x, &n, up);
        }
    }
    Ok(x)
}

/// Integral over `[t[i], t[i+1]]` of the Lagrange basis polynomial `j` on the nodes
/// `t[i], t[i-1], .., t[i-order+1]`, as `linear_multistep_coeff` computes it (float32 node
/// differences in the denominators, float64 elsewhere; the integrand is a polynomial of degree
/// <= 3 so 4-point Gauss-Legendre is exact).
pub(crate) fn lms_coeff(order: usize, t: &[f32], i: usize, j: usize) -> f64 {
    let denoms: Vec<f64> = (0..order)
        .map(|k| if k == j { 1.0 } else { (t[i - j] - t[i - k]) as f64 })
        .collect();
    let f = |tau: f64| {
        let mut prod = 1.0f64;
        for k in 0..order {
            if k == j {
                continue;
            }
            prod *= (tau - t[i - k] as f64) / denoms[k];
        }
        prod
    };
    let a = t[i] as f64;
    let b = t[i + 1] as f64;
    #[allow(clippy::excessive_precision)]
    const NODES: [(f64, f64); 4] = [
        (-0.861_136_311_594_052_6, 0.347_854_845_137_453_9),
        (-0.339_981_043_584_856_3, 0.652_145_154_862_546_1),
        (0.339_981_043_584_856_3, 0.652_145_154_862_546_1),
        (0.861_136_311_594_052_6, 0.347_854_845_137_453_9),
    ];
    let half = 0.5 * (b - a);
    let mid = 0.5 * (a + b);
    NODES.iter().map(|&(n, w)| w * f(mid + half * n)).sum::<f64>() * half
}

fn lms(r: &mut Run, mut x: V, s: &[f32], order: usize) -> Result<V, SampleError> {
    let mut ds: Vec<V> = Vec::new();
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        let d = to_d(&x, s[i], &den);
        ds.push(d);
        if ds.len() > order {
            ds.remove(0);
        }
        r.step(i, s[i], s[i], &x, &den)?;
        if s[i + 1] == 0.0 {
            x = den;
        } else {
            let cur = (i + 1).min(order);
            let coeffs: Vec<f32> = (0..cur).map(|j| lms_coeff(cur, s, i, j) as f32).collect();
            let mut acc = vec![0.0f32; x.len()];
            for (c, d) in coeffs.iter().zip(ds.iter().rev()) {
                acc = add_scaled(&acc, d, *c);
            }
            x = add(&x, &acc);
        }
    }
    Ok(x)
}

fn dpmpp_2s_ancestral(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let t_fn = |sigma: f32| -ln(sigma);
    let sigma_fn = |t: f32| exp(-t);
    let (eta, s_noise) = (r.options.eta as f32, r.options.s_noise as f32);
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        let (down, up) = ancestral_step(s[i], s[i + 1], eta);
        r.step(i, s[i], s[i], &x, &den)?;
        if down == 0.0 {
            let d = to_d(&x, s[i], &den);
            let dt = down - s[i];
            x = add_scaled(&x, &d, dt);
        } else {
            let t = t_fn(s[i]);
            let t_next = t_fn(down);
            let h = t_next - t;
            let sm = t + 0.5 * h;
            let x2 = lin2_sub(&x, sigma_fn(sm) / sigma_fn(t), &den, expm1(-h * 0.5));
            let den2 = r.model(&x2, sigma_fn(sm))?;
            x = lin2_sub(&x, sigma_fn(t_next) / sigma_fn(t), &den2, expm1(-h));
        }
        if s[i + 1] > 0.0 {
            let n = r.noise(s[i], s[i + 1])?;
            x = x.iter().zip(&n).map(|(&a, &nv)| a + (nv * s_noise) * up).collect();
        }
    }
    Ok(x)
}

fn dpmpp_sde(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let options = r.options;
    let (eta, s_noise, rr) = (options.eta as f32, options.s_noise as f32, options.r as f32);
    let fac = 1.0f64 / (2.0 * options.r);
    let lambda_fn = |sigma: f32| -ln(sigma);
    let sigma_fn = |l: f32| exp(-l);
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        if s[i + 1] == 0.0 {
            x = den;
            continue;
        }
        let ls = lambda_fn(s[i]);
        let lt = lambda_fn(s[i + 1]);
        let h = lt - ls;
        let ls1 = ls + rr * h;
        let sigma_s1 = sigma_fn(ls1);
        let alpha_s = s[i] * exp(ls);
        let alpha_s1 = sigma_s1 * exp(ls1);
        let alpha_t = s[i + 1] * exp(lt);

        // Step 1
        let (sd, su) = ancestral_step(exp(-ls), exp(-ls1), eta);
        let ls1_ = -ln(sd);
        let h_ = ls1_ - ls;
        let c1 = (alpha_s1 / alpha_s) * exp(-h_);
        let c2 = alpha_s1 * expm1(-h_);
        let mut x2 = lin2_sub(&x, c1, &den, c2);
        if options.adds_noise() {
            let n = r.noise(s[i], sigma_s1)?;
            x2 = x2
                .iter()
                .zip(&n)
                .map(|(&a, &nv)| a + ((alpha_s1 * nv) * s_noise) * su)
                .collect();
        }
        let den2 = r.model(&x2, sigma_s1)?;

        // Step 2
        let (sd, su) = ancestral_step(exp(-ls), exp(-lt), eta);
        let lt_ = -ln(sd);
        let h_ = lt_ - ls;
        let dd = lin2(&den, (1.0 - fac) as f32, &den2, fac as f32);
        let c1 = (alpha_t / alpha_s) * exp(-h_);
        let c2 = alpha_t * expm1(-h_);
        x = lin2_sub(&x, c1, &dd, c2);
        if options.adds_noise() {
            let n = r.noise(s[i], s[i + 1])?;
            x = x
                .iter()
                .zip(&n)
                .map(|(&a, &nv)| a + ((alpha_t * nv) * s_noise) * su)
                .collect();
        }
    }
    Ok(x)
}

fn dpmpp_2m(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let t_fn = |sigma: f32| -ln(sigma);
    let sigma_fn = |t: f32| exp(-t);
    let mut old: Option<V> = None;
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        let t = t_fn(s[i]);
        let t_next = t_fn(s[i + 1]);
        let h = t_next - t;
        let a = sigma_fn(t_next) / sigma_fn(t);
        let b = expm1(-h);
        match &old {
            Some(od) if s[i + 1] != 0.0 => {
                let h_last = t - t_fn(s[i - 1]);
                let rr = h_last / h;
                let k = 1.0 / (2.0 * rr);
                let dd = lin2_sub(&den, 1.0 + k, od, k);
                x = lin2_sub(&x, a, &dd, b);
            }
            _ => {
                x = lin2_sub(&x, a, &den, b);
            }
        }
        old = Some(den);
    }
    Ok(x)
}

/// The multistep SDE samplers' noise for step `i` (`h` in log sigma):
/// `x + noise * sigma_next * sqrt(1 - e^(-2 h eta)) * s_noise`, unless they add none.
fn add_sde_noise(r: &mut Run, x: V, s: &[f32], i: usize, h: f32) -> Result<V, SampleError> {
    let options = r.options;
    if !options.adds_noise() {
        return Ok(x);
    }
    let (eta, s_noise) = (options.eta as f32, options.s_noise as f32);
    let n = r.noise(s[i], s[i + 1])?;
    let sq = sqrt(-expm1(-2.0 * h * eta));
    Ok(x.iter()
        .zip(&n)
        .map(|(&a, &nv)| a + ((nv * s[i + 1]) * sq) * s_noise)
        .collect())
}

fn dpmpp_2m_sde(r: &mut Run, mut x: V, s: &[f32], heun: bool) -> Result<V, SampleError> {
    let eta = r.options.eta as f32;
    let lambda_fn = |sigma: f32| -ln(sigma);
    let mut old: Option<V> = None;
    let mut h_last: Option<f32> = None;
    let mut h: Option<f32> = None;
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        if s[i + 1] == 0.0 {
            x = den.clone();
        } else {
            let ls = lambda_fn(s[i]);
            let lt = lambda_fn(s[i + 1]);
            let hh = lt - ls;
            h = Some(hh);
            let h_eta = hh * (eta + 1.0);
            let alpha_t = s[i + 1] * exp(lt);
            let ne = -expm1(-h_eta);
            let c1 = s[i + 1] / s[i] * exp(-hh * eta);
            let c2 = alpha_t * ne;
            x = lin2(&x, c1, &den, c2);
            if let (Some(od), Some(hl)) = (&old, h_last) {
                let rr = hl / hh;
                let c = if heun {
                    (alpha_t * (ne / (-h_eta) + 1.0)) * (1.0 / rr)
                } else {
                    (0.5 * alpha_t * ne) * (1.0 / rr)
                };
                let diff = sub(&den, od);
                x = add_scaled(&x, &diff, c);
            }
            x = add_sde_noise(r, x, s, i, hh)?;
        }
        old = Some(den);
        h_last = h;
    }
    Ok(x)
}

fn dpmpp_3m_sde(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    let eta = r.options.eta as f32;
    let lambda_fn = |sigma: f32| -ln(sigma);
    let mut den1: Option<V> = None;
    let mut den2: Option<V> = None;
    let (mut h, mut h1, mut h2): (Option<f32>, Option<f32>, Option<f32>) = (None, None, None);
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        if s[i + 1] == 0.0 {
            x = den.clone();
        } else {
            let ls = lambda_fn(s[i]);
            let lt = lambda_fn(s[i + 1]);
            let hh = lt - ls;
            h = Some(hh);
            let h_eta = hh * (eta + 1.0);
            let alpha_t = s[i + 1] * exp(lt);
            let c1 = s[i + 1] / s[i] * exp(-hh * eta);
            let c2 = alpha_t * -expm1(-h_eta);
            x = lin2(&x, c1, &den, c2);
            if let (Some(hv2), Some(hv1), Some(d1v), Some(d2v)) = (h2, h1, &den1, &den2) {
                let r0 = hv1 / hh;
                let r1 = hv2 / hh;
                let d1_0: V = den.iter().zip(d1v).map(|(&a, &b)| (a - b) / r0).collect();
                let d1_1: V = d1v.iter().zip(d2v).map(|(&a, &b)| (a - b) / r1).collect();
                let rs = r0 + r1;
                let d1: V = d1_0.iter().zip(&d1_1).map(|(&a, &b)| a + ((a - b) * r0) / rs).collect();
                let d2: V = d1_0.iter().zip(&d1_1).map(|(&a, &b)| (a - b) / rs).collect();
                let phi_2 = expm1(-h_eta) / h_eta + 1.0;
                let phi_3 = phi_2 / h_eta - 0.5;
                let (k2, k3) = (alpha_t * phi_2, alpha_t * phi_3);
                x = x
                    .iter()
                    .zip(d1.iter().zip(&d2))
                    .map(|(&xv, (&a, &b))| (xv + k2 * a) - k3 * b)
                    .collect();
            } else if let (Some(hv1), Some(d1v)) = (h1, &den1) {
                let rr = hv1 / hh;
                let phi_2 = expm1(-h_eta) / h_eta + 1.0;
                let k = alpha_t * phi_2;
                x = x
                    .iter()
                    .zip(den.iter().zip(d1v))
                    .map(|(&xv, (&a, &b))| xv + k * ((a - b) / rr))
                    .collect();
            }
            x = add_sde_noise(r, x, s, i, hh)?;
        }
        den2 = den1.take();
        den1 = Some(den);
        h2 = h1;
        h1 = h;
    }
    Ok(x)
}

fn ddpm(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        let sigma = s[i];
        let sigma_prev = s[i + 1];
        let xin = scale_div(&x, sqrt(1.0 + sigma * sigma));
        let eps: V = x.iter().zip(&den).map(|(&a, &b)| (a - b) / sigma).collect();
        let acp = 1.0 / ((sigma * sigma) + 1.0);
        let acp_prev = 1.0 / ((sigma_prev * sigma_prev) + 1.0);
        let alpha = acp / acp_prev;
        let k1 = 1.0 - alpha;
        let k2 = sqrt(1.0 - acp);
        let k0 = sqrt(1.0 / alpha);
        let mut mu: V = xin
            .iter()
            .zip(&eps)
            .map(|(&xv, &e)| k0 * (xv - (k1 * e) / k2))
            .collect();
        if sigma_prev > 0.0 {
            let c = sqrt(((1.0 - alpha) * (1.0 - acp_prev)) / (1.0 - acp));
            let n = r.noise(sigma, sigma_prev)?;
            mu = mu.iter().zip(&n).map(|(&m, &nv)| m + c * nv).collect();
        }
        x = mu;
        if s[i + 1] != 0.0 {
            let k = sqrt(1.0 + s[i + 1] * s[i + 1]);
            x = scale(&x, k);
        }
    }
    Ok(x)
}

fn scale_div(a: &[f32], d: f32) -> V {
    a.iter().map(|&v| v / d).collect()
}

fn lcm(r: &mut Run, mut x: V, s: &[f32]) -> Result<V, SampleError> {
    for i in 0..s.len() - 1 {
        let den = r.model(&x, s[i])?;
        r.step(i, s[i], s[i], &x, &den)?;
        x = den;
        if s[i + 1] > 0.0 {
            let n = r.noise(s[i], s[i + 1])?;
            x = n.iter().zip(&x).map(|(&nv, &xv)| nv * s[i + 1] + xv).collect();
        }
    }
    Ok(x)
}

fn push_history(buf: &mut Vec<V>, d: V, max_order: usize) {
    if buf.len() == max_order - 1 {
        buf.remove(0);
    }
    buf.push(d);
}

fn ipndm(r: &mut Run, x: V, s: &[f32]) -> Result<V, SampleError> {
    let max_order = 4;
    let mut x_next = x;
    let mut buf: Vec<V> = Vec::new();
    for i in 0..s.len() - 1 {
        let (t_cur, t_next) = (s[i], s[i + 1]);
        let x_cur = x_next;
        let den = r.model(&x_cur, t_cur)?;
        r.step(i, s[i], s[i], &x_cur, &den)?;
        let d_cur = to_d(&x_cur, t_cur, &den);
        let order = max_order.min(i + 1);
        let dt = t_next - t_cur;
        let n = buf.len();
        x_next = if t_next == 0.0 {
            den
        } else {
            match order {
                1 => add_scaled(&x_cur, &d_cur, dt),
                2 => {
                    let b1 = &buf[n - 1];
                    (0..x_cur.len())
                        .map(|k| x_cur[k] + (dt * (3.0 * d_cur[k] - b1[k])) / 2.0)
                        .collect()
                }
                3 => {
                    let (b1, b2) = (&buf[n - 1], &buf[n - 2]);
                    (0..x_cur.len())
                        .map(|k| {
                            let c = (23.0 * d_cur[k] - 16.0 * b1[k]) + 5.0 * b2[k];
                            x_cur[k] + (dt * c) / 12.0
                        })
                        .collect()
                }
                _ => {
                    let (b1, b2, b3) = (&buf[n - 1], &buf[n - 2], &buf[n - 3]);
                    (0..x_cur.len())
                        .map(|k| {
                            let c = ((55.0 * d_cur[k] - 59.0 * b1[k]) + 37.0 * b2[k]) - 9.0 * b3[k];
                            x_cur[k] + (dt * c) / 24.0
                        })
                        .collect()
                }
            }
        };
        push_history(&mut buf, d_cur, max_order);
    }
    Ok(x_next)
}

fn ipndm_v(r: &mut Run, x: V, s: &[f32]) -> Result<V, SampleError> {
    let max_order = 4;
    let mut x_next = x;
    let mut buf: Vec<V> = Vec::new();
    for i in 0..s.len() - 1 {
        let (t_cur, t_next) = (s[i], s[i + 1]);
        let x_cur = x_next;
        let den = r.model(&x_cur, t_cur)?;
        r.step(i, s[i], s[i], &x_cur, &den)?;
        let d_cur = to_d(&x_cur, t_cur, &den);
        let order = max_order.min(i + 1);
        let dt = t_next - t_cur;
        let n = buf.len();
        x_next = if t_next == 0.0 {
            den
        } else if order == 1 {
            add_scaled(&x_cur, &d_cur, dt)
        } else {
            let h_n = t_next - t_cur;
            let h_n_1 = t_cur - s[i - 1];
            let coeffs: Vec<f32> = match order {
                2 => vec![(2.0 + (h_n / h_n_1)) / 2.0, -(h_n / h_n_1) / 2.0],
                3 => {
                    let h_n_2 = s[i - 1] - s[i - 2];
                    let temp =
                        (1.0 - h_n / (3.0 * (h_n + h_n_1)) * (h_n * (h_n + h_n_1)) / (h_n_1 * (h_n_1 + h_n_2))) / 2.0;
                    vec![
                        (2.0 + (h_n / h_n_1)) / 2.0 + temp,
                        -(h_n / h_n_1) / 2.0 - (1.0 + h_n_1 / h_n_2) * temp,
                        temp * h_n_1 / h_n_2,
                    ]
                }
                _ => {
                    let h_n_2 = s[i - 1] - s[i - 2];
                    let h_n_3 = s[i - 2] - s[i - 3];
                    let temp1 =
                        (1.0 - h_n / (3.0 * (h_n + h_n_1)) * (h_n * (h_n + h_n_1)) / (h_n_1 * (h_n_1 + h_n_2))) / 2.0;
                    let temp2 = ((1.0 - h_n / (3.0 * (h_n + h_n_1))) / 2.0
                        + (1.0 - h_n / (2.0 * (h_n + h_n_1))) * h_n / (6.0 * (h_n + h_n_1 + h_n_2)))
                        * (h_n * (h_n + h_n_1) * (h_n + h_n_1 + h_n_2))
                        / (h_n_1 * (h_n_1 + h_n_2) * (h_n_1 + h_n_2 + h_n_3));
                    let rr = h_n_1 * (h_n_1 + h_n_2) / (h_n_2 * (h_n_2 + h_n_3));
                    vec![
                        (2.0 + (h_n / h_n_1)) / 2.0 + temp1 + temp2,
                        -(h_n / h_n_1) / 2.0 - (1.0 + h_n_1 / h_n_2) * temp1 - (1.0 + (h_n_1 / h_n_2) + rr) * temp2,
                        temp1 * h_n_1 / h_n_2 + ((h_n_1 / h_n_2) + rr * (1.0 + h_n_2 / h_n_3)) * temp2,
                        -temp2 * rr * h_n_1 / h_n_2,
                    ]
                }
            };
            (0..x_cur.len())
                .map(|k| {
                    let mut acc = coeffs[0] * d_cur[k];
                    for (j, c) in coeffs.iter().enumerate().skip(1) {
                        acc += c * buf[n - j][k];
                    }
                    x_cur[k] + dt * acc
                })
                .collect()
        };
        push_history(&mut buf, d_cur, max_order);
    }
    Ok(x_next)
}

/// DEIS "tab" coefficients (`deis.get_deis_coeff_list`), computed in float64 with the same
/// 10000-point Riemann sum over the VP time mapping (EDM sigma_min 0.002, sigma_max 80).
pub(crate) fn deis_coeffs(sigmas: &[f32], max_order: usize) -> Vec<Vec<f64>> {
    let n_pts = 10_000usize;
    let (epsilon_s, smin, smax) = (1e-3f64, 0.002f32 as f64, 80.0f64);
    // torch.tensor(0.002) is float32; the logs are numpy on float32 tensors -> float32.
    let l_min = (((smin * smin) as f32 + 1.0) as f64).ln() as f32 as f64;
    let l_max = (((smax * smax) as f32 + 1.0) as f64).ln() as f32 as f64;
    let beta_d = 2.0 * (l_min / epsilon_s - l_max) / (epsilon_s - 1.0);
    let beta_min = l_max - 0.5 * beta_d;
    let beta_0 = beta_min;
    let beta_1 = beta_d + beta_min;
    let t_steps: Vec<f64> = sigmas
        .iter()
        .map(|&s| {
            let s = s as f64;
            ((beta_min * beta_min + 2.0 * beta_d * (s * s + 1.0).ln()).sqrt() - beta_min) / beta_d
        })
        .collect();
    let mut out = Vec::new();
    for i in 0..t_steps.len() - 1 {
        let (t_cur, t_next) = (t_steps[i], t_steps[i + 1]);
        let order = (i + 1).min(max_order);
        if order == 1 {
            out.push(Vec::new());
            continue;
        }
        let dtau = (t_next - t_cur) / n_pts as f64;
        let prev_t: Vec<f64> = (0..order).map(|k| t_steps[i - k]).collect();
        let mut coeffs = vec![0.0f64; order];
        for p in 0..n_pts {
            let tau = if p < n_pts / 2 {
                t_cur + (t_next - t_cur) / (n_pts - 1) as f64 * p as f64
            } else {
                t_next - (t_next - t_cur) / (n_pts - 1) as f64 * (n_pts - 1 - p) as f64
            };
            let alpha = (-0.5 * tau * tau * (beta_1 - beta_0) - tau * beta_0).exp();
            let dlog = -(tau * (beta_1 - beta_0) + beta_0);
            let integrand = -0.5 * dlog / (alpha * (1.0 - alpha)).sqrt();
            for (j, c) in coeffs.iter_mut().enumerate() {
                let mut poly = 1.0;
                for (k, &pk) in prev_t.iter().enumerate() {
                    if k != j {
                        poly *= (tau - pk) / (prev_t[j] - pk);
                    }
                }
                *c += integrand * poly;
            }
        }
        out.push(coeffs.into_iter().map(|c| c * dtau).collect());
    }
    out
}

fn deis(r: &mut Run, x: V, s: &[f32]) -> Result<V, SampleError> {
    let max_order = 3;
    let coeffs = deis_coeffs(s, max_order);
    let mut x_next = x;
    let mut buf: Vec<V> = Vec::new();
    for i in 0..s.len() - 1 {
        let (t_cur, t_next) = (s[i], s[i + 1]);
        let x_cur = x_next;
        let den = r.model(&x_cur, t_cur)?;
        r.step(i, s[i], s[i], &x_cur, &den)?;
        let d_cur = to_d(&x_cur, t_cur, &den);
        let mut order = max_order.min(i + 1);
        if t_next <= 0.0 {
            order = 1;
        }
        let n = buf.len();
        x_next = if order == 1 {
            add_scaled(&x_cur, &d_cur, t_next - t_cur)
        } else {
            let c: Vec<f32> = coeffs[i].iter().map(|&v| v as f32).collect();
            (0..x_cur.len())
                .map(|k| {
                    let mut v = x_cur[k] + c[0] * d_cur[k];
                    for (j, cj) in c.iter().enumerate().skip(1) {
                        v += cj * buf[n - j][k];
                    }
                    v
                })
                .collect()
        };
        push_history(&mut buf, d_cur, max_order);
    }
    Ok(x_next)
}

#[cfg(test)]
mod tests {
    use super::super::{sigmas, ModelSampling, Scheduler, ZeroNoise};
    use super::*;

    fn gaussian(x: &Tensor, sigma: f32) -> anyhow::Result<Tensor> {
        let mu = 0.3f32;
        let sig2 = sigma * sigma;
        let den = 0.25f32 + sig2;
        Ok(x.with_data(x.data.iter().map(|&v| (0.25 * v + sig2 * mu) / den).collect()))
    }

    #[test]
    fn parse_and_list() {
        assert_eq!("dpmpp_2m".parse::<SamplerKind>().unwrap(), SamplerKind::Dpmpp2m);
        assert_eq!("dpmpp_sde_gpu".parse::<SamplerKind>().unwrap(), SamplerKind::DpmppSde);
        let e = "bogus".parse::<SamplerKind>().unwrap_err().to_string();
        assert!(e.contains("euler_ancestral"), "{e}");
    }

    #[test]
    fn callback_can_cancel() {
        let sigmas = [14.6f32, 5.0, 1.0, 0.0];
        let x = Tensor::new(vec![1, 1, 1, 2], vec![1.0, -1.0]);
        let mut den = gaussian;
        let mut seen = 0;
        let err = sample(
            SamplerKind::Euler,
            &mut den,
            x,
            &sigmas,
            &mut ZeroNoise,
            &mut |info: &StepInfo<'_>| {
                seen += 1;
                if info.step == 1 {
                    StepControl::Stop
                } else {
                    StepControl::Continue
                }
            },
        )
        .unwrap_err();
        assert!(matches!(err, SampleError::Cancelled { step: 1 }));
        assert_eq!(seen, 2);
    }

    #[test]
    fn all_samplers_converge_towards_mean() {
        let sigmas = sigmas(&ModelSampling::sd1(), Scheduler::Karras, 12);
        for kind in SamplerKind::ALL {
            let x = Tensor::new(vec![1, 1, 1, 2], vec![0.3 * sigmas[0], -0.2 * sigmas[0]]);
            let mut den = gaussian;
            let out = sample(kind, &mut den, x, &sigmas, &mut ZeroNoise, &mut |_: &StepInfo<'_>| {
                StepControl::Continue
            })
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert!(
                out.data.iter().all(|v| v.is_finite() && v.abs() < 2.0),
                "{kind}: {:?}",
                out.data
            );
        }
    }
}
