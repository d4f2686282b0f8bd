//! ComfyUI's upscale models (`UpscaleModelLoader`, `ImageUpscaleWithModel`): `UPSCALE_MODEL`
//! handles over [`UpscaleModel`]s from the models folder's `upscale_models`, their weights
//! charged to the job that loads them; an upscale charges its working memory first, at the
//! largest tile (512, then 256, then 128 pixels) the job's budget holds, reports each tile
//! and stops between tiles (and inside the networks) on a cancel or the deadline.

use std::sync::Arc;

use wasmtime::component::Resource;
use weft_compute::image::ImageBatch;
use weft_compute::interrupt::Interrupt as Stop;
use weft_compute::upscale::{Tiling, UpscaleModel};

use super::{model_error, Ctx};
use crate::runtime::bindings::v0_2::wit::NodeError;
use crate::runtime::memory::{Charge, Held, MemoryLimit};
use crate::runtime::value::{HandleRes, ImageRes};

/// The type name of upscale-model handles.
const UPSCALE_MODEL: &str = "UPSCALE_MODEL";

/// The smallest tile tried before the job's memory is declared too small (ComfyUI gives up
/// below 128 too).
const MIN_TILE: usize = 128;

impl Ctx<'_> {
    /// `load-upscale-model`: the model file `model_name` of `upscale_models`, as an
    /// `UPSCALE_MODEL` whose weights are charged to the job.
    pub(super) fn upscale_model(
        &mut self,
        model_name: String,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let path = match self.state.library.resolve("upscale_models", &model_name) {
            Ok(path) => path,
            Err(e) => return Ok(Err(e)),
        };
        self.core.deadline.check()?;
        let model = match UpscaleModel::load(&path, &model_name) {
            Ok(model) => model,
            Err(e) => return Ok(Err(model_error(e))),
        };
        let charge = self.core.charge(model.weight_bytes(), || {
            format!("upscale model {model_name} ({} weights)", model.architecture())
        })?;
        let len = model.scale() as u32;
        Ok(Ok(self.push_handle(
            UPSCALE_MODEL,
            model_name,
            len,
            Arc::new(model),
            charge,
        )?))
    }

    /// `upscale-image`: `image` upscaled by the `UPSCALE_MODEL` `model`.
    pub(super) fn upscale(
        &mut self,
        model: Resource<HandleRes>,
        image: Resource<ImageRes>,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        let model = match self.payload::<UpscaleModel>(&model, UPSCALE_MODEL)? {
            Ok(model) => model,
            Err(e) => return Ok(Err(e)),
        };
        let image = self.core.table.get(&image)?.0.clone();
        let (tiling, mut charge) = self.charge_upscale(&model, &image)?;
        self.core.deadline.check()?;
        let stop = self.stop_question();
        let progress = self.state.progress.clone();
        let upscaled = weft_compute::on_workers(|| {
            let on_tile = &mut |done: usize, total: usize| progress.report(done as u32, total as u32, None);
            model.upscale(&image, tiling, on_tile, Stop::new(&stop))
        });
        let upscaled = match self.computed(upscaled)? {
            Ok(upscaled) => upscaled,
            Err(e) => return Ok(Err(e)),
        };
        self.core.deadline.check()?;
        charge.shrink_to(upscaled.data.len() as u64 * 4);
        Ok(Ok(self
            .core
            .table
            .push(ImageRes(Arc::new(Held::new(upscaled, charge))))?))
    }

    /// Charges an upscale of `image` with ComfyUI's tiling, halving the tile while the
    /// job's memory would not hold it (as ComfyUI halves it on running out of memory);
    /// below [`MIN_TILE`] the last refusal traps the call as `node_memory_limit`.
    fn charge_upscale(&self, model: &UpscaleModel, image: &ImageBatch) -> Result<(Tiling, Charge), MemoryLimit> {
        let (w, h, b) = (image.width as usize, image.height as usize, image.batch as usize);
        let mut tiling = Tiling::COMFYUI;
        loop {
            let bytes = model.working_bytes((w, h), b, tiling);
            let what = || {
                format!(
                    "upscaling {b} image(s) of {w}x{h} {}x in tiles of {} pixels",
                    model.scale(),
                    tiling.tile
                )
            };
            match self.core.charge(bytes, what) {
                Ok(charge) => return Ok((tiling, charge)),
                Err(refused) if tiling.tile / 2 < MIN_TILE => return Err(refused),
                Err(_) => tiling.tile /= 2,
            }
        }
    }
}
