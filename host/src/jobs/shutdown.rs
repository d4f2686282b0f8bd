//! Graceful shutdown of the job service (SIGTERM, Ctrl-C): [`Jobs::shut_down`].
//!
//! First the service drains: its workers take no new job (a job a worker had just taken is
//! left queued; with a shared store its claim is released), and the rescue service stops
//! after the pass in flight. The jobs running go on for the grace period and, if they end
//! within it, end as they would have (their outputs committed). A job still running when
//! the grace period is over is abandoned: its node is interrupted, its partial outputs are
//! discarded and it goes back to `queued` (a canceling one becomes canceled), and with a
//! shared store its claim is released at once, so another process takes it without
//! waiting out its lease. On SQLite the next start finds it queued and runs it.
//!
//! Submissions keep being accepted while the service drains: they are durable, and another
//! process (or this one's next start) runs them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::recovery::{recover_one, Recovered};
use super::Jobs;

/// How long the nodes interrupted at the end of the grace period have to stop before their
/// jobs are sent back to the queue from here.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// How often the drain looks whether the workers have ended.
const WORKERS_POLL: Duration = Duration::from_millis(20);

/// How long the events published during the drain have to reach a shared store's log.
const EVENTS_FLUSH: Duration = Duration::from_secs(2);

/// Where the service is on its way out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Taking and running jobs.
    Serving,
    /// Taking no new job; those running may finish.
    Draining,
    /// The grace period is over: running jobs are interrupted and queued again.
    Abandoning,
}

/// The shutdown state of a job service.
pub(super) struct Shutdown {
    phase: watch::Sender<Phase>,
    /// Held by a rescue pass while it settles jobs, so the drain waits for one in flight
    /// (a claim it took over is released before the process exits).
    pub(super) settling: tokio::sync::Mutex<()>,
    /// Jobs interrupted at the end of the grace period and queued again.
    requeued: AtomicUsize,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self {
            phase: watch::Sender::new(Phase::Serving),
            settling: tokio::sync::Mutex::new(()),
            requeued: AtomicUsize::new(0),
        }
    }
}

impl Shutdown {
    /// Whether the service has stopped taking new jobs.
    pub(super) fn is_draining(&self) -> bool {
        *self.phase.borrow() != Phase::Serving
    }

    /// Whether running jobs are being interrupted and queued again.
    pub(super) fn is_abandoning(&self) -> bool {
        *self.phase.borrow() == Phase::Abandoning
    }

    /// Waits until the service stops taking new jobs.
    pub(super) async fn draining(&self) {
        let mut phase = self.phase.subscribe();
        // The sender lives as long as `self`: the wait ends only by the phase.
        let _ = phase.wait_for(|p| *p != Phase::Serving).await;
    }

    fn enter(&self, next: Phase) {
        self.phase.send_if_modified(|phase| {
            let moved = *phase != next && (*phase == Phase::Serving || next == Phase::Abandoning);
            if moved {
                *phase = next;
            }
            moved
        });
    }
}

/// What a shutdown did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Jobs running here when the drain began.
    pub running: usize,
    /// Of those, the jobs still running when the grace period ended: interrupted and
    /// queued again (or canceled, if a cancel was asked).
    pub requeued: usize,
}

impl Jobs {
    /// Whether the service has stopped taking new jobs (it is shutting down).
    pub fn is_draining(&self) -> bool {
        self.shutdown.is_draining()
    }

    /// Shuts the service down gracefully: takes no new job, lets the running ones finish
    /// within `grace`, then interrupts those left and queues them again with their claims
    /// released (see the [module](self)). Returns once no worker runs a job. Submissions are
    /// still accepted, durably, meanwhile and after.
    pub async fn shut_down(self: &Arc<Self>, grace: Duration) -> Drained {
        let running = self.running_count();
        self.shutdown.enter(Phase::Draining);
        tracing::info!(
            running,
            grace_secs = grace.as_secs_f64(),
            "draining: no new job is taken"
        );
        // A rescue pass in flight ends (and releases what it took over) before the drain.
        drop(self.shutdown.settling.lock().await);
        if tokio::time::timeout(grace, self.workers_ended()).await.is_err() {
            self.abandon().await;
        }
        let requeued = self.shutdown.requeued.load(Ordering::SeqCst);
        if let Some(shared) = &self.shared {
            if requeued > 0 {
                // Idle workers elsewhere take the released jobs now rather than at their next poll.
                if let Err(e) = shared.coordinator.signal(crate::store::Signal::Work).await {
                    tracing::warn!(error = %e, "cannot wake the other processes' workers");
                }
            }
            shared.flush_events(EVENTS_FLUSH).await;
        }
        let drained = Drained { running, requeued };
        tracing::info!(?drained, "drained");
        drained
    }

    /// The grace period is over: interrupts every running node; the runs end by queueing
    /// their jobs again ([`requeue_interrupted`](Self::requeue_interrupted)). Runs that do
    /// not stop within [`STOP_WAIT`] are queued again from here (and their claims released).
    async fn abandon(self: &Arc<Self>) {
        self.shutdown.enter(Phase::Abandoning);
        let ids: Vec<String> = {
            let running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            for job in running.values() {
                job.cancel.cancel();
            }
            running.keys().cloned().collect()
        };
        tracing::warn!(jobs = ?ids, "the grace period is over: interrupting the jobs still running, to run again");
        if tokio::time::timeout(STOP_WAIT, self.workers_ended()).await.is_ok() {
            return;
        }
        let stuck: Vec<String> = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            running.drain().map(|(id, _)| id).collect()
        };
        tracing::warn!(jobs = ?stuck, "interrupted jobs did not stop; they are queued again as they are");
        for id in stuck {
            self.requeue_interrupted(&id).await;
            if let Some(shared) = &self.shared {
                super::shared::release(shared.coordinator.as_ref(), &id).await;
            }
        }
    }

    /// Waits until every worker has ended (none run on a process that runs no jobs).
    async fn workers_ended(&self) {
        while self.workers.0.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(WORKERS_POLL).await;
        }
    }

    /// Sends job `id`, whose run was interrupted by the shutdown, back to the queue as a
    /// crash recovery would: its partial outputs discarded, to run again from the start (or
    /// canceled, if a cancel was asked). Its claim, with a shared store, is the caller's to
    /// release. Call only for a run that is no longer in [`Jobs::running`].
    pub(super) async fn requeue_interrupted(&self, id: &str) {
        let job = match self.store.job_by_id(id).await {
            Ok(Some(job)) => job,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(job = %id, error = %e, "cannot read an interrupted job; it is recovered at the next start");
                return;
            }
        };
        let mut done = Recovered::default();
        match recover_one(self, &job, &mut done).await {
            Ok(_) if done.rerun + done.canceled > 0 => {
                self.shutdown.requeued.fetch_add(1, Ordering::SeqCst);
                tracing::info!(job = %id, "interrupted by the shutdown; queued to run again");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(job = %id, error = %e, "cannot queue an interrupted job again; it is recovered at the next start")
            }
        }
    }
}
