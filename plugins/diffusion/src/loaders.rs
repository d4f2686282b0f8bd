//! Loaders: checkpoints, UNets and text encoders in files of their own, standalone VAEs and
//! LoRAs from the models folder.

use weft_sdk::prelude::*;

weft_sdk::node! {
    /// Loads a diffusion model checkpoint, diffusion models are used to denoise latents.
    pub struct CheckpointLoaderSimple {
        display_name: "Load Checkpoint",
        category: "loaders",
        inputs {
            ckpt_name: String = input::model_file("checkpoints")
                .tooltip("The name of the checkpoint (model) to load."),
        }
        outputs { MODEL: Model, CLIP: Clip, VAE: Vae }
        fn execute(_, inp) {
            let checkpoint = diffusion::load_checkpoint(&inp.ckpt_name)?;
            Ok((Model(checkpoint.model), Clip(checkpoint.clip), Vae(checkpoint.vae)))
        }
    }
}

weft_sdk::node! {
    /// Loads an image autoencoder from the `vae` models folder.
    pub struct VAELoader {
        display_name: "Load VAE",
        category: "loaders",
        inputs {
            vae_name: String = input::model_file("vae"),
        }
        outputs { VAE: Vae }
        fn execute(_, inp) {
            Ok((Vae(diffusion::load_vae(&inp.vae_name)?),))
        }
    }
}

weft_sdk::node! {
    /// LoRAs are used to modify diffusion and CLIP models, altering the way in which latents are denoised such as applying styles. Multiple LoRA nodes can be linked together.
    pub struct LoraLoader {
        display_name: "Load LoRA",
        category: "loaders",
        inputs {
            model: Model = input::model().tooltip("The diffusion model the LoRA will be applied to."),
            clip: Clip = input::clip().tooltip("The CLIP model the LoRA will be applied to."),
            lora_name: String = input::model_file("loras").tooltip("The name of the LoRA."),
            strength_model: f64 = input::float().default(1.0).min(-100.0).max(100.0).step(0.01)
                .tooltip("How strongly to modify the diffusion model. This value can be negative."),
            strength_clip: f64 = input::float().default(1.0).min(-100.0).max(100.0).step(0.01)
                .tooltip("How strongly to modify the CLIP model. This value can be negative."),
        }
        outputs { MODEL: Model, CLIP: Clip }
        fn execute(_, inp) {
            if inp.strength_model == 0.0 && inp.strength_clip == 0.0 {
                return Ok((inp.model, inp.clip));
            }
            let (model, clip) = diffusion::load_lora(
                inp.model.handle(),
                Some(inp.clip.handle()),
                &inp.lora_name,
                inp.strength_model,
                inp.strength_clip,
            )?;
            let clip = clip.map(Clip).unwrap_or(inp.clip);
            Ok((Model(model), clip))
        }
    }
}

weft_sdk::node! {
    /// Applies a LoRA to the diffusion model only.
    pub struct LoraLoaderModelOnly {
        category: "loaders",
        inputs {
            model: Model = input::model(),
            lora_name: String = input::model_file("loras"),
            strength_model: f64 = input::float().default(1.0).min(-100.0).max(100.0).step(0.01),
        }
        outputs { MODEL: Model }
        fn execute(_, inp) {
            if inp.strength_model == 0.0 {
                return Ok((inp.model,));
            }
            let (model, _) = diffusion::load_lora(inp.model.handle(), None, &inp.lora_name, inp.strength_model, 0.0)?;
            Ok((Model(model),))
        }
    }
}

/// `UNETLoader`'s `weight_dtype` choices (weft computes the fp8 ones as `default`).
const WEIGHT_DTYPES: [&str; 4] = ["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"];

/// `CLIPLoader`'s `type` choices, as ComfyUI lists them (weft runs `stable_diffusion`).
const CLIP_TYPES: [&str; 18] = [
    "stable_diffusion",
    "stable_cascade",
    "sd3",
    "stable_audio",
    "mochi",
    "ltxv",
    "pixart",
    "cosmos",
    "lumina2",
    "wan",
    "hidream",
    "chroma",
    "ace",
    "omnigen2",
    "qwen_image",
    "hunyuan_image",
    "flux2",
    "ovis",
];

/// `DualCLIPLoader`'s `type` choices, as ComfyUI lists them (weft runs `sdxl`).
const DUAL_CLIP_TYPES: [&str; 9] = [
    "sdxl",
    "sd3",
    "flux",
    "hunyuan_video",
    "hidream",
    "hunyuan_image",
    "hunyuan_video_15",
    "kandinsky5",
    "kandinsky5_image",
];

/// The CLIP loaders' `device` choices.
const DEVICES: [&str; 2] = ["default", "cpu"];

weft_sdk::node! {
    /// Loads a denoising model (a UNet alone) from the `diffusion_models` folder. weft runs
    /// the UNets of Stable Diffusion 1.x, SDXL and the SDXL refiner; the fp8 weight types
    /// compute as `default`.
    pub struct UNETLoader {
        display_name: "Load Diffusion Model",
        category: "advanced/loaders",
        inputs {
            unet_name: String = input::model_file("diffusion_models"),
            weight_dtype: String = input::combo(WEIGHT_DTYPES),
        }
        outputs { MODEL: Model }
        fn execute(_, inp) {
            Ok((Model(diffusion::load_unet(&inp.unet_name, &inp.weight_dtype)?),))
        }
    }
}

weft_sdk::node! {
    /// Loads a text encoder from the `text_encoders` folder. weft runs type
    /// `stable_diffusion`: a CLIP-L file (Stable Diffusion 1.x) or a CLIP-G file (the SDXL
    /// refiner).
    pub struct CLIPLoader {
        display_name: "Load CLIP",
        category: "advanced/loaders",
        inputs {
            clip_name: String = input::model_file("text_encoders"),
            r#type: String = input::combo(CLIP_TYPES),
            device: String = input::combo(DEVICES),
        }
        outputs { CLIP: Clip }
        fn execute(_, inp) {
            let names = [inp.clip_name.clone()];
            Ok((Clip(diffusion::load_clip(&names, &inp.r#type, &inp.device)?),))
        }
    }
}

weft_sdk::node! {
    /// Loads two text encoders from the `text_encoders` folder as one CLIP. weft runs type
    /// `sdxl`: a CLIP-L and a CLIP-G file, in either order.
    pub struct DualCLIPLoader {
        display_name: "DualCLIPLoader",
        category: "advanced/loaders",
        inputs {
            clip_name1: String = input::model_file("text_encoders"),
            clip_name2: String = input::model_file("text_encoders"),
            r#type: String = input::combo(DUAL_CLIP_TYPES),
            device: String = input::combo(DEVICES),
        }
        outputs { CLIP: Clip }
        fn execute(_, inp) {
            let names = [inp.clip_name1.clone(), inp.clip_name2.clone()];
            Ok((Clip(diffusion::load_clip(&names, &inp.r#type, &inp.device)?),))
        }
    }
}
