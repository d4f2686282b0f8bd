//! `POST /prompt` (a prompt is a durable weft job), `GET /prompt`, `GET/POST /queue` and
//! `POST /interrupt`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::error::ComfyError;
use super::names::{self, FileRef, FolderType};
use super::{answer, json_body, json_reply, ok_empty, with_caller};
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::graph::{FieldError, GraphError};
use crate::jobs::{JobRecord, JobStatus, SubmitError};
use crate::runtime::Catalog;

/// Most names listed in one `queue` array.
const MAX_LISTED: usize = 1_000;

/// The routes.
pub(super) fn routes(state: &Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let submit = warp::path("prompt")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .and_then(|s, c, b| async move { answer(submit(s, c, b).await) });
    let info = warp::path("prompt")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s: Arc<AppState>, c: Caller| async move {
            answer(queue_info(&s, &c.tenant).await.map(|i| json_reply(StatusCode::OK, &i)))
        });
    let queue = warp::path("queue")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s, c| async move { answer(queue(s, c).await) });
    let edit_queue = warp::path("queue")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .and_then(|s, c, b| async move { answer(edit_queue(s, c, b).await) });
    let interrupt = warp::path("interrupt")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .and_then(|s, c, b| async move { answer(interrupt(s, c, b).await) });
    submit
        .or(info)
        .unify()
        .or(queue)
        .unify()
        .or(edit_queue)
        .unify()
        .or(interrupt)
        .unify()
        .boxed()
}

/// One field error in ComfyUI's shape.
fn comfy_error(error: &FieldError, node: Option<&Json>) -> Json {
    let received = node
        .and_then(|n| n.get("inputs"))
        .and_then(|i| i.get(&error.field))
        .cloned();
    let mut extra = Map::new();
    if !error.field.is_empty() {
        extra.insert("input_name".into(), json!(error.field));
    }
    if let Some(received) = received {
        extra.insert("received_value".into(), received);
    }
    let details = if error.field.is_empty() {
        error.message.clone()
    } else {
        format!("{}: {}", error.field, error.message)
    };
    json!({"type": error.reason, "message": error.message, "details": details, "extra_info": extra})
}

/// The node ids of a workflow's output nodes.
fn output_nodes(workflow: &Json, catalog: &Catalog) -> Vec<String> {
    workflow
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, node)| {
            node.get("class_type")
                .and_then(Json::as_str)
                .and_then(|c| catalog.get(c))
                .is_some_and(|d| d.output_node)
        })
        .map(|(id, _)| id.clone())
        .collect()
}

/// ComfyUI's `node_errors` for a rejected workflow: errors by node with the node's class
/// and the output nodes that depend on it.
fn node_errors(workflow: &Json, catalog: &Catalog, errors: &BTreeMap<String, Vec<FieldError>>) -> (Json, Vec<String>) {
    let outputs = output_nodes(workflow, catalog);
    let mut lines = Vec::new();
    let mut by_node = Map::new();
    for (id, list) in errors {
        let node = workflow.get(id);
        let class = node.and_then(|n| n.get("class_type")).cloned().unwrap_or(Json::Null);
        let rendered: Vec<Json> = list.iter().map(|e| comfy_error(e, node)).collect();
        for e in &rendered {
            lines.push(format!(
                "{}: {}",
                e["message"].as_str().unwrap_or(""),
                e["details"].as_str().unwrap_or("")
            ));
        }
        by_node.insert(
            id.clone(),
            json!({"errors": rendered, "dependent_outputs": outputs, "class_type": class}),
        );
    }
    (Json::Object(by_node), lines)
}

