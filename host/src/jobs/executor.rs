//! Running one job: plan the workflow, run its nodes in dependency order (from the cache
//! where possible), commit outputs as they are produced, and record the outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;

use super::cache::{CachedFile, Entry};
use super::events::{JobEvent, NodePhase};
use super::outputs::{self, JobFiles};
use super::state::Trigger;
use super::{Jobs, Running};
use crate::graph::{self, PlanInput};
use crate::runtime::{AssetReader, AssetRef, CallContext, CancelToken, OutputFile, ProgressSink, TailLog, Value};
use crate::store::blobs::LocalFile;
use crate::store::{AssetRecord, JobError, JobLogs, JobRecord, JobStatus, JobUpdate, NodeTime, Progress};

/// Snapshots reach the event stream at most this often.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);
/// Node step events (ComfyUI's per-step `progress`) are published at most this often,
/// except a node's last step.
const STEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

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

/// Tracks a job's progress and publishes snapshots, throttled.
struct Tracker {
    job_id: String,
    jobs: Arc<Jobs>,
    progress: Arc<Mutex<Progress>>,
    last_sent: Mutex<Option<Instant>>,
    preview: Arc<Mutex<Option<JobEvent>>>,
    last_preview: Mutex<Option<Instant>>,
    last_step: Mutex<Option<Instant>>,
    /// When the job started running, and the nodes' times so far (the last one still open
    /// while its node runs).
    times: Mutex<NodeTimes>,
}

/// The times of a job's nodes, in the order they ran.
struct NodeTimes {
    job_began: Instant,
    done: Vec<NodeTime>,
    /// When the node now running began.
    open: Option<Instant>,
}

impl NodeTimes {
    fn begin(&mut self, node: &graph::PlannedNode, cached: bool) {
        self.end();
        let now = Instant::now();
        self.done.push(NodeTime {
            node_id: node.id.clone(),
            class_type: node.class_type.clone(),
            started_ms: now.duration_since(self.job_began).as_millis() as u64,
            duration_ms: 0,
            cached,
        });
        self.open = Some(now);
    }

    /// Closes the node running, if one is.
    fn end(&mut self) {
        if let (Some(began), Some(last)) = (self.open.take(), self.done.last_mut()) {
            last.duration_ms = began.elapsed().as_millis() as u64;
        }
    }
}

impl Tracker {
    fn node_times(&self) -> std::sync::MutexGuard<'_, NodeTimes> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, force: bool, change: impl FnOnce(&mut Progress)) {
        let snapshot = {
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            change(&mut p);
            let within = match (p.step, p.steps) {
                (Some(s), Some(n)) if n > 0 => s.min(n) as f64 / n as f64,
                _ => 0.0,
            };
            p.value = if p.nodes_total == 0 {
                1.0
            } else {
                ((p.nodes_done as f64 + within) / p.nodes_total as f64).min(1.0)
            };
            p.clone()
        };
        let mut last = self.last_sent.lock().unwrap_or_else(|e| e.into_inner());
        if force || last.is_none_or(|t| t.elapsed() >= PROGRESS_INTERVAL) {
            *last = Some(Instant::now());
            drop(last);
            self.jobs.publish(&self.job_id, JobEvent::Progress(snapshot));
        }
    }
}

