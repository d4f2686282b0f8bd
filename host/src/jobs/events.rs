//! The in-process event hub: fans a job's events out to every open stream, numbers them,
//! and keeps a short replay buffer so a stream can resume from `Last-Event-ID`. When
//! several processes share a store, the numbers come from the shared event log and the hub
//! is fed from it ([`Hub::publish_numbered`], [`Hub::seed`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::store::{AssetRecord, JobRecord, Progress};

/// Events kept per job for resuming streams.
pub(crate) const REPLAY: usize = 256;

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

/// A [`JobEvent`] as written to the shared event log.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Logged {
    Status {
        job: Box<JobRecord>,
    },
    Progress {
        progress: Progress,
    },
    Output {
        asset: Box<AssetRecord>,
    },
    Preview {
        node_id: String,
        content_type: String,
        data_base64: String,
    },
    Log {
        level: String,
        message: String,
    },
    Node {
        node_id: String,
        class_type: String,
        phase: NodePhase,
    },
}

impl JobEvent {
    /// The event as JSON, for the shared event log.
    pub(crate) fn to_log(&self) -> String {
        use base64::Engine;
        let logged = match self.clone() {
            JobEvent::Status(job) => Logged::Status { job },
            JobEvent::Progress(progress) => Logged::Progress { progress },
            JobEvent::Output(asset) => Logged::Output { asset },
            JobEvent::Preview {
                node_id,
                content_type,
                data,
            } => Logged::Preview {
                node_id,
                content_type,
                data_base64: base64::engine::general_purpose::STANDARD.encode(data),
            },
            JobEvent::Log { level, message } => Logged::Log {
                level: level.to_string(),
                message,
            },
            JobEvent::Node {
                node_id,
                class_type,
                phase,
            } => Logged::Node {
                node_id,
                class_type,
                phase,
            },
        };
        serde_json::to_string(&logged).expect("events serialize")
    }

    /// An event read back from the shared event log; `None` if it does not parse.
    pub(crate) fn from_log(text: &str) -> Option<Self> {
        use base64::Engine;
        Some(match serde_json::from_str::<Logged>(text).ok()? {
            Logged::Status { job } => JobEvent::Status(job),
            Logged::Progress { progress } => JobEvent::Progress(progress),
            Logged::Output { asset } => JobEvent::Output(asset),
            Logged::Preview {
                node_id,
                content_type,
                data_base64,
            } => JobEvent::Preview {
                node_id,
                content_type,
                data: base64::engine::general_purpose::STANDARD.decode(data_base64).ok()?,
            },
            Logged::Log { level, message } => JobEvent::Log {
                level: match level.as_str() {
                    "error" => "error",
                    "warning" => "warning",
                    _ => "info",
                },
                message,
            },
            Logged::Node {
                node_id,
                class_type,
                phase,
            } => JobEvent::Node {
                node_id,
                class_type,
                phase,
            },
        })
    }

    fn is_terminal_status(&self) -> bool {
        matches!(self, JobEvent::Status(j) if j.status.is_terminal())
    }
}

/// What happened to one node of a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The job's tenant, once a status event named it.
    tenant: Option<String>,
}

/// Items of the feed kept for slow readers; one that falls further behind is told so.
const FEED: usize = 1024;

