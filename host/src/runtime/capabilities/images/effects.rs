//! The 0.2.0 image operations that make a new picture from one or two: `canny` (edge
//! detection), `stitch` (two images side by side) and `add-noise` (seeded gaussian noise).

use wasmtime::component::Resource;
use weft_compute::image as image_ops;

use super::ops::ImageResult;
use super::Ctx;
use crate::runtime::value::ImageRes;

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
}
