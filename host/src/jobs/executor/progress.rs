//! A running job's progress: the snapshot its watchers see (throttled), its nodes' times,
//! and the steps and previews each node call reports.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::graph;
use crate::jobs::events::{JobEvent, NodePhase};
use crate::jobs::Jobs;
use crate::runtime::ProgressSink;
use crate::store::{NodeTime, Progress};

/// Snapshots reach the event stream at most this often.
const PROGRESS_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);
/// Node step events (ComfyUI's per-step `progress`) are published at most this often,
/// except a node's last step.
const STEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// Tracks a job's progress and publishes snapshots, throttled.
pub(super) struct Tracker {
    job_id: String,
    jobs: Arc<Jobs>,
    progress: Arc<Mutex<Progress>>,
    last_sent: Mutex<Option<Instant>>,
    preview: Arc<Mutex<Option<JobEvent>>>,
    last_preview: Mutex<Option<Instant>>,
    last_step: Mutex<Option<Instant>>,
    /// When the job started running, and the nodes' times so far (those of nodes still
    /// running open).
    times: Mutex<NodeTimes>,
    /// The nodes running now (id and class), in the order they started: the last one is
    /// the job's current node.
    running: Mutex<Vec<(String, String)>>,
}

/// The times of a job's nodes, in the order they started.
struct NodeTimes {
    job_began: Instant,
    done: Vec<NodeTime>,
    /// When each node of `done` began, while it runs (same indices as `done`).
    open: Vec<Option<Instant>>,
}

impl NodeTimes {
    /// Opens the time of `node`, starting now; returns its slot for [`end`](Self::end).
    fn begin(&mut self, node: &graph::PlannedNode, cached: bool) -> usize {
        let now = Instant::now();
        self.done.push(NodeTime {
            node_id: node.id.clone(),
            class_type: node.class_type.clone(),
            started_ms: now.duration_since(self.job_began).as_millis() as u64,
            duration_ms: 0,
            cached,
        });
        self.open.push(Some(now));
        self.done.len() - 1
    }

    /// How long the node in `slot` has run, while its time is open.
    fn elapsed(&self, slot: usize) -> Option<std::time::Duration> {
        self.open.get(slot).copied().flatten().map(|began| began.elapsed())
    }

    /// Closes the time in `slot`, if it is open.
    fn end(&mut self, slot: usize) {
        if let (Some(began), Some(time)) = (self.open.get_mut(slot).and_then(Option::take), self.done.get_mut(slot)) {
            time.duration_ms = began.elapsed().as_millis() as u64;
        }
    }

    /// Closes every time still open.
    fn end_all(&mut self) {
        for slot in 0..self.done.len() {
            self.end(slot);
        }
    }
}

impl Tracker {
    /// The tracker of job `job_id`, which began running at `job_began`: it keeps the job's
    /// live `progress` and latest `preview` (shared with the job's watchers) and publishes
    /// through `jobs`.
    pub(super) fn new(
        job_id: String,
        jobs: Arc<Jobs>,
        progress: Arc<Mutex<Progress>>,
        preview: Arc<Mutex<Option<JobEvent>>>,
        job_began: Instant,
    ) -> Self {
        Self {
            job_id,
            jobs,
            progress,
            last_sent: Mutex::new(None),
            preview,
            last_preview: Mutex::new(None),
            last_step: Mutex::new(None),
            times: Mutex::new(NodeTimes {
                job_began,
                done: Vec::new(),
                open: Vec::new(),
            }),
            running: Mutex::new(Vec::new()),
        }
    }

