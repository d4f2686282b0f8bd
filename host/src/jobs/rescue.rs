//! Rescue: a small service of its own, like retention, run by the leader of the processes
//! sharing a store. It wakes every [`RESCUE_EVERY`] and looks for unfinished jobs whose
//! claim lapsed: the process that held it died (kill -9, machine loss), which the database
//! shows at once when its connection closes, or stopped renewing its lease. It takes each such claim
//! over (one process wins it) and settles the job by the rules of crash
//! [`recovery`](super::recovery): a queued or running job is queued to run again from the
//! start (every built-in node is safe to re-run; partial outputs are discarded), a
//! canceling one is canceled. Then it releases the claim and wakes the workers. Every 15 s a pass also
//! gives a turn to tenants whose queued jobs have none (see
//! [`Coordinator::restore_turns`](crate::store::Coordinator::restore_turns)).

use std::sync::Arc;
use std::time::Duration;

use super::recovery::{recover_one, Recovered};
use super::Jobs;
use crate::store::StoreError;

/// How often the leader looks for lapsed claims (more often with a lease under 2 s).
const RESCUE_EVERY: Duration = Duration::from_millis(500);

/// How often a pass also gives turns back to tenants without one: a scan of the queue, and
/// needed only after an older weft queued jobs during an upgrade.
const RESTORE_TURNS_EVERY: Duration = Duration::from_secs(15);

/// Starts the rescue service, if `jobs` shares its store. It stops when the service
/// drains ([`Jobs::shut_down`]).
pub fn start(jobs: Arc<Jobs>) {
    let Some(coordinator) = jobs.coordinator().cloned() else {
        return;
    };
    tokio::spawn(async move {
        let every = RESCUE_EVERY.min(coordinator.lease() / 4);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut turns_restored: Option<std::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = jobs.shutdown.draining() => return,
            }
            // Held while the pass settles jobs: a drain waits for the pass in flight.
            let _settling = jobs.shutdown.settling.lock().await;
            if jobs.shutdown.is_draining() {
                return;
            }
            if !coordinator.is_leader() {
                continue;
            }
            let restore = turns_restored.is_none_or(|at| at.elapsed() >= RESTORE_TURNS_EVERY);
            if restore {
                turns_restored = Some(std::time::Instant::now());
            }
            match rescue(&jobs, restore).await {
                Ok(done) if done != Recovered::default() => {
                    tracing::info!(?done, "rescued the jobs of a process that stopped renewing its leases")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "rescue failed"),
            }
        }
    });
}

/// One pass: settles every job whose claim lapsed, after giving turns back to the tenants
/// without one when `restore_turns`.
pub async fn rescue(jobs: &Arc<Jobs>, restore_turns: bool) -> Result<Recovered, StoreError> {
    let mut done = Recovered::default();
    let Some(coordinator) = jobs.coordinator().cloned() else {
        return Ok(done);
    };
    let mut woke = restore_turns && coordinator.restore_turns().await? > 0;
    for id in coordinator.lapsed().await? {
        if !coordinator.take_over(&id).await? {
            continue;
        }
        let settled = match jobs.store.job_by_id(&id).await? {
            Some(job) => recover_one(jobs, &job, &mut done).await.map(|_| ()),
            None => Ok(()),
        };
        coordinator.release(&id).await?;
        settled?;
        woke = true;
    }
    if woke {
        coordinator.signal(crate::store::Signal::Work).await?;
    }
    Ok(done)
}
