//! Torch's `interpolate` (bilinear and bicubic, `align_corners=False`, no antialias) and
//! ComfyUI's centre crop (`comfy.utils.common_upscale`), on `[batch, height, width,
//! channels]` float planes: what ComfyUI's image and mask nodes resize with.

use super::ImageBatch;
use crate::ComputeError;

use crate::resize::taps;
pub use crate::resize::Mode;

/// A plane of `batch` x `height` x `width` pixels of `channels` floats each.
#[derive(Debug, Clone, PartialEq)]
pub struct Planes {
    /// Images (or masks) in the batch.
    pub batch: usize,
    /// Rows per image.
    pub height: usize,
    /// Pixels per row.
    pub width: usize,
    /// Floats per pixel.
    pub channels: usize,
    /// `batch * height * width * channels` values, row-major.
    pub data: Vec<f32>,
}

impl Planes {
    /// The planes of an image batch (a copy of its pixels).
    pub fn of_image(image: &ImageBatch) -> Self {
        Planes {
            batch: image.batch as usize,
            height: image.height as usize,
            width: image.width as usize,
            channels: image.channels as usize,
            data: image.data.clone(),
        }
    }

    /// These planes as an image batch.
    pub fn into_image(self) -> ImageBatch {
        ImageBatch {
            width: self.width as u32,
            height: self.height as u32,
            batch: self.batch as u32,
            channels: self.channels as u32,
            data: self.data,
        }
    }

    /// The `width` x `height` window at `x`, `y` of every plane.
    pub fn window(&self, x: usize, y: usize, width: usize, height: usize) -> Planes {
        let row = self.width * self.channels;
        let mut data = Vec::with_capacity(self.batch * height * width * self.channels);
        for b in 0..self.batch {
            for line in y..y + height {
                let start = (b * self.height + line) * row + x * self.channels;
                data.extend_from_slice(&self.data[start..start + width * self.channels]);
            }
        }
        Planes {
            batch: self.batch,
            height,
            width,
            channels: self.channels,
            data,
        }
    }
}

/// `planes` resized to `width` x `height` with `mode`, as `torch.nn.functional.interpolate`
/// (unclamped, like torch). `keep_going` is asked once per output row; when it says no the
/// resize stops with [`ComputeError::Interrupted`].
pub fn interpolate(
    planes: &Planes,
    mode: Mode,
    width: usize,
    height: usize,
    keep_going: &dyn Fn() -> bool,
) -> Result<Planes, ComputeError> {
    if width == 0 || height == 0 || planes.width == 0 || planes.height == 0 {
        return Err(ComputeError::invalid("cannot resize to or from an empty image"));
    }
    let rows = taps(planes.height, height, mode);
    let cols = taps(planes.width, width, mode);
    let c = planes.channels;
    let mut data = Vec::with_capacity(planes.batch * height * width * c);
    let mut line = vec![0f32; planes.width * c];
    for b in 0..planes.batch {
        let image = &planes.data[b * planes.height * planes.width * c..][..planes.height * planes.width * c];
        for (ys, wys) in &rows {
            if !keep_going() {
                return Err(ComputeError::Interrupted);
            }
            // Weighted sum of the source rows, then along each row: torch's order of taps.
            line.iter_mut().for_each(|v| *v = 0.0);
            for (y, wy) in ys.iter().zip(wys) {
                let src = &image[y * planes.width * c..][..planes.width * c];
                line.iter_mut().zip(src).for_each(|(v, s)| *v += s * wy);
            }
            for (xs, wxs) in &cols {
                for ch in 0..c {
                    let mut v = 0f32;
                    for (x, wx) in xs.iter().zip(wxs) {
                        v += line[x * c + ch] * wx;
                    }
                    data.push(v);
                }
            }
        }
    }
    Ok(Planes {
        batch: planes.batch,
        height,
        width,
        channels: c,
        data,
    })
}

/// Python's `round`: halves go to the even neighbour.
pub(crate) fn round_half_even(v: f64) -> f64 {
    v.round_ties_even()
}

/// The window ComfyUI's `common_upscale` crops with `crop="center"` from a `width` x
/// `height` source before resizing it to `to_width` x `to_height`: `(x, y, width, height)`.
pub fn center_crop(width: usize, height: usize, to_width: usize, to_height: usize) -> (usize, usize, usize, usize) {
    let old = width as f64 / height as f64;
    let new = to_width as f64 / to_height as f64;
    let (mut x, mut y) = (0usize, 0usize);
    if old > new {
        x = round_half_even((width as f64 - width as f64 * (new / old)) / 2.0) as usize;
    } else if old < new {
        y = round_half_even((height as f64 - height as f64 * (old / new)) / 2.0) as usize;
    }
    (x, y, width - 2 * x, height - 2 * y)
}

/// ComfyUI's `common_upscale(..., mode, "center")`: the centre of `planes` cut to the
/// target's aspect ratio, then interpolated to `width` x `height`.
pub fn upscale_center(
    planes: &Planes,
    mode: Mode,
    width: usize,
    height: usize,
    keep_going: &dyn Fn() -> bool,
) -> Result<Planes, ComputeError> {
    let (x, y, w, h) = center_crop(planes.width, planes.height, width, height);
    if (x, y) == (0, 0) {
        return interpolate(planes, mode, width, height, keep_going);
    }
    interpolate(&planes.window(x, y, w, h), mode, width, height, keep_going)
}

/// ComfyUI's `repeat_to_batch_size`: the first `batch` planes, the batch repeated as often
/// as needed.
pub fn repeat_to_batch(planes: &Planes, batch: usize) -> Planes {
    let len = planes.height * planes.width * planes.channels;
    let data = (0..batch)
        .flat_map(|b| &planes.data[(b % planes.batch) * len..][..len])
        .copied()
        .collect();
    Planes { batch, data, ..*planes }
}

/// Bytes of `batch` planes of `width` x `height` x `channels` floats.
pub fn planes_bytes(batch: usize, width: usize, height: usize, channels: usize) -> u64 {
    batch as u64 * width as u64 * height as u64 * channels as u64 * 4
}
