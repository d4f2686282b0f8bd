//! The wasm runtime: one engine, the loaded plugins and their node catalogue, and node
//! invocation under limits in a fresh store per call.
//!
//! Public face: [`Runtime`] (load, catalogue, [`Runtime::call`]), [`RuntimeConfig`],
//! [`Limits`], [`CallContext`] and the value types.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

use capabilities::CallState;
mod bindings;
mod builtin;
mod call;
mod capabilities;
pub(crate) mod catalog;
mod engine;
mod guest_text;
mod inspect;
mod invoke;
mod limits;
mod logs;
mod memory;
mod registry;
mod reload;
mod value;
pub(crate) mod worlds;

pub use call::{AssetReader, CallContext, CancelToken, ProgressSink};
pub use capabilities::diffusion::{DiffusionConfig, Library as ModelLibrary};
pub use capabilities::{Capabilities, CapabilityConfig, MusicConfig};
pub use catalog::{Catalog, InputSpec, NodeDef, OutputSpec};
pub use inspect::PluginReport;
pub use limits::{default_host_memory, Limits};
pub use logs::{LogSnapshot, TailLog};
pub use memory::{Held, HostMemory, JobMemory, MemoryLimit};
pub use registry::{read_source, Manifest, PluginSource};
pub use value::{AssetRef, FileData, NodeFailure, NodeOutput, OutputFile, OutputKind, Value};

use registry::LoadedPlugin;

/// How to build a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Limits for every call.
    pub limits: Limits,
    /// Where compiled components are cached (`<data-dir>/cache`); none compiles every start.
    pub cache_dir: Option<PathBuf>,
    /// Extra plugins: every `*.wasm` here.
    pub plugins_dir: Option<PathBuf>,
    /// Operator grants, by plugin name.
    pub grants: HashMap<String, Capabilities>,
    /// How each host capability is configured.
    pub capabilities: CapabilityConfig,
    /// Most node calls that run at once, across all jobs: sizes the instance pool and the
    /// permits of [`Runtime::call_permits`] (`weft serve` sets it from `--workers`).
    pub concurrent_calls: u32,
    /// Time one plugin's `describe()` may take at start-up; zero means the node timeout.
    pub plugin_load_timeout: Duration,
}

impl RuntimeConfig {
    /// The default of [`plugin_load_timeout`](Self::plugin_load_timeout), in milliseconds
    /// (`--plugin-load-timeout-ms`).
    pub const DEFAULT_PLUGIN_LOAD_TIMEOUT_MS: u64 = 10_000;
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            cache_dir: None,
            plugins_dir: None,
            grants: HashMap::new(),
            capabilities: CapabilityConfig::default(),
            concurrent_calls: 0,
            plugin_load_timeout: Duration::from_millis(Self::DEFAULT_PLUGIN_LOAD_TIMEOUT_MS),
        }
    }
}

/// A plugin that was not loaded, and why: the others serve without it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RefusedPlugin {
    /// Plugin name.
    pub name: String,
    /// Where it came from.
    pub origin: String,
    /// Why it was refused.
    pub reason: String,
}

/// The loaded plugins and the machinery to call them.
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<CallState>>,
    plugins: Vec<Arc<LoadedPlugin>>,
    catalog: Catalog,
    limits: Limits,
    capabilities: CapabilityConfig,
    refused: Vec<RefusedPlugin>,
    host_memory: Arc<HostMemory>,
    /// One permit per node call that may run at once, across all jobs
    /// ([`RuntimeConfig::concurrent_calls`], at least one); shared by reloaded runtimes.
    call_permits: Arc<tokio::sync::Semaphore>,
    /// What it was built from: the cache dir, grants and load timeout serve later reloads.
    config: RuntimeConfig,
    _ticker: Arc<engine::EpochTicker>,
}

impl Runtime {
    /// Loads the built-in plugins and those of `config.plugins_dir`, calls each one's
    /// `describe()` once (within `config.plugin_load_timeout`), and builds the catalogue.
    /// A plugin that cannot be read, compiled, linked or described in time, or that defines
    /// a class an earlier plugin defines, is refused as a whole and logged, and the others
    /// serve; [`refused`](Self::refused) lists it. Only an unusable plugins directory or
    /// engine is an error.
    pub fn load(config: RuntimeConfig) -> anyhow::Result<Arc<Self>> {
        let mut sources = builtin::sources();
        let mut unreadable = Vec::new();
        if let Some(dir) = &config.plugins_dir {
            let (found, refused) = registry::scan_dir(dir)?;
            sources.extend(found);
            unreadable = refused;
        }
        Self::build(config, sources, unreadable)
    }

