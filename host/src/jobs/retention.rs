//! Retention: a small service that wakes periodically. Jobs past `expires_at` that have
//! not finished become `expired` (a running one is stopped); expired jobs are removed after
//! a grace period, finished ones at once; then idempotency keys past their lifetime
//! ([`IDEMPOTENCY_TTL`], 24 hours), uploads and previews past their own expiry go, and blobs no asset
//! references are deleted. Once an hour (and at start) the whole blob directory is checked
//! for blobs that no asset references and that are older than [`ORPHAN_GRACE`].

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::state::Trigger;
use super::Jobs;
use crate::store::{JobStatus, JobUpdate, StoreError, IDEMPOTENCY_TTL};

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Jobs moved to expired.
    pub expired: usize,
    /// Jobs removed with their outputs.
    pub removed: usize,
    /// Blobs deleted.
    pub blobs: usize,
}

/// How old an unreferenced blob must be before the orphan sweep removes it: long enough
/// for any upload or output commit under way to record its asset.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// How often the whole blob directory is scanned for orphans (the first time at start).
const ORPHAN_SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Starts the sweeper, every `interval`, with the orphan sweep every [`ORPHAN_SWEEP_EVERY`].
/// Of the processes sharing a store, only the leader sweeps.
pub fn start(jobs: Arc<Jobs>, interval: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut orphans_swept: Option<std::time::Instant> = None;
        loop {
            tick.tick().await;
            if !jobs.leads_maintenance() {
                continue;
            }
            if let Err(e) = sweep(&jobs).await {
                tracing::warn!(error = %e, "retention sweep failed");
            }
            if orphans_swept.is_none_or(|at| at.elapsed() >= ORPHAN_SWEEP_EVERY) {
                orphans_swept = Some(std::time::Instant::now());
                if let Err(e) = sweep_orphans(&jobs).await {
                    tracing::warn!(error = %e, "orphaned-blob sweep failed");
                }
            }
        }
    });
}

/// One pass.
pub async fn sweep(jobs: &Arc<Jobs>) -> Result<Swept, StoreError> {
    let now = Utc::now();
    let grace = chrono::Duration::from_std(jobs.config.expired_grace).unwrap_or_default();
    let mut swept = Swept::default();
    let mut blobs = Vec::new();
    for (id, status) in jobs.store.jobs_expiring(now).await? {
        if !status.is_terminal() {
            if jobs
                .transition(&id, Trigger::Expire, JobUpdate::default())
                .await?
                .is_some()
            {
                jobs.queue.remove_any(&id);
                jobs.handover.take(&id);
                jobs.interrupt(&id);
                swept.expired += 1;
            }
            continue;
        }
        if status == JobStatus::Expired {
            let Some(job) = jobs.store.job_by_id(&id).await? else {
                continue;
            };
            if job.updated_at + grace > now {
                continue;
            }
        }
        blobs.extend(jobs.delete_with_outputs(&id).await?);
        swept.removed += 1;
    }
    jobs.store.purge_idempotency(now - IDEMPOTENCY_TTL).await?;
    blobs.extend(jobs.store.delete_expired_assets(now).await?);
    let removed = jobs.assets.collect_garbage(blobs).await?;
    jobs.cache.forget_blobs(&removed);
    swept.blobs = removed.len();
    Ok(swept)
}

impl Jobs {
    /// Removes `tenant`'s finished job `id` with its outputs (ComfyUI's history delete);
    /// false when there is no such job or it has not finished.
    pub async fn remove_finished(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        let Some(job) = self.store.job(tenant, id).await? else {
            return Ok(false);
        };
        if !job.status.is_terminal() {
            return Ok(false);
        }
        let blobs = self.delete_with_outputs(id).await?;
        let removed = self.assets.collect_garbage(blobs).await?;
        self.cache.forget_blobs(&removed);
        Ok(true)
    }

    /// Deletes job `id` with its outputs; returns the blobs those outputs were stored in
    /// (inline outputs have none), for the caller to collect.
    async fn delete_with_outputs(&self, id: &str) -> Result<Vec<String>, StoreError> {
        let outputs = self.store.job_outputs(id).await?;
        self.store.delete_job(id).await?;
        self.hub.remove(id);
        Ok(outputs.into_iter().filter(|a| !a.inline).map(|a| a.blob).collect())
    }
}

/// Deletes blobs no asset references that are older than [`ORPHAN_GRACE`] (left by a crash
/// or a failed commit); returns how many.
pub async fn sweep_orphans(jobs: &Arc<Jobs>) -> Result<usize, StoreError> {
    let removed = jobs.assets.collect_orphans(ORPHAN_GRACE).await?;
    jobs.cache.forget_blobs(&removed);
    if !removed.is_empty() {
        tracing::info!(blobs = removed.len(), "removed orphaned blobs");
    }
    Ok(removed.len())
}