impl ProgressSink for Tracker {
    fn report(&self, step: u32, steps: u32, message: Option<String>) {
        let mut node = None;
        self.update(false, |p| {
            p.step = Some(step);
            p.steps = Some(steps);
            if message.is_some() {
                p.message = message;
            }
            node = p.current_node.clone().zip(p.current_node_class.clone());
        });
        let mut last = self.last_step.lock().unwrap_or_else(|e| e.into_inner());
        if step < steps && last.is_some_and(|t| t.elapsed() < STEP_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        if let Some((node_id, class_type)) = node {
            let phase = NodePhase::Step { step, steps };
            self.jobs.publish(
                &self.job_id,
                JobEvent::Node {
                    node_id,
                    class_type,
                    phase,
                },
            );
        }
    }

    fn preview(&self, content_type: &'static str, data: Vec<u8>) {
        let mut last = self.last_preview.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        let node_id = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .current_node
            .clone();
        let event = JobEvent::Preview {
            node_id: node_id.unwrap_or_default(),
            content_type: content_type.to_string(),
            data,
        };
        *self.preview.lock().unwrap_or_else(|e| e.into_inner()) = Some(event.clone());
        self.jobs.publish(&self.job_id, event);
    }
}

/// What a job has committed so far: the next output's index, and the bytes held.
#[derive(Default)]
struct Committed {
    count: i64,
    bytes: u64,
}

/// Whether one more output of `size` bytes fits bounds of `max_outputs` outputs and
/// `max_bytes` bytes, given what is `committed`; why not if not.
fn admit(max_outputs: usize, max_bytes: u64, committed: &Committed, size: u64) -> Result<(), String> {
    if committed.count as usize >= max_outputs {
        return Err(format!(
            "the job may commit at most {max_outputs} outputs (--max-job-outputs)"
        ));
    }
    if committed.bytes.saturating_add(size) > max_bytes {
        return Err(format!(
            "the job's outputs would exceed {} MiB in all (--max-job-output-mib)",
            max_bytes >> 20
        ));
    }
    Ok(())
}

/// How a run ended, before it is recorded.
enum Outcome {
    Succeeded,
    Failed(JobError),
    Canceled,
}

impl Jobs {
    /// Runs job `id` if it is still queued.
    pub(super) async fn run(self: &Arc<Self>, id: String) {
        let started = Instant::now();
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
        self.metrics.queue_wait(job.created_at);
        let cancel = CancelToken::new();
        let progress = Arc::new(Mutex::new(Progress::default()));
        let preview = Arc::new(Mutex::new(None));
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id.clone(),
            Running {
                cancel: cancel.clone(),
                progress: progress.clone(),
                preview: preview.clone(),
            },
        );
        let log = TailLog::new(self.config.log_bytes);
        let tracker = Arc::new(Tracker {
            job_id: id.clone(),
            jobs: self.clone(),
            progress,
            last_sent: Mutex::new(None),
            preview,
            last_preview: Mutex::new(None),
            last_step: Mutex::new(None),
            times: Mutex::new(NodeTimes {
                job_began: started,
                done: Vec::new(),
                open: None,
            }),
        });
        let outcome = match self.execute(&job, &cancel, &log, &tracker).await {
            Ok(()) if cancel.is_canceled() => Outcome::Canceled,
            Ok(()) => Outcome::Succeeded,
            Err(_) if cancel.is_canceled() => Outcome::Canceled,
            Err(e) => Outcome::Failed(e),
        };
        let logs = self.config.capture_logs.then(|| {
            let snapshot = log.snapshot();
            JobLogs {
                text: snapshot.text,
                truncated: snapshot.truncated,
                captured_at: Utc::now(),
            }
        });
        let final_progress = tracker.progress.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (trigger, mut update) = match outcome {
            Outcome::Succeeded => {
                let mut p = final_progress;
                p.value = 1.0;
                p.nodes_done = p.nodes_total;
                p.current_node = None;
                p.current_node_class = None;
                p.step = None;
                p.steps = None;
                tracker.update(true, |live| *live = p.clone());
                (
                    Trigger::Succeed,
                    JobUpdate {
                        progress: Some(p),
                        ..Default::default()
                    },
                )
            }
            Outcome::Failed(error) => (
                Trigger::Fail,
                JobUpdate {
                    progress: Some(final_progress),
                    error: Some(error),
                    ..Default::default()
                },
            ),
            Outcome::Canceled => (
                Trigger::CancelComplete,
                JobUpdate {
                    progress: Some(final_progress),
                    ..Default::default()
                },
            ),
        };
        update.logs = logs;
        update.node_times = Some({
            let mut times = tracker.node_times();
            times.end();
            std::mem::take(&mut times.done)
        });
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        match self.transition(&id, trigger, update.clone()).await {
            Ok(Some(_)) => {}
            // Canceled or expired meanwhile: keep the log and progress on what it became.
            Ok(None) => {
                if let Ok(Some(current)) = self.store.job_by_id(&id).await {
                    let keep = JobUpdate {
                        progress: update.progress,
                        logs: update.logs,
                        node_times: update.node_times,
                        ..Default::default()
                    };
                    let _ = self
                        .store
                        .update_job(&id, &[(current.status, current.status)], keep)
                        .await;
                    if current.status == JobStatus::Canceling {
                        let _ = self
                            .transition(&id, Trigger::CancelComplete, JobUpdate::default())
                            .await;
                    }
                }
            }
            Err(e) => tracing::error!(job = %id, error = %e, "cannot record job outcome"),
        }
        self.metrics.job_finished(started.elapsed());
    }

