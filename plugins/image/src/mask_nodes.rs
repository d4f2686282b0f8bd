//! ComfyUI's mask nodes (`comfy_extras/nodes_mask.py`), each one host call on handles.

use weft_sdk::prelude::*;

use crate::MAX_RESOLUTION;
use images::{Edges, Rect};
use masks::CompositeOp;

weft_sdk::node! {
    /// One mask of a single value.
    pub struct SolidMask {
        category: "mask",
        inputs {
            value: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
            width: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            height: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            Ok((masks::solid(inp.value, inp.width, inp.height)?,))
        }
    }
}

weft_sdk::node! {
    /// Every value `v` becomes `1 - v`.
    pub struct InvertMask {
        category: "mask",
        inputs {
            mask: Mask = input::mask(),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            Ok((masks::invert(&inp.mask)?,))
        }
    }
}

weft_sdk::node! {
    /// The part of each mask inside a rectangle.
    pub struct CropMask {
        category: "mask",
        inputs {
            mask: Mask = input::mask(),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            width: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
            height: u32 = input::uint().default(512).min(1).max(MAX_RESOLUTION).step(1),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            let area = Rect { x: inp.x, y: inp.y, width: inp.width, height: inp.height };
            Ok((masks::crop(&inp.mask, area)?,))
        }
    }
}

weft_sdk::node! {
    /// Combines a source mask placed at `x`, `y` into the destination.
    pub struct MaskComposite {
        category: "mask",
        inputs {
            destination: Mask = input::mask(),
            source: Mask = input::mask(),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            operation: String = input::combo(["multiply", "add", "subtract", "and", "or", "xor"]),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            let op = match inp.operation.as_str() {
                "multiply" => CompositeOp::Multiply,
                "add" => CompositeOp::Add,
                "subtract" => CompositeOp::Subtract,
                "and" => CompositeOp::And,
                "or" => CompositeOp::Or,
                "xor" => CompositeOp::Xor,
                other => return Err(NodeError::invalid_input(format!("unknown operation {other:?}"))),
            };
            Ok((masks::composite(&inp.destination, &inp.source, inp.x, inp.y, op)?,))
        }
    }
}

weft_sdk::node! {
    /// Fades each mask out linearly towards its edges.
    pub struct FeatherMask {
        category: "mask",
        inputs {
            mask: Mask = input::mask(),
            left: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            top: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            right: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
            bottom: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION).step(1),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            let widths = Edges { left: inp.left, top: inp.top, right: inp.right, bottom: inp.bottom };
            Ok((masks::feather(&inp.mask, widths)?,))
        }
    }
}

weft_sdk::node! {
    /// Grows (or, negative, shrinks) each mask by whole pixels.
    pub struct GrowMask {
        category: "mask",
        inputs {
            mask: Mask = input::mask(),
            expand: i64 = input::int()
                .default(0)
                .min(-i64::from(MAX_RESOLUTION))
                .max(i64::from(MAX_RESOLUTION))
                .step(1),
            tapered_corners: bool = input::boolean().default(true),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            let expand = i32::try_from(inp.expand)
                .map_err(|_| NodeError::invalid_input("expand is out of range"))?;
            Ok((masks::grow(&inp.mask, expand, inp.tapered_corners)?,))
        }
    }
}

weft_sdk::node! {
    /// 1 where the mask is above `value`, else 0.
    pub struct ThresholdMask {
        category: "mask",
        inputs {
            mask: Mask = input::mask(),
            value: f64 = input::float().default(0.5).min(0.0).max(1.0).step(0.01),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            Ok((masks::threshold(&inp.mask, inp.value)?,))
        }
    }
}

