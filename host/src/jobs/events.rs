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
    /// A log line.
    Log {
        /// `info`, `warning` or `error`.
        level: &'static str,
        /// The text.
        message: String,
    },
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

/// The hub.
pub struct Hub {
    jobs: Mutex<HashMap<String, Channel>>,
    feed: broadcast::Sender<Arc<FeedItem>>,
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            jobs: Mutex::default(),
            feed: broadcast::channel(FEED).0,
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
            tenant: None,
        })
    }

    /// Publishes `event` for `job`. After a terminal status the job's channel is dropped:
    /// open streams receive what was sent, and later streams start from a snapshot.
    pub fn publish(&self, job: &str, event: JobEvent) {
        let terminal = matches!(&event, JobEvent::Status(j) if j.status.is_terminal());
        let mut jobs = self.lock();
        let channel = Self::channel(&mut jobs, job);
        if let JobEvent::Status(record) = &event {
            channel.tenant = Some(record.tenant.clone());
        }
        let fed = matches!(event, JobEvent::Status(_) | JobEvent::Progress(_));
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
        if let (true, Some(tenant)) = (fed && self.feed.receiver_count() > 0, &channel.tenant) {
            let _ = self.feed.send(Arc::new(FeedItem {
                tenant: tenant.clone(),
                job_id: job.to_string(),
                event: numbered,
            }));
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

    /// The id the next event of `job` will get.
    pub fn next_id(&self, job: &str) -> u64 {
        self.lock().get(job).map_or(1, |c| c.next)
    }

    /// Every job's status changes and progress, as they happen.
    pub fn feed(&self) -> broadcast::Receiver<Arc<FeedItem>> {
        self.feed.subscribe()
    }

    /// Forgets a job (after it is deleted). Open streams see their channel close.
    pub fn remove(&self, job: &str) {
        self.lock().remove(job);
    }
}
