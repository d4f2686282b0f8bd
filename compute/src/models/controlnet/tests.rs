//! The ControlNet against ComfyUI's `comfy.cldm.cldm.ControlNet` on a reduced SD1.x layout
//! (`tests/fixtures/controlnet/`, written by `make_controlnet_component.py`), in every file
//! layout ComfyUI reads, and its refusals of other files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use super::{load, rename_original, ControlNetKeys};
use crate::interrupt::Interrupt;
use crate::models::layout::ModelConfig;
use crate::models::safetensors::{write_f32_safetensors, CheckpointError, SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::sampling::TorchGenerator;

/// Named tensors with their shapes, as the safetensors writer takes them.
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

pub(crate) fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/controlnet")
}

/// The fixture's SD1.x network's tensors under their original names, drawn as the generator
/// script draws them, and the timestep.
fn fixture_weights() -> (Tensors, f64) {
    drawn_weights("tensors", 0)
}

/// The tensors `list` of `layout.json`, drawn from the generator seeded with the fixture's
/// seed plus `offset`, and the timestep.
fn drawn_weights(list: &str, offset: u64) -> (Tensors, f64) {
    let text = std::fs::read_to_string(fixtures().join("layout.json")).expect("layout.json");
    let layout: serde_json::Value = serde_json::from_str(&text).expect("layout JSON");
    let mut g = TorchGenerator::new(layout["seed"].as_u64().expect("seed") + offset);
    let tensors = layout[list]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|entry| {
            let key = entry[0].as_str().expect("key").to_string();
            let shape: Vec<usize> = entry[1]
                .as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_u64().expect("dim") as usize)
                .collect();
            let n: usize = shape.iter().product();
            let r = g.randn(n);
            let data = if shape.len() >= 2 {
                let scale = 1.0 / ((n / shape[0]) as f64).sqrt();
                r.iter().map(|v| (f64::from(*v) * scale) as f32).collect()
            } else if key.ends_with(".weight") {
                r.iter().map(|v| 1.0 + 0.1 * v).collect()
            } else {
                r.iter().map(|v| 0.1 * v).collect()
            };
            (key, shape, data)
        })
        .collect();
    (tensors, layout["timestep"].as_f64().expect("timestep"))
}

/// Writes the fixture's SD1.x network in layout `keys` into `dir`; its path and timestep.
pub(crate) fn write_fixture(dir: &Path, keys: ControlNetKeys) -> (PathBuf, f64) {
    let (tensors, timestep) = fixture_weights();
    let cfg = ModelConfig::tiny();
    let renamed: Vec<_> = tensors
        .into_iter()
        .map(|(k, s, d)| (rename_original(&k, keys, &cfg).expect("mapped"), s, d))
        .collect();
    let path = dir.join(format!("{keys:?}.safetensors"));
    write_f32_safetensors(&path, &renamed, &BTreeMap::new()).expect("write");
    (path, timestep)
}

pub(crate) fn reference(name: &str) -> Tensor {
    let index = SafetensorsIndex::open(&fixtures().join("component.safetensors"), DEFAULT_MAX_HEADER).expect("fixture");
    let shape = index.tensors[name].shape.clone();
    Tensor::from_vec(index.read_f32(name).expect("read"), shape, &Device::Cpu).expect("tensor")
}

/// The residuals of the network in `path` on the fixture's inputs, against ComfyUI's.
fn assert_matches_comfyui(path: &Path, timestep: f64) {
    let net = load(path, &Device::Cpu).expect("load").net;
    let (x, hint, context) = (reference("x"), reference("hint"), reference("context"));
    let got = net
        .forward((&x, &hint), timestep, (&context, None), Interrupt::NEVER)
        .expect("forward");
    let mut compared = got
        .output
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("output.{i}"), t))
        .collect::<Vec<_>>();
    compared.push(("middle.0".to_string(), &got.middle[0]));
    assert_eq!(got.output.len(), 4);
    for (name, got) in compared {
        let want = reference(&name);
        let got = got.as_ref().expect("a residual");
        assert_eq!(got.dims(), want.dims(), "{name}");
        let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let worst = crate::max_abs_diff(got, &want);
        assert!(scale > 0.1, "{name}: a degenerate output proves nothing");
        assert!(worst <= 1e-5 * scale, "{name}: {worst} against {scale}");
    }
}

#[test]
fn controlnet_matches_comfyui_cldm() {
    let dir = tempfile::tempdir().unwrap();
    let (path, timestep) = write_fixture(dir.path(), ControlNetKeys::Original);
    assert_matches_comfyui(&path, timestep);
}

