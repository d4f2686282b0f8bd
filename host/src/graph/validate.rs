//! Validation of API-format workflows: structure, classes, links and their types, literal
//! types, ranges, combos, cycles and output nodes. It collects every error it finds, but
//! reports a bounded number of them, each of bounded size, so the answer to a hostile
//! workflow stays small: at most [`MAX_REPORTED_ERRORS`] entries, cycles shown by their
//! first [`CYCLE_PATH_SHOWN`] nodes, combos by their first [`COMBO_OPTIONS_SHOWN`] choices,
//! and echoed strings cut to [`ECHO_CHARS`] characters.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value as Json;
use weft_types as types;

use super::plan::{self, Plan};
use super::workflow::{as_asset_ref, as_link, RawNode};
use super::{FieldError, GraphError};
use crate::runtime::{Catalog, InputSpec, NodeDef, Value};

/// Most errors listed in one answer; the rest are counted (`error_count`) and the answer says
/// it is `truncated`.
const MAX_REPORTED_ERRORS: usize = 100;

/// Nodes of a cycle named in each of its errors.
const CYCLE_PATH_SHOWN: usize = 8;

/// Choices of a combo listed when a value is not one of them.
const COMBO_OPTIONS_SHOWN: usize = 20;

/// Characters of a caller's string (a class name, a combo value) echoed in a message.
const ECHO_CHARS: usize = 100;

/// The errors found so far, by node id.
type NodeErrors = BTreeMap<String, Vec<FieldError>>;

/// Checks `workflow` against `catalog`, collecting every error, and plans it.
pub fn validate(workflow: &Json, catalog: &Catalog) -> Result<Plan, GraphError> {
    let object = check_shape(workflow)?;
    let mut node_errors = NodeErrors::new();
    let (nodes, defs) = read_nodes(object, catalog, &mut node_errors);

    let outputs: Vec<&str> = defs.iter().filter(|(_, d)| d.output_node).map(|(id, _)| *id).collect();
    let mut errors = Vec::new();
    if outputs.is_empty() && node_errors.is_empty() {
        errors.push(FieldError::new(
            "workflow",
            "prompt_no_outputs",
            "the workflow has no output node (such as SaveImage or SaveText), so running it would produce nothing",
        ));
    }

    // Inputs are checked on the nodes the outputs need, as ComfyUI does.
    let needed = plan::ancestors(&outputs, &nodes);
    let literals = check_inputs(&needed, &nodes, &defs, &mut node_errors);
    report_cycles(&needed, &nodes, &mut node_errors);

    if !node_errors.is_empty() || !errors.is_empty() {
        return Err(reported(node_errors, errors));
    }
    Ok(plan::build(&needed, &nodes, &defs, literals))
}

/// The workflow as an object of nodes, or why its shape cannot be one: not an object, the
/// UI format, or empty.
fn check_shape(workflow: &Json) -> Result<&serde_json::Map<String, Json>, GraphError> {
    let Some(object) = workflow.as_object() else {
        return Err(shape_error(
            "the workflow must be a JSON object mapping node ids to nodes",
            "invalid_workflow_shape",
            format!("expected an object, got {}", kind_of(workflow)),
        ));
    };
    if object.get("nodes").is_some_and(Json::is_array) && object.contains_key("links") {
        return Err(GraphError::UiFormat);
    }
    if object.is_empty() {
        return Err(shape_error(
            "the workflow has no nodes",
            "prompt_no_outputs",
            "the workflow is empty; add at least one output node".into(),
        ));
    }
    Ok(object)
}

/// The answer `message` for a workflow whose shape is wrong: one error on the workflow as
/// a whole, for `reason`.
fn shape_error(message: &str, reason: &str, detail: String) -> GraphError {
    GraphError::Invalid {
        message: message.to_string(),
        node_errors: NodeErrors::new(),
        errors: vec![FieldError::new("workflow", reason, detail)],
        error_count: 1,
    }
}

/// Every node of `object` that is an object with a `class_type` and object `inputs`, and
/// the definitions of those whose class `catalog` knows; what is wrong with the others goes
/// to `node_errors`.
fn read_nodes<'a>(
    object: &'a serde_json::Map<String, Json>,
    catalog: &'a Catalog,
    node_errors: &mut NodeErrors,
) -> (HashMap<&'a str, RawNode<'a>>, HashMap<&'a str, &'a NodeDef>) {
    let mut nodes: HashMap<&str, RawNode> = HashMap::with_capacity(object.len());
    let mut defs: HashMap<&str, &NodeDef> = HashMap::with_capacity(object.len());
    for (id, node) in object {
        let (inputs, class_type) = match read_node(id, node) {
            Ok(read) => read,
            Err(e) => {
                push(node_errors, id, e);
                continue;
            }
        };
        match catalog.get(class_type) {
            Some(def) => {
                defs.insert(id, def);
            }
            None => push(node_errors, id, unknown_class(catalog, class_type)),
        }
        nodes.insert(id, RawNode { inputs });
    }
    (nodes, defs)
}

