//! The in-process event hub: fans a job's events out to every open stream, numbers them,
//! and keeps a short replay buffer so a stream can resume from `Last-Event-ID`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::store::{AssetRecord, JobRecord, Progress};

/// Events kept per job for resuming streams.
const REPLAY: usize = 256;

/// What happened to a job.
#[derive(Debug, Clone)]
pub enum JobEvent {
    /// A status transition; carries the job as it now is.
    Status(Box<JobRecord>),
    /// A progress snapshot.
    Progress(Progress),
    /// An output was committed.
    Output(Box<AssetRecord>),
    /// A preview image of a running node.
    Preview {
        /// Node id.
        node_id: String,
        /// Media type.
        content_type: String,
        /// The image bytes.
        data: Vec<u8>,
    },
    /// A node of the running job began, was served from the cache, or finished.
    Node {
        /// Node id.
        node_id: String,
        /// Its class.
        class_type: String,
        /// What happened.
        phase: NodePhase,
    },
    /// A log line.
    Log {
        /// `info`, `warning` or `error`.
        level: &'static str,
        /// The text.
        message: String,
    },
}

/// What happened to one node of a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodePhase {
    /// It started running.
    Started,
    /// Its result came from the cache (its outputs are committed again).
    Cached,
    /// It reported step `step` of `steps` (at most every few tens of milliseconds, and
    /// always the last step).
    Step {
        /// The step, from 1.
        step: u32,
        /// Steps in all.
        steps: u32,
    },
    /// It finished, from the cache or not.
    Finished,
}

/// A numbered event.
#[derive(Debug, Clone)]
pub struct Numbered {
    /// Per-job sequence number, from 1.
    pub id: u64,
    /// The event.
    pub event: JobEvent,
}

struct Channel {
    tx: broadcast::Sender<Arc<Numbered>>,
    next: u64,
    recent: VecDeque<Arc<Numbered>>,
}

/// Events of every job, for listeners that follow many jobs at once (ComfyUI's `/ws`).
const ALL_JOBS_BUFFER: usize = 1024;

/// One event of one job, as every-job listeners receive it.
#[derive(Debug, Clone)]
pub struct JobNumbered {
    /// The job.
    pub job_id: Arc<str>,
    /// The event.
    pub numbered: Arc<Numbered>,
}

/// The hub.
pub struct Hub {
    jobs: Mutex<HashMap<String, Channel>>,
    all: broadcast::Sender<JobNumbered>,
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            jobs: Mutex::new(HashMap::new()),
            all: broadcast::channel(ALL_JOBS_BUFFER).0,
        }
    }
}

/// A stream's view of a job: events it missed (when resuming) and the live receiver.
pub struct Subscription {
    /// Events after the requested id still in the replay buffer.
    pub missed: Vec<Arc<Numbered>>,
    /// Whether the replay buffer covered everything after the requested id.
    pub complete: bool,
    /// Live events.
    pub live: broadcast::Receiver<Arc<Numbered>>,
}

impl Hub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn channel<'a>(jobs: &'a mut HashMap<String, Channel>, job: &str) -> &'a mut Channel {
        jobs.entry(job.to_string()).or_insert_with(|| Channel {
            tx: broadcast::channel(REPLAY).0,
            next: 1,
            recent: VecDeque::new(),
        })
    }

    /// Publishes `event` for `job`. After a terminal status the job's channel is dropped:
    /// open streams receive what was sent, and later streams start from a snapshot.
    pub fn publish(&self, job: &str, event: JobEvent) {
        let terminal = matches!(&event, JobEvent::Status(j) if j.status.is_terminal());
        let mut jobs = self.lock();
        let channel = Self::channel(&mut jobs, job);
        let numbered = Arc::new(Numbered {
            id: channel.next,
            event,
        });
        channel.next += 1;
        if channel.recent.len() == REPLAY {
            channel.recent.pop_front();
        }
        channel.recent.push_back(numbered.clone());
        let _ = channel.tx.send(numbered.clone());
        if self.all.receiver_count() > 0 {
            let _ = self.all.send(JobNumbered {
                job_id: Arc::from(job),
                numbered,
            });
        }
        if terminal {
            jobs.remove(job);
        }
    }

    /// Subscribes to `job`, replaying what came after `after` if still buffered.
    pub fn subscribe(&self, job: &str, after: Option<u64>) -> Subscription {
        let mut jobs = self.lock();
        let channel = Self::channel(&mut jobs, job);
        let live = channel.tx.subscribe();
        match after {
            None => Subscription {
                missed: Vec::new(),
                complete: false,
                live,
            },
            Some(after) => {
                let missed: Vec<_> = channel.recent.iter().filter(|e| e.id > after).cloned().collect();
                let oldest = channel.recent.front().map_or(channel.next, |e| e.id);
                Subscription {
                    missed,
                    complete: after + 1 >= oldest && after < channel.next,
                    live,
                }
            }
        }
    }

    /// Subscribes to the events of every job, from now on. A listener that falls more than
    /// a buffer behind misses events (and is told so by the receiver).
    pub fn subscribe_all(&self) -> broadcast::Receiver<JobNumbered> {
        self.all.subscribe()
    }

    /// The id the next event of `job` will get.
    pub fn next_id(&self, job: &str) -> u64 {
        self.lock().get(job).map_or(1, |c| c.next)
    }

    /// Forgets a job (after it is deleted). Open streams see their channel close.
    pub fn remove(&self, job: &str) {
        self.lock().remove(job);
    }
}
