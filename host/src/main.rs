//! The `weft` command: `serve`, `nodes`, `keys`, `credits`, `dev`, `models`, and the client
//! commands `run`, `jobs` and `assets`. Argument parsing and dispatch; the longer command
//! bodies live in [`cli`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use weft::api::v2m::V2mSettings;
use weft::api::{ApiConfig, AuthMode, Surface};
use weft::jobs::JobsConfig;
use weft::runtime::{
    default_host_memory, Capabilities, CapabilityConfig, DiffusionConfig, Limits, ModelLibrary, Runtime, RuntimeConfig,
};
use weft::serve::{self, Role, ServeConfig};
use weft::store::blobs::BlobLocation;
use weft::store::Database;

use cli::models::ModelsCommand;
use cli::plugin::PluginCommand;

mod cli;

weft_allocator::install!();

#[derive(Parser)]
#[command(
    name = "weft",
    version,
    about = "A workflow job server: ComfyUI API-format graphs, every node a sandboxed wasm component"
)]
#[command(args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the server.
    Serve(Box<ServeArgs>),
    /// Prints the node catalogue.
    Nodes {
        /// Extra plugins directory.
        #[arg(long, env = "WEFT_PLUGINS_DIR")]
        plugins_dir: Option<PathBuf>,
        /// Models directory, for the choices of model-file inputs.
        #[arg(long, env = "WEFT_MODELS_DIR")]
        models_dir: Option<PathBuf>,
        /// Print ComfyUI's /object_info JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Time a plugin may take to describe itself, in milliseconds.
        #[arg(long, env = "WEFT_PLUGIN_LOAD_TIMEOUT_MS", default_value_t = RuntimeConfig::DEFAULT_PLUGIN_LOAD_TIMEOUT_MS)]
        plugin_load_timeout_ms: u64,
    },
    /// Manages API keys (for `--auth keys`).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Manages tenant credits (cloud and serverless surfaces).
    Credits {
        #[command(subcommand)]
        command: CreditsCommand,
    },
    /// Developer tools.
    Dev {
        #[command(subcommand)]
        command: DevCommand,
    },
    /// ComfyUI's web editor (the PyPI package `comfyui-frontend-package`).
    ComfyuiFrontend {
        #[command(subcommand)]
        command: cli::comfyui_frontend::FrontendCommand,
    },
    /// Model files.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
    /// Plugin authoring: check a component, start a new plugin.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    #[command(flatten)]
    Client(cli::ClientCommand),
    /// The database.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
}

