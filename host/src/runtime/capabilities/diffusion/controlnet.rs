//! ComfyUI's ControlNet nodes (`ControlNetLoader`, `DiffControlNetLoader`, `ControlNetApply`,
//! `ControlNetApplyAdvanced`): `CONTROL_NET` handles over [`ControlNetFile`]s from the models
//! folder's `controlnet`, their weights charged to the job that loads them, and
//! conditioning with controls attached (the control image copied and charged with it).
//! Sampling runs the controls (see `weft_compute::diffusion::control`) and charges their
//! working memory with the UNet's.

use std::sync::Arc;

use wasmtime::component::Resource;
use weft_compute::diffusion::controlnet::{self as control, ControlSettings};
use weft_compute::diffusion::Conditioning;
use weft_compute::image::ImageBatch;
use weft_compute::models::controlnet::ControlNetFile;

use super::{compute_error, model_error, Ctx};
use crate::runtime::bindings::v0_2::wit::NodeError;
use crate::runtime::value::{HandleRes, ImageRes};

/// The type name of ControlNet handles.
const CONTROL_NET: &str = "CONTROL_NET";

/// A ControlNet and the control image a conditioning keeps.
type ControlInputs = (Arc<ControlNetFile>, Arc<ImageBatch>);

/// A positive and a negative conditioning.
type ConditioningPair = (Resource<HandleRes>, Resource<HandleRes>);

impl Ctx<'_> {
    /// `load-controlnet`: the file `name` of `controlnet`, as a `CONTROL_NET` whose
    /// weights are charged to the job.
    pub(super) fn controlnet(&mut self, name: String) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let path = match self.state.library.resolve("controlnet", &name) {
            Ok(path) => path,
            Err(e) => return Ok(Err(e)),
        };
        self.core.deadline.check()?;
        let device = weft_compute::device::select_device();
        let loaded = match control::load_controlnet(&path, &name, &device) {
            Ok(loaded) => loaded,
            Err(e) => return Ok(Err(model_error(e))),
        };
        let charge = self.core.charge(loaded.bytes, || format!("ControlNet {name}"))?;
        Ok(Ok(self.push_handle(CONTROL_NET, name, 1, Arc::new(loaded), charge)?))
    }

    /// The `CONTROL_NET` `handle` and a copy of `image` (which the conditioning keeps), or
    /// the node error for a handle of another type.
    fn control_inputs(
        &self,
        handle: &Resource<HandleRes>,
        image: &Resource<ImageRes>,
    ) -> wasmtime::Result<Result<ControlInputs, NodeError>> {
        let model = match self.payload::<ControlNetFile>(handle, CONTROL_NET)? {
            Ok(model) => model,
            Err(e) => return Ok(Err(e)),
        };
        let image: &ImageBatch = &self.core.table.get(image)?.0;
        Ok(Ok((model, Arc::new(image.clone()))))
    }

    /// `controlnet-apply-advanced`.
    pub(super) fn controlnet_advanced(
        &mut self,
        (positive, negative): ConditioningPair,
        control_net: Resource<HandleRes>,
        image: Resource<ImageRes>,
        settings: ControlSettings,
    ) -> wasmtime::Result<Result<ConditioningPair, NodeError>> {
        let positive = match self.payload::<Conditioning>(&positive, "CONDITIONING")? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let negative = match self.payload::<Conditioning>(&negative, "CONDITIONING")? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let (model, hint) = match self.control_inputs(&control_net, &image)? {
            Ok(inputs) => inputs,
            Err(e) => return Ok(Err(e)),
        };
        let hint_bytes = hint.data.len() as u64 * 4;
        let (positive, negative) = match control::apply_advanced((&positive, &negative), &model, &hint, settings) {
            Ok(both) => both,
            Err(e) => return Ok(Err(compute_error(e))),
        };
        let positive = self.push_conditioning_with(positive, hint_bytes)?;
        let negative = self.push_conditioning_with(negative, 0)?;
        Ok(Ok((positive, negative)))
    }

    /// `controlnet-apply`.
    pub(super) fn controlnet_simple(
        &mut self,
        conditioning: Resource<HandleRes>,
        control_net: Resource<HandleRes>,
        image: Resource<ImageRes>,
        strength: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let conditioning = match self.payload::<Conditioning>(&conditioning, "CONDITIONING")? {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let (model, hint) = match self.control_inputs(&control_net, &image)? {
            Ok(inputs) => inputs,
            Err(e) => return Ok(Err(e)),
        };
        let hint_bytes = hint.data.len() as u64 * 4;
        let applied = match control::apply_simple(&conditioning, &model, &hint, strength) {
            Ok(applied) => applied,
            Err(e) => return Ok(Err(compute_error(e))),
        };
        Ok(Ok(self.push_conditioning_with(applied, hint_bytes)?))
    }
}
