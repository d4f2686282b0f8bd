//! Job routes: submit, read, workflow, cancel, list, and the event stream.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Value as Json};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Reply};

use super::auth::{self, Caller};
use super::error::ApiError;
use super::{render, respond, AppState, Surface};
use crate::graph::GraphError;
use crate::jobs::SubmitError;

/// Largest page of `GET /jobs`.
const MAX_PAGE: usize = 100;

/// The job routes, relative to `/api/v2`.
pub fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let with = crate::api::with_state(&state);
    let caller = auth::caller(state.clone());
    let submit = warp::path("jobs")
        .and(warp::path::end())
        .and(warp::post())
        .and(with.clone())
        .and(caller.clone())
        .and(warp::header::optional::<String>("idempotency-key"))
        .and(super::body::budgeted_body(&state))
        .and_then(|s, c, k, b| async move { respond(submit(s, c, k, b).await) });
    let list = warp::path("jobs")
        .and(warp::path::end())
        .and(warp::get())
        .and(with.clone())
        .and(caller.clone())
        .and(warp::query::raw().or(warp::any().map(String::new)).unify())
        .and_then(|s, c, q| async move { respond(list(s, c, q).await) });
    let get = warp::path!("jobs" / String)
        .and(warp::get())
        .and(with.clone())
        .and(caller.clone())
        .and_then(|id, s, c| async move { respond(get(s, c, id).await) });
    let workflow = warp::path!("jobs" / String / "workflow")
        .and(warp::get())
        .and(with.clone())
        .and(caller.clone())
        .and_then(|id, s, c| async move { respond(workflow(s, c, id).await) });
    let cancel = warp::path!("jobs" / String / "cancel")
        .and(warp::post())
        .and(with.clone())
        .and(caller.clone())
        .and(super::body::ignored_body())
        .and_then(|id, s, c| async move { respond(cancel(s, c, id).await) });
    let events = warp::path!("jobs" / String / "events")
        .and(warp::get())
        .and(with.clone())
        .and(caller)
        .and(warp::header::optional::<String>("last-event-id"))
        .and_then(|id, s, c, last| async move { respond(super::events::stream(s, c, id, last).await) });
    submit
        .or(list)
        .unify()
        .or(get)
        .unify()
        .or(workflow)
        .unify()
        .or(cancel)
        .unify()
        .or(events)
        .unify()
        .boxed()
}

fn reply(status: StatusCode, body: &Json) -> warp::reply::Response {
    warp::reply::with_status(warp::reply::json(body), status).into_response()
}

/// Whether `GET /jobs/{id}` shows logs: only the serverless surface has them, and the
/// public demo withholds them.
fn shows_logs(state: &AppState) -> bool {
    state.config.surface == Surface::Serverless && !state.config.public_demo
}

