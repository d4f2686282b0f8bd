//! ComfyUI's image nodes that make a new picture from one or two: edge detection
//! (`comfy_extras/nodes_canny.py`), stitching and seeded noise (`nodes_images.py`).
//! Each is one host call on handles.

use weft_sdk::prelude::*;

use images::{SpacingColor, StitchDirection, StitchOptions};

weft_sdk::node! {
    /// Finds edges with kornia's Canny detector: white edges on black, the image's size.
    pub struct Canny {
        category: "image/preprocessors",
        inputs {
            image: Image = input::image(),
            low_threshold: f64 = input::float().default(0.4).min(0.01).max(0.99).step(0.01),
            high_threshold: f64 = input::float().default(0.8).min(0.01).max(0.99).step(0.01),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::canny(&inp.image, inp.low_threshold, inp.high_threshold)?,))
        }
    }
}

weft_sdk::node! {
    /// Stitches image2 to image1 in the specified direction. If image2 is not provided,
    /// returns image1 unchanged. Optional spacing can be added between images.
    pub struct ImageStitch {
        display_name: "Image Stitch",
        category: "image/transform",
        inputs {
            image1: Image = input::image(),
            direction: String = input::combo(["right", "down", "left", "up"]).default("right"),
            match_image_size: bool = input::boolean().default(true),
            spacing_width: u32 = input::uint().default(0).min(0).max(1024).step(2),
            spacing_color: String =
                input::combo(["white", "black", "red", "green", "blue"]).default("white"),
            image2: Option<Image> = input::image(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let Some(image2) = inp.image2 else {
                return Ok((inp.image1,));
            };
            let direction = match inp.direction.as_str() {
                "right" => StitchDirection::Right,
                "down" => StitchDirection::Down,
                "left" => StitchDirection::Left,
                "up" => StitchDirection::Up,
                other => return Err(NodeError::invalid_input(format!("unknown direction {other:?}"))),
            };
            let color = match inp.spacing_color.as_str() {
                "white" => SpacingColor::White,
                "black" => SpacingColor::Black,
                "red" => SpacingColor::Red,
                "green" => SpacingColor::Green,
                "blue" => SpacingColor::Blue,
                other => return Err(NodeError::invalid_input(format!("unknown spacing_color {other:?}"))),
            };
            let options = StitchOptions {
                direction,
                match_size: inp.match_image_size,
                spacing: inp.spacing_width,
                color,
            };
            Ok((images::stitch(&inp.image1, &image2, options)?,))
        }
    }
}

/// The largest seed the contract's integers carry (ComfyUI allows up to `2^64 - 1`;
/// torch uses only the low 32 bits of any seed).
const MAX_SEED: u64 = i64::MAX as u64;

weft_sdk::node! {
    /// Adds seeded gaussian noise of `strength` to every value, clamped to 0..=1.
    pub struct ImageAddNoise {
        category: "image",
        inputs {
            image: Image = input::image(),
            seed: u64 = input::uint64().default(0).min(0).max(MAX_SEED)
                .tooltip("The random seed used for creating the noise."),
            strength: f64 = input::float().default(0.5).min(0.0).max(1.0).step(0.01),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::add_noise(&inp.image, inp.seed, inp.strength)?,))
        }
    }
}
