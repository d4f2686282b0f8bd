//! Loaders: checkpoints, standalone VAEs and LoRAs from the models folder.

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
