//! `weft:node/images` and `weft:node/masks`: pixel work on host-held images and masks.

mod effects;
mod masks;
mod ops;
mod v0_2_face;

use std::sync::Arc;

use wasmtime::component::{Linker, Resource};
use weft_compute::{self as compute, ComputeError};
use weft_types::NodeErrorCode;

use super::{own, CallState, Capabilities, Capability, CapabilityCtx, Own};
use crate::runtime::bindings::v0_1::weft::node::images::{add_to_linker, Host};
use crate::runtime::bindings::v0_1::wit::{AssetRef, NodeError};
use crate::runtime::bindings::v0_2;
use crate::runtime::call::{read_asset, AssetReader, CallContext, Interrupt};
use crate::runtime::limits::Limits;
use crate::runtime::memory::{Charge, Held};
use crate::runtime::value::{ImageRes, MaskRes};

/// What this capability's host functions see: the core and its own state.
type Ctx<'a> = CapabilityCtx<'a, ImagesState>;

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
        add_to_linker::<_, Own<Self>>(linker, own::<Self>)?;
        v0_2::weft::node::images::add_to_linker::<_, Own<Self>>(linker, own::<Self>)?;
        v0_2::weft::node::masks::add_to_linker::<_, Own<Self>>(linker, own::<Self>)
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

/// Bytes of an image batch of `batch` images of `width` x `height`, three float channels.
fn image_bytes(width: u32, height: u32, batch: u32) -> u64 {
    u64::from(width) * u64::from(height) * u64::from(batch) * 3 * 4
}

impl Ctx<'_> {
    fn image(&self, handle: &Resource<ImageRes>) -> wasmtime::Result<Arc<Held<compute::image::ImageBatch>>> {
        Ok(self.core.table.get(handle)?.0.clone())
    }

    /// Charges a new image batch of `width` x `height` x `batch` before it is made.
    fn charge_image(&self, width: u32, height: u32, batch: u32) -> Result<Charge, crate::runtime::MemoryLimit> {
        self.core.charge(image_bytes(width, height, batch), || {
            format!("a {width}x{height} image batch of {batch}")
        })
    }

    /// Keeps `image`, paid for by `charge` (trimmed to its real size), as a guest handle.
    fn push_image(
        &mut self,
        image: compute::image::ImageBatch,
        mut charge: Charge,
    ) -> wasmtime::Result<Resource<ImageRes>> {
        charge.shrink_to(image.data.len() as u64 * 4);
        Ok(self.core.table.push(ImageRes(Arc::new(Held::new(image, charge))))?)
    }
}

impl Host for Ctx<'_> {
    fn empty(
        &mut self,
        width: u32,
        height: u32,
        batch_size: u32,
        color: u32,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        let charge = self.charge_image(width, height, batch_size)?;
        match compute::image::empty(width, height, batch_size, color) {
            Ok(image) => Ok(Ok(self.push_image(image, charge)?)),
            Err(e) => Ok(Err(node_error(e))),
        }
    }

    fn invert(&mut self, image: Resource<ImageRes>) -> wasmtime::Result<Resource<ImageRes>> {
        let source = self.image(&image)?;
        let charge = self.charge_image(source.width, source.height, source.batch)?;
        self.push_image(compute::image::invert(&source), charge)
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
                    code: NodeErrorCode::InvalidInput.into(),
                    message: format!("unknown crop {other:?}; expected disabled or center"),
                }))
            }
        };
        let (to_width, to_height) = compute::image::scaled_size(&source, width, height);
        let charge = self
            .core
            .charge(compute::image::scale_peak_bytes(&source, width, height, center), || {
                format!(
                    "scaling a {}x{} image batch of {} to {to_width}x{to_height}",
                    source.width, source.height, source.batch
                )
            })?;
        let deadline = self.core.deadline.clone();
        let keep_going = || deadline.check().is_ok();
        match compute::image::scale(&source, method, width, height, center, &keep_going) {
            Ok(Some(scaled)) => Ok(Ok(self.push_image(scaled, charge)?)),
            Ok(None) => Err(self.core.deadline.check().err().unwrap_or(Interrupt::Canceled).into()),
            Err(e) => Ok(Err(node_error(e))),
        }
    }

    fn load(
        &mut self,
        asset: AssetRef,
    ) -> wasmtime::Result<Result<(Resource<ImageRes>, Resource<MaskRes>), NodeError>> {
        let bytes = match read_asset(&*self.state.assets, asset) {
            Ok(bytes) => bytes,
            Err(e) => return Ok(Err(e)),
        };
        let peak = match compute::image::decode_peak_bytes(&bytes) {
            Ok(peak) => peak,
            Err(e) => return Ok(Err(node_error(e))),
        };
        let mut charge = self.core.charge(peak, || {
            format!("decoding a {} KiB image file", bytes.len().div_ceil(1024))
        })?;
        self.core.deadline.check()?;
        let deadline = self.core.deadline.clone();
        let keep_going = || deadline.check().is_ok();
        match compute::image::decode_interruptible(&bytes, peak, &keep_going) {
            Ok(None) => Err(self.core.deadline.check().err().unwrap_or(Interrupt::Canceled).into()),
            Ok(Some((image, mask))) => {
                let mask_charge = charge.split(mask.data.len() as u64 * 4);
                let image = self.push_image(image, charge)?;
                let mask = self.core.table.push(MaskRes(Arc::new(Held::new(mask, mask_charge))))?;
                Ok(Ok((image, mask)))
            }
            Err(e) => Ok(Err(node_error(e))),
        }
    }
}
