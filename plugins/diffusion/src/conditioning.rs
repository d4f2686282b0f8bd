//! Text encoding and the conditioning nodes.

use weft_sdk::prelude::*;

use crate::MAX_RESOLUTION;

weft_sdk::node! {
    /// Encodes a text prompt using a CLIP model into an embedding that can be used to guide the diffusion model towards generating specific images.
    pub struct CLIPTextEncode {
        display_name: "CLIP Text Encode (Prompt)",
        category: "conditioning",
        inputs {
            text: String = input::string().multiline().tooltip("The text to be encoded."),
            clip: Clip = input::clip().tooltip("The CLIP model used for encoding the text."),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            Ok((Conditioning(diffusion::encode_text(inp.clip.handle(), &inp.text)?),))
        }
    }
}

weft_sdk::node! {
    /// Encodes `text_g` with SDXL's OpenCLIP bigG and `text_l` with its CLIP ViT-L, with SDXL's size conditioning.
    pub struct CLIPTextEncodeSDXL {
        category: "advanced/conditioning",
        inputs {
            clip: Clip = input::clip(),
            width: i64 = input::int().default(1024).min(0).max(MAX_RESOLUTION),
            height: i64 = input::int().default(1024).min(0).max(MAX_RESOLUTION),
            crop_w: i64 = input::int().default(0).min(0).max(MAX_RESOLUTION),
            crop_h: i64 = input::int().default(0).min(0).max(MAX_RESOLUTION),
            target_width: i64 = input::int().default(1024).min(0).max(MAX_RESOLUTION),
            target_height: i64 = input::int().default(1024).min(0).max(MAX_RESOLUTION),
            text_g: String = input::string().multiline(),
            text_l: String = input::string().multiline(),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let size = diffusion::SizeConditioning {
                width: Some(inp.width as f64),
                height: Some(inp.height as f64),
                crop_w: Some(inp.crop_w as f64),
                crop_h: Some(inp.crop_h as f64),
                target_width: Some(inp.target_width as f64),
                target_height: Some(inp.target_height as f64),
                aesthetic_score: None,
            };
            let encoded = diffusion::encode_text_sdxl(inp.clip.handle(), &inp.text_g, &inp.text_l, size)?;
            Ok((Conditioning(encoded),))
        }
    }
}

weft_sdk::node! {
    /// Encodes `text` with the SDXL refiner's OpenCLIP bigG, with its aesthetic score and size conditioning.
    pub struct CLIPTextEncodeSDXLRefiner {
        category: "advanced/conditioning",
        inputs {
            clip: Clip = input::clip(),
            ascore: f64 = input::float().default(6.0).min(0.0).max(1000.0).step(0.01),
            width: i64 = input::int().default(1024).min(0).max(MAX_RESOLUTION),
            height: i64 = input::int().default(1024).min(0).max(MAX_RESOLUTION),
            text: String = input::string().multiline(),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let size = diffusion::SizeConditioning {
                width: Some(inp.width as f64),
                height: Some(inp.height as f64),
                crop_w: None,
                crop_h: None,
                target_width: None,
                target_height: None,
                aesthetic_score: Some(inp.ascore),
            };
            let encoded = diffusion::encode_text_sdxl(inp.clip.handle(), &inp.text, &inp.text, size)?;
            Ok((Conditioning(encoded),))
        }
    }
}

weft_sdk::node! {
    /// Stops the text encoder at an earlier layer (-1 is the last, -2 the one before, ...).
    pub struct CLIPSetLastLayer {
        display_name: "CLIP Set Last Layer",
        category: "conditioning",
        inputs {
            clip: Clip = input::clip(),
            stop_at_clip_layer: i64 = input::int().default(-1).min(-24).max(-1).step(1),
        }
        outputs { CLIP: Clip }
        fn execute(_, inp) {
            let layer = i32::try_from(inp.stop_at_clip_layer)?;
            Ok((Clip(diffusion::clip_set_last_layer(inp.clip.handle(), layer)?),))
        }
    }
}

weft_sdk::node! {
    /// Both conditionings, applied together.
    pub struct ConditioningCombine {
        display_name: "Conditioning (Combine)",
        category: "conditioning",
        inputs {
            conditioning_1: Conditioning = input::conditioning(),
            conditioning_2: Conditioning = input::conditioning(),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let combined = diffusion::conditioning_combine(inp.conditioning_1.handle(), inp.conditioning_2.handle())?;
            Ok((Conditioning(combined),))
        }
    }
}

weft_sdk::node! {
    /// Blends every entry of `conditioning_to` with the first entry of `conditioning_from`.
    pub struct ConditioningAverage {
        category: "conditioning",
        inputs {
            conditioning_to: Conditioning = input::conditioning(),
            conditioning_from: Conditioning = input::conditioning(),
            conditioning_to_strength: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let blended = diffusion::conditioning_average(
                inp.conditioning_to.handle(),
                inp.conditioning_from.handle(),
                inp.conditioning_to_strength,
            )?;
            Ok((Conditioning(blended),))
        }
    }
}

