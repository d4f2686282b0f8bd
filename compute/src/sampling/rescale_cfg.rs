//! ComfyUI's `RescaleCFG` guidance ("Common Diffusion Noise Schedules and Sample Steps are
//! Flawed", section 3.4): classifier-free guidance taken in v-prediction space, its
//! standard deviation per latent rescaled to the conditional prediction's, blended with the
//! plain guidance by a multiplier. Float32 with torch's operation order.

/// Guidance of `x` at `sigma` (one sigma for the whole batch) from the conditional and
/// unconditional denoised predictions `cond` and `uncond` (all `batch` latents, row-major)
/// with guidance `scale`, rescaled by `multiplier` (0: plain guidance in v space, 1: fully
/// rescaled). Returns the guided denoised prediction.
pub fn rescale_cfg(
    x: &[f32],
    cond: &[f32],
    uncond: &[f32],
    scale: f32,
    sigma: f32,
    multiplier: f64,
    batch: usize,
) -> Vec<f32> {
    let total = sigma * sigma + 1.0;
    let root = total.sqrt();
    // The predictions as the v a v-prediction model would have given.
    let to_v = |xv: f32, denoised: f32| {
        let noise = xv - denoised;
        ((xv / total - (xv - noise)) * root) / sigma
    };
    let cond_v: Vec<f32> = x.iter().zip(cond).map(|(&xv, &c)| to_v(xv, c)).collect();
    let guided_v: Vec<f32> = x
        .iter()
        .zip(uncond)
        .zip(&cond_v)
        .map(|((&xv, &u), &c)| {
            let u = to_v(xv, u);
            u + scale * (c - u)
        })
        .collect();
    let per = x.len() / batch.max(1);
    let keep = multiplier as f32;
    let plain = (1.0 - multiplier) as f32;
    let mut out = Vec::with_capacity(x.len());
    for ((xs, cs), gs) in x.chunks(per).zip(cond_v.chunks(per)).zip(guided_v.chunks(per)) {
        let factor = std_f32(cs) / std_f32(gs);
        for (&xv, &g) in xs.iter().zip(gs) {
            let blended = keep * (g * factor) + plain * g;
            let back = xv - (xv / total - (blended * sigma) / root);
            out.push(xv - back);
        }
    }
    out
}

/// `torch.std` (Bessel-corrected) of float32 values, accumulated in float64.
fn std_f32(values: &[f32]) -> f32 {
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
    let squares: f64 = values.iter().map(|&v| (v as f64 - mean).powi(2)).sum();
    (squares / (n - 1.0)).sqrt() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    const X: [f32; 6] = [0.5, -1.0, 2.0, 0.25, 1.5, -0.5];
    const COND: [f32; 6] = [0.4, -0.6, 1.2, 0.1, 1.0, -0.2];
    const UNCOND: [f32; 6] = [0.1, -0.2, 0.9, 0.3, 0.8, 0.0];

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
    }

    #[test]
    fn multiplier_zero_is_plain_guidance() {
        let out = rescale_cfg(&X, &COND, &UNCOND, 3.0, 2.0, 0.0, 2);
        assert!(close(&out, &crate::sampling::cfg(&UNCOND, &COND, 3.0)), "{out:?}");
    }

    #[test]
    fn guidance_one_is_the_conditional_prediction_at_any_multiplier() {
        for multiplier in [0.0, 0.7, 1.0] {
            let out = rescale_cfg(&X, &COND, &UNCOND, 1.0, 2.0, multiplier, 2);
            assert!(close(&out, &COND), "{multiplier}: {out:?}");
        }
    }

    #[test]
    fn a_rescale_moves_strong_guidance() {
        let rescaled = rescale_cfg(&X, &COND, &UNCOND, 7.0, 2.0, 0.7, 2);
        assert!(!close(&rescaled, &rescale_cfg(&X, &COND, &UNCOND, 7.0, 2.0, 0.0, 2)));
    }
}
