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

/// Runs [`configure_allocator`] while the process loads, before `main` and before Rust's
/// runtime allocates: mimalloc reserves its first arena on the first allocation.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static CONFIGURE_ALLOCATOR: extern "C" fn() = {
    extern "C" fn configure() {
        configure_allocator();
    }
    configure
};

/// Has mimalloc leave transparent huge pages alone: with them (Linux's `madvise` mode), the
/// idle server's RSS was 51 MiB instead of 31.
#[cfg(target_os = "linux")]
fn configure_allocator() {
    // SAFETY: setting an option is a plain store into mimalloc's option table.
    unsafe { libmimalloc_sys::mi_option_set(ALLOW_THP, 0) };
}

/// `mi_option_allow_thp` in mimalloc 3's `mi_option_e` (the Rust bindings do not name it);
/// a test pins the mimalloc major version it was read from.
const ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

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

    /// [`super::ALLOW_THP`] is an index into mimalloc 3's option list, and the option is set
    /// before `main`.
    #[test]
    fn transparent_huge_pages_are_off_in_mimalloc_3() {
        // SAFETY: plain reads of mimalloc's version and option table.
        let (version, allow_thp) = unsafe {
            (
                libmimalloc_sys::mi_version(),
                libmimalloc_sys::mi_option_get(super::ALLOW_THP),
            )
        };
        assert_eq!(
            version / 10000,
            3,
            "ALLOW_THP was read from mimalloc 3's header: {version}"
        );
        assert_eq!(allow_thp, 0);
    }
}
