//! Operator routes: the node catalogue, our OpenAPI document, health, Prometheus metrics,
//! and draining a deployment. When authentication is on, metrics (which count every
//! tenant's jobs) are the operator's: they need `--admin-token`, like drain.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::json;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Reply};

use super::error::ApiError;
use super::{respond, AppState};

/// Routes under `/api/v2`: `nodes`, `openapi.json`, and the operator's `admin/drain`.
pub fn api_routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let with = crate::api::with_state(&state);
    let nodes = warp::path("nodes")
        .and(warp::path::end())
        .and(warp::get())
        .and(with.clone())
        .and(super::auth::caller(state.clone()))
        .and_then(|s: Arc<AppState>, _c| async move {
            respond(
                s.jobs()
                    .map(|jobs| warp::reply::json(&jobs.runtime().catalog().object_info()).into_response()),
            )
        });
    let openapi = warp::path("openapi.json")
        .and(warp::path::end())
        .and(warp::get())
        .and(with.clone())
        .map(|s: Arc<AppState>| warp::reply::json(&super::openapi::document(&s.config.mount_prefix)).into_response());
    let drain = warp::path!("admin" / "drain")
        .and(warp::post())
        .and(with.clone())
        .and(warp::header::optional::<String>("authorization"))
        .and_then(|s: Arc<AppState>, auth: Option<String>| async move { respond(drain(&s, auth.as_deref()).await) });
    nodes.or(openapi).unify().or(drain).unify().boxed()
}

/// Routes at the root: `/healthz` and `/metrics`.
pub fn root_routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let s1 = state.clone();
    let health = warp::path("healthz")
        .and(warp::path::end())
        .and(warp::get())
        .map(move || {
            let ready = s1.jobs.get().is_some();
            let stopped = s1.stopped.load(Ordering::SeqCst);
            let store = s1.store.health();
            let workers = s1.jobs.get().map(|jobs| jobs.worker_health());
            let draining = workers.as_ref().is_some_and(|w| w.draining);
            let failing = !store.is_ok()
                || workers
                    .as_ref()
                    .is_some_and(|w| !w.draining && w.running < w.configured);
            let status = if ready && !failing && !draining {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let word = if !ready {
                "starting"
            } else if failing {
                "failing"
            } else if draining {
                "draining"
            } else if stopped {
                "stopped"
            } else {
                "ok"
            };
            let mut body = json!({"status": word, "ready": ready, "store": store});
            if let Some(jobs) = s1.jobs.get() {
                let runtime = jobs.runtime();
                let refused: Vec<_> = runtime
                    .refused()
                    .iter()
                    .map(|p| json!({"name": p.name, "reason": p.reason}))
                    .collect();
                body["plugins"] = json!({"loaded": runtime.plugins().count(), "refused": refused});
                body["workers"] = json!(workers);
            }
            warp::reply::with_status(warp::reply::json(&body), status).into_response()
        });
    let metrics = warp::path("metrics")
        .and(warp::path::end())
        .and(warp::get())
        .and(crate::api::with_state(&state))
        .and(warp::header::optional::<String>("authorization"))
        .and_then(|s: Arc<AppState>, auth: Option<String>| async move { respond(metrics(&s, auth.as_deref()).await) });
    health.or(metrics).unify().boxed()
}

/// Checks that the caller holds the operator token.
async fn operator(state: &AppState, authorization: Option<&str>) -> Result<(), ApiError> {
    let Some(expected) = &state.config.admin_token else {
        return Err(ApiError::Forbidden(
            "operator routes are disabled; start weft with --admin-token".into(),
        ));
    };
    let given = super::auth::bearer(authorization).unwrap_or("");
    if !super::auth::secrets_match(given, expected) {
        // A caller the job API knows (a tenant key, the static token) is authenticated but
        // not allowed here: 403. Anyone else: 401.
        let known = !given.is_empty()
            && state.config.auth != super::AuthMode::None
            && super::auth::authenticate(state, authorization).await.is_ok();
        return Err(if known {
            ApiError::Forbidden("this route needs the operator token".into())
        } else {
            ApiError::Unauthorized
        });
    }
    Ok(())
}

async fn drain(state: &AppState, authorization: Option<&str>) -> Result<warp::reply::Response, ApiError> {
    operator(state, authorization).await?;
    state.stopped.store(true, Ordering::SeqCst);
    tracing::warn!("deployment drained by the operator: new jobs are refused");
    Ok(warp::reply::json(&json!({"status": "stopped"})).into_response())
}

async fn metrics(state: &AppState, authorization: Option<&str>) -> Result<warp::reply::Response, ApiError> {
    if state.config.auth != super::AuthMode::None {
        operator(state, authorization).await?;
    }
    let out = metrics_text(state).await?;
    Ok(warp::reply::with_header(out, "content-type", "text/plain; version=0.0.4").into_response())
}

/// The Prometheus text of `/metrics` (the operator's view of every tenant's work).
pub async fn metrics_text(state: &AppState) -> Result<String, ApiError> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# HELP weft_sse_streams Open event streams.\n# TYPE weft_sse_streams gauge"
    );
    let _ = writeln!(out, "weft_sse_streams {}", state.streams.load(Ordering::SeqCst));
    if let Some(jobs) = state.jobs.get() {
        let _ = writeln!(
            out,
            "# HELP weft_queue_depth Jobs waiting to run.\n# TYPE weft_queue_depth gauge"
        );
        let depth = jobs
            .queue_len()
            .await
            .map_err(|e| ApiError::upstream("counting queued jobs", e))?;
        let _ = writeln!(out, "weft_queue_depth {depth}");
        let _ = writeln!(
            out,
            "# HELP weft_queue_capacity Most jobs that may wait.\n# TYPE weft_queue_capacity gauge"
        );
        let _ = writeln!(out, "weft_queue_capacity {}", jobs.queue().capacity());
        let counts = jobs
            .count_by_status()
            .await
            .map_err(|e| ApiError::upstream("counting jobs", e))?;
        let _ = writeln!(
            out,
            "# HELP weft_jobs Jobs in the store, by status.\n# TYPE weft_jobs gauge"
        );
        for status in crate::jobs::JobStatus::ALL {
            let n = counts.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
            let _ = writeln!(out, "weft_jobs{{status=\"{}\"}} {n}", status.as_str());
        }
        let cache = jobs.node_cache();
        let _ = writeln!(
            out,
            "# HELP weft_node_cache_entries Node results held by the cache.\n# TYPE weft_node_cache_entries gauge"
        );
        let _ = writeln!(out, "weft_node_cache_entries {}", cache.len());
        let _ = writeln!(
            out,
            "# HELP weft_node_cache_bytes Bytes of node results held by the cache.\n# TYPE weft_node_cache_bytes gauge"
        );
        let _ = writeln!(out, "weft_node_cache_bytes {}", cache.bytes());
        jobs.metrics.render(&mut out);
    }
    Ok(out)
}
