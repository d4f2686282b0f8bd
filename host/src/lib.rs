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

/// Has mimalloc keep freed memory for a second (its default is 10 ms) before handing it back
/// to the OS. The sampler frees and reallocates the same tens of megabytes layer after
/// layer; memory handed back in between comes back as one page fault per 4 KiB (a few
/// percent of an SD1 step). Memory left idle still goes back. Called when the compute core
/// starts ([`compute::device::select_device`]).
pub(crate) fn hold_freed_memory() {
    use libmimalloc_sys::{mi_option_set, mi_option_t, mi_option_use_numa_nodes};
    // `mi_option_purge_delay` comes right before `mi_option_use_numa_nodes` in mimalloc's
    // `mi_option_e` (v2 and v3); the Rust bindings do not name it.
    const PURGE_DELAY: mi_option_t = mi_option_use_numa_nodes - 1;
    // SAFETY: setting an option is a plain store into mimalloc's option table.
    unsafe { mi_option_set(PURGE_DELAY, 1000) };
}

pub mod api;
pub mod compute;
pub mod graph;
pub mod jobs;
pub mod runtime;
pub mod serve;
pub mod store;
pub mod v2m;

#[cfg(test)]
mod tests {
    /// The option index used by [`super::hold_freed_memory`] is mimalloc's purge delay: its
    /// default is 10 ms until set.
    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        use libmimalloc_sys::{mi_option_get, mi_option_use_numa_nodes};
        let purge_delay = mi_option_use_numa_nodes - 1;
        // SAFETY: reading an option is a plain load from mimalloc's option table.
        let before = unsafe { mi_option_get(purge_delay) };
        assert!(before == 10 || before == 1000, "not the purge delay: {before}");
        super::hold_freed_memory();
        assert_eq!(unsafe { mi_option_get(purge_delay) }, 1000);
    }
}
