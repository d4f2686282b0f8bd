//! The examples of README.md, compiled (and run where they need no host calls).

use weft_sdk::prelude::*;
use weft_sdk::{execute, NamedValue, Node, NodeEntry, Value};

weft_sdk::node! {
    /// Repeats a string, reporting progress.
    pub struct RepeatText {
        display_name: "Repeat Text",
        category: "utils/string",
        inputs {
            text: String = input::string().multiline(),
            times: i64 = input::int().default(2).min(0).max(1000).tooltip("How many copies."),
            separator: Option<String> = input::string(),
        }
        outputs { STRING: String, length: i64 }
        fn execute(ctx, inp) {
            let times = u32::try_from(inp.times)?; // a failed conversion is `invalid_input`
            let sep = inp.separator.unwrap_or_default();
            let mut parts = Vec::new();
            for i in 0..times {
                ctx.check_canceled()?;            // stops with code `canceled`
                ctx.progress(i + 1, times, "repeating");
                parts.push(inp.text.clone());
            }
            let out = parts.join(sep.as_str());
            let len = out.chars().count() as i64;
            Ok((out, len))
        }
    }
}

weft_sdk::node! {
    /// Saves the images.
    pub struct SaveImage {
        display_name: "Save Image",
        category: "image",
        output_node: true,
        inputs {
            images: Image = input::image(),
            filename_prefix: String = input::string().default("ComfyUI"),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_png(inp.filename_prefix, inp.images); // the host encodes PNGs
            Ok(())
        }
    }
}

#[test]
fn readme_definitions() {
    let def = RepeatText::definition();
    assert_eq!(def.inputs[1].tooltip.as_deref(), Some("How many copies."));
    assert!(!def.inputs[2].required);
    let names: Vec<_> = def
        .outputs
        .iter()
        .map(|o| (o.name.as_str(), o.type_name.as_str()))
        .collect();
    assert_eq!(names, [("STRING", "STRING"), ("length", "INT")]);

    let save = SaveImage::definition();
    assert!(save.output_node);
    assert!(save.outputs.is_empty());
    assert_eq!(save.inputs[0].type_name, "IMAGE");
}

#[test]
fn zero_times_needs_no_host() {
    let inputs = vec![
        NamedValue {
            name: "text".into(),
            value: Value::Text("x".into()),
        },
        NamedValue {
            name: "times".into(),
            value: Value::Int(0),
        },
    ];
    let r = execute(&[NodeEntry::of::<RepeatText>()], "RepeatText", inputs).unwrap();
    assert!(matches!(&r.outputs[0], Value::Text(s) if s.is_empty()));
    assert!(matches!(r.outputs[1], Value::Int(0)));
}
