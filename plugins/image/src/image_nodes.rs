//! ComfyUI's image nodes beyond loading and saving: transforms, batches, blending,
//! filters, compositing and padding (`nodes.py`, `comfy_extras/nodes_images.py`,
//! `nodes_post_processing.py`, `nodes_mask.py`). Each is one host call on handles.

use weft_sdk::prelude::*;

use crate::MAX_RESOLUTION;
use images::{BlendMode, Edges, FilterOp, Rect, TransformOp};

weft_sdk::node! {
    /// Cuts a rectangle out of every image; the corner is clamped inside the image.
    pub struct ImageCrop {
        display_name: "Image Crop",
        category: "image/transform",
        inputs {
            image: Image = input::image(),
            width: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            height: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let area = Rect { x: inp.x, y: inp.y, width: inp.width, height: inp.height };
            Ok((images::transform(&inp.image, TransformOp::Crop(area))?,))
        }
    }
}

weft_sdk::node! {
    /// Flips every image top to bottom (x-axis) or left to right (y-axis).
    pub struct ImageFlip {
        category: "image/transform",
        inputs {
            image: Image = input::image(),
            flip_method: String = input::combo(["x-axis: vertically", "y-axis: horizontally"]),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let vertical = inp.flip_method.starts_with('x');
            Ok((images::transform(&inp.image, TransformOp::Flip(vertical))?,))
        }
    }
}

weft_sdk::node! {
    /// Rotates every image clockwise by quarter turns.
    pub struct ImageRotate {
        category: "image/transform",
        inputs {
            image: Image = input::image(),
            rotation: String = input::combo(["none", "90 degrees", "180 degrees", "270 degrees"]),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let turns = match inp.rotation.as_str() {
                r if r.starts_with("90") => 1,
                r if r.starts_with("180") => 2,
                r if r.starts_with("270") => 3,
                _ => return Ok((inp.image,)),
            };
            Ok((images::transform(&inp.image, TransformOp::Rotate(turns))?,))
        }
    }
}

weft_sdk::node! {
    /// Blends two images; the second is resized to the first's size when it differs.
    pub struct ImageBlend {
        category: "image/postprocessing",
        inputs {
            image1: Image = input::image(),
            image2: Image = input::image(),
            blend_factor: f64 = input::float().default(0.5).min(0.0).max(1.0).step(0.01),
            blend_mode: String =
                input::combo(["normal", "multiply", "screen", "overlay", "soft_light", "difference"]),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let mode = match inp.blend_mode.as_str() {
                "normal" => BlendMode::Normal,
                "multiply" => BlendMode::Multiply,
                "screen" => BlendMode::Screen,
                "overlay" => BlendMode::Overlay,
                "soft_light" => BlendMode::SoftLight,
                "difference" => BlendMode::Difference,
                other => return Err(NodeError::invalid_input(format!("unknown blend_mode {other:?}"))),
            };
            Ok((images::blend(&inp.image1, &inp.image2, inp.blend_factor, mode)?,))
        }
    }
}

weft_sdk::node! {
    /// A gaussian blur; the radius must be less than each side of the image.
    pub struct ImageBlur {
        category: "image/postprocessing",
        inputs {
            image: Image = input::image(),
            blur_radius: u32 = input::uint().default(1).min(1).max(31).step(1),
            sigma: f64 = input::float().default(1.0).min(0.1).max(10.0).step(0.1),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::filter(&inp.image, FilterOp::Blur((inp.blur_radius, inp.sigma)))?,))
        }
    }
}

weft_sdk::node! {
    /// Sharpens with an unsharp kernel; the radius must be less than each side.
    pub struct ImageSharpen {
        category: "image/postprocessing",
        inputs {
            image: Image = input::image(),
            sharpen_radius: u32 = input::uint().default(1).min(1).max(31).step(1),
            sigma: f64 = input::float().default(1.0).min(0.1).max(10.0).step(0.01),
            alpha: f64 = input::float().default(1.0).min(0.0).max(5.0).step(0.01),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let op = FilterOp::Sharpen((inp.sharpen_radius, inp.sigma, inp.alpha));
            Ok((images::filter(&inp.image, op)?,))
        }
    }
}

weft_sdk::node! {
    /// Joins two batches; the second is resized (bilinear, centre crop) to the first's size.
    pub struct ImageBatch {
        display_name: "Batch Images",
        category: "image",
        inputs {
            image1: Image = input::image(),
            image2: Image = input::image(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::concat(&inp.image1, &inp.image2)?,))
        }
    }
}

weft_sdk::node! {
    /// Takes `length` images from `batch_index` (both clamped to the batch).
    pub struct ImageFromBatch {
        category: "image/batch",
        inputs {
            image: Image = input::image(),
            batch_index: u32 = input::uint().default(0).min(0).max(4095),
            length: u32 = input::uint().default(1).min(1).max(4096),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::select(&inp.image, inp.batch_index, inp.length)?,))
        }
    }
}

weft_sdk::node! {
    /// Repeats the whole batch `amount` times.
    pub struct RepeatImageBatch {
        category: "image/batch",
        inputs {
            image: Image = input::image(),
            amount: u32 = input::uint().default(1).min(1).max(4096),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::repeat(&inp.image, inp.amount)?,))
        }
    }
}

