//! Latent nodes: empty latents, upscaling, compositing, batches, noise masks, and
//! `.latent` files.

use weft_sdk::prelude::*;

use crate::MAX_RESOLUTION;

/// `LatentUpscale`'s and `LatentUpscaleBy`'s methods.
const UPSCALE_METHODS: [&str; 5] = ["nearest-exact", "bilinear", "area", "bicubic", "bislerp"];

weft_sdk::node! {
    /// Create a new batch of empty latent images to be denoised via sampling.
    pub struct EmptyLatentImage {
        display_name: "Empty Latent Image",
        category: "latent",
        inputs {
            width: u32 = input::uint().default(512).min(16).max(MAX_RESOLUTION as u32).step(8)
                .tooltip("The width of the latent images in pixels."),
            height: u32 = input::uint().default(512).min(16).max(MAX_RESOLUTION as u32).step(8)
                .tooltip("The height of the latent images in pixels."),
            batch_size: u32 = input::uint().default(1).min(1).max(4096)
                .tooltip("The number of latent images in the batch."),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::empty_latent(inp.width, inp.height, inp.batch_size)?,))
        }
    }
}

weft_sdk::node! {
    /// Resizes latents to `width` x `height` pixels; a zero side keeps the aspect ratio.
    pub struct LatentUpscale {
        display_name: "Upscale Latent",
        category: "latent",
        inputs {
            samples: Latent = input::latent(),
            upscale_method: String = input::combo(UPSCALE_METHODS),
            width: u32 = input::uint().default(512).min(0).max(MAX_RESOLUTION as u32).step(8),
            height: u32 = input::uint().default(512).min(0).max(MAX_RESOLUTION as u32).step(8),
            crop: String = input::combo(["disabled", "center"]),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            // ComfyUI's sizes: at least 64 pixels, a zero side from the latent's aspect ratio.
            let (cells_w, cells_h) = (u64::from(inp.samples.width() / 8), u64::from(inp.samples.height() / 8));
            let (width, height) = match (inp.width, inp.height) {
                (0, 0) => return Ok((inp.samples,)),
                (0, h) => {
                    let h = h.max(64);
                    let w = ((cells_w * u64::from(h)) as f64 / cells_h as f64).round() as u32;
                    (w.max(64), h)
                }
                (w, 0) => {
                    let w = w.max(64);
                    let h = ((cells_h * u64::from(w)) as f64 / cells_w as f64).round() as u32;
                    (w, h.max(64))
                }
                (w, h) => (w.max(64), h.max(64)),
            };
            let scaled = diffusion::latent_scale(&inp.samples, &inp.upscale_method, width / 8, height / 8, &inp.crop)?;
            Ok((scaled,))
        }
    }
}

weft_sdk::node! {
    /// Resizes latents by a factor.
    pub struct LatentUpscaleBy {
        display_name: "Upscale Latent By",
        category: "latent",
        inputs {
            samples: Latent = input::latent(),
            upscale_method: String = input::combo(UPSCALE_METHODS),
            scale_by: f64 = input::float().default(1.5).min(0.01).max(8.0).step(0.01),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let cells = |pixels: u32| ((f64::from(pixels / 8) * inp.scale_by).round() as u32).max(1);
            let (width, height) = (cells(inp.samples.width()), cells(inp.samples.height()));
            let scaled = diffusion::latent_scale(&inp.samples, &inp.upscale_method, width, height, "disabled")?;
            Ok((scaled,))
        }
    }
}

weft_sdk::node! {
    /// Pastes `samples_from` into `samples_to` at `x`, `y`, blending its edges over `feather` pixels.
    pub struct LatentComposite {
        display_name: "Latent Composite",
        category: "latent",
        inputs {
            samples_to: Latent = input::latent(),
            samples_from: Latent = input::latent(),
            x: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
            y: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
            feather: u32 = input::uint().default(0).min(0).max(MAX_RESOLUTION as u32).step(8),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            let out = diffusion::latent_composite(&inp.samples_to, &inp.samples_from, inp.x, inp.y, inp.feather)?;
            Ok((out,))
        }
    }
}

weft_sdk::node! {
    /// `length` latents of the batch from `batch_index` on.
    pub struct LatentFromBatch {
        display_name: "Latent From Batch",
        category: "latent/batch",
        inputs {
            samples: Latent = input::latent(),
            batch_index: u32 = input::uint().default(0).min(0).max(63),
            length: u32 = input::uint().default(1).min(1).max(64),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::latent_from_batch(&inp.samples, inp.batch_index, inp.length)?,))
        }
    }
}

weft_sdk::node! {
    /// The batch repeated `amount` times.
    pub struct RepeatLatentBatch {
        display_name: "Repeat Latent Batch",
        category: "latent/batch",
        inputs {
            samples: Latent = input::latent(),
            amount: u32 = input::uint().default(1).min(1).max(64),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::repeat_latent_batch(&inp.samples, inp.amount)?,))
        }
    }
}

weft_sdk::node! {
    /// Limits sampling to where the mask is 1.
    pub struct SetLatentNoiseMask {
        display_name: "Set Latent Noise Mask",
        category: "latent/inpaint",
        inputs {
            samples: Latent = input::latent(),
            mask: Mask = input::mask(),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::set_latent_noise_mask(&inp.samples, &inp.mask)?,))
        }
    }
}

weft_sdk::node! {
    /// Saves latents as a ComfyUI `.latent` file (safetensors).
    pub struct SaveLatent {
        category: "_for_testing",
        output_node: true,
        inputs {
            samples: Latent = input::latent(),
            filename_prefix: String = input::string().default("latents/ComfyUI"),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_latent(inp.filename_prefix, inp.samples);
            Ok(())
        }
    }
}

weft_sdk::node! {
    /// Loads an uploaded ComfyUI `.latent` file.
    pub struct LoadLatent {
        category: "_for_testing",
        inputs {
            latent: AssetRef = input::asset(),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::load_latent(&inp.latent)?,))
        }
    }
}
