//! Running a job's graph: the loop that waits on its node calls, its commits, the call
//! permits and its cancel, and does what its [`GraphRun`] says is next: cache look-ups,
//! node calls (on the job's own thread when it has nothing else to do, else on a blocking
//! thread) and ordered commits, with their events, progress, metrics and cache entries.

use std::sync::Arc;
use std::time::Instant;
use weft_types::NodeErrorCode;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::commit::{Books, Commit, FinalMove, HeldOutput};
use super::graph_run::{GraphRun, NextCommit};
use super::progress::{NodeProgress, Tracker};
use crate::graph::{self, PlannedNode};
use crate::jobs::cache::{CachedFile, Entry};
use crate::jobs::events::{JobEvent, NodePhase};
use crate::jobs::Jobs;
use crate::runtime::{
    AssetReader, CallContext, CancelToken, JobMemory, NodeFailure, NodeOutput, Runtime, TailLog, Value,
};
use crate::store::{JobError, JobRecord};

/// What the run loop of a job waits on.
enum Event {
    /// Node `index`'s call, begun at `began`, returned.
    Ran {
        index: usize,
        began: Instant,
        /// The call's result, or why it was lost (it panicked).
        result: Result<Result<NodeOutput, NodeFailure>, String>,
    },
    /// A node's files were committed (or not).
    Committed(CommitEnded),
}

/// How the commit of node `index` ended.
struct CommitEnded {
    index: usize,
    /// Whether its files came from the cache.
    cached: bool,
    /// The files committed (`None`: the job was canceled between files), or the failure.
    result: Result<Option<Vec<CachedFile>>, JobError>,
    /// The job's books back (`None` after a failure).
    books: Option<Books>,
    /// The node's values, for the cache.
    values: Option<Vec<Value>>,
    /// Its inline outputs held for the job's final move.
    held: Vec<HeldOutput>,
}

/// What the call of `node` returned, or its failure (or the loss of the call) as the job's
/// error.
fn call_output(
    node: &PlannedNode,
    result: Result<Result<NodeOutput, NodeFailure>, String>,
) -> Result<NodeOutput, JobError> {
    let node_error = |code: &str, message: String, traceback: Option<String>| JobError {
        code: code.into(),
        message,
        node_id: Some(node.id.clone()),
        class_type: Some(node.class_type.clone()),
        traceback,
    };
    match result {
        Ok(Ok(output)) => Ok(output),
        Ok(Err(f)) => Err(node_error(f.code.as_str(), f.message, f.traceback)),
        Err(e) => Err(node_error(
            NodeErrorCode::NodeExecutionError.as_str(),
            format!("the node call was lost: {e}"),
            None,
        )),
    }
}

/// The runtime's call permits as one job sees them: one granted and not yet used, and the
/// wait for one while none was free.
struct CallPermits {
    semaphore: Arc<Semaphore>,
    granted: Option<OwnedSemaphorePermit>,
    wait: FuturesUnordered<BoxFuture<'static, OwnedSemaphorePermit>>,
}

impl CallPermits {
    /// A permit for the next call: the one granted, else one free now. `None` while one is
    /// awaited, or when none is free (then one is awaited from now on).
    fn take(&mut self) -> Option<OwnedSemaphorePermit> {
        if let Some(permit) = self.granted.take() {
            return Some(permit);
        }
        if !self.wait.is_empty() {
            return None;
        }
        match self.semaphore.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let semaphore = self.semaphore.clone();
                self.wait.push(Box::pin(async move {
                    semaphore
                        .acquire_owned()
                        .await
                        .expect("the call permits are never closed")
                }));
                None
            }
        }
    }

    /// Whether a permit is awaited.
    fn is_waiting(&self) -> bool {
        !self.wait.is_empty()
    }
}

