//! Upscale models, as ComfyUI's `UpscaleModelLoader` and `ImageUpscaleWithModel` run them
//! through spandrel: ESRGAN's RRDBNet (old and new key layouts, Real-ESRGAN's pixel-unshuffle
//! 1x and 2x models, any scale, block count and width) and Real-ESRGAN's compact network
//! (SRVGGNetCompact), detected from the file's keys as spandrel detects them, from
//! `.safetensors` or PyTorch `.pth` files (read without running any pickled code). Other
//! architectures are refused.
//!
//! The networks run on the CPU in float32, through weft's convolution kernels (Winograd's
//! F(4×4, 3×3) for their 3×3 layers on planes of 32×32 pixels and more), on one image (or
//! tile) at a time; images are tiled as ComfyUI's
//! `tiled_scale` tiles them.

mod compact;
mod ops;
mod rrdb;
mod tiled;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

pub use tiled::Tiling;

use crate::diffusion::ModelError;
use crate::image::ImageBatch;
use crate::interrupt::Interrupt;
use crate::ComputeError;

/// The architectures weft runs, for messages.
pub const SUPPORTED: &str =
    "ESRGAN (RRDBNet, incl. Real-ESRGAN x1/x2/x4 and BSRGAN) and Real-ESRGAN Compact (SRVGGNetCompact)";

/// The most floats of scratch the convolutions use beyond their inputs and outputs
/// (Winograd's transformed inputs and products, at most 16 Mi floats each, and filters).
const CONV_SCRATCH_FLOATS: u64 = 40 << 20;

/// A loaded upscale model.
#[derive(Debug)]
pub struct UpscaleModel {
    network: Network,
    /// Bytes of its float32 weights.
    weight_bytes: u64,
}

/// The network of an [`UpscaleModel`].
#[derive(Debug)]
enum Network {
    Esrgan(Box<rrdb::RrdbNet>),
    Compact(compact::Compact),
}

impl UpscaleModel {
    /// Loads the model file at `path` (called `name` in messages): `.safetensors`, or a
    /// PyTorch zip `.pth`/`.pt`/`.ckpt` (its state dict, or the one under `params_ema` or
    /// `params`).
    pub fn load(path: &Path, name: &str) -> Result<Self, ModelError> {
        if !path.exists() {
            return Err(ModelError::NotFound(format!("{name}: no such model file")));
        }
        let tensors = read_tensors(path).map_err(|e| {
            ModelError::Invalid(
                format!("{name}: not a readable model file: {e}").replace(&path.display().to_string(), name),
            )
        })?;
        Self::from_tensors(tensors, name)
    }

