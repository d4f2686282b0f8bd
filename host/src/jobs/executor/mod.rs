//! Running one job: plan the workflow, run its nodes in dependency order (from the cache
//! where possible), commit outputs as they are produced, and record the outcome.
//!
//! - `graph_run`: the state of the graph as it runs (what is ready, whose turn it is to
//!   commit, the first failure), with no effects of its own;
//! - `execution`: the loop that does what that state says is next (cache look-ups, node
//!   calls, commits) and tells it what happened;
//! - `commit`: one node's outputs encoded, stored and recorded, in order;
//! - `progress`: what the job's watchers see (its progress, node times, steps, previews).

mod commit;
mod execution;
mod graph_run;
mod progress;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use weft_types::NodeErrorCode;

use chrono::Utc;

use self::commit::FinalMove;
use self::execution::{Execution, JobContext};
use self::progress::Tracker;
use super::events::{JobEvent, NodePhase};
use super::state::Trigger;
use super::{Jobs, Running};
use crate::graph;
use crate::runtime::{AssetReader, AssetRef, CancelToken, TailLog};
use crate::store::blobs::LocalFile;
use crate::store::{JobError, JobLogs, JobRecord, JobStatus, JobUpdate, Progress};

/// Reads the blobs of the assets a job references, resolved before it runs (copied out of
/// object storage into temp files that last as long as the job).
struct ResolvedAssets(HashMap<String, LocalFile>);

impl AssetReader for ResolvedAssets {
    fn read(&self, asset: &AssetRef) -> Result<Vec<u8>, String> {
        let path = self
            .0
            .get(&asset.id)
            .ok_or_else(|| format!("asset {} is not available to this job", asset.id))?;
        std::fs::read(path.path()).map_err(|e| format!("asset {} cannot be read: {e}", asset.id))
    }
}

/// How a run ended, before it is recorded.
enum Outcome {
    /// With what is held for the final move.
    Succeeded(FinalMove),
    Failed(JobError),
    Canceled,
}

/// The job's error `code`, with `message`, that belongs to no node.
fn job_error(code: &str, message: String) -> JobError {
    JobError {
        code: code.into(),
        message,
        node_id: None,
        class_type: None,
        traceback: None,
    }
}

/// The event saying that `node` reached `phase`.
fn node_event(node: &graph::PlannedNode, phase: NodePhase) -> JobEvent {
    JobEvent::Node {
        node_id: node.id.clone(),
        class_type: node.class_type.clone(),
        phase,
    }
}

