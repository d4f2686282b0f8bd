//! The job event stream (SSE): a snapshot on connect (status, latest progress), then live
//! `status`, `progress`, `output`, `preview` and `log` events with ids, resumable with
//! `Last-Event-ID`, a keep-alive comment every 15 s, and the end after the terminal status.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::stream::{self, Stream, StreamExt};
use serde_json::json;
use warp::sse::Event;
use warp::Reply;

use super::auth::Caller;
use super::error::ApiError;
use super::links::Links;
use super::{render, AppState};
use crate::jobs::events::{JobEvent, Numbered};
use crate::jobs::JobView;
use crate::store::{JobRecord, JobStatus};

/// Keep-alive comment interval.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One open stream, counted globally and against its tenant's share; released on drop.
pub(crate) struct StreamSlot {
    state: Arc<AppState>,
    tenant: String,
}

impl StreamSlot {
    /// Takes a slot for `tenant`, or `too_many_streams` when the server's streams or the
    /// tenant's share of them are all open.
    pub(crate) fn open(state: &Arc<AppState>, tenant: &str) -> Result<StreamSlot, ApiError> {
        let mut by_tenant = state.tenant_streams.lock().unwrap_or_else(|e| e.into_inner());
        let mine = by_tenant.get(tenant).copied().unwrap_or(0);
        if mine >= state.config.tenant_max_streams || state.streams.load(Ordering::SeqCst) >= state.config.max_streams {
            return Err(ApiError::TooManyStreams { retry_after: 5 });
        }
        by_tenant.insert(tenant.to_string(), mine + 1);
        state.streams.fetch_add(1, Ordering::SeqCst);
        Ok(StreamSlot {
            state: state.clone(),
            tenant: tenant.to_string(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut by_tenant = self.state.tenant_streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by_tenant.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                by_tenant.remove(&self.tenant);
            }
        }
        self.state.streams.fetch_sub(1, Ordering::SeqCst);
    }
}

fn status_event(links: &Links, view: &JobView) -> Event {
    let mut body = render::job(links, view, false);
    body["queue_position"] = json!(view.queue_position);
    Event::default().event("status").json_data(body).unwrap_or_default()
}

/// The last status a stream told its client, to drop status events it already covers: the
/// shared event log is written after the job's row, so a snapshot read from the row can be
/// newer than events still on their way from the log.
struct ToldStatus {
    status: JobStatus,
    updated_at: chrono::DateTime<chrono::Utc>,
}

impl ToldStatus {
    /// The status `record` tells.
    fn of(record: &JobRecord) -> Self {
        Self {
            status: record.status,
            updated_at: record.updated_at,
        }
    }

    /// Whether `next` adds nothing: the same status again, or an earlier stage of the
    /// lifecycle that is no newer than what was told (a job sent back to the queue by a
    /// rescue is newer, and is told).
    fn covers(&self, next: &ToldStatus) -> bool {
        fn stage(status: JobStatus) -> u8 {
            match status {
                JobStatus::Queued => 0,
                JobStatus::Running => 1,
                JobStatus::Canceling => 2,
                _ => 3,
            }
        }
        next.status == self.status || (stage(next.status) < stage(self.status) && next.updated_at <= self.updated_at)
    }
}

/// Renders one hub event; `None` for events that need the store (status, handled by caller).
fn render_event(links: &Links, numbered: &Numbered) -> Option<Event> {
    let event = match &numbered.event {
        JobEvent::Status(_) | JobEvent::Node { .. } => return None,
        JobEvent::Progress(p) => Event::default().event("progress").json_data(p).ok()?,
        JobEvent::Output(asset) => Event::default().event("output").json_data(render::output(links, asset)).ok()?,
        JobEvent::Preview { node_id, content_type, data } => Event::default()
            .event("preview")
            .json_data(json!({"node_id": node_id, "content_type": content_type, "data_base64": base64::engine::general_purpose::STANDARD.encode(data)}))
            .ok()?,
        JobEvent::Log { level, message } => Event::default().event("log").json_data(json!({"level": level, "message": message})).ok()?,
    };
    Some(event.id(numbered.id.to_string()))
}

/// Opens the stream for `caller`'s job `id`.
pub async fn stream(
    state: Arc<AppState>,
    caller: Caller,
    id: String,
    last_event_id: Option<String>,
) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?.clone();
    let links = state.links.clone();
    let read = |jobs: Arc<crate::jobs::Jobs>, tenant: String, id: String| async move {
        jobs.get(&tenant, &id)
            .await
            .map_err(|e| ApiError::upstream("reading a job", e))?
            .ok_or(ApiError::NotFound("job".into()))
    };
    read(jobs.clone(), caller.tenant.clone(), id.clone()).await?;
    let slot = StreamSlot::open(&state, &caller.tenant)?;
    let after = last_event_id.and_then(|s| s.trim().parse::<u64>().ok());
    // Everything up to `mark` happened before the snapshot below is read, so it is covered.
    let (subscription, mark) = jobs
        .subscribe(&id, after)
        .await
        .map_err(|e| ApiError::upstream("reading a job's events", e))?;
    let view = read(jobs.clone(), caller.tenant.clone(), id.clone()).await?;

