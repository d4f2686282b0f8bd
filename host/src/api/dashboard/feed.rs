//! `/ui/feed`: one stream for the jobs list. Every status change and progress report of the
//! viewer's tenant's jobs, as `job` and `progress` events; `resync` when the reader fell
//! behind and should reload the list.

use std::convert::Infallible;

use futures::StreamExt;
use serde_json::json;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use warp::sse::Event;
use warp::Reply;

use crate::api::events::{StreamSlot, KEEP_ALIVE};
use crate::api::session::SessionInfo;
use crate::api::AppState;
use crate::jobs::events::{FeedItem, JobEvent};

fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The SSE event of one feed item.
fn event(item: &FeedItem) -> Option<Event> {
    match &item.event.event {
        JobEvent::Status(job) => Event::default()
            .event("job")
            .json_data(json!({
                "id": job.id,
                "status": job.status.as_str(),
                "created_at": time(job.created_at),
                "started_at": job.started_at.map(time),
                "completed_at": job.completed_at.map(time),
                "metadata": job.labels,
                "progress": job.progress,
            }))
            .ok(),
        JobEvent::Progress(p) => Event::default()
            .event("progress")
            .json_data(json!({"id": item.job_id, "progress": p}))
            .ok(),
        _ => None,
    }
}

/// Opens the feed for `viewer`'s tenant (counted as one event stream).
pub(super) fn stream(state: &std::sync::Arc<AppState>, viewer: &SessionInfo) -> warp::reply::Response {
    let jobs = match state.jobs() {
        Ok(jobs) => jobs,
        Err(e) => return e.into_response(),
    };
    let slot = match StreamSlot::open(state, &viewer.tenant) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let tenant = viewer.tenant.clone();
    let events = BroadcastStream::new(jobs.hub().feed()).filter_map(move |item| {
        let _keep = &slot;
        let out = match item {
            Ok(item) if item.tenant == tenant => event(&item),
            Ok(_) => None,
            Err(BroadcastStreamRecvError::Lagged(_)) => Some(Event::default().event("resync").data("{}")),
        };
        futures::future::ready(out.map(Ok::<_, Infallible>))
    });
    warp::sse::reply(warp::sse::keep_alive().interval(KEEP_ALIVE).stream(events)).into_response()
}
