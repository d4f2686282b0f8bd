//! The HTTP surface (warp): the v2 job and asset API, event streams, and operator routes.
//!
//! Public face: [`ApiConfig`], [`AppState`] and [`routes`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};

use warp::filters::BoxedFilter;
use warp::{Filter, Reply};

pub mod assets;
pub mod auth;
pub mod body;
pub mod comfy;
pub mod dashboard;
pub mod error;
pub mod events;
pub mod jobs;
pub mod links;
pub mod openapi;
pub mod operator;
pub mod render;
pub mod session;
pub mod v2m;

pub use auth::AuthMode;
pub use error::ApiError;

use crate::jobs::assets::Assets;
use crate::jobs::userdata::{SettingsLocks, UserData};
use crate::jobs::Jobs;
use crate::store::Store;

/// Which kind of surface this server presents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Surface {
    /// A self-hosted server: no logs on jobs, no credits. The default.
    #[default]
    SelfHosted,
    /// The hosted cloud: credits, no logs.
    Cloud,
    /// A serverless deployment: logs captured for every job, credits, deployment states.
    Serverless,
}

/// API settings.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// How callers authenticate.
    pub auth: AuthMode,
    /// The surface.
    pub surface: Surface,
    /// Public demo: callers without credentials are accepted and logs are withheld on read.
    pub public_demo: bool,
    /// Prefix the API is mounted under, for example `/deployment/abc`.
    pub mount_prefix: String,
    /// Largest asset upload, in bytes.
    pub max_upload_bytes: u64,
    /// Largest JSON request body, in bytes.
    pub max_json_bytes: u64,
    /// Bytes that request bodies being read and parsed may hold at once (see [`body`]).
    pub json_parse_budget_bytes: u64,
    /// Most event streams open at once.
    pub max_streams: usize,
    /// Most event streams one tenant may have open, so one tenant cannot take them all.
    pub tenant_max_streams: usize,
    /// `scheme://authority` clients reach the server at, when it is behind a proxy; content
    /// links are built on it. None: on the listening address.
    pub public_url: Option<String>,
    /// Origins (`scheme://host[:port]`) besides the server's own whose pages may use a
    /// dashboard session cookie (`--allowed-origin`).
    pub allowed_origins: Vec<String>,
    /// Operator token for drain; none disables operator routes.
    pub admin_token: Option<String>,
    /// Video-to-music endpoint settings.
    pub v2m: v2m::V2mSettings,
    /// Directory of ComfyUI's web editor, served at `/`; none: `/` is not the editor.
    pub comfyui_frontend: Option<std::path::PathBuf>,
}

impl ApiConfig {
    /// The default of [`max_upload_bytes`](Self::max_upload_bytes) (`--max-upload-bytes`).
    pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 300_000_000;
    /// [`max_json_bytes`](Self::max_json_bytes): 32 MiB (no flag).
    pub const MAX_JSON_BYTES: u64 = 32 << 20;
    /// The default of [`json_parse_budget_bytes`](Self::json_parse_budget_bytes), in MiB
    /// (`--json-parse-budget-mib`).
    pub const DEFAULT_JSON_PARSE_BUDGET_MIB: u64 = 512;
    /// The default of [`max_streams`](Self::max_streams) (`--max-streams`), and of
    /// [`tenant_max_streams`](Self::tenant_max_streams) with one tenant.
    pub const DEFAULT_MAX_STREAMS: usize = 20_000;
}

/// What `weft serve`'s defaults give: the self-hosted surface, no authentication, one tenant.
impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            auth: AuthMode::None,
            surface: Surface::default(),
            public_demo: false,
            mount_prefix: String::new(),
            max_upload_bytes: Self::DEFAULT_MAX_UPLOAD_BYTES,
            max_json_bytes: Self::MAX_JSON_BYTES,
            json_parse_budget_bytes: Self::DEFAULT_JSON_PARSE_BUDGET_MIB << 20,
            max_streams: Self::DEFAULT_MAX_STREAMS,
            tenant_max_streams: Self::DEFAULT_MAX_STREAMS,
            public_url: None,
            allowed_origins: Vec::new(),
            admin_token: None,
            v2m: v2m::V2mSettings::default(),
            comfyui_frontend: None,
        }
    }
}

