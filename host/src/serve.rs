//! Assembling and running the server: store, blobs, API, plugins, workers, maintenance.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weft_v2m::Engine as V2mEngine;

use crate::api::v2m::{V2mService, V2mSettings};
use crate::api::{self, ApiConfig, AppState};
use crate::jobs::assets::Assets;
use crate::jobs::{self, Jobs, JobsConfig};
use crate::runtime::{Runtime, RuntimeConfig};
use crate::store::{sqlite::SqliteStore, Blobs, Store};

/// Everything `weft serve` needs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Data directory: database, blobs, compiled-code cache, link key.
    pub data_dir: PathBuf,
    /// API settings.
    pub api: ApiConfig,
    /// Job service settings.
    pub jobs: JobsConfig,
    /// Runtime settings.
    pub runtime: RuntimeConfig,
    /// How often retention runs.
    pub sweep_interval: Duration,
    /// How long signed content links stay valid.
    pub link_ttl: Duration,
    /// Credits the `default` tenant starts with (cloud and serverless surfaces).
    pub initial_credits: i64,
}

/// The key that signs content links, made once per data dir.
fn link_key(data_dir: &Path) -> anyhow::Result<[u8; 32]> {
    let path = data_dir.join("link.key");
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice()) {
            return Ok(key);
        }
    }
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    let tmp = data_dir.join("link.key.tmp");
    std::fs::write(&tmp, key)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(key)
}

/// The video-to-music engine, writing its videos under `<data_dir>/v2m-tmp` (emptied of
/// leftovers); none, logged, when it cannot be made (for example without its SoundFont).
fn v2m_engine(settings: &V2mSettings, data_dir: &Path) -> Option<Arc<V2mEngine>> {
    let temp_dir = data_dir.join("v2m-tmp");
    weft_v2m::prepare_temp_dir(&temp_dir)
        .and_then(|()| V2mEngine::new(settings.engine_config(temp_dir)))
        .map(Arc::new)
        .map_err(|e| tracing::warn!(error = %e, "video-to-music is unavailable"))
        .ok()
}

/// Opens the store of `data_dir`.
pub fn open_store(data_dir: &Path) -> anyhow::Result<Arc<dyn Store>> {
    std::fs::create_dir_all(data_dir)?;
    Ok(Arc::new(
        SqliteStore::open(&data_dir.join("weft.db")).map_err(|e| anyhow::anyhow!("opening the database: {e}"))?,
    ))
}

/// Runs the server until the process is stopped. It listens at once; job routes answer
/// `deployment_not_ready` until the plugins are loaded and recovery has run.
pub async fn run(mut config: ServeConfig) -> anyhow::Result<()> {
    let store = open_store(&config.data_dir)?;
    if config.jobs.job_cost > 0 {
        store
            .ensure_tenant(api::auth::DEFAULT_TENANT, config.initial_credits)
            .await?;
    }
    let assets = Arc::new(Assets::new(store.clone(), Blobs::open(&config.data_dir.join("blobs"))?));
    let links = api::links::Links::new(&config.api.mount_prefix, link_key(&config.data_dir)?, config.link_ttl);
    let v2m_engine = v2m_engine(&config.api.v2m, &config.data_dir);
    let state = Arc::new(AppState {
        config: config.api.clone(),
        store: store.clone(),
        assets: assets.clone(),
        jobs: std::sync::OnceLock::new(),
        links,
        streams: Default::default(),
        stopped: Default::default(),
        v2m: v2m_engine.clone().and_then(|engine| {
            V2mService::new(&config.api.v2m, engine)
                .map(Arc::new)
                .map_err(|e| tracing::warn!(error = %e, "video-to-music is unavailable"))
                .ok()
        }),
    });
    let routes = api::routes(state.clone());
    let (bound, server) = warp::serve(routes).try_bind_with_graceful_shutdown(config.addr, shutdown_signal())?;
    tracing::info!(addr = %bound, "listening");
    println!("weft listening on http://{bound}");
    let server = tokio::spawn(server);

    config.runtime.cache_dir = Some(config.data_dir.join("cache"));
    config.runtime.concurrent_calls = config.jobs.workers as u32;
    config.runtime.capabilities.music = crate::runtime::MusicConfig(v2m_engine);
    let runtime_config = config.runtime.clone();
    let runtime = tokio::task::spawn_blocking(move || Runtime::load(runtime_config)).await??;
    tracing::info!(classes = runtime.catalog().len(), "plugins loaded");
    let jobs = Jobs::new(store, assets, runtime, config.jobs.clone());
    let recovered = jobs::recovery::recover(&jobs).await?;
    if recovered != Default::default() {
        tracing::info!(?recovered, "recovered unfinished jobs");
    }
    jobs.start_workers();
    jobs::retention::start(jobs.clone(), config.sweep_interval);
    let _ = state.jobs.set(jobs);
    tracing::info!("ready");
    server.await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("installing SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}
