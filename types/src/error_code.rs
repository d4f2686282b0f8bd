//! The codes a node's failure is reported with: a job's `error.code`, and the `code` of a
//! `node-error` that a host function or the SDK returns to a guest. The wire form of each is
//! the snake_case string [`NodeErrorCode::as_str`] gives; a guest may name any other code,
//! which travels as [`NodeErrorCode::Other`].

use alloc::string::String;
use core::fmt;

/// Declares [`NodeErrorCode`] with one variant per code the host or the SDK produces, and
/// its wire string; `Other` carries any other code.
macro_rules! node_error_codes {
    ($($(#[$doc:meta])* $variant:ident = $wire:literal,)*) => {
        /// The code of a node failure. Every code the host or the SDK produces has a variant;
        /// a guest may name its own, which is [`Other`](Self::Other).
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum NodeErrorCode {
            $($(#[$doc])* $variant,)*
            /// A code no variant names: a guest's own (at most [`MAX_CODE_BYTES`] bytes once
            /// the host reports it).
            Other(String),
        }

        impl NodeErrorCode {
            /// Every named code, in declaration order (not [`Other`](Self::Other)).
            pub const NAMED: &'static [NodeErrorCode] = &[$(NodeErrorCode::$variant,)*];

            /// The wire string: what jobs report and guests receive.
            pub fn as_str(&self) -> &str {
                match self {
                    $(NodeErrorCode::$variant => $wire,)*
                    NodeErrorCode::Other(code) => code,
                }
            }

            /// The code whose wire string is `code`: its variant, or [`Other`](Self::Other).
            pub fn parse(code: &str) -> NodeErrorCode {
                match code {
                    $($wire => NodeErrorCode::$variant,)*
                    other => NodeErrorCode::Other(other.into()),
                }
            }
        }
    };
}

node_error_codes! {
    /// The node failed: a guest's own error (its code is named in the message) or a host
    /// error while running it.
    NodeExecutionError = "node_execution_error",
    /// The node ran past its time limit.
    NodeTimeout = "node_timeout",
    /// The node passed a memory limit: its linear memory or tables, or the job's or the
    /// server's budget of host-held values.
    NodeMemoryLimit = "node_memory_limit",
    /// The node overflowed its wasm stack.
    NodeStackOverflow = "node_stack_overflow",
    /// The node passed more bytes through host calls than its budget.
    NodeHostcallLimit = "node_hostcall_limit",
    /// The node returned, or copied at once, more bytes than the limit.
    NodeOutputTooLarge = "node_output_too_large",
    /// The node panicked.
    NodePanic = "node_panic",
    /// The node trapped.
    NodeTrap = "node_trap",
    /// The job was canceled.
    Canceled = "canceled",
    /// The job's outputs passed their limit.
    JobOutputLimit = "job_output_limit",
    /// An output file could not be committed.
    OutputCommitFailed = "output_commit_failed",
    /// The server failed in a way that is not the node's fault.
    InternalError = "internal_error",
    /// An input was missing, of the wrong type or out of range.
    InvalidInput = "invalid_input",
    /// The plugin has no node of the class asked for.
    UnknownClass = "unknown_class",
    /// An asset the workflow referenced cannot be read.
    MissingAsset = "missing_asset",
    /// A model file is not in its models folder (or there is no models directory).
    ModelNotFound = "model_not_found",
    /// A model file name is malformed or leads outside its folder.
    InvalidModelName = "invalid_model_name",
    /// A model file is not one weft can use.
    InvalidModel = "invalid_model",
    /// A value would be larger than the host makes.
    ValueTooLarge = "value_too_large",
    /// A host computation failed.
    ComputeFailed = "compute_failed",
    /// A host computation was interrupted.
    Interrupted = "interrupted",
    /// Video-to-music was given no video.
    MissingVideo = "missing_video",
    /// Video-to-music cannot read the video.
    UnreadableVideo = "unreadable_video",
    /// The video is longer than video-to-music takes.
    VideoTooLong = "video_too_long",
    /// More copies were asked of video-to-music than it makes.
    TooManyCopies = "too_many_copies",
    /// The SoundFont of video-to-music could not be loaded.
    SoundfontError = "soundfont_error",
    /// Video-to-music failed to generate.
    GenerationFailed = "generation_failed",
}

/// The most bytes of a code the host reports; a longer guest code is cut.
pub const MAX_CODE_BYTES: usize = 64;

impl fmt::Display for NodeErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for NodeErrorCode {
    fn from(code: &str) -> Self {
        NodeErrorCode::parse(code)
    }
}

impl From<String> for NodeErrorCode {
    fn from(code: String) -> Self {
        match NodeErrorCode::parse(&code) {
            NodeErrorCode::Other(_) => NodeErrorCode::Other(code),
            named => named,
        }
    }
}

impl From<NodeErrorCode> for String {
    fn from(code: NodeErrorCode) -> Self {
        match code {
            NodeErrorCode::Other(code) => code,
            named => named.as_str().into(),
        }
    }
}

impl PartialEq<str> for NodeErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for NodeErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use std::vec::Vec;

    #[test]
    fn every_named_code_parses_back_to_itself() {
        for code in NodeErrorCode::NAMED {
            assert_eq!(&NodeErrorCode::parse(code.as_str()), code);
            assert_eq!(&NodeErrorCode::from(String::from(code.clone())), code);
        }
    }

    #[test]
    fn the_wire_strings_are_the_released_ones() {
        let wire: Vec<&str> = NodeErrorCode::NAMED.iter().map(NodeErrorCode::as_str).collect();
        assert_eq!(
            wire,
            [
                "node_execution_error",
                "node_timeout",
                "node_memory_limit",
                "node_stack_overflow",
                "node_hostcall_limit",
                "node_output_too_large",
                "node_panic",
                "node_trap",
                "canceled",
                "job_output_limit",
                "output_commit_failed",
                "internal_error",
                "invalid_input",
                "unknown_class",
                "missing_asset",
                "model_not_found",
                "invalid_model_name",
                "invalid_model",
                "value_too_large",
                "compute_failed",
                "interrupted",
                "missing_video",
                "unreadable_video",
                "video_too_long",
                "too_many_copies",
                "soundfont_error",
                "generation_failed",
            ]
        );
        assert!(wire.iter().all(|w| w.len() <= MAX_CODE_BYTES));
    }

    #[test]
    fn a_code_no_variant_names_is_kept_as_the_guest_wrote_it() {
        let code = NodeErrorCode::from("empty_slug");
        assert_eq!(code, NodeErrorCode::Other("empty_slug".into()));
        assert_eq!(code.as_str(), "empty_slug");
        assert_eq!(String::from(code), "empty_slug");
    }
}