/// Node `id`'s inputs and class, or what is wrong with its shape.
fn read_node<'a>(id: &str, node: &'a Json) -> Result<(&'a serde_json::Map<String, Json>, &'a str), FieldError> {
    let Some(node) = node.as_object() else {
        return Err(FieldError::new(
            "",
            "invalid_node",
            format!("node {id} must be an object with class_type and inputs"),
        ));
    };
    let Some(class_type) = node.get("class_type").and_then(Json::as_str) else {
        return Err(FieldError::new(
            "class_type",
            "missing_class_type",
            format!("node {id} has no class_type"),
        ));
    };
    static EMPTY: std::sync::OnceLock<serde_json::Map<String, Json>> = std::sync::OnceLock::new();
    let inputs = match node.get("inputs") {
        None => EMPTY.get_or_init(serde_json::Map::new),
        Some(Json::Object(m)) => m,
        Some(other) => {
            return Err(FieldError::new(
                "inputs",
                "invalid_node",
                format!("inputs must be an object, got {}", kind_of(other)),
            ))
        }
    };
    Ok((inputs, class_type))
}

/// The error for a node of `class_type`, which `catalog` does not know, with the nearest
/// class it does know as a hint.
fn unknown_class(catalog: &Catalog, class_type: &str) -> FieldError {
    let hint = catalog
        .nearest(class_type)
        .map(|n| format!("; did you mean {n:?}?"))
        .unwrap_or_default();
    FieldError::new(
        "class_type",
        "unknown_class",
        format!("unknown node class {:?}{hint}", clip(class_type)),
    )
}

/// Checks the inputs of the `needed` nodes against their definitions; returns the literals
/// by node id and input name, and adds what is wrong to `node_errors`.
fn check_inputs(
    needed: &BTreeSet<&str>,
    nodes: &HashMap<&str, RawNode>,
    defs: &HashMap<&str, &NodeDef>,
    node_errors: &mut NodeErrors,
) -> HashMap<(String, String), Value> {
    let mut literals: HashMap<(String, String), Value> = HashMap::new();
    for id in needed {
        let (Some(node), Some(def)) = (nodes.get(id), defs.get(id)) else {
            continue;
        };
        for spec in &def.inputs {
            match node.inputs.get(&spec.name) {
                None if spec.required => push(
                    node_errors,
                    id,
                    FieldError::new(
                        &spec.name,
                        "missing_input",
                        format!("required input {:?} of {} is missing", spec.name, def.class_type),
                    ),
                ),
                None => {}
                Some(raw) => match check_input(spec, raw, nodes, defs) {
                    Ok(Some(value)) => {
                        literals.insert((id.to_string(), spec.name.clone()), value);
                    }
                    Ok(None) => {}
                    Err(e) => push(node_errors, id, e),
                },
            }
        }
    }
    literals
}

/// Adds an error to every node of each cycle among the `needed` nodes.
fn report_cycles(needed: &BTreeSet<&str>, nodes: &HashMap<&str, RawNode>, node_errors: &mut NodeErrors) {
    for cycle in plan::cycles(needed, nodes) {
        let shown: Vec<&str> = cycle.iter().take(CYCLE_PATH_SHOWN).map(|id| clip(id)).collect();
        let path = if cycle.len() > CYCLE_PATH_SHOWN {
            format!("{} -> ... ({} nodes in all)", shown.join(" -> "), cycle.len())
        } else {
            format!("{} -> {}", shown.join(" -> "), shown[0])
        };
        for id in &cycle {
            push(
                node_errors,
                id,
                FieldError::new(
                    "",
                    "dependency_cycle",
                    format!("node {} is part of a cycle: {path}", clip(id)),
                ),
            );
        }
    }
}

/// The answer for the errors found: all of them counted, at most [`MAX_REPORTED_ERRORS`]
/// listed (the workflow's own first, then by node id).
fn reported(mut node_errors: NodeErrors, mut errors: Vec<FieldError>) -> GraphError {
    let count = node_errors.values().map(Vec::len).sum::<usize>() + errors.len();
    let truncated = count > MAX_REPORTED_ERRORS;
    let message = if truncated {
        format!("the workflow is invalid: {count} errors found, the first {MAX_REPORTED_ERRORS} listed")
    } else {
        format!(
            "the workflow is invalid: {count} error{} found",
            if count == 1 { "" } else { "s" }
        )
    };
    errors.truncate(MAX_REPORTED_ERRORS);
    let mut room = MAX_REPORTED_ERRORS - errors.len();
    node_errors.retain(|_, list| {
        list.truncate(room);
        room -= list.len();
        !list.is_empty()
    });
    GraphError::Invalid {
        message,
        node_errors,
        errors,
        error_count: count,
    }
}

