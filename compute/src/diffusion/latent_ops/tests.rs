//! Every case of `tests/fixtures/latent-nodes/latent_nodes.json`, computed by ComfyUI's own
//! nodes, against weft's.

use serde_json::Value;

use super::*;
use crate::diffusion::latent::plain;

/// `tests/fixtures/latent-nodes/latent_nodes.json`.
pub(crate) fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/latent-nodes/latent_nodes.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A JSON array of numbers as float32s.
pub(crate) fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn shape4(v: &Value) -> [u32; 4] {
    let s: Vec<u32> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    s.try_into().unwrap()
}

/// A fixture's `LATENT` dict.
fn read_latent(v: &Value) -> LatentBatch {
    let samples = &v["samples"];
    let mut latent = plain(shape4(&samples["shape"]), floats(&samples["data"]));
    latent.batch_index = v["batch_index"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_u64().unwrap() as u32).collect());
    latent
}

/// Float32 rounding: a few units in the last place of the values' scale (torch sums a
/// resize's taps with vector instructions, in another order).
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= scale * 1e-6, "{what}: value {i} is {g}, ComfyUI's {w}");
    }
}

fn run(node: &str, inputs: &Value) -> LatentBatch {
    let one = || read_latent(&inputs["samples"]);
    let a = || read_latent(&inputs["samples1"]);
    let b = || read_latent(&inputs["samples2"]);
    let f = |k: &str| inputs[k].as_f64().unwrap();
    let u = |k: &str| inputs[k].as_u64().unwrap() as u32;
    match node {
        "LatentAdd" => combine(&a(), &b(), Combination::Add),
        "LatentSubtract" => combine(&a(), &b(), Combination::Subtract),
        "LatentInterpolate" => combine(&a(), &b(), Combination::Interpolate(f("ratio"))),
        "LatentBlend" => combine(&a(), &b(), Combination::Blend(f("blend_factor"))),
        "LatentBatch" => batch(&a(), &b()),
        "LatentMultiply" => transform(&one(), &Transform::Multiply(f("multiplier"))),
        "LatentBatchSeedBehavior" => transform(
            &one(),
            &Transform::SeedBehavior {
                fixed: inputs["seed_behavior"] == "fixed",
            },
        ),
        "LatentFlip" => transform(
            &one(),
            &Transform::Flip {
                horizontally: inputs["flip_method"].as_str().unwrap().starts_with('y'),
            },
        ),
        "LatentRotate" => {
            let quarters = ["none", "90 degrees", "180 degrees", "270 degrees"]
                .iter()
                .position(|r| inputs["rotation"] == *r)
                .unwrap() as u32;
            transform(&one(), &Transform::Rotate(quarters))
        }
        "LatentCrop" => transform(
            &one(),
            &Transform::Crop {
                width: u("width"),
                height: u("height"),
                x: u("x"),
                y: u("y"),
            },
        ),
        "LatentCompositeMasked" => {
            let mask = inputs.get("mask").map(|m| {
                let s: Vec<u32> = m["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as u32)
                    .collect();
                MaskBatch {
                    batch: s[0],
                    height: s[1],
                    width: s[2],
                    data: floats(&m["data"]),
                }
            });
            composite_masked(
                &read_latent(&inputs["destination"]),
                &read_latent(&inputs["source"]),
                (u("x"), u("y")),
                inputs["resize_source"].as_bool().unwrap(),
                mask.as_ref(),
                &|| true,
            )
        }
        other => panic!("no case for {other}"),
    }
    .unwrap()
}

#[test]
fn latent_nodes_match_comfyui() {
    let fixture = fixture();
    for (i, case) in fixture["cases"].as_array().unwrap().iter().enumerate() {
        let node = case["node"].as_str().unwrap();
        let what = format!("case {i} ({node})");
        let got = run(node, &case["inputs"]);
        let want = read_latent(&case["output"]);
        assert_eq!(got.shape, want.shape, "{what}: shape");
        assert_close(&got.data, &want.data, &what);
        assert_eq!(got.batch_index, want.batch_index, "{what}: noise indices");
    }
}

#[test]
fn interpolation_refuses_batches_comfyui_cannot_broadcast() {
    let a = plain([2, 4, 1, 1], vec![1.0; 8]);
    assert!(combine(&a, &a, Combination::Interpolate(0.5)).is_err());
}

#[test]
fn a_crop_that_leaves_nothing_fails() {
    let a = plain([1, 1, 2, 2], vec![1.0; 4]);
    let empty = Transform::Crop {
        width: 0,
        height: 64,
        x: 0,
        y: 0,
    };
    assert!(transform(&a, &empty).is_err());
}

#[test]
fn latents_of_other_channel_counts_are_refused() {
    let (a, b) = (plain([1, 4, 1, 1], vec![1.0; 4]), plain([1, 16, 1, 1], vec![1.0; 16]));
    assert!(combine(&a, &b, Combination::Add).is_err());
    assert!(batch(&a, &b).is_err());
}
