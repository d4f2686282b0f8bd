//! The global allocator of weft's binaries: mimalloc, with two options set while the process
//! loads.
//!
//! The allocator is a process-wide choice, so it belongs to the binary, not to a library that
//! others link: this crate only provides [`install!`], which each binary (the `weft` server,
//! the benchmarks that run the compute engine in-process) invokes once.
//!
//! The sampling hot path allocates tens of megabytes per layer (84 MB for one SD1
//! feed-forward projection); glibc maps each block over 32 MiB afresh and the first touch of
//! every 4 KiB page faults, which made those products run at a third of their speed.
//! mimalloc reuses the memory it already holds.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use libmimalloc_sys::{mi_option_set, mi_option_t, mi_option_use_numa_nodes};

#[doc(hidden)]
pub use mimalloc::MiMalloc;

/// `mi_option_purge_delay`: it comes right before `mi_option_use_numa_nodes` in mimalloc's
/// `mi_option_e`. The Rust bindings name neither this option nor [`ALLOW_THP`]; both indices
/// are read from mimalloc 3's header, and a test pins the major version.
const PURGE_DELAY: mi_option_t = mi_option_use_numa_nodes - 1;

/// `mi_option_allow_thp` in mimalloc 3's `mi_option_e`.
const ALLOW_THP: mi_option_t = 43;

/// Makes mimalloc the global allocator of the binary it is invoked in, and runs
/// [`configure`] while the process loads (Linux), before `main` and before Rust's runtime
/// allocates: mimalloc reserves its first arena on the first allocation, and transparent
/// huge pages are decided there. Invoke it once, in a binary crate.
#[macro_export]
macro_rules! install {
    () => {
        #[global_allocator]
        static WEFT_ALLOCATOR: $crate::MiMalloc = $crate::MiMalloc;

        #[cfg(target_os = "linux")]
        #[used]
        #[link_section = ".init_array"]
        static WEFT_ALLOCATOR_CONFIGURE: extern "C" fn() = {
            extern "C" fn on_load() {
                $crate::configure();
            }
            on_load
        };
    };
}

/// Sets mimalloc's options ([`install!`] calls it while the process loads):
/// - freed memory is kept for ten seconds (the default is 10 ms) before it goes back to the
///   OS: the sampler frees and reallocates the same tens of megabytes layer after layer, and
///   memory handed back in between returns as one page fault per 4 KiB. An SD1 UNet call
///   takes about 4 s from one 64×64 level to the same level on the way up, so with a
///   one-second delay the up path faulted its buffers in afresh (293,000 faults, 1.1 GiB,
///   per step; 62,000 with ten seconds, and the step 5% faster). Memory left idle for ten
///   seconds still goes back;
/// - transparent huge pages are left alone: with them (Linux's `madvise` mode), the idle
///   server's RSS was 51 MiB instead of 31.
pub fn configure() {
    // SAFETY: setting an option is a plain store into mimalloc's option table.
    unsafe {
        mi_option_set(PURGE_DELAY, 10_000);
        mi_option_set(ALLOW_THP, 0);
    }
}

/// Hands freed memory back to the OS now, without waiting for the purge delay that
/// [`configure`] sets: mimalloc purges lazily, on later allocations, so an idle process
/// would otherwise keep what it freed. Call it after dropping a large amount of memory
/// (an aged-out cache, say); it costs a walk over the allocator's free pages.
///
/// It reaches the calling thread's pages and the pages every thread has given back; a
/// thread keeps the rest until it collects too ([`release_on_every_thread`]). It also trims
/// the C allocator, which the C libraries linked in (SQLite's page caches) allocate from.
pub fn release_free_memory() {
    // SAFETY: `mi_collect` takes no pointers; it is safe to call from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointers and locks each arena it trims.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Asks every thread that calls [`release_if_asked`] when it goes idle (a runtime's park
/// hook) to hand its free memory back at its next idle moment, and does so for this thread
/// now. For a process that has gone idle after a load: each thread's allocator heap keeps
/// the pages it last used.
pub fn release_on_every_thread() {
    RELEASE_EPOCH.fetch_add(1, Ordering::Relaxed);
    release_if_asked();
}

/// Hands this thread's free memory back if [`release_on_every_thread`] asked for it since
/// this thread last did; otherwise costs one atomic load. Meant for idle hooks such as
/// tokio's `on_thread_park`.
pub fn release_if_asked() {
    let asked = RELEASE_EPOCH.load(Ordering::Relaxed);
    if RELEASED_AT.with(|done| done.replace(asked)) != asked {
        release_free_memory();
    }
}

/// How many times [`release_on_every_thread`] was called.
static RELEASE_EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The [`RELEASE_EPOCH`] this thread last released at.
    static RELEASED_AT: Cell<u64> = const { Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::install!();

    /// The option indices come from mimalloc 3's header, and the options are set before
    /// `main`.
    #[test]
    fn the_options_are_set_in_mimalloc_3() {
        // SAFETY: plain reads of mimalloc's version and option table.
        let (version, purge_delay, allow_thp) = unsafe {
            (
                libmimalloc_sys::mi_version(),
                libmimalloc_sys::mi_option_get(PURGE_DELAY),
                libmimalloc_sys::mi_option_get(ALLOW_THP),
            )
        };
        assert_eq!(version / 10000, 3, "the option indices are mimalloc 3's: {version}");
        assert_eq!(purge_delay, 10_000);
        assert_eq!(allow_thp, 0);
    }

    /// A thread releases once per request, and a thread started after a request releases
    /// at its first idle moment.
    #[test]
    fn each_thread_releases_once_per_request() {
        let released_at = || RELEASED_AT.with(Cell::get);
        release_on_every_thread();
        let asked = RELEASE_EPOCH.load(Ordering::Relaxed);
        assert_eq!(released_at(), asked, "the asking thread released at once");
        release_if_asked();
        assert_eq!(released_at(), asked);
        let other = std::thread::spawn(move || {
            let before = RELEASED_AT.with(Cell::get);
            release_if_asked();
            (before, RELEASED_AT.with(Cell::get))
        })
        .join()
        .unwrap();
        assert_eq!(other, (0, asked));
    }
}
