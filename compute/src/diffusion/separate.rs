//! ComfyUI's separate-file loaders for the diffusion nodes: `UNETLoader` (a UNet file of the
//! `diffusion_models` folder) and `CLIPLoader` / `DualCLIPLoader` (text-encoder files of the
//! `text_encoders` folder), through the shared [`ModelCache`]. The networks are those a
//! checkpoint of the same family gives, so a workflow on files split out of a checkpoint
//! computes exactly what the checkpoint does.

use std::path::{Path, PathBuf};

use super::checkpoint::ModelError;
use super::model::DiffusionModel;
use super::text::TextEncoder;
use crate::models::layout::ModelConfig;
use crate::models::safetensors::{SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::models::separate::{check_clip, check_unet, detect_clip, detect_unet, ClipFile, UnetKeys};
use crate::models::ModelCache;

/// The families whose UNet files weft runs, for messages.
const UNET_FAMILIES: &str =
    "weft runs the UNets of Stable Diffusion 1.x, SDXL (distilled ones too) and the SDXL refiner";

/// The UNet file at `path` (called `name` in messages) as a `MODEL`, from `cache` or loaded
/// into it: ComfyUI's layout with or without the `model.diffusion_model.` prefix, or
/// diffusers'; the family detected from its tensors as for checkpoints.
pub fn load_unet(cache: &ModelCache, path: &Path, name: &str) -> Result<DiffusionModel, ModelError> {
    let index =
        SafetensorsIndex::open(path, DEFAULT_MAX_HEADER).map_err(|e| ModelError::from_checkpoint(&e, path, name))?;
    let keys = UnetKeys::detect(&index).ok_or_else(|| {
        ModelError::Invalid(format!(
            "{name}: not a diffusion model (UNet) file ({} tensors, first '{}'); {UNET_FAMILIES}",
            index.tensors.len(),
            index.tensors.keys().next().map(String::as_str).unwrap_or("")
        ))
    })?;
    let cfg =
        detect_unet(&index, keys).map_err(|found| ModelError::Invalid(format!("{name}: {found}; {UNET_FAMILIES}")))?;
    check_unet(&index, &cfg, keys).map_err(|detail| ModelError::Invalid(format!("{name}: {detail}")))?;
    let unet = cache
        .get_unet(path, &cfg, keys)
        .map_err(|e| ModelError::from_load(e, path, name))?;
    Ok(DiffusionModel::from_unet(unet, path.to_path_buf(), keys))
}

/// How a CLIP loader combines its files: the ComfyUI types weft supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClipKind {
    /// `CLIPLoader`'s `stable_diffusion`: a CLIP-L file (SD1.x's encoder) or a CLIP-G file
    /// (the SDXL refiner's).
    StableDiffusion,
    /// `DualCLIPLoader`'s `sdxl`: a CLIP-L and a CLIP-G file, in either order.
    Sdxl,
}

impl ClipKind {
    /// `CLIPLoader`'s types weft supports.
    pub const SINGLE: &'static [&'static str] = &["stable_diffusion"];
    /// `DualCLIPLoader`'s types weft supports.
    pub const DUAL: &'static [&'static str] = &["sdxl"];

    /// The kind of ComfyUI type `name` for a loader of `files` files, or an error that says
    /// which types weft supports.
    pub fn of(name: &str, files: usize) -> Result<ClipKind, String> {
        match (name, files) {
            ("stable_diffusion", 1) => Ok(ClipKind::StableDiffusion),
            ("sdxl", 2) => Ok(ClipKind::Sdxl),
            (_, 1) => Err(format!(
                "CLIPLoader type {name:?} is not supported: weft supports {} (a CLIP-L or CLIP-G file)",
                Self::SINGLE.join(", ")
            )),
            (_, 2) => Err(format!(
                "DualCLIPLoader type {name:?} is not supported: weft supports {} (a CLIP-L and a CLIP-G file)",
                Self::DUAL.join(", ")
            )),
            (_, n) => Err(format!("{n} text-encoder files: weft's CLIP loaders take one or two")),
        }
    }
}

/// The encoder `file` is, as encoder `slot` of one of `layouts`: the layout whose encoder
/// there has the file's width and depth.
fn layout_for(layouts: &[ModelConfig], slot: usize, file: &ClipFile) -> Option<ModelConfig> {
    layouts
        .iter()
        .find(|cfg| {
            cfg.text
                .get(slot)
                .is_some_and(|c| c.width == file.width && c.layers == file.layers)
        })
        .cloned()
}

/// A text encoder's description for messages.
fn describe(file: &ClipFile) -> String {
    let kind = if file.big_g { "CLIP-G (OpenCLIP bigG)" } else { "CLIP-L" };
    format!("a {kind} text encoder ({} wide, {} layers)", file.width, file.layers)
}