weft_sdk::node! {
    /// Applies the conditioning to a rectangle of the image only.
    pub struct ConditioningSetArea {
        display_name: "Conditioning (Set Area)",
        category: "conditioning",
        inputs {
            conditioning: Conditioning = input::conditioning(),
            width: i64 = input::int().default(64).min(64).max(MAX_RESOLUTION).step(8),
            height: i64 = input::int().default(64).min(64).max(MAX_RESOLUTION).step(8),
            x: i64 = input::int().default(0).min(0).max(MAX_RESOLUTION).step(8),
            y: i64 = input::int().default(0).min(0).max(MAX_RESOLUTION).step(8),
            strength: f64 = input::float().default(1.0).min(0.0).max(10.0).step(0.01),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let area = diffusion::Area {
                width: u32::try_from(inp.width)?,
                height: u32::try_from(inp.height)?,
                x: u32::try_from(inp.x)?,
                y: u32::try_from(inp.y)?,
            };
            let c = diffusion::conditioning_set_area(inp.conditioning.handle(), area, inp.strength)?;
            Ok((Conditioning(c),))
        }
    }
}

weft_sdk::node! {
    /// The conditioning with every tensor set to zero.
    pub struct ConditioningZeroOut {
        category: "advanced/conditioning",
        inputs {
            conditioning: Conditioning = input::conditioning(),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            Ok((Conditioning(diffusion::conditioning_zero_out(inp.conditioning.handle())?),))
        }
    }
}

weft_sdk::node! {
    /// The conditioning applied only from `start` to `end` of the way through sampling.
    pub struct ConditioningSetTimestepRange {
        category: "advanced/conditioning",
        inputs {
            conditioning: Conditioning = input::conditioning(),
            start: f64 = input::float().default(0.0).min(0.0).max(1.0).step(0.001),
            end: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.001),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let ranged = diffusion::conditioning_set_timestep_range(inp.conditioning.handle(), inp.start, inp.end)?;
            Ok((Conditioning(ranged),))
        }
    }
}

weft_sdk::node! {
    /// Every entry of `conditioning_to` with the tokens of `conditioning_from`'s first entry appended.
    pub struct ConditioningConcat {
        display_name: "Conditioning (Concat)",
        category: "conditioning",
        inputs {
            conditioning_to: Conditioning = input::conditioning(),
            conditioning_from: Conditioning = input::conditioning(),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let c = diffusion::conditioning_concat(inp.conditioning_to.handle(), inp.conditioning_from.handle())?;
            Ok((Conditioning(c),))
        }
    }
}

weft_sdk::node! {
    /// Applies the conditioning to a rectangle of the image only, in fractions of its sides.
    pub struct ConditioningSetAreaPercentage {
        display_name: "Conditioning (Set Area with Percentage)",
        category: "conditioning",
        inputs {
            conditioning: Conditioning = input::conditioning(),
            width: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
            height: f64 = input::float().default(1.0).min(0.0).max(1.0).step(0.01),
            x: f64 = input::float().default(0.0).min(0.0).max(1.0).step(0.01),
            y: f64 = input::float().default(0.0).min(0.0).max(1.0).step(0.01),
            strength: f64 = input::float().default(1.0).min(0.0).max(10.0).step(0.01),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let area = diffusion::AreaFraction { width: inp.width, height: inp.height, x: inp.x, y: inp.y };
            let c = diffusion::conditioning_set_area_fraction(inp.conditioning.handle(), area, inp.strength)?;
            Ok((Conditioning(c),))
        }
    }
}

weft_sdk::node! {
    /// The conditioning's weight against the others where they overlap.
    pub struct ConditioningSetAreaStrength {
        category: "conditioning",
        inputs {
            conditioning: Conditioning = input::conditioning(),
            strength: f64 = input::float().default(1.0).min(0.0).max(10.0).step(0.01),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let c = diffusion::conditioning_set_strength(inp.conditioning.handle(), inp.strength)?;
            Ok((Conditioning(c),))
        }
    }
}

weft_sdk::node! {
    /// Applies the conditioning where the mask is set, weighted by it.
    pub struct ConditioningSetMask {
        display_name: "Conditioning (Set Mask)",
        category: "conditioning",
        inputs {
            conditioning: Conditioning = input::conditioning(),
            mask: Mask = input::mask(),
            strength: f64 = input::float().default(1.0).min(0.0).max(10.0).step(0.01),
            set_cond_area: String = input::combo(["default", "mask bounds"]),
        }
        outputs { CONDITIONING: Conditioning }
        fn execute(_, inp) {
            let bounds = inp.set_cond_area != "default";
            let c = diffusion::conditioning_set_mask(inp.conditioning.handle(), &inp.mask, inp.strength, bounds)?;
            Ok((Conditioning(c),))
        }
    }
}

weft_sdk::node! {
    /// Conditions an inpainting model on an image and a mask: the masked part of the image, greyed and encoded, and the mask go with both conditionings; the latent is the image encoded.
    pub struct InpaintModelConditioning {
        category: "conditioning/inpaint",
        inputs {
            positive: Conditioning = input::conditioning(),
            negative: Conditioning = input::conditioning(),
            vae: Vae = input::vae(),
            pixels: Image = input::image(),
            mask: Mask = input::mask(),
            noise_mask: bool = input::boolean().default(true).tooltip("Add a noise mask to the latent so sampling will only happen within the mask. Might improve results or completely break things depending on the model."),
        }
        outputs { positive: Conditioning, negative: Conditioning, latent: Latent }
        fn execute(_, inp) {
            let out = diffusion::inpaint_model_conditioning(
                inp.positive.handle(),
                inp.negative.handle(),
                inp.vae.handle(),
                &inp.pixels,
                &inp.mask,
                inp.noise_mask,
            )?;
            Ok((Conditioning(out.positive), Conditioning(out.negative), out.latent))
        }
    }
}
