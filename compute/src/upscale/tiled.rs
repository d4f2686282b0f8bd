//! ComfyUI's `comfy.utils.tiled_scale` for one image: the image is cut into tiles of at most
//! `tile × tile` pixels overlapping by `overlap`, each is upscaled on its own, and the
//! results are blended with masks that fall off linearly over the (upscaled) overlap, then
//! divided by the masks' sum. An image no larger than a tile is upscaled whole.

use candle_core::Result;

/// How an image is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiling {
    /// The largest tile side, in input pixels.
    pub tile: usize,
    /// Pixels shared by neighbouring tiles.
    pub overlap: usize,
}

impl Tiling {
    /// ComfyUI's `ImageUpscaleWithModel` tiling: 512-pixel tiles overlapping by 32.
    pub const COMFYUI: Tiling = Tiling { tile: 512, overlap: 32 };

    /// Tiles of one `h × w` image: `comfy.utils.get_tiled_scale_steps`.
    pub fn steps(&self, (h, w): (usize, usize)) -> usize {
        self.starts(h).len() * self.starts(w).len()
    }

    /// Where tiles start along a side of `n` pixels (ComfyUI's positions, clamped as it
    /// clamps them).
    fn starts(&self, n: usize) -> Vec<usize> {
        if n <= self.tile {
            return vec![0];
        }
        let step = self.tile.saturating_sub(self.overlap).max(1);
        (0..n.saturating_sub(self.overlap))
            .step_by(step)
            .map(|p| p.min(n - self.overlap))
            .collect()
    }
}

/// Per index along a tile side of `n` upscaled pixels, the factors its mask is multiplied
/// by, in ComfyUI's order (`t` rising, the near edge before the far one).
fn feather_factors(n: usize, feather: usize) -> Vec<Vec<f32>> {
    let mut factors = vec![Vec::new(); n];
    if feather >= n {
        return factors;
    }
    for t in 0..feather {
        let a = ((t + 1) as f64 / feather as f64) as f32;
        factors[t].push(a);
        factors[n - 1 - t].push(a);
    }
    factors
}

/// Upscales one `channels × th × tw` tile (its pixels and `(th, tw)`).
pub(super) type TileFn<'a> = dyn FnMut(&[f32], (usize, usize)) -> Result<Vec<f32>> + 'a;

/// `image` (`channels × h × w`) upscaled `scale` times by `run` (which takes a
/// `channels × th × tw` tile and returns it upscaled), tile by tile as ComfyUI does, calling
/// `on_tile` after each tile.
pub(super) fn tiled_scale(
    image: &[f32],
    (channels, h, w): (usize, usize, usize),
    tiling: Tiling,
    scale: usize,
    run: &mut TileFn<'_>,
    on_tile: &mut dyn FnMut() -> Result<()>,
) -> Result<Vec<f32>> {
    if h <= tiling.tile && w <= tiling.tile {
        let out = run(image, (h, w))?;
        on_tile()?;
        return Ok(out);
    }
    let (ho, wo) = (h * scale, w * scale);
    let mut out = vec![0f32; channels * ho * wo];
    let mut weights = vec![0f32; ho * wo];
    let feather = tiling.overlap * scale;
    for y in tiling.starts(h) {
        for x in tiling.starts(w) {
            let (th, tw) = (tiling.tile.min(h - y), tiling.tile.min(w - x));
            let tile = crop_at(image, (channels, h, w), (y, x), (th, tw));
            let upscaled = run(&tile, (th, tw))?;
            let (uh, uw) = (th * scale, tw * scale);
            let mask = mask(feather_factors(uh, feather), feather_factors(uw, feather));
            blend(
                &mut out,
                &mut weights,
                (ho, wo),
                &upscaled,
                &mask,
                (y * scale, x * scale, uh, uw),
            );
            on_tile()?;
        }
    }
    let plane = ho * wo;
    for (c, o) in out.chunks_exact_mut(plane).enumerate() {
        debug_assert!(c < channels);
        o.iter_mut().zip(&weights).for_each(|(o, &d)| *o /= d);
    }
    Ok(out)
}

/// The `th × tw` region of `image` at `(y, x)`, contiguous.
fn crop_at(
    image: &[f32],
    (channels, h, w): (usize, usize, usize),
    (y, x): (usize, usize),
    (th, tw): (usize, usize),
) -> Vec<f32> {
    let mut out = Vec::with_capacity(channels * th * tw);
    for c in 0..channels {
        for row in y..y + th {
            out.extend_from_slice(&image[(c * h + row) * w + x..][..tw]);
        }
    }
    out
}

/// A tile's mask: row factors then column factors, multiplied onto 1 in float32.
fn mask(rows: Vec<Vec<f32>>, cols: Vec<Vec<f32>>) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * cols.len());
    for r in &rows {
        let row = r.iter().fold(1f32, |m, f| m * f);
        for c in &cols {
            out.push(c.iter().fold(row, |m, f| m * f));
        }
    }
    out
}

/// Adds `tile · mask` to `out` and `mask` to `weights` at `(y, x)` (a `uh × uw` region).
fn blend(
    out: &mut [f32],
    weights: &mut [f32],
    (ho, wo): (usize, usize),
    tile: &[f32],
    mask: &[f32],
    (y, x, uh, uw): (usize, usize, usize, usize),
) {
    for (c, plane) in out.chunks_exact_mut(ho * wo).enumerate() {
        let tile = &tile[c * uh * uw..][..uh * uw];
        for row in 0..uh {
            let o = &mut plane[(y + row) * wo + x..][..uw];
            let (t, m) = (&tile[row * uw..][..uw], &mask[row * uw..][..uw]);
            o.iter_mut().zip(t.iter().zip(m)).for_each(|(o, (&t, &m))| *o += t * m);
        }
    }
    for row in 0..uh {
        let d = &mut weights[(y + row) * wo + x..][..uw];
        d.iter_mut().zip(&mask[row * uw..][..uw]).for_each(|(d, &m)| *d += m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_count_tiles_as_comfyui_does() {
        let t = Tiling::COMFYUI;
        assert_eq!(t.steps((512, 512)), 1);
        assert_eq!(t.steps((513, 100)), 2);
        assert_eq!(t.steps((1000, 1000)), 9);
        assert_eq!(t.steps((1024, 2048)), 15);
    }

    #[test]
    fn tiles_of_an_identity_blend_back_to_the_image() {
        let (c, h, w) = (3, 37, 29);
        let image: Vec<f32> = (0..c * h * w).map(|i| (i % 97) as f32 / 97.0).collect();
        let tiling = Tiling { tile: 16, overlap: 4 };
        let mut tiles = 0;
        let out = tiled_scale(&image, (c, h, w), tiling, 1, &mut |t, _| Ok(t.to_vec()), &mut || {
            tiles += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(tiles, tiling.steps((h, w)));
        for (a, b) in out.iter().zip(&image) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}