/// The answer to a workflow weft's validator refused.
fn invalid(workflow: &Json, catalog: &Catalog, error: GraphError) -> ComfyError {
    match error {
        GraphError::UiFormat => ComfyError::prompt("invalid_prompt", &error.message(), ""),
        GraphError::Invalid {
            message,
            node_errors: by_node,
            errors,
            ..
        } => {
            if by_node.is_empty() {
                let first = errors.first();
                let kind = first.map_or("invalid_prompt", |e| e.reason.as_str());
                let text = first.map_or(message.as_str(), |e| e.message.as_str());
                let details: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
                return ComfyError::prompt(kind, text, &details.join("\n"));
            }
            let (rendered, lines) = node_errors(workflow, catalog, &by_node);
            ComfyError::prompt_with_nodes(
                "prompt_outputs_failed_validation",
                "Prompt outputs failed validation",
                &lines.join("\n"),
                rendered,
            )
        }
    }
}

/// Replaces the file names ComfyUI gives asset inputs (`LoadImage`'s `image`) with
/// references to the tenant's assets; the names that match none are errors by node.
async fn resolve_files(
    state: &AppState,
    tenant: &str,
    workflow: &mut Json,
    catalog: &Catalog,
) -> Result<BTreeMap<String, Vec<FieldError>>, ApiError> {
    let mut errors: BTreeMap<String, Vec<FieldError>> = BTreeMap::new();
    let Some(nodes) = workflow.as_object_mut() else {
        return Ok(errors);
    };
    for (id, node) in nodes.iter_mut() {
        let Some(def) = node
            .get("class_type")
            .and_then(Json::as_str)
            .and_then(|c| catalog.get(c))
        else {
            continue;
        };
        let Some(inputs) = node.get_mut("inputs").and_then(Json::as_object_mut) else {
            continue;
        };
        for spec in def.inputs.iter().filter(|i| i.type_name == weft_types::ASSET) {
            let Some(Json::String(name)) = inputs.get(&spec.name) else {
                continue;
            };
            let fail = |reason: &str, message: String| FieldError {
                field: spec.name.clone(),
                reason: reason.to_string(),
                message,
            };
            let found = match names::resolve(name, "", FolderType::Input) {
                Err(why) => Err(fail("value_not_in_list", format!("{name:?} is refused: {why}"))),
                Ok(file) => match find_file(state, tenant, &file).await? {
                    Some(asset) => Ok(asset),
                    None => Err(fail(
                        "value_not_in_list",
                        format!(
                            "Value not in list: {}: '{name}' is not one of your uploaded files",
                            spec.name
                        ),
                    )),
                },
            };
            match found {
                Ok(asset) => {
                    inputs.insert(
                        spec.name.clone(),
                        json!({"__type": weft_types::ASSET, "info": {"id": asset.id}}),
                    );
                }
                Err(e) => errors.entry(id.clone()).or_default().push(e),
            }
        }
    }
    Ok(errors)
}

/// The tenant's asset a file reference names.
pub(super) async fn find_file(
    state: &AppState,
    tenant: &str,
    file: &FileRef,
) -> Result<Option<crate::store::AssetRecord>, ApiError> {
    match file {
        FileRef::Upload(key) => state
            .store
            .upload_named(tenant, key)
            .await
            .map_err(|e| ApiError::upstream("finding an upload", e)),
        FileRef::Output { job_id, name } => {
            let job = state
                .store
                .job(tenant, job_id)
                .await
                .map_err(|e| ApiError::upstream("reading a job", e))?;
            if job.is_none() {
                return Ok(None);
            }
            let outputs = state
                .store
                .job_outputs(job_id)
                .await
                .map_err(|e| ApiError::upstream("reading a job's outputs", e))?;
            Ok(outputs.into_iter().find(|a| a.file_path == *name))
        }
    }
}

/// The job metadata key that records the `client_id` a prompt was queued with.
pub(super) const CLIENT_ID_LABEL: &str = "comfy_client_id";

/// Longest `client_id` taken (ComfyUI's own are UUIDs).
const MAX_CLIENT_ID: usize = 256;