/// One job's graph as it runs: its [`GraphRun`], and what doing its work needs.
pub(super) struct Execution<'a> {
    jobs: &'a Arc<Jobs>,
    job: &'a JobRecord,
    cancel: &'a CancelToken,
    log: &'a TailLog,
    tracker: &'a Arc<Tracker>,
    /// The runtime this job runs on to its end, even if a plugin is reloaded meanwhile.
    runtime: Arc<Runtime>,
    assets: Arc<dyn AssetReader>,
    memory: Arc<JobMemory>,
    workflow_text: Arc<str>,
    graph: GraphRun<'a>,
    /// Each node's slot among the node times.
    slots: Vec<usize>,
    permits: CallPermits,
    /// The node calls and the commit under way.
    tasks: FuturesUnordered<BoxFuture<'a, Event>>,
    /// How much of the log was announced.
    log_mark: u64,
    /// Whether node calls may run on the job's own thread: only a multi-threaded runtime
    /// can lend it.
    inline_calls: bool,
}

/// What a job's graph runs with: its record, its cancel, its log, its progress, the runtime,
/// its assets and its workflow's text (embedded in its PNGs).
pub(super) struct JobContext<'a> {
    pub(super) job: &'a JobRecord,
    pub(super) cancel: &'a CancelToken,
    pub(super) log: &'a TailLog,
    pub(super) tracker: &'a Arc<Tracker>,
    pub(super) runtime: Arc<Runtime>,
    pub(super) assets: Arc<dyn AssetReader>,
    pub(super) workflow_text: Arc<str>,
}

impl<'a> Execution<'a> {
    /// The run of `plan` for the job in `cx`, by `jobs`.
    pub(super) fn new(jobs: &'a Arc<Jobs>, plan: &'a graph::Plan, cx: JobContext<'a>) -> Self {
        let n = plan.nodes.len();
        Self {
            jobs,
            job: cx.job,
            cancel: cx.cancel,
            log: cx.log,
            tracker: cx.tracker,
            memory: cx.runtime.job_memory(),
            permits: CallPermits {
                semaphore: cx.runtime.call_permits().clone(),
                granted: None,
                wait: FuturesUnordered::new(),
            },
            runtime: cx.runtime,
            assets: cx.assets,
            workflow_text: cx.workflow_text,
            graph: GraphRun::new(plan, cx.cancel),
            slots: vec![0; n],
            tasks: FuturesUnordered::new(),
            log_mark: cx.log.written(),
            inline_calls: tokio::runtime::Handle::current().runtime_flavor()
                == tokio::runtime::RuntimeFlavor::MultiThread,
        }
    }

    /// Runs the graph until nothing is left to wait on. Returns what the last node to commit
    /// held for the job's final move, or the job's failure.
    pub(super) async fn run(mut self) -> Result<FinalMove, JobError> {
        let cancel = self.cancel;
        let job_canceled = cancel.canceled();
        tokio::pin!(job_canceled);
        loop {
            if !self.graph.is_stopped() {
                self.look_up_fresh().await;
                self.dispatch_ready();
            }
            // Outputs commit in plan order, up to the first node that has not finished. A
            // failure stops the calls but not this: the nodes before the failing one whose
            // calls ended keep their outputs. A cancel stops it.
            while let Some(next) = self.graph.next_commit() {
                self.start_commit(next);
            }
            if self.tasks.is_empty() && (!self.permits.is_waiting() || self.graph.is_stopped()) {
                break;
            }
            let event = tokio::select! {
                biased;
                () = &mut job_canceled, if !self.graph.is_stopped() => {
                    self.graph.cancel();
                    continue;
                }
                Some(event) = self.tasks.next() => event,
                Some(permit) = self.permits.wait.next(), if !self.graph.is_stopped() => {
                    self.permits.granted = Some(permit);
                    continue;
                }
                else => break,
            };
            match event {
                Event::Ran { index, began, result } => self.ran(index, began, result),
                Event::Committed(ended) => self.committed(ended),
            }
        }
        self.graph.finish()
    }

