//! Jobs: submission (validation, idempotency, queue bounds, credits), the state machine,
//! the fair run queue and its workers, cancellation, and the maintenance services
//! (retention, recovery).
//!
//! Public face: [`Jobs`] and its config, errors and views, and [`assets::Assets`], through
//! which everything reaches assets and their blobs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use serde_json::Value as Json;

use crate::graph::{self, GraphError};
use crate::runtime::{CancelToken, Runtime};
use crate::store::{Coordinator, JobPage, JobUpdate, Progress, Store, StoreError};

pub use crate::store::{AssetRecord, JobRecord, JobStatus};

pub mod assets;
pub mod cache;
pub mod events;
mod executor;
mod handover;
pub mod metrics;
pub(crate) mod outputs;
pub mod plugin_watch;
pub mod queue;
pub mod recovery;
pub mod rescue;
pub mod retention;
mod room;
mod shared;
pub mod shutdown;
pub mod state;
pub mod userdata;

use assets::Assets;
use events::{Hub, JobEvent};
use state::Trigger;

/// How the job service behaves. `weft serve`'s flags default to the `DEFAULT_*` constants
/// (in the flags' units), and [`Default`] is what those defaults give on the self-hosted
/// surface with one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsConfig {
    /// Jobs that run at once.
    pub workers: usize,
    /// Jobs that may wait in the queue.
    pub queue_depth: usize,
    /// Jobs one tenant may have waiting in the queue.
    pub tenant_queue_depth: usize,
    /// How long a job is kept (`expires_at = created_at + retention`).
    pub retention: Duration,
    /// How long an expired job stays readable before it is removed.
    pub expired_grace: Duration,
    /// How long a preview (a temporary output, `PreviewImage`) is kept after it is
    /// committed, never longer than its job; none (the default): as long as its job, as the
    /// interface keeps every output while its job is retained.
    pub preview_retention: Option<Duration>,
    /// Bytes of node results the cache may hold.
    pub cache_bytes: usize,
    /// How long a cached node result may go unused before it is dropped (zero: kept until
    /// the budget evicts it).
    pub cache_idle: Duration,
    /// Whether every job's log is captured into the job (the serverless surface).
    pub capture_logs: bool,
    /// Credits one job costs; zero disables credit checks (self-hosted, the default). The
    /// cloud and serverless surfaces charge [`DEFAULT_PAID_JOB_COST`](Self::DEFAULT_PAID_JOB_COST)
    /// unless `--job-cost` says otherwise.
    pub job_cost: i64,
    /// Most outputs one job may commit.
    pub max_outputs: usize,
    /// Most bytes one job's outputs may hold in all (encoded: PNG, WAV, ...).
    pub max_output_bytes: u64,
    /// Largest output file kept inline, in its asset's row, rather than as a blob.
    pub inline_output_bytes: usize,
}

impl JobsConfig {
    /// The default of [`workers`](Self::workers) (`--workers`).
    pub const DEFAULT_WORKERS: usize = 4;
    /// The default of [`queue_depth`](Self::queue_depth) (`--queue-depth`), and of
    /// [`tenant_queue_depth`](Self::tenant_queue_depth) with one tenant.
    pub const DEFAULT_QUEUE_DEPTH: usize = 10_000;
    /// The default of [`retention`](Self::retention), in seconds (`--retention-secs`): a week.
    pub const DEFAULT_RETENTION_SECS: u64 = 7 * 24 * 3600;
    /// The default of [`expired_grace`](Self::expired_grace), in seconds
    /// (`--expired-grace-secs`).
    pub const DEFAULT_EXPIRED_GRACE_SECS: u64 = 3600;
    /// The default of [`cache_bytes`](Self::cache_bytes), in MiB (`--cache-mib`).
    pub const DEFAULT_CACHE_MIB: usize = 512;
    /// The default of [`cache_idle`](Self::cache_idle), in seconds (`--cache-idle-secs`).
    pub const DEFAULT_CACHE_IDLE_SECS: u64 = 30;
    /// Credits a job costs on the cloud and serverless surfaces (`--job-cost`).
    pub const DEFAULT_PAID_JOB_COST: i64 = 1;
    /// The default of [`max_outputs`](Self::max_outputs) (`--max-job-outputs`).
    pub const DEFAULT_MAX_OUTPUTS: usize = 1_000;
    /// The default of [`max_output_bytes`](Self::max_output_bytes), in MiB
    /// (`--max-job-output-mib`).
    pub const DEFAULT_MAX_OUTPUT_MIB: u64 = 2048;
    /// The default of [`inline_output_bytes`](Self::inline_output_bytes), in KiB
    /// (`--inline-output-kib`).
    pub const DEFAULT_INLINE_OUTPUT_KIB: usize = 64;
    /// The most [`inline_output_bytes`](Self::inline_output_bytes) may be, in KiB (16 MiB).
    pub const MAX_INLINE_OUTPUT_KIB: usize = 16 << 10;
}

