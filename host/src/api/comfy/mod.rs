//! ComfyUI's native server protocol beside the v2 API, on the same jobs: `/prompt`,
//! `/queue`, `/history`, `/view`, uploads, `/object_info`, the informational routes and the
//! `/ws` event socket, served at the root and under `/api` as ComfyUI serves them; the
//! routes ComfyUI's web editor needs (settings, user data, users, i18n, templates); and,
//! with `--comfyui-frontend DIR`, the editor's static files.
//!
//! Every route takes its caller from [`super::auth::caller`]: a tenant sees only its own
//! prompts, history, uploads, views and user data. File names given by callers are names of
//! the tenant's assets (uploads are assets, outputs are a job's assets), never paths of the
//! server.
//!
//! Public face: [`routes`] and [`frontend_routes`].

use std::sync::Arc;

use serde_json::Value as Json;
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::{Filter, Reply};

use super::auth::{self, Caller};
use super::AppState;
use error::ComfyError;

pub use frontend::frontend_routes;
pub use userdata::user_path_is_allowed;

mod error;
mod files;
mod frontend;
mod history;
mod info;
mod loaders;
mod names;
mod prompt;
mod userdata;
mod ws;

/// The protocol's routes, at the mount prefix's root and under its `/api`.
pub fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let protocol = protocol_routes(state.clone());
    let mut base = warp::any().boxed();
    for segment in state.config.mount_prefix.split('/').filter(|s| !s.is_empty()) {
        base = base.and(warp::path(segment.to_string())).boxed();
    }
    base.clone()
        .and(warp::path("api"))
        .and(protocol.clone())
        .or(base.and(protocol))
        .unify()
        .boxed()
}

/// The state and the authenticated caller.
fn with_caller(state: &Arc<AppState>) -> BoxedFilter<(Arc<AppState>, Caller)> {
    crate::api::with_state(state).and(auth::caller(state.clone())).boxed()
}

/// A JSON body of at most the configured size, parsed; ComfyUI's routes answer 400 to a
/// body that is not JSON.
fn json_body(state: &Arc<AppState>) -> BoxedFilter<(Json,)> {
    super::body::budgeted_body(state)
        .and_then(|body: super::body::BudgetedBody| async move {
            if body.bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(Json::Object(Default::default()));
            }
            // The value outlives the charge by the handler's run; the charge covered its
            // making, which is where the memory went.
            body.parse()
                .await
                .map(|(value, _charge)| value)
                .map_err(warp::reject::custom)
        })
        .boxed()
}

/// Every protocol route, relative to `/` or `/api`.
fn protocol_routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    prompt::routes(&state)
        .or(history::routes(&state))
        .unify()
        .or(files::routes(&state))
        .unify()
        .or(info::routes(&state))
        .unify()
        .or(userdata::routes(&state))
        .unify()
        .or(ws::route(&state))
        .unify()
        .boxed()
}

/// A JSON answer.
fn json_reply(status: StatusCode, body: &Json) -> warp::reply::Response {
    warp::reply::with_status(warp::reply::json(body), status).into_response()
}

/// ComfyUI's empty 200.
fn ok_empty() -> warp::reply::Response {
    warp::reply::with_status(warp::reply::reply(), StatusCode::OK).into_response()
}

/// Milliseconds since the epoch, ComfyUI's message timestamps.
fn timestamp_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Wraps a handler result for warp: an error answers with its own body.
fn answer<E: Into<ComfyError>>(
    result: Result<warp::reply::Response, E>,
) -> Result<warp::reply::Response, warp::Rejection> {
    Ok(result.unwrap_or_else(|e| e.into().into_response()))
}
