//! A plugin of `weft:node@0.2.0` whose declarations break the contract in every way
//! `weft plugin check` reports (raw bindings: the SDK would refuse most of them):
//!
//! * `BadTwice` is defined twice, and `stringlength` collides with the built-in
//!   `StringLength` (the names differ only in case);
//! * `BadDefault` has an INT default that is not an integer and a FLOAT default above its
//!   maximum;
//! * `BadRange` has an input whose min is greater than its max;
//! * `BadType` has an input of type `IMAGEE`, which nothing outputs.
//!
//! The server loads it anyway up to the duplicate: only `weft plugin check` names all.

wit_bindgen::generate!({
    path: "../../../wit/weft-node-0.2.0",
    world: "plugin",
});

use weft::node::types::{InputSpec, OutputSpec, Value};

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
        model_folder: None,
    }
}

fn node(class: &str, inputs: Vec<InputSpec>) -> NodeDef {
    NodeDef {
        class_type: class.into(),
        display_name: class.into(),
        category: "testing/contract".into(),
        description: "A class that breaks the contract.".into(),
        inputs,
        outputs: vec![OutputSpec {
            type_name: "STRING".into(),
            name: "STRING".into(),
            is_list: false,
            tooltip: None,
        }],
        output_node: false,
        deterministic: true,
    }
}

struct BadContract;

impl Guest for BadContract {
    fn describe() -> Vec<NodeDef> {
        vec![
            node("BadTwice", vec![]),
            node("BadTwice", vec![]),
            node("stringlength", vec![]),
            node(
                "BadDefault",
                vec![
                    InputSpec {
                        default: Some("\"ten\"".into()),
                        ..input("count", "INT")
                    },
                    InputSpec {
                        default: Some("5.0".into()),
                        min: Some(0.0),
                        max: Some(1.0),
                        ..input("ratio", "FLOAT")
                    },
                ],
            ),
            node(
                "BadRange",
                vec![InputSpec {
                    min: Some(10.0),
                    max: Some(1.0),
                    ..input("steps", "INT")
                }],
            ),
            node("BadType", vec![input("picture", "IMAGEE")]),
        ]
    }

    fn execute(_class_type: String, _inputs: Vec<NamedValue>) -> Result<NodeResult, NodeError> {
        Ok(NodeResult {
            outputs: vec![Value::Text("bad".into())],
            files: Vec::new(),
        })
    }
}

export!(BadContract);
