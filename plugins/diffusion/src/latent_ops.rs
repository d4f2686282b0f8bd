//! ComfyUI's latent arithmetic, batching and transform nodes (`nodes.py` and
//! `comfy_extras/nodes_latent.py`).

use weft_sdk::prelude::*;

use crate::MAX_RESOLUTION;
use diffusion::{LatentChange as Change, LatentCombination as Combination};

/// Declares a node that combines its two latent batches by `$how`.
macro_rules! combine_node {
    ($doc:literal, $name:ident, $display:literal, $category:literal, |$inp:ident| $how:expr $(, $field:ident: $ty:ty = $spec:expr)*) => {
        weft_sdk::node! {
            #[doc = $doc]
            pub struct $name {
                display_name: $display,
                category: $category,
                inputs {
                    samples1: Latent = input::latent(),
                    samples2: Latent = input::latent(),
                    $($field: $ty = $spec,)*
                }
                outputs { LATENT: Latent }
                fn execute(_, $inp) {
                    Ok((diffusion::latent_combine(&$inp.samples1, &$inp.samples2, $how)?,))
                }
            }
        }
    };
}

combine_node!(
    "The sum of two latent batches.",
    LatentAdd,
    "LatentAdd",
    "latent/advanced",
    |inp| Combination::Add
);
combine_node!(
    "The first latent batch minus the second.",
    LatentSubtract,
    "LatentSubtract",
    "latent/advanced",
    |inp| Combination::Subtract
);
combine_node!(
    "Each latent vector's direction and length interpolated between the two batches.",
    LatentInterpolate,
    "LatentInterpolate",
    "latent/advanced",
    |inp| Combination::Interpolate(inp.ratio),
    ratio: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01)
);
combine_node!(
    "The second latent batch after the first.",
    LatentBatch,
    "LatentBatch",
    "latent/batch",
    |inp| Combination::Batch
);
combine_node!(
    "`samples1 * blend_factor + samples2 * (1 - blend_factor)`.",
    LatentBlend,
    "Latent Blend",
    "_for_testing",
    |inp| Combination::Blend(inp.blend_factor),
    blend_factor: f64 = input::float().default(0.5).min(0.0).max(1.0).step(0.01)
);

weft_sdk::node! {
    /// Every value of the latents times `multiplier`.
    pub struct LatentMultiply {
        category: "latent/advanced",
        inputs {
            samples: Latent = input::latent(),
            multiplier: f64 = input::float().default(1.0).min(-10.0).max(10.0).step(0.01),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::latent_transform(&inp.samples, Change::Multiply(inp.multiplier))?,))
        }
    }
}

weft_sdk::node! {
    /// Whether the latents of the batch share the first one's noise (`fixed`) or each get
    /// their own (`random`).
    pub struct LatentBatchSeedBehavior {
        category: "latent/advanced",
        inputs {
            samples: Latent = input::latent(),
            seed_behavior: String = input::combo(["random", "fixed"]).default("fixed"),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let how = if inp.seed_behavior == "fixed" { Change::FixedSeed } else { Change::RandomSeed };
            Ok((diffusion::latent_transform(&inp.samples, how)?,))
        }
    }
}

weft_sdk::node! {
    /// A rectangle of the latents, in pixels.
    pub struct LatentCrop {
        display_name: "Crop Latent",
        category: "latent/transform",
        inputs {
            samples: Latent = input::latent(),
            width: u32 = input::uint().default(512).min(64).max(MAX_RESOLUTION as u32).step(8),
            height: u32 = input::uint().default(512).min(64).max(MAX_RESOLUTION as u32).step(8),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let area = diffusion::Area { width: inp.width, height: inp.height, x: inp.x, y: inp.y };
            Ok((diffusion::latent_transform(&inp.samples, Change::Crop(area))?,))
        }
    }
}

weft_sdk::node! {
    /// The latents upside down or mirrored.
    pub struct LatentFlip {
        display_name: "Flip Latent",
        category: "latent/transform",
        inputs {
            samples: Latent = input::latent(),
            flip_method: String = input::combo(["x-axis: vertically", "y-axis: horizontally"]),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let how = if inp.flip_method.starts_with('x') { Change::FlipVertically } else { Change::FlipHorizontally };
            Ok((diffusion::latent_transform(&inp.samples, how)?,))
        }
    }
}

weft_sdk::node! {
    /// The latents turned clockwise.
    pub struct LatentRotate {
        display_name: "Rotate Latent",
        category: "latent/transform",
        inputs {
            samples: Latent = input::latent(),
            rotation: String = input::combo(["none", "90 degrees", "180 degrees", "270 degrees"]),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let quarters = match inp.rotation.as_str() {
                "90 degrees" => 1,
                "180 degrees" => 2,
                "270 degrees" => 3,
                _ => 0,
            };
            Ok((diffusion::latent_transform(&inp.samples, Change::Rotate(quarters))?,))
        }
    }
}

weft_sdk::node! {
    /// `source` pasted into `destination` at `x`, `y`, weighed by `mask`.
    pub struct LatentCompositeMasked {
        category: "latent",
        inputs {
            destination: Latent = input::latent(),
            source: Latent = input::latent(),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
            resize_source: bool = input::boolean().default(false),
            mask: Option<Mask> = input::mask(),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let out = diffusion::latent_composite_masked(
                &inp.destination,
                &inp.source,
                inp.x,
                inp.y,
                inp.resize_source,
                inp.mask.as_ref(),
            )?;
            Ok((out,))
        }
    }
}