    async fn execute(
        self: &Arc<Self>,
        job: &JobRecord,
        cancel: &CancelToken,
        log: &TailLog,
        tracker: &Arc<Tracker>,
    ) -> Result<(), JobError> {
        let fail = |code: &str, message: String| JobError {
            code: code.into(),
            message,
            node_id: None,
            class_type: None,
            traceback: None,
        };
        // The runtime this job runs on to its end, even if a plugin is reloaded meanwhile.
        let runtime = self.runtime();
        // The start's record carries the workflow only where the store read it back.
        let read;
        let workflow = if job.workflow.is_null() {
            read = match self.store.job_workflow(&job.id).await {
                Ok(Some(workflow)) => workflow,
                Ok(None) => return Err(fail("invalid_workflow", "the job's workflow is gone".into())),
                Err(e) => {
                    return Err(fail(
                        "internal_error",
                        format!("the job's workflow cannot be read: {e}"),
                    ))
                }
            };
            &read
        } else {
            &job.workflow
        };
        let plan = match graph::validate(workflow, &runtime.catalog()) {
            Ok(plan) => plan,
            Err(e) => {
                return Err(fail(
                    "invalid_workflow",
                    format!("the workflow can no longer run: {}", e.message()),
                ))
            }
        };
        let mut assets = HashMap::new();
        for (_, asset) in graph::asset_refs(workflow) {
            match self.assets.get(&job.tenant, &asset.id).await {
                Ok(Some(record)) => match self.assets.local_file(&record, u64::MAX).await {
                    Ok(file) => {
                        assets.insert(asset.id, file);
                    }
                    Err(e) => return Err(fail("missing_asset", format!("asset {} cannot be read: {e}", asset.id))),
                },
                _ => return Err(fail("missing_asset", format!("asset {} no longer exists", asset.id))),
            }
        }
        let ctx = CallContext {
            log: log.clone(),
            cancel: cancel.clone(),
            progress: tracker.clone(),
            assets: Arc::new(ResolvedAssets(assets)),
            memory: runtime.job_memory(),
        };
        tracker.update(true, |p| p.nodes_total = plan.nodes.len() as u32);
        let workflow_text: Arc<str> = workflow.to_string().into();
        let mut job_files = JobFiles::default();
        let mut committed = Committed::default();
        // Each node's outputs are dropped once the last node that reads them has run, so a
        // chain holds about two values at a time, not all of them (the cache keeps its own).
        let mut readers = vec![0usize; plan.nodes.len()];
        for node in &plan.nodes {
            for (_, input) in &node.inputs {
                if let PlanInput::Link { node: source, .. } = input {
                    readers[*source] += 1;
                }
            }
        }
        let mut results: Vec<Vec<Value>> = Vec::with_capacity(plan.nodes.len());
        for (index, node) in plan.nodes.iter().enumerate() {
            if cancel.is_canceled() {
                return Ok(());
            }
            let node_error = |code: &str, message: String, traceback: Option<String>| JobError {
                code: code.into(),
                message,
                node_id: Some(node.id.clone()),
                class_type: Some(node.class_type.clone()),
                traceback,
            };
            tracker.update(false, |p| {
                p.current_node = Some(node.id.clone());
                p.current_node_class = Some(node.class_type.clone());
                p.step = None;
                p.steps = None;
                p.message = None;
            });
            // The cache is this process's; with a shared blob dir another process may have
            // collected a blob it names, and then the node runs again.
            let mut cached = node.cache_key.and_then(|key| self.cache.get(&job.tenant, &key));
            if let Some(entry) = &cached {
                for file in &entry.files {
                    if !self.assets.blob_exists(&file.blob).await {
                        cached = None;
                        break;
                    }
                }
            }
            let phase = if cached.is_some() {
                NodePhase::Cached
            } else {
                NodePhase::Started
            };
            tracker.node_times().begin(node, cached.is_some());
            self.publish_node(&job.id, node, phase);
            let entry = match cached {
                Some(entry) => {
                    for file in &entry.files {
                        self.admit_output(&committed, file.size)
                            .map_err(|m| node_error("job_output_limit", m, None))?;
                        self.commit(job, &node.id, file.clone(), &mut committed)
                            .await
                            .map_err(|m| node_error("output_commit_failed", m, None))?;
                    }
                    self.metrics.cache_hit();
                    entry
                }
                None => {
                    let mut inputs = Vec::with_capacity(node.inputs.len());
                    for (name, input) in &node.inputs {
                        let value = match input {
                            PlanInput::Literal(v) => v.clone(),
                            PlanInput::Link { node: source, output } => match results[*source].get(*output) {
                                Some(v) => v.clone(),
                                None => {
                                    return Err(node_error(
                                        "node_execution_error",
                                        format!("input {name:?} links to output {output} of node {}, which returned only {} value(s)", plan.nodes[*source].id, results[*source].len()),
                                        None,
                                    ))
                                }
                            },
                        };
                        inputs.push((name.clone(), value));
                    }
                    let call_runtime = runtime.clone();
                    let class = node.class_type.clone();
                    let call_ctx = ctx.clone();
                    let began = Instant::now();
                    let log_start = log.written();
                    let result = tokio::task::spawn_blocking(move || call_runtime.call(&class, inputs, &call_ctx))
                        .await
                        .map_err(|e| {
                            node_error("node_execution_error", format!("the node call was lost: {e}"), None)
                        })?;
                    self.metrics.node_call(&node.class_type, began.elapsed());
                    self.publish_log(&job.id, log, log_start);
                    let output = result.map_err(|f| node_error(&f.code, f.message, f.traceback))?;
                    if cancel.is_canceled() {
                        // Canceled while the node ran: nothing more is committed.
                        return Ok(());
                    }
                    // The output commit is part of the node's time: it stops at the node's
                    // deadline or at a cancel, between files.
                    let timeout = runtime.limits().node_timeout;
                    let keep_going = || !cancel.is_canceled() && began.elapsed() < timeout;
                    let stopped = || {
                        if cancel.is_canceled() {
                            Ok(())
                        } else {
                            Err(node_error(
                                "node_timeout",
                                "the node ran past its time limit while its outputs were committed".into(),
                                None,
                            ))
                        }
                    };
                    let mut files = Vec::new();
                    let announced: usize = output.files.iter().map(|f| f.data.files()).sum();
                    if committed.count as usize + announced > self.config.max_outputs {
                        return Err(node_error(
                            "job_output_limit",
                            format!(
                                "the node would commit {announced} outputs; the job may commit at most {} (--max-job-outputs)",
                                self.config.max_outputs
                            ),
                            None,
                        ));
                    }
                    // One file at a time: encoded, checked against the job's bounds, stored
                    // and committed before the next is encoded. Encoding and the blob's
                    // write and fsync run on a blocking thread, off the async workers.
                    for file in output.files {
                        let file = Arc::new(file);
                        for index in 0..file.data.files() {
                            if !keep_going() {
                                return stopped();
                            }
                            let stored = self
                                .store_output(file.clone(), index, job_files, workflow_text.clone(), &committed)
                                .await;
                            let (cached, returned) = match stored {
                                Ok(done) => done,
                                Err((code, message)) => return Err(node_error(code, message, None)),
                            };
                            job_files = returned;
                            self.commit(job, &node.id, cached.clone(), &mut committed)
                                .await
                                .map_err(|m| node_error("output_commit_failed", m, None))?;
                            files.push(cached);
                        }
                    }
                    let entry = Entry {
                        values: output.values,
                        files,
                    };
                    if let Some(key) = node.cache_key {
                        self.cache.put(&job.tenant, key, entry.clone());
                    }
                    entry
                }
            };
            results.push(if readers[index] > 0 { entry.values } else { Vec::new() });
            for (_, input) in &node.inputs {
                if let PlanInput::Link { node: source, .. } = input {
                    readers[*source] -= 1;
                    if readers[*source] == 0 {
                        results[*source] = Vec::new();
                    }
                }
            }
            tracker.update(false, |p| {
                p.nodes_done += 1;
                p.step = None;
                p.steps = None;
            });
            tracker.node_times().end();
            self.publish_node(&job.id, node, NodePhase::Finished);
        }
        Ok(())
    }