    /// Like [`load`](Self::load), from explicit sources (no built-ins unless included).
    pub fn from_sources(config: RuntimeConfig, sources: Vec<PluginSource>) -> anyhow::Result<Arc<Self>> {
        Self::build(config, sources, Vec::new())
    }

    /// Loads `sources`; `unreadable` were refused before they could be read.
    fn build(
        config: RuntimeConfig,
        sources: Vec<PluginSource>,
        unreadable: Vec<RefusedPlugin>,
    ) -> anyhow::Result<Arc<Self>> {
        for plugin in &unreadable {
            tracing::error!(plugin = %plugin.name, origin = %plugin.origin, reason = %plugin.reason, "plugin refused");
        }
        let engine = engine::build(&config.limits, config.concurrent_calls.saturating_mul(2).max(8))?;
        let ticker = engine::EpochTicker::start(&engine);
        let mut linker = Linker::new(&engine);
        capabilities::link_all(&mut linker)?;
        let mut runtime = Runtime {
            engine,
            linker: Arc::new(linker),
            plugins: Vec::new(),
            catalog: Catalog::default(),
            limits: config.limits.clone(),
            capabilities: config.capabilities.clone(),
            refused: unreadable,
            host_memory: HostMemory::new(config.limits.host_memory_bytes),
            call_permits: Arc::new(tokio::sync::Semaphore::new(config.concurrent_calls.max(1) as usize)),
            config,
            _ticker: Arc::new(ticker),
        };
        let compiled = compile_all(&runtime.engine, &sources, runtime.config.cache_dir.as_deref());
        for (source, component) in sources.into_iter().zip(compiled) {
            let loaded = runtime.load_plugin(&source, component).and_then(|plugin| {
                runtime.catalog.check_new(&plugin.nodes).map_err(anyhow::Error::msg)?;
                Ok(plugin)
            });
            let plugin = match loaded {
                Ok(plugin) => plugin,
                Err(e) => {
                    let refused = RefusedPlugin {
                        name: source.name,
                        origin: source.origin,
                        reason: format!("{e:#}"),
                    };
                    tracing::error!(plugin = %refused.name, origin = %refused.origin, reason = %refused.reason, "plugin refused");
                    runtime.refused.push(refused);
                    continue;
                }
            };
            let index = runtime.plugins.len();
            for def in &plugin.nodes {
                runtime.catalog.insert(index, def.clone()).map_err(anyhow::Error::msg)?;
            }
            tracing::info!(
                plugin = %plugin.name,
                contract = plugin.pre.world().version(),
                classes = plugin.nodes.len(),
                "plugin loaded"
            );
            runtime.plugins.push(Arc::new(plugin));
        }
        Ok(Arc::new(runtime))
    }

    /// Links `source`'s compiled `component` and asks it to describe itself (within the
    /// load timeout): the plugin, ready to call, or why it cannot be loaded. The catalogue
    /// is not consulted.
    fn load_plugin(&self, source: &PluginSource, component: anyhow::Result<Component>) -> anyhow::Result<LoadedPlugin> {
        let component = component?;
        let pre = registry::prelink(&self.engine, &self.linker, &component)
            .map_err(|e| anyhow::anyhow!("cannot be linked: {e:#}"))?;
        let granted = self.config.grants.get(&source.name).cloned().unwrap_or_default();
        let mut plugin = LoadedPlugin {
            grants: source.manifest.capabilities.intersect(&granted),
            name: source.name.clone(),
            origin: source.origin.clone(),
            pre,
            nodes: Vec::new(),
        };
        plugin.nodes = self.describe(&plugin, self.describe_timeout())?;
        for def in &mut plugin.nodes {
            def.build.clone_from(&source.hash);
        }
        Ok(plugin)
    }

    /// Time a plugin's `describe()` may take.
    fn describe_timeout(&self) -> Duration {
        if self.config.plugin_load_timeout.is_zero() {
            self.limits.node_timeout
        } else {
            self.config.plugin_load_timeout
        }
    }

