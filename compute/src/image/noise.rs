//! `ImageAddNoise` (ComfyUI's `nodes_images`): `torch.manual_seed(seed)`, then every value
//! of the batch (alpha too) plus `strength` times a standard normal from `torch.randn` of
//! the batch's shape on the CPU, clamped to 0..=1. The normals are torch's CPU generator's
//! own ([`crate::sampling::TorchGenerator`], as the samplers' noise).

use super::ImageBatch;
use crate::sampling::TorchGenerator;
use crate::ComputeError;

/// Values added between two questions to the caller.
const VALUES_PER_CHECK: usize = 1 << 20;

/// Bytes [`add_noise`] holds at its peak besides its source: the noise, which becomes the
/// result in place.
pub fn add_noise_peak_bytes(image: &ImageBatch) -> u64 {
    image.data.len() as u64 * 4
}

/// `ImageAddNoise`: `clamp(image + strength * randn, 0, 1)` in float32, the normals drawn
/// with `seed` (its low 32 bits, as torch's generator takes them). `keep_going` is asked
/// every million values; when it says no the result is [`ComputeError::Interrupted`].
pub fn add_noise(
    image: &ImageBatch,
    seed: u64,
    strength: f64,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    let mut generator = TorchGenerator::new(seed);
    let mut data = generator
        .randn_interruptible(image.data.len(), keep_going)
        .ok_or(ComputeError::Interrupted)?;
    let strength = strength as f32;
    for (noise, values) in data
        .chunks_mut(VALUES_PER_CHECK)
        .zip(image.data.chunks(VALUES_PER_CHECK))
    {
        for (noise, value) in noise.iter_mut().zip(values) {
            *noise = (value + strength * *noise).clamp(0.0, 1.0);
        }
        if !keep_going() {
            return Err(ComputeError::Interrupted);
        }
    }
    Ok(ImageBatch { data, ..*image })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, float, Fixture};

    #[test]
    fn noise_is_torchs_seeded_randn_added_and_clamped() {
        let f = Fixture::load();
        for case in f.cases("ImageAddNoise") {
            let seed = case.inputs["seed"].as_u64().unwrap();
            let got = add_noise(&f.image(case, "image"), seed, float(case, "strength"), &always).unwrap();
            f.check_image(case, 0, &got, 0.0);
        }
    }

    #[test]
    fn a_stop_ends_the_noise_as_interrupted() {
        let image = crate::image::empty(1024, 1024, 1, 0).unwrap();
        assert!(matches!(
            add_noise(&image, 1, 0.5, &|| false),
            Err(ComputeError::Interrupted)
        ));
    }
}
