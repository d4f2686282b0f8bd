//! Where each conditioning entry applies and how much, cell by cell, as ComfyUI's samplers
//! work it out: areas in fractions and masks are resolved against the latent once, before
//! sampling (`resolve_areas_and_cond_masks_multidim`), and every step weights an entry's
//! prediction by its strength, faded in at an area's inner edges or multiplied by its mask
//! (`get_area_and_mult`).

use std::sync::Arc;

use super::conditioning::{Area, CondEntry, CondMask, Conditioning};
use crate::image::MaskBatch;
use crate::resize::{resize_planes, Mode};

/// A latent region in cells: `(y, x, height, width)`.
pub type Region = (usize, usize, usize, usize);

/// `conditioning` for a latent of `height` x `width` cells: areas in fractions turned into
/// cells, masks resized (bilinearly) to the latent, and the areas of entries whose mask sets
/// them made the mask's bounding box (at least 8 cells a side).
pub fn resolve(conditioning: &Conditioning, height: usize, width: usize) -> Conditioning {
    let entries = conditioning.0.iter().map(|entry| {
        let mut entry = entry.clone();
        if let Some([fh, fw, fy, fx]) = entry.area_fraction.take() {
            // Python's `round`: halves to even.
            let cells = |f: f64, side: usize| (f * side as f64).round_ties_even() as usize;
            entry.area = Some(Area {
                height: cells(fh, height).max(1),
                width: cells(fw, width).max(1),
                y: cells(fy, height),
                x: cells(fx, width),
            });
        }
        if let Some(m) = &mut entry.mask {
            m.mask = Arc::new(resized(&m.mask, height, width));
            if m.to_bounds {
                entry.area = Some(bounds(&m.mask));
            }
        }
        entry
    });
    Conditioning(entries.collect())
}

/// `mask` at `height` x `width`.
fn resized(mask: &MaskBatch, height: usize, width: usize) -> MaskBatch {
    let (h, w) = (mask.height as usize, mask.width as usize);
    if (h, w) == (height, width) {
        return mask.clone();
    }
    MaskBatch {
        width: width as u32,
        height: height as u32,
        batch: mask.batch,
        data: resize_planes(&mask.data, h, w, height, width, Mode::Bilinear),
    }
}

/// The bounding box of the cells any mask of the batch does not zero, at least 8 cells a
/// side; an 8 x 8 corner when every cell is zero (ComfyUI's `get_mask_aabb`).
fn bounds(mask: &MaskBatch) -> Area {
    let (h, w) = (mask.height as usize, mask.width as usize);
    let set = |r: usize, c: usize| mask.data.chunks_exact(h * w).any(|plane| plane[r * w + c] != 0.0);
    let cells: Vec<(usize, usize)> = (0..h)
        .flat_map(|r| (0..w).map(move |c| (r, c)))
        .filter(|&(r, c)| set(r, c))
        .collect();
    let (Some(top), Some(bottom)) = (cells.iter().map(|c| c.0).min(), cells.iter().map(|c| c.0).max()) else {
        return Area {
            height: 8,
            width: 8,
            y: 0,
            x: 0,
        };
    };
    let left = cells.iter().map(|c| c.1).min().unwrap_or(0);
    let right = cells.iter().map(|c| c.1).max().unwrap_or(0);
    Area {
        height: (bottom - top + 1).max(8),
        width: (right - left + 1).max(8),
        y: top,
        x: left,
    }
}

/// The latent region an entry reads, in cells, clamped to the latent.
pub fn region(area: Option<Area>, height: usize, width: usize) -> Option<Region> {
    match area {
        None => Some((0, 0, height, width)),
        Some(a) => {
            let h = a.height.min(height.saturating_sub(a.y));
            let w = a.width.min(width.saturating_sub(a.x));
            (h > 0 && w > 0).then_some((a.y, a.x, h, w))
        }
    }
}

/// The weight of each cell of `region` for each of `batch` latents (`[batch, h, w]`): the
/// entry's strength times its mask (times its mask strength), or, without a mask, faded in
/// over up to 8 cells at every edge of its area that is not the latent's border.
pub fn weights(entry: &CondEntry, region: Region, height: usize, width: usize, batch: usize) -> Vec<f32> {
    let (y, x, h, w) = region;
    if let Some(mask) = &entry.mask {
        return masked(mask, entry.strength, region, batch);
    }
    let mut mult = vec![entry.strength; h * w];
    if entry.area.is_some() {
        let (fy, fx) = (fade(h, y, height), fade(w, x, width));
        for r in 0..h {
            for c in 0..w {
                mult[r * w + c] *= fy[r] * fx[c];
            }
        }
    }
    mult.repeat(batch)
}

/// Per cell of one side of an area: 1, ramped down over up to 8 cells (a quarter of the side
/// at most) at each end that is not the latent's border.
fn fade(size: usize, offset: usize, full: usize) -> Vec<f32> {
    let mut f = vec![1.0f32; size];
    let rr = 8.min(size / 4);
    for t in 0..rr {
        let ramp = (1.0 / rr as f32) * (t + 1) as f32;
        if offset != 0 {
            f[t] *= ramp;
        }
        if size + offset < full {
            f[size - 1 - t] *= ramp;
        }
    }
    f
}

/// A masked entry's weights: latent `n` reads mask `n` of the first `batch` masks, repeated
/// when there are fewer (the mask already [`resolve`]d to the latent's size).
fn masked(mask: &CondMask, strength: f32, (y, x, h, w): Region, batch: usize) -> Vec<f32> {
    let m = &mask.mask;
    let width = m.width as usize;
    let plane = m.height as usize * width;
    let masks = (m.batch as usize).min(batch).max(1);
    let mut mult = Vec::with_capacity(batch * h * w);
    for n in 0..batch {
        let data = &m.data[(n % masks) * plane..][..plane];
        for r in 0..h {
            let row = &data[(y + r) * width + x..][..w];
            mult.extend(row.iter().map(|v| v * mask.strength * strength));
        }
    }
    mult
}

#[cfg(test)]
mod tests;
