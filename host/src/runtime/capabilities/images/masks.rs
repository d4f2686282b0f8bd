//! `weft:node/masks` (0.2.0): ComfyUI's mask nodes on host-held masks.

use wasmtime::component::Resource;
use weft_compute::mask as ops;

use super::ops::{floats, MaskResult};
use super::Ctx;
use crate::runtime::bindings::v0_2::weft::node::images::{Edges, Rect};
use crate::runtime::bindings::v0_2::weft::node::masks::{CompositeOp, Host};
use crate::runtime::value::{ImageRes, MaskRes};

impl Host for Ctx<'_> {
    fn solid(&mut self, value: f64, width: u32, height: u32) -> MaskResult {
        let charge = self.charge_for(floats(u64::from(width) * u64::from(height)), "a solid mask")?;
        self.finish_mask(ops::solid(value, width, height), charge)
    }

    fn invert(&mut self, mask: Resource<MaskRes>) -> MaskResult {
        let source = self.mask(&mask)?;
        let charge = self.charge_for(floats(source.data.len() as u64), "an inverted mask")?;
        self.finish_mask(Ok(ops::invert(&source)), charge)
    }

    fn crop(&mut self, mask: Resource<MaskRes>, area: Rect) -> MaskResult {
        let source = self.mask(&mask)?;
        let charge = self.charge_for(floats(source.data.len() as u64), "a cropped mask")?;
        let result = ops::crop(&source, (area.x, area.y, area.width, area.height));
        self.finish_mask(result, charge)
    }

    fn composite(
        &mut self,
        destination: Resource<MaskRes>,
        source: Resource<MaskRes>,
        x: u32,
        y: u32,
        op: CompositeOp,
    ) -> MaskResult {
        let (dest, src) = (self.mask(&destination)?, self.mask(&source)?);
        let charge = self.charge_for(floats(dest.data.len() as u64), "a composited mask")?;
        let op = match op {
            CompositeOp::Multiply => ops::CompositeOp::Multiply,
            CompositeOp::Add => ops::CompositeOp::Add,
            CompositeOp::Subtract => ops::CompositeOp::Subtract,
            CompositeOp::And => ops::CompositeOp::And,
            CompositeOp::Or => ops::CompositeOp::Or,
            CompositeOp::Xor => ops::CompositeOp::Xor,
        };
        self.finish_mask(ops::composite(&dest, &src, (x, y), op), charge)
    }

    fn feather(&mut self, mask: Resource<MaskRes>, widths: Edges) -> MaskResult {
        let source = self.mask(&mask)?;
        let charge = self.charge_for(floats(source.data.len() as u64), "a feathered mask")?;
        let edges = [widths.left, widths.top, widths.right, widths.bottom];
        self.finish_mask(Ok(ops::feather(&source, edges)), charge)
    }

    fn grow(&mut self, mask: Resource<MaskRes>, expand: i32, tapered: bool) -> MaskResult {
        let source = self.mask(&mask)?;
        let scratch = u64::from(source.width) * u64::from(source.height);
        let charge = self.charge_for(floats(source.data.len() as u64 + scratch), "a grown mask")?;
        let keep_going = self.keep_going();
        self.finish_mask(ops::grow(&source, expand, tapered, &keep_going), charge)
    }

    fn threshold(&mut self, mask: Resource<MaskRes>, value: f64) -> MaskResult {
        let source = self.mask(&mask)?;
        let charge = self.charge_for(floats(source.data.len() as u64), "a thresholded mask")?;
        self.finish_mask(Ok(ops::threshold(&source, value)), charge)
    }

    fn from_channel(&mut self, image: Resource<ImageRes>, channel: u32) -> MaskResult {
        let source = self.image(&image)?;
        let charge = self.charge_for(floats(source.data.len() as u64 / 3), "a mask of an image channel")?;
        self.finish_mask(ops::from_channel(&source, channel), charge)
    }

    fn from_color(&mut self, image: Resource<ImageRes>, color: u32) -> MaskResult {
        let source = self.image(&image)?;
        let charge = self.charge_for(floats(source.data.len() as u64 / 3), "a mask of an image colour")?;
        self.finish_mask(ops::from_color(&source, color), charge)
    }
}
