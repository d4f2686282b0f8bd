//! weft: a workflow job server. Callers submit ComfyUI API-format node graphs over the v2
//! job API; every node class is a sandboxed WebAssembly component.
//!
//! Layers, each depending only on those below it: `api` → `jobs` → `graph` → `runtime`,
//! with `store` holding everything persistent. The numeric engine (`weft-compute`) and
//! the video-to-music engine (`weft-v2m`) are crates below all of them.

pub mod api;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod graph;
pub mod jobs;
pub mod runtime;
pub mod serve;
pub mod store;

/// The message of a caught panic (its `&str` or `String` payload), or "no message".
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}
