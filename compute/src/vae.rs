//! VAE encode and decode for SD1 models, in ComfyUI's conventions: images are
//! [`ImageBatch`]es (float 0..=1, `[batch, height, width, 3]`); latents are `[batch, 4, h/8,
//! w/8]` in the VAE's own (unscaled) space, as ComfyUI's `LATENT` holds them. Samplers work
//! on [`process_in`]`(latent)` (times 0.18215) and hand back through [`process_out`].

use anyhow::{Context, Result};
use candle_core::{Device, Tensor as CTensor};

use super::image::ImageBatch;
use super::interrupt::Interrupt;
use super::models::{CheckpointModels, Sd1Vae};
use super::sampling::Tensor;

/// SD1.x latent scale factor.
pub const SD1_SCALE_FACTOR: f32 = 0.18215;

/// VAE space -> sampler space.
pub fn process_in(latent: &Tensor) -> Tensor {
    latent.with_data(latent.data.iter().map(|v| v * SD1_SCALE_FACTOR).collect())
}

/// Sampler space -> VAE space.
pub fn process_out(latent: &Tensor) -> Tensor {
    latent.with_data(latent.data.iter().map(|v| v / SD1_SCALE_FACTOR).collect())
}

/// Converts a candle tensor back (float32).
pub fn from_candle(t: &CTensor) -> Result<Tensor> {
    let t = t.to_dtype(candle_core::DType::F32)?;
    let data = t.flatten_all()?.to_vec1::<f32>()?;
    Tensor::try_new(t.dims().to_vec(), data)
}

/// Decodes VAE-space latents `[batch, 4, h, w]` into an `8w` x `8h` image batch:
/// `clamp((decoder(latent) + 1) / 2, 0, 1)`.
pub fn decode(models: &CheckpointModels, latent: &Tensor) -> Result<ImageBatch> {
    decode_with(&models.vae, &models.device, models.config.latent_channels, latent)
}

/// [`decode`] with any SD1 autoencoder: a checkpoint's or a standalone VAE file's.
pub fn decode_with(vae: &Sd1Vae, device: &Device, latent_channels: usize, latent: &Tensor) -> Result<ImageBatch> {
    decode_interruptible(vae, device, latent_channels, latent, Interrupt::NEVER)
}

/// [`decode_with`], asking `stop` between the decoder's blocks.
pub fn decode_interruptible(
    vae: &Sd1Vae,
    device: &Device,
    latent_channels: usize,
    latent: &Tensor,
    stop: Interrupt<'_>,
) -> Result<ImageBatch> {
    anyhow::ensure!(
        latent.shape.len() == 4 && latent.shape[1] == latent_channels,
        "decode needs a [batch, {}, h, w] latent, got {:?}",
        latent_channels,
        latent.shape
    );
    let x = CTensor::from_slice(&latent.data, latent.shape.as_slice(), device)?;
    let img = vae.decode_interruptible(&x, stop).context("VAE decode")?;
    let img = ((img + 1.0)? / 2.0)?
        .clamp(0f32, 1f32)?
        .permute((0, 2, 3, 1))?
        .contiguous()?;
    let (b, h, w, c) = img.dims4()?;
    Ok(ImageBatch {
        width: w as u32,
        height: h as u32,
        batch: b as u32,
        channels: c as u32,
        data: img.flatten_all()?.to_vec1::<f32>()?,
    })
}

/// Encodes an RGB image batch (sides multiples of 8) into VAE-space latents: the mean of the
/// posterior of `encoder(2 * image - 1)`, as ComfyUI's `VAEEncode` does.
pub fn encode(models: &CheckpointModels, image: &ImageBatch) -> Result<Tensor> {
    encode_with(&models.vae, &models.device, image)
}

/// [`encode`] with any SD1 autoencoder: a checkpoint's or a standalone VAE file's.
pub fn encode_with(vae: &Sd1Vae, device: &Device, image: &ImageBatch) -> Result<Tensor> {
    encode_interruptible(vae, device, image, Interrupt::NEVER)
}

/// [`encode_with`], asking `stop` between the encoder's blocks.
pub fn encode_interruptible(vae: &Sd1Vae, device: &Device, image: &ImageBatch, stop: Interrupt<'_>) -> Result<Tensor> {
    anyhow::ensure!(
        image.channels == 3,
        "encode needs an RGB image, got {} channels",
        image.channels
    );
    anyhow::ensure!(
        image.width.is_multiple_of(8) && image.height.is_multiple_of(8) && image.width > 0 && image.height > 0,
        "encode needs image sides that are multiples of 8, got {}x{}",
        image.width,
        image.height
    );
    let shape = (
        image.batch as usize,
        image.height as usize,
        image.width as usize,
        3usize,
    );
    let x = CTensor::from_slice(&image.data, shape, device)?
        .permute((0, 3, 1, 2))?
        .contiguous()?;
    let x = ((x * 2.0)? - 1.0)?;
    let latent = vae.encode_interruptible(&x, stop).context("VAE encode")?;
    from_candle(&latent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::loader::tiny_test_models;

    #[test]
    fn round_trip_shapes_and_determinism() -> Result<()> {
        let (_dir, m) = tiny_test_models(5)?;
        let latent = Tensor::new(vec![2, 4, 3, 5], (0..120).map(|i| (i as f32 / 60.0) - 1.0).collect());
        let img = decode(&m, &latent)?;
        // The tiny VAE has two levels, so it upsamples by 2 (SD1's by 8).
        assert_eq!((img.batch, img.height, img.width, img.channels), (2, 6, 10, 3));
        assert!(img.data.iter().all(|v| (0.0..=1.0).contains(v)));
        let img = crate::image::empty(16, 8, 1, 0x336699)?;
        let a = encode(&m, &img)?;
        assert_eq!(a.shape, vec![1, 4, 4, 8]);
        assert_eq!(a, encode(&m, &img)?, "encoding uses the posterior mean");
        let odd = crate::image::empty(12, 8, 1, 0)?;
        assert!(encode(&m, &odd).is_err());
        assert!(decode(&m, &Tensor::zeros(vec![1, 3, 2, 2])).is_err());
        let s = process_in(&a);
        assert_eq!(process_out(&s).shape, a.shape);
        Ok(())
    }
}