impl Default for JobsConfig {
    fn default() -> Self {
        Self {
            workers: Self::DEFAULT_WORKERS,
            queue_depth: Self::DEFAULT_QUEUE_DEPTH,
            tenant_queue_depth: Self::DEFAULT_QUEUE_DEPTH,
            retention: Duration::from_secs(Self::DEFAULT_RETENTION_SECS),
            expired_grace: Duration::from_secs(Self::DEFAULT_EXPIRED_GRACE_SECS),
            preview_retention: None,
            cache_bytes: Self::DEFAULT_CACHE_MIB << 20,
            cache_idle: Duration::from_secs(Self::DEFAULT_CACHE_IDLE_SECS),
            capture_logs: false,
            job_cost: 0,
            max_outputs: Self::DEFAULT_MAX_OUTPUTS,
            max_output_bytes: Self::DEFAULT_MAX_OUTPUT_MIB << 20,
            inline_output_bytes: Self::DEFAULT_INLINE_OUTPUT_KIB << 10,
        }
    }
}

/// Why a submission was refused.
#[derive(Debug)]
pub enum SubmitError {
    /// The workflow is invalid or in the UI format.
    Graph(GraphError),
    /// Asset references that do not exist or are not the caller's: (node id, asset id).
    MissingAsset(Vec<(String, String)>),
    /// The idempotency key was presented before.
    IdempotencyReuse {
        /// The job the key made, if it made one.
        job_id: Option<String>,
    },
    /// The queue is full; retry after this many seconds.
    QueueFull {
        /// Suggested wait.
        retry_after: u64,
    },
    /// The tenant is out of credits.
    InsufficientCredits {
        /// Balance.
        balance: i64,
        /// Cost of a job.
        cost: i64,
    },
    /// The store failed; the outcome is unknown.
    Store(StoreError),
    /// The request was malformed.
    BadRequest(String),
}

/// A job as read: the record, its outputs and its live state.
#[derive(Debug, Clone)]
pub struct JobView {
    /// The stored job, with the latest in-memory progress.
    pub job: JobRecord,
    /// Its outputs so far.
    pub outputs: Vec<AssetRecord>,
    /// Position in the queue while queued.
    pub queue_position: Option<usize>,
}

/// A job being run: how to cancel it and its latest progress.
struct Running {
    cancel: CancelToken,
    progress: Arc<Mutex<Progress>>,
    /// The latest preview event, sent first to streams that open while the job runs.
    preview: Arc<Mutex<Option<JobEvent>>>,
}

/// The job service.
pub struct Jobs {
    store: Arc<dyn Store>,
    assets: Arc<Assets>,
    /// The runtime new jobs start on; replaced whole when a plugin is reloaded.
    runtime: std::sync::RwLock<Arc<Runtime>>,
    config: JobsConfig,
    queue: queue::Queue,
    hub: Hub,
    cache: cache::NodeCache,
    running: Mutex<HashMap<String, Running>>,
    /// The workflows of small jobs submitted here and queued, for the workers that start
    /// them; none with a shared store, where another process may start the job.
    handover: handover::Handover,
    /// This process's part when several processes share the store; `None` when the queue,
    /// the event hub and the running-job map are this process's alone (SQLite).
    shared: Option<shared::Shared>,
    /// Workers running now, and how many were restarted after a panic.
    workers: (std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicU64),
    /// Workers started by [`start_workers`](Self::start_workers): none on an API-only process.
    workers_started: std::sync::atomic::AtomicUsize,
    /// Counters and histograms for `/metrics`.
    pub metrics: metrics::Metrics,
    /// Whether the service is shutting down ([`shut_down`](Self::shut_down)).
    shutdown: shutdown::Shutdown,
}

