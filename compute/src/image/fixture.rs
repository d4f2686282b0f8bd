//! The ComfyUI image-node fixture (`tests/fixtures/image-nodes`, written by its
//! `make_image_nodes.py`), for the tests that compare each operation with ComfyUI's own.

use std::collections::HashMap;

use serde_json::Value;

use super::{ImageBatch, MaskBatch};

/// One run of a ComfyUI node: its class, its inputs and what it returned.
pub(crate) struct Case {
    /// The class name.
    pub(crate) node: String,
    /// Inputs by name: literals, or `{"tensor": name}`.
    pub(crate) inputs: Value,
    /// Outputs in order: `{"tensor": name}`, `{"shape": [...]}` or a literal.
    pub(crate) outputs: Vec<Value>,
}

/// The fixture's tensors (shape and float32 values) and cases.
pub(crate) struct Fixture {
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
    cases: Vec<Case>,
}

impl Fixture {
    /// Reads the committed fixture.
    pub(crate) fn load() -> Self {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/image-nodes");
        let loaded = candle_core::safetensors::load(dir.join("image_nodes.safetensors"), &candle_core::Device::Cpu)
            .expect("the fixture's tensors load");
        let tensors = loaded
            .into_iter()
            .map(|(name, t)| {
                let shape = t.dims().to_vec();
                let flat = t.flatten_all().unwrap();
                // Large tensors on the 8-bit grid are stored as their bytes `k` for `k / 255`.
                let values = match flat.dtype() {
                    candle_core::DType::U8 => flat
                        .to_vec1::<u8>()
                        .unwrap()
                        .into_iter()
                        .map(|k| f32::from(k) / 255.0)
                        .collect(),
                    _ => flat.to_vec1::<f32>().unwrap(),
                };
                (name, (shape, values))
            })
            .collect();
        let text = std::fs::read_to_string(dir.join("cases.json")).expect("cases.json is readable");
        let json: Value = serde_json::from_str(&text).unwrap();
        let cases = json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| Case {
                node: c["node"].as_str().unwrap().to_string(),
                inputs: c["inputs"].clone(),
                outputs: c["outputs"].as_array().unwrap().clone(),
            })
            .collect();
        Fixture { tensors, cases }
    }

    /// The cases of class `node` (at least one).
    pub(crate) fn cases(&self, node: &str) -> Vec<&Case> {
        let cases: Vec<&Case> = self.cases.iter().filter(|c| c.node == node).collect();
        assert!(!cases.is_empty(), "the fixture has cases of {node}");
        cases
    }

    /// The tensor `reference` (`{"tensor": name}`) names.
    pub(crate) fn tensor(&self, reference: &Value) -> (&[usize], &[f32]) {
        let name = reference["tensor"].as_str().expect("a tensor reference");
        let (shape, data) = &self.tensors[&format!("in.{name}")];
        (shape, data)
    }

    /// Output `index` of `case`, a tensor.
    pub(crate) fn output(&self, case: &Case, index: usize) -> (&[usize], &[f32]) {
        let name = case.outputs[index]["tensor"].as_str().expect("a tensor output");
        let (shape, data) = &self.tensors[name];
        (shape, data)
    }

    /// Input `name` of `case`, an image `[batch, height, width, channels]`.
    pub(crate) fn image(&self, case: &Case, name: &str) -> ImageBatch {
        let (shape, data) = self.tensor(&case.inputs[name]);
        ImageBatch {
            batch: shape[0] as u32,
            height: shape[1] as u32,
            width: shape[2] as u32,
            channels: shape[3] as u32,
            data: data.to_vec(),
        }
    }

    /// Input `name` of `case`, a mask `[batch, height, width]`.
    pub(crate) fn mask(&self, case: &Case, name: &str) -> MaskBatch {
        let (shape, data) = self.tensor(&case.inputs[name]);
        MaskBatch {
            batch: shape[0] as u32,
            height: shape[1] as u32,
            width: shape[2] as u32,
            data: data.to_vec(),
        }
    }

    /// Checks `image` against image output `index` of `case`: shape exactly, values to
    /// within `tolerance` (relative, absolute below 1).
    pub(crate) fn check_image(&self, case: &Case, index: usize, image: &ImageBatch, tolerance: f32) {
        let (shape, want) = self.output(case, index);
        let got_shape = [image.batch, image.height, image.width, image.channels].map(|v| v as usize);
        assert_eq!(shape, got_shape, "{}: shape, inputs {}", case.node, case.inputs);
        assert_close(&image.data, want, tolerance, case);
    }

    /// Checks `mask` against mask output `index` of `case`, as [`Fixture::check_image`].
    pub(crate) fn check_mask(&self, case: &Case, index: usize, mask: &MaskBatch, tolerance: f32) {
        let (shape, want) = self.output(case, index);
        let got_shape = [mask.batch, mask.height, mask.width].map(|v| v as usize);
        assert_eq!(shape, got_shape, "{}: shape, inputs {}", case.node, case.inputs);
        assert_close(&mask.data, want, tolerance, case);
    }
}

/// Asserts every value of `got` is within `tolerance` of `want` (relative, absolute below 1).
fn assert_close(got: &[f32], want: &[f32], tolerance: f32, case: &Case) {
    assert_eq!(got.len(), want.len(), "{}: length", case.node);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance * w.abs().max(1.0),
            "{}: value {i} is {g}, ComfyUI gives {w}; inputs {}",
            case.node,
            case.inputs
        );
    }
}

/// Input `name` of `case` as an unsigned integer.
pub(crate) fn uint(case: &Case, name: &str) -> u32 {
    case.inputs[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} is an integer")) as u32
}

/// Input `name` of `case` as a float.
pub(crate) fn float(case: &Case, name: &str) -> f64 {
    case.inputs[name]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} is a number"))
}

/// Input `name` of `case` as text.
pub(crate) fn text<'a>(case: &'a Case, name: &str) -> &'a str {
    case.inputs[name].as_str().unwrap_or_else(|| panic!("{name} is text"))
}

/// A `keep_going` that always says yes.
pub(crate) fn always() -> bool {
    true
}
