//! The `weft:node@0.2.0` face of `images`: the 0.1.0 calls, plus `load-mask` and
//! ComfyUI's image nodes (`transform`, `blend`, `filter`, `concat`, `select`, `repeat`,
//! `composite`, `pad`, `from-mask`, `join-alpha`, `split-alpha`, `porter-duff`; `canny`,
//! `stitch` and `add-noise` are in `effects`).

use std::sync::Arc;

use wasmtime::component::Resource;

use weft_compute::image::{self as image_ops, MaskBatch};
use weft_types::NodeErrorCode;

use super::ops::{floats, image_values, ImageResult, PairResult};
use super::Ctx;
use crate::runtime::bindings::v0_1::weft::node as v1;
use crate::runtime::bindings::v0_2::weft::node as v2;
use crate::runtime::bindings::v0_2::wit::{AssetRef, NodeError};
use crate::runtime::memory::Held;
use crate::runtime::value::{ImageRes, MaskRes};
use v2::images::{BlendMode, Edges, FilterOp as Filter, PorterDuffMode, StitchOptions, TransformOp as Transform};

impl v2::images::Host for Ctx<'_> {
    fn empty(
        &mut self,
        width: u32,
        height: u32,
        batch_size: u32,
        color: u32,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        Ok(v1::images::Host::empty(self, width, height, batch_size, color)?.map_err(NodeError::from))
    }

    fn invert(&mut self, image: Resource<ImageRes>) -> wasmtime::Result<Resource<ImageRes>> {
        v1::images::Host::invert(self, image)
    }

    fn scale(
        &mut self,
        image: Resource<ImageRes>,
        method: String,
        width: u32,
        height: u32,
        crop: String,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        Ok(v1::images::Host::scale(self, image, method, width, height, crop)?.map_err(NodeError::from))
    }

    fn load(
        &mut self,
        asset_ref: AssetRef,
    ) -> wasmtime::Result<Result<(Resource<ImageRes>, Resource<MaskRes>), NodeError>> {
        Ok(v1::images::Host::load(self, asset_ref.into())?.map_err(NodeError::from))
    }

    fn load_mask(
        &mut self,
        asset_ref: AssetRef,
        channel: String,
    ) -> wasmtime::Result<Result<Resource<MaskRes>, NodeError>> {
        let index = match channel.as_str() {
            "red" => Some(0),
            "green" => Some(1),
            "blue" => Some(2),
            "alpha" => None,
            other => {
                return Ok(Err(NodeError {
                    code: NodeErrorCode::InvalidInput.into(),
                    message: format!("unknown channel {other:?}; expected alpha, red, green or blue"),
                }))
            }
        };
        let (image, mask) = match v1::images::Host::load(self, asset_ref.into())? {
            Ok(loaded) => loaded,
            Err(e) => return Ok(Err(e.into())),
        };
        let image = self.core.table.delete(image)?.0;
        let alpha = self.core.table.delete(mask)?.0;
        let mask = match index {
            None => alpha,
            Some(c) => {
                // The channel mask takes the place, and the charge, of the alpha mask.
                let charge = match Arc::try_unwrap(alpha) {
                    Ok(alpha) => alpha.into_charge(),
                    Err(_) => self
                        .core
                        .charge(image.data.len() as u64 / 3 * 4, || "a channel mask".into())?,
                };
                let data = image
                    .data
                    .chunks_exact(image.channels as usize)
                    .map(|pixel| pixel[c])
                    .collect();
                let mask = MaskBatch {
                    width: image.width,
                    height: image.height,
                    batch: image.batch,
                    data,
                };
                Arc::new(Held::new(mask, charge))
            }
        };
        Ok(Ok(self.core.table.push(MaskRes(mask))?))
    }

    fn transform(&mut self, image: Resource<ImageRes>, op: Transform) -> ImageResult {
        let source = self.image(&image)?;
        let values = match op {
            Transform::Crop(r) => {
                let (_, _, w, h) =
                    image_ops::transform::crop_area(source.width, source.height, (r.x, r.y, r.width, r.height));
                u64::from(w) * u64::from(h) * u64::from(source.batch) * u64::from(source.channels)
            }
            Transform::Rotate(2) => 2 * image_values(&source),
            _ => image_values(&source),
        };
        let charge = self.charge_for(floats(values), "a transformed image batch")?;
        let result = match op {
            Transform::Crop(r) => image_ops::transform::crop(&source, (r.x, r.y, r.width, r.height)),
            Transform::Flip(vertical) => image_ops::transform::flip(&source, vertical),
            Transform::Rotate(turns) => image_ops::transform::rotate(&source, turns),
        };
        self.finish_image(Ok(result), charge)
    }

    fn blend(
        &mut self,
        image1: Resource<ImageRes>,
        image2: Resource<ImageRes>,
        factor: f64,
        mode: BlendMode,
    ) -> ImageResult {
        let (a, b) = (self.image(&image1)?, self.image(&image2)?);
        let frame = u64::from(a.width) * u64::from(a.height) * u64::from(a.channels);
        let out = frame * u64::from(a.batch.max(b.batch));
        let resized = 2 * image_values(&b) + frame * u64::from(b.batch);
        let charge = self.charge_for(floats(out + resized), "a blended image batch")?;
        let mode = match mode {
            BlendMode::Normal => image_ops::blend::BlendMode::Normal,
            BlendMode::Multiply => image_ops::blend::BlendMode::Multiply,
            BlendMode::Screen => image_ops::blend::BlendMode::Screen,
            BlendMode::Overlay => image_ops::blend::BlendMode::Overlay,
            BlendMode::SoftLight => image_ops::blend::BlendMode::SoftLight,
            BlendMode::Difference => image_ops::blend::BlendMode::Difference,
        };
        let keep_going = self.keep_going();
        let result = image_ops::blend::blend(&a, &b, factor, mode, &keep_going);
        self.finish_image(result, charge)
    }

    fn filter(&mut self, image: Resource<ImageRes>, filter: Filter) -> ImageResult {
        let source = self.image(&image)?;
        let charge = self.charge_for(floats(image_values(&source)), "a filtered image batch")?;
        let keep_going = self.keep_going();
        let result = match filter {
            Filter::Blur((radius, sigma)) => image_ops::filter::blur(&source, radius, sigma, &keep_going),
            Filter::Sharpen((radius, sigma, alpha)) => {
                image_ops::filter::sharpen(&source, radius, sigma, alpha, &keep_going)
            }
        };
        self.finish_image(result, charge)
    }

    fn concat(&mut self, first: Resource<ImageRes>, second: Resource<ImageRes>) -> ImageResult {
        let (a, b) = (self.image(&first)?, self.image(&second)?);
        let frame = u64::from(a.width) * u64::from(a.height) * u64::from(a.channels);
        let out = frame * (u64::from(a.batch) + u64::from(b.batch));
        let resized = 2 * image_values(&b) + frame * u64::from(b.batch);
        let charge = self.charge_for(floats(out + resized), "a joined image batch")?;
        let keep_going = self.keep_going();
        let result = image_ops::transform::concat(&a, &b, &keep_going);
        self.finish_image(result, charge)
    }

    fn select(&mut self, image: Resource<ImageRes>, start: u32, length: u32) -> ImageResult {
        let source = self.image(&image)?;
        let (_, length) = image_ops::transform::select_range(source.batch, start, length);
        let values = image_values(&source) / u64::from(source.batch) * u64::from(length);
        let charge = self.charge_for(floats(values), "images taken from a batch")?;
        self.finish_image(Ok(image_ops::transform::select(&source, start, length)), charge)
    }

    fn repeat(&mut self, image: Resource<ImageRes>, amount: u32) -> ImageResult {
        let source = self.image(&image)?;
        let values = image_values(&source).saturating_mul(u64::from(amount));
        let charge = self.charge_for(floats(values), "a repeated image batch")?;
        self.finish_image(image_ops::transform::repeat(&source, amount), charge)
    }

    fn composite(
        &mut self,
        destination: Resource<ImageRes>,
        source: Resource<ImageRes>,
        x: u32,
        y: u32,
        resize_source: bool,
        mask: Option<Resource<MaskRes>>,
    ) -> ImageResult {
        let (dest, src) = (self.image(&destination)?, self.image(&source)?);
        let mask = mask.map(|m| self.mask(&m)).transpose()?;
        let out = image_values(&dest) / u64::from(dest.channels) * u64::from(dest.channels + 1);
        let (sw, sh) = if resize_source {
            (dest.width, dest.height)
        } else {
            (src.width, src.height)
        };
        let area = u64::from(sw) * u64::from(sh);
        let src_frame = area * u64::from(src.channels + 1);
        let working = image_values(&src) + src_frame * u64::from(src.batch) + src_frame * u64::from(dest.batch);
        let mask_values = mask.as_ref().map_or(0, |m| {
            m.data.len() as u64 + 2 * area * u64::from(m.batch.max(dest.batch))
        });
        let charge = self.charge_for(floats(out + working + mask_values), "a composited image batch")?;
        let keep_going = self.keep_going();
        let result = image_ops::composite::composite(
            &dest,
            &src,
            (x, y),
            resize_source,
            mask.as_ref().map(|m| &***m),
            &keep_going,
        );
        self.finish_image(result, charge)
    }

    fn pad(&mut self, image: Resource<ImageRes>, margins: Edges, feathering: u32) -> PairResult {
        let source = self.image(&image)?;
        let width = u64::from(source.width) + u64::from(margins.left) + u64::from(margins.right);
        let height = u64::from(source.height) + u64::from(margins.top) + u64::from(margins.bottom);
        let pixels = width * height;
        let values = pixels * u64::from(source.batch) * u64::from(source.channels) + pixels;
        let ramp = u64::from(source.width) * u64::from(source.height);
        let charge = self.charge_for(floats(values + ramp), "a padded image batch and its mask")?;
        let edges = [margins.left, margins.top, margins.right, margins.bottom];
        let keep_going = self.keep_going();
        let result = image_ops::composite::pad_for_outpaint(&source, edges, feathering, &keep_going);
        self.finish_pair(result, charge)
    }

    fn from_mask(&mut self, mask: Resource<MaskRes>) -> ImageResult {
        let source = self.mask(&mask)?;
        let charge = self.charge_for(floats(source.data.len() as u64 * 3), "an image of a mask")?;
        self.finish_image(Ok(image_ops::composite::from_mask(&source)), charge)
    }

    fn join_alpha(&mut self, image: Resource<ImageRes>, alpha: Resource<MaskRes>) -> ImageResult {
        let (source, mask) = (self.image(&image)?, self.mask(&alpha)?);
        let pixels = u64::from(source.width) * u64::from(source.height);
        let batch = u64::from(source.batch.min(mask.batch));
        let working = mask.data.len() as u64 + pixels * batch;
        let charge = self.charge_for(floats(pixels * batch * 4 + working), "an image with alpha")?;
        let keep_going = self.keep_going();
        self.finish_image(image_ops::alpha::join(&source, &mask, &keep_going), charge)
    }

    fn split_alpha(&mut self, image: Resource<ImageRes>) -> PairResult {
        let source = self.image(&image)?;
        let pixels = image_values(&source) / u64::from(source.channels);
        let charge = self.charge_for(floats(pixels * 4), "an image and its alpha mask")?;
        self.finish_pair(image_ops::alpha::split(&source), charge)
    }

    fn porter_duff(
        &mut self,
        source: Resource<ImageRes>,
        source_alpha: Resource<MaskRes>,
        destination: Resource<ImageRes>,
        destination_alpha: Resource<MaskRes>,
        mode: PorterDuffMode,
    ) -> PairResult {
        let (src, sa) = (self.image(&source)?, self.mask(&source_alpha)?);
        let (dst, da) = (self.image(&destination)?, self.mask(&destination_alpha)?);
        let batch = u64::from(src.batch.min(sa.batch).min(dst.batch).min(da.batch));
        let pixels = u64::from(dst.width) * u64::from(dst.height);
        let frame = pixels * u64::from(dst.channels);
        let src_frame = u64::from(src.width) * u64::from(src.height) * u64::from(src.channels);
        // The results, and one image's resized source and alphas with their copies.
        let working = 2 * (frame + src_frame) + 4 * pixels;
        let charge = self.charge_for(floats(batch * (frame + pixels) + working), "a Porter-Duff composite")?;
        let keep_going = self.keep_going();
        let result = image_ops::porter_duff::porter_duff((&src, &sa), (&dst, &da), porter_duff_mode(mode), &keep_going);
        self.finish_pair(result, charge)
    }

    fn canny(&mut self, image: Resource<ImageRes>, low_threshold: f64, high_threshold: f64) -> ImageResult {
        self.canny_edges(image, low_threshold, high_threshold)
    }

    fn stitch(
        &mut self,
        image1: Resource<ImageRes>,
        image2: Resource<ImageRes>,
        options: StitchOptions,
    ) -> ImageResult {
        self.stitch_images(image1, image2, options)
    }

    fn add_noise(&mut self, image: Resource<ImageRes>, seed: u64, strength: f64) -> ImageResult {
        self.noisy(image, seed, strength)
    }
}

/// The compute operator of a WIT Porter-Duff mode.
fn porter_duff_mode(mode: PorterDuffMode) -> image_ops::porter_duff::PorterDuff {
    use image_ops::porter_duff::PorterDuff as P;
    match mode {
        PorterDuffMode::Add => P::Add,
        PorterDuffMode::Clear => P::Clear,
        PorterDuffMode::Darken => P::Darken,
        PorterDuffMode::Dst => P::Dst,
        PorterDuffMode::DstAtop => P::DstAtop,
        PorterDuffMode::DstIn => P::DstIn,
        PorterDuffMode::DstOut => P::DstOut,
        PorterDuffMode::DstOver => P::DstOver,
        PorterDuffMode::Lighten => P::Lighten,
        PorterDuffMode::Multiply => P::Multiply,
        PorterDuffMode::Overlay => P::Overlay,
        PorterDuffMode::Screen => P::Screen,
        PorterDuffMode::Src => P::Src,
        PorterDuffMode::SrcAtop => P::SrcAtop,
        PorterDuffMode::SrcIn => P::SrcIn,
        PorterDuffMode::SrcOut => P::SrcOut,
        PorterDuffMode::SrcOver => P::SrcOver,
        PorterDuffMode::Xor => P::Xor,
    }
}
