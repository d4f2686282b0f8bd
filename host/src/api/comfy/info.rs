//! `GET /object_info[/{class}]`, `/system_stats`, `/features`, `/embeddings`,
//! `/extensions`, `/models[/{folder}]` and `POST /free`. Nothing here shows another
//! tenant's data: the only per-tenant part is the `LoadImage` combo, the caller's uploads.
//! `/object_info` also lists the core loaders ComfyUI's editor requires (see `loaders`).

use std::sync::Arc;

use serde_json::{json, Value as Json};
use warp::filters::BoxedFilter;
use warp::http::StatusCode;
use warp::Filter;

use super::{answer, json_body, json_reply, ok_empty, with_caller};
use super::{loaders, names};
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::runtime::NodeDef;

/// The ComfyUI version whose protocol this speaks.
pub(super) const COMFYUI_VERSION: &str = "0.3.64";
/// Most upload names an asset combo lists.
const MAX_COMBO_NAMES: usize = 1_000;
/// Model folders always listed by `/models`, beside those the catalogue's nodes read.
const MODEL_FOLDERS: &[&str] = &["checkpoints", "loras", "vae", "embeddings", "upscale_models"];

/// The routes.
pub(super) fn routes(state: &Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let all = warp::path("object_info")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s, c| async move { answer(object_info(s, c, None).await) });
    let one = warp::path!("object_info" / String)
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|class, s, c| async move { answer(object_info(s, c, Some(class)).await) });
    let stats = warp::path("system_stats")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .map(|_s: Arc<AppState>, _c: Caller| json_reply(StatusCode::OK, &system_stats()));
    let features = warp::path("features")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .map(|s: Arc<AppState>, _c: Caller| {
            json_reply(
                StatusCode::OK,
                &json!({"supports_preview_metadata": false, "max_upload_size": s.config.max_upload_bytes}),
            )
        });
    let embeddings = warp::path("embeddings")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s: Arc<AppState>, _c: Caller| async move {
            answer(s.jobs().map(|jobs| {
                let names: Vec<String> = jobs
                    .runtime()
                    .model_files("embeddings")
                    .into_iter()
                    .map(|f| match f.rfind('.') {
                        Some(dot) if dot > 0 => f[..dot].to_string(),
                        _ => f,
                    })
                    .collect();
                json_reply(StatusCode::OK, &json!(names))
            }))
        });
    let extensions = warp::path("extensions")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .map(|_s: Arc<AppState>, _c: Caller| json_reply(StatusCode::OK, &json!([])));
    let folders = warp::path("models")
        .and(warp::path::end())
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s: Arc<AppState>, _c: Caller| async move {
            answer(model_folders(&s).map(|f| json_reply(StatusCode::OK, &json!(f))))
        });
    let files = warp::path!("models" / String)
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|folder: String, s: Arc<AppState>, _c: Caller| async move {
            answer(model_folders(&s).and_then(|known| {
                if !known.contains(&folder) {
                    return Err(ApiError::NotFound("models folder".into()));
                }
                let files = s.jobs()?.runtime().model_files(&folder);
                Ok(json_reply(StatusCode::OK, &json!(files)))
            }))
        });
    let experiment_folders = warp::path!("experiment" / "models")
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|s: Arc<AppState>, _c: Caller| async move {
            answer(model_folders(&s).map(|folders| {
                // Folder paths of the server are not shown; the editor needs the names.
                let listed: Vec<Json> = folders.iter().map(|f| json!({"name": f, "folders": []})).collect();
                json_reply(StatusCode::OK, &json!(listed))
            }))
        });
    let experiment_files = warp::path!("experiment" / "models" / String)
        .and(warp::get())
        .and(with_caller(state))
        .and_then(|folder: String, s: Arc<AppState>, _c: Caller| async move {
            answer(model_folders(&s).and_then(|known| {
                if !known.contains(&folder) {
                    return Err(ApiError::NotFound("models folder".into()));
                }
                let files: Vec<Json> = s
                    .jobs()?
                    .runtime()
                    .model_files(&folder)
                    .into_iter()
                    .map(|name| json!({"name": name, "pathIndex": 0}))
                    .collect();
                Ok(json_reply(StatusCode::OK, &json!(files)))
            }))
        });
    // The editor's log console (shown after a failed queue): the server's own log is the
    // operator's, not a tenant's, so the console is empty and subscribing to it is a no-op.
    let logs = warp::path!("internal" / "logs")
        .and(warp::get())
        .and(with_caller(state))
        .map(|_s: Arc<AppState>, _c: Caller| json_reply(StatusCode::OK, &json!("")));
    let raw_logs = warp::path!("internal" / "logs" / "raw")
        .and(warp::get())
        .and(with_caller(state))
        .map(|_s: Arc<AppState>, _c: Caller| {
            json_reply(
                StatusCode::OK,
                &json!({"entries": [], "size": {"cols": 80, "rows": 24}}),
            )
        });
    let subscribe_logs = warp::path!("internal" / "logs" / "subscribe")
        .and(warp::patch())
        .and(with_caller(state))
        .and(json_body(state))
        .map(|_s: Arc<AppState>, _c: Caller, _body: Json| ok_empty());
    let free = warp::path("free")
        .and(warp::path::end())
        .and(warp::post())
        .and(with_caller(state))
        .and(json_body(state))
        .map(|_s: Arc<AppState>, _c: Caller, _body: Json| ok_empty());
    all.or(one)
        .unify()
        .or(stats)
        .unify()
        .or(features)
        .unify()
        .or(embeddings)
        .unify()
        .or(extensions)
        .unify()
        .or(folders)
        .unify()
        .or(files)
        .unify()
        .or(experiment_folders)
        .unify()
        .or(experiment_files)
        .unify()
        .or(free)
        .unify()
        .or(logs)
        .unify()
        .or(raw_logs)
        .unify()
        .or(subscribe_logs)
        .unify()
        .boxed()
}

