//! Every case of `tests/fixtures/inpaint/inpaint_units.json`, computed by ComfyUI's own
//! `InpaintModelConditioning` and `BaseModel.concat_cond`, against weft's.

use serde_json::Value;

use super::*;
use crate::diffusion::latent::plain;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/inpaint/inpaint_units.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    let data = v["data"].as_array().unwrap();
    data.iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn shape(v: &Value) -> Vec<usize> {
    let dims = v["shape"].as_array().unwrap();
    dims.iter().map(|x| x.as_u64().unwrap() as usize).collect()
}

/// A `[batch, height, width]` mask of the fixture.
fn mask(v: &Value) -> MaskBatch {
    let s = shape(v);
    MaskBatch {
        batch: s[0] as u32,
        height: s[1] as u32,
        width: s[2] as u32,
        data: floats(v),
    }
}

/// Float32 rounding: a few units in the last place of the values' scale (the resizes sum
/// their taps in another order than torch's vector code).
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= scale * 1e-6, "{what}: value {i} is {g}, ComfyUI's {w}");
    }
}

#[test]
fn inpaint_model_conditioning_greys_and_masks_as_comfyui() {
    let fixture = fixture();
    for (n, case) in fixture["inpaint_model_conditioning"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let s = shape(&case["pixels"]);
        let pixels = ImageBatch {
            batch: s[0] as u32,
            height: s[1] as u32,
            width: s[2] as u32,
            channels: 3,
            data: floats(&case["pixels"]),
        };
        let (grey, cells) = prepare_inpaint_pixels(&pixels, &mask(&case["mask"])).unwrap();
        let want = shape(&case["grey"]);
        assert_eq!(
            [grey.batch, grey.height, grey.width].map(|d| d as usize),
            [want[0], want[1], want[2]],
            "case {n}: grey size"
        );
        assert_close(&grey.data, &floats(&case["grey"]), &format!("case {n}: grey pixels"));
        // The attached mask is `[batch, 1, height, width]`, the noise mask the same.
        let want = shape(&case["concat_mask"]);
        assert_eq!(
            [cells.batch, 1, cells.height, cells.width].map(|d| d as usize).to_vec(),
            want,
            "case {n}: mask size"
        );
        assert_close(&cells.data, &floats(&case["concat_mask"]), &format!("case {n}: mask"));
        if case["noise_mask"] == true {
            assert_eq!(case["latent_noise_mask"], case["concat_mask"], "case {n}");
        }
    }
}

#[test]
fn an_inpainting_models_extra_input_is_built_as_comfyuis_concat_cond() {
    let fixture = fixture();
    let scale = 0.18215f32;
    let process_in = |d: &[f32], _plane: usize| d.iter().map(|v| v * scale).collect::<Vec<f32>>();
    for (n, case) in fixture["concat_cond"].as_array().unwrap().iter().enumerate() {
        let dims: Vec<usize> = case["noise_shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let shape4 = [dims[0], dims[1], dims[2], dims[3]];
        let mut latent = plain(shape4.map(|d| d as u32), floats(&case["latent"]));
        latent.noise_mask = case.get("latent_noise_mask").map(|m| Arc::new(mask(m)));
        let latent_in = process_in(&latent.data, dims[2] * dims[3]);
        let denoise = noise_mask(&latent, &dims);
        let base = Conditioning::from_context(
            candle_core::Tensor::zeros((1, 1, 1), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
        );
        let mut entry = base.0[0].clone();
        entry.concat_latent_image = case
            .get("concat_latent_image")
            .map(|t| Arc::new(Tensor::new(shape(t), floats(t))));
        entry.concat_mask = case.get("concat_mask").map(|m| Arc::new(mask(m)));
        let source = ConcatSource {
            latent: &latent_in,
            denoise_mask: denoise.as_deref(),
            shape: shape4,
        };
        let got = build_concat(&entry, &source, &process_in).unwrap();
        let want = &case["c_concat"];
        assert_eq!(shape(want), vec![dims[0], dims[1] + 1, dims[2], dims[3]], "case {n}");
        assert_close(&got, &floats(want), &format!("case {n}: c_concat"));
    }
}
