//! Areas and masks resolved and weighted as ComfyUI's sampler does it, against
//! `tests/fixtures/latent-nodes/latent_nodes.json` (`areas`: ComfyUI's own
//! `resolve_areas_and_cond_masks_multidim` and `get_area_and_mult` on a 2x4x9x13 latent).

use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde_json::Value;

use super::*;
use crate::diffusion::latent_ops::tests::{fixture, floats};

fn sizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

/// The fixture's entry as a one-entry conditioning, set by the nodes that set it.
fn entry(case: &Value) -> Conditioning {
    let context = Tensor::zeros((1, 1, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let plain = Conditioning::from_context(context);
    let strength = case["strength"].as_f64().unwrap();
    if let Some(f) = case["percentage"].as_array() {
        let f: Vec<f64> = f.iter().map(|v| v.as_f64().unwrap()).collect();
        return plain.set_area_fraction(f[1], f[0], f[3], f[2], strength);
    }
    let shape = sizes(&case["mask"]["shape"]);
    let mask = MaskBatch {
        batch: shape[0] as u32,
        height: shape[1] as u32,
        width: shape[2] as u32,
        data: floats(&case["mask"]["data"]),
    };
    let to_bounds = case["set_area_to_bounds"].as_bool().unwrap();
    plain
        .set_strength(strength)
        .set_mask(Arc::new(mask), case["mask_strength"].as_f64().unwrap(), to_bounds)
}

#[test]
fn areas_and_masks_weight_entries_as_comfyui_does() {
    let (batch, height, width) = (2, 9, 13);
    for (i, case) in fixture()["areas"].as_array().unwrap().iter().enumerate() {
        let resolved = resolve(&entry(case), height, width);
        let entry = &resolved.0[0];
        let region = region(entry.area, height, width).unwrap();
        if let Some(area) = case["area"].as_array() {
            let a: Vec<usize> = area.iter().map(|v| v.as_u64().unwrap() as usize).collect();
            assert_eq!(region, (a[2], a[3], a[0], a[1]), "case {i}: area");
        } else {
            assert_eq!(region, (0, 0, height, width), "case {i}: area");
        }
        let got = weights(entry, region, height, width, batch);
        let want = floats(&case["mult"]["data"]);
        assert_eq!(got.len(), want.len(), "case {i}: weights");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                "case {i}: weight {k} is {g}, ComfyUI's {w}"
            );
        }
    }
}

#[test]
fn a_later_area_undoes_mask_bounds() {
    let context = Tensor::zeros((1, 1, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let mask = Arc::new(MaskBatch {
        batch: 1,
        height: 2,
        width: 2,
        data: vec![0.0, 1.0, 0.0, 0.0],
    });
    let c = Conditioning::from_context(context)
        .set_mask(mask, 1.0, true)
        .set_area(64, 64, 0, 0, 1.0);
    assert!(!c.0[0].mask.as_ref().unwrap().to_bounds);
}
