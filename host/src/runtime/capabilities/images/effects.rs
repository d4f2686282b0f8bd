//! The 0.2.0 image operations that make a new picture from one or two: `canny` (edge
//! detection), `stitch` (two images side by side) and `add-noise` (seeded gaussian noise).

use wasmtime::component::Resource;
use weft_compute::image as image_ops;

use super::ops::{guest_error, ImageResult};
use super::Ctx;
use crate::runtime::bindings::v0_2::weft::node::images::{SpacingColor, StitchDirection, StitchOptions};
use crate::runtime::value::ImageRes;
use image_ops::stitch::{Direction, SpacingColor as Color, Stitch};

impl Ctx<'_> {
    /// `Canny`: the edge maps of `image`, charged for the result and one image's working planes.
    pub(super) fn canny_edges(&mut self, image: Resource<ImageRes>, low: f64, high: f64) -> ImageResult {
        let source = self.image(&image)?;
        let bytes = image_ops::canny::canny_peak_bytes(&source);
        let charge = self.charge_for(bytes, "edge detection on an image batch")?;
        let keep_going = self.keep_going();
        let result = image_ops::canny::canny(&source, low, high, &keep_going);
        self.finish_image(result, charge)
    }

    /// `ImageStitch`: `second` beside `first`, charged for the result and the resize.
    pub(super) fn stitch_images(
        &mut self,
        first: Resource<ImageRes>,
        second: Resource<ImageRes>,
        options: StitchOptions,
    ) -> ImageResult {
        let (first, second) = (self.image(&first)?, self.image(&second)?);
        let options = stitch_options(options);
        let layout = match image_ops::stitch::layout(&first, &second, &options) {
            Ok(layout) => layout,
            Err(e) => return Ok(Err(guest_error(e))),
        };
        let bytes = image_ops::stitch::stitch_peak_bytes(&second, &layout);
        let charge = self.charge_for(bytes, "two stitched image batches")?;
        let keep_going = self.keep_going();
        let result = image_ops::stitch::stitch(&first, &second, &options, &keep_going);
        self.finish_image(result, charge)
    }

    /// `ImageAddNoise`: seeded gaussian noise added to `image`, charged for the result.
    pub(super) fn noisy(&mut self, image: Resource<ImageRes>, seed: u64, strength: f64) -> ImageResult {
        let source = self.image(&image)?;
        let bytes = image_ops::noise::add_noise_peak_bytes(&source);
        let charge = self.charge_for(bytes, "a noisy image batch")?;
        let keep_going = self.keep_going();
        let result = image_ops::noise::add_noise(&source, seed, strength, &keep_going);
        self.finish_image(result, charge)
    }
}

/// The compute options of WIT stitch options.
fn stitch_options(options: StitchOptions) -> Stitch {
    let direction = match options.direction {
        StitchDirection::Right => Direction::Right,
        StitchDirection::Down => Direction::Down,
        StitchDirection::Left => Direction::Left,
        StitchDirection::Up => Direction::Up,
    };
    let color = match options.color {
        SpacingColor::White => Color::White,
        SpacingColor::Black => Color::Black,
        SpacingColor::Red => Color::Red,
        SpacingColor::Green => Color::Green,
        SpacingColor::Blue => Color::Blue,
    };
    Stitch {
        direction,
        match_size: options.match_size,
        spacing: options.spacing,
        color,
    }
}
