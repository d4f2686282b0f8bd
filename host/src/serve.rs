//! Assembling and running the server: store, blobs, API, plugins, workers, maintenance.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use weft_v2m::Engine as V2mEngine;

use crate::api::v2m::{V2mService, V2mSettings};
use crate::api::{self, ApiConfig, AppState};
use crate::jobs::assets::Assets;
use crate::jobs::{self, Jobs, JobsConfig};
use crate::runtime::{Runtime, RuntimeConfig};
use crate::store::blobs::BlobLocation;
use crate::store::{Coordinator, Database, Store};

/// What a process does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Serves the HTTP API only; other processes run the jobs.
    Api,
    /// Runs jobs only; `/healthz` and `/metrics` stay on the operator address.
    Worker,
    /// Both (the default).
    #[default]
    All,
}

/// Everything `weft serve` needs. Its flags default to the `DEFAULT_*` constants of this
/// and the configurations inside it (in the flags' units), and [`Default`] is what the
/// flags give when none is passed.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Data directory: database (by default), compiled-code cache, link key.
    pub data_dir: PathBuf,
    /// The store.
    pub database: Database,
    /// The content-addressed blobs, shared by every process of a shared store.
    pub blob_dir: BlobLocation,
    /// What this process does.
    pub role: Role,
    /// Where a worker-only process serves `/healthz` and `/metrics` (default: `addr`).
    pub operator_addr: Option<SocketAddr>,
    /// How long a claim on a job lasts unless its process renews it (shared store).
    pub lease: Duration,
    /// API settings.
    pub api: ApiConfig,
    /// Job service settings.
    pub jobs: JobsConfig,
    /// Runtime settings.
    pub runtime: RuntimeConfig,
    /// Reload a plugin of `runtime.plugins_dir` when its file changes.
    pub watch_plugins: bool,
    /// How often retention runs.
    pub sweep_interval: Duration,
    /// How long signed content links stay valid.
    pub link_ttl: Duration,
    /// Credits the `default` tenant starts with (cloud and serverless surfaces).
    pub initial_credits: i64,
    /// How long the running jobs may go on after SIGTERM or Ctrl-C before they are
    /// interrupted and queued again (see [`run`]).
    pub shutdown_grace: Duration,
}

impl ServeConfig {
    /// The default of [`addr`](Self::addr) (`--addr`): loopback, ComfyUI's port.
    pub const DEFAULT_ADDR: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8188));
    /// The default of [`data_dir`](Self::data_dir) (`--data-dir`).
    pub const DEFAULT_DATA_DIR: &'static str = "./data";
    /// The default of [`lease`](Self::lease), in seconds (`--lease-secs`).
    pub const DEFAULT_LEASE_SECS: u64 = 30;
    /// The default of [`shutdown_grace`](Self::shutdown_grace), in seconds
    /// (`--shutdown-grace-secs`).
    pub const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 30;
    /// The default of [`sweep_interval`](Self::sweep_interval), in seconds
    /// (`--sweep-interval-secs`).
    pub const DEFAULT_SWEEP_INTERVAL_SECS: u64 = 30;
    /// [`link_ttl`](Self::link_ttl): an hour (no flag).
    pub const LINK_TTL: Duration = Duration::from_secs(3600);

    /// The blobs' place when `--blob-dir` is not given: `blobs` in `data_dir`.
    pub fn default_blob_dir(data_dir: &Path) -> BlobLocation {
        BlobLocation::Dir(data_dir.join("blobs"))
    }
}

/// What `weft serve` without flags or `WEFT_*` variables runs with.
impl Default for ServeConfig {
    fn default() -> Self {
        let data_dir = PathBuf::from(Self::DEFAULT_DATA_DIR);
        Self {
            addr: Self::DEFAULT_ADDR,
            database: Database::parse(None, &data_dir),
            blob_dir: Self::default_blob_dir(&data_dir),
            data_dir,
            role: Role::default(),
            operator_addr: None,
            lease: Duration::from_secs(Self::DEFAULT_LEASE_SECS),
            api: ApiConfig::default(),
            jobs: JobsConfig::default(),
            runtime: RuntimeConfig::default(),
            watch_plugins: false,
            sweep_interval: Duration::from_secs(Self::DEFAULT_SWEEP_INTERVAL_SECS),
            link_ttl: Self::LINK_TTL,
            initial_credits: 0,
            shutdown_grace: Duration::from_secs(Self::DEFAULT_SHUTDOWN_GRACE_SECS),
        }
    }
}

/// How long open connections (event streams) may hold the HTTP server once the jobs have
/// drained; then they are closed.
const HTTP_CLOSE: Duration = Duration::from_secs(2);

