//! What ComfyUI's web editor keeps on the server, per tenant: user data files (saved
//! workflows, templates, ...) under `/userdata` and `/v2/userdata`, settings under
//! `/settings` (ComfyUI keeps them in the user data file `comfy.settings.json`), the
//! `/users` answer of a single-user server, and the custom-node `/i18n` and
//! `/workflow_templates` maps (weft's plugins add none). Paths are names in the tenant's
//! store, bounded in number and size, never paths of the server; [`crate::jobs::userdata`] reads and
//! writes them.

use std::sync::Arc;

use percent_encoding::percent_decode_str;
use serde_json::{json, Map, Value as Json};
use warp::filters::BoxedFilter;
use warp::http::{HeaderValue, StatusCode};
use warp::{Filter, Reply};

use super::error::ComfyError;
use super::names;
use super::{answer, json_body, json_reply, with_caller};
use crate::api::assets::content_safety_headers;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::jobs::userdata::{SettingsChange, LIMITS, MAX_FILE_BYTES};
use crate::store::{UserFile, UserWrite};

type Query = std::collections::HashMap<String, String>;

/// The routes.
pub(super) fn routes(state: &Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let query = || warp::query::<Query>();
    let raw_body = || warp::body::content_length_limit(MAX_FILE_BYTES).and(warp::body::bytes());
    let users = warp::path("users")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .map(|_s: Arc<AppState>, _c: Caller| {
            json_reply(StatusCode::OK, &json!({"storage": "server", "migrated": true}))
        });
    let add_user = warp::path("users")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .map(|_s: Arc<AppState>, _c: Caller| ComfyError::UsersAreTenants.into_response());
    let list = warp::path("userdata")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and(query())
        .and_then(|s, c, q| async move { answer(list(s, c, q).await) });
    let list_v2 = warp::path!("v2" / "userdata")
        .and(warp::get())
        .and(with_caller(state))
        .and(query())
        .and_then(|s, c, q| async move { answer(list_v2(s, c, q).await) });
    let read = warp::path!("userdata" / String)
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|f, s, c| async move { answer(read(s, c, f).await) });
    let write = warp::path!("userdata" / String)
        .and(warp::post())
        .and(with_caller(state))
        .and(query())
        .and(raw_body())
        .and_then(|f, s, c, q, b| async move { answer(write(s, c, f, q, b).await) });
    let delete = warp::path!("userdata" / String)
        .and(warp::delete())
        .and(with_caller(state))
        .and_then(|f, s, c| async move { answer(delete(s, c, f).await) });
    let rename = warp::path!("userdata" / String / "move" / String)
        .and(warp::post())
        .and(with_caller(state))
        .and(query())
        .and_then(|f, d, s, c, q| async move { answer(rename(s, c, f, d, q).await) });
    let settings = warp::path("settings")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s: Arc<AppState>, c: Caller| async move {
            answer(
                read_settings(&s, &c)
                    .await
                    .map(|v| json_reply(StatusCode::OK, &Json::Object(v))),
            )
        });
    let setting = warp::path!("settings" / String)
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|id: String, s: Arc<AppState>, c: Caller| async move {
            answer(
                read_settings(&s, &c)
                    .await
                    .map(|v| json_reply(StatusCode::OK, v.get(&decode(&id)).unwrap_or(&Json::Null))),
            )
        });
    let save_settings = warp::path("settings")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .and_then(|s, c, b| async move { answer(write_settings(s, c, None, b).await) });
    let save_setting = warp::path!("settings" / String)
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .and_then(|id, s, c, b| async move { answer(write_settings(s, c, Some(id), b).await) });
    let empty_map = |name: &'static str| {
        warp::path(name)
            .and(warp::path::end())
            .and(warp::get())
            .and(with_caller(state))
            .map(|_s: Arc<AppState>, _c: Caller| json_reply(StatusCode::OK, &json!({})))
    };
    users
        .or(add_user)
        .unify()
        .or(list)
        .unify()
        .or(list_v2)
        .unify()
        .or(read)
        .unify()
        .or(write)
        .unify()
        .or(delete)
        .unify()
        .or(rename)
        .unify()
        .or(settings)
        .unify()
        .or(setting)
        .unify()
        .or(save_settings)
        .unify()
        .or(save_setting)
        .unify()
        .or(empty_map("i18n"))
        .unify()
        .or(empty_map("workflow_templates"))
        .unify()
        .boxed()
}

