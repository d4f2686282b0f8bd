//! Admission against the shared queue's bounds without counting the queue at every
//! submission: a count of the queue (all jobs, and the tenant's) is kept for a moment, plus
//! this process's submissions since. While that is below half of each bound a submission
//! is admitted at once; nearer, the queue is counted again. Other processes' submissions
//! within the moment are not seen, so a bound can be passed by what all processes admit in
//! one [`FRESH_FOR`] while the count stood below half of it: bounded, and corrected at the
//! next count.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a count of the queue is used.
const FRESH_FOR: Duration = Duration::from_millis(100);

/// The most tenants whose counts are kept; beyond it stale ones are dropped.
const MOST_TENANTS: usize = 1024;

/// Recent counts of the shared queue: per tenant, when counted, all queued jobs and the
/// tenant's, each with this process's submissions since added.
#[derive(Default)]
pub(crate) struct Room(Mutex<HashMap<String, (Instant, usize, usize)>>);

impl Room {
    /// Whether a fresh count says `tenant` is below half of both `limits` (all, tenant's).
    pub(crate) fn far_below(&self, tenant: &str, limits: (usize, usize)) -> bool {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(tenant).is_some_and(|&(at, all, mine)| {
            at.elapsed() < FRESH_FOR && all.saturating_mul(2) < limits.0 && mine.saturating_mul(2) < limits.1
        })
    }

    /// Records a count of the queue: `all` jobs, `mine` of `tenant`.
    pub(crate) fn counted(&self, tenant: &str, all: usize, mine: usize) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() >= MOST_TENANTS {
            counts.retain(|_, (at, _, _)| at.elapsed() < FRESH_FOR);
        }
        if counts.len() < MOST_TENANTS {
            counts.insert(tenant.to_string(), (Instant::now(), all, mine));
        }
    }

    /// Adds a job `tenant` submitted through this process to the counts.
    pub(crate) fn submitted(&self, tenant: &str) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (name, (_, all, mine)) in counts.iter_mut() {
            *all += 1;
            if name == tenant {
                *mine += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_count_admits_below_half_of_each_bound_and_counts_what_this_process_adds() {
        let room = Room::default();
        assert!(!room.far_below("a", (10, 10)), "nothing counted yet");
        room.counted("a", 3, 3);
        assert!(room.far_below("a", (10, 10)));
        assert!(!room.far_below("b", (10, 10)), "another tenant is counted on its own");
        room.submitted("a");
        room.submitted("a");
        assert!(!room.far_below("a", (10, 10)), "5 of 10 is not below half");
        room.counted("b", 1, 1);
        room.submitted("a");
        assert!(!room.far_below("b", (4, 10)), "every tenant's count of all jobs grows");
    }
}