/// A server started by [`start`].
struct Started {
    /// Where it listens.
    addr: SocketAddr,
    /// The HTTP server's task.
    server: tokio::task::JoinHandle<()>,
    /// The job service.
    jobs: Arc<Jobs>,
    /// Stops the HTTP server (open connections finish their requests).
    stop_http: CancellationToken,
}

/// The key that signs content links: one per data dir, or with a shared store one beside
/// the shared blobs (a file in a folder, an object in a bucket), so a link signed by one
/// process opens on every other. Of processes starting together, the first to place its key
/// wins and the others read that one.
async fn link_key(config: &ServeConfig, assets: &Assets) -> anyhow::Result<[u8; 32]> {
    let key = match config.database {
        Database::Postgres(_) => assets.shared_key("link.key").await,
        Database::Sqlite(_) => {
            let dir = config.data_dir.clone();
            tokio::task::spawn_blocking(move || crate::store::blobs::local::shared_key(&dir, "link.key")).await?
        }
    };
    key.map_err(|e| anyhow::anyhow!("reading the link-signing key: {e}"))
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

/// The database connections of process `process` serving `config`: named after its role
/// and it, as many as its role needs.
fn connections(config: &ServeConfig, process: &str) -> crate::store::postgres::Connections {
    let (role, api, workers) = match config.role {
        Role::Api => ("api", true, 0),
        Role::Worker => ("worker", false, config.jobs.workers),
        Role::All => ("all", true, config.jobs.workers),
    };
    crate::store::postgres::Connections::for_process(&format!("{role} {process}"), api, workers)
}

/// The wake-ups a process of `role` listens for: work if it runs jobs, event notices if it
/// serves event streams.
fn hears(role: Role) -> crate::store::postgres::Hears {
    crate::store::postgres::Hears {
        work: role != Role::Api,
        events: role != Role::Worker,
    }
}

/// Opens the store `database` names.
pub async fn open_store(database: &Database) -> anyhow::Result<Arc<dyn Store>> {
    Ok(database
        .open()
        .await
        .map_err(|e| anyhow::anyhow!("opening the database: {e}"))?
        .store)
}

/// Runs the server until the process is stopped. On the self-hosted and cloud surfaces
/// the port opens once the plugins are loaded and recovery has run, so the first request
/// is served; on the serverless surface it opens at once and job routes answer
/// `deployment_not_ready` until then, as a deployment that is still starting does.
///
/// On SIGTERM or Ctrl-C it shuts down gracefully and returns `Ok`: no new job is taken,
/// the running ones have [`ServeConfig::shutdown_grace`] to finish, and those still running
/// then are interrupted and queued again with their claims released
/// ([`Jobs::shut_down`]). The HTTP side serves throughout (reads, event streams, cancels;
/// submissions are accepted durably, for another process or the next start to run), then
/// stops. A second signal exits the process at once with status 128 + the signal's number
/// (143 for SIGTERM, 130 for SIGINT).
pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let grace = config.shutdown_grace;
    let mut stop = stop_requests()?;
    let Started {
        mut server,
        jobs,
        stop_http,
        ..
    } = start(config, true).await?;
    tokio::select! {
        _ = stop.wait_for(|asked| *asked) => {}
        ended = &mut server => {
            ended?;
            return Ok(());
        }
    }
    jobs.shut_down(grace).await;
    stop_http.cancel();
    if tokio::time::timeout(HTTP_CLOSE, &mut server).await.is_err() {
        tracing::info!("closing the connections still open");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Starts a server inside this process (for `weft run` without `--server`): nothing is
/// printed, Ctrl-C is left to the caller, and it serves until the process ends. Returns
/// once it is ready, with its address.
pub async fn start_embedded(config: ServeConfig) -> anyhow::Result<SocketAddr> {
    Ok(start(config, false).await?.addr)
}

/// Assembles the server and starts serving; returns once jobs are accepted. A `standalone`
/// server announces its address on stdout.
async fn start(mut config: ServeConfig, standalone: bool) -> anyhow::Result<Started> {
    std::fs::create_dir_all(&config.data_dir)?;
    let stop_http = CancellationToken::new();
    let process = format!("{}-{}", std::process::id(), uuid::Uuid::new_v4());
    let opened = config
        .database
        .open_as(&connections(&config, &process))
        .await
        .map_err(|e| anyhow::anyhow!("opening the database: {e}"))?;
    let store = opened.store;
    let coordinator: Option<Arc<dyn Coordinator>> = opened
        .postgres
        .map(|pg| pg.coordinator_hearing(process, config.lease, hears(config.role)) as Arc<dyn Coordinator>);
    if config.jobs.job_cost > 0 {
        store
            .ensure_tenant(api::auth::DEFAULT_TENANT, config.initial_credits)
            .await?;
    }
    let spool = config.data_dir.join("blob-spool");
    let blobs = config
        .blob_dir
        .open(&spool)
        .map_err(|e| anyhow::anyhow!("opening the blob store: {e}"))?;
    let assets = Arc::new(Assets::new(store.clone(), blobs));
    let link_key = link_key(&config, &assets).await?;
    let v2m_engine = v2m_engine(&config.api.v2m, &config.data_dir);
    let listen_early = config.api.surface == api::Surface::Serverless && config.role != Role::Worker;
    let early = if listen_early {
        let listener = std::net::TcpListener::bind(config.addr)?;
        let state = app_state(
            &config,
            listener.local_addr()?,
            store.clone(),
            assets.clone(),
            &v2m_engine,
            link_key,
        )?;
        let addr = listener.local_addr()?;
        let server = listen(listener, state.clone(), standalone, stop_http.clone())?;
        Some((state, server, addr))
    } else {
        None
    };

    if config.runtime.cache_dir.is_none() {
        config.runtime.cache_dir = Some(config.data_dir.join("cache"));
    }
    config.runtime.concurrent_calls = config.jobs.workers as u32;
    config.runtime.capabilities.music = crate::runtime::MusicConfig(v2m_engine.clone());
    let runtime_config = config.runtime.clone();
    let runtime = tokio::task::spawn_blocking(move || Runtime::load(runtime_config)).await??;
    tracing::info!(
        classes = runtime.catalog().len(),
        refused = runtime.refused().len(),
        "plugins loaded"
    );
    let jobs = job_service(&config, store.clone(), assets.clone(), runtime, coordinator).await?;
    let watcher = match (&config.runtime.plugins_dir, config.watch_plugins) {
        (Some(dir), true) => Some(jobs::plugin_watch::start(dir, jobs.clone())?),
        (None, true) => anyhow::bail!("--watch needs --plugins-dir"),
        _ => None,
    };
    jobs::retention::start(jobs.clone(), config.sweep_interval);
    jobs.start_cache_aging();
    let (server, addr) = if config.role == Role::Worker {
        let listener = std::net::TcpListener::bind(config.operator_addr.unwrap_or(config.addr))?;
        let addr = listener.local_addr()?;
        let state = app_state(&config, addr, store, assets, &v2m_engine, link_key)?;
        let _ = state.jobs.set(jobs.clone());
        (listen_operator(listener, state, stop_http.clone())?, addr)
    } else {
        match early {
            Some((state, server, addr)) => {
                let _ = state.jobs.set(jobs.clone());
                (server, addr)
            }
            None => {
                let listener = std::net::TcpListener::bind(config.addr)?;
                let addr = listener.local_addr()?;
                let state = app_state(&config, addr, store, assets, &v2m_engine, link_key)?;
                let _ = state.jobs.set(jobs.clone());
                (listen(listener, state, standalone, stop_http.clone())?, addr)
            }
        }
    };
    // The plugin watcher lives as long as the server serves.
    let server = match watcher {
        Some(watcher) => tokio::spawn(async move {
            let _watcher = watcher;
            let _ = server.await;
        }),
        None => server,
    };
    tracing::info!("ready");
    Ok(Started {
        addr,
        server,
        jobs,
        stop_http,
    })
}

/// The job service over `store`: shared with the other processes through `coordinator`
/// (with its rescue service), or this process's alone (after crash recovery); its workers
/// started unless the process only serves the API.
async fn job_service(
    config: &ServeConfig,
    store: Arc<dyn Store>,
    assets: Arc<Assets>,
    runtime: Arc<Runtime>,
    coordinator: Option<Arc<dyn Coordinator>>,
) -> anyhow::Result<Arc<Jobs>> {
    let jobs = match coordinator {
        // Several processes share the store: a dead one's jobs are rescued when their
        // leases lapse, never at another's start.
        Some(coordinator) => {
            let jobs = Jobs::new_shared(store, assets, runtime, config.jobs.clone(), coordinator);
            jobs.start_services();
            jobs::rescue::start(jobs.clone());
            jobs
        }
        None => {
            let jobs = Jobs::new(store, assets, runtime, config.jobs.clone());
            let recovered = jobs::recovery::recover(&jobs).await?;
            if recovered != Default::default() {
                tracing::info!(?recovered, "recovered unfinished jobs");
            }
            jobs
        }
    };
    if config.role != Role::Api {
        jobs.start_workers();
    }
    Ok(jobs)
}

/// The handlers' shared state, with links on `--public-url` or else on `bound`.
fn app_state(
    config: &ServeConfig,
    bound: SocketAddr,
    store: Arc<dyn Store>,
    assets: Arc<Assets>,
    v2m_engine: &Option<Arc<V2mEngine>>,
    link_key: [u8; 32],
) -> anyhow::Result<Arc<AppState>> {
    let origin = config
        .api
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"));
    let links = api::links::Links::new(&origin, &config.api.mount_prefix, link_key, config.link_ttl);
    Ok(Arc::new(AppState {
        config: config.api.clone(),
        store,
        assets,
        jobs: std::sync::OnceLock::new(),
        links,
        streams: Default::default(),
        tenant_streams: Default::default(),
        stopped: Default::default(),
        sessions: Default::default(),
        logins: Default::default(),
        json_budget: api::body::ParseBudget::new(config.api.json_parse_budget_bytes),
        settings_locks: Default::default(),
        v2m: v2m_engine.clone().and_then(|engine| {
            V2mService::new(&config.api.v2m, engine)
                .map(Arc::new)
                .map_err(|e| tracing::warn!(error = %e, "video-to-music is unavailable"))
                .ok()
        }),
    }))
}

/// Serves `state`'s routes on `listener` until `stop`. A `standalone` server announces its
/// address.
fn listen(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    standalone: bool,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let bound = listener.local_addr()?;
    let server = serve_with_client_addr(listener, api::routes(state), stop.cancelled_owned())?;
    tracing::info!(addr = %bound, "listening");
    if standalone {
        println!("weft listening on http://{bound}");
    }
    Ok(tokio::spawn(server))
}

/// Serves only `/healthz` and `/metrics` on `listener` (a worker-only process) until `stop`.
fn listen_operator(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let bound = listener.local_addr()?;
    let server = serve_with_client_addr(listener, api::operator_routes(state), stop.cancelled_owned())?;
    tracing::info!(addr = %bound, "operator routes listening");
    println!("weft listening on http://{bound}");
    Ok(tokio::spawn(server))
}

/// Serves `routes` on `listener` with warp's HTTP server (hyper), until `shutdown` (then open
/// connections finish their requests), with each request's client address in its extensions
/// ([`api::ClientAddr`]) and Nagle's algorithm off: a response goes out in several small
/// writes (headers, body, an event stream's events and its end), and with Nagle on each write
/// after the first waits for the client's ACK of the one before, which a client that delays
/// its ACKs holds back for up to 40 ms.
fn serve_with_client_addr(
    listener: std::net::TcpListener,
    routes: warp::filters::BoxedFilter<(warp::reply::Response,)>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use hyper::server::conn::{AddrIncoming, AddrStream};
    use hyper::service::{make_service_fn, service_fn, Service};
    listener.set_nonblocking(true)?;
    let mut incoming = AddrIncoming::from_listener(tokio::net::TcpListener::from_std(listener)?)?;
    incoming.set_nodelay(true);
    let service = warp::service(routes);
    let make = make_service_fn(move |connection: &AddrStream| {
        let service = service.clone();
        let client = api::ClientAddr(connection.remote_addr());
        async move {
            Ok::<_, std::convert::Infallible>(service_fn(move |mut request: hyper::Request<hyper::Body>| {
                request.extensions_mut().insert(client);
                service.clone().call(request)
            }))
        }
    });
    let server = hyper::Server::builder(incoming)
        .serve(make)
        .with_graceful_shutdown(shutdown);
    Ok(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "the HTTP server stopped");
        }
    })
}

