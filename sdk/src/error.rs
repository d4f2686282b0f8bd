//! Constructors and conversions for [`NodeError`].

use crate::{NodeError, NodeErrorCode};

impl NodeError {
    /// An error with a snake_case `code` (for example `invalid_regex`, or a
    /// [`NodeErrorCode`]) and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        NodeError {
            code: code.into(),
            message: message.into(),
        }
    }

    /// An `invalid_input` error: an input was missing, of the wrong type or out of range.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(NodeErrorCode::InvalidInput, message)
    }

    /// A `canceled` error, for a node that stops because its job was canceled.
    pub fn canceled() -> Self {
        Self::new(NodeErrorCode::Canceled, "the job was canceled")
    }

    /// The error's code as the shared [`NodeErrorCode`]: a named one, or `Other`.
    pub fn error_code(&self) -> NodeErrorCode {
        NodeErrorCode::parse(&self.code)
    }
}

macro_rules! invalid_input_from {
    ($($ty:ty),*) => {$(
        impl From<$ty> for NodeError {
            fn from(err: $ty) -> Self {
                NodeError::invalid_input(err.to_string())
            }
        }
    )*};
}

invalid_input_from!(
    std::num::TryFromIntError,
    std::num::ParseIntError,
    std::num::ParseFloatError,
    std::str::ParseBoolError,
    std::char::TryFromCharError,
    std::string::FromUtf8Error,
    std::str::Utf8Error
);
