//! weft's built-in image nodes. Pixels never enter the plugin: every node only
//! orchestrates the host's `images` functions on image handles.
//!
//! Class names, inputs, defaults and categories follow ComfyUI's `nodes.py`.

use weft_sdk::prelude::*;

mod animated;
mod effect_nodes;
mod image_nodes;
mod mask_nodes;

use animated::*;
use effect_nodes::*;
use image_nodes::*;
use mask_nodes::*;

/// ComfyUI's `MAX_RESOLUTION`.
pub(crate) const MAX_RESOLUTION: u32 = 16384;

weft_sdk::node! {
    /// A batch of images filled with one colour (0xRRGGBB).
    pub struct EmptyImage {
        category: "image",
        inputs {
            width: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            height: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            batch_size: u32 = input::uint().default(1).min(1).max(4096),
            color: u32 = input::uint().default(0).min(0).max(0xFF_FFFF).step(1),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let image = images::empty(inp.width, inp.height, inp.batch_size, inp.color)?;
            Ok((image,))
        }
    }
}

weft_sdk::node! {
    /// Inverts every channel value `v` to `1 - v`.
    pub struct ImageInvert {
        display_name: "Invert Image",
        category: "image",
        inputs {
            image: Image = input::image(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::invert(&inp.image),))
        }
    }
}

weft_sdk::node! {
    /// Resizes images; a zero width or height keeps the aspect ratio.
    pub struct ImageScale {
        display_name: "Upscale Image",
        category: "image/upscaling",
        inputs {
            image: Image = input::image(),
            upscale_method: String =
                input::combo(["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]),
            width: u32 = input::uint().default(512).min(0).max(MAX_RESOLUTION).step(1),
            height: u32 = input::uint().default(512).min(0).max(MAX_RESOLUTION).step(1),
            crop: String = input::combo(["disabled", "center"]),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let image = images::scale(&inp.image, &inp.upscale_method, inp.width, inp.height, &inp.crop)?;
            Ok((image,))
        }
    }
}

weft_sdk::node! {
    /// Loads an uploaded image: its RGB pixels, and a mask from its alpha channel.
    pub struct LoadImage {
        display_name: "Load Image",
        category: "image",
        inputs {
            image: AssetRef = input::asset(),
        }
        outputs { IMAGE: Image, MASK: Mask }
        fn execute(_, inp) {
            let (image, mask) = images::load(&inp.image)?;
            Ok((image, mask))
        }
    }
}

weft_sdk::node! {
    /// Saves the input images to your ComfyUI output directory.
    pub struct SaveImage {
        display_name: "Save Image",
        category: "image",
        output_node: true,
        inputs {
            images: Image = input::image().tooltip("The images to save."),
            filename_prefix: String = input::string().default("ComfyUI").tooltip(
                "The prefix for the file to save. This may include formatting information \
                 such as %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values \
                 from nodes.",
            ),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_png(inp.filename_prefix, inp.images);
            Ok(())
        }
    }
}

weft_sdk::node! {
    /// Resizes images by a factor.
    pub struct ImageScaleBy {
        display_name: "Upscale Image By",
        category: "image/upscaling",
        inputs {
            image: Image = input::image(),
            upscale_method: String =
                input::combo(["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]),
            scale_by: f64 = input::float().default(1.0).min(0.01).max(8.0).step(0.01),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            let side = |pixels: u32| ((f64::from(pixels) * inp.scale_by).round() as u32).max(1);
            let (width, height) = (side(inp.image.width()), side(inp.image.height()));
            let image = images::scale(&inp.image, &inp.upscale_method, width, height, "disabled")?;
            Ok((image,))
        }
    }
}

weft_sdk::node! {
    /// Loads an uploaded image as a mask from one of its channels (alpha: 1 where transparent).
    pub struct LoadImageMask {
        display_name: "Load Image (as Mask)",
        category: "mask",
        inputs {
            image: AssetRef = input::asset(),
            channel: String = input::combo(["alpha", "red", "green", "blue"]),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            Ok((images::load_mask(&inp.image, &inp.channel)?,))
        }
    }
}

weft_sdk::node! {
    /// Shows the images: temporary outputs named `ComfyUI_temp`, dropped after the server's
    /// preview retention.
    pub struct PreviewImage {
        display_name: "Preview Image",
        category: "image",
        output_node: true,
        inputs {
            images: Image = input::image(),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.preview_png("ComfyUI_temp", inp.images);
            Ok(())
        }
    }
}

weft_sdk::export_plugin!(
    EmptyImage,
    ImageInvert,
    ImageScale,
    ImageScaleBy,
    LoadImage,
    LoadImageMask,
    SaveImage,
    PreviewImage,
    SaveAnimatedPNG,
    ImageCrop,
    ImageFlip,
    ImageRotate,
    ImageBlend,
    ImageBlur,
    ImageSharpen,
    ImageBatch,
    ImageFromBatch,
    RepeatImageBatch,
    ImageCompositeMasked,
    ImagePadForOutpaint,
    ImageScaleToTotalPixels,
    ImageScaleToMaxDimension,
    ResizeAndPadImage,
    GetImageSize,
    SolidMask,
    InvertMask,
    CropMask,
    MaskComposite,
    FeatherMask,
    GrowMask,
    ThresholdMask,
    ImageToMask,
    MaskToImage,
    ImageColorToMask,
    JoinImageWithAlpha,
    SplitImageWithAlpha,
    PorterDuffImageComposite,
    Canny,
    ImageStitch,
    ImageAddNoise
);
