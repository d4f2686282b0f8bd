//! `GET /history`, `GET /history/{prompt_id}` and `POST /history`: the tenant's finished
//! jobs, with their outputs per node as ComfyUI lists them.

use std::sync::Arc;

use serde_json::{json, Map, Value as Json};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::prompt::{id_list, queue_item, with_workflows};
use super::{answer, json_body, json_reply, ok_empty, with_caller};
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::jobs::{AssetRecord, JobRecord, JobStatus, Jobs};

/// Items `GET /history` lists when `max_items` is not given, and the most it lists.
const DEFAULT_ITEMS: usize = 200;
const MAX_ITEMS: usize = 1_000;
/// Largest text output shown inline in `text`.
const MAX_INLINE_TEXT: i64 = 64 << 10;

/// The routes.
pub(super) fn routes(state: &Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let list = warp::path("history")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and_then(|s, c, q| async move { answer(list(s, c, q).await) });
    let one = warp::path!("history" / String)
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|id, s, c| async move { answer(one(s, c, id).await) });
    let edit = warp::path("history")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .and_then(|s, c, b| async move { answer(edit(s, c, b).await) });
    list.or(one).unify().or(edit).unify().boxed()
}

/// ComfyUI's `{filename, subfolder, type}` of an output: its subfolder is its job's id.
pub(super) fn file_ref(asset: &AssetRecord) -> Json {
    let kind = if asset.is_temporary() { "temp" } else { "output" };
    json!({
        "filename": asset.file_path,
        "subfolder": asset.job_id.clone().unwrap_or_default(),
        "type": kind,
    })
}

/// One node's UI output (`{images: [...]}`, `{audio: [...]}`, `{text: [...]}`, ...) from
/// the outputs it committed. Text outputs up to 64 KiB are shown inline, as ComfyUI's text
/// nodes show theirs.
pub(super) async fn node_output(state: &AppState, outputs: &[&AssetRecord]) -> Json {
    let mut ui = Map::new();
    let mut push = |key: &str, value: Json| {
        if let Json::Array(list) = ui.entry(key).or_insert_with(|| json!([])) {
            list.push(value);
        }
    };
    for asset in outputs {
        match asset.kind.as_deref() {
            Some("image") => push("images", file_ref(asset)),
            Some("video") => {
                push("images", file_ref(asset));
                push("animated", json!(true));
            }
            Some("audio") => push("audio", file_ref(asset)),
            Some("latent") => push("latents", file_ref(asset)),
            Some("text") if asset.size_bytes <= MAX_INLINE_TEXT => {
                let text = state.assets.read_all(asset).await.ok();
                match text.and_then(|t| String::from_utf8(t).ok()) {
                    Some(text) => push("text", json!(text)),
                    None => push("files", file_ref(asset)),
                }
            }
            _ => push("files", file_ref(asset)),
        }
    }
    Json::Object(ui)
}

