//! ComfyUI's `BrownianTreeNoiseSampler`: the step noise of its SDE samplers, drawn from a
//! torchsde `BrownianTree` seeded with the sampler's seed, so that the noise of a step depends
//! only on the seed and the step's sigmas (not on how many draws came before).

mod interval;
mod seed_sequence;

use self::interval::BrownianInterval;
use super::{NoiseSource, Tensor};

/// Brownian-tree step noise over `[sigma_min, sigma_max]` with the identity time transform and
/// the tree on the CPU, as ComfyUI's `dpmpp_sde`, `dpmpp_2m_sde`, `dpmpp_2m_sde_heun` and
/// `dpmpp_3m_sde` build it. A draw for `(sigma, sigma_next)` is the tree's increment between
/// the two, signed by direction, divided by `sqrt(|sigma_next - sigma|)`: unit normal noise.
///
/// One tree covers the whole batch (ComfyUI passes a single seed), so the noise of a latent
/// depends on the batch size, as in ComfyUI.
pub struct BrownianTreeNoise {
    tree: BrownianInterval,
    shape: Vec<usize>,
    sign: f32,
}

/// `BatchedBrownianTree.sort`: the pair in increasing order, and -1 when it was swapped
/// (also when the two are equal).
fn sort(a: f32, b: f32) -> (f32, f32, f32) {
    if a < b {
        (a, b, 1.0)
    } else {
        (b, a, -1.0)
    }
}

impl BrownianTreeNoise {
    /// The tree for tensors of `shape` between `sigma_min` and `sigma_max`, seeded with `seed`.
    pub fn new(seed: u64, sigma_min: f32, sigma_max: f32, shape: &[usize]) -> anyhow::Result<Self> {
        let (t0, t1, sign) = sort(sigma_min, sigma_max);
        let len = shape.iter().product();
        Ok(BrownianTreeNoise {
            tree: BrownianInterval::new(f64::from(t0), f64::from(t1), len, seed)?,
            shape: shape.to_vec(),
            sign,
        })
    }

    /// The tree an SDE sampler builds for `sigmas`: from the smallest positive sigma to the
    /// largest (`sigmas[sigmas > 0].min(), sigmas.max()`).
    pub fn for_sigmas(seed: u64, sigmas: &[f32], shape: &[usize]) -> anyhow::Result<Self> {
        let sigma_min = sigmas
            .iter()
            .copied()
            .filter(|&s| s > 0.0)
            .reduce(f32::min)
            .ok_or_else(|| anyhow::anyhow!("no positive sigma in {sigmas:?}"))?;
        let sigma_max = sigmas.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        Self::new(seed, sigma_min, sigma_max, shape)
    }
}

impl NoiseSource for BrownianTreeNoise {
    fn sample(&mut self, sigma: f32, sigma_next: f32, shape: &[usize]) -> anyhow::Result<Tensor> {
        anyhow::ensure!(
            shape == self.shape.as_slice(),
            "Brownian noise made for {:?}, asked for {shape:?}",
            self.shape
        );
        let (ta, tb, sign) = sort(sigma, sigma_next);
        let w = self.tree.increment(f64::from(ta), f64::from(tb))?;
        let scale = self.sign * sign;
        // ComfyUI divides by sqrt(|t1 - t0|) in float32 (NaN for a zero-length step, as there).
        let norm = (sigma_next - sigma).abs().sqrt();
        Ok(Tensor::new(
            shape.to_vec(),
            w.into_iter().map(|v| (v * scale) / norm).collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws of ComfyUI's own `BrownianTreeNoiseSampler` (see the fixture's `about`).
    #[test]
    fn matches_comfyui_brownian_tree_noise_sampler() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/comfyui-brownian-tree.json"
        );
        let fixture: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let floats = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        };
        let mut worst = 0f32;
        for case in fixture["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let shape: Vec<usize> = case["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let seed = case["seed"].as_u64().unwrap();
            let mut noise = BrownianTreeNoise::for_sigmas(seed, &floats(&case["sigmas"]), &shape).unwrap();
            for (k, draw) in case["draws"].as_array().unwrap().iter().enumerate() {
                let (s, sn) = (
                    draw["sigma"].as_f64().unwrap() as f32,
                    draw["sigma_next"].as_f64().unwrap() as f32,
                );
                let got = noise.sample(s, sn, &shape).unwrap().data;
                let want = floats(&draw["noise"]);
                assert_eq!(got.len(), want.len(), "{name} draw {k}");
                for (g, w) in got.iter().zip(&want) {
                    let d = (g - w).abs();
                    worst = worst.max(d);
                    assert!(d <= 1e-5 * w.abs().max(1.0), "{name} draw {k}: {g} vs {w}");
                }
            }
        }
        eprintln!("Brownian tree noise vs ComfyUI: worst |diff| {worst:e}");
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(BrownianTreeNoise::for_sigmas(1, &[0.0, 0.0], &[1, 4, 2, 2]).is_err());
        let mut n = BrownianTreeNoise::new(1, 0.1, 1.0, &[1, 4, 2, 2]).unwrap();
        assert!(n.sample(1.0, 0.5, &[1, 4, 2, 3]).is_err());
        assert!(BrownianTreeNoise::new(1, f32::NAN, 1.0, &[4]).is_err());
    }
}