    /// The model of state dict `tensors` (any dtype), called `name` in messages.
    pub fn from_tensors(tensors: HashMap<String, Tensor>, name: &str) -> Result<Self, ModelError> {
        let mut state = HashMap::with_capacity(tensors.len());
        let mut weight_bytes = 0u64;
        for (key, t) in tensors {
            let key = key.strip_prefix("module.").map(str::to_string).unwrap_or(key);
            let t = t
                .to_device(&Device::Cpu)
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.contiguous())
                .map_err(|e| ModelError::Invalid(format!("{name}: tensor {key}: {e}")))?;
            weight_bytes += t.elem_count() as u64 * 4;
            state.insert(key, t);
        }
        let invalid = |why: String| ModelError::Invalid(format!("{name}: {why}"));
        let network = if rrdb::detect(|k| state.contains_key(k)) {
            Network::Esrgan(Box::new(rrdb::RrdbNet::new(state).map_err(invalid)?))
        } else if compact::detect(&state) {
            Network::Compact(compact::Compact::new(&state).map_err(invalid)?)
        } else {
            return Err(invalid(format!(
                "not an upscale model weft supports (supported: {SUPPORTED})"
            )));
        };
        Ok(UpscaleModel { network, weight_bytes })
    }

    /// How many times larger images come out.
    pub fn scale(&self) -> usize {
        match &self.network {
            Network::Esrgan(n) => n.scale,
            Network::Compact(n) => n.scale,
        }
    }

    /// The architecture, by spandrel's name.
    pub fn architecture(&self) -> &'static str {
        match &self.network {
            Network::Esrgan(_) => "ESRGAN",
            Network::Compact(_) => "RealESRGAN Compact",
        }
    }

    /// Bytes of the weights as held (float32).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Bytes of working memory an upscale of `batch` images of `width × height` with
    /// `tiling` needs at most, the result included: the activations alive at once while one
    /// tile runs (at the input size, ESRGAN's dense-block buffer with its block input and a
    /// convolution's output; at the output size, a layer's input and output), the
    /// convolutions' scratch, the blending buffers and the result.
    pub fn working_bytes(&self, (width, height): (usize, usize), batch: usize, tiling: Tiling) -> u64 {
        let scale = self.scale() as u64;
        let (th, tw) = (height.min(tiling.tile) as u64 + 4, width.min(tiling.tile) as u64 + 4);
        let (tile_in, tile_out) = (th * tw, th * tw * scale * scale);
        let out_pixels = height as u64 * width as u64 * scale * scale;
        let (floats, widest) = match &self.network {
            Network::Esrgan(n) => {
                let nf = n.features() as u64;
                let low = tile_in * (3 * nf + 4 * 32 + 32);
                let high = tile_out * (2 * nf + 3);
                (low.max(high), (nf + 4 * 32).max(nf * scale * scale))
            }
            Network::Compact(n) => {
                let nf = n.features() as u64;
                (tile_in * 2 * nf + tile_out * 3 * 3, nf)
            }
        };
        // Winograd's transformed inputs and products: 4 floats per pixel and channel each.
        let scratch = (8 * widest * tile_in).min(CONV_SCRATCH_FLOATS);
        let blending = if height > tiling.tile || width > tiling.tile {
            out_pixels * 4
        } else {
            0
        };
        let images = (height * width) as u64 * 3 * 2 + out_pixels * 3 * batch as u64;
        (floats + scratch + blending + images) * 4
    }

    /// `image` upscaled as `ImageUpscaleWithModel` does: each image tiled by `tiling`,
    /// the result clamped to 0..=1. Calls `on_tile(done, total)` after each tile; `stop` is
    /// asked between tiles and inside the networks' convolutions.
    pub fn upscale(
        &self,
        image: &ImageBatch,
        tiling: Tiling,
        on_tile: &mut dyn FnMut(usize, usize),
        stop: Interrupt<'_>,
    ) -> Result<ImageBatch, ComputeError> {
        let (b, h, w, c) = (
            image.batch as usize,
            image.height as usize,
            image.width as usize,
            image.channels as usize,
        );
        if c != 3 || h == 0 || w == 0 || image.data.len() != b * h * w * c {
            return Err(ComputeError::invalid(format!(
                "an upscale model needs a non-empty RGB image, got {w}x{h} with {c} channels"
            )));
        }
        if tiling.tile <= tiling.overlap {
            return Err(ComputeError::invalid("the tile must be larger than the overlap"));
        }
        let scale = self.scale();
        let total = b * tiling.steps((h, w));
        let mut done = 0;
        let mut data = Vec::with_capacity(b * h * w * 3 * scale * scale);
        for one in image.data.chunks_exact(h * w * 3) {
            let chw = to_planes(one, (h, w));
            let run = &mut |x: &[f32], hw: (usize, usize)| self.forward(x, hw, stop);
            let tick = &mut || {
                done += 1;
                on_tile(done, total);
                stop.check()
            };
            let out = tiled::tiled_scale(&chw, (3, h, w), tiling, scale, run, tick)
                .map_err(|e| stop.explain("upscaling", e))?;
            to_pixels(&out, (h * scale, w * scale), &mut data);
        }
        Ok(ImageBatch {
            width: (w * scale) as u32,
            height: (h * scale) as u32,
            batch: b as u32,
            channels: 3,
            data,
        })
    }

    /// spandrel's model call on one `3 × h × w` image: padded to the network's size
    /// requirements, run, clamped to 0..=1 and cropped back.
    fn forward(&self, x: &[f32], (h, w): (usize, usize), stop: Interrupt<'_>) -> candle_core::Result<Vec<f32>> {
        let (minimum, multiple) = match &self.network {
            Network::Esrgan(n) => n.size_requirements(),
            Network::Compact(_) => (0, 1),
        };
        let (hp, wp) = (
            h.max(minimum).next_multiple_of(multiple),
            w.max(minimum).next_multiple_of(multiple),
        );
        let padded;
        let input = if (hp, wp) == (h, w) {
            x
        } else {
            padded = ops::pad(x, 3, (h, w), (hp - h, wp - w));
            &padded
        };
        let mut out = match &self.network {
            Network::Esrgan(n) => n.forward(input, (hp, wp), stop)?,
            Network::Compact(n) => n.forward(input, (hp, wp), stop)?,
        };
        ops::clamp_unit(&mut out);
        let s = self.scale();
        Ok(ops::crop(&out, 3, (hp * s, wp * s), (h * s, w * s)))
    }
}

