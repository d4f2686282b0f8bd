//! `WS /ws?clientId=...`: ComfyUI's event socket. On connect a `status` with the `sid`;
//! then, for every job of the caller's tenant (prompts and v2 jobs alike),
//! `execution_start`, `execution_cached`, `executing`, `progress`, `executed`,
//! `execution_success` / `execution_error` / `execution_interrupted`, a `status` whenever
//! the queue changes, and preview images as binary frames in ComfyUI's framing
//! (big-endian u32 event 1, big-endian u32 image format 1 JPEG / 2 PNG, the image bytes).

use std::collections::HashMap;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value as Json};
use tokio::sync::broadcast::error::RecvError;
use warp::filters::ws::{Message, WebSocket, Ws};
use warp::filters::BoxedFilter;
use warp::{Filter, Reply};

use super::history::{execution_error, execution_interrupted, node_output};
use super::prompt::queue_info;
use super::{answer, timestamp_ms, with_caller};
use crate::api::auth::Caller;
use crate::api::events::StreamSlot;
use crate::api::AppState;
use crate::jobs::events::{JobEvent, JobNumbered, NodePhase};
use crate::jobs::{AssetRecord, JobStatus};
use crate::store::JobRecord;

/// ComfyUI's binary event type of a preview image.
const PREVIEW_IMAGE: u32 = 1;
/// Jobs a socket remembers the owner of; beyond this it forgets them all and asks again.
const MAX_KNOWN_JOBS: usize = 4_096;
/// Largest text message accepted from a client.
const MAX_CLIENT_MESSAGE: usize = 64 << 10;

/// The route.
pub(super) fn route(state: &Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    warp::path("ws")
        .and(warp::path::end())
        .and(warp::ws())
        .and(with_caller(state))
        .and(warp::query::<HashMap<String, String>>())
        .and_then(
            |ws: Ws, state: Arc<AppState>, caller: Caller, query: HashMap<String, String>| async move {
                let slot = match StreamSlot::open(&state, &caller.tenant) {
                    Ok(slot) => slot,
                    Err(e) => return answer(Err(e)),
                };
                let sid = query
                    .get("clientId")
                    .filter(|c| !c.is_empty() && c.len() <= 128)
                    .cloned()
                    .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
                let ws = ws
                    .max_message_size(MAX_CLIENT_MESSAGE)
                    .max_frame_size(MAX_CLIENT_MESSAGE);
                Ok(ws
                    .on_upgrade(move |socket| async move {
                        Session::new(state, caller, sid).run(socket).await;
                        drop(slot);
                    })
                    .into_response())
            },
        )
        .boxed()
}

/// What one socket knows about the jobs it follows.
struct Session {
    state: Arc<AppState>,
    caller: Caller,
    sid: String,
    /// Who hears each job seen.
    owned: HashMap<Arc<str>, Audience>,
    /// Outputs committed by each running job, by node, until the node finishes.
    outputs: HashMap<Arc<str>, HashMap<String, Vec<AssetRecord>>>,
}

/// Who hears a job's messages: as ComfyUI does, a prompt queued with a `client_id` is heard
/// by that client's sockets only, one without (a v2 job) by every socket; both only within
/// the job's tenant. The queue's `status` goes to every socket of the tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Audience {
    /// Another tenant's job.
    Nobody,
    /// Every socket of the tenant.
    Everyone,
    /// The sockets of this client id.
    Client(Arc<str>),
}

impl Audience {
    fn of(job: &JobRecord, tenant: &str) -> Self {
        if job.tenant != tenant {
            return Audience::Nobody;
        }
        match job.labels.get(super::prompt::CLIENT_ID_LABEL) {
            Some(client) => Audience::Client(Arc::from(client.as_str())),
            None => Audience::Everyone,
        }
    }
}

fn text(kind: &str, data: Json) -> Message {
    Message::text(json!({"type": kind, "data": data}).to_string())
}

impl Session {
    fn new(state: Arc<AppState>, caller: Caller, sid: String) -> Self {
        Self {
            state,
            caller,
            sid,
            owned: HashMap::new(),
            outputs: HashMap::new(),
        }
    }

    async fn status(&self) -> Option<Message> {
        let info = queue_info(&self.state, &self.caller.tenant).await.ok()?;
        Some(text("status", json!({"status": info, "sid": self.sid})))
    }

    async fn run(mut self, socket: WebSocket) {
        let Ok(jobs) = self.state.jobs().cloned() else {
            return;
        };
        let mut events = jobs.hub().subscribe_all();
        let (mut tx, mut rx) = socket.split();
        let Some(hello) = self.status().await else {
            return;
        };
        if tx.send(hello).await.is_err() {
            return;
        }
        let mut first = true;
        loop {
            tokio::select! {
                incoming = rx.next() => match incoming {
                    Some(Ok(message)) => {
                        if message.is_close() {
                            break;
                        }
                        if first && message.is_text() {
                            let data: Option<Json> = message.to_str().ok().and_then(|t| serde_json::from_str(t).ok());
                            if data.as_ref().and_then(|d| d.get("type")).and_then(Json::as_str) == Some("feature_flags") {
                                let flags = json!({"supports_preview_metadata": false, "max_upload_size": self.state.config.max_upload_bytes});
                                if tx.send(text("feature_flags", flags)).await.is_err() {
                                    break;
                                }
                            }
                        }
                        first = false;
                    }
                    _ => break,
                },
                event = events.recv() => {
                    let messages = match event {
                        Ok(event) => self.translate(event).await,
                        // Fell behind: what it missed is summed up by the queue's state.
                        Err(RecvError::Lagged(_)) => self.status().await.into_iter().collect(),
                        Err(RecvError::Closed) => break,
                    };
                    let mut sent = true;
                    for message in messages {
                        if tx.send(message).await.is_err() {
                            sent = false;
                            break;
                        }
                    }
                    if !sent {
                        break;
                    }
                }
            }
        }
    }

