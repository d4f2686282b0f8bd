//! `weft:node/images`: pixel work on host-held images.

mod v0_2_face;

use std::sync::Arc;

use wasmtime::component::{HasSelf, Linker, Resource};
use weft_compute::{self as compute, ComputeError};

use super::{CallState, Capabilities, Capability};
use crate::runtime::bindings::weft::node::images::{add_to_linker, Host};
use crate::runtime::bindings::wit::{AssetRef, NodeError};
use crate::runtime::call::{read_asset, AssetReader, CallContext};
use crate::runtime::limits::Limits;
use crate::runtime::value::{ImageRes, MaskRes};
use crate::runtime::worlds::v0_2;

/// The images capability.
pub struct Images;

/// Where a call's images are loaded from.
pub struct ImagesState {
    assets: Arc<dyn AssetReader>,
}

impl Capability for Images {
    type Config = ();
    type State = ImagesState;

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        add_to_linker::<_, HasSelf<CallState>>(linker, |s| s)?;
        v0_2::weft::node::images::add_to_linker::<_, HasSelf<CallState>>(linker, |s| s)
    }

    fn new_state(_: &(), _: &Limits, call: &CallContext, _: &Capabilities) -> ImagesState {
        ImagesState {
            assets: call.assets.clone(),
        }
    }
}

fn node_error(e: ComputeError) -> NodeError {
    NodeError {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

impl CallState {
    fn image(&self, handle: &Resource<ImageRes>) -> wasmtime::Result<Arc<compute::image::ImageBatch>> {
        Ok(self.table.get(handle)?.0.clone())
    }

    fn push_image(&mut self, image: compute::image::ImageBatch) -> wasmtime::Result<Resource<ImageRes>> {
        Ok(self.table.push(ImageRes(Arc::new(image)))?)
    }
}

impl Host for CallState {
    fn empty(
        &mut self,
        width: u32,
        height: u32,
        batch_size: u32,
        color: u32,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        match compute::image::empty(width, height, batch_size, color) {
            Ok(image) => Ok(Ok(self.push_image(image)?)),
            Err(e) => Ok(Err(node_error(e))),
        }
    }

    fn invert(&mut self, image: Resource<ImageRes>) -> wasmtime::Result<Resource<ImageRes>> {
        let source = self.image(&image)?;
        self.push_image(compute::image::invert(&source))
    }

    fn scale(
        &mut self,
        image: Resource<ImageRes>,
        method: String,
        width: u32,
        height: u32,
        crop: String,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        let source = self.image(&image)?;
        let method = match method.parse() {
            Ok(m) => m,
            Err(e) => return Ok(Err(node_error(e))),
        };
        let center = match crop.as_str() {
            "disabled" => false,
            "center" => true,
            other => {
                return Ok(Err(NodeError {
                    code: "invalid_input".into(),
                    message: format!("unknown crop {other:?}; expected disabled or center"),
                }))
            }
        };
        match compute::image::scale(&source, method, width, height, center) {
            Ok(scaled) => Ok(Ok(self.push_image(scaled)?)),
            Err(e) => Ok(Err(node_error(e))),
        }
    }

    fn load(
        &mut self,
        asset: AssetRef,
    ) -> wasmtime::Result<Result<(Resource<ImageRes>, Resource<MaskRes>), NodeError>> {
        let bytes = match read_asset(&*self.images.assets, asset) {
            Ok(bytes) => bytes,
            Err(e) => return Ok(Err(e)),
        };
        match compute::image::decode(&bytes) {
            Ok((image, mask)) => {
                let image = self.push_image(image)?;
                let mask = self.table.push(MaskRes(Arc::new(mask)))?;
                Ok(Ok((image, mask)))
            }
            Err(e) => Ok(Err(node_error(e))),
        }
    }
}