async fn submit(state: Arc<AppState>, caller: Caller, body: Json) -> Result<warp::reply::Response, ComfyError> {
    let jobs = state.jobs()?;
    if state.stopped.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::DeploymentStopped.into());
    }
    let Json::Object(mut body) = body else {
        return Err(ComfyError::prompt(
            "invalid_prompt",
            "The body must be a JSON object",
            "",
        ));
    };
    let Some(mut workflow) = body.remove("prompt") else {
        return Err(ComfyError::prompt(
            "no_prompt",
            "No prompt provided",
            "No prompt provided",
        ));
    };
    if !workflow.is_object() {
        return Err(ComfyError::prompt(
            "invalid_prompt",
            "The prompt must be an object of nodes",
            "",
        ));
    }
    let id = match body.get("prompt_id") {
        None | Some(Json::Null) => None,
        Some(Json::String(id)) => Some(id.clone()),
        Some(_) => return Err(ComfyError::prompt("invalid_prompt", "prompt_id must be a string", "")),
    };
    // Who queued it: its messages on `/ws` go to that client's sockets only.
    let mut labels = BTreeMap::new();
    match body.get("client_id") {
        None | Some(Json::Null) => {}
        Some(Json::String(client)) if !client.is_empty() && client.chars().count() <= MAX_CLIENT_ID => {
            labels.insert(CLIENT_ID_LABEL.to_string(), client.clone());
        }
        Some(_) => {
            return Err(ComfyError::prompt(
                "invalid_prompt",
                &format!("client_id must be a string of 1 to {MAX_CLIENT_ID} characters"),
                "",
            ))
        }
    }
    let runtime = jobs.runtime();
    let catalog = runtime.catalog_for(&workflow);
    let file_errors = resolve_files(&state, &caller.tenant, &mut workflow, &catalog).await?;
    if !file_errors.is_empty() {
        let (rendered, lines) = node_errors(&workflow, &catalog, &file_errors);
        return Err(ComfyError::prompt_with_nodes(
            "prompt_outputs_failed_validation",
            "Prompt outputs failed validation",
            &lines.join("\n"),
            rendered,
        ));
    }
    match jobs.submit_as(&caller.tenant, id, workflow.clone(), labels, None).await {
        Ok(job) => Ok(json_reply(
            StatusCode::OK,
            &json!({"prompt_id": job.id, "number": number(&job), "node_errors": {}}),
        )),
        Err(SubmitError::Graph(e)) => Err(invalid(&workflow, &catalog, e)),
        Err(SubmitError::BadRequest(message)) => Err(ComfyError::prompt("invalid_prompt", &message, "")),
        Err(SubmitError::QueueFull { retry_after }) => Err(ApiError::QueueFull { retry_after }.into()),
        Err(SubmitError::InsufficientCredits { balance, cost }) => {
            Err(ApiError::InsufficientCredits { balance, cost }.into())
        }
        Err(SubmitError::MissingAsset(missing)) => Err(ComfyError::prompt(
            "invalid_prompt",
            &format!("{} referenced asset(s) do not exist or are not yours", missing.len()),
            "",
        )),
        Err(SubmitError::IdempotencyReuse { job_id }) => Err(ApiError::IdempotencyKeyReuse { job_id }.into()),
        Err(SubmitError::Store(e)) => Err(ApiError::upstream("recording a job", e).into()),
    }
}

/// ComfyUI's queue `number` of a job: its place in the order of submission.
pub(super) fn number(job: &JobRecord) -> i64 {
    job.seq
}

/// The tenant's jobs that have not finished, oldest first, at most `limit` (without their
/// workflows: [`with_workflows`] adds them).
pub(super) async fn active_jobs(state: &AppState, tenant: &str, limit: usize) -> Result<Vec<JobRecord>, ApiError> {
    state
        .store
        .tenant_jobs_with_status(tenant, &JobStatus::UNFINISHED, limit)
        .await
        .map_err(|e| ApiError::upstream("reading the queue", e))
}

/// Reads the workflows of `jobs` (records come from the store without them), in one read.
pub(super) async fn with_workflows(state: &AppState, jobs: &mut [JobRecord]) -> Result<(), ApiError> {
    let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
    let mut workflows = state
        .store
        .workflows_of_jobs(&ids)
        .await
        .map_err(|e| ApiError::upstream("reading workflows", e))?;
    for job in jobs {
        job.workflow = workflows.remove(&job.id).unwrap_or_default();
    }
    Ok(())
}

