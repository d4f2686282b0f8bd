//! ComfyUI's image nodes that make a new picture from one or two: edge detection
//! (`comfy_extras/nodes_canny.py`), stitching and seeded noise (`nodes_images.py`).
//! Each is one host call on handles.

use weft_sdk::prelude::*;

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