    /// Looks the nodes whose inputs are ready up in the cache: a node found is taken from it
    /// (finished, if it has no files to commit), the others are to run.
    async fn look_up_fresh(&mut self) {
        while let Some(index) = self.graph.next_fresh() {
            let node = &self.graph.plan().nodes[index];
            let Some(entry) = self.jobs.cached(self.job, node).await else {
                self.graph.not_cached(index);
                continue;
            };
            self.slots[index] = self.tracker.node_started(node, true);
            self.jobs.publish_node(&self.job.id, node, NodePhase::Cached);
            if self.graph.take_cached(index, entry) {
                self.jobs.metrics.cache_hit();
                self.finished(index, true);
            }
        }
    }

    /// Starts the calls of the nodes that are to run, lowest plan index first, each once it
    /// holds a call permit.
    fn dispatch_ready(&mut self) {
        while let Some(index) = self.graph.next_ready() {
            let Some(permit) = self.permits.take() else {
                break;
            };
            let node = &self.graph.plan().nodes[index];
            self.slots[index] = self.tracker.node_started(node, false);
            self.jobs.publish_node(&self.job.id, node, NodePhase::Started);
            let inputs = match self.graph.start(index) {
                Ok(inputs) => inputs,
                Err(e) => {
                    self.tracker.node_ended(node, self.slots[index], false);
                    self.graph.fail(e);
                    break;
                }
            };
            self.call(index, inputs, permit);
        }
    }

    /// Calls node `index` with `inputs`, holding `permit` until the call returns, even when
    /// the job stops waiting for it.
    fn call(&mut self, index: usize, inputs: Vec<(String, Value)>, permit: OwnedSemaphorePermit) {
        let node = &self.graph.plan().nodes[index];
        let call_runtime = self.runtime.clone();
        let class = node.class_type.clone();
        let call_ctx = CallContext {
            log: self.log.clone(),
            cancel: self.graph.stop_token().clone(),
            progress: Arc::new(NodeProgress::new(self.tracker, node)),
            assets: self.assets.clone(),
            memory: self.memory.clone(),
        };
        let call = move || {
            let _permit = permit;
            call_runtime.call(&class, inputs, &call_ctx)
        };
        let began = Instant::now();
        if self.tasks.is_empty() && !self.graph.has_queued() && !self.permits.is_waiting() && self.inline_calls {
            // The job has nothing else to do meanwhile, so the call runs on this thread and
            // the runtime's other work moves to another one: no hand-off to a blocking
            // thread and back, which on an idle machine costs more than a small node's
            // whole call. A cancel still reaches the call through `stop`, a child of the
            // job's token.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tokio::task::block_in_place(call)))
                .map_err(|panic| format!("it panicked: {}", crate::panic_message(&*panic)));
            self.tasks
                .push(Box::pin(std::future::ready(Event::Ran { index, began, result })));
        } else {
            self.tasks.push(Box::pin(async move {
                let result = tokio::task::spawn_blocking(call).await.map_err(|e| e.to_string());
                Event::Ran { index, began, result }
            }));
        }
    }

    /// Node `index`'s call, begun at `began`, returned `result`: its log is announced, and
    /// it is finished (and cached) or leaves its files to commit, or the job fails.
    fn ran(&mut self, index: usize, began: Instant, result: Result<Result<NodeOutput, NodeFailure>, String>) {
        let node = &self.graph.plan().nodes[index];
        let slot = self.slots[index];
        self.jobs.metrics.node_call(&node.class_type, began.elapsed());
        let from = self.log_mark;
        self.log_mark = self.log.written();
        self.jobs.publish_log(&self.job.id, self.log, from);
        let output = match call_output(node, result) {
            // Canceled while the node ran: nothing more is committed.
            _ if self.graph.is_canceled() => {
                self.tracker.node_ended(node, slot, false);
                return;
            }
            // A call that ended well keeps its output, even when another node failed
            // meanwhile: the commits still stop at the failing node.
            Ok(output) => output,
            // A call stopped by an earlier failure leaves that failure the job's.
            Err(e) => {
                self.tracker.node_ended(node, slot, false);
                self.graph.fail(e);
                return;
            }
        };
        let cache_values = node.cache_key.map(|_| output.values.clone());
        if !output.files.is_empty() {
            // The output commit is part of the node's time: what the call left of the
            // node's time limit, from when its turn to commit comes.
            let budget = self.runtime.limits().node_timeout.saturating_sub(began.elapsed());
            let work = Commit::Made {
                files: output.files,
                values: cache_values,
                budget,
            };
            self.graph.ran(index, output.values, work);
            return;
        }
        self.graph.ran(index, output.values, Commit::Done);
        if let (Some(key), Some(values)) = (node.cache_key, cache_values) {
            let entry = Entry {
                values,
                files: Vec::new(),
            };
            if let Some(cost) = self.tracker.node_elapsed(slot) {
                self.jobs.cache.put(&self.job.tenant, key, entry, cost);
            }
        }
        self.finished(index, true);
    }