/// `text` cut to [`ECHO_CHARS`] characters (at a character boundary).
fn clip(text: &str) -> &str {
    match text.char_indices().nth(ECHO_CHARS) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

fn push(map: &mut NodeErrors, id: &str, e: FieldError) {
    map.entry(id.to_string()).or_default().push(e);
}

fn kind_of(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

fn types_compatible(output: &str, input: &InputSpec) -> bool {
    output == input.type_name
        || output == types::ANY
        || input.type_name == types::ANY
        || (input.is_combo() && (output == types::STRING || output == types::COMBO))
        || input.type_name.split(',').any(|t| t.trim() == output)
}

/// Checks one given input. `Ok(Some(value))` for a literal, `Ok(None)` for a good link.
fn check_input(
    spec: &InputSpec,
    raw: &Json,
    nodes: &HashMap<&str, RawNode>,
    defs: &HashMap<&str, &NodeDef>,
) -> Result<Option<Value>, FieldError> {
    let name = spec.name.as_str();
    if let Some((source, index)) = as_link(raw) {
        if !nodes.contains_key(source) {
            return Err(FieldError::new(
                name,
                "bad_linked_input",
                format!("input {name:?} links to node {source:?}, which is not in the workflow"),
            ));
        }
        let Some(def) = defs.get(source) else {
            // The source's own error (unknown class) is reported on it.
            return Ok(None);
        };
        let Some(output) = def.outputs.get(index as usize) else {
            return Err(FieldError::new(
                name,
                "bad_linked_input",
                format!(
                    "input {name:?} links to output {index} of node {source:?} ({}), which has {} output(s)",
                    def.class_type,
                    def.outputs.len()
                ),
            ));
        };
        if !types_compatible(&output.type_name, spec) {
            return Err(FieldError::new(
                name,
                "return_type_mismatch",
                format!(
                    "input {name:?} expects {} but output {index} of node {source:?} ({}) is {}",
                    spec.type_name, def.class_type, output.type_name
                ),
            ));
        }
        return Ok(None);
    }
    if raw.is_array() {
        return Err(FieldError::new(
            name,
            "bad_linked_input",
            format!("input {name:?} is a list but not a link; a link is [\"<node id>\", <output index>]"),
        ));
    }
    let wrong_type = |expected: &str| {
        FieldError::new(
            name,
            "invalid_input_type",
            format!("input {name:?} expects {expected}, got {}", kind_of(raw)),
        )
    };
    let value = match spec.type_name.as_str() {
        types::INT => {
            let v = match raw {
                Json::Number(n) if n.is_i64() => n.as_i64().expect("checked"),
                Json::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.2e18) => {
                    n.as_f64().expect("checked") as i64
                }
                _ => return Err(wrong_type("an integer (INT)")),
            };
            check_range(spec, v as f64)?;
            Value::Int(v)
        }
        types::FLOAT => {
            let Some(v) = raw.as_f64() else {
                return Err(wrong_type("a number (FLOAT)"));
            };
            check_range(spec, v)?;
            Value::Float(v)
        }
        types::BOOLEAN => Value::Bool(raw.as_bool().ok_or_else(|| wrong_type("true or false (BOOLEAN)"))?),
        types::STRING => Value::Text(raw.as_str().ok_or_else(|| wrong_type("a string (STRING)"))?.to_string()),
        types::COMBO => {
            let Some(choice) = raw.as_str() else {
                return Err(wrong_type("one of the listed choices"));
            };
            if !spec.options.iter().any(|o| o == choice) {
                let mut listed = spec
                    .options
                    .iter()
                    .take(COMBO_OPTIONS_SHOWN)
                    .map(|o| format!("{:?}", clip(o)))
                    .collect::<Vec<_>>()
                    .join(", ");
                if spec.options.len() > COMBO_OPTIONS_SHOWN {
                    listed.push_str(&format!(
                        " and {} more (GET /api/v2/nodes lists them all)",
                        spec.options.len() - COMBO_OPTIONS_SHOWN
                    ));
                }
                return Err(FieldError::new(
                    name,
                    "value_not_in_list",
                    format!("input {name:?}: {:?} is not one of {listed}", clip(choice)),
                ));
            }
            Value::Text(choice.to_string())
        }
        types::ASSET => match as_asset_ref(raw) {
            Some(Ok(asset)) => Value::Asset(asset),
            Some(Err(message)) => return Err(FieldError::new(name, "invalid_input_type", message)),
            None => {
                return Err(wrong_type(
                    "a {\"__type\": \"core/ASSET\", \"info\": {\"id\": ...}} reference",
                ))
            }
        },
        t if types::is_handle(t) => {
            return Err(FieldError::new(
                name,
                "invalid_input_type",
                format!("input {name:?} is {t}, which must come from a link to another node"),
            ))
        }
        _ => Value::Json(raw.clone()),
    };
    Ok(Some(value))
}

fn check_range(spec: &InputSpec, v: f64) -> Result<(), FieldError> {
    let name = spec.name.as_str();
    if let Some(min) = spec.min {
        if v < min {
            return Err(FieldError::new(
                name,
                "value_smaller_than_min",
                format!("input {name:?}: {v} is smaller than the minimum {min}"),
            ));
        }
    }
    if let Some(max) = spec.max {
        if v > max {
            return Err(FieldError::new(
                name,
                "value_bigger_than_max",
                format!("input {name:?}: {v} is bigger than the maximum {max}"),
            ));
        }
    }
    Ok(())
}