/// How the job workers are doing, as `/healthz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkerHealth {
    /// Workers started (`--workers`; none on a process that runs no jobs).
    pub configured: usize,
    /// Workers taking jobs now: fewer only for the moment a panicked one takes to restart,
    /// and none once the service drains (a worker may still finish its last job then).
    pub running: usize,
    /// How many times a worker was restarted after a panic outside a job's run.
    pub restarts: u64,
    /// Whether the service is shutting down: it takes no new job.
    pub draining: bool,
}

impl Jobs {
    /// A job service over `store`, `assets` (over the same store) and `runtime`.
    pub fn new(store: Arc<dyn Store>, assets: Arc<Assets>, runtime: Arc<Runtime>, config: JobsConfig) -> Arc<Self> {
        Self::build(store, assets, runtime, config, None)
    }

    /// A job service shared with the other processes that `coordinator` coordinates: jobs
    /// are claimed from the store, and events and cancels cross processes.
    pub fn new_shared(
        store: Arc<dyn Store>,
        assets: Arc<Assets>,
        runtime: Arc<Runtime>,
        config: JobsConfig,
        coordinator: Arc<dyn Coordinator>,
    ) -> Arc<Self> {
        Self::build(store, assets, runtime, config, Some(shared::Shared::new(coordinator)))
    }

    fn build(
        store: Arc<dyn Store>,
        assets: Arc<Assets>,
        runtime: Arc<Runtime>,
        config: JobsConfig,
        shared: Option<shared::Shared>,
    ) -> Arc<Self> {
        Arc::new(Self {
            queue: queue::Queue::new(config.queue_depth, config.tenant_queue_depth),
            cache: cache::NodeCache::new(config.cache_bytes),
            store,
            assets,
            runtime: std::sync::RwLock::new(runtime),
            config,
            hub: Hub::default(),
            running: Mutex::new(HashMap::new()),
            handover: handover::Handover::default(),
            shared,
            workers: Default::default(),
            workers_started: Default::default(),
            metrics: metrics::Metrics::default(),
            shutdown: shutdown::Shutdown::default(),
        })
    }

    /// The coordinator of a shared store, if this service shares one.
    pub fn coordinator(&self) -> Option<&Arc<dyn Coordinator>> {
        self.shared.as_ref().map(|s| &s.coordinator)
    }

    /// Whether this process runs the maintenance (retention, rescue): with a shared store,
    /// only its leader does.
    pub fn leads_maintenance(&self) -> bool {
        self.coordinator().is_none_or(|c| c.is_leader())
    }

    /// Starts what a process that serves the API needs even when it runs no jobs: with a
    /// shared store, the event writer, the wake-up listener and the lease renewer. Call
    /// once, before [`start_workers`](Self::start_workers).
    pub fn start_services(self: &Arc<Self>) {
        if let Some(shared) = &self.shared {
            self.start_shared(shared);
        }
    }

    /// The node result cache (for its gauges).
    pub fn node_cache(&self) -> &cache::NodeCache {
        &self.cache
    }

