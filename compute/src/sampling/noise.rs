//! Seeded noise bit-identical to torch's CPU generator (`torch.manual_seed` + `torch.randn`/`torch.rand`),
//! which is what ComfyUI's `prepare_noise` and `default_noise_sampler` use.
//!
//! torch's CPU generator is a 32-bit MT19937 seeded with `init_genrand(seed mod 2^32)`.
//! `randn` of a float32 tensor has two code paths:
//! * fewer than 16 elements: double-precision Box-Muller from 53-bit uniforms, caching the sine half;
//! * 16 or more elements: 24-bit float uniforms transformed in blocks of 16 (halves of a block are
//!   paired), with a re-drawn final block when the length is not a multiple of 16. On AVX2/AVX-512
//!   CPUs the log/sin/cos there are the Cephes-derived polynomials of ATen's `avx_mathfun.h`
//!   compiled with FMA contraction; [`NormalKernel::Avx2`] reproduces them bit-for-bit with
//!   `f32::mul_add`, [`NormalKernel::Default`] reproduces the non-AVX kernel (libm functions).

use super::{SamplerKind, Tensor};

/// Which torch CPU kernel to emulate for the `n >= 16` float32 `randn` path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NormalKernel {
    /// torch on AVX2 / AVX-512 CPUs (the common case): `avx_mathfun.h` polynomials with FMA.
    #[default]
    Avx2,
    /// torch's portable kernel (`ATEN_CPU_CAPABILITY=default` or CPUs without AVX2): libm functions.
    Default,
}

const MT_N: usize = 624;
const MT_M: usize = 397;

/// The standard 32-bit Mersenne Twister as used by torch's CPU generator.
#[derive(Clone)]
pub struct Mt19937 {
    state: [u32; MT_N],
    index: usize,
}

impl Mt19937 {
    /// Seeds like `init_genrand(seed)`.
    pub fn new(seed: u32) -> Self {
        let mut state = [0u32; MT_N];
        state[0] = seed;
        for i in 1..MT_N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: MT_N }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        for i in 0..MT_N {
            let y = (self.state[i] & UPPER) | (self.state[(i + 1) % MT_N] & LOWER);
            let mut v = self.state[(i + MT_M) % MT_N] ^ (y >> 1);
            if y & 1 != 0 {
                v ^= MATRIX_A;
            }
            self.state[i] = v;
        }
        self.index = 0;
    }

    /// Next tempered 32-bit output word.
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= MT_N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^= y >> 18;
        y
    }
}

/// A torch-compatible CPU generator: MT19937 plus the cached second Box-Muller normal.
#[derive(Clone)]
pub struct TorchGenerator {
    mt: Mt19937,
    next_double_normal: Option<f64>,
    kernel: NormalKernel,
}

impl TorchGenerator {
    /// Equivalent of `torch.Generator().manual_seed(seed)`; only the low 32 bits of `seed` count.
    pub fn new(seed: u64) -> Self {
        Self::with_kernel(seed, NormalKernel::Avx2)
    }

    /// Like [`TorchGenerator::new`] but emulating a specific CPU kernel.
    pub fn with_kernel(seed: u64, kernel: NormalKernel) -> Self {
        TorchGenerator {
            mt: Mt19937::new(seed as u32),
            next_double_normal: None,
            kernel,
        }
    }

    fn uniform_f32(&mut self) -> f32 {
        let w = self.mt.next_u32();
        (w & 0x00ff_ffff) as f32 * (1.0f32 / 16_777_216.0)
    }

    fn uniform_f64(&mut self) -> f64 {
        let hi = self.mt.next_u32() as u64;
        let lo = self.mt.next_u32() as u64;
        let w = (hi << 32) | lo;
        (w & ((1u64 << 53) - 1)) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }

