//! weft: a workflow job server. Callers submit ComfyUI API-format node graphs over the v2
//! job API; every node class is a sandboxed WebAssembly component.
//!
//! Layers, each depending only on those below it: `api` → `jobs` → `graph` → `runtime` →
//! `compute`, with `store` holding everything persistent.

/// mimalloc for every binary built on this crate (the server, its benchmarks and tests).
/// The sampling hot path allocates tens of megabytes per layer (84 MB for one SD1
/// feed-forward projection); glibc maps each such block afresh and the first touch of every
/// 4 KiB page faults, which made those products run at a third of their speed. mimalloc
/// reuses the memory it already holds.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod api;
pub mod compute;
pub mod graph;
pub mod jobs;
pub mod runtime;
pub mod serve;
pub mod store;
pub mod v2m;