weft_sdk::node! {
    /// Pastes `source` onto `destination` at `x`, `y`, weighed by an optional mask.
    pub struct ImageCompositeMasked {
        category: "image",
        inputs {
            destination: Image = input::image(),
            source: Image = input::image(),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            resize_source: bool = input::boolean().default(false),
            mask: Option<Mask> = input::mask(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let image = images::composite(
                &inp.destination,
                &inp.source,
                inp.x,
                inp.y,
                inp.resize_source,
                inp.mask.as_ref(),
            )?;
            Ok((image,))
        }
    }
}

weft_sdk::node! {
    /// Pads images with grey for outpainting, and masks the padding (feathered inside).
    pub struct ImagePadForOutpaint {
        display_name: "Pad Image for Outpainting",
        category: "image",
        inputs {
            image: Image = input::image(),
            left: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(8),
            top: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(8),
            right: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(8),
            bottom: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(8),
            feathering: u32 = input::uint().default(40).min(0).max(MAX_RESOLUTION).step(1),
        }
        outputs { IMAGE: Image, MASK: Mask }
        fn execute(_, inp) {
            let margins = Edges { left: inp.left, top: inp.top, right: inp.right, bottom: inp.bottom };
            images::pad(&inp.image, margins, inp.feathering)
        }
    }
}

/// `ImageScaleToTotalPixels`' target size for a `width` x `height` image: both sides
/// scaled by `sqrt(int(megapixels * 2^20) / (width * height))`, rounded half to even.
pub fn total_pixels_size(width: u32, height: u32, megapixels: f64) -> (u32, u32) {
    let total = (megapixels * 1024.0 * 1024.0).trunc();
    let scale_by = (total / (f64::from(width) * f64::from(height))).sqrt();
    let side = |v: u32| (f64::from(v) * scale_by).round_ties_even() as u32;
    (side(width), side(height))
}

weft_sdk::node! {
    /// Resizes images to about `megapixels` million pixels, keeping the aspect ratio.
    pub struct ImageScaleToTotalPixels {
        category: "image/upscaling",
        inputs {
            image: Image = input::image(),
            upscale_method: String =
                input::combo(["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]),
            megapixels: f64 = input::float().default(1.0).min(0.01).max(16.0).step(0.01),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let (width, height) = total_pixels_size(inp.image.width(), inp.image.height(), inp.megapixels);
            if width == 0 || height == 0 {
                return Err(NodeError::invalid_input("the scaled image would be empty"));
            }
            Ok((images::scale(&inp.image, &inp.upscale_method, width, height, "disabled")?,))
        }
    }
}

/// `ImageScaleToMaxDimension`'s target size for a `width` x `height` image: the longer
/// side becomes `largest`, the other keeps the aspect ratio (rounded half to even).
pub fn max_dimension_size(width: u32, height: u32, largest: u32) -> (u32, u32) {
    let other = |a: u32, b: u32| (f64::from(a) / f64::from(b) * f64::from(largest)).round_ties_even() as u32;
    match height.cmp(&width) {
        std::cmp::Ordering::Greater => (other(width, height), largest),
        std::cmp::Ordering::Less => (largest, other(height, width)),
        std::cmp::Ordering::Equal => (largest, largest),
    }
}

weft_sdk::node! {
    /// Resizes images so that their longer side is `largest_size`.
    pub struct ImageScaleToMaxDimension {
        category: "image/upscaling",
        inputs {
            image: Image = input::image(),
            upscale_method: String =
                input::combo(["area", "lanczos", "bilinear", "nearest-exact", "bilinear", "bicubic"]),
            largest_size: u32 = input::uint().default(512).min(0).max(MAX_RESOLUTION).step(1),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let (width, height) = max_dimension_size(inp.image.width(), inp.image.height(), inp.largest_size);
            if width == 0 || height == 0 {
                return Err(NodeError::invalid_input("the scaled image would be empty"));
            }
            Ok((images::scale(&inp.image, &inp.upscale_method, width, height, "disabled")?,))
        }
    }
}

/// `ResizeAndPadImage`'s resized size and its offset in the target: the image scaled by
/// the smaller of the two side ratios (sides truncated), centred (offsets floored).
pub fn fit_inside(width: u32, height: u32, target_w: u32, target_h: u32) -> ((u32, u32), (u32, u32)) {
    let scale = (f64::from(target_w) / f64::from(width)).min(f64::from(target_h) / f64::from(height));
    let new_w = (f64::from(width) * scale) as u32;
    let new_h = (f64::from(height) * scale) as u32;
    (
        (new_w, new_h),
        (target_w.saturating_sub(new_w) / 2, target_h.saturating_sub(new_h) / 2),
    )
}

weft_sdk::node! {
    /// Resizes images to fit inside the target size, keeping their aspect ratio, and pads
    /// the rest with white or black.
    pub struct ResizeAndPadImage {
        category: "image/transform",
        inputs {
            image: Image = input::image(),
            target_width: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            target_height: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            padding_color: String = input::combo(["white", "black"]),
            interpolation: String =
                input::combo(["area", "bicubic", "nearest-exact", "bilinear", "lanczos"]),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let (tw, th) = (inp.target_width, inp.target_height);
            let ((w, h), (x, y)) = fit_inside(inp.image.width(), inp.image.height(), tw, th);
            if w == 0 || h == 0 {
                return Err(NodeError::invalid_input("the resized image would be empty"));
            }
            let resized = images::scale(&inp.image, &inp.interpolation, w, h, "disabled")?;
            let color = if inp.padding_color == "black" { 0 } else { 0xFF_FFFF };
            let canvas = images::empty(tw, th, inp.image.batch_size(), color)?;
            Ok((images::composite(&canvas, &resized, x, y, false, None)?,))
        }
    }
}

weft_sdk::node! {
    /// Returns width and height of the image, and passes it through unchanged.
    pub struct GetImageSize {
        display_name: "Get Image Size",
        category: "image",
        inputs {
            image: Image = input::image(),
        }
        outputs { width: u32, height: u32, batch_size: u32 }
        fn execute(_, inp) {
            Ok((inp.image.width(), inp.image.height(), inp.image.batch_size()))
        }
    }
}
