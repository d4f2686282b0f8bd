//! The node catalogue: every class the loaded plugins define, in ComfyUI's shapes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Map, Value as Json};

use super::bindings::v0_2::wit;

/// How one input is given.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InputSpec {
    /// Input name.
    pub name: String,
    /// ComfyUI type name, or `COMBO`.
    pub type_name: String,
    /// Whether the workflow must give it.
    pub required: bool,
    /// Default value.
    pub default: Option<Json>,
    /// Smallest accepted value.
    pub min: Option<f64>,
    /// Largest accepted value.
    pub max: Option<f64>,
    /// UI step.
    pub step: Option<f64>,
    /// Combo choices.
    pub options: Vec<String>,
    /// Multi-line string.
    pub multiline: bool,
    /// Help text.
    pub tooltip: Option<String>,
    /// For a combo of model files: the models folder whose files are the choices, listed
    /// each time the catalogue is asked for (see [`Catalog::with_model_files`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_folder: Option<String>,
}

impl InputSpec {
    /// Whether this input takes a combo choice.
    pub fn is_combo(&self) -> bool {
        self.type_name == weft_types::COMBO
    }

    /// The `[TYPE, opts]` pair of ComfyUI's `/object_info`.
    fn object_info(&self) -> Json {
        let mut opts = Map::new();
        if let Some(d) = &self.default {
            opts.insert("default".into(), d.clone());
        }
        for (key, v) in [("min", self.min), ("max", self.max), ("step", self.step)] {
            if let Some(v) = v {
                let n = if v.fract() == 0.0 && v.abs() < 9.0e15 {
                    json!(v as i64)
                } else {
                    json!(v)
                };
                opts.insert(key.into(), n);
            }
        }
        if self.multiline {
            opts.insert("multiline".into(), json!(true));
        }
        if let Some(t) = &self.tooltip {
            opts.insert("tooltip".into(), json!(t));
        }
        if self.is_combo() {
            json!([self.options, opts])
        } else {
            json!([self.type_name, opts])
        }
    }
}

/// One output of a class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputSpec {
    /// ComfyUI type name.
    pub type_name: String,
    /// Display name.
    pub name: String,
    /// ComfyUI's `output_is_list`.
    pub is_list: bool,
    /// Help text.
    pub tooltip: Option<String>,
}

/// A node class definition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDef {
    /// Class name.
    pub class_type: String,
    /// Display name.
    pub display_name: String,
    /// Category.
    pub category: String,
    /// Description.
    pub description: String,
    /// Inputs in order.
    pub inputs: Vec<InputSpec>,
    /// Outputs in order.
    pub outputs: Vec<OutputSpec>,
    /// Whether the node commits job outputs.
    pub output_node: bool,
    /// Whether results may be cached.
    pub deterministic: bool,
    /// The plugin that defines it.
    pub plugin: String,
    /// The build of the plugin that defines it (the blake3 of its component, once loaded):
    /// part of every cache key, so results of a replaced build are never reused.
    #[serde(skip)]
    pub build: String,
}

impl NodeDef {
    /// Converts a guest's definition, checking what the host relies on.
    pub(crate) fn from_wit(def: wit::NodeDef, plugin: &str) -> Result<Self, String> {
        if def.class_type.trim().is_empty() {
            return Err("a node definition has an empty class name".into());
        }
        let mut inputs = Vec::with_capacity(def.inputs.len());
        for input in def.inputs {
            let default = match input.default {
                None => None,
                Some(text) => Some(serde_json::from_str(&text).map_err(|e| {
                    format!(
                        "class {}: input {}: default is not JSON: {e}",
                        def.class_type, input.name
                    )
                })?),
            };
            inputs.push(InputSpec {
                name: input.name,
                type_name: input.type_name,
                required: input.required,
                default,
                min: input.min,
                max: input.max,
                step: input.step,
                options: input.options,
                multiline: input.multiline,
                tooltip: input.tooltip,
                model_folder: input.model_folder,
            });
        }
        Ok(Self {
            class_type: def.class_type,
            display_name: def.display_name,
            category: def.category,
            description: def.description,
            inputs,
            outputs: def
                .outputs
                .into_iter()
                .map(|o| OutputSpec {
                    type_name: o.type_name,
                    name: o.name,
                    is_list: o.is_list,
                    tooltip: o.tooltip,
                })
                .collect(),
            output_node: def.output_node,
            deterministic: def.deterministic,
            plugin: plugin.to_string(),
            build: String::new(),
        })
    }