/// Listens for SIGTERM and SIGINT (Ctrl-C) from now on. The first signal sets the returned
/// flag (the caller shuts down gracefully); a second exits the process at once, with status
/// 128 + its number (143 for SIGTERM, 130 for SIGINT), leaving the running jobs to recovery.
fn stop_requests() -> anyhow::Result<watch::Receiver<bool>> {
    let (asked, requests) = watch::channel(false);
    #[cfg(unix)]
    let mut signals = Signals::new()?;
    tokio::spawn(async move {
        #[cfg(unix)]
        let (name, _) = signals.next().await;
        #[cfg(not(unix))]
        let name = {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        };
        tracing::info!(
            signal = name,
            "shutting down: the running jobs may finish within the grace period (a second signal stops at once)"
        );
        asked.send_replace(true);
        #[cfg(unix)]
        let (name, number) = signals.next().await;
        #[cfg(not(unix))]
        let (name, number) = {
            let _ = tokio::signal::ctrl_c().await;
            ("SIGINT", 2)
        };
        tracing::warn!(signal = name, "stopping at once: the running jobs are left to recovery");
        std::process::exit(128 + number);
    });
    Ok(requests)
}

/// The stop signals of a Unix process, listened for from their creation.
#[cfg(unix)]
struct Signals {
    term: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

#[cfg(unix)]
impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// The next stop signal: its name and number.
    async fn next(&mut self) -> (&'static str, i32) {
        tokio::select! {
            _ = self.term.recv() => ("SIGTERM", 15),
            _ = self.interrupt.recv() => ("SIGINT", 2),
        }
    }
}
