//! The catalogue checked against ComfyUI's own `/object_info` entries, as fixture scripts
//! dump them in a normal form: per class its display name, category, output types and, per
//! input in order, `[name, {type, choices, default, min, max, step}]` (a combo's type is
//! `COMBO`).

use serde_json::{json, Map, Value};

/// A number as a float, so that `0` and `0.0` compare equal; anything else as it is.
fn number(v: &Value) -> Value {
    v.as_f64().map_or_else(|| v.clone(), |f| json!(f))
}

/// One input spec, `[type or choices, options]`, in the normal form. A combo without a
/// default takes its first choice, as ComfyUI's editor does.
fn normal_input(spec: &Value) -> Value {
    let (kind, options) = (&spec[0], &spec[1]);
    let mut out = Map::new();
    let choices = match kind {
        Value::Array(choices) => Some(Value::Array(choices.clone())),
        _ if kind == "COMBO" => Some(options["options"].clone()),
        _ => None,
    };
    out.insert(
        "type".into(),
        json!(if choices.is_some() {
            "COMBO"
        } else {
            kind.as_str().unwrap_or("?")
        }),
    );
    for key in ["default", "min", "max", "step"] {
        if let Some(v) = options.get(key) {
            out.insert(key.into(), number(v));
        }
    }
    if let Some(choices) = choices {
        if !out.contains_key("default") {
            out.insert("default".into(), choices[0].clone());
        }
        out.insert("choices".into(), choices);
    }
    Value::Object(out)
}

/// A catalogue entry in the normal form.
fn normal_entry(entry: &Value) -> Value {
    let mut inputs = Vec::new();
    for section in ["required", "optional"] {
        for name in entry["input_order"][section].as_array().into_iter().flatten() {
            let name = name.as_str().unwrap();
            inputs.push(json!([name, normal_input(&entry["input"][section][name])]));
        }
    }
    json!({
        "display_name": entry["display_name"],
        "category": entry["category"],
        "output": entry["output"],
        "inputs": inputs,
    })
}

/// A fixture's spec in the normal form (its numbers as floats, its combos' defaults filled).
fn normal_fixture(spec: &Value) -> Value {
    let inputs: Vec<Value> = spec["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            let given = pair[1].as_object().unwrap();
            let mut options: Map<String, Value> = given.iter().map(|(k, v)| (k.clone(), number(v))).collect();
            if let Some(choices) = given.get("choices") {
                options.insert("choices".into(), choices.clone());
                options.entry("default").or_insert_with(|| choices[0].clone());
            }
            json!([pair[0], Value::Object(options)])
        })
        .collect();
    json!({
        "display_name": spec["display_name"],
        "category": spec["category"],
        "output": spec["output"],
        "inputs": inputs,
    })
}

/// Asserts that `catalogue` (`/object_info`) has every class of `specs` (class -> ComfyUI's
/// entry in the normal form) as ComfyUI has it.
pub(crate) fn assert_catalogue_matches(catalogue: &Value, specs: &Value) {
    for (class, spec) in specs.as_object().unwrap() {
        let entry = &catalogue[class];
        assert!(entry.is_object(), "{class} is not in the catalogue");
        assert_eq!(
            normal_entry(entry),
            normal_fixture(spec),
            "{class} differs from ComfyUI's"
        );
    }
}
