//! What several processes sharing one store need beyond [`Store`](super::Store): claims on
//! queued jobs with leases their workers renew, the lapsed claims of dead workers, a
//! shared numbered log of each job's events, and wake-ups between processes. Only the
//! PostgreSQL store has one; with SQLite the queue, the event hub and the running-job map
//! are per process, and one process owns the database.

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::{JobRecord, JobStatus, JobUpdate, StoreError};

/// A wake-up between processes. It carries no data: the receiver reads the database, so
/// a lost wake-up delays something but loses nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// A job was queued or released: idle workers should try to claim.
    Work,
    /// Job `id` was asked to stop: the process running it interrupts its node.
    Cancel(String),
    /// A job has a new event in the log.
    Event(EventNotice),
    /// Wake-ups may have been missed (the listening connection was re-made): re-read all.
    Resync,
}

/// What an event wake-up names: the job, the number of its new event and the job's tenant,
/// so that a process whose listeners follow every job (ComfyUI's `/ws`, the dashboard's
/// list) can start following a job at that event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EventNotice {
    /// The job.
    pub job: String,
    /// The event's number in the job's log.
    pub n: u64,
    /// The job's tenant.
    pub tenant: String,
}

/// A job a claim took: already moved to running (the `Start` move) for this process, with
/// its workflow.
#[derive(Debug, Clone)]
pub struct ClaimedJob {
    /// The job as it is now: running, claimed by this process.
    pub job: JobRecord,
    /// Its workflow.
    pub workflow: serde_json::Value,
}

/// One write to the shared log, for [`Coordinator::write`].
#[derive(Debug, Clone)]
pub enum LogWrite {
    /// An event of `job` (its JSON `body`); `progress`, if any, also becomes the running
    /// job's stored progress.
    Event {
        /// The job.
        job: String,
        /// The event, as the log keeps it.
        body: String,
        /// The progress it carries, as stored JSON.
        progress: Option<String>,
    },
    /// A status move, as [`Store::update_job`](super::Store::update_job) makes one, that
    /// also gives up this process's claim on the job when it moves. When it moves,
    /// `announce` (event bodies) and then the job's status event are appended after it.
    Move {
        /// The job.
        id: String,
        /// The allowed moves (from, to).
        moves: Vec<(JobStatus, JobStatus)>,
        /// What the move writes.
        update: Box<JobUpdate>,
        /// Events appended before the move's status event.
        announce: Vec<String>,
    },
}

/// Makes the status event (as the log keeps it) of a job a [`LogWrite::Move`] moved.
pub type StatusBody = dyn Fn(&JobRecord) -> String + Send + Sync;

/// What a [`Coordinator::write`] did.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// For each [`LogWrite::Move`], in order: the job as it became, or `None` when no move
    /// started at its status (or the job is gone).
    pub moved: Vec<Option<JobRecord>>,
    /// For each job with events in the write: its tenant and its first new event's number.
    pub notices: Vec<EventNotice>,
}

/// Cross-process coordination over a shared store.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// This process's name, unique among the processes sharing the store.
    fn process(&self) -> &str;
    /// How long a claim lasts unless renewed.
    fn lease(&self) -> std::time::Duration;
    /// Whether this process is the one that runs the shared maintenance (retention, the
    /// rescue, key expiry). One live process is, at any time.
    fn is_leader(&self) -> bool;
    /// Claims up to `n` queued jobs for this process in one statement and starts them,
    /// tenants taking turns round-robin as in the local queue (each tenant's oldest first).
    /// Empty when nothing unclaimed waits, or while this process cannot show the others that
    /// it is alive.
    async fn claim(&self, n: usize) -> Result<Vec<ClaimedJob>, StoreError>;
    /// Gives up this process's claim on `id` (its run ended, or a rescue sent it back to
    /// the queue, where it is claimable again).
    async fn release(&self, id: &str) -> Result<(), StoreError>;
    /// Gives a turn to each tenant whose claimable jobs have none (queued by a process of an
    /// older weft during an upgrade), so that no queued job waits unseen; returns how many.
    async fn restore_turns(&self) -> Result<u64, StoreError>;
    /// Extends every claim this process holds by a lease; returns how many.
    async fn renew_leases(&self) -> Result<u64, StoreError>;
    /// Ids of unfinished jobs whose claim lapsed: the process holding it is gone (its
    /// connection closed) or stopped renewing its lease; or that are running with no claim.
    async fn lapsed(&self) -> Result<Vec<String>, StoreError>;
    /// Takes over the lapsed claim on `id` for this process; `false` if another process
    /// took it first or it no longer lapsed.
    async fn take_over(&self, id: &str) -> Result<bool, StoreError>;
    /// The 0-based position at which queued job `id` of `tenant` will be claimed, counting
    /// the tenants' turns as the local queue does; `None` when it is not waiting.
    async fn queue_position(&self, tenant: &str, id: &str) -> Result<Option<usize>, StoreError>;
    /// Unclaimed queued jobs: `(all, tenant's)`.
    async fn queued_counts(&self, tenant: &str) -> Result<(usize, usize), StoreError>;
    /// Writes `writes` in order, in one transaction: events are appended to their job's log
    /// and numbered, moves applied with their events (`status_body` makes a moved job's
    /// status event). The listeners of every process are woken once it commits.
    async fn write(&self, writes: Vec<LogWrite>, status_body: &StatusBody) -> Result<Written, StoreError>;
    /// Appends one event (see [`LogWrite::Event`]); returns its number, 0 if the job is gone.
    async fn append_event(&self, job: &str, body: String, progress: Option<String>) -> Result<u64, StoreError> {
        let event = LogWrite::Event {
            job: job.to_string(),
            body,
            progress,
        };
        let written = self.write(vec![event], &|_| String::new()).await?;
        Ok(written.notices.first().map_or(0, |n| n.n))
    }
    /// Job `job`'s events numbered above `after`, oldest first, at most `limit`.
    async fn events_after(&self, job: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError>;
    /// The newest `limit` events of job `job`, oldest first.
    async fn latest_events(&self, job: &str, limit: usize) -> Result<Vec<(u64, String)>, StoreError>;
    /// Sends `signal` to every process sharing the store (this one included). Work
    /// wake-ups are coalesced: at most one goes out per short cooldown.
    async fn signal(&self, signal: Signal) -> Result<(), StoreError>;
    /// The wake-ups this process receives.
    fn signals(&self) -> broadcast::Receiver<Signal>;
}
