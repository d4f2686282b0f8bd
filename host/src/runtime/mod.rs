//! The wasm runtime: one engine, the loaded plugins and their node catalogue, and node
//! invocation under limits in a fresh store per call.
//!
//! Public face: [`Runtime`] (load, catalogue, [`Runtime::call`]), [`RuntimeConfig`],
//! [`Limits`], [`CallContext`] and the value types.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use wasmtime::component::Linker;
use wasmtime::Engine;

mod bindings;
mod builtin;
mod call;
mod capabilities;
mod catalog;
mod engine;
mod invoke;
mod limits;
mod logs;
mod memory;
mod registry;
mod value;
mod worlds;

pub use call::{AssetReader, CallContext, CancelToken, ProgressSink};
pub use capabilities::diffusion::{DiffusionConfig, Library as ModelLibrary};
pub use capabilities::{Capabilities, CapabilityConfig, MusicConfig};
pub use catalog::{Catalog, InputSpec, NodeDef, OutputSpec};
pub use invoke::{NodeFailure, NodeOutput};
pub use limits::{default_host_memory, Limits};
pub use logs::{LogSnapshot, TailLog};
pub use memory::{Held, HostMemory, JobMemory, MemoryLimit};
pub use registry::{Manifest, PluginSource};
pub use value::{AssetRef, FileData, OutputFile, OutputKind, Value};

use registry::LoadedPlugin;

/// How to build a [`Runtime`].
#[derive(Debug, Clone, Default)]
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
    /// Most node calls that run at once (sizes the instance pool).
    pub concurrent_calls: u32,
}

/// The loaded plugins and the machinery to call them.
pub struct Runtime {
    engine: Engine,
    plugins: Vec<LoadedPlugin>,
    catalog: Catalog,
    limits: Limits,
    capabilities: CapabilityConfig,
    host_memory: Arc<HostMemory>,
    _ticker: engine::EpochTicker,
}

impl Runtime {
    /// Loads the built-in plugins and those of `config.plugins_dir`, calls each one's
    /// `describe()` once, and builds the catalogue. Two plugins defining one class is an
    /// error that names both.
    pub fn load(config: RuntimeConfig) -> anyhow::Result<Arc<Self>> {
        let mut sources = builtin::sources();
        if let Some(dir) = &config.plugins_dir {
            sources.extend(registry::scan_dir(dir)?);
        }
        Self::from_sources(config, sources)
    }

    /// Like [`load`](Self::load), from explicit sources (no built-ins unless included).
    pub fn from_sources(config: RuntimeConfig, sources: Vec<PluginSource>) -> anyhow::Result<Arc<Self>> {
        let engine = engine::build(&config.limits, config.concurrent_calls.saturating_mul(2).max(8))?;
        let ticker = engine::EpochTicker::start(&engine);
        let mut linker = Linker::new(&engine);
        capabilities::link_all(&mut linker)?;
        let mut runtime = Runtime {
            engine,
            plugins: Vec::new(),
            catalog: Catalog::default(),
            limits: config.limits.clone(),
            capabilities: config.capabilities.clone(),
            host_memory: HostMemory::new(config.limits.host_memory_bytes),
            _ticker: ticker,
        };
        let compiled = compile_all(&runtime.engine, &sources, config.cache_dir.as_deref())?;
        for (source, component) in sources.into_iter().zip(compiled) {
            let pre = registry::prelink(&runtime.engine, &linker, &component)
                .map_err(|e| anyhow::anyhow!("plugin {} ({}) cannot be linked: {e:#}", source.name, source.origin))?;
            let granted = config.grants.get(&source.name).cloned().unwrap_or_default();
            let mut plugin = LoadedPlugin {
                grants: source.manifest.capabilities.intersect(&granted),
                name: source.name,
                origin: source.origin,
                pre,
                nodes: Vec::new(),
            };
            plugin.nodes = runtime.describe(&plugin)?;
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
            runtime.plugins.push(plugin);
        }
        Ok(Arc::new(runtime))
    }

    /// The node catalogue, with the choices of model-file combos (`ckpt_name`, ...) listed
    /// from the models folder now, so a new file shows up without a restart.
    pub fn catalog(&self) -> Cow<'_, Catalog> {
        self.catalog
            .with_model_files(|folder| self.capabilities.diffusion.list(folder))
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

    /// Names and origins of the loaded plugins.
    pub fn plugins(&self) -> impl Iterator<Item = (&str, &str)> {
        self.plugins.iter().map(|p| (p.name.as_str(), p.origin.as_str()))
    }

    fn plugin_for(&self, class: &str) -> Option<&LoadedPlugin> {
        self.catalog.plugin_of(class).map(|i| &self.plugins[i])
    }

    /// Calls the plugin's `describe()` in a fresh store, under the usual limits.
    fn describe(&self, plugin: &LoadedPlugin) -> anyhow::Result<Vec<NodeDef>> {
        struct Discard;
        impl ProgressSink for Discard {
            fn report(&self, _: u32, _: u32, _: Option<String>) {}
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
        plugin
            .pre
            .describe(&mut store, &plugin.name)
            .map_err(|e| anyhow::anyhow!("plugin {} ({}): describe() failed: {e:#}", plugin.name, plugin.origin))
    }
}

/// Compiles every source, in parallel across the machine's cores.
fn compile_all(
    engine: &Engine,
    sources: &[PluginSource],
    cache_dir: Option<&std::path::Path>,
) -> anyhow::Result<Vec<wasmtime::component::Component>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = sources
            .iter()
            .map(|source| {
                scope.spawn(move || {
                    registry::compile(engine, &source.bytes, cache_dir).map_err(|e| {
                        anyhow::anyhow!(
                            "plugin {} ({}) is not a valid component: {e:#}",
                            source.name,
                            source.origin
                        )
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("compile thread panicked"))
            .collect()
    })
}