/// A status change or progress of some job, for list views (the dashboard's jobs list).
#[derive(Debug, Clone)]
pub struct FeedItem {
    /// The job's tenant.
    pub tenant: String,
    /// The job.
    pub job_id: String,
    /// The event: only `Status` and `Progress` are fed.
    pub event: Arc<Numbered>,
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

/// Jobs whose channel closed at a terminal status that are remembered, so that a late
/// wake-up of the shared log does not open their channel again.
const ENDED: usize = 4096;

/// The channels of the jobs, and the two every-job channels.
#[derive(Default)]
struct Channels {
    open: HashMap<String, Channel>,
    /// Recently ended jobs, oldest first, and the same as a set.
    ended: VecDeque<String>,
    ended_set: std::collections::HashSet<String>,
}

impl Channels {
    /// Closes `job`'s channel; `terminal` when it closes because the job ended.
    fn close(&mut self, job: &str, terminal: bool) {
        self.open.remove(job);
        if terminal && self.ended_set.insert(job.to_string()) {
            self.ended.push_back(job.to_string());
            if self.ended.len() > ENDED {
                if let Some(old) = self.ended.pop_front() {
                    self.ended_set.remove(&old);
                }
            }
        }
    }
}

/// The hub.
pub struct Hub {
    jobs: Mutex<Channels>,
    feed: broadcast::Sender<Arc<FeedItem>>,
    all: broadcast::Sender<JobNumbered>,
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            jobs: Mutex::default(),
            feed: broadcast::channel(FEED).0,
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
    fn lock(&self) -> std::sync::MutexGuard<'_, Channels> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn channel<'a>(jobs: &'a mut Channels, job: &str) -> &'a mut Channel {
        jobs.open.entry(job.to_string()).or_insert_with(|| Channel {
            tx: broadcast::channel(REPLAY).0,
            next: 1,
            recent: VecDeque::new(),
            tenant: None,
        })
    }

    /// Whether a listener follows every job (the feed or the every-job channel): then the
    /// channels of jobs no stream follows stay open, so that their events reach it.
    pub fn follows_all(&self) -> bool {
        self.feed.receiver_count() > 0 || self.all.receiver_count() > 0
    }

    /// Publishes `event` for `job`. After a terminal status the job's channel is dropped:
    /// open streams receive what was sent, and later streams start from a snapshot.
    pub fn publish(&self, job: &str, event: JobEvent) {
        let mut jobs = self.lock();
        let id = Self::channel(&mut jobs, job).next;
        self.deliver(&mut jobs, job, Arc::new(Numbered { id, event }));
    }

    /// Sends `numbered` to `job`'s open channel (its number is the next one) and to the
    /// every-job listeners; closes the channel after a terminal status.
    fn deliver(&self, jobs: &mut Channels, job: &str, numbered: Arc<Numbered>) {
        let terminal = numbered.event.is_terminal_status();
        let Some(channel) = jobs.open.get_mut(job) else {
            return;
        };
        if let JobEvent::Status(record) = &numbered.event {
            channel.tenant = Some(record.tenant.clone());
        }
        channel.next = numbered.id + 1;
        if channel.recent.len() == REPLAY {
            channel.recent.pop_front();
        }
        channel.recent.push_back(numbered.clone());
        let _ = channel.tx.send(numbered.clone());
        let fed = matches!(numbered.event, JobEvent::Status(_) | JobEvent::Progress(_));
        if let (true, Some(tenant)) = (fed && self.feed.receiver_count() > 0, &channel.tenant) {
            let _ = self.feed.send(Arc::new(FeedItem {
                tenant: tenant.clone(),
                job_id: job.to_string(),
                event: numbered.clone(),
            }));
        }
        if self.all.receiver_count() > 0 {
            let _ = self.all.send(JobNumbered {
                job_id: Arc::from(job),
                numbered,
            });
        }
        if terminal {
            jobs.close(job, true);
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
        self.lock().open.get(job).map_or(1, |c| c.next)
    }

    /// Every job's status changes and progress, as they happen.
    pub fn feed(&self) -> broadcast::Receiver<Arc<FeedItem>> {
        self.feed.subscribe()
    }

    /// Whether a channel is open for `job` (a stream follows it).
    pub fn is_watched(&self, job: &str) -> bool {
        self.lock().open.contains_key(job)
    }

    /// The jobs with an open channel.
    pub fn watched(&self) -> Vec<String> {
        self.lock().open.keys().cloned().collect()
    }

    /// Opens `job`'s channel at event `n`, of which the shared log just told, for the
    /// every-job listeners; nothing is done if it is open, or if the job ended lately.
    pub fn open_at(&self, job: &str, n: u64, tenant: &str) {
        let mut jobs = self.lock();
        if jobs.open.contains_key(job) || jobs.ended_set.contains(job) {
            return;
        }
        let channel = Self::channel(&mut jobs, job);
        channel.next = n;
        channel.tenant = Some(tenant.to_string());
    }

    /// Publishes event number `id` of `job`, numbered by the shared event log, if a channel
    /// is open for it and the number is new. A terminal status closes the channel as
    /// [`publish`](Self::publish) does; so does finding no listener left.
    pub fn publish_numbered(&self, job: &str, id: u64, event: JobEvent) {
        let mut jobs = self.lock();
        let Some(channel) = jobs.open.get(job) else {
            return;
        };
        if id < channel.next {
            return;
        }
        self.deliver(&mut jobs, job, Arc::new(Numbered { id, event }));
        if jobs.open.get(job).is_some_and(|c| c.tx.receiver_count() == 0) && !self.follows_all() {
            jobs.close(job, false);
        }
    }

    /// Opens `job`'s channel, if it is not open, with `backlog` (the newest events of the
    /// shared log, oldest first) as its replay buffer.
    pub fn seed(&self, job: &str, backlog: Vec<(u64, JobEvent)>) {
        let mut jobs = self.lock();
        if jobs.open.contains_key(job) {
            return;
        }
        let channel = Self::channel(&mut jobs, job);
        for (id, event) in backlog {
            if id < channel.next {
                continue;
            }
            if let JobEvent::Status(record) = &event {
                channel.tenant = Some(record.tenant.clone());
            }
            channel.next = id + 1;
            if channel.recent.len() == REPLAY {
                channel.recent.pop_front();
            }
            channel.recent.push_back(Arc::new(Numbered { id, event }));
        }
    }

    /// The newest preview in `job`'s replay buffer sent since its latest status event.
    pub fn recent_preview(&self, job: &str) -> Option<JobEvent> {
        let jobs = self.lock();
        jobs.open
            .get(job)?
            .recent
            .iter()
            .rev()
            .take_while(|e| !matches!(e.event, JobEvent::Status(_)))
            .find(|e| matches!(e.event, JobEvent::Preview { .. }))
            .map(|e| e.event.clone())
    }

    /// Closes `job`'s channel if no stream, and no every-job listener, follows it any more.
    pub fn close_if_unwatched(&self, job: &str) {
        let mut jobs = self.lock();
        if jobs.open.get(job).is_some_and(|c| c.tx.receiver_count() == 0) && !self.follows_all() {
            jobs.close(job, false);
        }
    }

    /// Forgets a job (after it is deleted). Open streams see their channel close.
    pub fn remove(&self, job: &str) {
        self.lock().close(job, false);
    }
}
