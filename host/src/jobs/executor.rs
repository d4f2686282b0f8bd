//! Running one job: plan the workflow, run its nodes in dependency order (from the cache
//! where possible), commit outputs as they are produced, and record the outcome.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::OwnedSemaphorePermit;

use super::cache::{CachedFile, Entry};
use super::events::{JobEvent, NodePhase};
use super::outputs::{self, JobFiles};
use super::state::Trigger;
use super::{Jobs, Running};
use crate::graph::{self, PlanInput};
use crate::runtime::{AssetReader, AssetRef, CallContext, CancelToken, OutputFile, ProgressSink, TailLog, Value};
use crate::store::blobs::LocalFile;
use crate::store::{AssetRecord, JobError, JobLogs, JobRecord, JobStatus, JobUpdate, NodeTime, Progress};

/// The failure code `Jobs::store_output` gives when its [`Until`] came first; the
/// commit loop turns it into the deadline's or the stop's outcome.
const ENCODE_INTERRUPTED: &str = "interrupted";

/// When an output's encode must stop: at the node's deadline, or once `stop` is canceled.
struct Until {
    deadline: Instant,
    stop: CancelToken,
}

/// Snapshots reach the event stream at most this often.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);
/// Node step events (ComfyUI's per-step `progress`) are published at most this often,
/// except a node's last step.
const STEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);
/// Output files that encode from at most this many bytes, the job's workflow included (a
/// 64x64 RGB image is 12 KiB), are encoded on the async thread; larger ones on a blocking
/// thread.
const INLINE_ENCODE_BYTES: usize = 16 * 1024;

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
    /// When the job started running, and the nodes' times so far (those of nodes still
    /// running open).
    times: Mutex<NodeTimes>,
    /// The nodes running now (id and class), in the order they started: the last one is
    /// the job's current node.
    running: Mutex<Vec<(String, String)>>,
}

/// The times of a job's nodes, in the order they started.
struct NodeTimes {
    job_began: Instant,
    done: Vec<NodeTime>,
    /// When each node of `done` began, while it runs (same indices as `done`).
    open: Vec<Option<Instant>>,
}

impl NodeTimes {
    /// Opens the time of `node`, starting now; returns its slot for [`end`](Self::end).
    fn begin(&mut self, node: &graph::PlannedNode, cached: bool) -> usize {
        let now = Instant::now();
        self.done.push(NodeTime {
            node_id: node.id.clone(),
            class_type: node.class_type.clone(),
            started_ms: now.duration_since(self.job_began).as_millis() as u64,
            duration_ms: 0,
            cached,
        });
        self.open.push(Some(now));
        self.done.len() - 1
    }

    /// How long the node in `slot` has run, while its time is open.
    fn elapsed(&self, slot: usize) -> Option<std::time::Duration> {
        self.open.get(slot).copied().flatten().map(|began| began.elapsed())
    }

    /// Closes the time in `slot`, if it is open.
    fn end(&mut self, slot: usize) {
        if let (Some(began), Some(time)) = (self.open.get_mut(slot).and_then(Option::take), self.done.get_mut(slot)) {
            time.duration_ms = began.elapsed().as_millis() as u64;
        }
    }

    /// Closes every time still open.
    fn end_all(&mut self) {
        for slot in 0..self.done.len() {
            self.end(slot);
        }
    }
}

impl Tracker {
    fn node_times(&self) -> std::sync::MutexGuard<'_, NodeTimes> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `node` starts (or is taken from the cache): it becomes the current node. Returns
    /// the slot of its time.
    fn node_started(&self, node: &graph::PlannedNode, cached: bool) -> usize {
        self.running().push((node.id.clone(), node.class_type.clone()));
        self.update(false, |p| {
            p.current_node = Some(node.id.clone());
            p.current_node_class = Some(node.class_type.clone());
            p.step = None;
            p.steps = None;
            p.message = None;
        });
        self.node_times().begin(node, cached)
    }