    /// Who hears job `id`, asking the store the first time.
    async fn audience(&mut self, id: &Arc<str>, event: &JobEvent) -> Audience {
        if let JobEvent::Status(job) = event {
            let audience = Audience::of(job, &self.caller.tenant);
            self.remember(id, audience.clone());
            return audience;
        }
        if let Some(audience) = self.owned.get(id) {
            return audience.clone();
        }
        let audience = match self.state.store.job(&self.caller.tenant, id).await {
            Ok(Some(job)) => Audience::of(&job, &self.caller.tenant),
            _ => Audience::Nobody,
        };
        self.remember(id, audience.clone());
        audience
    }

    fn remember(&mut self, id: &Arc<str>, audience: Audience) {
        if self.owned.len() >= MAX_KNOWN_JOBS {
            self.owned.clear();
        }
        self.owned.insert(id.clone(), audience);
    }

    /// The messages one hub event becomes for this socket.
    async fn translate(&mut self, event: JobNumbered) -> Vec<Message> {
        let JobNumbered { job_id, numbered } = event;
        match self.audience(&job_id, &numbered.event).await {
            Audience::Nobody => return Vec::new(),
            Audience::Client(client) if *client != *self.sid => {
                // Another client's prompt: only the queue's state changes for this one.
                return match &numbered.event {
                    JobEvent::Status(job) if job.status != JobStatus::Canceling => {
                        if job.status.is_terminal() {
                            self.owned.remove(&job_id);
                        }
                        self.status().await.into_iter().collect()
                    }
                    _ => Vec::new(),
                };
            }
            Audience::Everyone | Audience::Client(_) => {}
        }
        let prompt_id = job_id.to_string();
        match &numbered.event {
            JobEvent::Status(job) => {
                let mut out = Vec::new();
                match job.status {
                    JobStatus::Running => {
                        out.push(text(
                            "execution_start",
                            json!({"prompt_id": prompt_id, "timestamp": timestamp_ms()}),
                        ));
                    }
                    JobStatus::Succeeded => {
                        out.push(text(
                            "execution_success",
                            json!({"prompt_id": prompt_id, "timestamp": timestamp_ms()}),
                        ));
                        out.push(text(
                            "executing",
                            json!({"node": null, "display_node": null, "prompt_id": prompt_id}),
                        ));
                    }
                    JobStatus::Failed => {
                        out.push(text("execution_error", execution_error(job)));
                        out.push(text(
                            "executing",
                            json!({"node": null, "display_node": null, "prompt_id": prompt_id}),
                        ));
                    }
                    JobStatus::Canceled | JobStatus::Expired => {
                        out.push(text("execution_interrupted", execution_interrupted(job)));
                        out.push(text(
                            "executing",
                            json!({"node": null, "display_node": null, "prompt_id": prompt_id}),
                        ));
                    }
                    JobStatus::Queued | JobStatus::Canceling => {}
                }
                if job.status.is_terminal() {
                    self.outputs.remove(&job_id);
                    self.owned.remove(&job_id);
                }
                if job.status != JobStatus::Canceling {
                    out.extend(self.status().await);
                }
                out
            }
            JobEvent::Node { node_id, phase, .. } => match phase {
                NodePhase::Started => vec![text(
                    "executing",
                    json!({"node": node_id, "display_node": node_id, "prompt_id": prompt_id}),
                )],
                NodePhase::Cached => vec![text(
                    "execution_cached",
                    json!({"nodes": [node_id], "prompt_id": prompt_id, "timestamp": timestamp_ms()}),
                )],
                NodePhase::Step { step, steps } => vec![text(
                    "progress",
                    json!({"value": step, "max": steps, "prompt_id": prompt_id, "node": node_id}),
                )],
                NodePhase::Finished => {
                    let committed = self
                        .outputs
                        .get_mut(&job_id)
                        .and_then(|by_node| by_node.remove(node_id))
                        .unwrap_or_default();
                    if committed.is_empty() {
                        return Vec::new();
                    }
                    let refs: Vec<&AssetRecord> = committed.iter().collect();
                    let output = node_output(&self.state, &refs).await;
                    vec![text(
                        "executed",
                        json!({"node": node_id, "display_node": node_id, "output": output, "prompt_id": prompt_id}),
                    )]
                }
            },
            // Steps come as node events, one per step (snapshots are throttled harder).
            JobEvent::Progress(_) => Vec::new(),
            JobEvent::Output(asset) => {
                if let Some(node) = &asset.node_id {
                    let by_node = self.outputs.entry(job_id.clone()).or_default();
                    let list = by_node.entry(node.clone()).or_default();
                    // Bounded like the job's outputs; the socket keeps at most that many.
                    list.push((**asset).clone());
                }
                Vec::new()
            }
            JobEvent::Preview { content_type, data, .. } => {
                let format: u32 = if content_type == "image/png" { 2 } else { 1 };
                let mut frame = Vec::with_capacity(8 + data.len());
                frame.extend_from_slice(&PREVIEW_IMAGE.to_be_bytes());
                frame.extend_from_slice(&format.to_be_bytes());
                frame.extend_from_slice(data);
                vec![Message::binary(frame)]
            }
            JobEvent::Log { .. } => Vec::new(),
        }
    }
}
