//! ComfyUI's `MODEL` -> `MODEL` patch nodes (`ModelSamplingDiscrete`,
//! `ModelSamplingContinuousEDM`, `RescaleCFG`): their settings checked and applied to a
//! [`DiffusionModel`]. Bad settings are `invalid_input` node errors.

use weft_compute::diffusion::DiffusionModel;
use weft_compute::sampling::{DiscreteSampling, EdmSampling, UnknownSampling};
use weft_types::NodeErrorCode;

use super::{compute_error, node_error};
use crate::runtime::bindings::v0_2::wit::NodeError;

fn unknown(e: UnknownSampling) -> NodeError {
    node_error(NodeErrorCode::InvalidInput, e.to_string())
}

/// `ModelSamplingDiscrete`: `model` with `sampling`'s prediction, zero terminal SNR when `zsnr`.
pub(super) fn discrete(model: &DiffusionModel, sampling: &str, zsnr: bool) -> Result<DiffusionModel, NodeError> {
    let sampling: DiscreteSampling = sampling.parse().map_err(unknown)?;
    Ok(model.with_discrete_sampling(sampling, zsnr))
}

/// `ModelSamplingContinuousEDM`: `model` with continuous sigmas from `sigma_min` to
/// `sigma_max` and `sampling`'s prediction.
pub(super) fn continuous_edm(
    model: &DiffusionModel,
    sampling: &str,
    sigma_max: f64,
    sigma_min: f64,
) -> Result<DiffusionModel, NodeError> {
    let sampling: EdmSampling = sampling.parse().map_err(unknown)?;
    model
        .with_continuous_edm(sampling, sigma_min, sigma_max)
        .map_err(compute_error)
}

/// `RescaleCFG`: `model` guided with its spread rescaled by `multiplier`.
pub(super) fn rescale_cfg(model: &DiffusionModel, multiplier: f64) -> Result<DiffusionModel, NodeError> {
    model.with_cfg_rescale(multiplier).map_err(compute_error)
}
