//! ComfyUI's model patch nodes (`comfy_extras/nodes_model_advanced.py`): another model
//! sampling (`ModelSamplingDiscrete`, `ModelSamplingContinuousEDM`) and `RescaleCFG`.

use weft_sdk::prelude::*;

/// `ModelSamplingDiscrete`'s `sampling` choices, in ComfyUI's order.
pub const DISCRETE_SAMPLINGS: [&str; 5] = ["eps", "v_prediction", "lcm", "x0", "img_to_img"];

/// `ModelSamplingContinuousEDM`'s `sampling` choices weft runs, in ComfyUI's order
/// (ComfyUI's `cosmos_rflow` is for Cosmos models, which weft does not load).
pub const EDM_SAMPLINGS: [&str; 4] = ["v_prediction", "edm", "edm_playground_v2.5", "eps"];

weft_sdk::node! {
    /// Samples the model with another prediction type over the discrete schedule, optionally rescaled to zero terminal SNR.
    pub struct ModelSamplingDiscrete {
        category: "advanced/model",
        inputs {
            model: Model = input::model(),
            sampling: String = input::combo(DISCRETE_SAMPLINGS),
            zsnr: bool = input::boolean().default(false),
        }
        outputs { MODEL: Model }
        fn execute(_, inp) {
            Ok((Model(diffusion::model_sampling_discrete(inp.model.handle(), &inp.sampling, inp.zsnr)?),))
        }
    }
}

weft_sdk::node! {
    /// Samples the model over continuous sigmas from sigma_min to sigma_max (EDM) with the given prediction type.
    pub struct ModelSamplingContinuousEDM {
        category: "advanced/model",
        inputs {
            model: Model = input::model(),
            sampling: String = input::combo(EDM_SAMPLINGS),
            sigma_max: f64 = input::float().default(120.0).min(0.0).max(1000.0).step(0.001),
            sigma_min: f64 = input::float().default(0.002).min(0.0).max(1000.0).step(0.001),
        }
        outputs { MODEL: Model }
        fn execute(_, inp) {
            let model = diffusion::model_sampling_continuous_edm(
                inp.model.handle(),
                &inp.sampling,
                inp.sigma_max,
                inp.sigma_min,
            )?;
            Ok((Model(model),))
        }
    }
}

weft_sdk::node! {
    /// Rescales classifier-free guidance to the conditional prediction's spread, against over-exposure at high guidance.
    pub struct RescaleCFG {
        category: "advanced/model",
        inputs {
            model: Model = input::model(),
            multiplier: f64 = input::float().default(0.7).min(0.0).max(1.0).step(0.01),
        }
        outputs { MODEL: Model }
        fn execute(_, inp) {
            Ok((Model(diffusion::rescale_cfg(inp.model.handle(), inp.multiplier)?),))
        }
    }
}
