//! ControlNets (ComfyUI's `ControlNetLoader`, `DiffControlNetLoader`, `ControlNetApply` and
//! `ControlNetApplyAdvanced`): the network runs on the host when sampling.

use weft_sdk::prelude::*;

weft_sdk::node! {
    /// Loads a ControlNet (SD1.x or SDXL; original or diffusers layout) from the `controlnet` folder.
    pub struct ControlNetLoader {
        display_name: "Load ControlNet Model",
        category: "loaders",
        inputs {
            control_net_name: String = input::model_file("controlnet"),
        }
        outputs { CONTROL_NET: ControlNet }
        fn execute(_, inp) {
            Ok((ControlNet(diffusion::load_controlnet(&inp.control_net_name)?),))
        }
    }
}

weft_sdk::node! {
    /// Loads a ControlNet for a model. Difference ControlNets (weights relative to the model's) are refused.
    pub struct DiffControlNetLoader {
        display_name: "Load ControlNet Model (diff)",
        category: "loaders",
        inputs {
            model: Model = input::model(),
            control_net_name: String = input::model_file("controlnet"),
        }
        outputs { CONTROL_NET: ControlNet }
        fn execute(_, inp) {
            let _ = &inp.model;
            Ok((ControlNet(diffusion::load_controlnet(&inp.control_net_name)?),))
        }
    }
}

weft_sdk::node! {
    /// Applies a ControlNet to every entry of a conditioning (ComfyUI's older node; sampling gives it to the negative prompt too).
    pub struct ControlNetApply {
        display_name: "Apply ControlNet (OLD)",
        category: "conditioning/controlnet",
        inputs {
            conditioning: Conditioning = input::conditioning(),
            control_net: ControlNet = input::control_net(),
            image: Image = input::image(),
            strength: f64 = input::float().default(1.0).min(0.0).max(10.0).step(0.01),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            if inp.strength == 0.0 {
                return Ok((inp.conditioning,));
            }
            let applied = diffusion::controlnet_apply(inp.conditioning.handle(), inp.control_net.handle(), &inp.image, inp.strength)?;
            Ok((Conditioning(applied),))
        }
    }
}

weft_sdk::node! {
    /// Applies a ControlNet to the positive and negative conditioning over part of sampling.
    pub struct ControlNetApplyAdvanced {
        display_name: "Apply ControlNet",
        category: "conditioning/controlnet",
        inputs {
            positive: Conditioning = input::conditioning(),
            negative: Conditioning = input::conditioning(),
            control_net: ControlNet = input::control_net(),
            image: Image = input::image(),
            strength: f64 = input::float().default(1.0).min(0.0).max(10.0).step(0.01),
            start_percent: f64 = input::float().default(0.0).min(0.0).max(1.0).step(0.001),
            end_percent: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.001),
            vae: Option<Vae> = input::vae(),
        }
        outputs { positive: Conditioning, negative: Conditioning }
        fn execute(_, inp) {
            // The VAE is read only by ControlNets that encode their hint (not SD1.x or SDXL ones).
            let _ = &inp.vae;
            if inp.strength == 0.0 {
                return Ok((inp.positive, inp.negative));
            }
            let (positive, negative) = diffusion::controlnet_apply_advanced(
                inp.positive.handle(),
                inp.negative.handle(),
                inp.control_net.handle(),
                &inp.image,
                inp.strength,
                inp.start_percent,
                inp.end_percent,
            )?;
            Ok((Conditioning(positive), Conditioning(negative)))
        }
    }
}
