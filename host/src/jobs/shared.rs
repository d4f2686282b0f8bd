//! Running one job service across several processes that share a store (PostgreSQL): the
//! workers claim jobs from the database instead of the in-process queue, leases are renewed
//! while this process lives, events go to the shared event log and come back to this
//! process's streams from it, and cancels reach the process running the job. Wake-ups
//! ([`Signal`]s) only shorten waits: workers also poll, and the hub re-reads the log.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, Notify, Semaphore};

use super::events::{JobEvent, Subscription, REPLAY};
use super::Jobs;
use crate::store::{ClaimedJob, Coordinator, JobRecord, JobStatus, JobUpdate, LogWrite, Signal, StoreError};

/// Writes waiting for the shared log; beyond it new events are dropped, with a warning (a
/// stream that reconnects re-syncs from the job's stored snapshot), and moves wait.
const LOG_BACKLOG: usize = 4096;

/// How long an idle worker waits for a wake-up before it polls the database anyway.
const POLL: Duration = Duration::from_secs(1);

/// The most jobs one claim takes.
const CLAIM_BATCH: usize = 64;

/// What waits for the shared log: an event, or a move whose caller awaits its outcome.
enum Pending {
    Event(String, JobEvent),
    Move(LogWrite, oneshot::Sender<Result<Option<JobRecord>, StoreError>>),
}

/// This process's part in the shared job service.
pub(crate) struct Shared {
    pub(crate) coordinator: Arc<dyn Coordinator>,
    log: mpsc::Sender<Pending>,
    log_rx: std::sync::Mutex<Option<mpsc::Receiver<Pending>>>,
    work: Notify,
    /// Serialises feeding the hub from the log, so every event reaches it once, in order.
    feeding: tokio::sync::Mutex<()>,
    /// Outcomes handed to the log and not yet recorded.
    outcomes: Arc<std::sync::atomic::AtomicUsize>,
    /// Recent counts of the shared queue, for admitting submissions.
    pub(crate) room: super::room::Room,
}