/// `{exec_info: {queue_remaining}}` for the tenant.
pub(super) async fn queue_info(state: &AppState, tenant: &str) -> Result<Json, ApiError> {
    let remaining = state
        .store
        .count_tenant_jobs(tenant, &JobStatus::UNFINISHED)
        .await
        .map_err(|e| ApiError::upstream("reading the queue", e))?;
    Ok(json!({"exec_info": {"queue_remaining": remaining}}))
}

/// A queue or history item: `[number, prompt_id, prompt, extra_data, outputs_to_execute]`;
/// `extra_data` names the client that queued it, if one did.
pub(super) fn queue_item(job: &JobRecord, catalog: &Catalog) -> Json {
    let extra_data = match job.labels.get(CLIENT_ID_LABEL) {
        Some(client) => json!({"client_id": client}),
        None => json!({}),
    };
    json!([
        number(job),
        job.id,
        job.workflow,
        extra_data,
        output_nodes(&job.workflow, catalog)
    ])
}

async fn queue(state: Arc<AppState>, caller: Caller) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let runtime = jobs.runtime();
    let catalog = runtime.catalog();
    let mut active = active_jobs(&state, &caller.tenant, MAX_LISTED).await?;
    with_workflows(&state, &mut active).await?;
    let (running, pending): (Vec<_>, Vec<_>) = active.iter().partition(|j| j.status != JobStatus::Queued);
    let render = |list: Vec<&JobRecord>| list.into_iter().map(|j| queue_item(j, &catalog)).collect::<Vec<_>>();
    Ok(json_reply(
        StatusCode::OK,
        &json!({"queue_running": render(running), "queue_pending": render(pending)}),
    ))
}

/// The ids in a `delete` list, each a string.
pub(super) fn id_list(body: &Json, field: &str) -> Result<Vec<String>, ApiError> {
    match body.get(field) {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(String::from)
                    .ok_or_else(|| ApiError::InvalidRequest(format!("{field} must list ids as strings")))
            })
            .collect(),
        Some(_) => Err(ApiError::InvalidRequest(format!("{field} must be a list of ids"))),
    }
}

async fn edit_queue(state: Arc<AppState>, caller: Caller, body: Json) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let delete = id_list(&body, "delete")?;
    let clear = body.get("clear").and_then(Json::as_bool).unwrap_or(false);
    let mut targets = Vec::new();
    if clear {
        targets.extend(
            active_jobs(&state, &caller.tenant, usize::MAX)
                .await?
                .into_iter()
                .filter(|j| j.status == JobStatus::Queued)
                .map(|j| j.id),
        );
    }
    for id in delete {
        let job = state
            .store
            .job(&caller.tenant, &id)
            .await
            .map_err(|e| ApiError::upstream("reading a job", e))?;
        // Like ComfyUI, delete takes pending prompts out of the queue; a running one is
        // interrupted through /interrupt.
        if job.is_some_and(|j| j.status == JobStatus::Queued) {
            targets.push(id);
        }
    }
    for id in targets {
        jobs.cancel(&caller.tenant, &id)
            .await
            .map_err(|e| ApiError::upstream("canceling a job", e))?;
    }
    Ok(ok_empty())
}

async fn interrupt(state: Arc<AppState>, caller: Caller, body: Json) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let only = body.get("prompt_id").and_then(Json::as_str).map(String::from);
    let running = state
        .store
        .tenant_jobs_with_status(&caller.tenant, &[JobStatus::Running], usize::MAX)
        .await
        .map_err(|e| ApiError::upstream("reading the queue", e))?;
    for job in running {
        if only.as_ref().is_none_or(|id| *id == job.id) {
            jobs.cancel(&caller.tenant, &job.id)
                .await
                .map_err(|e| ApiError::upstream("interrupting a job", e))?;
        }
    }
    Ok(ok_empty())
}
