//! Workflows handed from a job's submission to the worker that starts it, in memory, so
//! that the start need not read them back from the store (a trip to a reader connection and
//! a JSON parse per job). Only small workflows, within a byte budget for all of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value as Json;

/// The largest workflow handed over, in bytes of JSON text (about).
const MAX_WORKFLOW_BYTES: usize = 64 * 1024;

/// The most bytes held for all queued jobs together: past it, workflows are read back from
/// the store as before.
const BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// The workflows of queued jobs, by job id, and the bytes they hold.
#[derive(Default)]
pub(super) struct Handover {
    kept: Mutex<Kept>,
}

/// Each kept workflow with its size, and the sizes' sum.
#[derive(Default)]
struct Kept {
    workflows: HashMap<String, (Arc<Json>, usize)>,
    bytes: usize,
}

impl Handover {
    /// Keeps queued job `id`'s `workflow` for its worker, if it is small and the budget has
    /// room; otherwise the worker reads it from the store.
    pub(super) fn offer(&self, id: &str, workflow: &Json) {
        let Some(bytes) = json_size(workflow, MAX_WORKFLOW_BYTES) else {
            return;
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.bytes + bytes <= BUDGET_BYTES {
            if let Some((_, replaced)) = kept
                .workflows
                .insert(id.to_string(), (Arc::new(workflow.clone()), bytes))
            {
                kept.bytes -= replaced;
            }
            kept.bytes += bytes;
        }
    }

    /// Takes job `id`'s workflow, if it was kept: when the job starts, or leaves the queue
    /// without starting (canceled, expired).
    pub(super) fn take(&self, id: &str) -> Option<Arc<Json>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (workflow, bytes) = kept.workflows.remove(id)?;
        kept.bytes -= bytes;
        Some(workflow)
    }
}

/// About how many bytes `value`'s JSON text takes (strings and keys by their length, every
/// other value a few bytes), if at most `limit`; the walk stops as soon as it is over.
fn json_size(value: &Json, limit: usize) -> Option<usize> {
    fn take(value: &Json, left: &mut usize) -> bool {
        let own = match value {
            Json::String(text) => text.len() + 2,
            _ => 8,
        };
        let Some(rest) = left.checked_sub(own) else {
            return false;
        };
        *left = rest;
        match value {
            Json::Array(items) => items.iter().all(|item| take(item, left)),
            Json::Object(fields) => fields.iter().all(|(key, item)| match left.checked_sub(key.len() + 3) {
                Some(rest) => {
                    *left = rest;
                    take(item, left)
                }
                None => false,
            }),
            _ => true,
        }
    }
    let mut left = limit;
    take(value, &mut left).then(|| limit - left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_small_workflows_are_handed_over_within_the_budget() {
        let handover = Handover::default();
        let small = json!({"1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}}});
        handover.offer("a", &small);
        assert_eq!(handover.take("a").as_deref(), Some(&small));
        assert!(handover.take("a").is_none(), "taken once");

        let long_text = json!({"1": {"inputs": {"value": "x".repeat(MAX_WORKFLOW_BYTES)}}});
        handover.offer("b", &long_text);
        assert!(handover.take("b").is_none());
        let many_nodes: serde_json::Map<String, Json> = (0..MAX_WORKFLOW_BYTES / 8)
            .map(|i| (i.to_string(), json!({})))
            .collect();
        handover.offer("c", &Json::Object(many_nodes));
        assert!(handover.take("c").is_none());

        let near_limit = json!({"1": {"inputs": {"value": "x".repeat(MAX_WORKFLOW_BYTES - 100)}}});
        let fit = BUDGET_BYTES / json_size(&near_limit, MAX_WORKFLOW_BYTES).expect("within");
        for i in 0..fit + 10 {
            handover.offer(&i.to_string(), &near_limit);
        }
        let kept = (0..fit + 10)
            .filter(|i| handover.take(&i.to_string()).is_some())
            .count();
        assert_eq!(kept, fit, "the budget bounds what is held");
        assert_eq!(handover.kept.lock().unwrap().bytes, 0, "every byte is given back");
    }
}