    /// The job's progress now.
    pub(super) fn snapshot(&self) -> Progress {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// How long the node whose time is in `slot` has run, while it runs.
    pub(super) fn node_elapsed(&self, slot: usize) -> Option<std::time::Duration> {
        self.node_times().elapsed(slot)
    }

    /// The times of the job's nodes, in the order they started, those still open closed now.
    pub(super) fn take_node_times(&self) -> Vec<NodeTime> {
        let mut times = self.node_times();
        times.end_all();
        std::mem::take(&mut times.done)
    }

    fn node_times(&self) -> std::sync::MutexGuard<'_, NodeTimes> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<(String, String)>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `node` starts (or is taken from the cache): it becomes the current node. Returns
    /// the slot of its time.
    pub(super) fn node_started(&self, node: &graph::PlannedNode, cached: bool) -> usize {
        self.running().push((node.id.clone(), node.class_type.clone()));
        self.update(false, |p| {
            p.current_node = Some(node.id.clone());
            p.current_node_class = Some(node.class_type.clone());
            p.step = None;
            p.steps = None;
            p.message = None;
        });
        self.node_times().begin(node, cached)
    }

    /// `node`, whose time is in `slot`, is done: counted when `counted`, and the current
    /// node becomes the most recently started of those still running (it stays when none
    /// is).
    pub(super) fn node_ended(&self, node: &graph::PlannedNode, slot: usize, counted: bool) {
        let next = {
            let mut running = self.running();
            if let Some(at) = running.iter().rposition(|(id, _)| *id == node.id) {
                running.remove(at);
            }
            running.last().cloned()
        };
        self.node_times().end(slot);
        self.update(false, |p| {
            if counted {
                p.nodes_done += 1;
            }
            match next {
                Some((id, class)) if p.current_node.as_deref() != Some(id.as_str()) => {
                    p.current_node = Some(id);
                    p.current_node_class = Some(class);
                    p.step = None;
                    p.steps = None;
                    p.message = None;
                }
                Some(_) => {}
                None => {
                    p.step = None;
                    p.steps = None;
                }
            }
        });
    }

    /// Applies `change` to the job's progress, recomputes its value and publishes the
    /// snapshot when `force` or when the last one is old enough.
    pub(super) fn update(&self, force: bool, change: impl FnOnce(&mut Progress)) {
        let snapshot = {
            let mut p = self.progress.lock().unwrap_or_else(|e| e.into_inner());
            change(&mut p);
            let within = match (p.step, p.steps) {
                (Some(s), Some(n)) if n > 0 => s.min(n) as f64 / n as f64,
                _ => 0.0,
            };
            p.value = if p.nodes_total == 0 {
                1.0
            } else {
                ((p.nodes_done as f64 + within) / p.nodes_total as f64).min(1.0)
            };
            p.clone()
        };
        let mut last = self.last_sent.lock().unwrap_or_else(|e| e.into_inner());
        if force || last.is_none_or(|t| t.elapsed() >= PROGRESS_INTERVAL) {
            *last = Some(Instant::now());
            drop(last);
            self.jobs.publish(&self.job_id, JobEvent::Progress(snapshot));
        }
    }
}

/// Where one node call's progress goes: the job's tracker, named for the node. The job's
/// snapshot takes the steps of its current node only; every node's steps are published as
/// its own `Node` step events.
pub(super) struct NodeProgress {
    tracker: Arc<Tracker>,
    node_id: String,
    class_type: String,
}

impl NodeProgress {
    /// Where the calls of `node` report, through `tracker`.
    pub(super) fn new(tracker: &Arc<Tracker>, node: &graph::PlannedNode) -> Self {
        Self {
            tracker: tracker.clone(),
            node_id: node.id.clone(),
            class_type: node.class_type.clone(),
        }
    }
}

impl ProgressSink for NodeProgress {
    fn report(&self, step: u32, steps: u32, message: Option<String>) {
        let tracker = &self.tracker;
        tracker.update(false, |p| {
            if p.current_node.as_deref() == Some(self.node_id.as_str()) {
                p.step = Some(step);
                p.steps = Some(steps);
                if message.is_some() {
                    p.message = message;
                }
            }
        });
        let mut last = tracker.last_step.lock().unwrap_or_else(|e| e.into_inner());
        if step < steps && last.is_some_and(|t| t.elapsed() < STEP_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        let phase = NodePhase::Step { step, steps };
        tracker.jobs.publish(
            &tracker.job_id,
            JobEvent::Node {
                node_id: self.node_id.clone(),
                class_type: self.class_type.clone(),
                phase,
            },
        );
    }

    fn preview(&self, content_type: &'static str, data: Vec<u8>) {
        let tracker = &self.tracker;
        let mut last = tracker.last_preview.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < PROGRESS_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        let event = JobEvent::Preview {
            node_id: self.node_id.clone(),
            content_type: content_type.to_string(),
            data,
        };
        *tracker.preview.lock().unwrap_or_else(|e| e.into_inner()) = Some(event.clone());
        tracker.jobs.publish(&tracker.job_id, event);
    }
}