    /// Starts the cache's aging: a few times per [`JobsConfig::cache_idle`], the node
    /// results unused for that long are dropped, and the memory they held is handed back to
    /// the OS. On the first tick that finds the service idle after some activity (nothing
    /// submitted, started or finished since the tick before, nothing queued or running), the
    /// store's caches and every thread's free memory go back too: a server that goes idle
    /// after a load shrinks back to about its size at start.
    pub fn start_cache_aging(self: &Arc<Self>) {
        let idle = self.config.cache_idle;
        if idle.is_zero() {
            return;
        }
        let jobs = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval((idle / 4).max(Duration::from_secs(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_activity = jobs.metrics.activity();
            let mut released_at = last_activity;
            loop {
                tick.tick().await;
                if let Some(since) = std::time::Instant::now().checked_sub(idle) {
                    let cache = jobs.clone();
                    // Dropping large values and purging the allocator are blocking work.
                    let _ = tokio::task::spawn_blocking(move || {
                        if cache.cache.evict_unused_since(since) > 0 {
                            weft_allocator::release_free_memory();
                        }
                    })
                    .await;
                }
                let activity = jobs.metrics.activity();
                let quiet = activity == last_activity && jobs.queue.is_empty() && jobs.running_count() == 0;
                last_activity = activity;
                if quiet && activity != released_at {
                    released_at = activity;
                    jobs.release_idle_memory().await;
                }
            }
        });
    }

    /// Hands back what an idle service holds only for speed: the store's caches, and the
    /// free memory of this process's threads. Each tokio worker releases its own when it
    /// next parks (the runtime's park hook), so one wake-up task per worker is spawned.
    async fn release_idle_memory(&self) {
        self.store.release_caches().await;
        let _ = tokio::task::spawn_blocking(weft_allocator::release_on_every_thread).await;
        for _ in 0..tokio::runtime::Handle::current().metrics().num_workers() {
            tokio::spawn(tokio::task::yield_now());
        }
    }

    /// Jobs this process is running now.
    fn running_count(&self) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Starts the workers. Call once, after recovery (and [`start_services`](Self::start_services)).
    /// A job whose run panics fails with `internal_error`, and its worker goes on to the next
    /// job; a worker that panics anywhere else is restarted (and counted in
    /// [`worker_health`](Self::worker_health)).
    pub fn start_workers(self: &Arc<Self>) {
        use std::sync::atomic::Ordering;
        let count = self.config.workers.max(1);
        self.workers_started.store(count, Ordering::SeqCst);
        let feed = self.shared.as_ref().map(|_| self.start_claimer());
        for _ in 0..count {
            let (jobs, feed) = (self.clone(), feed.clone());
            tokio::spawn(async move {
                loop {
                    jobs.workers.0.fetch_add(1, Ordering::SeqCst);
                    let worker = match &feed {
                        Some(feed) => tokio::spawn(jobs.clone().work_shared(feed.clone())),
                        None => tokio::spawn(jobs.clone().work()),
                    };
                    let ended = worker.await;
                    jobs.workers.0.fetch_sub(1, Ordering::SeqCst);
                    match ended {
                        Err(e) if e.is_panic() => {
                            jobs.workers.1.fetch_add(1, Ordering::SeqCst);
                            tracing::error!(error = %e, "a job worker panicked; it is restarted");
                        }
                        _ => return,
                    }
                }
            });
        }
    }

    /// One worker: takes queued jobs one at a time, until the service drains.
    async fn work(self: Arc<Self>) {
        use futures::FutureExt;
        loop {
            let (tenant, id) = tokio::select! {
                biased;
                () = self.shutdown.draining() => return,
                next = self.queue.pop() => next,
            };
            if self.shutdown.is_draining() {
                // Taken as the drain began: it stays queued, for the next start.
                let _ = self.queue.push(&tenant, id, true);
                return;
            }
            if let Err(panic) = std::panic::AssertUnwindSafe(self.run(id.clone())).catch_unwind().await {
                self.fail_after_panic(&id, panic).await;
            }
        }
    }

    /// How the workers are doing.
    pub fn worker_health(&self) -> WorkerHealth {
        use std::sync::atomic::Ordering;
        let draining = self.shutdown.is_draining();
        WorkerHealth {
            configured: self.workers_started.load(Ordering::SeqCst),
            running: if draining {
                0
            } else {
                self.workers.0.load(Ordering::SeqCst)
            },
            restarts: self.workers.1.load(Ordering::SeqCst),
            draining,
        }
    }

    /// Records that running job `id` panicked: it fails with `internal_error`, unless it
    /// already reached another end.
    async fn fail_after_panic(&self, id: &str, panic: Box<dyn std::any::Any + Send>) {
        let text = crate::panic_message(&*panic);
        tracing::error!(job = %id, panic = %text, "a job's run panicked; its worker goes on");
        self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
        let update = JobUpdate {
            error: Some(crate::store::JobError {
                code: weft_types::NodeErrorCode::InternalError.into(),
                message: "the server failed while running this job".into(),
                node_id: None,
                class_type: None,
                traceback: None,
            }),
            ..Default::default()
        };
        if let Err(e) = self.transition(id, Trigger::Fail, update).await {
            tracing::error!(job = %id, error = %e, "cannot record the failure of a panicked job");
        }
    }

    /// The runtime now: its catalogue validates submissions, and a job that starts runs on
    /// it to the end, whatever replaces it meanwhile.
    pub fn runtime(&self) -> Arc<Runtime> {
        self.runtime.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `runtime` the one new submissions and jobs use (a plugin was reloaded). Jobs
    /// already running keep theirs.
    pub fn replace_runtime(&self, runtime: Arc<Runtime>) {
        *self.runtime.write().unwrap_or_else(|e| e.into_inner()) = runtime;
    }

    /// The event hub.
    pub fn hub(&self) -> &Hub {
        &self.hub
    }

    /// The run queue.
    pub fn queue(&self) -> &queue::Queue {
        &self.queue
    }

    /// The configuration.
    pub fn config(&self) -> &JobsConfig {
        &self.config
    }

    /// Whether `tenant`'s idempotency `key` was presented within its lifetime: `Some` with
    /// the job it made, if any. A fast pre-check; [`submit`](Self::submit) decides races.
    pub async fn idempotency_claim(&self, tenant: &str, key: &str) -> Result<Option<Option<String>>, StoreError> {
        self.store.idempotency_claim(tenant, key, Utc::now()).await
    }

    /// `tenant`'s jobs, newest first: at most `limit`, older than the job at position
    /// `before`, with every label in `labels`, and in `status` when given.
    pub async fn list(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<i64>,
        labels: &BTreeMap<String, String>,
        status: Option<JobStatus>,
    ) -> Result<JobPage, StoreError> {
        self.store.list_jobs(tenant, limit, before, labels, status).await
    }

    /// Whether `seq` is the position of one of `tenant`'s jobs (a list cursor).
    pub async fn is_position(&self, tenant: &str, seq: i64) -> Result<bool, StoreError> {
        self.store.job_seq_exists(tenant, seq).await
    }

    /// How many jobs are stored, by status.
    pub async fn count_by_status(&self) -> Result<Vec<(JobStatus, i64)>, StoreError> {
        self.store.count_by_status().await
    }

    /// Validates and durably records a job, then queues it.
    pub async fn submit(
        &self,
        tenant: &str,
        workflow: Json,
        labels: BTreeMap<String, String>,
        idempotency_key: Option<String>,
    ) -> Result<JobRecord, SubmitError> {
        self.submit_as(tenant, None, workflow, labels, idempotency_key).await
    }

    /// [`submit`](Self::submit) under an id the caller chose (ComfyUI's `prompt_id`); it
    /// must be a UUID no job has.
    pub async fn submit_as(
        &self,
        tenant: &str,
        id: Option<String>,
        workflow: Json,
        labels: BTreeMap<String, String>,
        idempotency_key: Option<String>,
    ) -> Result<JobRecord, SubmitError> {
        let id = match id {
            None => uuid::Uuid::new_v4().to_string(),
            Some(id) => {
                let parsed = uuid::Uuid::parse_str(&id)
                    .map_err(|_| SubmitError::BadRequest(format!("the job id {id:?} is not a UUID")))?;
                let id = parsed.hyphenated().to_string();
                if self.store.job_by_id(&id).await.map_err(SubmitError::Store)?.is_some() {
                    return Err(SubmitError::BadRequest(format!("a job with id {id} exists already")));
                }
                id
            }
        };
        if let Some(key) = &idempotency_key {
            if key.is_empty() || key.len() > 255 {
                return Err(SubmitError::BadRequest(
                    "Idempotency-Key must be 1 to 255 characters".into(),
                ));
            }
        }
        graph::validate(&workflow, &self.runtime().catalog_for(&workflow)).map_err(SubmitError::Graph)?;
        let mut missing = Vec::new();
        for (node, asset) in graph::asset_refs(&workflow) {
            match self.store.asset(tenant, &asset.id).await.map_err(SubmitError::Store)? {
                Some(_) => {}
                None => missing.push((node, asset.id)),
            }
        }
        if !missing.is_empty() {
            return Err(SubmitError::MissingAsset(missing));
        }
        if !self.has_room(tenant).await.map_err(SubmitError::Store)? {
            return Err(SubmitError::QueueFull {
                retry_after: self.retry_after(),
            });
        }
        if self.config.job_cost > 0 {
            let balance = self
                .store
                .tenant(tenant)
                .await
                .map_err(SubmitError::Store)?
                .map_or(0, |t| t.credits);
            if balance < self.config.job_cost {
                return Err(SubmitError::InsufficientCredits {
                    balance,
                    cost: self.config.job_cost,
                });
            }
        }
        let now = Utc::now();
        let job = JobRecord {
            id,
            tenant: tenant.to_string(),
            status: JobStatus::Queued,
            workflow,
            labels,
            created_at: now,
            updated_at: now,
            started_at: None,
            completed_at: None,
            expires_at: now + chrono::Duration::from_std(self.config.retention).unwrap_or(chrono::Duration::days(7)),
            progress: None,
            error: None,
            logs: None,
            node_times: Vec::new(),
            seq: 0,
        };
        let cost = self.config.job_cost;
        match self.store.insert_job(job.clone(), idempotency_key, cost).await {
            Ok(()) => {}
            Err(StoreError::IdempotencyReuse { job_id }) => return Err(SubmitError::IdempotencyReuse { job_id }),
            Err(StoreError::InsufficientCredits { balance }) => {
                return Err(SubmitError::InsufficientCredits { balance, cost })
            }
            Err(e) => return Err(SubmitError::Store(e)),
        }
        // The job is durable now: it is queued even if a race filled the queue meanwhile.
        match &self.shared {
            Some(shared) => {
                shared.room.submitted(tenant);
                shared.wake_workers().await
            }
            None => {
                self.handover.offer(&job.id, &job.workflow);
                let _ = self.queue.push(tenant, job.id.clone(), true);
            }
        }
        self.metrics.submitted();
        self.publish(&job.id, status_event(&job));
        Ok(job)
    }

    /// Whether `tenant` may queue another job (see [`queue::Queue::has_room`]); with a
    /// shared store the jobs waiting in it are counted, unless a recent count (with this
    /// process's submissions since) is far below the bounds.
    async fn has_room(&self, tenant: &str) -> Result<bool, StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(self.queue.has_room(tenant).is_ok());
        };
        let limits = (self.queue.capacity(), self.config.tenant_queue_depth);
        if shared.room.far_below(tenant, limits) {
            return Ok(true);
        }
        let (all, mine) = shared.coordinator.queued_counts(tenant).await?;
        shared.room.counted(tenant, all, mine);
        Ok(all < limits.0 && mine < limits.1)
    }