/// A finished job as one `history` entry.
async fn entry(state: &AppState, job: &JobRecord) -> Result<Json, ApiError> {
    let jobs = state.jobs()?;
    let runtime = jobs.runtime();
    let catalog = runtime.catalog();
    let outputs = state
        .store
        .job_outputs(&job.id)
        .await
        .map_err(|e| ApiError::upstream("reading a job's outputs", e))?;
    let mut nodes: Vec<&str> = Vec::new();
    for o in &outputs {
        if let Some(node) = o.node_id.as_deref() {
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
    }
    let mut by_node = Map::new();
    let mut meta = Map::new();
    for node in nodes {
        let mine: Vec<&AssetRecord> = outputs.iter().filter(|o| o.node_id.as_deref() == Some(node)).collect();
        by_node.insert(node.to_string(), node_output(state, &mine).await);
        meta.insert(
            node.to_string(),
            json!({"node_id": node, "display_node": node, "parent_node": null, "real_node_id": node}),
        );
    }
    let started = job.started_at.unwrap_or(job.created_at).timestamp_millis();
    let ended = job.completed_at.unwrap_or(job.updated_at).timestamp_millis();
    let mut messages = vec![json!(["execution_start", {"prompt_id": job.id, "timestamp": started}])];
    let (status_str, completed) = match job.status {
        JobStatus::Succeeded => {
            messages.push(json!(["execution_success", {"prompt_id": job.id, "timestamp": ended}]));
            ("success", true)
        }
        JobStatus::Failed => {
            messages.push(json!(["execution_error", execution_error(job)]));
            ("error", false)
        }
        _ => {
            messages.push(json!(["execution_interrupted", execution_interrupted(job)]));
            ("error", false)
        }
    };
    Ok(json!({
        "prompt": queue_item(job, &catalog),
        "outputs": by_node,
        "status": {"status_str": status_str, "completed": completed, "messages": messages},
        "meta": meta,
    }))
}

/// ComfyUI's `execution_error` data for a failed job.
pub(super) fn execution_error(job: &JobRecord) -> Json {
    let error = job.error.as_ref();
    json!({
        "prompt_id": job.id,
        "timestamp": job.completed_at.unwrap_or(job.updated_at).timestamp_millis(),
        "node_id": error.and_then(|e| e.node_id.clone()),
        "node_type": error.and_then(|e| e.class_type.clone()),
        "executed": [],
        "exception_message": error.map(|e| e.message.clone()).unwrap_or_default(),
        "exception_type": error.map(|e| e.code.clone()).unwrap_or_default(),
        "traceback": error.and_then(|e| e.traceback.clone()).map(|t| vec![t]).unwrap_or_default(),
        "current_inputs": {},
        "current_outputs": {},
    })
}

/// ComfyUI's `execution_interrupted` data for a canceled or expired job.
pub(super) fn execution_interrupted(job: &JobRecord) -> Json {
    let progress = job.progress.as_ref();
    json!({
        "prompt_id": job.id,
        "timestamp": job.completed_at.unwrap_or(job.updated_at).timestamp_millis(),
        "node_id": progress.and_then(|p| p.current_node.clone()),
        "node_type": progress.and_then(|p| p.current_node_class.clone()),
        "executed": [],
    })
}

fn parse_count(value: &str, name: &str) -> Result<usize, ApiError> {
    value
        .parse::<usize>()
        .map_err(|_| ApiError::InvalidRequest(format!("{name} must be a non-negative integer")))
}

/// `tenant`'s finished jobs, newest first: `take` of them after skipping the `skip` newest.
async fn finished_jobs(jobs: &Jobs, tenant: &str, skip: usize, take: usize) -> Result<Vec<JobRecord>, ApiError> {
    let mut found = Vec::new();
    let mut skipped = 0usize;
    let mut before = None;
    loop {
        let page = jobs
            .list(tenant, 100, before, &Default::default(), None)
            .await
            .map_err(|e| ApiError::upstream("listing jobs", e))?;
        for job in page.jobs.into_iter().filter(|j| j.status.is_terminal()) {
            if skipped < skip {
                skipped += 1;
            } else if found.len() >= take {
                return Ok(found);
            } else {
                found.push(job);
            }
        }
        match page.next {
            Some(next) => before = Some(next),
            None => return Ok(found),
        }
    }
}

async fn list(state: Arc<AppState>, caller: Caller, query: String) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let mut max_items = DEFAULT_ITEMS;
    let mut offset = 0usize;
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "max_items" => max_items = parse_count(&value, "max_items")?.min(MAX_ITEMS),
            "offset" => offset = parse_count(&value, "offset")?,
            _ => {}
        }
    }
    let mut found = finished_jobs(jobs, &caller.tenant, offset, max_items).await?;
    with_workflows(&state, &mut found).await?;
    let mut history = Map::new();
    for job in found.iter().rev() {
        history.insert(job.id.clone(), entry(&state, job).await?);
    }
    Ok(json_reply(StatusCode::OK, &Json::Object(history)))
}

async fn one(state: Arc<AppState>, caller: Caller, id: String) -> Result<warp::reply::Response, ApiError> {
    let job = state
        .store
        .job(&caller.tenant, &id)
        .await
        .map_err(|e| ApiError::upstream("reading a job", e))?;
    let mut history = Map::new();
    if let Some(job) = job.filter(|j| j.status.is_terminal()) {
        let mut found = [job];
        with_workflows(&state, &mut found).await?;
        history.insert(found[0].id.clone(), entry(&state, &found[0]).await?);
    }
    Ok(json_reply(StatusCode::OK, &Json::Object(history)))
}

async fn edit(state: Arc<AppState>, caller: Caller, body: Json) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let mut targets = id_list(&body, "delete")?;
    if body.get("clear").and_then(Json::as_bool).unwrap_or(false) {
        let finished = finished_jobs(jobs, &caller.tenant, 0, usize::MAX).await?;
        targets.extend(finished.into_iter().map(|j| j.id));
    }
    for id in targets {
        jobs.remove_finished(&caller.tenant, &id)
            .await
            .map_err(|e| ApiError::upstream("deleting a job", e))?;
    }
    Ok(ok_empty())
}