/// The models folders: those the catalogue's model inputs read, and the usual ones.
fn model_folders(state: &AppState) -> Result<Vec<String>, ApiError> {
    let jobs = state.jobs()?;
    let runtime = jobs.runtime();
    let catalog = runtime.catalog();
    let mut folders: Vec<String> = MODEL_FOLDERS.iter().map(|f| f.to_string()).collect();
    for def in catalog.iter() {
        for input in &def.inputs {
            if let Some(folder) = &input.model_folder {
                if !folders.contains(folder) {
                    folders.push(folder.clone());
                }
            }
        }
    }
    Ok(folders)
}

/// One class in ComfyUI's shape, with asset inputs as a combo of the caller's uploads that
/// the editor offers an upload button for.
fn class_info(def: &NodeDef, uploads: &[String]) -> Json {
    let mut info = def.object_info();
    for input in def.inputs.iter().filter(|i| i.type_name == weft_types::ASSET) {
        let section = if input.required { "required" } else { "optional" };
        if let Some(slot) = info.pointer_mut(&format!("/input/{section}/{}", input.name)) {
            *slot = json!([uploads, {"image_upload": true}]);
        }
    }
    info
}

async fn object_info(
    state: Arc<AppState>,
    caller: Caller,
    class: Option<String>,
) -> Result<warp::reply::Response, ApiError> {
    let jobs = state.jobs()?;
    let runtime = jobs.runtime();
    let catalog = runtime.catalog();
    let uploads: Vec<String> = state
        .store
        .upload_names(&caller.tenant, "image/", MAX_COMBO_NAMES)
        .await
        .map_err(|e| ApiError::upstream("listing uploads", e))?
        .into_iter()
        .filter(|n| names::is_listed_input(n))
        .collect();
    let mut out = serde_json::Map::new();
    for def in catalog.iter() {
        if class.as_ref().is_none_or(|c| *c == def.class_type) {
            out.insert(def.class_type.clone(), class_info(def, &uploads));
        }
    }
    out.extend(loaders::object_info(
        class.as_deref(),
        |c| catalog.get(c).is_some(),
        |folder| runtime.model_files(folder),
    ));
    Ok(json_reply(StatusCode::OK, &Json::Object(out)))
}

/// Total and available memory in bytes, from `/proc/meminfo` where there is one.
fn memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The server's description: its version and the machine's memory; no tenant's data and
/// none of its command line.
fn system_stats() -> Json {
    let (ram_total, ram_free) = memory();
    json!({
        "system": {
            "os": std::env::consts::OS,
            "ram_total": ram_total,
            "ram_free": ram_free,
            "comfyui_version": COMFYUI_VERSION,
            "weft_version": env!("CARGO_PKG_VERSION"),
            "required_frontend_version": "",
            "installed_templates_version": "",
            "required_templates_version": "",
            "python_version": "",
            "pytorch_version": "",
            "embedded_python": false,
            "argv": ["weft"],
        },
        "devices": [{
            "name": "cpu",
            "type": "cpu",
            "index": null,
            "vram_total": 0,
            "vram_free": 0,
            "torch_vram_total": 0,
            "torch_vram_free": 0,
        }],
    })
}