impl Jobs {
    /// Runs job `id` if it is still queued.
    pub(super) async fn run(self: &Arc<Self>, id: String) {
        let started = Instant::now();
        let handed_over = self.handover.take(&id);
        let update = JobUpdate {
            started_at: Some(Utc::now()),
            ..Default::default()
        };
        let job = match self.transition(&id, Trigger::Start, update).await {
            Ok(Some(job)) => job,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(job = %id, error = %e, "cannot start job");
                return;
            }
        };
        self.run_started(job, handed_over, started).await;
    }

    /// Runs `claimed`, a job that a claim of the shared store started (see
    /// [`announce_start`](Self::announce_start)). Returns whether the claim on it was given
    /// up with its outcome.
    pub(super) async fn run_claimed(self: &Arc<Self>, claimed: crate::store::ClaimedJob) -> bool {
        let workflow = Arc::new(claimed.workflow);
        self.run_started(claimed.job, Some(workflow), Instant::now()).await
    }

    /// What the start of `job` (by a claim) tells: its status event, and the metrics.
    pub(super) fn announce_start(&self, job: &JobRecord) {
        self.metrics.transition(job.status);
        self.publish(&job.id, super::status_event(job));
    }

    /// Runs `job`, just started, on `workflow` (else the one in the store), and records how
    /// it ended (with a shared store, in the background); returns whether that takes care of
    /// this process's claim on it.
    async fn run_started(
        self: &Arc<Self>,
        job: JobRecord,
        workflow: Option<Arc<serde_json::Value>>,
        started: Instant,
    ) -> bool {
        let id = job.id.clone();
        let (cancel, tracker) = self.make_running(&job, started);
        let log = TailLog::new(self.runtime().limits().log_bytes);
        let outcome = match self.execute(&job, workflow.as_deref(), &cancel, &log, &tracker).await {
            _ if cancel.is_canceled() && self.shutdown.is_abandoning() => {
                // Interrupted by the shutdown: queued again, unless the shutdown has queued
                // it already (it took the job from the running ones).
                if self
                    .running
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id)
                    .is_some()
                {
                    self.requeue_interrupted(&id).await;
                }
                return false;
            }
            Ok(_) if cancel.is_canceled() => Outcome::Canceled,
            Ok(final_move) => Outcome::Succeeded(final_move),
            Err(_) if cancel.is_canceled() => Outcome::Canceled,
            Err(e) => Outcome::Failed(e),
        };
        let (trigger, update, announce) = self.outcome_update(outcome, &log, &tracker);
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        let released = match &self.shared {
            Some(shared) => {
                // The worker goes on to its next job while the log's next batch records
                // this one's outcome (and gives up its claim).
                let (jobs, finishing) = (self.clone(), shared.finishing());
                tokio::spawn(async move {
                    let _finishing = finishing;
                    if !jobs.record_outcome(&id, trigger, update, announce).await {
                        if let Some(shared) = &jobs.shared {
                            super::shared::release(shared.coordinator.as_ref(), &id).await;
                        }
                    }
                });
                true
            }
            None => self.record_outcome(&id, trigger, update, announce).await,
        };
        self.metrics.job_finished(started.elapsed());
        released
    }

    /// Makes `job`, just started, one of the running jobs: returns its cancel token and its
    /// progress tracker.
    fn make_running(self: &Arc<Self>, job: &JobRecord, started: Instant) -> (CancelToken, Arc<Tracker>) {
        self.metrics.queue_wait(job.created_at);
        let cancel = CancelToken::new();
        let progress = Arc::new(Mutex::new(Progress::default()));
        let preview = Arc::new(Mutex::new(None));
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(
            job.id.clone(),
            Running {
                cancel: cancel.clone(),
                progress: progress.clone(),
                preview: preview.clone(),
            },
        );
        if self.shutdown.is_abandoning() {
            // Started as the grace period ended, after the running nodes were interrupted.
            cancel.cancel();
        }
        let tracker = Arc::new(Tracker::new(job.id.clone(), self.clone(), progress, preview, started));
        (cancel, tracker)
    }

    /// The move that records `outcome`, the update it writes (with the job's `log` and its
    /// progress and node times from `tracker`) and the events it announces. A success's
    /// final progress is published now.
    fn outcome_update(
        &self,
        outcome: Outcome,
        log: &TailLog,
        tracker: &Tracker,
    ) -> (Trigger, JobUpdate, Vec<JobEvent>) {
        let logs = self.config.capture_logs.then(|| {
            let snapshot = log.snapshot();
            JobLogs {
                text: snapshot.text,
                truncated: snapshot.truncated,
                captured_at: Utc::now(),
            }
        });
        let final_progress = tracker.snapshot();
        let mut announce = Vec::new();
        let (trigger, mut update) = match outcome {
            Outcome::Succeeded(final_move) => {
                // The outputs held for this move, then their node's end.
                announce.extend(
                    final_move
                        .outputs
                        .iter()
                        .map(|(asset, _)| JobEvent::Output(Box::new(asset.clone()))),
                );
                announce.extend(final_move.finished);
                let mut p = final_progress;
                p.value = 1.0;
                p.nodes_done = p.nodes_total;
                p.current_node = None;
                p.current_node_class = None;
                p.step = None;
                p.steps = None;
                tracker.update(true, |live| *live = p.clone());
                let update = JobUpdate {
                    progress: Some(p),
                    outputs: final_move.outputs,
                    ..Default::default()
                };
                (Trigger::Succeed, update)
            }
            Outcome::Failed(error) => {
                let update = JobUpdate {
                    progress: Some(final_progress),
                    error: Some(error),
                    ..Default::default()
                };
                (Trigger::Fail, update)
            }
            Outcome::Canceled => {
                let update = JobUpdate {
                    progress: Some(final_progress),
                    ..Default::default()
                };
                (Trigger::CancelComplete, update)
            }
        };
        update.logs = logs;
        update.node_times = Some(tracker.take_node_times());
        (trigger, update, announce)
    }

    /// Records job `id`'s outcome: the move by `trigger` with `update`, announcing
    /// `announce` (with a shared store, in the log's next batch, which also gives up the
    /// claim). A job canceled or expired meanwhile keeps the log, progress and node times
    /// on what it became (and a job being canceled is canceled now). Returns whether the
    /// move happened and gave up this process's claim on the job.
    async fn record_outcome(&self, id: &str, trigger: Trigger, update: JobUpdate, announce: Vec<JobEvent>) -> bool {
        let moved = match &self.shared {
            Some(shared) => {
                let moved = shared
                    .finish(id, super::state::moves(trigger), update.clone(), announce)
                    .await;
                if let Ok(Some(job)) = &moved {
                    self.metrics.transition(job.status);
                }
                moved
            }
            None => self.transition_announcing(id, trigger, update.clone(), announce).await,
        };
        match moved {
            Ok(Some(_)) => return self.shared.is_some(),
            Ok(None) => {
                if let Ok(Some(current)) = self.store.job_by_id(id).await {
                    let keep = JobUpdate {
                        progress: update.progress,
                        logs: update.logs,
                        node_times: update.node_times,
                        ..Default::default()
                    };
                    let _ = self
                        .store
                        .update_job(id, &[(current.status, current.status)], keep)
                        .await;
                    if current.status == JobStatus::Canceling {
                        let _ = self.transition(id, Trigger::CancelComplete, JobUpdate::default()).await;
                    }
                }
            }
            Err(e) => tracing::error!(job = %id, error = %e, "cannot record job outcome"),
        }
        false
    }

    /// Runs `job`'s graph: `workflow` when its submission handed it over, else the one
    /// in the store. Returns what the last node to commit held for the job's final move.
    async fn execute(
        self: &Arc<Self>,
        job: &JobRecord,
        handed_over: Option<&serde_json::Value>,
        cancel: &CancelToken,
        log: &TailLog,
        tracker: &Arc<Tracker>,
    ) -> Result<FinalMove, JobError> {
        // The runtime this job runs on to its end, even if a plugin is reloaded meanwhile.
        let runtime = self.runtime();
        // The start's record carries the workflow only where the store read it back.
        let read;
        let workflow = if let Some(workflow) = handed_over {
            workflow
        } else if job.workflow.is_null() {
            read = self.stored_workflow(job).await?;
            &read
        } else {
            &job.workflow
        };
        let plan = graph::validate(workflow, &runtime.catalog_for(workflow)).map_err(|e| {
            job_error(
                "invalid_workflow",
                format!("the workflow can no longer run: {}", e.message()),
            )
        })?;
        let assets = self.resolve_assets(job, workflow).await?;
        tracker.update(true, |p| p.nodes_total = plan.nodes.len() as u32);
        if cancel.is_canceled() {
            return Ok(FinalMove::default());
        }
        let cx = JobContext {
            job,
            cancel,
            log,
            tracker,
            runtime,
            assets: Arc::new(ResolvedAssets(assets)),
            workflow_text: workflow.to_string().into(),
        };
        Execution::new(self, &plan, cx).run().await
    }

    /// `job`'s workflow, read from the store.
    async fn stored_workflow(&self, job: &JobRecord) -> Result<serde_json::Value, JobError> {
        match self.store.job_workflow(&job.id).await {
            Ok(Some(workflow)) => Ok(workflow),
            Ok(None) => Err(job_error("invalid_workflow", "the job's workflow is gone".into())),
            Err(e) => Err(job_error(
                NodeErrorCode::InternalError.as_str(),
                format!("the job's workflow cannot be read: {e}"),
            )),
        }
    }

    /// The assets `workflow` references, each copied out of storage for `job` to read.
    async fn resolve_assets(
        &self,
        job: &JobRecord,
        workflow: &serde_json::Value,
    ) -> Result<HashMap<String, LocalFile>, JobError> {
        let mut assets = HashMap::new();
        for (_, asset) in graph::asset_refs(workflow) {
            match self.assets.get(&job.tenant, &asset.id).await {
                Ok(Some(record)) => match self.assets.local_file(&record, u64::MAX).await {
                    Ok(file) => {
                        assets.insert(asset.id, file);
                    }
                    Err(e) => {
                        return Err(job_error(
                            "missing_asset",
                            format!("asset {} cannot be read: {e}", asset.id),
                        ))
                    }
                },
                _ => {
                    return Err(job_error(
                        "missing_asset",
                        format!("asset {} no longer exists", asset.id),
                    ))
                }
            }
        }
        Ok(assets)
    }
}
