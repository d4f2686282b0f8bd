//! Crash recovery, run once by `serve` before the workers start when the store is this
//! process's alone: every job that was accepted is accounted for. Queued jobs are queued
//! again. Jobs that were running are run again from the start (their partial outputs are
//! discarded first, so the re-run commits a clean set: every built-in node is safe to
//! re-run). Jobs that were canceling are canceled. [`rescue`](super::rescue) applies the
//! same rules, job by job, to the jobs of a dead process when several share the store.

use std::sync::Arc;

use super::state::Trigger;
use super::Jobs;
use crate::store::{JobRecord, JobStatus, JobUpdate, StoreError};

/// What recovery did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovered {
    /// Queued jobs put back in the queue.
    pub requeued: usize,
    /// Interrupted jobs that will run again.
    pub rerun: usize,
    /// Jobs that were being canceled.
    pub canceled: usize,
}

/// Recovers the jobs a previous process left unfinished.
pub async fn recover(jobs: &Arc<Jobs>) -> Result<Recovered, StoreError> {
    let mut done = Recovered::default();
    let pending = jobs.store.jobs_with_status(&JobStatus::UNFINISHED).await?;
    for job in pending {
        if recover_one(jobs, &job, &mut done).await? {
            let _ = jobs.queue.push(&job.tenant, job.id.clone(), true);
        }
    }
    Ok(done)
}

/// Settles one unfinished job whose process is gone, counting it in `done`; returns
/// whether it is queued to run (again).
pub(super) async fn recover_one(jobs: &Jobs, job: &JobRecord, done: &mut Recovered) -> Result<bool, StoreError> {
    match job.status {
        JobStatus::Queued => {
            done.requeued += 1;
            Ok(true)
        }
        JobStatus::Running => {
            jobs.store.delete_job_outputs(&job.id).await?;
            let update = JobUpdate {
                progress: Some(Default::default()),
                ..Default::default()
            };
            if jobs.transition(&job.id, Trigger::Requeue, update).await?.is_none() {
                return Ok(false);
            }
            done.rerun += 1;
            Ok(true)
        }
        JobStatus::Canceling => {
            if jobs
                .transition(&job.id, Trigger::Requeue, JobUpdate::default())
                .await?
                .is_some()
            {
                done.canceled += 1;
            }
            Ok(false)
        }
        _ => Ok(false),
    }
}
