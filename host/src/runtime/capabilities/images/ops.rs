//! The shared plumbing of the 0.2.0 image and mask operations: reading handles, charging
//! each result before it is made, and turning the compute result into a handle or a node
//! error (an interruption ends the call as its deadline or cancel).

use std::sync::Arc;

use wasmtime::component::Resource;
use weft_compute::image::{ImageBatch, MaskBatch};
use weft_compute::ComputeError;

use super::Ctx;
use crate::runtime::bindings::v0_2::wit::NodeError;
use crate::runtime::call::Interrupt;
use crate::runtime::memory::{Charge, Held};
use crate::runtime::value::{ImageRes, MaskRes};

/// What an operation making an image returns to the guest.
pub(super) type ImageResult = wasmtime::Result<Result<Resource<ImageRes>, NodeError>>;
/// What an operation making a mask returns to the guest.
pub(super) type MaskResult = wasmtime::Result<Result<Resource<MaskRes>, NodeError>>;
/// What an operation making an image and a mask returns to the guest.
pub(super) type PairResult = wasmtime::Result<Result<(Resource<ImageRes>, Resource<MaskRes>), NodeError>>;

/// Bytes of `values` float32 values.
pub(super) fn floats(values: u64) -> u64 {
    values.saturating_mul(4)
}

/// Float values of an image batch.
pub(super) fn image_values(image: &ImageBatch) -> u64 {
    image.data.len() as u64
}

/// A compute failure as the guest's node error.
pub(super) fn guest_error(e: ComputeError) -> NodeError {
    NodeError {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

impl Ctx<'_> {
    /// The mask behind `handle`.
    pub(super) fn mask(&self, handle: &Resource<MaskRes>) -> wasmtime::Result<Arc<Held<MaskBatch>>> {
        Ok(self.core.table.get(handle)?.0.clone())
    }

    /// Reserves `bytes` of the job's host memory for `what`.
    pub(super) fn charge_for(&self, bytes: u64, what: &str) -> wasmtime::Result<Charge> {
        Ok(self.core.charge(bytes, || what.to_string())?)
    }

    /// A closure asking whether the call may go on (its deadline and cancel).
    pub(super) fn keep_going(&self) -> impl Fn() -> bool {
        let deadline = self.core.deadline.clone();
        move || deadline.check().is_ok()
    }

    /// The call's interruption as a trap, for a compute that stopped part way.
    fn interrupted(&self) -> wasmtime::Error {
        self.core.deadline.check().err().unwrap_or(Interrupt::Canceled).into()
    }

    /// `result` kept as a guest handle paid for by `charge`, or its error.
    pub(super) fn finish_image(&mut self, result: Result<ImageBatch, ComputeError>, mut charge: Charge) -> ImageResult {
        match result {
            Ok(image) => {
                charge.shrink_to(floats(image_values(&image)));
                Ok(Ok(self
                    .core
                    .table
                    .push(ImageRes(Arc::new(Held::new(image, charge))))?))
            }
            Err(ComputeError::Interrupted) => Err(self.interrupted()),
            Err(e) => Ok(Err(guest_error(e))),
        }
    }

    /// `result` kept as a guest handle paid for by `charge`, or its error.
    pub(super) fn finish_mask(&mut self, result: Result<MaskBatch, ComputeError>, mut charge: Charge) -> MaskResult {
        match result {
            Ok(mask) => {
                charge.shrink_to(floats(mask.data.len() as u64));
                Ok(Ok(self.core.table.push(MaskRes(Arc::new(Held::new(mask, charge))))?))
            }
            Err(ComputeError::Interrupted) => Err(self.interrupted()),
            Err(e) => Ok(Err(guest_error(e))),
        }
    }

    /// An image and a mask made together (`charge` paying for both), or their error.
    pub(super) fn finish_pair(
        &mut self,
        result: Result<(ImageBatch, MaskBatch), ComputeError>,
        mut charge: Charge,
    ) -> PairResult {
        match result {
            Ok((image, mask)) => {
                charge.shrink_to(floats(image_values(&image) + mask.data.len() as u64));
                let mask_charge = charge.split(floats(mask.data.len() as u64));
                let image = self.core.table.push(ImageRes(Arc::new(Held::new(image, charge))))?;
                let mask = self.core.table.push(MaskRes(Arc::new(Held::new(mask, mask_charge))))?;
                Ok(Ok((image, mask)))
            }
            Err(ComputeError::Interrupted) => Err(self.interrupted()),
            Err(e) => Ok(Err(guest_error(e))),
        }
    }
}