    /// Jobs waiting to be taken by a worker (of any process, with a shared store).
    pub async fn queue_len(&self) -> Result<usize, StoreError> {
        match &self.shared {
            Some(shared) => Ok(shared.coordinator.queued_counts("").await?.0),
            None => Ok(self.queue.len()),
        }
    }

    /// The 0-based position at which queued job `id` of `tenant` will be taken, counting
    /// the tenants' turns; 0 for a job a worker has taken but not started.
    pub async fn queue_position(&self, tenant: &str, id: &str) -> Result<usize, StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(self.queue.position(tenant, id).unwrap_or(0));
        };
        Ok(shared.coordinator.queue_position(tenant, id).await?.unwrap_or(0))
    }

    /// Publishes an event of job `id` to the streams following it, in every process.
    pub(crate) fn publish(&self, id: &str, event: JobEvent) {
        match &self.shared {
            Some(shared) => shared.publish(id, event),
            None => self.hub.publish(id, event),
        }
    }

    /// Seconds a caller should wait when the queue is full: the time the workers need to
    /// drain a tenth of the queue at the recent job rate, at least one second.
    fn retry_after(&self) -> u64 {
        let per_job = self.metrics.mean_job_seconds().max(0.001);
        let secs = (self.queue.capacity() as f64 / 10.0) * per_job / self.config.workers.max(1) as f64;
        secs.ceil().clamp(1.0, 300.0) as u64
    }

    /// `tenant`'s job `id` with its outputs and live state.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<JobView>, StoreError> {
        let Some((job, outputs)) = self.store.job_with_outputs(tenant, id).await? else {
            return Ok(None);
        };
        self.view_with(job, outputs).await.map(Some)
    }

    /// Puts the live progress of `job`, if it runs here, in place of the stored one, once
    /// the run has planned its nodes (before that there is nothing to report).
    fn add_live_progress(&self, job: &mut JobRecord) {
        if job.status.is_terminal() {
            return;
        }
        if let Some(running) = self.running.lock().unwrap_or_else(|e| e.into_inner()).get(&job.id) {
            let live = running.progress.lock().unwrap_or_else(|e| e.into_inner());
            if live.nodes_total > 0 {
                job.progress = Some(live.clone());
            }
        }
    }

    /// Adds outputs, live progress and queue position to a stored job.
    pub async fn view(&self, job: JobRecord) -> Result<JobView, StoreError> {
        let outputs = self.store.job_outputs(&job.id).await?;
        self.view_with(job, outputs).await
    }

    /// The view of `job` with its `outputs` already read: live progress and queue position
    /// added.
    async fn view_with(&self, mut job: JobRecord, outputs: Vec<AssetRecord>) -> Result<JobView, StoreError> {
        self.add_live_progress(&mut job);
        let queue_position = match job.status {
            // A queued job no longer in the queue has been taken by a worker that is
            // about to start it: it is next.
            JobStatus::Queued => Some(self.queue_position(&job.tenant, &job.id).await?),
            _ => None,
        };
        Ok(JobView {
            job,
            outputs,
            queue_position,
        })
    }

    /// The views of `jobs` (a page of a list), with every job's outputs read at once.
    pub async fn views(&self, jobs: Vec<JobRecord>) -> Result<Vec<JobView>, StoreError> {
        let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
        let mut outputs = self.store.outputs_of_jobs(&ids).await?;
        let mut views = Vec::with_capacity(jobs.len());
        for job in jobs {
            let own = outputs.remove(&job.id).unwrap_or_default();
            views.push(self.view_with(job, own).await?);
        }
        Ok(views)
    }

    /// The latest `preview` event of running job `id`, if it sent one.
    pub fn latest_preview(&self, id: &str) -> Option<JobEvent> {
        let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let Some(here) = running.get(id) else {
            // Run by another process: the newest preview its stream has seen.
            return self.shared.as_ref().and_then(|_| self.hub.recent_preview(id));
        };
        let preview = here.preview.lock().unwrap_or_else(|e| e.into_inner()).clone();
        preview
    }

    /// Cancels `tenant`'s job `id`: queued goes straight to canceled, running to canceling
    /// (then canceled when its node stops), and anything else is returned unchanged.
    pub async fn cancel(&self, tenant: &str, id: &str) -> Result<Option<JobView>, StoreError> {
        let Some(job) = self.store.job(tenant, id).await? else {
            return Ok(None);
        };
        let job = match self
            .transition(id, Trigger::CancelRequest, JobUpdate::default())
            .await?
        {
            Some(moved) => {
                match moved.status {
                    JobStatus::Canceled => {
                        self.queue.remove(tenant, id);
                        self.handover.take(id);
                    }
                    _ => self.interrupt(id),
                }
                moved
            }
            // Canceling already, or terminal: unchanged (read again, it may have just moved).
            None => self.store.job(tenant, id).await?.unwrap_or(job),
        };
        self.view(job).await.map(Some)
    }

    /// Moves job `id` by `trigger` if its current status allows it, publishing the change.
    pub(crate) async fn transition(
        &self,
        id: &str,
        trigger: Trigger,
        update: JobUpdate,
    ) -> Result<Option<JobRecord>, StoreError> {
        self.transition_announcing(id, trigger, update, Vec::new()).await
    }

    /// [`Self::transition`], publishing `announce` just before the change if the move
    /// happens: what the move records, such as the outputs in `update`.
    pub(crate) async fn transition_announcing(
        &self,
        id: &str,
        trigger: Trigger,
        update: JobUpdate,
        announce: Vec<JobEvent>,
    ) -> Result<Option<JobRecord>, StoreError> {
        let updated = self.store.update_job(id, &state::moves(trigger), update).await?;
        if let Some(job) = &updated {
            for event in announce {
                self.publish(id, event);
            }
            self.metrics.transition(job.status);
            self.publish(id, status_event(job));
        }
        Ok(updated)
    }

    /// Stops a running job's node (cancel and retention), whichever process runs it.
    pub(crate) fn interrupt(&self, id: &str) {
        self.interrupt_here(id);
        if let Some(shared) = &self.shared {
            shared.cancel(id);
        }
    }

    /// Stops job `id`'s node if this process runs it.
    fn interrupt_here(&self, id: &str) {
        if let Some(r) = self.running.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            r.cancel.cancel();
        }
    }
}

