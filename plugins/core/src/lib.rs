//! weft's built-in core nodes: primitives, ComfyUI's string nodes, and text output.
//!
//! Class names, inputs, defaults and categories follow ComfyUI
//! (`comfy_extras/nodes_primitive.py`, `comfy_extras/nodes_string.py`); `PreviewAny` follows
//! ComfyUI's `nodes_preview_any.py`; `SaveText` and `LogText` are weft's own.

mod primitive;
mod string;
mod strings;
mod text;

pub use primitive::{PrimitiveBoolean, PrimitiveFloat, PrimitiveInt, PrimitiveString, PrimitiveStringMultiline};
pub use string::{
    CaseConverter, RegexExtract, RegexMatch, StringCompare, StringConcatenate, StringContains, StringLength,
    StringReplace, StringSubstring, StringTrim,
};
pub use text::{LogText, PreviewAny, SaveText};

weft_sdk::export_plugin!(
    PrimitiveString,
    PrimitiveStringMultiline,
    PrimitiveInt,
    PrimitiveFloat,
    PrimitiveBoolean,
    StringConcatenate,
    StringSubstring,
    StringLength,
    CaseConverter,
    StringTrim,
    StringReplace,
    StringContains,
    StringCompare,
    RegexMatch,
    RegexExtract,
    SaveText,
    LogText,
    PreviewAny,
);
