//! Running one job service across several processes that share a store (PostgreSQL): the
//! workers claim jobs from the database instead of the in-process queue, leases are renewed
//! while this process lives, events go to the shared event log and come back to this
//! process's streams from it, and cancels reach the process running the job. Wake-ups
//! ([`Signal`]s) only shorten waits: workers also poll, and the hub re-reads the log.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, Notify};

use super::events::{JobEvent, Subscription, REPLAY};
use super::Jobs;
use crate::store::{Coordinator, Signal, StoreError};

/// Events waiting to be written to the shared log; beyond it new events are dropped, with a
/// warning (a stream that reconnects re-syncs from the job's stored snapshot).
const EVENT_BACKLOG: usize = 4096;

/// How long an idle worker waits for a wake-up before it polls the database anyway.
const POLL: Duration = Duration::from_secs(1);

/// This process's part in the shared job service.
pub(crate) struct Shared {
    pub(crate) coordinator: Arc<dyn Coordinator>,
    events: mpsc::Sender<(String, JobEvent)>,
    events_rx: std::sync::Mutex<Option<mpsc::Receiver<(String, JobEvent)>>>,
    work: Notify,
    /// Serialises feeding the hub from the log, so every event reaches it once, in order.
    feeding: tokio::sync::Mutex<()>,
}

impl Shared {
    pub(crate) fn new(coordinator: Arc<dyn Coordinator>) -> Self {
        let (events, events_rx) = mpsc::channel(EVENT_BACKLOG);
        Self {
            coordinator,
            events,
            events_rx: std::sync::Mutex::new(Some(events_rx)),
            work: Notify::new(),
            feeding: tokio::sync::Mutex::new(()),
        }
    }

    /// Queues `event` of `job` for the shared log (never blocks: called from node code).
    pub(crate) fn publish(&self, job: &str, event: JobEvent) {
        if let Err(e) = self.events.try_send((job.to_string(), event)) {
            tracing::warn!(job = %job, error = %e, "an event was dropped: the event log is behind");
        }
    }

    /// Waits (at most `within`) until the events published so far have been taken for the
    /// shared log, so that a process about to exit leaves none behind.
    pub(crate) async fn flush_events(&self, within: Duration) {
        let flushed = async {
            while self.events.capacity() < self.events.max_capacity() {
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
}

impl Jobs {
    /// Starts this process's shared services: the event writer, the wake-up listener and
    /// the lease renewer. Call once, with a coordinator.
    pub(super) fn start_shared(self: &Arc<Self>, shared: &Shared) {
        if let Some(rx) = shared.events_rx.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(write_events(shared.coordinator.clone(), rx));
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
        } else {
            self.feed_hub_locked(shared, id).await;
        }
        let subscription = self.hub.subscribe(id, after);
        let mark = self.hub.next_id(id).saturating_sub(1);
        if ended {
            // Nothing follows a terminal status: the stream needs no live channel.
            self.hub.remove(id);
        }
        Ok((subscription, mark))
    }

    /// The worker loop of a shared store: claim, run, release; wait for a wake-up (or
    /// poll) when nothing is queued. It ends when the service drains.
    pub(super) async fn work_shared(self: Arc<Self>) {
        use futures::FutureExt;
        let Some(shared) = &self.shared else { return };
        while !self.shutdown.is_draining() {
            // Registered before the claim, so a wake-up sent while claiming is not missed.
            let woken = shared.work.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let idle = match shared.coordinator.claim().await {
                Ok(Some((_tenant, id))) => {
                    // A job claimed as the drain began is released unstarted, still queued.
                    if !self.shutdown.is_draining() {
                        let run = std::panic::AssertUnwindSafe(self.run(id.clone())).catch_unwind();
                        if let Err(panic) = run.await {
                            self.fail_after_panic(&id, panic).await;
                        }
                    }
                    release(shared.coordinator.as_ref(), &id).await;
                    continue;
                }
                Ok(None) => futures::future::Either::Left(async {
                    let _ = tokio::time::timeout(POLL, woken).await;
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim a job");
                    futures::future::Either::Right(tokio::time::sleep(POLL))
                }
            };
            tokio::select! {
                () = idle => {}
                () = self.shutdown.draining() => return,
            }
        }
    }
}

/// How many times a coordinator write that failed (a deadlock the database broke, a
/// dropped connection) is tried in all: a failed one wrote nothing, so it is safe to repeat.
const WRITE_ATTEMPTS: u32 = 5;

/// Runs `write` until it succeeds or has failed [`WRITE_ATTEMPTS`] times, pausing longer
/// after each failure; the last error if every attempt failed.
async fn with_retries<F: Future<Output = Result<(), StoreError>>>(
    what: &str,
    mut write: impl FnMut() -> F,
) -> Result<(), StoreError> {
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
pub(super) async fn release(coordinator: &dyn Coordinator, id: &str) {
    if let Err(e) = with_retries("releasing a claim", || coordinator.release(id)).await {
        tracing::warn!(job = %id, error = %e, "cannot release a job's claim; its lease will lapse");
    }
}

/// Most events written in one transaction.
const EVENT_BATCH: usize = 256;

/// Writes queued events to the shared log, in the order they were published, all those
/// waiting in one transaction. The batch is ordered by job (stably: each job's events keep
/// their order), so every process locks job rows in the same order and two batches cannot
/// deadlock; a batch that fails anyway is retried, since a failed one wrote nothing.
async fn write_events(coordinator: Arc<dyn Coordinator>, mut rx: mpsc::Receiver<(String, JobEvent)>) {
    let mut batch = Vec::with_capacity(EVENT_BATCH);
    while rx.recv_many(&mut batch, EVENT_BATCH).await > 0 {
        batch.sort_by(|a, b| a.0.cmp(&b.0));
        let events: Vec<(String, String, Option<String>)> = batch
            .drain(..)
            .map(|(job, event)| {
                let progress = match &event {
                    JobEvent::Progress(p) => serde_json::to_string(p).ok(),
                    _ => None,
                };
                (job, event.to_log(), progress)
            })
            .collect();
        if let Err(e) = with_retries("writing events", || coordinator.append_events(events.clone())).await {
            tracing::warn!(error = %e, events = events.len(), "cannot write events to the log; they are lost");
        }
    }
}