/// The status event of `job`: the record without its workflow, which no reader of events
/// needs and which would otherwise be copied into every status event and sit in each live
/// job's replay buffer (`GET /api/v2/jobs/{id}/workflow` reads it from the store).
fn status_event(job: &JobRecord) -> JobEvent {
    JobEvent::Status(Box::new(JobRecord {
        id: job.id.clone(),
        tenant: job.tenant.clone(),
        status: job.status,
        workflow: Json::Null,
        labels: job.labels.clone(),
        created_at: job.created_at,
        updated_at: job.updated_at,
        started_at: job.started_at,
        completed_at: job.completed_at,
        expires_at: job.expires_at,
        progress: job.progress.clone(),
        error: job.error.clone(),
        logs: job.logs.clone(),
        node_times: job.node_times.clone(),
        seq: job.seq,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RuntimeConfig;
    use crate::store::{blobs::LocalBlobs, sqlite::SqliteStore};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outputs_are_numbered_in_the_order_they_are_committed() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.path().join("weft.db")).unwrap());
        let assets = Arc::new(Assets::new(
            store.clone(),
            Arc::new(LocalBlobs::open(&dir.path().join("blobs")).unwrap()),
        ));
        let runtime = tokio::task::spawn_blocking(|| Runtime::load(RuntimeConfig::default()))
            .await
            .unwrap()
            .unwrap();
        let jobs = Jobs::new(store.clone(), assets, runtime, JobsConfig::default());
        jobs.start_workers();
        let save = |text: &str| serde_json::json!({"class_type": "SaveText", "inputs": {"text": text, "filename_prefix": text}});
        let workflow = serde_json::json!({"1": save("a"), "2": save("b"), "3": save("c")});
        let job = jobs.submit("t", workflow, BTreeMap::new(), None).await.unwrap();
        loop {
            let current = store.job_by_id(&job.id).await.unwrap().unwrap();
            if current.status.is_terminal() {
                assert_eq!(current.status, JobStatus::Succeeded, "{:?}", current.error);
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let indices: Vec<Option<i64>> = store
            .job_outputs(&job.id)
            .await
            .unwrap()
            .iter()
            .map(|o| o.output_index)
            .collect();
        assert_eq!(indices, [Some(0), Some(1), Some(2)], "each output has its own place");
    }
}