/// The layout `kind` makes of `found` (each file's name and what it holds), with the
/// files' order in it; an error says why the files do not fit.
fn clip_layout(kind: ClipKind, found: &[(&str, ClipFile)]) -> Result<(ModelConfig, Vec<usize>), String> {
    match (kind, found) {
        (ClipKind::StableDiffusion, [(name, file)]) => {
            let layouts = if file.big_g {
                [ModelConfig::sdxl_refiner(), ModelConfig::tiny_sdxl_refiner()]
            } else {
                [ModelConfig::sd1(), ModelConfig::tiny()]
            };
            let cfg = layout_for(&layouts, 0, file).ok_or_else(|| {
                format!(
                    "{name}: {} fits neither Stable Diffusion 1.x's CLIP-L nor the SDXL refiner's CLIP-G",
                    describe(file)
                )
            })?;
            Ok((cfg, vec![0]))
        }
        (ClipKind::Sdxl, [(a, fa), (b, fb)]) => {
            let order = match (fa.big_g, fb.big_g) {
                (false, true) => vec![0, 1],
                (true, false) => vec![1, 0],
                _ => {
                    return Err(format!(
                        "{a} is {} and {b} is {}: DualCLIPLoader's sdxl takes one CLIP-L and one CLIP-G file",
                        describe(fa),
                        describe(fb)
                    ))
                }
            };
            let (l, g) = (&found[order[0]].1, &found[order[1]].1);
            let layouts = [ModelConfig::sdxl(), ModelConfig::tiny_sdxl()];
            layout_for(&layouts, 0, l)
                .filter(|cfg| cfg.text[1].width == g.width && cfg.text[1].layers == g.layers)
                .map(|cfg| (cfg, order))
                .ok_or_else(|| {
                    format!(
                        "{a} and {b}: {} and {} are not SDXL's pair of text encoders",
                        describe(fa),
                        describe(fb)
                    )
                })
        }
        _ => Err(format!("{} text-encoder files do not fit {kind:?}", found.len())),
    }
}

/// The text-encoder files `files` (`(path, name)`) combined as `kind` into a `CLIP`, from
/// `cache` or loaded into it: Hugging Face `CLIPTextModel` layout, optionally under
/// `clip_l.` / `clip_g.`; which file is CLIP-L and which CLIP-G is read from their tensors.
pub fn load_clip(cache: &ModelCache, files: &[(PathBuf, String)], kind: ClipKind) -> Result<TextEncoder, ModelError> {
    let mut found = Vec::with_capacity(files.len());
    for (path, name) in files {
        let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)
            .map_err(|e| ModelError::from_checkpoint(&e, path, name))?;
        let file = detect_clip(&index).map_err(|e| ModelError::Invalid(format!("{name}: {e}")))?;
        found.push((index, name.as_str(), file));
    }
    let described: Vec<(&str, ClipFile)> = found.iter().map(|(_, n, f)| (*n, f.clone())).collect();
    let (cfg, order) = clip_layout(kind, &described).map_err(ModelError::Invalid)?;
    let mut ordered = Vec::with_capacity(order.len());
    for (slot, &i) in order.iter().enumerate() {
        let (index, name, file) = &found[i];
        check_clip(index, &file.prefix, &cfg.text[slot]).map_err(|e| ModelError::Invalid(format!("{name}: {e}")))?;
        ordered.push((files[i].0.clone(), file.prefix.clone()));
    }
    let first = &files[order[0]];
    let models = cache
        .get_text(&ordered, &cfg)
        .map_err(|e| ModelError::from_load(e, &first.0, &first.1))?;
    Ok(TextEncoder::from_files(models, ordered))
}