#[derive(Subcommand)]
enum DbCommand {
    /// Applies the schema migrations the database lacks (`serve` also does at start), and
    /// prints the schema version. Refuses a database migrated by a newer weft.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// Where the store is.
#[derive(Args)]
struct StoreArgs {
    /// Data directory of the server.
    #[arg(long, env = "WEFT_DATA_DIR", default_value = ServeConfig::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// The store: a path or sqlite://PATH (the embedded store, one process; default
    /// DATA_DIR/weft.db), or postgres://USER@HOST/DB (PostgreSQL, shared by many processes).
    #[arg(long, env = "WEFT_DATABASE")]
    database: Option<String>,
}

impl StoreArgs {
    fn database(&self) -> Database {
        Database::parse(self.database.as_deref(), &self.data_dir)
    }
}

#[derive(Subcommand)]
enum DevCommand {
    /// Runs every case of a ComfyUI reference-vector file (schedulers, samplers, seeded
    /// noise) and prints the worst absolute error per case; exits 1 if any is out of tolerance.
    CheckVectors {
        /// The vector file (format of tests/fixtures/comfyui-sampling.json).
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Creates an API key for a tenant and prints it on the last line.
    Create {
        #[command(flatten)]
        store: StoreArgs,
        /// Tenant name (created if new).
        #[arg(long)]
        tenant: String,
    },
}

#[derive(Subcommand)]
enum CreditsCommand {
    /// Adds credits to a tenant and prints the new balance.
    Add {
        #[command(flatten)]
        store: StoreArgs,
        /// Tenant name.
        #[arg(long)]
        tenant: String,
        /// Credits to add (negative to remove).
        #[arg(long, allow_hyphen_values = true)]
        amount: i64,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// TOML file of settings; its keys are the long flag names (`queue-depth = 100`).
    /// Flags and WEFT_* environment variables override it.
    #[arg(long, env = "WEFT_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, env = "WEFT_ADDR", default_value_t = ServeConfig::DEFAULT_ADDR)]
    addr: SocketAddr,
    /// Data directory (database, blobs, caches).
    #[arg(long, env = "WEFT_DATA_DIR", default_value = ServeConfig::DEFAULT_DATA_DIR)]
    data_dir: PathBuf,
    /// The store: a path or sqlite://PATH (the embedded store, one process; default
    /// DATA_DIR/weft.db), or postgres://USER@HOST/DB (PostgreSQL, shared by many processes).
    #[arg(long, env = "WEFT_DATABASE")]
    database: Option<String>,
    /// The content-addressed blobs (default DATA_DIR/blobs). Processes sharing a database
    /// share it: a local folder on one machine, a network mount across machines, or an S3
    /// bucket, s3://BUCKET/PREFIX (configured from the AWS_* environment variables).
    #[arg(long, env = "WEFT_BLOB_DIR")]
    blob_dir: Option<String>,
    /// api serves HTTP only, worker runs jobs only (with /healthz and /metrics on
    /// --operator-addr), all does both. api and worker need a shared (postgres://) database.
    #[arg(long, env = "WEFT_ROLE", value_enum, default_value_t = Role::default())]
    role: Role,
    /// Where a worker-only process serves /healthz and /metrics (default: --addr).
    #[arg(long, env = "WEFT_OPERATOR_ADDR")]
    operator_addr: Option<SocketAddr>,
    /// Seconds a claim on a job lasts unless its process renews it (PostgreSQL); a dead
    /// process's jobs are rescued this long after it stopped.
    #[arg(long, env = "WEFT_LEASE_SECS", default_value_t = ServeConfig::DEFAULT_LEASE_SECS)]
    lease_secs: u64,
    /// Seconds the running jobs may go on after SIGTERM or Ctrl-C (no new job is taken);
    /// those still running then are interrupted and queued again, for another process or
    /// the next start. A second signal stops at once.
    #[arg(long, env = "WEFT_SHUTDOWN_GRACE_SECS", default_value_t = ServeConfig::DEFAULT_SHUTDOWN_GRACE_SECS)]
    shutdown_grace_secs: u64,
    /// Extra plugins: every *.wasm in this directory, with its optional <name>.toml manifest.
    #[arg(long, env = "WEFT_PLUGINS_DIR")]
    plugins_dir: Option<PathBuf>,
    /// Directory of the plugins' compiled machine code, loaded at the next start instead of
    /// compiling again (default: `cache` in --data-dir). Servers on one machine may share
    /// one; its files are run as native code, so it must be writable by the operator only.
    #[arg(long, env = "WEFT_COMPILE_CACHE")]
    compile_cache: Option<PathBuf>,
    /// Reload a plugin of --plugins-dir when its file changes; jobs already running keep
    /// the version they started with.
    #[arg(long, env = "WEFT_WATCH")]
    watch: bool,
    /// Jobs that run at once. More than the cores: a job waits on storage as well as computing.
    #[arg(long, env = "WEFT_WORKERS", default_value_t = JobsConfig::DEFAULT_WORKERS)]
    workers: usize,
    /// The precision networks compute in on a GPU: float32, float16 or bfloat16 (the
    /// autoencoder takes bfloat16 for float16). Unset: ComfyUI's defaults, the UNet and text
    /// encoders in float16, the autoencoder in bfloat16. The CPU always computes in float32.
    #[arg(long, env = "WEFT_PRECISION", value_parser = parse_precision)]
    precision: Option<weft_compute::device::Precision>,
    /// Jobs that may wait; beyond it submissions get 429 queue_full.
    #[arg(long, env = "WEFT_QUEUE_DEPTH", default_value_t = JobsConfig::DEFAULT_QUEUE_DEPTH)]
    queue_depth: usize,
    /// Jobs one tenant may have waiting; beyond it its submissions get 429 queue_full.
    /// Default: half of --queue-depth under `--auth keys` (many tenants), all of it otherwise.
    #[arg(long, env = "WEFT_TENANT_QUEUE_DEPTH")]
    tenant_queue_depth: Option<usize>,
    /// Which surface to present.
    #[arg(long, env = "WEFT_SURFACE", value_enum, default_value_t = Surface::default())]
    surface: Surface,
    /// Authentication: none, token (with --token) or keys (see `weft keys create`). Unset:
    /// token when --token is given, none otherwise.
    #[arg(long, env = "WEFT_AUTH", value_parser = ["none", "token", "keys"])]
    auth: Option<String>,
    /// The static bearer token; giving it turns on `--auth token` (with another --auth it is
    /// refused).
    #[arg(long, env = "WEFT_TOKEN")]
    token: Option<String>,
    /// Public demo: accept callers without credentials, withhold logs on read.
    #[arg(long, env = "WEFT_PUBLIC_DEMO")]
    public_demo: bool,
    /// Allow listening on a non-loopback address without authentication.
    #[arg(long, env = "WEFT_ALLOW_UNAUTHENTICATED")]
    allow_unauthenticated: bool,
    /// Prefix the API is mounted under, e.g. /deployment/<id>.
    #[arg(long, env = "WEFT_MOUNT_PREFIX", default_value_t)]
    mount_prefix: String,
    /// Operator token for POST /api/v2/admin/drain.
    #[arg(long, env = "WEFT_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// Serve ComfyUI's web editor from this directory at `/` (install it with
    /// `weft comfyui-frontend install DIR`).
    #[arg(long, env = "WEFT_COMFYUI_FRONTEND")]
    comfyui_frontend: Option<PathBuf>,
    /// Job retention in seconds (expires_at = created_at + this).
    #[arg(long, env = "WEFT_RETENTION_SECS", default_value_t = JobsConfig::DEFAULT_RETENTION_SECS)]
    retention_secs: u64,
    /// Seconds an expired job stays readable before it is removed.
    #[arg(long, env = "WEFT_EXPIRED_GRACE_SECS", default_value_t = JobsConfig::DEFAULT_EXPIRED_GRACE_SECS)]
    expired_grace_secs: u64,
    /// Seconds a preview (`PreviewImage`'s temporary output) is kept after it is committed,
    /// never longer than its job; unset, as long as its job (the interface's rule for outputs).
    #[arg(long, env = "WEFT_PREVIEW_RETENTION_SECS")]
    preview_retention_secs: Option<u64>,
    /// Seconds between retention sweeps.
    #[arg(long, env = "WEFT_SWEEP_INTERVAL_SECS", default_value_t = ServeConfig::DEFAULT_SWEEP_INTERVAL_SECS)]
    sweep_interval_secs: u64,
    /// Credits a job costs on the cloud and serverless surfaces.
    #[arg(long, env = "WEFT_JOB_COST", default_value_t = JobsConfig::DEFAULT_PAID_JOB_COST)]
    job_cost: i64,
    /// Credits a new tenant starts with.
    #[arg(long, env = "WEFT_INITIAL_CREDITS", default_value_t)]
    initial_credits: i64,
    /// Memory that request bodies being read and parsed may hold at once, in MiB: a JSON
    /// body's length while it arrives, then an estimate of its parse. Beyond it a request
    /// gets 429 `server_busy` with `Retry-After`; one that could never fit gets 413.
    #[arg(long, env = "WEFT_JSON_PARSE_BUDGET_MIB", default_value_t = ApiConfig::DEFAULT_JSON_PARSE_BUDGET_MIB)]
    json_parse_budget_mib: u64,
    /// Largest asset upload in bytes.
    #[arg(long, env = "WEFT_MAX_UPLOAD_BYTES", default_value_t = ApiConfig::DEFAULT_MAX_UPLOAD_BYTES)]
    max_upload_bytes: u64,
    /// Most event streams open at once.
    #[arg(long, env = "WEFT_MAX_STREAMS", default_value_t = ApiConfig::DEFAULT_MAX_STREAMS)]
    max_streams: usize,
    /// Most event streams one tenant may have open. Default: half of --max-streams under
    /// `--auth keys` (many tenants), all of them otherwise.
    #[arg(long, env = "WEFT_TENANT_MAX_STREAMS")]
    tenant_max_streams: Option<usize>,
    /// `scheme://host[:port]` clients reach this server at (behind a proxy). Signed content
    /// links are built on it; unset, they are built on the listening address and the
    /// request's `Host` header is never trusted.
    #[arg(long, env = "WEFT_PUBLIC_URL")]
    public_url: Option<String>,
    /// An origin (`scheme://host[:port]`) besides the server's own whose pages may use a
    /// dashboard session cookie: read, follow events and change state. Repeatable.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    allowed_origins: Vec<String>,
    /// Time a plugin may take to describe itself at start-up, in milliseconds; a plugin
    /// that takes longer is refused and the others serve.
    #[arg(long, env = "WEFT_PLUGIN_LOAD_TIMEOUT_MS", default_value_t = RuntimeConfig::DEFAULT_PLUGIN_LOAD_TIMEOUT_MS)]
    plugin_load_timeout_ms: u64,
    /// Wall time per node call, in milliseconds.
    #[arg(long, env = "WEFT_NODE_TIMEOUT_MS", default_value_t = Limits::DEFAULT_NODE_TIMEOUT_MS)]
    node_timeout_ms: u64,
    /// Linear memory per instance, in MiB.
    #[arg(long, env = "WEFT_NODE_MEMORY_MIB", default_value_t = Limits::DEFAULT_MEMORY_MIB)]
    node_memory_mib: usize,
    /// Host memory one job's values (images, latents, masks, audio) may hold, in MiB.
    #[arg(long, env = "WEFT_JOB_MEMORY_MIB", default_value_t = Limits::DEFAULT_JOB_MEMORY_MIB)]
    job_memory_mib: u64,
    /// Host memory all jobs' values together may hold, in MiB (default: three quarters of
    /// the machine's memory).
    #[arg(long, env = "WEFT_HOST_MEMORY_MIB")]
    host_memory_mib: Option<u64>,
    /// Bytes one node call may pass through host calls and its result, in MiB.
    #[arg(long, env = "WEFT_HOSTCALL_MIB", default_value_t = Limits::DEFAULT_HOSTCALL_MIB)]
    hostcall_mib: usize,
    /// Per-job log tail, in KiB.
    #[arg(long, env = "WEFT_LOG_KIB", default_value_t = Limits::DEFAULT_LOG_KIB)]
    log_kib: usize,
    /// Most outputs (files: images, audio, text, ...) one job may commit.
    #[arg(long, env = "WEFT_MAX_JOB_OUTPUTS", default_value_t = JobsConfig::DEFAULT_MAX_OUTPUTS)]
    max_job_outputs: usize,
    /// Most bytes one job's outputs may hold in all, encoded, in MiB.
    #[arg(long, env = "WEFT_MAX_JOB_OUTPUT_MIB", default_value_t = JobsConfig::DEFAULT_MAX_OUTPUT_MIB)]
    max_job_output_mib: u64,
    /// Largest output file kept in the database with its asset record, in KiB (it then needs
    /// no blob file and no separate sync); larger outputs are blobs. 0: every output a blob;
    /// at most 16384 (16 MiB).
    #[arg(long, env = "WEFT_INLINE_OUTPUT_KIB", default_value_t = JobsConfig::DEFAULT_INLINE_OUTPUT_KIB)]
    inline_output_kib: usize,
    /// Node result cache, in MiB. It keeps small results, and large ones whose node took a
    /// millisecond or more: a faster node runs again rather than hold its result.
    #[arg(long, env = "WEFT_CACHE_MIB", default_value_t = JobsConfig::DEFAULT_CACHE_MIB)]
    cache_mib: usize,
    /// Seconds a cached node result may go unused before it is dropped and its memory handed
    /// back to the OS; 0 keeps results until the cache's size evicts them.
    #[arg(long, env = "WEFT_CACHE_IDLE_SECS", default_value_t = JobsConfig::DEFAULT_CACHE_IDLE_SECS)]
    cache_idle_secs: u64,
    /// Grants a plugin a capability its manifest asks for: PLUGIN=env:NAME, PLUGIN=dir:/path
    /// or PLUGIN=network. Repeatable.
    #[arg(long = "grant", env = "WEFT_GRANTS", value_delimiter = ',')]
    grants: Vec<String>,
    /// ComfyUI-style models directory: checkpoints/, loras/, vae/ and embeddings/ inside it.
    /// Its files are the choices of `ckpt_name` and the like, listed on every catalogue read.
    #[arg(long, env = "WEFT_MODELS_DIR")]
    models_dir: Option<PathBuf>,
    /// Loaded model weights kept for later jobs, in MiB (shared by all jobs and tenants).
    #[arg(long, env = "WEFT_MODEL_CACHE_MIB", default_value_t = DiffusionConfig::DEFAULT_MODEL_CACHE_MIB)]
    model_cache_mib: u64,
    /// General MIDI SoundFont (.sf2) for video-to-music.
    #[arg(long, env = "WEFT_V2M_SOUNDFONT", default_value = weft_v2m::DEFAULT_SOUNDFONT)]
    v2m_soundfont: PathBuf,
    /// Largest video accepted by video-to-music, in bytes.
    #[arg(long, env = "WEFT_V2M_MAX_UPLOAD_BYTES", default_value_t = weft_v2m::DEFAULT_MAX_UPLOAD_BYTES)]
    v2m_max_upload_bytes: u64,
    /// Longest video accepted by video-to-music, in seconds.
    #[arg(long, env = "WEFT_V2M_MAX_DURATION_SECS", default_value_t = weft_v2m::DEFAULT_MAX_DURATION_SECS)]
    v2m_max_duration_secs: u64,
    /// Most streams (`copies`) one video-to-music request may ask for.
    #[arg(long, env = "WEFT_V2M_MAX_COPIES", default_value_t = weft_v2m::DEFAULT_MAX_COPIES)]
    v2m_max_copies: u32,
    /// A host that video-to-music `video` URLs may name. Repeatable; none means no URLs.
    #[arg(long = "v2m-allow-url-host", env = "WEFT_V2M_ALLOW_URL_HOSTS", value_delimiter = ',')]
    v2m_allow_url_hosts: Vec<String>,
    /// Let video-to-music URLs reach loopback, private and link-local addresses.
    #[arg(long, env = "WEFT_V2M_ALLOW_PRIVATE_URLS")]
    v2m_allow_private_urls: bool,
    /// PEM file of extra certificates to trust for https video URLs (on top of the built-in
    /// Mozilla roots).
    #[arg(long, env = "WEFT_V2M_URL_CA_FILE")]
    v2m_url_ca_file: Option<PathBuf>,
    /// Longest a video-to-music URL download may take in all, in seconds; a server that
    /// trickles its bytes is cut off then.
    #[arg(long, env = "WEFT_V2M_URL_TIMEOUT_SECS", default_value_t = V2mSettings::default().url_timeout.as_secs())]
    v2m_url_timeout_secs: u64,
}

/// Prepends the settings of `--config FILE` as flags, so real flags and env vars win.
fn args_with_config_file() -> anyhow::Result<Vec<String>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--config=").map(String::from)))
        .or_else(|| std::env::var("WEFT_CONFIG").ok());
    let Some(path) = path else { return Ok(args) };
    if args.get(1).map(String::as_str) != Some("serve") {
        return Ok(args);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("cannot read config file {path}: {e}"))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| anyhow::anyhow!("config file {path} is not valid TOML: {e}"))?;
    let mut injected = vec![args[0].clone(), args[1].clone()];
    for (key, value) in table {
        let env = format!("WEFT_{}", key.replace('-', "_").to_uppercase());
        if std::env::var_os(&env).is_some() {
            continue;
        }
        let values = match value {
            toml::Value::Array(items) => items,
            other => vec![other],
        };
        for value in values {
            let text = match value {
                toml::Value::String(s) => s,
                toml::Value::Boolean(true) => {
                    injected.push(format!("--{key}"));
                    continue;
                }
                toml::Value::Boolean(false) => continue,
                other => other.to_string(),
            };
            injected.push(format!("--{key}={text}"));
        }
    }
    injected.extend(args.into_iter().skip(2));
    Ok(injected)
}

/// The limits node calls run under, from `weft serve`'s flags.
fn limits(args: &ServeArgs) -> Limits {
    Limits {
        node_timeout: Duration::from_millis(args.node_timeout_ms),
        memory_bytes: args.node_memory_mib << 20,
        hostcall_bytes: args.hostcall_mib << 20,
        log_bytes: args.log_kib << 10,
        job_memory_bytes: args.job_memory_mib << 20,
        host_memory_bytes: args.host_memory_mib.map_or_else(default_host_memory, |mib| mib << 20),
        ..Limits::default()
    }
}

fn grants(list: &[String]) -> anyhow::Result<HashMap<String, Capabilities>> {
    let mut grants: HashMap<String, Capabilities> = HashMap::new();
    for item in list {
        let (plugin, grant) = item
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--grant {item:?}: expected PLUGIN=CAPABILITY"))?;
        grants
            .entry(plugin.to_string())
            .or_default()
            .add_grant(grant)
            .map_err(anyhow::Error::msg)?;
    }
    Ok(grants)
}

/// The authentication `--auth` and `--token` ask for. A token alone means token auth: a
/// server given a token is never left open. A token with `--auth none` or `keys` is refused,
/// since one of the two settings would be silently ignored.
fn auth_mode(auth: Option<&str>, token: Option<&str>) -> anyhow::Result<AuthMode> {
    let token = token.filter(|t| !t.is_empty());
    match (auth, token) {
        (None, None) | (Some("none"), None) => Ok(AuthMode::None),
        (None | Some("token"), Some(token)) => Ok(AuthMode::Token(token.to_string())),
        (Some("token"), None) => anyhow::bail!("--auth token needs --token"),
        (Some("keys"), None) => Ok(AuthMode::Keys),
        (Some(other), Some(_)) => {
            anyhow::bail!("--token is given with --auth {other}; use --auth token (or drop --token)")
        }
        (Some(other), None) => anyhow::bail!("unknown --auth {other}"),
    }
}

/// `--public-url`, checked (see [`origin`]).
fn public_url(value: Option<&str>) -> anyhow::Result<Option<String>> {
    value
        .filter(|v| !v.is_empty())
        .map(|v| origin("--public-url", v))
        .transpose()
}

/// An origin given to `flag`, checked (`http` or `https`, a host, no path beyond `/`, no
/// query) and written as a browser writes it in `Origin` (no default port, no `/`).
fn origin(flag: &str, value: &str) -> anyhow::Result<String> {
    let url = url::Url::parse(value).map_err(|e| anyhow::anyhow!("{flag} {value:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https")
        || url.host_str().is_none()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || !url.username().is_empty()
    {
        anyhow::bail!("{flag} {value:?} must be http(s)://host[:port], without a path or query");
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// The settings `weft serve` runs with, from its flags.
/// Parses `--precision`.
fn parse_precision(text: &str) -> Result<weft_compute::device::Precision, String> {
    weft_compute::device::Precision::parse(text)
        .ok_or_else(|| format!("{text:?}: expected float32, float16 or bfloat16"))
}

fn serve_config(args: ServeArgs) -> anyhow::Result<ServeConfig> {
    weft_compute::device::request_precision(args.precision);
    let auth = auth_mode(args.auth.as_deref(), args.token.as_deref())?;
    if auth == AuthMode::None && !args.addr.ip().is_loopback() && !args.allow_unauthenticated {
        anyhow::bail!(
            "refusing to listen on {} without authentication: use --auth token/keys, or pass --allow-unauthenticated",
            args.addr
        );
    }
    if !args.mount_prefix.is_empty() && !args.mount_prefix.starts_with('/') {
        anyhow::bail!("--mount-prefix must start with /");
    }
    let database = Database::parse(args.database.as_deref(), &args.data_dir);
    if args.role != Role::All && !matches!(database, Database::Postgres(_)) {
        anyhow::bail!("--role api and --role worker need a shared database: pass --database postgres://...");
    }
    // In this order, so that of several wrong flags the same one is reported as before.
    let blob_dir = match &args.blob_dir {
        Some(text) => BlobLocation::parse(text)?,
        None => ServeConfig::default_blob_dir(&args.data_dir),
    };
    let jobs = jobs_config(&args, &auth);
    let api = api_config(&args, auth)?;
    let runtime = runtime_config(&args)?;
    Ok(ServeConfig {
        addr: args.addr,
        blob_dir,
        database,
        role: args.role,
        operator_addr: args.operator_addr,
        lease: Duration::from_secs(args.lease_secs.max(1)),
        shutdown_grace: Duration::from_secs(args.shutdown_grace_secs),
        sweep_interval: Duration::from_secs(args.sweep_interval_secs.max(1)),
        watch_plugins: args.watch,
        initial_credits: args.initial_credits,
        link_ttl: ServeConfig::LINK_TTL,
        data_dir: args.data_dir,
        api,
        jobs,
        runtime,
    })
}

/// The share of a server-wide cap one tenant may take: half of it under `--auth keys`,
/// the only mode with more than one tenant to share between, all of it otherwise.
fn tenant_share(auth: &AuthMode, cap: usize) -> usize {
    if *auth == AuthMode::Keys {
        cap / 2
    } else {
        cap
    }
}

/// The HTTP surface's settings from `weft serve`'s flags.
fn api_config(args: &ServeArgs, auth: AuthMode) -> anyhow::Result<ApiConfig> {
    let tenant_max_streams = args
        .tenant_max_streams
        .unwrap_or(tenant_share(&auth, args.max_streams))
        .max(1);
    Ok(ApiConfig {
        surface: args.surface,
        public_demo: args.public_demo,
        mount_prefix: args.mount_prefix.clone(),
        max_upload_bytes: args.max_upload_bytes,
        max_json_bytes: ApiConfig::MAX_JSON_BYTES,
        json_parse_budget_bytes: args.json_parse_budget_mib << 20,
        max_streams: args.max_streams,
        tenant_max_streams,
        public_url: public_url(args.public_url.as_deref())?,
        allowed_origins: args
            .allowed_origins
            .iter()
            .map(|o| origin("--allowed-origin", o))
            .collect::<anyhow::Result<_>>()?,
        admin_token: args.admin_token.clone(),
        comfyui_frontend: args.comfyui_frontend.clone(),
        v2m: V2mSettings {
            soundfont: args.v2m_soundfont.clone(),
            max_upload_bytes: args.v2m_max_upload_bytes,
            max_duration_secs: args.v2m_max_duration_secs,
            max_copies: args.v2m_max_copies.max(1),
            allow_url_hosts: args.v2m_allow_url_hosts.clone(),
            allow_private_urls: args.v2m_allow_private_urls,
            url_ca_file: args.v2m_url_ca_file.clone(),
            url_timeout: Duration::from_secs(args.v2m_url_timeout_secs.max(1)),
        },
        auth,
    })
}

/// The job service's settings from `weft serve`'s flags.
fn jobs_config(args: &ServeArgs, auth: &AuthMode) -> JobsConfig {
    let paid = args.surface != Surface::SelfHosted;
    JobsConfig {
        workers: args.workers.max(1),
        queue_depth: args.queue_depth.max(1),
        tenant_queue_depth: args
            .tenant_queue_depth
            .unwrap_or(tenant_share(auth, args.queue_depth))
            .max(1),
        retention: Duration::from_secs(args.retention_secs),
        expired_grace: Duration::from_secs(args.expired_grace_secs),
        preview_retention: args.preview_retention_secs.map(Duration::from_secs),
        cache_bytes: args.cache_mib << 20,
        cache_idle: Duration::from_secs(args.cache_idle_secs),
        capture_logs: args.surface == Surface::Serverless,
        job_cost: if paid { args.job_cost.max(0) } else { 0 },
        max_outputs: args.max_job_outputs.max(1),
        max_output_bytes: args.max_job_output_mib.max(1) << 20,
        inline_output_bytes: args.inline_output_kib.min(JobsConfig::MAX_INLINE_OUTPUT_KIB) << 10,
    }
}

/// The plugin runtime's settings from `weft serve`'s flags.
fn runtime_config(args: &ServeArgs) -> anyhow::Result<RuntimeConfig> {
    Ok(RuntimeConfig {
        limits: limits(args),
        cache_dir: args.compile_cache.clone(),
        plugins_dir: args.plugins_dir.clone(),
        grants: grants(&args.grants)?,
        capabilities: capabilities(DiffusionConfig {
            models_dir: args.models_dir.clone(),
            model_cache_bytes: args.model_cache_mib << 20,
        }),
        concurrent_calls: 0,
        plugin_load_timeout: Duration::from_millis(args.plugin_load_timeout_ms.max(1)),
    })
}

/// The host capabilities' configuration, with the models library `diffusion` describes.
fn capabilities(diffusion: DiffusionConfig) -> CapabilityConfig {
    CapabilityConfig {
        diffusion: Arc::new(ModelLibrary::new(&diffusion)),
        ..Default::default()
    }
}

/// The settings `weft run` without `--server` starts its in-process server with: `weft
/// serve`'s defaults and WEFT_* environment, a free loopback port, no authentication, and
/// `data_dir`.
fn embedded_serve_config(data_dir: &std::path::Path) -> anyhow::Result<ServeConfig> {
    let data_dir = data_dir.to_string_lossy().into_owned();
    let cli = Cli::try_parse_from([
        "weft",
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--auth",
        "none",
        "--data-dir",
        &data_dir,
    ])?;
    match cli.command {
        Command::Serve(args) => serve_config(*args),
        _ => anyhow::bail!("the in-process server's settings did not parse"),
    }
}

fn print_nodes(
    plugins_dir: Option<PathBuf>,
    models_dir: Option<PathBuf>,
    json: bool,
    plugin_load_timeout: Duration,
) -> anyhow::Result<()> {
    let runtime = Runtime::load(RuntimeConfig {
        plugins_dir,
        plugin_load_timeout,
        capabilities: capabilities(DiffusionConfig {
            models_dir,
            ..Default::default()
        }),
        ..RuntimeConfig::default()
    })?;
    let catalog = runtime.catalog();
    for refused in runtime.refused() {
        eprintln!(
            "refused plugin {} ({}): {}",
            refused.name, refused.origin, refused.reason
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&catalog.object_info())?);
        return Ok(());
    }
    for def in catalog.iter() {
        let inputs: Vec<String> = def
            .inputs
            .iter()
            .map(|i| format!("{}{}: {}", i.name, if i.required { "" } else { "?" }, i.type_name))
            .collect();
        let outputs: Vec<&str> = def.outputs.iter().map(|o| o.type_name.as_str()).collect();
        let flag = if def.output_node { " [output]" } else { "" };
        println!(
            "{:<22} {:<16} ({}) -> ({}){flag}",
            def.class_type,
            def.category,
            inputs.join(", "),
            outputs.join(", ")
        );
    }
    println!(
        "{} classes from {} plugins ({} refused)",
        catalog.len(),
        runtime.plugins().count(),
        runtime.refused().len()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse_from(args_with_config_file()?);
    // The client commands print for people: only warnings from the library.
    let default_filter = match cli.command {
        Command::Client(_) => "warn",
        _ => "info,wasmtime=warn,cranelift=warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEFT_LOG").unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: a log file or collector gets plain lines.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A worker that parks after the server went idle hands its free memory back
        // (`weft_allocator::release_on_every_thread` asks; otherwise one atomic load).
        .on_thread_park(weft_allocator::release_if_asked)
        .build()?;
    match cli.command {
        Command::Client(command) => {
            let code = command.run(&runtime);
            runtime.shutdown_timeout(Duration::from_secs(1));
            std::process::exit(code);
        }
        Command::Serve(args) => {
            let config = serve_config(*args)?;
            let served = runtime.block_on(serve::run(config));
            // The jobs have drained: a blocking call still in flight is not waited for.
            runtime.shutdown_timeout(Duration::from_secs(1));
            served
        }
        Command::Nodes {
            plugins_dir,
            models_dir,
            json,
            plugin_load_timeout_ms,
        } => print_nodes(
            plugins_dir,
            models_dir,
            json,
            Duration::from_millis(plugin_load_timeout_ms.max(1)),
        ),
        Command::Keys {
            command: KeysCommand::Create { store, tenant },
        } => runtime.block_on(async {
            let store = serve::open_store(&store.database()).await?;
            store.ensure_tenant(&tenant, 0).await?;
            let key = weft::api::auth::new_key();
            store.add_api_key(&tenant, &weft::api::auth::hash_key(&key)).await?;
            println!("created an API key for tenant {tenant}; it is shown once:");
            println!("{key}");
            Ok(())
        }),
        Command::Dev {
            command: DevCommand::CheckVectors { file },
        } => {
            let report = weft_compute::sampling::check_vectors(&file)?;
            print!("{report}");
            if !report.all_passed() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Models { command } => command.run(),
        Command::Plugin { command } => {
            if !command.run()? {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::ComfyuiFrontend { command } => command.run(),
        Command::Db {
            command: DbCommand::Migrate { store },
        } => runtime.block_on(async {
            let version = store
                .database()
                .migrate()
                .await
                .map_err(|e| anyhow::anyhow!("migrating the database: {e}"))?;
            println!("the database schema is at version {version}");
            Ok(())
        }),
        Command::Credits {
            command: CreditsCommand::Add { store, tenant, amount },
        } => runtime.block_on(async {
            let store = serve::open_store(&store.database()).await?;
            let balance = store.add_credits(&tenant, amount).await?;
            println!("{balance}");
            Ok(())
        }),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;

    /// `weft serve`'s flags as `args` give them, with every `WEFT_*` variable ignored.
    fn serve_args_without_env(args: &[&str]) -> ServeArgs {
        let command = Cli::command().mut_subcommand("serve", |serve| serve.mut_args(|arg| arg.env(None::<&str>)));
        let cli = Cli::from_arg_matches(&command.try_get_matches_from(args).unwrap()).unwrap();
        match cli.command {
            Command::Serve(args) => *args,
            _ => unreachable!("parsed `weft serve`"),
        }
    }

    #[test]
    fn serve_without_flags_runs_with_the_default_configuration() {
        let config = serve_config(serve_args_without_env(&["weft", "serve"])).unwrap();
        let default = ServeConfig::default();
        assert_eq!(config.jobs, default.jobs);
        assert_eq!(config.runtime.limits, default.runtime.limits);
        assert_eq!(
            config.runtime.capabilities.diffusion.config(),
            default.runtime.capabilities.diffusion.config()
        );
        // Every field, down to the last: the configurations print all of theirs.
        assert_eq!(format!("{config:#?}"), format!("{default:#?}"));
    }
}
