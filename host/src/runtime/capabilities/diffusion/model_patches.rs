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

#[cfg(test)]
mod tests {
    use weft_compute::models::{ModelCache, ModelConfig};

    use super::*;

    fn tiny_model() -> (tempfile::TempDir, DiffusionModel) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.safetensors");
        weft_compute::models::write_random_checkpoint(&path, &ModelConfig::tiny(), 1).unwrap();
        let cache = ModelCache::new(u64::MAX, weft_compute::device::select_device());
        let models = weft_compute::diffusion::load_checkpoint(&cache, &path, "tiny.safetensors").unwrap();
        (dir, DiffusionModel::new(models, path))
    }

    fn code<T>(result: Result<T, NodeError>) -> String {
        result.err().map(|e| e.code).unwrap_or_default()
    }

    #[test]
    fn unknown_choices_and_bad_numbers_are_invalid_input_and_good_ones_patch() {
        let (_dir, model) = tiny_model();
        for sampling in ["eps", "v_prediction", "lcm", "x0", "img_to_img"] {
            let patched = discrete(&model, sampling, true).unwrap();
            assert_eq!(patched.model_sampling().sigma_max(), 4_518.763_7, "{sampling}");
        }
        for sampling in ["v_prediction", "edm", "edm_playground_v2.5", "eps"] {
            let patched = continuous_edm(&model, sampling, 120.0, 0.002).unwrap();
            assert!(
                (patched.model_sampling().sigma_max() - 120.0).abs() < 1e-4,
                "{sampling}"
            );
        }
        assert_eq!(code(discrete(&model, "cosmos_rflow", false)), "invalid_input");
        assert_eq!(code(continuous_edm(&model, "lcm", 120.0, 0.002)), "invalid_input");
        assert_eq!(code(continuous_edm(&model, "eps", f64::NAN, 0.002)), "invalid_input");
        assert_eq!(code(continuous_edm(&model, "eps", 120.0, -1.0)), "invalid_input");
        assert_eq!(code(rescale_cfg(&model, f64::NAN)), "invalid_input");
        assert_eq!(code(rescale_cfg(&model, 2.0)), "invalid_input");
        assert_eq!(rescale_cfg(&model, 0.7).unwrap().cfg_rescale(), Some(0.7));
    }
}
