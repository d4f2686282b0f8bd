//! Upscale models (ComfyUI's `comfy_extras/nodes_upscale_model.py`): the network runs on
//! the host, tiled as ComfyUI tiles it.

use weft_sdk::prelude::*;

weft_sdk::node! {
    /// Loads an image upscale model (ESRGAN, Real-ESRGAN, Real-ESRGAN Compact) from the `upscale_models` folder.
    pub struct UpscaleModelLoader {
        display_name: "Load Upscale Model",
        category: "loaders",
        inputs {
            model_name: String = input::model_file("upscale_models"),
        }
        outputs { UPSCALE_MODEL: UpscaleModel }
        fn execute(_, inp) {
            Ok((UpscaleModel(diffusion::load_upscale_model(&inp.model_name)?),))
        }
    }
}

weft_sdk::node! {
    /// Upscales images with an upscale model, in 512-pixel tiles overlapping by 32.
    pub struct ImageUpscaleWithModel {
        display_name: "Upscale Image (using Model)",
        category: "image/upscaling",
        inputs {
            upscale_model: UpscaleModel = input::upscale_model(),
            image: Image = input::image(),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((diffusion::upscale_image(inp.upscale_model.handle(), &inp.image)?,))
        }
    }
}
