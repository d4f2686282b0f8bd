//! Native tests of `node!`: the generated definitions and input conversion.

use weft_sdk::{execute, AssetRef, InputValues, NamedValue, Node, NodeEntry, NodeError, Value};

weft_sdk::node! {
    /// Joins two strings with a delimiter.
    ///
    /// Second paragraph.
    pub struct StringConcatenate {
        display_name: "Concatenate",
        category: "utils/string",
        inputs {
            string_a: String = input::string().multiline(),
            string_b: String = input::string().multiline(),
            delimiter: String = input::string().default(""),
        }
        outputs { STRING: String }
        fn execute(ctx, inp) {
            Ok((format!("{}{}{}", inp.string_a, inp.delimiter, inp.string_b),))
        }
    }
}

weft_sdk::node! {
    /// Every kind of input.
    pub struct Everything {
        category: "test",
        deterministic: false,
        output_node: true,
        class_type: "Everything!",
        inputs {
            count: i64 = input::int().default(3).min(-5).max(100).step(1).tooltip("how many"),
            width: u32 = input::uint().default(512).min(1).max(16384),
            ratio: f64 = input::float().default(0.5).min(0.0).max(1.0).step(0.01),
            flag: bool = input::boolean().default(true),
            mode: String = input::combo(["a", "b"]),
            note: Option<String> = input::string(),
            asset: Option<AssetRef>,
            plain: Option<i64>,
            forced: Option<bool> = input::boolean().required(true),
        }
        outputs { INT: i64, FLOAT: f64, STRING: String, BOOLEAN: bool }
        fn execute(ctx, inp) {
            ctx.save_text("prefix", inp.mode.clone());
            let n = inp.count * i64::from(inp.width);
            let note = inp.note.unwrap_or_else(|| "none".into());
            Ok((n, inp.ratio, format!("{}:{note}", inp.mode), inp.flag))
        }
    }
}

weft_sdk::node! {
    /// Fails.
    struct Fails {
        inputs {}
        outputs {}
        fn execute(_, _) {
            let n: u8 = u8::try_from(300i64)?;
            let _ = n;
            Err(NodeError::new("never", "unreachable"))
        }
    }
}

const NODES: &[NodeEntry] = &[
    NodeEntry::of::<StringConcatenate>(),
    NodeEntry::of::<Everything>(),
    NodeEntry::of::<Fails>(),
];

fn nv(name: &str, value: Value) -> NamedValue {
    NamedValue {
        name: name.into(),
        value,
    }
}

#[test]
fn concatenate_definition() {
    let def = StringConcatenate::definition();
    assert_eq!(def.class_type, "StringConcatenate");
    assert_eq!(def.display_name, "Concatenate");
    assert_eq!(def.category, "utils/string");
    assert_eq!(
        def.description,
        "Joins two strings with a delimiter.\n\nSecond paragraph."
    );
    assert!(def.deterministic);
    assert!(!def.output_node);
    let names: Vec<_> = def.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["string_a", "string_b", "delimiter"]);
    assert!(def.inputs.iter().all(|i| i.type_name == "STRING" && i.required));
    assert!(def.inputs[0].multiline);
    assert!(!def.inputs[2].multiline);
    assert_eq!(def.inputs[0].default, None);
    assert_eq!(def.inputs[2].default.as_deref(), Some("\"\""));
    assert_eq!(def.outputs.len(), 1);
    assert_eq!(def.outputs[0].type_name, "STRING");
    assert_eq!(def.outputs[0].name, "STRING");
}

#[test]
fn everything_definition() {
    let def = Everything::definition();
    assert_eq!(def.class_type, "Everything!");
    assert_eq!(def.display_name, "Everything");
    assert!(!def.deterministic);
    assert!(def.output_node);
    let i = &def.inputs;
    assert_eq!(i[0].type_name, "INT");
    assert_eq!(i[0].default.as_deref(), Some("3"));
    assert_eq!((i[0].min, i[0].max, i[0].step), (Some(-5.0), Some(100.0), Some(1.0)));
    assert_eq!(i[0].tooltip.as_deref(), Some("how many"));
    assert_eq!(i[1].type_name, "INT");
    assert_eq!(i[1].default.as_deref(), Some("512"));
    assert_eq!(i[2].type_name, "FLOAT");
    assert_eq!(i[2].default.as_deref(), Some("0.5"));
    assert_eq!(i[2].step, Some(0.01));
    assert_eq!(i[3].type_name, "BOOLEAN");
    assert_eq!(i[3].default.as_deref(), Some("true"));
    assert_eq!(i[4].type_name, "COMBO");
    assert_eq!(i[4].options, ["a", "b"]);
    assert_eq!(i[4].default, None);
    assert!(i[4].required);
    assert_eq!(i[5].type_name, "STRING");
    assert!(!i[5].required);
    assert_eq!(i[6].type_name, "core/ASSET");
    assert!(!i[6].required);
    assert_eq!(i[7].type_name, "INT");
    assert!(!i[7].required);
    assert!(i[8].required);
    let outs: Vec<_> = def.outputs.iter().map(|o| o.type_name.as_str()).collect();
    assert_eq!(outs, ["INT", "FLOAT", "STRING", "BOOLEAN"]);
}

