//! The one wasmtime engine: pooling allocator, epoch interruption, and the ticker thread
//! that drives epochs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::limits::Limits;

/// How often the epoch advances. Each running call checks its deadline and its job's
/// cancel flag once per tick, so a cancel interrupts a node within about this long.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Bytes of each pooled linear memory and table kept mapped between calls (see [`build`]):
/// a Rust guest's 1 MiB stack, its data and the start of its heap. Only pages a call wrote
/// stay resident, so the pool holds at most this much per memory slot that was ever used
/// (16 slots with 4 workers: 64 MiB); a guest that writes more pays for the rest with
/// madvise and page faults, as before.
const KEEP_RESIDENT: usize = 4 << 20;

/// Builds the engine for `limits`, with pool slots for `concurrent_calls` simultaneous calls.
pub(crate) fn build(limits: &Limits, concurrent_calls: u32) -> anyhow::Result<Engine> {
    let slots = concurrent_calls.max(4);
    let mut pool = PoolingAllocationConfig::default();
    pool.total_component_instances(slots)
        .total_core_instances(slots * limits.instances as u32)
        .total_memories(slots * 2)
        .total_tables(slots * 4)
        .max_memories_per_component(2)
        .max_tables_per_component(8)
        .max_core_instances_per_component(limits.instances as u32)
        .table_elements(limits.table_elements)
        .max_memory_size(limits.memory_bytes)
        .max_component_instance_size(1 << 20)
        .max_core_instance_size(1 << 20)
        // A freed slot is reset in place: the kernel's PAGEMAP_SCAN finds the pages the call
        // wrote and only those are restored (copied back from the image or zeroed), up to
        // KEEP_RESIDENT; beyond it, and without the ioctl, pages are released with madvise.
        // So the next call finds its pages mapped instead of faulting them in again, and a
        // call that wrote little costs little to reset.
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .table_keep_resident(KEEP_RESIDENT)
        .pagemap_scan(Enabled::Auto);
    let mut config = Config::new();
    config
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .epoch_interruption(true)
        .max_wasm_stack(limits.stack_bytes)
        .cranelift_opt_level(wasmtime::OptLevel::Speed);
    Ok(Engine::new(&config)?)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
pub(crate) struct EpochTicker {
    stop: Arc<AtomicBool>,
}

impl EpochTicker {
    /// Starts the ticker thread for `engine`.
    pub(crate) fn start(engine: &Engine) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = engine.weak();
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("weft-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    match engine.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .expect("spawning the epoch thread");
        Self { stop }
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
