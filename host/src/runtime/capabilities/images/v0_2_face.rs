//! The `weft:node@0.2.0` face of `images`: the 0.1.0 calls, plus `load-mask`.

use std::sync::Arc;

use wasmtime::component::Resource;

use weft_compute::image::MaskBatch;
use weft_types::NodeErrorCode;

use super::Ctx;
use crate::runtime::bindings::v0_1::weft::node as v1;
use crate::runtime::bindings::v0_2::weft::node as v2;
use crate::runtime::bindings::v0_2::wit::{AssetRef, NodeError};
use crate::runtime::memory::Held;
use crate::runtime::value::{ImageRes, MaskRes};

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
}
