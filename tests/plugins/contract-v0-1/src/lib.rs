//! A plugin built against the frozen `weft:node@0.1.0` contract with raw `wit-bindgen`
//! bindings (the SDK follows the newest contract), so the host's support for the first
//! contract stays tested:
//!
//! * `LegacyInvert` inverts an `IMAGE` through 0.1.0's `images.invert`, reporting progress;
//! * `LegacyDescribe` describes whatever it is given (`*`), reading 0.1.0's resources
//!   (a `MODEL`'s name, a `CONDITIONING`'s length, an `IMAGE`'s size).

wit_bindgen::generate!({
    path: "../../../wit/weft-node-0.1.0",
    world: "plugin",
});

use weft::node::types::{InputSpec, OutputSpec, Value};
use weft::node::{host, images};

fn input(name: &str, type_name: &str) -> InputSpec {
    InputSpec {
        name: name.into(),
        type_name: type_name.into(),
        required: true,
        default: None,
        min: None,
        max: None,
        step: None,
        options: Vec::new(),
        multiline: false,
        tooltip: None,
    }
}

fn output(type_name: &str) -> OutputSpec {
    OutputSpec {
        type_name: type_name.into(),
        name: type_name.into(),
        is_list: false,
        tooltip: None,
    }
}

fn node(class: &str, inputs: Vec<InputSpec>, outputs: Vec<OutputSpec>) -> NodeDef {
    NodeDef {
        class_type: class.into(),
        display_name: class.into(),
        category: "testing/contract-0.1.0".into(),
        description: "A node built against weft:node@0.1.0.".into(),
        inputs,
        outputs,
        output_node: false,
        deterministic: true,
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Int(i) => format!("INT {i}"),
        Value::Float(f) => format!("FLOAT {f}"),
        Value::Boolean(b) => format!("BOOLEAN {b}"),
        Value::Text(s) => format!("STRING {s}"),
        Value::Json(j) => format!("JSON {j}"),
        Value::Asset(a) => format!("ASSET {}", a.id),
        Value::Image(i) => format!("IMAGE {}x{}x{}", i.batch_size(), i.width(), i.height()),
        Value::Latent(l) => format!("LATENT {}x{}x{}", l.batch_size(), l.width(), l.height()),
        Value::Mask(m) => format!("MASK {}x{}x{}", m.batch_size(), m.width(), m.height()),
        Value::Audio(a) => format!("AUDIO {}", a.frames()),
        Value::Model(m) => format!("MODEL {}", m.name()),
        Value::Clip(c) => format!("CLIP {}", c.name()),
        Value::Vae(v) => format!("VAE {}", v.name()),
        Value::Conditioning(c) => format!("CONDITIONING {}", c.len()),
    }
}

fn take(inputs: Vec<NamedValue>, name: &str) -> Result<Value, NodeError> {
    inputs
        .into_iter()
        .find(|v| v.name == name)
        .map(|v| v.value)
        .ok_or_else(|| NodeError {
            code: "invalid_input".into(),
            message: format!("missing input `{name}`"),
        })
}

struct Plugin;

impl Guest for Plugin {
    fn describe() -> Vec<NodeDef> {
        vec![
            node("LegacyInvert", vec![input("image", "IMAGE")], vec![output("IMAGE")]),
            node("LegacyDescribe", vec![input("value", "*")], vec![output("STRING")]),
        ]
    }

    fn execute(class_type: String, inputs: Vec<NamedValue>) -> Result<NodeResult, NodeError> {
        let outputs = match class_type.as_str() {
            "LegacyInvert" => match take(inputs, "image")? {
                Value::Image(image) => {
                    host::progress(1, 1, Some("inverted by a 0.1.0 plugin"));
                    vec![Value::Image(images::invert(&image))]
                }
                other => {
                    return Err(NodeError {
                        code: "invalid_input".into(),
                        message: format!("expected IMAGE, got {}", describe(&other)),
                    })
                }
            },
            "LegacyDescribe" => vec![Value::Text(describe(&take(inputs, "value")?))],
            other => {
                return Err(NodeError {
                    code: "unknown_class".into(),
                    message: format!("no class {other}"),
                })
            }
        };
        Ok(NodeResult {
            outputs,
            files: Vec::new(),
        })
    }
}

export!(Plugin);