    /// `node`, whose time is in `slot`, is done: counted when `counted`, and the current
    /// node becomes the most recently started of those still running (it stays when none
    /// is).
    fn node_ended(&self, node: &graph::PlannedNode, slot: usize, counted: bool) {
        let next = {
            let mut running = self.running();
            if let Some(at) = running.iter().rposition(|(id, _)| *id == node.id) {
                running.remove(at);
            }
            running.last().cloned()
        };
        self.node_times().end(slot);
        self.update(false, |p| {
            if counted {
                p.nodes_done += 1;
            }
            match next {
                Some((id, class)) if p.current_node.as_deref() != Some(id.as_str()) => {
                    p.current_node = Some(id);
                    p.current_node_class = Some(class);
                    p.step = None;
                    p.steps = None;
                    p.message = None;
                }
                Some(_) => {}
                None => {
                    p.step = None;
                    p.steps = None;
                }
            }
        });
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

/// Where one node call's progress goes: the job's tracker, named for the node. The job's
/// snapshot takes the steps of its current node only; every node's steps are published as
/// its own `Node` step events.
struct NodeProgress {
    tracker: Arc<Tracker>,
    node_id: String,
    class_type: String,
}

impl ProgressSink for NodeProgress {
    fn report(&self, step: u32, steps: u32, message: Option<String>) {
        let tracker = &self.tracker;
        tracker.update(false, |p| {
            if p.current_node.as_deref() == Some(self.node_id.as_str()) {
                p.step = Some(step);
                p.steps = Some(steps);
                if message.is_some() {
                    p.message = message;
                }
            }
        });
        let mut last = tracker.last_step.lock().unwrap_or_else(|e| e.into_inner());
        if step < steps && last.is_some_and(|t| t.elapsed() < STEP_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        let phase = NodePhase::Step { step, steps };
        tracker.jobs.publish(
            &tracker.job_id,
            JobEvent::Node {
                node_id: self.node_id.clone(),
                class_type: self.class_type.clone(),
                phase,
            },
        );
    }

    fn preview(&self, content_type: &'static str, data: Vec<u8>) {
        let tracker = &self.tracker;
        let mut last = tracker.last_preview.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        let event = JobEvent::Preview {
            node_id: self.node_id.clone(),
            content_type: content_type.to_string(),
            data,
        };
        *tracker.preview.lock().unwrap_or_else(|e| e.into_inner()) = Some(event.clone());
        tracker.jobs.publish(&tracker.job_id, event);
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
    /// With what is held for the final move.
    Succeeded(FinalMove),
    Failed(JobError),
    Canceled,
}

/// What a node that ran leaves to commit when its turn comes.
enum Commit {
    /// Nothing: the node is finished.
    Done,
    /// Files from the cache, stored already.
    Cached(Vec<CachedFile>),
    /// Files the call made, to encode and store, with the node's values for the cache and
    /// the time it may take.
    Made {
        files: Vec<OutputFile>,
        values: Option<Vec<Value>>,
        budget: std::time::Duration,
    },
}

/// What [`Jobs::commit_node`] returns.
type CommitResult = (
    Result<Option<Vec<CachedFile>>, JobError>,
    Option<(Committed, JobFiles)>,
    Option<Vec<Value>>,
    Vec<HeldOutput>,
);

/// An inline output whose record waits for the job's final move, to be written in the same
/// transaction (see [`Jobs::commit_file`]).
type HeldOutput = (AssetRecord, bytes::Bytes);

/// Most outputs of the last node that are held for the job's final move.
const MAX_HELD_OUTPUTS: usize = 8;

/// What the last node to commit leaves for the job's final move: its inline outputs, and
/// the announcement of its end, which follows them.
#[derive(Default)]
struct FinalMove {
    outputs: Vec<HeldOutput>,
    finished: Option<JobEvent>,
}

/// What the run loop of a job waits on.
enum Event {
    /// Node `index`'s call, begun at `began`, returned.
    Ran {
        index: usize,
        began: Instant,
        /// The call's result, or why it was lost (it panicked).
        result: Result<Result<crate::runtime::NodeOutput, crate::runtime::NodeFailure>, String>,
    },
    /// Node `index`'s files were committed (or not).
    Committed {
        index: usize,
        cached: bool,
        result: Result<Option<Vec<CachedFile>>, JobError>,
        books: Option<(Committed, JobFiles)>,
        values: Option<Vec<Value>>,
        /// Its inline outputs held for the job's final move.
        held: Vec<HeldOutput>,
    },
}

/// The event saying that `node` reached `phase`.
fn node_event(node: &graph::PlannedNode, phase: NodePhase) -> JobEvent {
    JobEvent::Node {
        node_id: node.id.clone(),
        class_type: node.class_type.clone(),
        phase,
    }
}

/// The inputs of node `index` of `plan`: its literals and copies of the values it links
/// to, or the error for a link to an output its source did not return.
fn gather_inputs(plan: &graph::Plan, index: usize, results: &[Vec<Value>]) -> Result<Vec<(String, Value)>, JobError> {
    let node = &plan.nodes[index];
    let mut inputs = Vec::with_capacity(node.inputs.len());
    for (name, input) in &node.inputs {
        let value = match input {
            PlanInput::Literal(v) => v.clone(),
            PlanInput::Link { node: source, output } => match results[*source].get(*output) {
                Some(v) => v.clone(),
                None => {
                    return Err(JobError {
                        code: "node_execution_error".into(),
                        message: format!(
                            "input {name:?} links to output {output} of node {}, which returned only {} value(s)",
                            plan.nodes[*source].id,
                            results[*source].len()
                        ),
                        node_id: Some(node.id.clone()),
                        class_type: Some(node.class_type.clone()),
                        traceback: None,
                    })
                }
            },
        };
        inputs.push((name.clone(), value));
    }
    Ok(inputs)
}

/// Node `index` no longer needs the values it links to: those it was the last reader of
/// are dropped.
fn release_inputs(plan: &graph::Plan, index: usize, readers: &mut [usize], results: &mut [Vec<Value>]) {
    for source in plan.dependencies(index) {
        readers[source] -= 1;
        if readers[source] == 0 {
            results[source] = Vec::new();
        }
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
        if self.shutdown.is_abandoning() {
            // Started as the grace period ended, after the running nodes were interrupted.
            cancel.cancel();
        }
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
                open: Vec::new(),
            }),
            running: Mutex::new(Vec::new()),
        });
        let outcome = match self
            .execute(&job, handed_over.as_deref(), &cancel, &log, &tracker)
            .await
        {
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
                return;
            }
            Ok(_) if cancel.is_canceled() => Outcome::Canceled,
            Ok(final_move) => Outcome::Succeeded(final_move),
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
                (
                    Trigger::Succeed,
                    JobUpdate {
                        progress: Some(p),
                        outputs: final_move.outputs,
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
            times.end_all();
            std::mem::take(&mut times.done)
        });
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        match self.transition_announcing(&id, trigger, update.clone(), announce).await {
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
        let workflow = if let Some(workflow) = handed_over {
            workflow
        } else if job.workflow.is_null() {
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
        let plan = match graph::validate(workflow, &runtime.catalog_for(workflow)) {
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
        // The node calls stop on this: at the job's cancel (or deadline), and at the first
        // failure, so that a failing branch stops the others.
        let stop = cancel.child();
        let assets: Arc<dyn AssetReader> = Arc::new(ResolvedAssets(assets));
        let memory = runtime.job_memory();
        tracker.update(true, |p| p.nodes_total = plan.nodes.len() as u32);
        if cancel.is_canceled() {
            return Ok(FinalMove::default());
        }
        let workflow_text: Arc<str> = workflow.to_string().into();
        let n = plan.nodes.len();
        // Each node's outputs are dropped once the last node that reads them has started
        // (it holds its own copies), so a chain holds about two values at a time, not all
        // of them (the cache keeps its own).
        let mut readers = vec![0usize; n];
        // Per node: its links to nodes not finished yet, and the nodes that link to it.
        let mut waiting = vec![0usize; n];
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (index, links) in waiting.iter_mut().enumerate() {
            for source in plan.dependencies(index) {
                readers[source] += 1;
                *links += 1;
                dependents[source].push(index);
            }
        }
        let mut results: Vec<Vec<Value>> = vec![Vec::new(); n];
        // Each node's slot among the node times.
        let mut slots = vec![0usize; n];
        // What each node that ran left to commit; outputs commit in plan order, one node
        // at a time, so `next_commit` is the node whose turn it is.
        let mut pending: Vec<Option<Commit>> = (0..n).map(|_| None).collect();
        let mut next_commit = 0;
        let mut books = Some((Committed::default(), JobFiles::default()));
        // Nodes whose inputs are ready: `fresh` not yet looked up in the cache, `ready` to
        // run, lowest plan index first, each once it holds a call permit.
        let mut fresh: Vec<usize> = (0..n).rev().filter(|&i| waiting[i] == 0).collect();
        let mut ready: BTreeSet<usize> = BTreeSet::new();
        let permits = runtime.call_permits().clone();
        let mut granted: Option<OwnedSemaphorePermit> = None;
        let mut permit_wait: FuturesUnordered<BoxFuture<'static, OwnedSemaphorePermit>> = FuturesUnordered::new();
        let mut tasks: FuturesUnordered<BoxFuture<'_, Event>> = FuturesUnordered::new();
        let mut failure: Option<JobError> = None;
        let mut final_move = FinalMove::default();
        let mut log_mark = log.written();
        // Node calls run on the job's own thread where they can (see below): only a
        // multi-threaded runtime can lend it.
        let inline_calls =
            tokio::runtime::Handle::current().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
        let job_canceled = cancel.canceled();
        tokio::pin!(job_canceled);
        loop {
            if !stop.is_canceled() {
                while let Some(index) = fresh.pop() {
                    let node = &plan.nodes[index];
                    let Some(entry) = self.cached(job, node).await else {
                        ready.insert(index);
                        continue;
                    };
                    slots[index] = tracker.node_started(node, true);
                    self.publish_node(&job.id, node, NodePhase::Cached);
                    release_inputs(&plan, index, &mut readers, &mut results);
                    results[index] = if readers[index] > 0 { entry.values } else { Vec::new() };
                    if entry.files.is_empty() {
                        self.metrics.cache_hit();
                        self.finished(
                            job,
                            &plan,
                            index,
                            slots[index],
                            tracker,
                            &mut waiting,
                            &dependents,
                            &mut fresh,
                            true,
                        );
                        pending[index] = Some(Commit::Done);
                    } else {
                        pending[index] = Some(Commit::Cached(entry.files));
                    }
                }
                while let Some(&index) = ready.first() {
                    let permit = match granted.take() {
                        Some(permit) => permit,
                        None if !permit_wait.is_empty() => break,
                        None => match permits.clone().try_acquire_owned() {
                            Ok(permit) => permit,
                            Err(_) => {
                                let permits = permits.clone();
                                permit_wait.push(Box::pin(async move {
                                    permits
                                        .acquire_owned()
                                        .await
                                        .expect("the call permits are never closed")
                                }));
                                break;
                            }
                        },
                    };
                    ready.pop_first();
                    let node = &plan.nodes[index];
                    slots[index] = tracker.node_started(node, false);
                    self.publish_node(&job.id, node, NodePhase::Started);
                    let inputs = match gather_inputs(&plan, index, &results) {
                        Ok(inputs) => inputs,
                        Err(e) => {
                            tracker.node_ended(node, slots[index], false);
                            failure.get_or_insert(e);
                            stop.cancel();
                            break;
                        }
                    };
                    release_inputs(&plan, index, &mut readers, &mut results);
                    let call_runtime = runtime.clone();
                    let class = node.class_type.clone();
                    let call_ctx = CallContext {
                        log: log.clone(),
                        cancel: stop.clone(),
                        progress: Arc::new(NodeProgress {
                            tracker: tracker.clone(),
                            node_id: node.id.clone(),
                            class_type: node.class_type.clone(),
                        }),
                        assets: assets.clone(),
                        memory: memory.clone(),
                    };
                    // The permit goes with the call: it is held until the call returns, even
                    // when the job stops waiting for it.
                    let call = move || {
                        let _permit = permit;
                        call_runtime.call(&class, inputs, &call_ctx)
                    };
                    let began = Instant::now();
                    if tasks.is_empty()
                        && ready.is_empty()
                        && fresh.is_empty()
                        && permit_wait.is_empty()
                        && inline_calls
                    {
                        // The job has nothing else to do meanwhile, so the call runs on this
                        // thread and the runtime's other work moves to another one: no
                        // hand-off to a blocking thread and back, which on an idle machine
                        // costs more than a small node's whole call. A cancel still reaches
                        // the call through `stop`, a child of the job's token.
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            tokio::task::block_in_place(call)
                        }))
                        .map_err(|panic| format!("it panicked: {}", crate::panic_message(&*panic)));
                        tasks.push(Box::pin(std::future::ready(Event::Ran { index, began, result })));
                    } else {
                        tasks.push(Box::pin(async move {
                            let result = tokio::task::spawn_blocking(call).await.map_err(|e| e.to_string());
                            Event::Ran { index, began, result }
                        }));
                    }
                }
            }
            // Outputs commit in plan order, up to the first node that has not finished. A
            // failure stops the calls but not this: the nodes before the failing one whose
            // calls ended keep their outputs. A cancel stops it.
            if !cancel.is_canceled() {
                while books.is_some() && next_commit < n {
                    match pending[next_commit].take() {
                        None => break,
                        Some(Commit::Done) => next_commit += 1,
                        Some(work) => {
                            let (committed, job_files) = books.take().expect("checked");
                            let index = next_commit;
                            let node = &plan.nodes[index];
                            let text = workflow_text.clone();
                            let halt = cancel;
                            // The last node to commit, with every other node done: its inline
                            // outputs are recorded with the job's final move, one store
                            // transaction fewer per job.
                            let last =
                                failure.is_none() && (index + 1..n).all(|i| matches!(pending[i], Some(Commit::Done)));
                            tasks.push(Box::pin(async move {
                                let cached = matches!(work, Commit::Cached(_));
                                let (result, books, values, held) = self
                                    .commit_node(job, node, work, committed, job_files, text, halt, last)
                                    .await;
                                Event::Committed {
                                    index,
                                    cached,
                                    result,
                                    books,
                                    values,
                                    held,
                                }
                            }));
                        }
                    }
                }
            }
            if tasks.is_empty() && (permit_wait.is_empty() || stop.is_canceled()) {
                break;
            }
            let event = tokio::select! {
                biased;
                () = &mut job_canceled, if !stop.is_canceled() => {
                    stop.cancel();
                    continue;
                }
                Some(event) = tasks.next() => event,
                Some(permit) = permit_wait.next(), if !stop.is_canceled() => {
                    granted = Some(permit);
                    continue;
                }
                else => break,
            };
            match event {
                Event::Ran { index, began, result } => {
                    let node = &plan.nodes[index];
                    self.metrics.node_call(&node.class_type, began.elapsed());
                    let from = log_mark;
                    log_mark = log.written();
                    self.publish_log(&job.id, log, from);
                    let node_error = |code: &str, message: String, traceback: Option<String>| JobError {
                        code: code.into(),
                        message,
                        node_id: Some(node.id.clone()),
                        class_type: Some(node.class_type.clone()),
                        traceback,
                    };
                    let output = match result {
                        Ok(Ok(output)) => Ok(output),
                        Ok(Err(f)) => Err(node_error(&f.code, f.message, f.traceback)),
                        Err(e) => Err(node_error(
                            "node_execution_error",
                            format!("the node call was lost: {e}"),
                            None,
                        )),
                    };
                    let output = match output {
                        // Canceled while the node ran: nothing more is committed.
                        _ if cancel.is_canceled() => {
                            tracker.node_ended(node, slots[index], false);
                            continue;
                        }
                        // A call that ended well keeps its output, even when another node
                        // failed meanwhile: the commits still stop at the failing node.
                        Ok(output) => output,
                        // A call stopped by an earlier failure leaves that failure the job's.
                        Err(e) => {
                            tracker.node_ended(node, slots[index], false);
                            failure.get_or_insert(e);
                            stop.cancel();
                            continue;
                        }
                    };
                    let cache_values = node.cache_key.map(|_| output.values.clone());
                    results[index] = if readers[index] > 0 { output.values } else { Vec::new() };
                    if output.files.is_empty() {
                        if let (Some(key), Some(values)) = (node.cache_key, cache_values) {
                            let entry = Entry {
                                values,
                                files: Vec::new(),
                            };
                            if let Some(cost) = tracker.node_times().elapsed(slots[index]) {
                                self.cache.put(&job.tenant, key, entry, cost);
                            }
                        }
                        self.finished(
                            job,
                            &plan,
                            index,
                            slots[index],
                            tracker,
                            &mut waiting,
                            &dependents,
                            &mut fresh,
                            true,
                        );
                        pending[index] = Some(Commit::Done);
                    } else {
                        // The output commit is part of the node's time: what the call left
                        // of the node's time limit, from when its turn to commit comes.
                        let budget = runtime.limits().node_timeout.saturating_sub(began.elapsed());
                        pending[index] = Some(Commit::Made {
                            files: output.files,
                            values: cache_values,
                            budget,
                        });
                    }
                }
                Event::Committed {
                    index,
                    cached,
                    result,
                    books: returned,
                    values,
                    held: outputs,
                } => {
                    books = returned;
                    let node = &plan.nodes[index];
                    match result {
                        Ok(Some(files)) if !cancel.is_canceled() => {
                            if cached {
                                self.metrics.cache_hit();
                            } else if let (Some(key), Some(values), Some(cost)) =
                                (node.cache_key, values, tracker.node_times().elapsed(slots[index]))
                            {
                                // The node's time so far, which a hit saves: its call and its
                                // outputs' commit.
                                self.cache.put(&job.tenant, key, Entry { values, files }, cost);
                            }
                            // A node whose outputs are held ends, for its watchers, after them.
                            let announce = outputs.is_empty();
                            if !announce {
                                final_move = FinalMove {
                                    outputs,
                                    finished: Some(node_event(node, NodePhase::Finished)),
                                };
                            }
                            self.finished(
                                job,
                                &plan,
                                index,
                                slots[index],
                                tracker,
                                &mut waiting,
                                &dependents,
                                &mut fresh,
                                announce,
                            );
                            next_commit += 1;
                        }
                        Ok(_) => tracker.node_ended(node, slots[index], false),
                        Err(e) => {
                            tracker.node_ended(node, slots[index], false);
                            failure.get_or_insert(e);
                            stop.cancel();
                        }
                    }
                }
            }
        }
        if let Some(error) = failure {
            return Err(error);
        }
        if !stop.is_canceled() && next_commit < n {
            return Err(fail(
                "internal_error",
                format!("the job stopped after {next_commit} of its {n} nodes"),
            ));
        }
        Ok(final_move)
    }

