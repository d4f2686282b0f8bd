//! The limits every node call runs under. Each default is set here, once, with the reason.

use std::time::Duration;

/// Limits applied to every node invocation. Operators set them with `weft serve` flags,
/// whose defaults are the `DEFAULT_*` constants below, in the flags' units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall time one node call may run. Ten minutes by default: long enough for a CPU
    /// diffusion step loop, short enough that a runaway guest cannot hold a worker forever.
    pub node_timeout: Duration,
    /// Largest size of each linear memory of an instance. 256 MiB: pixels, latents and
    /// weights are host-held, so a guest only needs memory for its own bookkeeping.
    pub memory_bytes: usize,
    /// Largest number of elements in one table (function pointers of the guest).
    pub table_elements: usize,
    /// Largest number of core instances, tables and memories one component may create.
    pub instances: usize,
    /// Bytes one call may pass through host calls and return in its result: strings, lists
    /// and file bytes. 64 MiB stops a guest flooding the host through its outputs.
    pub hostcall_bytes: usize,
    /// Size of the per-job log tail. 64 KiB keeps the end of a run, where errors are.
    pub log_bytes: usize,
    /// wasm stack size. 1 MiB is generous for real nodes; deeper recursion traps cleanly.
    pub stack_bytes: usize,
    /// Host memory one job's values (images, latents, masks, audio, conditioning) may hold
    /// at once. 4 GiB: an SD1.5 job at 512x512 needs well under 1 GiB besides its model,
    /// and four 16384x5461 images fit.
    pub job_memory_bytes: u64,
    /// Host memory every job's values together may hold: the server's bound whatever the
    /// tenants do. By default three quarters of the machine's memory, the rest being left
    /// to loaded models, wasm instances and the system (8 GiB where it cannot be read).
    pub host_memory_bytes: u64,
}

/// The default server-wide budget of host-held values: see [`Limits::host_memory_bytes`].
pub fn default_host_memory() -> u64 {
    super::memory::machine_memory().map_or(8 << 30, |total| total / 4 * 3)
}

impl Limits {
    /// The default of [`node_timeout`](Self::node_timeout), in milliseconds
    /// (`--node-timeout-ms`).
    pub const DEFAULT_NODE_TIMEOUT_MS: u64 = 600_000;
    /// The default of [`memory_bytes`](Self::memory_bytes), in MiB (`--node-memory-mib`).
    pub const DEFAULT_MEMORY_MIB: usize = 256;
    /// The default of [`hostcall_bytes`](Self::hostcall_bytes), in MiB (`--hostcall-mib`).
    pub const DEFAULT_HOSTCALL_MIB: usize = 64;
    /// The default of [`log_bytes`](Self::log_bytes), in KiB (`--log-kib`).
    pub const DEFAULT_LOG_KIB: usize = 64;
    /// The default of [`job_memory_bytes`](Self::job_memory_bytes), in MiB
    /// (`--job-memory-mib`).
    pub const DEFAULT_JOB_MEMORY_MIB: u64 = 4096;
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            node_timeout: Duration::from_millis(Self::DEFAULT_NODE_TIMEOUT_MS),
            memory_bytes: Self::DEFAULT_MEMORY_MIB << 20,
            table_elements: 100_000,
            instances: 32,
            hostcall_bytes: Self::DEFAULT_HOSTCALL_MIB << 20,
            log_bytes: Self::DEFAULT_LOG_KIB << 10,
            stack_bytes: 1 << 20,
            job_memory_bytes: Self::DEFAULT_JOB_MEMORY_MIB << 20,
            host_memory_bytes: default_host_memory(),
        }
    }
}

/// The host-call byte budget of one call: [`Limits::hostcall_bytes`], spent by the strings,
/// lists and file bytes the guest passes through host calls.
#[derive(Debug)]
pub struct HostcallBudget {
    spent: usize,
    /// The cap.
    pub limit: usize,
    /// Set once the guest went over the cap.
    pub hit: bool,
}

impl HostcallBudget {
    /// A budget of `limit` bytes, none spent.
    pub fn new(limit: usize) -> Self {
        Self {
            spent: 0,
            limit,
            hit: false,
        }
    }

    /// Counts `bytes` against the budget; an error (which traps the guest) when it is spent.
    pub fn charge(&mut self, bytes: usize) -> wasmtime::Result<()> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.limit {
            self.hit = true;
            wasmtime::bail!("host-call byte limit of {} bytes exceeded", self.limit);
        }
        Ok(())
    }
}

/// The `wasmtime::ResourceLimiter` of one call. It records which limit was hit, so the
/// failure is reported as that limit rather than as a generic trap.
#[derive(Debug)]
pub struct CallLimiter {
    memory_bytes: usize,
    table_elements: usize,
    instances: usize,
    /// Set once a memory growth was refused.
    pub memory_hit: bool,
    /// Set once a table growth was refused.
    pub table_hit: bool,
}

impl CallLimiter {
    /// A limiter enforcing `limits`.
    pub fn new(limits: &Limits) -> Self {
        Self {
            memory_bytes: limits.memory_bytes,
            table_elements: limits.table_elements,
            instances: limits.instances,
            memory_hit: false,
            table_hit: false,
        }
    }
}

impl wasmtime::ResourceLimiter for CallLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = desired <= self.memory_bytes && maximum.is_none_or(|max| desired <= max);
        self.memory_hit |= !allowed;
        Ok(allowed)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = desired <= self.table_elements && maximum.is_none_or(|max| desired <= max);
        self.table_hit |= !allowed;
        Ok(allowed)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        self.instances
    }

    fn memories(&self) -> usize {
        self.instances
    }
}