    /// Announces that `node` of job `job_id` reached `phase`.
    fn publish_node(&self, job_id: &str, node: &graph::PlannedNode, phase: NodePhase) {
        let event = JobEvent::Node {
            node_id: node.id.clone(),
            class_type: node.class_type.clone(),
            phase,
        };
        self.publish(job_id, event);
    }

    /// Announces what a node wrote to the log since byte `start` (as much as the log still
    /// holds) as one `log` event: bounded by the log's own size, one event per node call.
    fn publish_log(&self, job_id: &str, log: &TailLog, start: u64) {
        if log.written() == start {
            return;
        }
        let message = log.since(start);
        if !message.is_empty() {
            self.publish(job_id, JobEvent::Log { level: "info", message });
        }
    }

    /// Whether one more output of `size` bytes fits the job's output bounds; why not if not.
    fn admit_output(&self, committed: &Committed, size: u64) -> Result<(), String> {
        admit(self.config.max_outputs, self.config.max_output_bytes, committed, size)
    }

    /// Encodes file `index` of `file`, checks it against the job's output bounds and writes
    /// its blob, on a blocking thread. Returns the stored file and `job_files` back, or the
    /// failure's code and message.
    async fn store_output(
        &self,
        file: Arc<OutputFile>,
        index: usize,
        mut job_files: JobFiles,
        workflow_text: Arc<str>,
        committed: &Committed,
    ) -> Result<(CachedFile, JobFiles), (&'static str, String)> {
        let (max_outputs, max_bytes) = (self.config.max_outputs, self.config.max_output_bytes);
        let committed = Committed {
            count: committed.count,
            bytes: committed.bytes,
        };
        let (e, job_files) = tokio::task::spawn_blocking(move || {
            let e = outputs::encode(&file, index, &mut job_files, &workflow_text)
                .map_err(|m| ("output_encoding_failed", m))?;
            admit(max_outputs, max_bytes, &committed, e.bytes.len() as u64).map_err(|m| ("job_output_limit", m))?;
            Ok((e, job_files))
        })
        .await
        .map_err(|e| ("output_commit_failed", format!("the output's write was lost: {e}")))??;
        let (blob, size) = self
            .assets
            .put(e.bytes)
            .await
            .map_err(|io| ("output_commit_failed", io.to_string()))?;
        let cached = CachedFile {
            name: e.name,
            kind: e.kind,
            content_type: e.content_type,
            blob,
            size,
        };
        Ok((cached, job_files))
    }

    /// Records `file` as the job's next output (numbered by `committed`, which then counts
    /// it) and announces it.
    async fn commit(
        &self,
        job: &JobRecord,
        node_id: &str,
        file: CachedFile,
        committed: &mut Committed,
    ) -> Result<(), String> {
        let asset = AssetRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: job.tenant.clone(),
            blob: file.blob,
            size_bytes: file.size as i64,
            content_type: file.content_type,
            file_path: file.name,
            job_id: Some(job.id.clone()),
            node_id: Some(node_id.to_string()),
            kind: Some(
                serde_json::to_value(file.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_else(|| "file".into()),
            ),
            tags: Vec::new(),
            created_at: Utc::now(),
            expires_at: None,
            output_index: Some(committed.count),
        };
        let size = file.size;
        self.assets.commit_output(asset.clone()).await?;
        committed.count += 1;
        committed.bytes += size;
        self.publish(&job.id, JobEvent::Output(Box::new(asset)));
        Ok(())
    }
}