#[test]
fn executes_with_defaults_and_files() {
    let r = execute(
        NODES,
        "Everything!",
        vec![nv("mode", Value::Text("b".into())), nv("ratio", Value::Int(1))],
    )
    .unwrap();
    assert_eq!(r.outputs.len(), 4);
    assert!(matches!(r.outputs[0], Value::Int(1536)));
    assert!(matches!(r.outputs[1], Value::Float(f) if f == 1.0));
    assert!(matches!(&r.outputs[2], Value::Text(s) if s == "b:none"));
    assert!(matches!(r.outputs[3], Value::Boolean(true)));
    assert_eq!(r.files.len(), 1);
    assert_eq!(r.files[0].filename_prefix, "prefix");
    assert_eq!(r.files[0].extension, "txt");
    assert_eq!(r.files[0].content_type, "text/plain");
    assert!(matches!(&r.files[0].data, weft_sdk::FileData::Bytes(b) if b == b"b"));
}

#[test]
fn concatenates() {
    let r = execute(
        NODES,
        "StringConcatenate",
        vec![
            nv("string_a", Value::Text("a".into())),
            nv("string_b", Value::Text("b".into())),
            nv("delimiter", Value::Text("-".into())),
        ],
    )
    .unwrap();
    assert!(matches!(&r.outputs[0], Value::Text(s) if s == "a-b"));
    assert!(r.files.is_empty());
}

fn err(class: &str, inputs: Vec<NamedValue>) -> NodeError {
    execute(NODES, class, inputs).unwrap_err()
}

#[test]
fn input_errors() {
    let e = err("StringConcatenate", vec![nv("string_a", Value::Text("a".into()))]);
    assert_eq!(e.code, "invalid_input");
    assert!(e.message.contains("string_b"), "{}", e.message);

    let e = err("StringConcatenate", vec![nv("string_a", Value::Int(1))]);
    assert_eq!(e.code, "invalid_input");
    assert!(e.message.contains("expected STRING, got INT"), "{}", e.message);

    let e = err("Everything!", vec![nv("mode", Value::Text("c".into()))]);
    assert_eq!(e.code, "invalid_input");
    assert!(e.message.contains("mode"), "{}", e.message);

    let e = err(
        "Everything!",
        vec![nv("mode", Value::Text("a".into())), nv("count", Value::Int(101))],
    );
    assert_eq!(e.code, "invalid_input");
    assert!(e.message.contains("maximum"), "{}", e.message);

    let e = err(
        "Everything!",
        vec![nv("mode", Value::Text("a".into())), nv("width", Value::Int(-1))],
    );
    assert_eq!(e.code, "invalid_input");

    let e = err("Fails", vec![]);
    assert_eq!(e.code, "invalid_input");
}

#[test]
fn unknown_class() {
    let e = err("Nope", vec![]);
    assert_eq!(e.code, "unknown_class");
    assert!(e.message.contains("Nope"));
}

#[test]
fn describe_lists_all() {
    let defs = weft_sdk::describe(NODES);
    let names: Vec<_> = defs.iter().map(|d| d.class_type.as_str()).collect();
    assert_eq!(names, ["StringConcatenate", "Everything!", "Fails"]);
}

#[test]
fn class_type_without_the_definition_names_the_class_the_definition_names() {
    assert_eq!(StringConcatenate::class_type(), "StringConcatenate");
    assert_eq!(Everything::class_type(), "Everything!");
    for entry in NODES {
        assert_eq!((entry.class_type)(), (entry.definition)().class_type);
    }
}

#[test]
fn input_values_take_last() {
    let mut v = InputValues::new(vec![nv("a", Value::Int(1)), nv("a", Value::Int(2))]);
    assert!(matches!(v.take("a"), Some(Value::Int(2))));
    assert!(matches!(v.take("a"), Some(Value::Int(1))));
    assert!(v.take("a").is_none());
}