async fn submit(
    state: Arc<AppState>,
    caller: Caller,
    key: Option<String>,
    body: super::body::BudgetedBody,
) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    if state.stopped.load(Ordering::SeqCst) {
        return Err(ApiError::DeploymentStopped);
    }
    // A key presented before is rejected whatever this body holds, even one that would fail
    // validation. (Claiming happens atomically with the insert, in the store.)
    if let Some(key) = key.as_deref().filter(|k| !k.is_empty()) {
        let claimed = jobs
            .idempotency_claim(&caller.tenant, key)
            .await
            .map_err(|e| ApiError::upstream("checking an idempotency key", e))?;
        if let Some(job_id) = claimed {
            return Err(ApiError::IdempotencyKeyReuse { job_id });
        }
    }
    let (body, _parse_charge) = body.parse().await?;
    let Json::Object(mut body) = body else {
        return Err(ApiError::InvalidRequest(
            "the body must be a JSON object with a workflow".into(),
        ));
    };
    for reserved in ["webhook_url", "inputs"] {
        if body.contains_key(reserved) {
            return Err(ApiError::ReservedField(format!(
                "`{reserved}` is reserved for a later version of the API and is rejected today"
            )));
        }
    }
    if let Some(extra) = body.remove("extra_data") {
        // Forwarded per prompt, never stored: nothing here persists it.
        let Json::Object(extra) = extra else {
            return Err(ApiError::InvalidExtraData("extra_data must be an object".into()));
        };
        for (name, value) in &extra {
            if !matches!(name.as_str(), "api_key_platform_org" | "api_key_comfy_org") {
                return Err(ApiError::InvalidExtraData(format!(
                    "extra_data does not accept `{name}`; it accepts only api_key_platform_org"
                )));
            }
            if !value.is_string() {
                return Err(ApiError::InvalidExtraData(format!(
                    "extra_data.{name} must be a string"
                )));
            }
        }
    }
    let labels: BTreeMap<String, String> = match body.remove("metadata") {
        None | Some(Json::Null) => BTreeMap::new(),
        Some(value) => serde_json::from_value(value)
            .map_err(|_| metadata_invalid("metadata must be an object of string values"))?,
    };
    check_labels(&labels)?;
    let Some(workflow) = body.remove("workflow") else {
        return Err(ApiError::MissingWorkflow(
            "the body needs a `workflow` object in ComfyUI's API format".into(),
        ));
    };
    match jobs.submit(&caller.tenant, workflow, labels, key).await {
        Ok(job) => {
            // A new job has no outputs yet: no store read on the submit path.
            let queue_position = Some(
                jobs.queue_position(&job.tenant, &job.id)
                    .await
                    .map_err(|e| ApiError::upstream("reading the queue", e))?,
            );
            let view = crate::jobs::JobView {
                job,
                outputs: Vec::new(),
                queue_position,
            };
            Ok(reply(StatusCode::CREATED, &render::job(&state.links, &view, false)))
        }
        Err(e) => Err(submit_error(e)),
    }
}

/// Most labels on one job, and the longest key and value.
const MAX_LABELS: usize = 16;
const MAX_LABEL_KEY: usize = 64;
const MAX_LABEL_VALUE: usize = 256;

fn metadata_invalid(message: impl Into<String>) -> ApiError {
    ApiError::MetadataInvalid(message.into())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if labels.len() > MAX_LABELS {
        return Err(metadata_invalid(format!(
            "metadata has {} pairs; at most {MAX_LABELS} are allowed",
            labels.len()
        )));
    }
    for (key, value) in labels {
        if key.is_empty() || key.chars().count() > MAX_LABEL_KEY {
            return Err(metadata_invalid(format!(
                "metadata key {key:?} must be 1 to {MAX_LABEL_KEY} characters"
            )));
        }
        if value.chars().count() > MAX_LABEL_VALUE {
            return Err(metadata_invalid(format!(
                "the value of metadata key {key:?} is longer than {MAX_LABEL_VALUE} characters"
            )));
        }
    }
    Ok(())
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Graph(GraphError::UiFormat) => ApiError::WorkflowFormatUi(GraphError::UiFormat.message()),
        SubmitError::Graph(GraphError::Invalid {
            message,
            node_errors,
            errors,
            error_count,
        }) => {
            let listed = node_errors.values().map(Vec::len).sum::<usize>() + errors.len();
            ApiError::InvalidWorkflow {
                message,
                details: json!({
                    "node_errors": node_errors,
                    "errors": errors,
                    "error_count": error_count,
                    "truncated": error_count > listed,
                }),
            }
        }
        SubmitError::MissingAsset(missing) => {
            let mut by_node: BTreeMap<String, Vec<Json>> = BTreeMap::new();
            for (node, asset) in &missing {
                by_node.entry(node.clone()).or_default().push(json!({
                    "field": "asset", "reason": "missing_asset",
                    "message": format!("asset {asset} does not exist or is not yours"), "asset_id": asset,
                }));
            }
            ApiError::MissingAsset {
                message: format!("{} referenced asset(s) do not exist or are not yours", missing.len()),
                details: json!({"node_errors": by_node, "asset_ids": missing.iter().map(|(_, a)| a).collect::<Vec<_>>()}),
            }
        }
        SubmitError::IdempotencyReuse { job_id } => ApiError::IdempotencyKeyReuse { job_id },
        SubmitError::QueueFull { retry_after } => ApiError::QueueFull { retry_after },
        SubmitError::InsufficientCredits { balance, cost } => ApiError::InsufficientCredits { balance, cost },
        SubmitError::BadRequest(m) => ApiError::InvalidRequest(m),
        SubmitError::Store(e) => ApiError::upstream("recording a job", e),
    }
}

