//! What several processes sharing one store need beyond [`Store`](super::Store): claims on
//! queued jobs with leases their workers renew, the lapsed claims of dead workers, a
//! shared numbered log of each job's events, and wake-ups between processes. Only the
//! PostgreSQL store has one; with SQLite the queue, the event hub and the running-job map
//! are per process, and one process owns the database.

use async_trait::async_trait;
use tokio::sync::broadcast;

use super::StoreError;

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

/// Cross-process coordination over a shared store.
#[async_trait]
pub trait Coordinator: Send + Sync {
    /// This process's name, unique among the processes sharing the store.
    fn process(&self) -> &str;
    /// How long a claim lasts unless renewed.
    fn lease(&self) -> std::time::Duration;
    /// Claims the next queued job for this process, tenants taking turns round-robin as in
    /// the local queue: `(tenant, id)`, or `None` when nothing unclaimed waits.
    async fn claim(&self) -> Result<Option<(String, String)>, StoreError>;
    /// Gives up this process's claim on `id` (its run ended, or a rescue sent it back to
    /// the queue, where it is claimable again).
    async fn release(&self, id: &str) -> Result<(), StoreError>;
    /// Gives a turn to each tenant whose claimable jobs have none (queued by a process of an
    /// older weft during an upgrade), so that no queued job waits unseen; returns how many.
    async fn restore_turns(&self) -> Result<u64, StoreError>;
    /// Extends every claim this process holds by a lease; returns how many.
    async fn renew_leases(&self) -> Result<u64, StoreError>;
    /// Ids of unfinished jobs whose claim lapsed (their worker died), or that are running
    /// with no claim at all.
    async fn lapsed(&self) -> Result<Vec<String>, StoreError>;
    /// Takes over the lapsed claim on `id` for this process; `false` if another process
    /// took it first or it no longer lapsed.
    async fn take_over(&self, id: &str) -> Result<bool, StoreError>;
    /// Unclaimed queued jobs `(tenant, id)`, each tenant's oldest first, tenants listed in
    /// the order of their turn.
    async fn queued(&self) -> Result<Vec<(String, String)>, StoreError>;
    /// Unclaimed queued jobs: `(all, tenant's)`.
    async fn queued_counts(&self, tenant: &str) -> Result<(usize, usize), StoreError>;
    /// Appends an event (its JSON `body`) to job `job`'s log and wakes the listeners;
    /// `progress`, if any, also becomes the running job's stored progress. Returns its number.
    async fn append_event(&self, job: &str, body: String, progress: Option<String>) -> Result<u64, StoreError>;
    /// Appends several events, each `(job, body, progress)` as for
    /// [`append_event`](Self::append_event), in order, in one transaction.
    async fn append_events(&self, events: Vec<(String, String, Option<String>)>) -> Result<(), StoreError>;
    /// Job `job`'s events numbered above `after`, oldest first, at most `limit`.
    async fn events_after(&self, job: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError>;
    /// The newest `limit` events of job `job`, oldest first.
    async fn latest_events(&self, job: &str, limit: usize) -> Result<Vec<(u64, String)>, StoreError>;
    /// Sends `signal` to every process sharing the store (this one included).
    async fn signal(&self, signal: Signal) -> Result<(), StoreError>;
    /// The wake-ups this process receives.
    fn signals(&self) -> broadcast::Receiver<Signal>;
}
