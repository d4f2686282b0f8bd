//! VAE decoding and encoding.

use weft_sdk::prelude::*;

weft_sdk::node! {
    /// Decodes latent images back into pixel space images.
    pub struct VAEDecode {
        display_name: "VAE Decode",
        category: "latent",
        inputs {
            samples: Latent = input::latent().tooltip("The latent to be decoded."),
            vae: Vae = input::vae().tooltip("The VAE model used for decoding the latent."),
        }
        outputs { IMAGE: Image }
        fn execute(_, inp) {
            Ok((diffusion::vae_decode(inp.vae.handle(), &inp.samples)?,))
        }
    }
}

weft_sdk::node! {
    /// Encodes images into latents.
    pub struct VAEEncode {
        display_name: "VAE Encode",
        category: "latent",
        inputs {
            pixels: Image = input::image(),
            vae: Vae = input::vae(),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::vae_encode(inp.vae.handle(), &inp.pixels)?,))
        }
    }
}

weft_sdk::node! {
    /// Encodes images for inpainting: the masked part is set to grey and becomes the noise mask.
    pub struct VAEEncodeForInpaint {
        display_name: "VAE Encode (for Inpainting)",
        category: "latent/inpaint",
        inputs {
            pixels: Image = input::image(),
            vae: Vae = input::vae(),
            mask: Mask = input::mask(),
            grow_mask_by: u32 = input::uint().default(6).min(0).max(64).step(1),
        }
        outputs { LATENT: Latent }
        fn execute(_, inp) {
            Ok((diffusion::vae_encode_for_inpaint(inp.vae.handle(), &inp.pixels, &inp.mask, inp.grow_mask_by)?,))
        }
    }
}
