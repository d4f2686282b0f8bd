//! `ImageBlur` and `ImageSharpen` (ComfyUI's `nodes_post_processing`): a square kernel
//! convolved over each channel of each image, reflect-padded at the edges.

use super::ImageBatch;
use crate::ComputeError;

/// Torch's float32 `linspace(-1, 1, steps)`: from both ends towards the middle.
fn linspace(steps: usize) -> Vec<f32> {
    let step = 2.0f32 / (steps - 1) as f32;
    let halfway = steps / 2;
    (0..steps)
        .map(|i| {
            if i < halfway {
                -1.0 + step * i as f32
            } else {
                1.0 - step * (steps - i - 1) as f32
            }
        })
        .collect()
}

/// ComfyUI's `gaussian_kernel(size, sigma)`: a normalised gaussian over a `size` x `size`
/// grid spanning -1..1, row-major.
pub fn gaussian_kernel(size: usize, sigma: f64) -> Vec<f32> {
    let grid = linspace(size);
    let denominator = (2.0 * sigma * sigma) as f32;
    let mut kernel = Vec::with_capacity(size * size);
    for &x in &grid {
        for &y in &grid {
            let d = (x * x + y * y).sqrt();
            kernel.push((-(d * d) / denominator).exp());
        }
    }
    let sum: f32 = kernel.iter().sum();
    kernel.iter_mut().for_each(|v| *v /= sum);
    kernel
}

/// `ImageSharpen`'s kernel: the gaussian scaled by `-10 alpha`, its centre raised so that
/// the kernel sums to one.
pub fn sharpen_kernel(size: usize, sigma: f64, alpha: f64) -> Vec<f32> {
    let scale = -(alpha * 10.0) as f32;
    let mut kernel: Vec<f32> = gaussian_kernel(size, sigma).iter().map(|v| v * scale).collect();
    let sum: f32 = kernel.iter().sum();
    let center = size / 2 * size + size / 2;
    kernel[center] = kernel[center] - sum + 1.0;
    kernel
}

/// Index `i` (which may lie up to one side outside `0..n`) reflected into it.
fn reflect(i: isize, n: usize) -> usize {
    let n = n as isize;
    let r = if i < 0 {
        -i
    } else if i >= n {
        2 * (n - 1) - i
    } else {
        i
    };
    r as usize
}

/// Every image convolved with the `size` x `size` `kernel` (cross-correlation, as torch's
/// `conv2d`), reflect-padded by `size / 2`; the result clamped to 0..=1 when `clamp`. The
/// radius must be less than each side, as torch's reflect padding requires. `keep_going`
/// is asked once per row.
pub fn convolve(
    image: &ImageBatch,
    kernel: &[f32],
    size: usize,
    clamp: bool,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    let radius = size / 2;
    let (w, h, c) = (image.width as usize, image.height as usize, image.channels as usize);
    if radius >= w || radius >= h {
        return Err(ComputeError::invalid(format!(
            "a radius of {radius} needs an image larger than {radius}x{radius}, got {w}x{h}"
        )));
    }
    let mut data = Vec::with_capacity(image.data.len());
    for frame in image.data.chunks_exact(w * h * c) {
        for y in 0..h {
            if !keep_going() {
                return Err(ComputeError::Interrupted);
            }
            for x in 0..w {
                for ch in 0..c {
                    let mut sum = 0f64;
                    for (u, krow) in kernel.chunks_exact(size).enumerate() {
                        let sy = reflect(y as isize + u as isize - radius as isize, h);
                        for (v, k) in krow.iter().enumerate() {
                            let sx = reflect(x as isize + v as isize - radius as isize, w);
                            sum += f64::from(*k) * f64::from(frame[(sy * w + sx) * c + ch]);
                        }
                    }
                    let v = sum as f32;
                    data.push(if clamp { v.clamp(0.0, 1.0) } else { v });
                }
            }
        }
    }
    Ok(ImageBatch { data, ..*image })
}

/// `ImageBlur`: a gaussian of `radius` and `sigma`.
pub fn blur(
    image: &ImageBatch,
    radius: u32,
    sigma: f64,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    let size = radius as usize * 2 + 1;
    convolve(image, &gaussian_kernel(size, sigma), size, false, keep_going)
}

/// `ImageSharpen`: the sharpening kernel of `radius`, `sigma` and `alpha`, clamped.
pub fn sharpen(
    image: &ImageBatch,
    radius: u32,
    sigma: f64,
    alpha: f64,
    keep_going: &dyn Fn() -> bool,
) -> Result<ImageBatch, ComputeError> {
    let size = radius as usize * 2 + 1;
    convolve(image, &sharpen_kernel(size, sigma, alpha), size, true, keep_going)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::fixture::{always, float, uint, Fixture};

    #[test]
    fn blur_matches_comfyuis_gaussian_convolution() {
        let f = Fixture::load();
        for case in f.cases("ImageBlur") {
            let got = blur(
                &f.image(case, "image"),
                uint(case, "blur_radius"),
                float(case, "sigma"),
                &always,
            )
            .unwrap();
            f.check_image(case, 0, &got, 1e-6);
        }
    }

    #[test]
    fn sharpen_matches_comfyuis_unsharp_kernel() {
        let f = Fixture::load();
        for case in f.cases("ImageSharpen") {
            let image = f.image(case, "image");
            let got = sharpen(
                &image,
                uint(case, "sharpen_radius"),
                float(case, "sigma"),
                float(case, "alpha"),
                &always,
            )
            .unwrap();
            f.check_image(case, 0, &got, 1e-5);
        }
    }

    #[test]
    fn a_radius_as_large_as_a_side_is_refused() {
        let image = crate::image::empty(3, 8, 1, 0).unwrap();
        assert!(blur(&image, 3, 1.0, &always).is_err());
        assert!(blur(&image, 2, 1.0, &always).is_ok());
    }
}
