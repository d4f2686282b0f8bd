//! Loops compiled for the widest vector instructions the CPU has, chosen at run time.
//!
//! A [`Kernel`] is a plain, `#[inline(always)]` loop; [`run`] calls it from inside a function
//! compiled for AVX-512 or AVX2+FMA when the CPU has them, so the compiler vectorises the
//! loop for that width (the binary itself targets baseline x86-64). Elsewhere the loop runs
//! as compiled for the target.

/// A loop to run on the best instruction set available. Implement `run` with
/// `#[inline(always)]` so that it is compiled into the feature-enabled callers.
pub(crate) trait Kernel {
    /// What the loop returns.
    type Output;
    /// The loop.
    fn run(self) -> Self::Output;
}

/// The instruction sets [`run_on`] can use (tests compare the variants; [`run`] picks one).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512 Foundation.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 with fused multiply-add.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Whatever the build targets.
    Portable,
}

#[cfg(test)]
impl Isa {
    /// The instruction sets this CPU supports, best first.
    pub(crate) fn available() -> Vec<Isa> {
        let mut isas = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                isas.push(Isa::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                isas.push(Isa::Avx2);
            }
        }
        isas.push(Isa::Portable);
        isas
    }
}

/// Runs `kernel` on the best instruction set this CPU has. Called per row on hot paths:
/// detection is cached by `is_x86_feature_detected!`, and nothing is allocated.
#[inline]
pub(crate) fn run<K: Kernel>(kernel: K) -> K::Output {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the feature the function is compiled for.
            return unsafe { run_avx512(kernel) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { run_avx2(kernel) };
        }
    }
    kernel.run()
}

/// Runs `kernel` compiled for `isa`, which must be one of [`Isa::available`] (for tests that
/// compare the variants).
#[cfg(test)]
pub(crate) fn run_on<K: Kernel>(isa: Isa, kernel: K) -> K::Output {
    assert!(Isa::available().contains(&isa), "{isa:?} is not available on this CPU");
    match isa {
        // SAFETY: the assertion above checked that the CPU has the features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { run_avx512(kernel) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { run_avx2(kernel) },
        Isa::Portable => kernel.run(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn run_avx512<K: Kernel>(kernel: K) -> K::Output {
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2<K: Kernel>(kernel: K) -> K::Output {
    kernel.run()
}

/// `e^x` to about 2 ulp (Cephes' range reduction and degree-7 polynomial, evaluated in
/// Estrin's scheme so that its dependency chain is short), branch-free so that loops over it
/// vectorise. Inputs are clamped to [-87, 88]: below gives ~1e-38, above ~1.6e38.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = x.mul_add(LOG2E, 0.5).floor();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    // e^r = 1 + r + r²·(p5 + p4·r + p3·r² + p2·r³ + p1·r⁴ + p0·r⁵)
    let r2 = r * r;
    let r4 = r2 * r2;
    let low = r.mul_add(1.666_666_5e-1, 0.5);
    let mid = r.mul_add(8.333_452e-3, 4.166_579_6e-2);
    let high = r.mul_add(1.987_569_1e-4, 1.398_199_9e-3);
    let p = r4.mul_add(high, r2.mul_add(mid, low));
    let e = r2.mul_add(p, r) + 1.0;
    // SAFETY: the clamp above keeps `n` finite and within [-126, 127], so it fits an i32 (a
    // plain `as` cast would add saturation checks that stop the loop from vectorising).
    let n = unsafe { n.to_int_unchecked::<i32>() };
    e * f32::from_bits(((n + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_the_standard_library() {
        let mut worst = 0f32;
        for i in 0..=400_000 {
            let x = -87.0 + 175.0 * i as f32 / 400_000.0;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 1e-6, "worst relative error {worst}");
    }

    struct SumOfExps<'a>(&'a [f32]);

    impl Kernel for SumOfExps<'_> {
        type Output = f32;
        #[inline(always)]
        fn run(self) -> f32 {
            self.0.iter().map(|&x| exp(x)).sum()
        }
    }

    #[test]
    fn every_available_isa_runs_the_kernel() {
        let values: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01 - 5.0).collect();
        let want: f32 = values.iter().map(|x| x.exp()).sum();
        for isa in Isa::available() {
            let got = run_on(isa, SumOfExps(&values));
            assert!((got - want).abs() <= 1e-5 * want, "{isa:?}: {got} vs {want}");
        }
        assert!((run(SumOfExps(&values)) - want).abs() <= 1e-5 * want);
    }
}