/// An outcome being recorded (see [`Shared::finishing`]), until dropped.
pub(crate) struct Finishing(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Finishing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The jobs this process's claimer hands its workers: each idle worker adds a slot, and a
/// claim takes at most as many jobs as there are slots.
pub(super) struct Feed {
    jobs: tokio::sync::Mutex<mpsc::UnboundedReceiver<ClaimedJob>>,
    slots: Semaphore,
}

impl Shared {
    pub(crate) fn new(coordinator: Arc<dyn Coordinator>) -> Self {
        let (log, log_rx) = mpsc::channel(LOG_BACKLOG);
        Self {
            coordinator,
            log,
            log_rx: std::sync::Mutex::new(Some(log_rx)),
            work: Notify::new(),
            feeding: tokio::sync::Mutex::new(()),
            outcomes: Arc::default(),
            room: Default::default(),
        }
    }

    /// Queues `event` of `job` for the shared log (never blocks: called from node code).
    pub(crate) fn publish(&self, job: &str, event: JobEvent) {
        if let Err(e) = self.log.try_send(Pending::Event(job.to_string(), event)) {
            tracing::warn!(job = %job, error = %e, "an event was dropped: the event log is behind");
        }
    }

    /// Moves job `id` by one of `moves` with `update`, in the shared log's next batch: when
    /// it moves, `announce` and its status event follow it in the log and this process's
    /// claim on it is given up. Returns once the batch is committed, with the job as it
    /// became (`None` when no move started at its status).
    pub(crate) async fn finish(
        &self,
        id: &str,
        moves: Vec<(JobStatus, JobStatus)>,
        update: JobUpdate,
        announce: Vec<JobEvent>,
    ) -> Result<Option<JobRecord>, StoreError> {
        let write = LogWrite::Move {
            id: id.to_string(),
            moves,
            update: Box::new(update),
            announce: announce.iter().map(JobEvent::to_log).collect(),
        };
        let (reply, outcome) = oneshot::channel();
        self.log
            .send(Pending::Move(write, reply))
            .await
            .map_err(|_| StoreError::Backend("the event log writer has stopped".into()))?;
        outcome
            .await
            .map_err(|_| StoreError::Backend("the event log writer has stopped".into()))?
    }

    /// Counts an outcome being recorded until the returned guard is dropped.
    pub(crate) fn finishing(&self) -> Finishing {
        self.outcomes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Finishing(self.outcomes.clone())
    }

    /// Waits (at most `within`) until the events published so far have been taken for the
    /// shared log and the outcomes handed to it are recorded, so that a process about to
    /// exit leaves none behind.
    pub(crate) async fn flush_events(&self, within: Duration) {
        let flushed = async {
            while self.log.capacity() < self.log.max_capacity()
                || self.outcomes.load(std::sync::atomic::Ordering::SeqCst) > 0
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        if tokio::time::timeout(within, flushed).await.is_err() {
            tracing::warn!("some events did not reach the event log before the shutdown");
        }
    }

    /// Asks every process to stop job `id`'s node (this one's is stopped by the caller).
    pub(crate) fn cancel(&self, id: &str) {
        let coordinator = self.coordinator.clone();
        let signal = Signal::Cancel(id.to_string());
        tokio::spawn(async move {
            if let Err(e) = coordinator.signal(signal).await {
                tracing::warn!(error = %e, "cannot send a cancel to the other processes");
            }
        });
    }

    /// Wakes the idle workers of every process (coalesced by the coordinator).
    pub(crate) async fn wake_workers(&self) {
        if let Err(e) = self.coordinator.signal(Signal::Work).await {
            tracing::warn!(error = %e, "cannot wake the workers");
        }
    }
}

impl Jobs {
    /// Starts this process's shared services: the event writer, the wake-up listener and
    /// the lease renewer. Call once, with a coordinator.
    pub(super) fn start_shared(self: &Arc<Self>, shared: &Shared) {
        if let Some(rx) = shared.log_rx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(write_log(shared.coordinator.clone(), rx));
        }
        let jobs = self.clone();
        let signals = shared.coordinator.signals();
        tokio::spawn(async move { jobs.follow_signals(signals).await });
        let coordinator = shared.coordinator.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval((coordinator.lease() / 3).max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = coordinator.renew_leases().await {
                    tracing::warn!(error = %e, "cannot renew this process's leases");
                }
            }
        });
    }

    async fn follow_signals(self: Arc<Self>, mut signals: broadcast::Receiver<Signal>) {
        let Some(shared) = &self.shared else { return };
        loop {
            let signal = match signals.recv().await {
                Ok(signal) => signal,
                Err(broadcast::error::RecvError::Lagged(_)) => Signal::Resync,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            match signal {
                Signal::Work => shared.work.notify_waiters(),
                Signal::Cancel(id) => self.interrupt_here(&id),
                Signal::Event(notice) => {
                    if self.hub.follows_all() {
                        self.hub.open_at(&notice.job, notice.n, &notice.tenant);
                    }
                    self.feed_hub(&notice.job).await
                }
                Signal::Resync => {
                    shared.work.notify_waiters();
                    for id in self.hub.watched() {
                        self.feed_hub(&id).await;
                    }
                }
            }
        }
    }

    /// Brings the hub's channel of job `id`, if a stream follows it, up to the shared log.
    async fn feed_hub(&self, id: &str) {
        let Some(shared) = &self.shared else { return };
        let _feeding = shared.feeding.lock().await;
        self.feed_hub_locked(shared, id).await;
        self.hub.close_if_unwatched(id);
    }

    async fn feed_hub_locked(&self, shared: &Shared, id: &str) {
        loop {
            if !self.hub.is_watched(id) {
                return;
            }
            let after = self.hub.next_id(id).saturating_sub(1);
            let events = match shared.coordinator.events_after(id, after, REPLAY).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(job = %id, error = %e, "cannot read the event log");
                    return;
                }
            };
            let full = events.len() == REPLAY;
            for (n, body) in events {
                if let Some(event) = JobEvent::from_log(&body) {
                    self.hub.publish_numbered(id, n, event);
                }
            }
            if !full {
                return;
            }
        }
    }

    /// Subscribes to job `id`'s events after `after`; returns the subscription and the
    /// number of the last event it covers.
    pub async fn subscribe(&self, id: &str, after: Option<u64>) -> Result<(Subscription, u64), StoreError> {
        let Some(shared) = &self.shared else {
            let subscription = self.hub.subscribe(id, after);
            return Ok((subscription, self.hub.next_id(id).saturating_sub(1)));
        };
        let _feeding = shared.feeding.lock().await;
        let mut ended = false;
        if self.hub.is_watched(id) {
            // Feeding may close the channel, when the streams that followed it have gone:
            // then it is seeded afresh below.
            self.feed_hub_locked(shared, id).await;
        }
        if !self.hub.is_watched(id) {
            let backlog: Vec<(u64, JobEvent)> = shared
                .coordinator
                .latest_events(id, REPLAY)
                .await?
                .into_iter()
                .filter_map(|(n, body)| JobEvent::from_log(&body).map(|e| (n, e)))
                .collect();
            ended = backlog
                .last()
                .is_some_and(|(_, e)| matches!(e, JobEvent::Status(j) if j.status.is_terminal()));
            self.hub.seed(id, backlog);
        }
        let subscription = self.hub.subscribe(id, after);
        let mark = self.hub.next_id(id).saturating_sub(1);
        if ended {
            // Nothing follows a terminal status: the stream needs no live channel.
            self.hub.remove(id);
        }
        Ok((subscription, mark))
    }

    /// Starts this process's claimer, which claims as many jobs as its workers have free
    /// slots, in one statement, and hands them to the workers ([`work_shared`](Self::work_shared)).
    /// It stops when the service drains, and the workers after it once the jobs it handed
    /// them are done. A claimer that panics is restarted.
    pub(super) fn start_claimer(self: &Arc<Self>) -> Arc<Feed> {
        let (tx, rx) = mpsc::unbounded_channel();
        let feed = Arc::new(Feed {
            jobs: tokio::sync::Mutex::new(rx),
            slots: Semaphore::new(0),
        });
        let (jobs, handed) = (self.clone(), feed.clone());
        tokio::spawn(async move {
            loop {
                let claimer = tokio::spawn(jobs.clone().claim_for_workers(tx.clone(), handed.clone()));
                match claimer.await {
                    Err(e) if e.is_panic() => tracing::error!(error = %e, "the job claimer panicked; it is restarted"),
                    _ => return,
                }
            }
        });
        feed
    }

    /// The claimer's loop: waits for a free slot, claims up to the free slots, hands the
    /// jobs over; when the queue runs short it waits for a wake-up (or polls).
    async fn claim_for_workers(self: Arc<Self>, handed: mpsc::UnboundedSender<ClaimedJob>, feed: Arc<Feed>) {
        let Some(shared) = &self.shared else { return };
        loop {
            let first = tokio::select! {
                biased;
                () = self.shutdown.draining() => return,
                slot = feed.slots.acquire() => slot,
            };
            let Ok(first) = first else { return };
            first.forget();
            let mut wanted = 1;
            while wanted < CLAIM_BATCH {
                match feed.slots.try_acquire() {
                    Ok(slot) => slot.forget(),
                    Err(_) => break,
                }
                wanted += 1;
            }
            // Registered before the claim, so a wake-up sent while claiming is not missed.
            let woken = shared.work.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let claimed = match shared.coordinator.claim(wanted).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim jobs");
                    Vec::new()
                }
            };
            let short = claimed.len() < wanted;
            feed.slots.add_permits(wanted - claimed.len());
            for job in claimed {
                self.announce_start(&job.job);
                let _ = handed.send(job);
            }
            if short {
                tokio::select! {
                    () = &mut woken => {}
                    () = tokio::time::sleep(POLL) => {}
                    () = self.shutdown.draining() => return,
                }
            }
        }
    }

    /// One worker of a shared store: runs the jobs the claimer hands it, giving up each
    /// one's claim when its run ends. It ends when the claimer has stopped and every job it
    /// handed over is taken.
    pub(super) async fn work_shared(self: Arc<Self>, feed: Arc<Feed>) {
        use futures::FutureExt;
        let Some(shared) = &self.shared else { return };
        loop {
            feed.slots.add_permits(1);
            let Some(claimed) = feed.jobs.lock().await.recv().await else {
                return;
            };
            let id = claimed.job.id.clone();
            let released = if self.shutdown.is_draining() {
                // Claimed as the drain began: queued again, unstarted.
                self.requeue_interrupted(&id).await;
                false
            } else {
                match std::panic::AssertUnwindSafe(self.run_claimed(claimed))
                    .catch_unwind()
                    .await
                {
                    Ok(released) => released,
                    Err(panic) => {
                        self.fail_after_panic(&id, panic).await;
                        false
                    }
                }
            };
            if !released {
                release(shared.coordinator.as_ref(), &id).await;
            }
        }
    }
}