/// The tensors of the file at `path`: safetensors, or a PyTorch zip file's state dict.
fn read_tensors(path: &Path) -> candle_core::Result<HashMap<String, Tensor>> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    if extension == "safetensors" || extension == "sft" {
        return candle_core::safetensors::load(path, &Device::Cpu);
    }
    // Real-ESRGAN's files keep the state dict under `params_ema` or `params`.
    for key in ["params_ema", "params", "state_dict"] {
        if let Ok(tensors) = candle_core::pickle::read_all_with_key(path, Some(key)) {
            if !tensors.is_empty() {
                return Ok(tensors.into_iter().collect());
            }
        }
    }
    let tensors = candle_core::pickle::read_all(path)?;
    if tensors.is_empty() {
        candle_core::bail!("no tensors found");
    }
    Ok(tensors.into_iter().collect())
}

/// One HWC image as CHW planes.
fn to_planes(pixels: &[f32], (h, w): (usize, usize)) -> Vec<f32> {
    let p = h * w;
    let mut out = vec![0f32; 3 * p];
    for (i, px) in pixels.chunks_exact(3).enumerate() {
        for (c, &v) in px.iter().enumerate() {
            out[c * p + i] = v;
        }
    }
    out
}

/// CHW planes appended to `out` as HWC pixels, clamped to 0..=1.
fn to_pixels(planes: &[f32], (h, w): (usize, usize), out: &mut Vec<f32>) {
    let p = h * w;
    out.reserve(3 * p);
    for i in 0..p {
        for c in 0..3 {
            out.push(planes[c * p + i].clamp(0.0, 1.0));
        }
    }
}

#[cfg(test)]
mod tests {
    //! Against ComfyUI's `ImageUpscaleWithModel` (spandrel) on the reduced random-weight
    //! models of `tests/fixtures/upscale-models/` (see its README).

    use std::path::PathBuf;

    use super::*;

