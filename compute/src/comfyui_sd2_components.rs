//! SD2's components against ComfyUI itself: the fixtures of
//! `tests/fixtures/sd2-components/` were made by ComfyUI imported as a library
//! (`make_components.py` there).
//! - `clip_h.safetensors`: a reduced OpenCLIP ViT-H (ComfyUI's `SD2ClipHModel`) under SD2's
//!   prefix, and what `CLIPTextEncode` gives for two prompts: token ids padded with 0, the
//!   penultimate layer with the final norm applied;
//! - `detection.safetensors`: values of the tensor that tells SD2 v-prediction from eps,
//!   with ComfyUI's verdict on each, and the UNet config ComfyUI detects from a UNet of
//!   weft's tiny SD2 layout.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use super::diffusion::lora::load_component;
use super::diffusion::prompt::{encode_with, tokenize_for, EncodeSpec, Token};
use super::interrupt::Interrupt;
use super::models::layout::{sd2_predicts_v, ClipConfig, SD2_CLIP_H_PREFIX, SD2_V_PROBE, UNET_PREFIX};
use super::models::safetensors::{write_f32_safetensors, SafetensorsIndex, DEFAULT_MAX_HEADER};
use super::models::{ClipText, Component, ModelConfig};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/sd2-components")
        .join(name)
}

/// Every tensor of a fixture file.
fn tensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    Ok(candle_core::safetensors::load(path, &Device::Cpu)?)
}

/// The fixture's metadata entries.
fn metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    let bytes = std::fs::read(path)?;
    let len = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len])?;
    Ok(serde_json::from_value(header["__metadata__"].clone())?)
}

#[test]
fn openclip_h_penultimate_normed_encoding_and_zero_padding_match_comfyui() -> Result<()> {
    let path = fixture("clip_h.safetensors");
    let clip = ClipConfig {
        width: 8,
        layers: 3,
        heads: 2,
        intermediate: 32,
        ..ClipConfig::vit_h(SD2_CLIP_H_PREFIX)
    };
    let cfg = ModelConfig {
        text: vec![clip.clone()],
        ..ModelConfig::tiny_sd2()
    };
    let weights = load_component(&path, &cfg, Component::Clip(0), &Device::Cpu)?;
    let model = ClipText::new(VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu), &clip)?;
    let io = tensors(&path)?;
    let ids: Vec<Vec<u32>> = io
        .get("input.tokens")
        .context("tokens")?
        .to_dtype(DType::U32)?
        .to_vec2()?;
    let want = io.get("output.penultimate").context("penultimate")?;
    let prompts: Vec<String> = serde_json::from_str(metadata(&path)?.get("prompts").context("prompts")?)?;
    // What CLIPTextEncode does with an SD2 CLIP, as `TextEncoder` configures it.
    let spec = EncodeSpec {
        layers: (clip.layers as i32 + clip.default_layer + 1) as usize,
        norm_hidden: clip.norm_hidden,
        pad_token: clip.pad_token,
        pooled: clip.projection,
    };
    for (row, prompt) in prompts.iter().enumerate() {
        let chunks = tokenize_for(prompt, None, clip.name)?;
        // ComfyUI's ids up to the end token are weft's; 0 fills the rest.
        let end = ids[row].iter().position(|&t| t == 49407).context("an end token")?;
        let ours: Vec<u32> = chunks[0][..=end]
            .iter()
            .map(|(t, _)| match t {
                Token::Id(id) => *id,
                Token::Vector(..) => u32::MAX,
            })
            .collect();
        assert_eq!(ours, ids[row][..=end], "{prompt}");
        assert!(ids[row][end + 1..].iter().all(|&t| t == 0), "{prompt}: {:?}", ids[row]);
        let (hidden, pooled) = encode_with(&model, &spec, &chunks, Interrupt::NEVER)?;
        assert!(pooled.is_none());
        let want = want.narrow(0, row, 1)?;
        let scale = want.abs()?.max_all()?.to_scalar::<f32>()?;
        let worst = crate::max_abs_diff(&hidden, &want);
        assert!(scale > 0.1, "a degenerate output proves nothing");
        assert!(worst <= 1e-5 * scale.max(1.0), "{prompt}: {worst} against {scale}");
    }
    Ok(())
}

#[test]
fn sd2_prediction_and_tiny_layout_are_detected_as_comfyui_does() -> Result<()> {
    let path = fixture("detection.safetensors");
    let meta = metadata(&path)?;
    let verdicts: BTreeMap<String, String> = serde_json::from_str(meta.get("verdicts").context("verdicts")?)?;
    let io = tensors(&path)?;
    let dir = tempfile::tempdir()?;
    assert_eq!(verdicts.len(), io.len());
    for (case, verdict) in &verdicts {
        let values: Vec<f32> = io.get(case).context("case")?.to_dtype(DType::F32)?.to_vec1()?;
        let file = dir.path().join(format!("{case}.safetensors"));
        let probe = format!("{UNET_PREFIX}{SD2_V_PROBE}");
        write_f32_safetensors(&file, &[(probe, vec![values.len()], values)], &Default::default())?;
        let index = SafetensorsIndex::open(&file, DEFAULT_MAX_HEADER)?;
        let v = sd2_predicts_v(&index).map_err(anyhow::Error::msg)?;
        assert_eq!(v, verdict == "V_PREDICTION", "{case}: ComfyUI says {verdict}");
    }
    // The config ComfyUI detects from a UNet of weft's tiny SD2 layout.
    let detected: serde_json::Value = serde_json::from_str(meta.get("detected_unet_config").context("config")?)?;
    let tiny = ModelConfig::tiny_sd2();
    assert_eq!(detected["model_channels"], tiny.model_channels);
    assert_eq!(detected["channel_mult"], serde_json::json!(tiny.channel_mult));
    assert_eq!(
        detected["num_res_blocks"],
        serde_json::json!(vec![tiny.num_res_blocks; 4])
    );
    assert_eq!(detected["transformer_depth"], serde_json::json!(tiny.transformer_depth));
    assert_eq!(
        detected["transformer_depth_output"],
        serde_json::json!(tiny.transformer_depth_output)
    );
    assert_eq!(detected["transformer_depth_middle"], 1);
    assert_eq!(detected["context_dim"], tiny.context_dim);
    assert_eq!(detected["use_linear_in_transformer"], tiny.linear_projection);
    assert_eq!(detected["adm_in_channels"], serde_json::Value::Null);
    assert_eq!(meta.get("family_at_real_widths").map(String::as_str), Some("SD20"));
    Ok(())
}
