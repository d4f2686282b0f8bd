//! What a diffusion model's output means, and how its input is scaled: ComfyUI's
//! model-sampling prediction types (`EPS`, `V_PREDICTION`, `EDM`, LCM's, `X0`,
//! `IMG_TO_IMG`), in float32 with torch's operation order.

/// A model's prediction type: what its output is, given the noisy input `x` at `sigma`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prediction {
    /// The noise (SD1, SDXL): `denoised = x - out * sigma`.
    Eps,
    /// The velocity `v` (SD2 768, zero-terminal-SNR models).
    V,
    /// EDM's preconditioned output (Playground v2.5): the `V` skip term plus `out` scaled.
    Edm,
    /// A latent consistency model's noise, mixed with the input by LCM's boundary
    /// condition at the model's timestep.
    Lcm,
    /// The clean sample itself.
    X0,
    /// The clean sample, from an input that is not scaled (image-to-image models such as
    /// Lotus).
    ImgToImg,
}

/// LCM's `sigma_data` in its boundary condition.
const LCM_SIGMA_DATA: f32 = 0.5;
/// LCM's timestep scaling in its boundary condition.
const LCM_TIMESTEP_SCALING: f32 = 10.0;

impl Prediction {
    /// The model's input for the noisy `x` at `sigma` (`calculate_input`): `x` divided by
    /// `sqrt(sigma^2 + sigma_data^2)`, or `x` itself for [`Prediction::ImgToImg`].
    pub fn input(self, sigma: f32, sigma_data: f32, x: &[f32]) -> Vec<f32> {
        if self == Prediction::ImgToImg {
            return x.to_vec();
        }
        let scale = (sigma * sigma + sigma_data * sigma_data).sqrt();
        x.iter().map(|v| v / scale).collect()
    }

    /// The denoised prediction from the model's `output` for the noisy `input` at `sigma`
    /// (`calculate_denoised`); `timestep` is the model's timestep for `sigma` (LCM's
    /// boundary condition reads it).
    pub fn denoised(self, sigma: f32, sigma_data: f32, timestep: f32, output: &[f32], input: &[f32]) -> Vec<f32> {
        let pairs = output.iter().zip(input);
        match self {
            Prediction::Eps => pairs.map(|(&o, &i)| i - o * sigma).collect(),
            Prediction::V | Prediction::Edm => {
                let sd2 = sigma_data * sigma_data;
                let total = sigma * sigma + sd2;
                let root = total.sqrt();
                let sign = if self == Prediction::V { -1.0 } else { 1.0 };
                pairs
                    .map(|(&o, &i)| (i * sd2) / total + sign * ((o * sigma * sigma_data) / root))
                    .collect()
            }
            Prediction::Lcm => {
                let scaled = timestep * LCM_TIMESTEP_SCALING;
                let total = scaled * scaled + LCM_SIGMA_DATA * LCM_SIGMA_DATA;
                let c_skip = (1.0 / total) * (LCM_SIGMA_DATA * LCM_SIGMA_DATA);
                let c_out = scaled / total.sqrt();
                pairs.map(|(&o, &i)| c_out * (i - o * sigma) + c_skip * i).collect()
            }
            Prediction::X0 | Prediction::ImgToImg => output.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_scales_the_input_and_subtracts_the_scaled_noise() {
        assert_eq!(Prediction::Eps.input(0.0, 1.0, &[2.0]), vec![2.0]);
        assert_eq!(Prediction::Eps.input(3.0, 4.0, &[10.0]), vec![2.0]);
        assert_eq!(Prediction::Eps.denoised(2.0, 1.0, 0.0, &[0.5], &[3.0]), vec![2.0]);
    }

    #[test]
    fn x0_and_img_to_img_return_the_output_and_img_to_img_keeps_the_input() {
        for p in [Prediction::X0, Prediction::ImgToImg] {
            assert_eq!(
                p.denoised(7.0, 1.0, 999.0, &[0.25, -1.0], &[5.0, 6.0]),
                vec![0.25, -1.0]
            );
        }
        assert_eq!(Prediction::ImgToImg.input(7.0, 1.0, &[5.0, 6.0]), vec![5.0, 6.0]);
        assert_eq!(Prediction::X0.input(0.0, 1.0, &[5.0]), vec![5.0]);
    }

    #[test]
    fn v_and_edm_differ_only_in_the_sign_of_the_output_term() {
        // sigma = sigma_data = 1: skip 1/2, output term out / sqrt(2).
        let v = Prediction::V.denoised(1.0, 1.0, 0.0, &[2.0], &[4.0])[0];
        let edm = Prediction::Edm.denoised(1.0, 1.0, 0.0, &[2.0], &[4.0])[0];
        assert!((v - (2.0 - 2.0 / 2f32.sqrt())).abs() < 1e-6, "{v}");
        assert!((edm - (2.0 + 2.0 / 2f32.sqrt())).abs() < 1e-6, "{edm}");
    }

    #[test]
    fn lcm_at_timestep_zero_is_the_input() {
        assert_eq!(Prediction::Lcm.denoised(0.5, 1.0, 0.0, &[3.0], &[1.5]), vec![1.5]);
    }
}