#[test]
fn every_key_layout_loads_to_the_same_network() {
    let dir = tempfile::tempdir().unwrap();
    for keys in [ControlNetKeys::Prefixed, ControlNetKeys::Diffusers] {
        let (path, timestep) = write_fixture(dir.path(), keys);
        assert_eq!(load(&path, &Device::Cpu).expect("load").keys, keys);
        assert_matches_comfyui(&path, timestep);
    }
}

/// A file's load error, as the `CheckpointError` it holds.
fn load_error(tensors: &[(&str, Vec<usize>)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("foreign.safetensors");
    let tensors: Vec<_> = tensors
        .iter()
        .map(|(k, s)| (k.to_string(), s.clone(), vec![0.0; s.iter().product()]))
        .collect();
    write_f32_safetensors(&path, &tensors, &BTreeMap::new()).unwrap();
    let err = load(&path, &Device::Cpu).err().expect("refused");
    let checkpoint = err.downcast_ref::<CheckpointError>().expect("a checkpoint error");
    assert!(matches!(checkpoint, CheckpointError::WrongArch { .. }), "{checkpoint}");
    checkpoint.to_string()
}

#[test]
fn foreign_files_are_refused_with_what_they_hold() {
    let message = load_error(&[("first_stage_model.encoder.conv_in.weight", vec![4, 3, 3, 3])]);
    assert!(message.contains("no ControlNet tensors"), "{message}");
    let message = load_error(&[("controlnet_blocks.0.weight", vec![4, 4])]);
    assert!(message.contains("transformer model"), "{message}");
    let message = load_error(&[
        ("task_embedding", vec![8, 32]),
        ("zero_convs.0.0.weight", vec![4, 4, 1, 1]),
    ]);
    assert!(message.contains("union"), "{message}");
}

#[test]
fn a_controlnet_missing_tensors_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (tensors, _) = fixture_weights();
    let kept: Vec<_> = tensors
        .into_iter()
        .filter(|(k, _, _)| !k.starts_with("zero_convs.2."))
        .collect();
    let path = dir.path().join("partial.safetensors");
    write_f32_safetensors(&path, &kept, &BTreeMap::new()).unwrap();
    let err = load(&path, &Device::Cpu).err().expect("refused");
    let message = format!("{err:#}");
    assert!(message.contains("not a complete ControlNet"), "{message}");
}

#[test]
fn a_truncated_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.safetensors");
    std::fs::write(&path, [1u8, 2, 3]).unwrap();
    let err = load(&path, &Device::Cpu).err().expect("refused");
    assert!(err.downcast_ref::<CheckpointError>().is_some(), "{err:#}");
}

/// A reduced SDXL ControlNet (label embedding, linear projections, deeper transformers)
/// against ComfyUI's, in the original layout and diffusers'.
#[test]
fn an_sdxl_controlnet_matches_comfyui_cldm() {
    let dir = tempfile::tempdir().unwrap();
    let (tensors, timestep) = drawn_weights("sdxl_tensors", 1);
    let cfg = ModelConfig::tiny_sdxl();
    let (x, hint, context, y) = (
        reference("sdxl.x"),
        reference("sdxl.hint"),
        reference("sdxl.context"),
        reference("sdxl.y"),
    );
    for keys in [ControlNetKeys::Original, ControlNetKeys::Diffusers] {
        let renamed: Vec<_> = tensors
            .iter()
            .map(|(k, s, d)| (rename_original(k, keys, &cfg).expect("mapped"), s.clone(), d.clone()))
            .collect();
        let path = dir.path().join(format!("sdxl-{keys:?}.safetensors"));
        write_f32_safetensors(&path, &renamed, &BTreeMap::new()).unwrap();
        let net = load(&path, &Device::Cpu).expect("load").net;
        assert_eq!(net.config().adm_in_channels, cfg.adm_in_channels);
        let got = net
            .forward((&x, &hint), timestep, (&context, Some(&y)), Interrupt::NEVER)
            .expect("forward");
        assert_eq!(got.output.len(), 9);
        let mut compared: Vec<(String, &Option<Tensor>)> = got
            .output
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("sdxl.output.{i}"), t))
            .collect();
        compared.push(("sdxl.middle.0".to_string(), &got.middle[0]));
        for (name, got) in compared {
            let want = reference(&name);
            let got = got.as_ref().expect("a residual");
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let worst = crate::max_abs_diff(got, &want);
            assert!(scale > 0.1, "{name}: a degenerate output proves nothing");
            assert!(worst <= 1e-5 * scale, "{keys:?} {name}: {worst} against {scale}");
        }
    }
}
