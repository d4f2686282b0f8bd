//! JSON shapes of the interface: Job, Output, Asset, list items.

use serde_json::{json, Value as Json};

use super::links::Links;
use crate::jobs::{AssetRecord, JobRecord, JobView};

fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The `Output` object of a committed output asset. A temporary one (a preview) says so, and
/// its link lasts no longer than it does.
pub fn output(links: &Links, asset: &AssetRecord) -> Json {
    let (url, link_expires) = links.content(&asset.id);
    let expires = asset.expires_at.map_or(link_expires, |gone| gone.min(link_expires));
    json!({
        "node_id": asset.node_id,
        "name": asset.file_path,
        "type": asset.kind.as_deref().unwrap_or("file"),
        "content_type": asset.content_type,
        "size_bytes": asset.size_bytes,
        "id": asset.id,
        "hash": format!("blake3:{}", asset.blob),
        "url": url,
        "url_expires_at": time(expires),
        "job_id": asset.job_id,
        "temporary": asset.is_temporary(),
    })
}

/// The asset record of `GET /api/v2/assets/{id}`.
pub fn asset(links: &Links, asset: &AssetRecord, created_new: bool) -> Json {
    let (url, url_expires) = links.content(&asset.id);
    json!({
        "id": asset.id,
        "hash": format!("blake3:{}", asset.blob),
        "size_bytes": asset.size_bytes,
        "content_type": asset.content_type,
        "file_path": asset.file_path,
        "created_new": created_new,
        "created_at": time(asset.created_at),
        "url": url,
        "url_expires_at": time(url_expires),
        "expires_at": asset.expires_at.map(time),
        "job_id": asset.job_id,
        "tags": asset.tags,
    })
}

fn metrics(job: &JobRecord) -> Json {
    let ms = |a: chrono::DateTime<chrono::Utc>, b: chrono::DateTime<chrono::Utc>| (b - a).num_milliseconds().max(0);
    json!({
        "queue_ms": job.started_at.map(|s| ms(job.created_at, s)),
        "execution_ms": match (job.started_at, job.completed_at) {
            (Some(s), Some(c)) => Some(ms(s, c)),
            _ => None,
        },
    })
}

/// The `Job` object. `logs` only where the caller may see them (see `GET /jobs/{id}`).
pub fn job(links: &Links, view: &JobView, with_logs: bool) -> Json {
    let job = &view.job;
    let mut body = json!({
        "id": job.id,
        "status": job.status.as_str(),
        "created_at": time(job.created_at),
        "started_at": job.started_at.map(time),
        "completed_at": job.completed_at.map(time),
        "expires_at": time(job.expires_at),
        "queue_position": view.queue_position,
        "progress": job.progress,
        "outputs": view.outputs.iter().map(|o| output(links, o)).collect::<Vec<_>>(),
        "error": job.error,
        "urls": links.job(&job.id),
        "metrics": metrics(job),
    });
    if with_logs {
        if let Some(logs) = &job.logs {
            body["logs"] =
                json!({"text": logs.text, "truncated": logs.truncated, "captured_at": time(logs.captured_at)});
        }
    }
    body
}

/// A list item: the job plus the list fields clients read.
pub fn list_item(links: &Links, view: &JobView) -> Json {
    let mut body = job(links, view, false);
    body["create_time"] = json!(time(view.job.created_at));
    body["update_time"] = json!(time(view.job.updated_at));
    body["metadata"] = json!(view.job.labels);
    body
}