/// How many times a coordinator write that failed (a deadlock the database broke, a
/// dropped connection) is tried in all: a failed one wrote nothing, so it is safe to repeat.
const WRITE_ATTEMPTS: u32 = 5;

/// Runs `write` until it succeeds or has failed [`WRITE_ATTEMPTS`] times, pausing longer
/// after each failure; the last error if every attempt failed.
async fn with_retries<T, F: Future<Output = Result<T, StoreError>>>(
    what: &str,
    mut write: impl FnMut() -> F,
) -> Result<T, StoreError> {
    let mut attempt = 1;
    loop {
        match write().await {
            Err(e) if attempt < WRITE_ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "{what} failed; retrying");
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt))).await;
                attempt += 1;
            }
            done => return done,
        }
    }
}

/// Releases this process's claim on job `id`, retried: a claim left behind holds a queued
/// job until its lease lapses.
pub(crate) async fn release(coordinator: &dyn Coordinator, id: &str) {
    if let Err(e) = with_retries("releasing a claim", || coordinator.release(id)).await {
        tracing::warn!(job = %id, error = %e, "cannot release a job's claim; its lease will lapse");
    }
}

/// Most writes in one transaction.
const LOG_BATCH: usize = 256;

/// Writes what waits for the shared log, in the order it was published, all that waits
/// (up to [`LOG_BATCH`]) in one transaction, and answers each move once it is committed.
/// A batch that fails is retried, since a failed one wrote nothing.
async fn write_log(coordinator: Arc<dyn Coordinator>, mut rx: mpsc::Receiver<Pending>) {
    let mut batch = Vec::with_capacity(LOG_BATCH);
    let status_body = |job: &JobRecord| super::status_event(job).to_log();
    while rx.recv_many(&mut batch, LOG_BATCH).await > 0 {
        let mut writes = Vec::with_capacity(batch.len());
        let mut replies = Vec::new();
        for pending in batch.drain(..) {
            match pending {
                Pending::Event(job, event) => {
                    let progress = match &event {
                        JobEvent::Progress(p) => serde_json::to_string(p).ok(),
                        _ => None,
                    };
                    writes.push(LogWrite::Event {
                        job,
                        body: event.to_log(),
                        progress,
                    });
                }
                Pending::Move(write, reply) => {
                    writes.push(write);
                    replies.push(reply);
                }
            }
        }
        let written = with_retries("writing the event log", || {
            coordinator.write(writes.clone(), &status_body)
        })
        .await;
        match written {
            Ok(written) => {
                for (reply, moved) in replies.into_iter().zip(written.moved) {
                    let _ = reply.send(Ok(moved));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, writes = writes.len(), "cannot write to the event log; its events are lost");
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Backend(e.to_string())));
                }
            }
        }
    }
}