weft_sdk::node! {
    /// One channel of each image as a mask.
    pub struct ImageToMask {
        display_name: "Convert Image to Mask",
        category: "mask",
        inputs {
            image: Image = input::image(),
            channel: String = input::combo(["red", "green", "blue", "alpha"]),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            let channel = match inp.channel.as_str() {
                "red" => 0,
                "green" => 1,
                "blue" => 2,
                "alpha" => 3,
                other => return Err(NodeError::invalid_input(format!("unknown channel {other:?}"))),
            };
            Ok((masks::from_channel(&inp.image, channel)?,))
        }
    }
}

weft_sdk::node! {
    /// Each mask as a grey image.
    pub struct MaskToImage {
        display_name: "Convert Mask to Image",
        category: "mask",
        inputs {
            mask: Mask = input::mask(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::from_mask(&inp.mask)?,))
        }
    }
}

weft_sdk::node! {
    /// 1 where the image's 8-bit colour is `color` (0xRRGGBB), else 0.
    pub struct ImageColorToMask {
        category: "mask",
        inputs {
            image: Image = input::image(),
            color: u32 = input::uint().default(0).min(0).max(0xFF_FFFF).step(1),
        }
        outputs { MASK: Mask }
        fn execute(_, inp) {
            Ok((masks::from_color(&inp.image, inp.color)?,))
        }
    }
}

weft_sdk::node! {
    /// Adds a mask as the images' alpha channel (1 in the mask is transparent).
    pub struct JoinImageWithAlpha {
        display_name: "Join Image with Alpha",
        category: "mask/compositing",
        inputs {
            image: Image = input::image(),
            alpha: Mask = input::mask(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((images::join_alpha(&inp.image, &inp.alpha)?,))
        }
    }
}

weft_sdk::node! {
    /// Splits images into RGB and a mask of their transparency.
    pub struct SplitImageWithAlpha {
        display_name: "Split Image with Alpha",
        category: "mask/compositing",
        inputs {
            image: Image = input::image(),
        }
        outputs { IMAGE: Image, MASK: Mask }
        fn execute(_, inp) {
            images::split_alpha(&inp.image)
        }
    }
}

/// ComfyUI's Porter-Duff mode names, in its order, with the host's operators.
const PORTER_DUFF: [(&str, images::PorterDuffMode); 18] = {
    use images::PorterDuffMode as M;
    [
        ("ADD", M::Add),
        ("CLEAR", M::Clear),
        ("DARKEN", M::Darken),
        ("DST", M::Dst),
        ("DST_ATOP", M::DstAtop),
        ("DST_IN", M::DstIn),
        ("DST_OUT", M::DstOut),
        ("DST_OVER", M::DstOver),
        ("LIGHTEN", M::Lighten),
        ("MULTIPLY", M::Multiply),
        ("OVERLAY", M::Overlay),
        ("SCREEN", M::Screen),
        ("SRC", M::Src),
        ("SRC_ATOP", M::SrcAtop),
        ("SRC_IN", M::SrcIn),
        ("SRC_OUT", M::SrcOut),
        ("SRC_OVER", M::SrcOver),
        ("XOR", M::Xor),
    ]
};

weft_sdk::node! {
    /// Composites two images with alpha masks by a Porter-Duff operator.
    pub struct PorterDuffImageComposite {
        display_name: "Porter-Duff Image Composite",
        category: "mask/compositing",
        inputs {
            source: Image = input::image(),
            source_alpha: Mask = input::mask(),
            destination: Image = input::image(),
            destination_alpha: Mask = input::mask(),
            mode: String = input::combo(PORTER_DUFF.map(|(name, _)| name)).default("DST"),
        }
        outputs { IMAGE: Image, MASK: Mask }
        fn execute(_, inp) {
            let mode = PORTER_DUFF
                .iter()
                .find(|(name, _)| *name == inp.mode)
                .map(|(_, mode)| *mode)
                .ok_or_else(|| NodeError::invalid_input(format!("unknown mode {:?}", inp.mode)))?;
            let (source, destination) = ((&inp.source, &inp.source_alpha), (&inp.destination, &inp.destination_alpha));
            images::porter_duff(source.0, source.1, destination.0, destination.1, mode)
        }
    }
}