    /// Starts the commit of the node whose turn came.
    fn start_commit(&mut self, next: NextCommit) {
        let NextCommit {
            index,
            work,
            books: (committed, job_files),
            last,
        } = next;
        let (jobs, job, halt) = (self.jobs, self.job, self.cancel);
        let node = &self.graph.plan().nodes[index];
        let text = self.workflow_text.clone();
        self.tasks.push(Box::pin(async move {
            let cached = matches!(work, Commit::Cached(_));
            let (result, books, values, held) = jobs
                .commit_node(job, node, work, committed, job_files, text, halt, last)
                .await;
            Event::Committed(CommitEnded {
                index,
                cached,
                result,
                books,
                values,
                held,
            })
        }));
    }

    /// A node's commit `ended`: the job's books come back, and the node is finished and
    /// cached, or it ends uncounted (a cancel), or the job fails.
    fn committed(&mut self, ended: CommitEnded) {
        self.graph.books_returned(ended.books);
        let index = ended.index;
        let node = &self.graph.plan().nodes[index];
        let slot = self.slots[index];
        match ended.result {
            Ok(Some(files)) if !self.graph.is_canceled() => {
                if ended.cached {
                    self.jobs.metrics.cache_hit();
                } else if let (Some(key), Some(values), Some(cost)) =
                    (node.cache_key, ended.values, self.tracker.node_elapsed(slot))
                {
                    // The node's time so far, which a hit saves: its call and its outputs'
                    // commit.
                    self.jobs
                        .cache
                        .put(&self.job.tenant, key, Entry { values, files }, cost);
                }
                // A node whose outputs are held ends, for its watchers, after them.
                let announce = self.graph.committed(index, ended.held);
                self.finished(index, announce);
            }
            Ok(_) => self.tracker.node_ended(node, slot, false),
            Err(e) => {
                self.tracker.node_ended(node, slot, false);
                self.graph.fail(e);
            }
        }
    }

    /// Node `index` is finished (its outputs committed): counted, and announced if
    /// `announce`.
    fn finished(&self, index: usize, announce: bool) {
        let node = &self.graph.plan().nodes[index];
        self.tracker.node_ended(node, self.slots[index], true);
        if announce {
            self.jobs.publish_node(&self.job.id, node, NodePhase::Finished);
        }
    }
}

impl Jobs {
    /// `node` is taken from the cache if the cache holds it and every blob it names. The
    /// cache is this process's; with a shared blob dir another process may have collected
    /// a blob it names, and then the node runs again.
    async fn cached(&self, job: &JobRecord, node: &PlannedNode) -> Option<Entry> {
        let entry = self.cache.get(&job.tenant, &node.cache_key?)?;
        for file in entry.files.iter().filter(|f| f.inline.is_none()) {
            if !self.assets.blob_exists(&file.blob).await {
                return None;
            }
        }
        Some(entry)
    }

    /// Announces that `node` of job `job_id` reached `phase`.
    fn publish_node(&self, job_id: &str, node: &PlannedNode, phase: NodePhase) {
        self.publish(job_id, super::node_event(node, phase));
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
}