    /// `node` is taken from the cache if the cache holds it and every blob it names. The
    /// cache is this process's; with a shared blob dir another process may have collected
    /// a blob it names, and then the node runs again.
    async fn cached(&self, job: &JobRecord, node: &graph::PlannedNode) -> Option<Entry> {
        let entry = self.cache.get(&job.tenant, &node.cache_key?)?;
        for file in entry.files.iter().filter(|f| f.inline.is_none()) {
            if !self.assets.blob_exists(&file.blob).await {
                return None;
            }
        }
        Some(entry)
    }

    /// Node `index` of `plan` is finished (its outputs committed): counted, announced if
    /// `announce`, and the nodes that were waiting only for it are `fresh`.
    #[allow(clippy::too_many_arguments)]
    fn finished(
        &self,
        job: &JobRecord,
        plan: &graph::Plan,
        index: usize,
        slot: usize,
        tracker: &Tracker,
        waiting: &mut [usize],
        dependents: &[Vec<usize>],
        fresh: &mut Vec<usize>,
        announce: bool,
    ) {
        let node = &plan.nodes[index];
        tracker.node_ended(node, slot, true);
        if announce {
            self.publish_node(&job.id, node, NodePhase::Finished);
        }
        for &next in dependents[index].iter().rev() {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                fresh.push(next);
            }
        }
    }

    /// Commits the files `work` left for `node`, in order, as the job's next outputs
    /// (numbered from `committed`). Returns the files (`None` when the job was stopped
    /// between files), the job's books back (`None` after a failure, when the job ends),
    /// the node's values for the cache, and, when `last` (no node commits after it), its
    /// inline outputs held for the job's final move instead of recorded now.
    #[allow(clippy::too_many_arguments)]
    async fn commit_node(
        &self,
        job: &JobRecord,
        node: &graph::PlannedNode,
        work: Commit,
        mut committed: Committed,
        mut job_files: JobFiles,
        workflow_text: Arc<str>,
        stop: &CancelToken,
        last: bool,
    ) -> CommitResult {
        // Only a few outputs are held: a node with many commits them one by one, within its
        // time limit, rather than in one unbounded final transaction.
        let announced: usize = match &work {
            Commit::Done => 0,
            Commit::Cached(files) => files.len(),
            Commit::Made { files, .. } => files.iter().map(|f| f.data.files()).sum(),
        };
        let mut held = (last && announced <= MAX_HELD_OUTPUTS).then(Vec::new);
        let node_error = |code: &str, message: String| JobError {
            code: code.into(),
            message,
            node_id: Some(node.id.clone()),
            class_type: Some(node.class_type.clone()),
            traceback: None,
        };
        match work {
            Commit::Done => (Ok(Some(Vec::new())), Some((committed, job_files)), None, Vec::new()),
            Commit::Cached(files) => {
                for file in &files {
                    if stop.is_canceled() {
                        return (Ok(None), Some((committed, job_files)), None, Vec::new());
                    }
                    if let Err(m) = self.admit_output(&committed, file.size) {
                        return (Err(node_error("job_output_limit", m)), None, None, Vec::new());
                    }
                    if let Err(m) = self
                        .commit_file(job, &node.id, file.clone(), &mut committed, held.as_mut())
                        .await
                    {
                        return (Err(node_error("output_commit_failed", m)), None, None, Vec::new());
                    }
                }
                (
                    Ok(Some(files)),
                    Some((committed, job_files)),
                    None,
                    held.unwrap_or_default(),
                )
            }
            Commit::Made { files, values, budget } => {
                // It stops at the node's deadline or at a stop, between files.
                let began = Instant::now();
                if committed.count as usize + announced > self.config.max_outputs {
                    let message = format!(
                        "the node would commit {announced} outputs; the job may commit at most {} (--max-job-outputs)",
                        self.config.max_outputs
                    );
                    return (Err(node_error("job_output_limit", message)), None, None, Vec::new());
                }
                let mut stored_files = Vec::new();
                // One file at a time: encoded, checked against the job's bounds, stored
                // and committed before the next is encoded. Encoding and the blob's
                // write and fsync run on a blocking thread, off the async workers.
                for file in files {
                    let file = Arc::new(file);
                    for index in 0..file.data.files() {
                        if stop.is_canceled() {
                            return (Ok(None), Some((committed, job_files)), None, Vec::new());
                        }
                        if began.elapsed() >= budget {
                            let message = "the node ran past its time limit while its outputs were committed".into();
                            return (Err(node_error("node_timeout", message)), None, None, Vec::new());
                        }
                        let until = Until {
                            deadline: began + budget,
                            stop: stop.clone(),
                        };
                        let stored = self
                            .store_output(file.clone(), index, job_files, workflow_text.clone(), &committed, until)
                            .await;
                        let (cached, returned) = match stored {
                            Ok(done) => done,
                            Err((ENCODE_INTERRUPTED, _)) if began.elapsed() >= budget => {
                                let message = "the node ran past its time limit while its outputs were encoded".into();
                                return (Err(node_error("node_timeout", message)), None, None, Vec::new());
                            }
                            Err((ENCODE_INTERRUPTED, _)) => {
                                let message = "the job was stopped while its outputs were encoded".into();
                                return (Err(node_error("canceled", message)), None, None, Vec::new());
                            }
                            Err((code, message)) => return (Err(node_error(code, message)), None, None, Vec::new()),
                        };
                        job_files = returned;
                        if let Err(m) = self
                            .commit_file(job, &node.id, cached.clone(), &mut committed, held.as_mut())
                            .await
                        {
                            return (Err(node_error("output_commit_failed", m)), None, None, Vec::new());
                        }
                        stored_files.push(cached);
                    }
                }
                (
                    Ok(Some(stored_files)),
                    Some((committed, job_files)),
                    values,
                    held.unwrap_or_default(),
                )
            }
        }
    }

    /// Announces that `node` of job `job_id` reached `phase`.
    fn publish_node(&self, job_id: &str, node: &graph::PlannedNode, phase: NodePhase) {
        self.publish(job_id, node_event(node, phase));
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

    /// Encodes file `index` of `file` (a large image stops at `until`), checks it against the
    /// job's output bounds and writes its blob, on a blocking thread. Returns the stored file
    /// and `job_files` back, or the failure's code and message ([`ENCODE_INTERRUPTED`] when
    /// `until` came first).
    async fn store_output(
        &self,
        file: Arc<OutputFile>,
        index: usize,
        mut job_files: JobFiles,
        workflow_text: Arc<str>,
        committed: &Committed,
        until: Until,
    ) -> Result<(CachedFile, JobFiles), (&'static str, String)> {
        let (max_outputs, max_bytes) = (self.config.max_outputs, self.config.max_output_bytes);
        let inline_max = self.config.inline_output_bytes;
        let committed = Committed {
            count: committed.count,
            bytes: committed.bytes,
        };
        // The workflow counts too: a PNG carries it in a text chunk.
        let small = file.data.source_len() + workflow_text.len() <= INLINE_ENCODE_BYTES;
        let encode = move || {
            let ask = move || until.stop.is_canceled() || Instant::now() >= until.deadline;
            let stop = weft_compute::interrupt::Interrupt::new(&ask);
            let e = outputs::encode(&file, index, &mut job_files, &workflow_text, stop).map_err(|e| match e {
                outputs::EncodeError::Interrupted => (ENCODE_INTERRUPTED, String::new()),
                outputs::EncodeError::Failed(m) => ("output_encoding_failed", m),
            })?;
            admit(max_outputs, max_bytes, &committed, e.bytes.len() as u64).map_err(|m| ("job_output_limit", m))?;
            // A small file goes inline, into its asset's row: hashed here, never a blob.
            let inline = (e.bytes.len() <= inline_max).then(|| blake3::hash(&e.bytes).to_hex().to_string());
            Ok((e, inline, job_files))
        };
        // A small file is encoded here, in tens of microseconds, rather than handed to a
        // blocking thread and back (two thread wake-ups, which cost more on a loaded VM).
        let (e, inline, job_files) = if small {
            encode()?
        } else {
            tokio::task::spawn_blocking(encode)
                .await
                .map_err(|e| ("output_commit_failed", format!("the output's write was lost: {e}")))??
        };
        let (blob, size, inline) = match inline {
            Some(hash) => {
                // Kept with the job's record and in the node cache: only its own bytes, not
                // the encoder's spare capacity (a 64x64 PNG of 1 KiB was held in 7 KiB).
                let mut bytes = e.bytes;
                bytes.shrink_to_fit();
                (hash, bytes.len() as u64, Some(bytes::Bytes::from(bytes)))
            }
            None => {
                let (blob, size) = self
                    .assets
                    .put(e.bytes)
                    .await
                    .map_err(|io| ("output_commit_failed", io.to_string()))?;
                (blob, size, None)
            }
        };
        let cached = CachedFile {
            name: e.name,
            kind: e.kind,
            content_type: e.content_type,
            blob,
            size,
            inline,
        };
        Ok((cached, job_files))
    }

    /// Records `file` as the job's next output (numbered by `committed`, which then counts
    /// it) and announces it. With `held`, an inline file's record is added there instead,
    /// for the job's final move to write and announce; a blob's record is written at once,
    /// after those held before it, so that outputs stay in order.
    async fn commit_file(
        &self,
        job: &JobRecord,
        node_id: &str,
        file: CachedFile,
        committed: &mut Committed,
        held: Option<&mut Vec<HeldOutput>>,
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
            inline: file.inline.is_some(),
        };
        let size = file.size;
        match (held, file.inline) {
            (Some(held), Some(content)) => held.push((asset, content)),
            (held, content) => {
                for (asset, content) in held.map(std::mem::take).unwrap_or_default() {
                    self.assets.commit_output(asset.clone(), Some(content)).await?;
                    self.publish(&job.id, JobEvent::Output(Box::new(asset)));
                }
                self.assets.commit_output(asset.clone(), content).await?;
                self.publish(&job.id, JobEvent::Output(Box::new(asset)));
            }
        }
        committed.count += 1;
        committed.bytes += size;
        Ok(())
    }
}
