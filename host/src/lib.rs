//! weft: a workflow job server. Callers submit ComfyUI API-format node graphs over the v2
//! job API; every node class is a sandboxed WebAssembly component.
//!
//! Layers, each depending only on those below it: `api` → `jobs` → `graph` → `runtime`,
//! with `store` holding everything persistent. The numeric engine is the `weft-compute`
//! crate, below all of them.

pub mod api;
pub mod graph;
pub mod jobs;
pub mod runtime;
pub mod serve;
pub mod store;
pub mod v2m;