    /// The plugins that were refused at start-up, with the reason of each.
    pub fn refused(&self) -> &[RefusedPlugin] {
        &self.refused
    }

    /// The node catalogue, with the choices of model-file combos (`ckpt_name`, ...) listed
    /// from the models folder now, so a new file shows up without a restart.
    pub fn catalog(&self) -> Cow<'_, Catalog> {
        self.catalog
            .with_model_files(|folder| self.capabilities.diffusion.list(folder))
    }

    /// The catalogue as [`catalog`](Self::catalog) gives it, for validating `workflow` (an
    /// API-format graph): the model folders are listed only if one of its classes lists files.
    pub fn catalog_for(&self, workflow: &serde_json::Value) -> Cow<'_, Catalog> {
        let classes = workflow
            .as_object()
            .into_iter()
            .flat_map(|nodes| nodes.values())
            .filter_map(|node| node.get("class_type")?.as_str());
        self.catalog
            .with_model_files_for(classes, |folder| self.capabilities.diffusion.list(folder))
    }

    /// The files of models folder `folder` (for example `checkpoints`), listed now.
    pub fn model_files(&self, folder: &str) -> Vec<String> {
        self.capabilities.diffusion.list(folder)
    }

    /// The limits calls run under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A fresh budget of host-held values for one job ([`Limits::job_memory_bytes`]),
    /// drawing on the server's ([`Limits::host_memory_bytes`]).
    pub fn job_memory(&self) -> Arc<JobMemory> {
        self.host_memory.job(self.limits.job_memory_bytes)
    }

    /// The permits that bound how many node calls run at once, across all jobs and
    /// reloads: a job holds one for each node call it runs, until the call returns.
    pub fn call_permits(&self) -> &Arc<tokio::sync::Semaphore> {
        &self.call_permits
    }

    /// Names and origins of the loaded plugins.
    pub fn plugins(&self) -> impl Iterator<Item = (&str, &str)> {
        self.plugins.iter().map(|p| (p.name.as_str(), p.origin.as_str()))
    }

    fn plugin_for(&self, class: &str) -> Option<&LoadedPlugin> {
        self.catalog.plugin_of(class).map(|i| &*self.plugins[i])
    }

    /// Calls the plugin's `describe()` in a fresh store, under the usual limits but with
    /// `timeout` as its time limit.
    fn describe(&self, plugin: &LoadedPlugin, timeout: Duration) -> anyhow::Result<Vec<NodeDef>> {
        struct Discard;
        impl ProgressSink for Discard {
            fn report(&self, _: u32, _: u32, _: Option<String>) {}
            fn preview(&self, _: &'static str, _: Vec<u8>) {}
        }
        impl AssetReader for Discard {
            fn read(&self, _: &AssetRef) -> Result<Vec<u8>, String> {
                Err("assets are not available while a plugin describes itself".into())
            }
        }
        let ctx = CallContext {
            log: TailLog::new(self.limits.log_bytes),
            cancel: CancelToken::new(),
            progress: Arc::new(Discard),
            assets: Arc::new(Discard),
            memory: JobMemory::unlimited(),
        };
        let mut store = self.new_store(plugin, &ctx);
        let deadline = Instant::now() + timeout;
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                return Err(call::Interrupt::Timeout.into());
            }
            Ok(wasmtime::UpdateDeadline::Continue(1))
        });
        plugin.pre.describe(&mut store, &plugin.name).map_err(|e| {
            if e.downcast_ref::<call::Interrupt>().is_some() {
                anyhow::anyhow!("describe() did not return within {} ms", timeout.as_millis())
            } else {
                anyhow::anyhow!("describe() failed: {e:#}")
            }
        })
    }
}

/// Compiles every source, in parallel across the machine's cores.
fn compile_all(
    engine: &Engine,
    sources: &[PluginSource],
    cache_dir: Option<&std::path::Path>,
) -> Vec<anyhow::Result<wasmtime::component::Component>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|source| {
                scope.spawn(move || {
                    registry::compile(engine, source, cache_dir)
                        .map_err(|e| anyhow::anyhow!("is not a valid component: {e:#}"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("compiling it panicked")))
            })
            .collect()
    })
}
