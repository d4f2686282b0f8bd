//! The raw API-format workflow, as submitted: an object of nodes, each with its inputs, where
//! an input is a literal, a link to another node's output, or an asset reference. Both
//! validation and planning read workflows through this module.

use std::collections::BTreeSet;

use serde_json::Value as Json;
use weft_types as types;

use crate::runtime::AssetRef;

/// A parsed node: its raw inputs.
pub(super) struct RawNode<'a> {
    pub inputs: &'a serde_json::Map<String, Json>,
}

impl<'a> RawNode<'a> {
    /// The ids of the nodes this node links to (with repeats, unchecked).
    pub(crate) fn links(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.inputs.values().filter_map(|raw| as_link(raw).map(|(n, _)| n))
    }
}

/// A link is exactly a two-element list of a node id (string) and an output index.
pub(super) fn as_link(raw: &Json) -> Option<(&str, u64)> {
    match raw.as_array()?.as_slice() {
        [Json::String(node), Json::Number(index)] => Some((node.as_str(), index.as_u64()?)),
        _ => None,
    }
}

/// A `{"__type": "core/ASSET", "info": {"id": ...}}` reference.
pub(super) fn as_asset_ref(raw: &Json) -> Option<Result<AssetRef, String>> {
    let object = raw.as_object()?;
    if object.get("__type").and_then(Json::as_str) != Some(types::ASSET) {
        return None;
    }
    let parsed = object
        .get("info")
        .cloned()
        .ok_or_else(|| "a core/ASSET reference needs an info object".to_string())
        .and_then(|info| {
            serde_json::from_value::<AssetRef>(info).map_err(|e| format!("bad core/ASSET reference: {e}"))
        });
    Some(parsed)
}

/// Every asset reference in the workflow's inputs: (node id, reference).
pub fn asset_refs(workflow: &Json) -> Vec<(String, AssetRef)> {
    let mut refs = Vec::new();
    let mut seen = BTreeSet::new();
    if let Some(object) = workflow.as_object() {
        for (id, node) in object {
            for raw in node
                .get("inputs")
                .and_then(Json::as_object)
                .into_iter()
                .flat_map(|m| m.values())
            {
                if let Some(Ok(asset)) = as_asset_ref(raw) {
                    if seen.insert((id.clone(), asset.id.clone())) {
                        refs.push((id.clone(), asset));
                    }
                }
            }
        }
    }
    refs
}