    /// The input named `name`.
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }

    /// This class in ComfyUI's `/object_info` shape.
    pub fn object_info(&self) -> Json {
        let section = |required: bool| -> Map<String, Json> {
            self.inputs
                .iter()
                .filter(|i| i.required == required)
                .map(|i| (i.name.clone(), i.object_info()))
                .collect()
        };
        json!({
            "input": {"required": section(true), "optional": section(false), "hidden": {}},
            "input_order": {
                "required": self.inputs.iter().filter(|i| i.required).map(|i| &i.name).collect::<Vec<_>>(),
                "optional": self.inputs.iter().filter(|i| !i.required).map(|i| &i.name).collect::<Vec<_>>(),
            },
            "output": self.outputs.iter().map(|o| &o.type_name).collect::<Vec<_>>(),
            "output_is_list": self.outputs.iter().map(|o| o.is_list).collect::<Vec<_>>(),
            "output_name": self.outputs.iter().map(|o| &o.name).collect::<Vec<_>>(),
            "output_tooltips": self.outputs.iter().map(|o| &o.tooltip).collect::<Vec<_>>(),
            "name": self.class_type,
            "display_name": self.display_name,
            "description": self.description,
            "category": self.category,
            "output_node": self.output_node,
            "python_module": format!("weft.{}", self.plugin),
        })
    }
}

/// Every class, by name.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    classes: BTreeMap<String, (usize, NodeDef)>,
}

impl Catalog {
    /// Whether every class of `defs` is new to the catalogue (and none is defined twice
    /// among them); an error naming the first collision otherwise.
    pub(super) fn check_new(&self, defs: &[NodeDef]) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for def in defs {
            if let Some((_, existing)) = self.classes.get(&def.class_type) {
                return Err(format!(
                    "node class {:?} is already defined by plugin {:?}",
                    def.class_type, existing.plugin
                ));
            }
            if !seen.insert(def.class_type.as_str()) {
                return Err(format!("node class {:?} is defined twice", def.class_type));
            }
        }
        Ok(())
    }

    /// Adds `def` from plugin number `plugin`; an error naming both plugins when the class
    /// is already defined.
    pub(super) fn insert(&mut self, plugin: usize, def: NodeDef) -> Result<(), String> {
        if let Some((_, existing)) = self.classes.get(&def.class_type) {
            return Err(format!(
                "node class {:?} is defined by two plugins: {:?} and {:?}",
                def.class_type, existing.plugin, def.plugin
            ));
        }
        self.classes.insert(def.class_type.clone(), (plugin, def));
        Ok(())
    }

    /// The definition of `class`.
    pub fn get(&self, class: &str) -> Option<&NodeDef> {
        self.classes.get(class).map(|(_, d)| d)
    }

    /// The plugin index of `class`.
    pub(super) fn plugin_of(&self, class: &str) -> Option<usize> {
        self.classes.get(class).map(|(p, _)| *p)
    }

    /// Every definition, by class name.
    pub fn iter(&self) -> impl Iterator<Item = &NodeDef> {
        self.classes.values().map(|(_, d)| d)
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Whether there are no classes.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// The whole catalogue in ComfyUI's `/object_info` shape, keyed by class.
    pub fn object_info(&self) -> Json {
        Json::Object(self.iter().map(|d| (d.class_type.clone(), d.object_info())).collect())
    }

    /// This catalogue with the choices of every model-file combo (an input with a
    /// `model_folder`) set to what `list_folder` finds in that folder now. Borrowed as it is
    /// when no input lists files.
    pub fn with_model_files(&self, list_folder: impl Fn(&str) -> Vec<String>) -> Cow<'_, Catalog> {
        let lists_files = |d: &NodeDef| d.inputs.iter().any(|i| i.model_folder.is_some());
        if !self.iter().any(lists_files) {
            return Cow::Borrowed(self);
        }
        let mut fresh = self.clone();
        for (_, def) in fresh.classes.values_mut() {
            for input in &mut def.inputs {
                if let Some(folder) = &input.model_folder {
                    input.options.extend(list_folder(folder));
                }
            }
        }
        Cow::Owned(fresh)
    }

    /// [`with_model_files`](Self::with_model_files) for a workflow of `classes`: borrowed as
    /// it is, without listing any folder, when none of those classes has a model-file input.
    /// Validating a workflow that loads no model then costs no copy and no directory read.
    pub fn with_model_files_for<'a>(
        &self,
        mut classes: impl Iterator<Item = &'a str>,
        list_folder: impl Fn(&str) -> Vec<String>,
    ) -> Cow<'_, Catalog> {
        let lists_files = |class: &str| {
            self.get(class)
                .is_some_and(|d| d.inputs.iter().any(|i| i.model_folder.is_some()))
        };
        if classes.any(lists_files) {
            self.with_model_files(list_folder)
        } else {
            Cow::Borrowed(self)
        }
    }

    /// The known class closest to `name`, for "did you mean" messages.
    pub fn nearest(&self, name: &str) -> Option<&str> {
        let lower = name.to_lowercase();
        self.classes
            .keys()
            .map(|k| (strsim::jaro_winkler(&lower, &k.to_lowercase()), k))
            .filter(|(score, _)| *score > 0.7)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, k)| k.as_str())
    }
}
