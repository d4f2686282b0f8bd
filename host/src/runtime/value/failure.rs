//! Why a node call failed, with the code jobs report it by.

use weft_types::{NodeErrorCode, MAX_CODE_BYTES};

use crate::runtime::guest_text;

/// Why a node call failed. `code` is the interface's `JobError.code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    /// [`NodeErrorCode::NodeExecutionError`], or the specific limit: `NodeTimeout`,
    /// `NodeMemoryLimit`, `NodeStackOverflow`, `NodeHostcallLimit`, `NodeOutputTooLarge`,
    /// `NodePanic`, `NodeTrap`, `Canceled`.
    pub code: NodeErrorCode,
    /// What happened, for people.
    pub message: String,
    /// The wasm backtrace, when the guest trapped.
    pub traceback: Option<String>,
}

impl NodeFailure {
    /// A failure with `code` and `message`, without a backtrace.
    pub(crate) fn new(code: NodeErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            traceback: None,
        }
    }

    /// The failure of a guest's `execute` that returned a node error: the host reports every
    /// guest error as `node_execution_error`, naming a specific code in the message.
    pub(crate) fn from_guest(code: String, message: String) -> Self {
        let message = if code.is_empty() || NodeErrorCode::NodeExecutionError == code.as_str() {
            message
        } else {
            format!("{message} ({code})")
        };
        Self::new(NodeErrorCode::NodeExecutionError, message)
    }

    /// The failure for a result of `returned` bytes, over the byte `limit`.
    pub(crate) fn output_too_large(returned: usize, limit: usize) -> Self {
        Self::new(
            NodeErrorCode::NodeOutputTooLarge,
            format!("the node returned {returned} bytes; the limit is {limit} bytes"),
        )
    }

    /// This failure with its guest-made text cut to the fixed limits (the code too: a
    /// guest's own error may name any code).
    pub(crate) fn bounded(self) -> Self {
        let code = match self.code {
            NodeErrorCode::Other(code) => NodeErrorCode::Other(guest_text::bounded(code, MAX_CODE_BYTES)),
            named => named,
        };
        Self {
            code,
            message: guest_text::bounded(self.message, guest_text::ERROR_MESSAGE_BYTES),
            traceback: self
                .traceback
                .map(|t| guest_text::bounded(t, guest_text::TRACEBACK_BYTES)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_error_is_a_node_execution_error_naming_its_own_code() {
        let failure = NodeFailure::from_guest("empty_slug".into(), "nothing to slug".into());
        assert_eq!(failure.code, NodeErrorCode::NodeExecutionError);
        assert_eq!(failure.code.as_str(), "node_execution_error");
        assert_eq!(failure.message, "nothing to slug (empty_slug)");
        let plain = NodeFailure::from_guest("node_execution_error".into(), "failed".into());
        assert_eq!(plain.message, "failed");
    }

    #[test]
    fn a_code_no_variant_names_is_cut_to_its_bound() {
        let long = NodeFailure::new(NodeErrorCode::Other("x".repeat(200)), "m").bounded();
        assert!(long.code.as_str().len() <= MAX_CODE_BYTES, "{}", long.code);
        assert!(long.code.as_str().starts_with("xxxx"));
    }
}
