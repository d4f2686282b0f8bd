//! `weft plugin check`: loading one plugin as the server would, and listing what is wrong
//! with its contract, for authors and for operators before they install it.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value as Json;

use super::registry;
use super::worlds::World;
use super::{Capabilities, InputSpec, NodeDef, PluginSource, Runtime};

/// What checking a plugin found.
#[derive(Debug, Clone)]
pub struct PluginReport {
    /// Plugin name.
    pub name: String,
    /// Where it came from.
    pub origin: String,
    /// The `weft:node` contract version it targets, when it could be read.
    pub contract: Option<String>,
    /// Its classes, when it could describe itself.
    pub classes: Vec<NodeDef>,
    /// What its manifest asks for.
    pub capabilities: Capabilities,
    /// Everything wrong with it, one sentence each; empty when the server would load it
    /// and its declarations are sound.
    pub problems: Vec<String>,
}

impl PluginReport {
    /// Whether no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl Runtime {
    /// Loads `source` under this runtime's limits (compile, link, `describe()` within the
    /// load timeout) without adding it, and checks its declarations against the contract
    /// and against the classes already loaded here.
    pub fn inspect(&self, source: &PluginSource) -> PluginReport {
        let mut report = PluginReport {
            name: source.name.clone(),
            origin: source.origin.clone(),
            contract: None,
            classes: Vec::new(),
            capabilities: source.manifest.capabilities.clone(),
            problems: Vec::new(),
        };
        let component = match registry::compile(&self.engine, source, self.config.cache_dir.as_deref()) {
            Ok(component) => component,
            Err(e) => {
                report.problems.push(format!("it is not a valid component: {e:#}"));
                return report;
            }
        };
        match World::of(&self.engine, &component) {
            Ok(world) => report.contract = Some(world.version().to_string()),
            Err(e) => {
                report.problems.push(format!("unsupported contract version: {e:#}"));
                return report;
            }
        }
        match self.load_plugin(source, Ok(component)) {
            Ok(plugin) => {
                report.problems = contract_problems(&plugin.nodes, &self.catalog.iter().collect::<Vec<_>>());
                report.classes = plugin.nodes;
            }
            Err(e) => report.problems.push(format!("it cannot be loaded: {e:#}")),
        }
        report
    }
}

/// The type names every host knows, whatever its plugins.
const KNOWN_TYPES: &[&str] = &[
    weft_types::INT,
    weft_types::FLOAT,
    weft_types::STRING,
    weft_types::BOOLEAN,
    weft_types::COMBO,
    weft_types::JSON,
    weft_types::ANY,
    weft_types::ASSET,
];

/// The contract problems of `defs` (one plugin's classes), next to the classes `loaded`.
fn contract_problems(defs: &[NodeDef], loaded: &[&NodeDef]) -> Vec<String> {
    let mut problems = Vec::new();
    // Names a workflow could not tell apart: the same name, or one differing only in case.
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for def in defs {
        let name = def.class_type.as_str();
        match seen.get(&name.to_lowercase()) {
            Some(&earlier) if earlier == name => problems.push(format!("class {name} is defined twice")),
            Some(&earlier) => problems.push(format!(
                "class {name} collides with class {earlier}: the names differ only in case"
            )),
            None => {
                seen.insert(name.to_lowercase(), name);
            }
        }
        for other in loaded {
            if other.class_type.eq_ignore_ascii_case(name) {
                problems.push(format!(
                    "class {name} collides with class {} of plugin {}",
                    other.class_type, other.plugin
                ));
            }
        }
    }
    let known: BTreeSet<&str> = KNOWN_TYPES
        .iter()
        .copied()
        .chain(weft_types::HANDLES.iter().copied())
        .chain(
            loaded
                .iter()
                .flat_map(|d| d.outputs.iter().map(|o| o.type_name.as_str())),
        )
        .chain(defs.iter().flat_map(|d| d.outputs.iter().map(|o| o.type_name.as_str())))
        .collect();
    for def in defs {
        let class = &def.class_type;
        let mut inputs = BTreeSet::new();
        for input in &def.inputs {
            let at = format!("class {class}, input {}", input.name);
            if !inputs.insert(input.name.as_str()) {
                problems.push(format!("{at}: declared twice"));
            }
            if !known.contains(input.type_name.as_str()) {
                problems.push(format!(
                    "{at}: unknown type name {:?} (not a weft type, and no class outputs it)",
                    input.type_name
                ));
            }
            if let (Some(min), Some(max)) = (input.min, input.max) {
                if min > max {
                    problems.push(format!("{at}: min {min} is greater than max {max}"));
                }
            }
            if input.is_combo() && input.options.is_empty() && input.model_folder.is_none() {
                problems.push(format!("{at}: a COMBO without choices"));
            }
            if let Some(default) = &input.default {
                if let Some(why) = default_problem(input, default) {
                    problems.push(format!("{at}: invalid default {default}: {why}"));
                }
            }
        }
        for (index, output) in def.outputs.iter().enumerate() {
            if output.type_name.trim().is_empty() {
                problems.push(format!("class {class}, output {index}: empty type name"));
            }
        }
    }
    problems
}

/// Why `default` cannot be the value of `input`, if it cannot.
fn default_problem(input: &InputSpec, default: &Json) -> Option<String> {
    let number = match input.type_name.as_str() {
        weft_types::INT => match default.as_i64() {
            Some(n) => n as f64,
            None => return Some("not an integer".into()),
        },
        weft_types::FLOAT => match default.as_f64() {
            Some(n) => n,
            None => return Some("not a number".into()),
        },
        weft_types::BOOLEAN => return (!default.is_boolean()).then(|| "not a boolean".into()),
        weft_types::STRING => return (!default.is_string()).then(|| "not a string".into()),
        weft_types::COMBO => {
            let choice = default.as_str()?;
            let listed = input.options.iter().any(|o| o == choice) || input.model_folder.is_some();
            return (!listed).then(|| format!("not one of the choices {:?}", input.options));
        }
        _ => return None,
    };
    if input.min.is_some_and(|min| number < min) {
        return Some(format!("below the minimum {}", input.min.unwrap_or_default()));
    }
    if input.max.is_some_and(|max| number > max) {
        return Some(format!("above the maximum {}", input.max.unwrap_or_default()));
    }
    None
}