fn decode(segment: &str) -> String {
    percent_decode_str(segment).decode_utf8_lossy().into_owned()
}

/// A user data path from a URL segment: decoded, `/`-separated, without empty parts and
/// refused when it could read as a path outside the tenant's names.
fn user_path(segment: &str) -> Result<String, ApiError> {
    let path = decode(segment);
    allowed_path(&path).map_err(ApiError::InvalidPath)?;
    Ok(path)
}

fn allowed_path(path: &str) -> Result<(), String> {
    names::check(path, "the path", true)?;
    if path.split('/').any(str::is_empty) || path.contains('\\') {
        return Err("the path has an empty part or a backslash".into());
    }
    Ok(())
}

/// Whether `path` is a user-data path the rules accept (what every stored one must be).
pub fn user_path_is_allowed(path: &str) -> bool {
    allowed_path(path).is_ok()
}

fn flag(query: &Query, name: &str, default: bool) -> bool {
    query.get(name).map_or(default, |v| v.eq_ignore_ascii_case("true"))
}

fn seconds(t: chrono::DateTime<chrono::Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

/// ComfyUI's file information, with the path relative to `base` (ending in `/` or empty).
fn info(file: &UserFile, base: &str) -> Json {
    json!({
        "path": file.path.strip_prefix(base).unwrap_or(&file.path),
        "size": file.size,
        "modified": seconds(file.modified),
        "created": seconds(file.created),
    })
}

async fn list(state: Arc<AppState>, caller: Caller, query: Query) -> Result<warp::reply::Response, ApiError> {
    let dir = query
        .get("dir")
        .filter(|d| !d.is_empty())
        .ok_or_else(|| ApiError::InvalidRequest("dir is required".into()))?;
    let dir = user_path(dir.trim_end_matches('/'))?;
    let base = format!("{dir}/");
    let files = state.user_data().files(&caller.tenant, &base).await?;
    let (recurse, full) = (flag(&query, "recurse", false), flag(&query, "full_info", false));
    let split = flag(&query, "split", false);
    let listed: Vec<Json> = files
        .iter()
        .filter(|f| recurse || !f.path[base.len()..].contains('/'))
        .map(|f| {
            let relative = &f.path[base.len()..];
            if full {
                info(f, &base)
            } else if split {
                let mut parts = vec![json!(relative)];
                parts.extend(relative.split('/').map(|p| json!(p)));
                Json::Array(parts)
            } else {
                json!(relative)
            }
        })
        .collect();
    // An empty folder lists as empty: folders exist as the files under them.
    Ok(json_reply(StatusCode::OK, &Json::Array(listed)))
}

async fn list_v2(state: Arc<AppState>, caller: Caller, query: Query) -> Result<warp::reply::Response, ApiError> {
    let path = query.get("path").map(|p| p.trim_end_matches('/')).unwrap_or("");
    let base = if path.is_empty() {
        String::new()
    } else {
        format!("{}/", user_path(path)?)
    };
    let files = state.user_data().files(&caller.tenant, &base).await?;
    let mut directories = std::collections::BTreeSet::new();
    let mut entries = Vec::new();
    for file in &files {
        let relative = &file.path[base.len()..];
        let parts: Vec<&str> = relative.split('/').collect();
        for depth in 1..parts.len() {
            directories.insert(format!("{base}{}", parts[..depth].join("/")));
        }
        entries.push(json!({
            "name": parts.last().copied().unwrap_or(""),
            "path": file.path,
            "type": "file",
            "size": file.size,
            "modified": seconds(file.modified),
        }));
    }
    let mut listed: Vec<Json> = directories
        .into_iter()
        .map(|d| json!({"name": d.rsplit('/').next().unwrap_or(""), "path": d, "type": "directory"}))
        .collect();
    listed.extend(entries);
    Ok(json_reply(StatusCode::OK, &Json::Array(listed)))
}

async fn read(state: Arc<AppState>, caller: Caller, file: String) -> Result<warp::reply::Response, ApiError> {
    let path = user_path(&file)?;
    let found = state.user_data().file(&caller.tenant, &path).await?;
    let Some((file, content)) = found else {
        // The files the editor reads on load start out empty.
        return match path.as_str() {
            "user.css" => Ok(warp::reply::with_header("", "content-type", "text/css").into_response()),
            "comfy.templates.json" => Ok(json_reply(StatusCode::OK, &json!([]))),
            _ => Err(ApiError::NotFound("user data file".into())),
        };
    };
    let content_type = if path.ends_with(".json") {
        "application/json"
    } else {
        "application/octet-stream"
    };
    let mut response = warp::http::Response::new(warp::hyper::Body::from(content));
    let headers = response.headers_mut();
    headers.insert("content-length", HeaderValue::from(file.size.max(0) as u64));
    content_safety_headers(headers, content_type, &path);
    Ok(response.into_response())
}

fn written(result: UserWrite, full_info: bool) -> Result<warp::reply::Response, ComfyError> {
    match result {
        UserWrite::Written(file) => Ok(json_reply(
            StatusCode::OK,
            &if full_info { info(&file, "") } else { json!(file.path) },
        )),
        UserWrite::Exists => Err(ComfyError::FileExists),
        UserWrite::Missing => Err(ApiError::NotFound("user data file".into()).into()),
        UserWrite::Full => Err(ApiError::PayloadTooLarge(format!(
            "user data is limited to {} files and {} MiB per tenant",
            LIMITS.files,
            LIMITS.bytes >> 20
        ))
        .into()),
    }
}

async fn write(
    state: Arc<AppState>,
    caller: Caller,
    file: String,
    query: Query,
    body: bytes::Bytes,
) -> Result<warp::reply::Response, ComfyError> {
    let path = user_path(&file)?;
    let overwrite = flag(&query, "overwrite", true);
    let result = state
        .user_data()
        .put(&caller.tenant, &path, body.to_vec(), overwrite)
        .await?;
    written(result, flag(&query, "full_info", false))
}

async fn delete(state: Arc<AppState>, caller: Caller, file: String) -> Result<warp::reply::Response, ApiError> {
    let path = user_path(&file)?;
    if !state.user_data().delete(&caller.tenant, &path).await? {
        return Err(ApiError::NotFound("user data file".into()));
    }
    Ok(warp::reply::with_status(warp::reply::reply(), StatusCode::NO_CONTENT).into_response())
}

async fn rename(
    state: Arc<AppState>,
    caller: Caller,
    file: String,
    dest: String,
    query: Query,
) -> Result<warp::reply::Response, ComfyError> {
    let (from, to) = (user_path(&file)?, user_path(&dest)?);
    let overwrite = flag(&query, "overwrite", true);
    let result = state.user_data().rename(&caller.tenant, &from, &to, overwrite).await?;
    written(result, flag(&query, "full_info", false))
}

/// The tenant's settings; none saved yet is `{}`.
async fn read_settings(state: &AppState, caller: &Caller) -> Result<Map<String, Json>, ApiError> {
    Ok(state.user_data().settings(&caller.tenant).await?)
}

/// Saves one setting (`id`) or several (a JSON object of them).
async fn write_settings(
    state: Arc<AppState>,
    caller: Caller,
    id: Option<String>,
    body: Json,
) -> Result<warp::reply::Response, ComfyError> {
    let change = match id {
        Some(id) => SettingsChange::One {
            id: decode(&id),
            value: body,
        },
        None => {
            let Json::Object(changes) = body else {
                return Err(ApiError::InvalidRequest("settings must be a JSON object".into()).into());
            };
            SettingsChange::Many(changes)
        }
    };
    let result = state.user_data().change_settings(&caller.tenant, change).await?;
    written(result, false).map(|_| super::ok_empty())
}
