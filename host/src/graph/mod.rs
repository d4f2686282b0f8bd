//! Workflows: parsing ComfyUI's API format, validating it against the node catalogue
//! (every error, in one answer, without running a guest), and planning execution.
//!
//! Public face: [`validate`] turns JSON into a [`Plan`] or a [`GraphError`].

mod plan;
mod validate;
mod workflow;

pub use plan::{Plan, PlanInput, PlannedNode};
pub use validate::validate;
pub use workflow::asset_refs;

use std::collections::BTreeMap;

use serde::Serialize;

/// One problem with one field of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldError {
    /// Input name (or `class_type`, or empty for the node as a whole).
    pub field: String,
    /// Machine-readable reason, from ComfyUI's vocabulary where it has one.
    pub reason: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl FieldError {
    fn new(field: &str, reason: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// Why a workflow was rejected.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphError {
    /// The workflow is in the UI export format (`nodes` + `links`).
    UiFormat,
    /// The workflow is invalid; every problem found is listed.
    Invalid {
        /// Summary.
        message: String,
        /// Problems by node id.
        node_errors: BTreeMap<String, Vec<FieldError>>,
        /// Problems with the workflow as a whole.
        errors: Vec<FieldError>,
        /// How many problems were found; more than are listed when the lists were cut to
        /// the validator's cap.
        error_count: usize,
    },
}

impl GraphError {
    /// The message shown to callers.
    pub fn message(&self) -> String {
        match self {
            GraphError::UiFormat => "the workflow is in ComfyUI's UI format (with `nodes` and `links`); \
                submit the API format instead: in ComfyUI enable dev mode options and use \
                \"Save (API Format)\" / \"Export (API)\""
                .to_string(),
            GraphError::Invalid { message, .. } => message.clone(),
        }
    }
}