/// The weights of `UNETLoader`'s `weight_dtype` choices weft accepts. weft computes in
/// float32 on the CPU, holding the file's precision (float16 / bfloat16 on a GPU, as for
/// checkpoints): the fp8 choices load and compute exactly as `default`.
pub const WEIGHT_DTYPES: &[&str] = &["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interrupt::Interrupt;
    use crate::models::safetensors::write_f32_safetensors;
    use crate::models::separate::write_split;
    use crate::models::write_random_checkpoint;
    use candle_core::{Device, Tensor};

    fn split(cfg: &ModelConfig, dir: &Path) -> crate::models::separate::SplitFiles {
        let ckpt = dir.join("ckpt.safetensors");
        write_random_checkpoint(&ckpt, cfg, 5).unwrap();
        let index = SafetensorsIndex::open(&ckpt, DEFAULT_MAX_HEADER).unwrap();
        write_split(&index, cfg, dir, "tiny").unwrap()
    }

    /// Rewrites the UNet file `src` with every key renamed by `rename`, into `dst`.
    fn renamed(src: &Path, dst: &Path, rename: impl Fn(&str) -> Option<String>) {
        let index = SafetensorsIndex::open(src, DEFAULT_MAX_HEADER).unwrap();
        let tensors: Vec<_> = index
            .tensors
            .iter()
            .filter_map(|(k, t)| Some((rename(k)?, t.shape.clone(), index.read_f32(k).unwrap())))
            .collect();
        write_f32_safetensors(dst, &tensors, &Default::default()).unwrap();
    }

    #[test]
    fn split_sdxl_files_compute_exactly_as_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ModelConfig::tiny_sdxl();
        let files = split(&cfg, dir.path());
        let cache = ModelCache::new(u64::MAX, Device::Cpu);
        let ckpt = crate::diffusion::load_checkpoint(&cache, &dir.path().join("ckpt.safetensors"), "ckpt").unwrap();
        let whole_text = TextEncoder::new(ckpt.clone(), dir.path().join("ckpt.safetensors"));
        let named = |p: &PathBuf| (p.clone(), p.file_name().unwrap().to_string_lossy().to_string());
        // CLIP-G first: DualCLIPLoader tells them apart by their tensors.
        let pair = [named(&files.text[1].1), named(&files.text[0].1)];
        let text = load_clip(&cache, &pair, ClipKind::Sdxl).unwrap();
        let a = whole_text.encode("a red apple", None, Interrupt::NEVER).unwrap();
        let b = text.encode("a red apple", None, Interrupt::NEVER).unwrap();
        assert_eq!(crate::max_abs_diff(&a.context, &b.context), 0.0);
        assert_eq!(
            crate::max_abs_diff(a.pooled.as_ref().unwrap(), b.pooled.as_ref().unwrap()),
            0.0
        );

        let x = Tensor::randn(0f32, 1.0, (1, 4, 8, 8), &Device::Cpu).unwrap();
        let y = Tensor::randn(0f32, 1.0, (1, cfg.adm_in_channels.unwrap()), &Device::Cpu).unwrap();
        let whole = DiffusionModel::new(ckpt, dir.path().join("ckpt.safetensors"));
        let want = whole.unet().forward(&x, 500.0, &a.context, Some(&y)).unwrap();
        let diffusers = dir.path().join("diffusers.safetensors");
        renamed(&files.unet, &diffusers, |k| {
            crate::models::ldm_to_candle(&format!("model.diffusion_model.{k}"), &cfg).map(|(_, n)| n)
        });
        let prefixed = dir.path().join("prefixed.safetensors");
        renamed(&files.unet, &prefixed, |k| Some(format!("model.diffusion_model.{k}")));
        for (file, keys) in [
            (&files.unet, UnetKeys::Bare),
            (&prefixed, UnetKeys::Prefixed),
            (&diffusers, UnetKeys::Diffusers),
        ] {
            let model = load_unet(&cache, file, "unet").unwrap();
            assert_eq!(model.checkpoint.config, cfg, "{keys:?}");
            let got = model.unet().forward(&x, 500.0, &b.context, Some(&y)).unwrap();
            assert_eq!(crate::max_abs_diff(&want, &got), 0.0, "{keys:?}");
        }
    }

    #[test]
    fn files_that_do_not_fit_are_refused_with_what_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let files = split(&ModelConfig::tiny_sdxl(), dir.path());
        let cache = ModelCache::new(u64::MAX, Device::Cpu);
        let named = |p: &PathBuf| (p.clone(), p.file_name().unwrap().to_string_lossy().to_string());
        let l = named(&files.text[0].1);
        let twice = load_clip(&cache, &[l.clone(), l.clone()], ClipKind::Sdxl)
            .err()
            .unwrap();
        assert_eq!(twice.code(), "invalid_model");
        assert!(twice.to_string().contains("one CLIP-L and one CLIP-G"), "{twice}");
        let unet_as_clip = load_clip(&cache, &[named(&files.unet)], ClipKind::StableDiffusion)
            .err()
            .unwrap();
        assert_eq!(unet_as_clip.code(), "invalid_model", "{unet_as_clip}");
        let clip_as_unet = load_unet(&cache, &files.text[0].1, "clip").err().unwrap();
        assert_eq!(clip_as_unet.code(), "invalid_model", "{clip_as_unet}");
        // tiny-sdxl's three-layer CLIP-L is no SD1 encoder; its CLIP-G is the refiner's.
        assert!(load_clip(&cache, &[l], ClipKind::StableDiffusion).is_err());
        let refiner = load_clip(&cache, &[named(&files.text[1].1)], ClipKind::StableDiffusion).unwrap();
        assert_eq!(refiner.models.config, ModelConfig::tiny_sdxl_refiner());
        let bytes = std::fs::read(&files.unet).unwrap();
        let cut = dir.path().join("cut.safetensors");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        assert_eq!(load_unet(&cache, &cut, "cut").err().unwrap().code(), "invalid_model");
        assert!(ClipKind::of("flux", 2).unwrap_err().contains("sdxl"));
        assert!(ClipKind::of("sd3", 1).unwrap_err().contains("stable_diffusion"));
    }
}
