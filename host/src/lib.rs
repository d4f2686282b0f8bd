//! weft: a workflow job server. Callers submit ComfyUI API-format node graphs over the v2
//! job API; every node class is a sandboxed WebAssembly component.
//!
//! Layers, each depending only on those below it: `api` → `jobs` → `graph` → `runtime` →
//! `compute`, with `store` holding everything persistent.

mod allocator;
pub mod api;
pub mod compute;
pub mod graph;
pub mod jobs;
pub mod runtime;
pub mod serve;
pub mod store;
pub mod v2m;
