//! Host memory accounting: every value a node makes through a host function (images,
//! masks, latents, audio, conditioning) is charged, before it is allocated, to its job and
//! to the server, and released when the last reference to it drops.
//!
//! Public face: [`HostMemory`] (the server's budget, one per runtime), [`JobMemory`] (one
//! job's budget, drawing on the server's), [`Charge`] (the RAII guard of one reservation),
//! [`Held`] (a value with its charge, what the host's `Arc`s hold) and [`MemoryLimit`] (the
//! refusal, which becomes the node error `node_memory_limit`).

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const MIB: u64 = 1 << 20;

/// One budget: bytes in use against a limit, reserved atomically.
#[derive(Debug)]
struct Account {
    limit: u64,
    used: AtomicU64,
}

impl Account {
    fn new(limit: u64) -> Self {
        Self {
            limit,
            used: AtomicU64::new(0),
        }
    }

    /// Reserves `bytes`, or returns what was in use when that would pass the limit.
    fn reserve(&self, bytes: u64) -> Result<(), u64> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .map(|_| ())
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// The server-wide budget of host-held values, shared by every job.
#[derive(Debug)]
pub struct HostMemory(Account);

impl HostMemory {
    /// A server budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self(Account::new(limit)))
    }

    /// A fresh budget of `limit` bytes for one job, drawing on this one.
    pub fn job(self: &Arc<Self>, limit: u64) -> Arc<JobMemory> {
        Arc::new(JobMemory {
            account: Account::new(limit),
            host: self.clone(),
        })
    }
}

/// One job's budget of host-held values. Values outlive their job only in the node cache,
/// which holds them (and their charge) within its own byte budget.
#[derive(Debug)]
pub struct JobMemory {
    account: Account,
    host: Arc<HostMemory>,
}

impl JobMemory {
    /// A budget that never refuses, drawing on an unlimited server budget: for calls that
    /// belong to no job (a plugin's `describe()`).
    pub fn unlimited() -> Arc<Self> {
        HostMemory::new(u64::MAX).job(u64::MAX)
    }

    /// Reserves `bytes` for `what` against the job's budget and the server's; the
    /// reservation lasts as long as the returned guard.
    /// `what` names the value in the refusal.
    pub fn charge(self: &Arc<Self>, bytes: u64, what: impl FnOnce() -> String) -> Result<Charge, MemoryLimit> {
        let refused = match self.account.reserve(bytes) {
            Err(used) => Some((Budget::Job, self.account.limit, used)),
            Ok(()) => match self.host.0.reserve(bytes) {
                Err(used) => {
                    self.account.release(bytes);
                    Some((Budget::Server, self.host.0.limit, used))
                }
                Ok(()) => None,
            },
        };
        if let Some((budget, limit, used)) = refused {
            return Err(MemoryLimit {
                what: what(),
                bytes,
                budget,
                limit,
                used,
            });
        }
        Ok(Charge {
            job: self.clone(),
            bytes,
        })
    }
}

/// Bytes reserved in a job's and the server's budgets, given back when dropped.
#[derive(Debug)]
pub struct Charge {
    job: Arc<JobMemory>,
    bytes: u64,
}

impl Charge {
    /// Gives back what this charge holds beyond `bytes` (once the real size is known).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            let extra = self.bytes - bytes;
            self.job.account.release(extra);
            self.job.host.0.release(extra);
            self.bytes = bytes;
        }
    }
}

impl Charge {
    /// Moves `bytes` of this charge (at most all of it) into a charge of its own, for a
    /// second value made under one reservation.
    pub fn split(&mut self, bytes: u64) -> Charge {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Charge {
            job: self.job.clone(),
            bytes,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.job.account.release(self.bytes);
        self.job.host.0.release(self.bytes);
    }
}

/// A host-held value with the charge that pays for it. The host shares it in an `Arc`, so
/// the charge is given back exactly once, when the last reference drops.
pub struct Held<T> {
    value: T,
    charge: Charge,
}

impl<T> Held<T> {
    /// `value`, paid for by `charge`.
    pub fn new(value: T, charge: Charge) -> Self {
        Self { value, charge }
    }

    /// Drops the value and keeps its charge, for a value of the same size that replaces it.
    pub fn into_charge(self) -> Charge {
        self.charge
    }
}

impl<T> Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for Held<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

/// Which budget refused a charge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// The job's (`--job-memory-mib`).
    Job,
    /// The server's (`--host-memory-mib`), shared by every job.
    Server,
}

/// A charge that would have passed a budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    /// What was being made, for example `a 4096x4096 image batch of 1`.
    pub what: String,
    /// Bytes it needed.
    pub bytes: u64,
    /// The budget it would have passed.
    pub budget: Budget,
    /// That budget's limit.
    pub limit: u64,
    /// Bytes that budget had in use.
    pub used: u64,
}

impl MemoryLimit {
    /// The node-error code: `node_memory_limit`.
    pub const CODE: weft_types::NodeErrorCode = weft_types::NodeErrorCode::NodeMemoryLimit;
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, flag) = match self.budget {
            Budget::Job => ("the job's", "--job-memory-mib"),
            Budget::Server => ("the server's", "--host-memory-mib"),
        };
        write!(
            f,
            "{} needs {} MiB of host memory, over {name} budget of {} MiB ({flag}), of which {} MiB are in use",
            self.what,
            self.bytes.div_ceil(MIB),
            self.limit / MIB,
            self.used.div_ceil(MIB),
        )
    }
}

impl std::error::Error for MemoryLimit {}

/// Memory the machine has, from `/proc/meminfo`; none where it cannot be read.
pub(crate) fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    impl HostMemory {
        fn used(&self) -> u64 {
            self.0.used.load(Ordering::Acquire)
        }
    }

    impl JobMemory {
        fn used(&self) -> u64 {
            self.account.used.load(Ordering::Acquire)
        }
    }

    impl Charge {
        fn bytes(&self) -> u64 {
            self.bytes
        }
    }

    #[test]
    fn charges_are_refused_over_either_budget_and_given_back_on_drop() {
        let host = HostMemory::new(100);
        let a = host.job(60);
        let b = host.job(60);
        let first = a.charge(50, || "first".into()).unwrap();
        let over_job = a.charge(20, || "second".into()).unwrap_err();
        assert_eq!((over_job.budget, over_job.used), (Budget::Job, 50));
        let on_b = b.charge(40, || "third".into()).unwrap();
        let over_host = b.charge(20, || "fourth".into()).unwrap_err();
        assert_eq!(over_host.budget, Budget::Server);
        assert_eq!(b.used(), 40, "a refused charge reserves nothing");
        drop(first);
        assert_eq!((a.used(), host.used()), (0, 40));
        let shared = Arc::new(Held::new(7u8, b.charge(20, || "shared".into()).unwrap()));
        let again = shared.clone();
        drop(shared);
        assert_eq!(b.used(), 60, "still referenced");
        drop(again);
        drop(on_b);
        assert_eq!((b.used(), host.used()), (0, 0));
        assert!(over_host.to_string().contains("--host-memory-mib"), "{over_host}");
    }

    #[test]
    fn shrinking_gives_back_the_difference() {
        let host = HostMemory::new(100);
        let job = host.job(100);
        let mut charge = job.charge(80, || "estimate".into()).unwrap();
        charge.shrink_to(30);
        assert_eq!((job.used(), host.used(), charge.bytes()), (30, 30, 30));
        let part = charge.split(10);
        assert_eq!((part.bytes(), charge.bytes(), job.used()), (10, 20, 30));
        drop(part);
        assert_eq!(job.used(), 20);
    }
}