    fn normal_f64(&mut self) -> f64 {
        if let Some(v) = self.next_double_normal.take() {
            return v;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u1;
        self.next_double_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// `torch.rand(n)` (float32).
    pub fn rand(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform_f32()).collect()
    }

    /// `torch.randn(n)` (float32, contiguous).
    pub fn randn(&mut self, n: usize) -> Vec<f32> {
        self.randn_interruptible(n, &|| true)
            .expect("drawing stops only when told to")
    }

    /// [`TorchGenerator::randn`], asking `keep_going` every million values drawn or
    /// transformed; `None` once it says no (the generator is then part way through).
    pub fn randn_interruptible(&mut self, n: usize, keep_going: &dyn Fn() -> bool) -> Option<Vec<f32>> {
        const VALUES_PER_CHECK: usize = 1 << 20;
        if n < 16 {
            return Some((0..n).map(|_| self.normal_f64() as f32).collect());
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let stretch = VALUES_PER_CHECK.min(n - out.len());
            out.extend((0..stretch).map(|_| self.uniform_f32()));
            if !keep_going() {
                return None;
            }
        }
        let mut b = 0;
        while b + 16 <= n {
            self.normal_block(&mut out[b..b + 16]);
            b += 16;
            if b % VALUES_PER_CHECK == 0 && !keep_going() {
                return None;
            }
        }
        if !n.is_multiple_of(16) {
            let tail = &mut out[n - 16..];
            for v in tail.iter_mut() {
                *v = self.uniform_f32();
            }
            self.normal_block(tail);
        }
        Some(out)
    }

    fn normal_block(&self, block: &mut [f32]) {
        for j in 0..8 {
            let a = 1.0f32 - block[j];
            let c = block[8 + j];
            let (cos_t, sin_t, r) = match self.kernel {
                NormalKernel::Avx2 => {
                    let r = (-2.0f32 * avx_log(a)).sqrt();
                    let theta = (2.0 * std::f64::consts::PI) as f32 * c;
                    let (s, co) = avx_sincos(theta);
                    (co, s, r)
                }
                NormalKernel::Default => {
                    let r = (-2.0f32 * libm_logf(a)).sqrt();
                    let theta = (2.0 * std::f64::consts::PI * c as f64) as f32;
                    (libm_cosf(theta), libm_sinf(theta), r)
                }
            };
            block[j] = r * cos_t;
            block[8 + j] = r * sin_t;
        }
    }
}

// Correctly rounded float versions via f64 (glibc's logf/sinf/cosf are correctly rounded in
// practice for these arguments).
fn libm_logf(x: f32) -> f32 {
    (x as f64).ln() as f32
}
fn libm_sinf(x: f32) -> f32 {
    (x as f64).sin() as f32
}
fn libm_cosf(x: f32) -> f32 {
    (x as f64).cos() as f32
}

/// Cephes-style float log as in ATen's `avx_mathfun.h` (`log256_ps`), with the FMA contractions
/// that GCC applies when building torch's AVX2 kernels.
#[allow(clippy::excessive_precision)]
fn avx_log(x: f32) -> f32 {
    if x.is_nan() || x <= 0.0 {
        // The vector code ORs an all-ones mask into non-positive inputs: NaN.
        return f32::NAN;
    }
    // Cephes SQRTHF (1/sqrt(2)) rounded to float32.
    const SQRTHF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    const P: [f32; 9] = [
        7.0376836292E-2,
        -1.1514610310E-1,
        1.1676998740E-1,
        -1.2420140846E-1,
        1.4249322787E-1,
        -1.6668057665E-1,
        2.0000714765E-1,
        -2.4999993993E-1,
        3.3333331174E-1,
    ];
    const Q1: f32 = -2.12194440e-4;
    const Q2: f32 = 0.693359375;
    let x = x.max(f32::MIN_POSITIVE);
    let bits = x.to_bits();
    let exp_field = (bits >> 23) as i32;
    let mut m = f32::from_bits((bits & !0x7f80_0000) | 0.5f32.to_bits());
    let mut e = (exp_field - 0x7f) as f32 + 1.0;
    let below = m < SQRTHF;
    let tmp = if below { m } else { 0.0 };
    m -= 1.0;
    if below {
        e -= 1.0;
    }
    m += tmp;
    let z = m * m;
    let mut y = P[0];
    for &p in &P[1..] {
        y = y.mul_add(m, p);
    }
    y *= m;
    y = y.mul_add(z, e * Q1);
    y -= z * 0.5;
    let mut r = m + y;
    r += e * Q2;
    r
}

/// Cephes-style float sincos as in ATen's `avx_mathfun.h` (`sincos256_ps`), FMA-contracted.
/// Returns `(sin, cos)`.
#[allow(clippy::excessive_precision)]
fn avx_sincos(x_in: f32) -> (f32, f32) {
    const FOPI: f32 = 1.27323954473516;
    const DP1: f32 = -0.785_156_25;
    const DP2: f32 = -2.4187564849853515625e-4;
    const DP3: f32 = -3.77489497744594108e-8;
    const COS_P0: f32 = 2.443315711809948E-005;
    const COS_P1: f32 = -1.388731625493765E-003;
    const COS_P2: f32 = 4.166664568298827E-002;
    const SIN_P0: f32 = -1.9515295891E-4;
    const SIN_P1: f32 = 8.3321608736E-3;
    const SIN_P2: f32 = -1.6666654611E-1;

    let sign_sin_in = x_in.to_bits() & 0x8000_0000;
    let mut x = x_in.abs();
    let y0 = x * FOPI;
    let mut j = y0 as i32; // truncation, like cvttps
    j = (j + 1) & !1;
    let y = j as f32;
    let swap_sign_sin = ((j & 4) as u32) << 29;
    let poly_is_cos = (j & 2) == 0;
    x += y * DP1;
    x += y * DP2;
    x += y * DP3;
    let sign_cos = ((!(j - 2) & 4) as u32) << 29;
    let sign_sin = sign_sin_in ^ swap_sign_sin;

    let z = x * x;
    let mut yc = COS_P0.mul_add(z, COS_P1);
    yc = yc.mul_add(z, COS_P2);
    yc *= z;
    yc = yc.mul_add(z, -(z * 0.5));
    yc += 1.0;

    let mut ys = SIN_P0.mul_add(z, SIN_P1);
    ys = ys.mul_add(z, SIN_P2);
    ys *= z;
    ys = ys.mul_add(x, x);

    let (s, c) = if poly_is_cos { (ys, yc) } else { (yc, ys) };
    (
        f32::from_bits(s.to_bits() ^ sign_sin),
        f32::from_bits(c.to_bits() ^ sign_cos),
    )
}

/// ComfyUI's `prepare_noise(latent, seed)` for a float32 latent of `shape`:
/// `torch.manual_seed(seed)` then one `torch.randn(shape)` on the CPU (AVX2 kernel).
pub fn seeded_noise(seed: u64, shape: &[usize]) -> Tensor {
    seeded_noise_with_kernel(seed, shape, NormalKernel::Avx2)
}

/// [`seeded_noise`] emulating a specific torch CPU kernel.
pub fn seeded_noise_with_kernel(seed: u64, shape: &[usize], kernel: NormalKernel) -> Tensor {
    let n = shape.iter().product();
    let mut g = TorchGenerator::with_kernel(seed, kernel);
    Tensor::new(shape.to_vec(), g.randn(n))
}

/// Supplies the noise that stochastic samplers inject, one tensor per call, in draw order.
pub trait NoiseSource {
    /// Returns noise of `shape` for the step from `sigma` to `sigma_next`.
    fn sample(&mut self, sigma: f32, sigma_next: f32, shape: &[usize]) -> anyhow::Result<Tensor>;
}

/// ComfyUI's `default_noise_sampler` (ancestral / ddpm / lcm / res_multistep / er_sde / seeds /
/// sa_solver samplers): a dedicated torch CPU generator seeded once, drawing a fresh
/// `randn(shape)` on every call. At the reference ComfyUI commit the generator is seeded with
/// `extra_args["seed"]` itself (its first draw equals `prepare_noise` for the same seed); newer
/// ComfyUI adds 1 to the seed on CPU, so pass `seed + 1` to match those.
///
/// ComfyUI's SDE samplers (`dpmpp_sde`, `dpmpp_2m_sde*`, `dpmpp_3m_sde`) default to a torchsde
/// Brownian tree instead: [`BrownianTreeNoise`](super::BrownianTreeNoise); [`default_noise`]
/// picks the right one.
pub struct TorchNoise {
    generator: TorchGenerator,
}

impl TorchNoise {
    /// A generator seeded with `seed` (the caller applies any seed offset ComfyUI uses).
    pub fn new(seed: u64) -> Self {
        TorchNoise {
            generator: TorchGenerator::new(seed),
        }
    }
}

impl NoiseSource for TorchNoise {
    fn sample(&mut self, _sigma: f32, _sigma_next: f32, shape: &[usize]) -> anyhow::Result<Tensor> {
        let n = shape.iter().product();
        Ok(Tensor::new(shape.to_vec(), self.generator.randn(n)))
    }
}

/// ComfyUI's default step noise for `kind` when sampling `sigmas` with `seed`: the SDE samplers
/// (`dpmpp_sde`, `dpmpp_2m_sde`, `dpmpp_2m_sde_heun`, `dpmpp_3m_sde` and their `_gpu` names)
/// build a [`BrownianTreeNoise`](super::BrownianTreeNoise) from the smallest positive to the
/// largest sigma; every other sampler uses `default_noise_sampler` ([`TorchNoise`]).
///
/// The `_gpu` names differ in ComfyUI only by building their tree on the model's device; on
/// a CPU that is the same tree, which is what weft gives for them on every device.
pub fn default_noise(
    kind: SamplerKind,
    seed: u64,
    sigmas: &[f32],
    shape: &[usize],
) -> anyhow::Result<Box<dyn NoiseSource>> {
    use SamplerKind::*;
    Ok(match kind {
        DpmppSde | Dpmpp2mSde | Dpmpp2mSdeHeun | Dpmpp3mSde => {
            Box::new(super::BrownianTreeNoise::for_sigmas(seed, sigmas, shape)?)
        }
        _ => Box::new(TorchNoise::new(seed)),
    })
}

/// Replays a fixed list of noise tensors (the k-th call returns the k-th entry) and records the
/// `(sigma, sigma_next)` arguments; used for tests and reference-vector checks.
pub struct ListNoise {
    items: Vec<Tensor>,
    next: usize,
    /// Arguments of every call so far.
    pub calls: Vec<(f32, f32)>,
}

impl ListNoise {
    /// Wraps the noise list.
    pub fn new(items: Vec<Tensor>) -> Self {
        ListNoise {
            items,
            next: 0,
            calls: Vec::new(),
        }
    }
}

impl NoiseSource for ListNoise {
    fn sample(&mut self, sigma: f32, sigma_next: f32, shape: &[usize]) -> anyhow::Result<Tensor> {
        self.calls.push((sigma, sigma_next));
        let item = self
            .items
            .get(self.next)
            .ok_or_else(|| anyhow::anyhow!("noise list exhausted after {} draws", self.next))?;
        anyhow::ensure!(
            item.data.len() == shape.iter().product::<usize>(),
            "noise list entry {} has {} elements, sampler needs shape {:?}",
            self.next,
            item.data.len(),
            shape
        );
        self.next += 1;
        Ok(Tensor::new(shape.to_vec(), item.data.clone()))
    }
}

/// Returns all-zero noise (for deterministic runs of stochastic samplers).
pub struct ZeroNoise;

impl NoiseSource for ZeroNoise {
    fn sample(&mut self, _sigma: f32, _sigma_next: f32, shape: &[usize]) -> anyhow::Result<Tensor> {
        Ok(Tensor::zeros(shape.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mt19937_reference_output() {
        // Reference first output of init_genrand(5489).
        let mut mt = Mt19937::new(5489);
        assert_eq!(mt.next_u32(), 3_499_211_612);
    }

    #[test]
    fn seed_uses_low_32_bits() {
        let a = seeded_noise(u64::MAX, &[1, 4, 2, 2]);
        let b = seeded_noise(u32::MAX as u64, &[1, 4, 2, 2]);
        assert_eq!(a.data, b.data);
    }

    #[test]
    fn small_randn_caches_second_normal() {
        let mut g = TorchGenerator::new(0);
        let one = g.randn(1)[0];
        let two = g.randn(1)[0];
        let mut h = TorchGenerator::new(0);
        assert_eq!(h.randn(2), vec![one, two]);
        // torch.manual_seed(0); torch.randn(1) == 1.5409960746765137
        assert_eq!(one, 1.540_996_1);
    }

    #[test]
    fn randn_tail_block_is_redrawn() {
        let mut g = TorchGenerator::new(0);
        let a = g.randn(17);
        let mut h = TorchGenerator::new(0);
        let b = h.randn(16);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1..16], b[1..16]);
    }
}