    let mut first: Vec<Event> = Vec::new();
    let resumed = after.is_some() && subscription.complete;
    if resumed {
        for numbered in &subscription.missed {
            if let JobEvent::Status(_) = numbered.event {
                continue;
            }
            if let Some(e) = render_event(&links, numbered) {
                first.push(e);
            }
        }
    }
    first.push(status_event(&links, &view).id(mark.to_string()));
    if !resumed {
        if let Some(progress) = &view.job.progress {
            first.push(
                Event::default()
                    .event("progress")
                    .json_data(progress)
                    .unwrap_or_default()
                    .id(mark.to_string()),
            );
        }
        if let Some(event) = jobs.latest_preview(&id) {
            first.extend(render_event(&links, &Numbered { id: mark, event }));
        }
    }
    if view.job.status.is_terminal() {
        let events = stream::iter(first.into_iter().map(Ok::<_, Infallible>));
        return Ok(sse(events
            .chain(stream::once(async move {
                drop(slot);
                Ok(Event::default().comment("end"))
            }))
            .boxed()));
    }

    let told = ToldStatus::of(&view.job);
    let live = tokio_stream::wrappers::BroadcastStream::new(subscription.live);
    let tenant = caller.tenant.clone();
    let live = live
        .filter_map(move |item| {
            let links = links.clone();
            let jobs = jobs.clone();
            let tenant = tenant.clone();
            async move {
                let numbered = match item {
                    Ok(n) if n.id > mark => n,
                    Ok(_) => return None,
                    // A slow client missed events: the next snapshot re-syncs it.
                    Err(_) => return None,
                };
                match &numbered.event {
                    JobEvent::Status(record) => {
                        if record.tenant != tenant {
                            return None;
                        }
                        let view = jobs.view((**record).clone()).await.ok()?;
                        let event = status_event(&links, &view).id(numbered.id.to_string());
                        Some((event, Some(ToldStatus::of(record))))
                    }
                    _ => render_event(&links, &numbered).map(|e| (e, None)),
                }
            }
        })
        .scan((false, told), |(ended, told), (event, status)| {
            if *ended {
                return futures::future::ready(None);
            }
            let Some(status) = status else {
                return futures::future::ready(Some(Some(event)));
            };
            if told.covers(&status) {
                return futures::future::ready(Some(None));
            }
            *ended = status.status.is_terminal();
            *told = status;
            futures::future::ready(Some(Some(event)))
        })
        .filter_map(futures::future::ready);
    let events = stream::iter(first).chain(live).map(move |e| {
        let _keep = &slot;
        Ok::<_, Infallible>(e)
    });
    Ok(sse(events.boxed()))
}

fn sse(events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> warp::reply::Response {
    warp::sse::reply(warp::sse::keep_alive().interval(KEEP_ALIVE).stream(events)).into_response()
}
