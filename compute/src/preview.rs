//! Cheap latent previews: ComfyUI's `Latent2RGBPreviewer`, a fixed linear projection of the
//! four latent channels onto RGB plus a bias (`comfy/latent_formats.py`,
//! `latent_rgb_factors` and `latent_rgb_factors_bias` of SD1.5's and SDXL's formats), then
//! `(v + 1) / 2` clamped to 0..=1. The result is 1/8 of the image size.

use super::image::ImageBatch;
use super::sampling::Tensor;
use super::ComputeError;

/// A latent format's projection onto RGB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatentRgb {
    /// Rows = latent channels, columns = R, G, B.
    pub factors: [[f32; 3]; 4],
    /// Added to each of R, G, B.
    pub bias: [f32; 3],
}

/// SD1.x's projection (no bias).
pub const SD15_LATENT_RGB: LatentRgb = LatentRgb {
    factors: [
        [0.3512, 0.2297, 0.3227],
        [0.3250, 0.4974, 0.2350],
        [-0.2829, 0.1762, 0.2721],
        [-0.2120, -0.2616, -0.7177],
    ],
    bias: [0.0; 3],
};

/// SDXL's projection.
pub const SDXL_LATENT_RGB: LatentRgb = LatentRgb {
    factors: [
        [0.3651, 0.4232, 0.4341],
        [-0.2533, -0.0042, 0.1068],
        [0.1076, 0.1111, -0.0362],
        [-0.3165, -0.2492, -0.2188],
    ],
    bias: [0.1084, -0.0175, -0.0011],
};

/// RGB previews of a `[batch, 4, h, w]` SD1 latent in the sampler's (scaled) space, as the
/// `x0`/`denoised` a step callback sees: an `ImageBatch` of `w` x `h` pixels per item.
pub fn latent_to_rgb(latent: &Tensor) -> Result<ImageBatch, ComputeError> {
    latent_to_rgb_with(latent, &SD15_LATENT_RGB)
}

/// [`latent_to_rgb`] with the projection of the model's latent format.
pub fn latent_to_rgb_with(latent: &Tensor, format: &LatentRgb) -> Result<ImageBatch, ComputeError> {
    let [b, c, h, w] = latent.shape[..] else {
        return Err(ComputeError::invalid(format!(
            "a latent preview needs a [batch, 4, h, w] tensor, got {:?}",
            latent.shape
        )));
    };
    if c != format.factors.len() || b == 0 || h == 0 || w == 0 {
        return Err(ComputeError::invalid(format!(
            "a latent preview needs a [batch, 4, h, w] tensor, got {:?}",
            latent.shape
        )));
    }
    let plane = h * w;
    let mut data = vec![0f32; b * plane * 3];
    for n in 0..b {
        let item = &latent.data[n * c * plane..(n + 1) * c * plane];
        for p in 0..plane {
            for (rgb, out) in data[(n * plane + p) * 3..(n * plane + p) * 3 + 3]
                .iter_mut()
                .enumerate()
            {
                let v: f32 = (0..c)
                    .map(|ch| item[ch * plane + p] * format.factors[ch][rgb])
                    .sum::<f32>()
                    + format.bias[rgb];
                *out = ((v + 1.0) / 2.0).clamp(0.0, 1.0);
            }
        }
    }
    Ok(ImageBatch {
        width: w as u32,
        height: h as u32,
        batch: b as u32,
        channels: 3,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projection() {
        // One pixel, latent (1, 0, 0, -1): R = 0.3512 + 0.2120, mapped by (v + 1) / 2; B clamps.
        let t = Tensor::new(vec![1, 4, 1, 1], vec![1.0, 0.0, 0.0, -1.0]);
        let img = latent_to_rgb(&t).unwrap();
        assert_eq!((img.width, img.height, img.batch), (1, 1, 1));
        let want = [(0.3512f32 + 0.2120 + 1.0) / 2.0, (0.2297f32 + 0.2616 + 1.0) / 2.0, 1.0];
        for (a, b) in img.data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        // Clamped.
        let t = Tensor::new(vec![1, 4, 1, 2], vec![9.0, -9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let img = latent_to_rgb(&t).unwrap();
        assert_eq!(&img.data[..3], &[1.0, 1.0, 1.0]);
        assert_eq!(&img.data[3..], &[0.0, 0.0, 0.0]);
        assert!(latent_to_rgb(&Tensor::zeros(vec![1, 3, 2, 2])).is_err());
        // SDXL's projection adds its bias: a zero latent is the bias, mapped.
        let img = latent_to_rgb_with(&Tensor::zeros(vec![1, 4, 1, 1]), &SDXL_LATENT_RGB).unwrap();
        let want = [
            (0.1084f32 + 1.0) / 2.0,
            (-0.0175f32 + 1.0) / 2.0,
            (-0.0011f32 + 1.0) / 2.0,
        ];
        for (a, b) in img.data.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        assert!(crate::codecs::encode_png(&img, 0, &[]).is_ok());
    }
}