    /// Float32 rounding over a network's depth: the convolutions sum in another order.
    const TOLERANCE: f32 = 2e-5;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/upscale-models")
    }

    fn tensors(file: &str) -> HashMap<String, Tensor> {
        candle_core::safetensors::load(fixtures().join(file), &Device::Cpu).unwrap()
    }

    fn batch(t: &Tensor) -> ImageBatch {
        let (b, h, w, c) = t.dims4().unwrap();
        ImageBatch {
            width: w as u32,
            height: h as u32,
            batch: b as u32,
            channels: c as u32,
            data: t.flatten_all().unwrap().to_vec1().unwrap(),
        }
    }

    fn assert_close(got: &ImageBatch, want: &Tensor, what: &str) {
        let want = batch(want);
        assert_eq!(
            (got.batch, got.height, got.width, got.channels),
            (want.batch, want.height, want.width, want.channels),
            "{what}"
        );
        let worst = got
            .data
            .iter()
            .zip(&want.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= TOLERANCE, "{what}: off by up to {worst}");
    }

    fn check(model_file: &str, key: &str) {
        let model = UpscaleModel::load(&fixtures().join(model_file), model_file).unwrap();
        let inputs = tensors("inputs.safetensors");
        let outputs = tensors("outputs.safetensors");
        let whole = model
            .upscale(
                &batch(&inputs["image"]),
                Tiling::COMFYUI,
                &mut |_, _| {},
                Interrupt::NEVER,
            )
            .unwrap();
        assert_close(&whole, &outputs[key], key);
        let small = Tiling { tile: 12, overlap: 3 };
        let mut ticks = Vec::new();
        let large = batch(&inputs["large"]);
        let tiled = model
            .upscale(&large, small, &mut |d, t| ticks.push((d, t)), Interrupt::NEVER)
            .unwrap();
        assert_close(&tiled, &outputs[&format!("{key}/tiled")], key);
        let steps = small.steps((17, 26));
        assert_eq!(ticks, (1..=steps).map(|d| (d, steps)).collect::<Vec<_>>());
    }

    #[test]
    fn esrgan_old_layout_4x_matches_comfyui() {
        check("esrgan-old-x4.safetensors", "esrgan-old-x4");
    }

    #[test]
    fn real_esrgan_new_layout_2x_unshuffles_as_comfyui_does() {
        check("esrgan-new-x2.safetensors", "esrgan-new-x2");
    }

    #[test]
    fn real_esrgan_new_layout_1x_unshuffles_as_comfyui_does() {
        check("esrgan-new-x1.safetensors", "esrgan-new-x1");
    }

    #[test]
    fn compact_network_matches_comfyui() {
        check("compact-x4.safetensors", "compact-x4");
    }

    #[test]
    fn pytorch_pickles_load_like_safetensors() {
        check("compact-x4.pth", "compact-x4");
    }

    #[test]
    fn models_are_detected_with_their_scale() {
        for (file, arch, scale) in [
            ("esrgan-old-x4.safetensors", "ESRGAN", 4),
            ("esrgan-new-x2.safetensors", "ESRGAN", 2),
            ("esrgan-new-x1.safetensors", "ESRGAN", 1),
            ("compact-x4.pth", "RealESRGAN Compact", 4),
        ] {
            let model = UpscaleModel::load(&fixtures().join(file), file).unwrap();
            assert_eq!((model.architecture(), model.scale()), (arch, scale), "{file}");
            assert!(model.weight_bytes() > 0);
        }
    }

    #[test]
    fn other_architectures_are_refused_naming_the_supported_ones() {
        let name = "not-an-upscaler.safetensors";
        let e = UpscaleModel::load(&fixtures().join(name), name).unwrap_err();
        assert_eq!(e.code(), "invalid_model");
        assert!(e.to_string().contains("ESRGAN"), "{e}");
        let missing = UpscaleModel::load(&fixtures().join("absent.safetensors"), "absent.safetensors").unwrap_err();
        assert_eq!(missing.code(), "model_not_found");
    }

    #[test]
    fn an_interrupt_stops_the_upscale() {
        let model = UpscaleModel::load(&fixtures().join("compact-x4.safetensors"), "c").unwrap();
        let inputs = tensors("inputs.safetensors");
        let stop = || true;
        let e = model
            .upscale(
                &batch(&inputs["large"]),
                Tiling { tile: 12, overlap: 3 },
                &mut |_, _| {},
                Interrupt::new(&stop),
            )
            .unwrap_err();
        assert!(matches!(e, ComputeError::Interrupted), "{e}");
    }
}
