//! Crash recovery, run once by `serve` before the workers start: every job that was
//! accepted is accounted for. Queued jobs are queued again. Jobs that were running are run
//! again from the start (their partial outputs are discarded first, so the re-run commits
//! a clean set: every built-in node is safe to re-run). Jobs that were canceling are
//! canceled.

use std::sync::Arc;

use super::state::Trigger;
use super::Jobs;
use crate::store::{JobStatus, JobUpdate, StoreError};

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
    let pending = jobs
        .store
        .jobs_with_status(&[JobStatus::Queued, JobStatus::Running, JobStatus::Canceling])
        .await?;
    for job in pending {
        match job.status {
            JobStatus::Queued => done.requeued += 1,
            JobStatus::Running => {
                jobs.store.delete_job_outputs(&job.id).await?;
                let update = JobUpdate {
                    progress: Some(Default::default()),
                    ..Default::default()
                };
                if jobs.transition(&job.id, Trigger::Requeue, update).await?.is_none() {
                    continue;
                }
                done.rerun += 1;
            }
            _ => {
                jobs.transition(&job.id, Trigger::Requeue, JobUpdate::default()).await?;
                done.canceled += 1;
                continue;
            }
        }
        let _ = jobs.queue.push(&job.tenant, job.id.clone(), true);
    }
    Ok(done)
}