async fn get(state: Arc<AppState>, caller: Caller, id: String) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let view = jobs
        .get(&caller.tenant, &id)
        .await
        .map_err(|e| ApiError::upstream("reading a job", e))?
        .ok_or(ApiError::NotFound("job".into()))?;
    Ok(reply(
        StatusCode::OK,
        &render::job(&state.links, &view, shows_logs(&state)),
    ))
}

async fn workflow(state: Arc<AppState>, caller: Caller, id: String) -> Result<warp::reply::Response, ApiError> {
    let job = state
        .store
        .job(&caller.tenant, &id)
        .await
        .map_err(|e| ApiError::upstream("reading a job", e))?;
    job.ok_or(ApiError::NotFound("job".into()))?;
    let workflow = state
        .store
        .job_workflow(&id)
        .await
        .map_err(|e| ApiError::upstream("reading a job", e))?
        .ok_or(ApiError::NotFound("job".into()))?;
    Ok(reply(StatusCode::OK, &json!({"workflow": workflow, "format": "api"})))
}

async fn cancel(state: Arc<AppState>, caller: Caller, id: String) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let view = jobs
        .cancel(&caller.tenant, &id)
        .await
        .map_err(|e| ApiError::upstream("canceling a job", e))?;
    let view = view.ok_or(ApiError::NotFound("job".into()))?;
    Ok(reply(StatusCode::OK, &render::job(&state.links, &view, false)))
}

/// Cursors are opaque to clients: `c` plus the position of the last job of a page.
fn parse_cursor(cursor: &str) -> Option<i64> {
    cursor.strip_prefix('c')?.parse().ok().filter(|n: &i64| *n > 0)
}

async fn list(state: Arc<AppState>, caller: Caller, query: String) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let mut limit = 20usize;
    let mut before = None;
    let mut labels = BTreeMap::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| ApiError::InvalidLimit(format!("limit must be an integer from 1 to {MAX_PAGE}")))?;
            }
            "cursor" if !value.is_empty() => {
                let seq = parse_cursor(&value)
                    .ok_or_else(|| ApiError::InvalidCursor("the cursor is not one this server issued".into()))?;
                let known = jobs
                    .is_position(&caller.tenant, seq)
                    .await
                    .map_err(|e| ApiError::upstream("checking a cursor", e))?;
                if !known {
                    return Err(ApiError::InvalidCursor("the cursor is unknown or has expired".into()));
                }
                before = Some(seq);
            }
            key if key.starts_with("metadata[") && key.ends_with(']') => {
                labels.insert(key["metadata[".len()..key.len() - 1].to_string(), value.into_owned());
            }
            _ => {}
        }
    }
    let page = jobs
        .list(&caller.tenant, limit, before, &labels, None)
        .await
        .map_err(|e| ApiError::upstream("listing jobs", e))?;
    let links = state.links.clone();
    let views = jobs
        .views(page.jobs)
        .await
        .map_err(|e| ApiError::upstream("listing jobs", e))?;
    let items: Vec<Json> = views.iter().map(|view| render::list_item(&links, view)).collect();
    Ok(reply(
        StatusCode::OK,
        &json!({"jobs": items, "next_cursor": page.next.map(|n| format!("c{n}"))}),
    ))
}