/// Shared state of every handler.
pub struct AppState {
    /// Settings.
    pub config: ApiConfig,
    /// The store, only read here (every write goes through `jobs`; ComfyUI's user data through
    /// [`AppState::user_data`]): API keys, its health, a job's stored workflow, and the ComfyUI
    /// protocol's views of a tenant's jobs, outputs and uploads.
    pub store: Arc<dyn Store>,
    /// Uploads and outputs, with their content.
    pub assets: Arc<Assets>,
    /// The job service, set once plugins are loaded.
    pub jobs: OnceLock<Arc<Jobs>>,
    /// Follow-up links.
    pub links: links::Links,
    /// Event streams open now.
    pub streams: AtomicUsize,
    /// Event streams open now, by tenant.
    pub tenant_streams: Mutex<HashMap<String, usize>>,
    /// Set when the operator drained the deployment.
    pub stopped: AtomicBool,
    /// The video-to-music service; none when its SoundFont could not be loaded.
    pub v2m: Option<Arc<v2m::V2mService>>,
    /// Dashboard sessions.
    pub sessions: session::Sessions,
    /// Login attempts per client network.
    pub logins: session::LoginLimiter,
    /// What request bodies being read and parsed hold now.
    pub json_budget: Arc<body::ParseBudget>,
    /// The locks of ComfyUI's settings writes, one per tenant (see [`AppState::user_data`]).
    pub settings_locks: SettingsLocks,
}

/// The address of the client a request came from (its TCP peer), in the request's
/// extensions.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub std::net::SocketAddr);

impl AppState {
    /// The job service, or `deployment_not_ready` while plugins are loading.
    pub fn jobs(&self) -> Result<&Arc<Jobs>, ApiError> {
        self.jobs.get().ok_or(ApiError::DeploymentNotReady { retry_after: 1 })
    }

    /// ComfyUI's user data and settings of every tenant; ready before the plugins load.
    pub fn user_data(&self) -> UserData<'_> {
        UserData::new(self.store.as_ref(), &self.settings_locks)
    }
}

/// Matches the mount prefix, then `api/v2`.
fn api_base(prefix: &str) -> BoxedFilter<()> {
    let mut base = warp::any().boxed();
    for segment in prefix.split('/').filter(|s| !s.is_empty()) {
        base = base.and(warp::path(segment.to_string())).boxed();
    }
    base.and(warp::path("api")).and(warp::path("v2")).boxed()
}

/// The operator's routes alone (`/healthz`, `/metrics`), for a worker-only process.
pub fn operator_routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    operator::root_routes(state).recover(error::recover).unify().boxed()
}

/// Every route, with the error envelope on every rejection.
pub fn routes(state: Arc<AppState>) -> BoxedFilter<(warp::reply::Response,)> {
    let base = api_base(&state.config.mount_prefix);
    let api = base
        .and(
            jobs::routes(state.clone())
                .or(assets::routes(state.clone()))
                .unify()
                .or(operator::api_routes(state.clone()))
                .unify(),
        )
        .boxed();
    let mount_prefix = state.config.mount_prefix.clone();
    let api = match state.config.comfyui_frontend.clone() {
        Some(dir) => comfy::frontend_routes(dir, &mount_prefix).or(api).unify().boxed(),
        None => api,
    };
    let all = api
        .or(v2m::routes(state.clone()))
        .unify()
        .or(operator::root_routes(state.clone()))
        .unify()
        .or(dashboard::routes(state.clone()))
        .unify()
        .or(comfy::routes(state))
        .unify()
        .recover(error::recover)
        .unify();
    // A 405 names the methods the path does serve (RFC 9110).
    warp::path::full()
        .and(all)
        .map(move |path: warp::path::FullPath, mut response: warp::reply::Response| {
            if response.status() == warp::http::StatusCode::METHOD_NOT_ALLOWED {
                if let Some(allow) = openapi::allowed_methods(&mount_prefix, path.as_str())
                    .and_then(|a| warp::http::HeaderValue::from_str(&a).ok())
                {
                    response.headers_mut().insert(warp::http::header::ALLOW, allow);
                }
            }
            response
        })
        .boxed()
}

/// A filter that hands a clone of the server's state to a handler (cloning the filter is
/// cheap: every route takes one).
pub(crate) fn with_state(state: &Arc<AppState>) -> BoxedFilter<(Arc<AppState>,)> {
    let state = state.clone();
    warp::any().map(move || state.clone()).boxed()
}

/// Wraps a handler result as a response.
pub fn respond(result: Result<warp::reply::Response, ApiError>) -> Result<warp::reply::Response, warp::Rejection> {
    Ok(result.unwrap_or_else(|e| e.into_response()))
}
