//! The latent arithmetic and transform nodes' host side: the WIT variants read into
//! compute's, and the size of what each makes, charged before it is made.

use weft_compute::diffusion::latent_ops::{Combination, Transform};
use weft_compute::values::LatentBatch;

use crate::runtime::bindings::v0_2::weft::node::diffusion::{LatentChange, LatentCombination};

/// Compute's combination for `how` (`None`: `LatentBatch`, which is not a combination of
/// values).
pub(super) fn combination(how: LatentCombination) -> Option<Combination> {
    Some(match how {
        LatentCombination::Add => Combination::Add,
        LatentCombination::Subtract => Combination::Subtract,
        LatentCombination::Interpolate(ratio) => Combination::Interpolate(ratio),
        LatentCombination::Blend(factor) => Combination::Blend(factor),
        LatentCombination::Batch => return None,
    })
}

/// Compute's transform for `transform`.
pub(super) fn transform(transform: LatentChange) -> Transform {
    match transform {
        LatentChange::Multiply(factor) => Transform::Multiply(factor),
        LatentChange::Crop(a) => Transform::Crop {
            width: a.width,
            height: a.height,
            x: a.x,
            y: a.y,
        },
        LatentChange::FlipVertically => Transform::Flip { horizontally: false },
        LatentChange::FlipHorizontally => Transform::Flip { horizontally: true },
        LatentChange::Rotate(quarters) => Transform::Rotate(quarters),
        LatentChange::FixedSeed => Transform::SeedBehavior { fixed: true },
        LatentChange::RandomSeed => Transform::SeedBehavior { fixed: false },
    }
}

/// The shape of the result of combining `a` with `b` (the largest it can be: `b` repeated
/// to `a`'s batch, or after it), and the bytes of `b` resized to `a`'s planes on the way.
pub(super) fn combined_shape(a: &LatentBatch, b: &LatentBatch, batch: bool) -> ([u32; 4], u64) {
    let [ab, c, h, w] = a.shape;
    let bb = b.shape[0];
    let resized = u64::from(bb) * u64::from(c) * u64::from(h) * u64::from(w) * 4;
    let out_batch = if batch { ab.saturating_add(bb) } else { ab.max(bb) };
    ([out_batch, c, h, w], resized)
}
