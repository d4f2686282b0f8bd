//! Plugins: where components come from, what they may reach, and their compiled form.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use wasmtime::component::{Component, Linker};
use wasmtime::Engine;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::capabilities::CallState;
use super::catalog::NodeDef;
use super::worlds::PluginPre;

/// A component to load, and what its manifest asks for.
#[derive(Debug, Clone)]
pub struct PluginSource {
    /// Plugin name: the file stem, or the built-in's name.
    pub name: String,
    /// Where it came from, for messages.
    pub origin: String,
    /// The component bytes.
    pub bytes: Vec<u8>,
    /// What the plugin asks for.
    pub manifest: Manifest,
}

/// A plugin's manifest: `<name>.toml` next to `<name>.wasm`. Everything defaults to off.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Capabilities the plugin asks for.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// Sandbox capabilities: asked for by a manifest, granted by the operator. A plugin gets
/// what both name.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Environment variables it may read.
    #[serde(default)]
    pub env: Vec<String>,
    /// Host directories it may read, each preopened read-only at the same path.
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
    /// Outbound network access.
    #[serde(default)]
    pub network: bool,
}

impl Capabilities {
    /// What both `self` (asked) and `granted` name.
    pub fn intersect(&self, granted: &Capabilities) -> Capabilities {
        Capabilities {
            env: self.env.iter().filter(|e| granted.env.contains(e)).cloned().collect(),
            dirs: self.dirs.iter().filter(|d| granted.dirs.contains(d)).cloned().collect(),
            network: self.network && granted.network,
        }
    }

    /// Parses one operator grant: `env:NAME`, `dir:/path` or `network`.
    pub fn add_grant(&mut self, grant: &str) -> Result<(), String> {
        match grant.split_once(':') {
            Some(("env", name)) if !name.is_empty() => self.env.push(name.to_string()),
            Some(("dir", path)) if !path.is_empty() => self.dirs.push(PathBuf::from(path)),
            None if grant == "network" => self.network = true,
            _ => {
                return Err(format!(
                    "unknown grant {grant:?}; expected env:NAME, dir:/path or network"
                ))
            }
        }
        Ok(())
    }

    /// Opens these capabilities in a guest's WASI context. With none, the guest has no
    /// files, no network, no environment and no arguments.
    pub(super) fn apply(&self, wasi: &mut WasiCtxBuilder) {
        for name in &self.env {
            if let Ok(value) = std::env::var(name) {
                wasi.env(name, value);
            }
        }
        for dir in &self.dirs {
            if let Err(e) = wasi.preopened_dir(dir, dir.to_string_lossy(), FsPerms::ReadOnly) {
                tracing::warn!(dir = %dir.display(), error = %e, "granted directory cannot be opened");
            }
        }
        if self.network {
            wasi.inherit_network().allow_ip_name_lookup(true);
        }
    }
}

/// A loaded plugin, ready to instantiate.
pub struct LoadedPlugin {
    /// Plugin name.
    pub name: String,
    /// Where it came from.
    pub origin: String,
    /// Pre-linked instance, for the contract version it was built against: instantiation
    /// per call is cheap.
    pub pre: PluginPre,
    /// What this plugin was granted.
    pub grants: Capabilities,
    /// Its node classes.
    pub nodes: Vec<NodeDef>,
}

/// Lists the plugins of `dir`: each `*.wasm` with its optional `<stem>.toml` manifest.
pub fn scan_dir(dir: &Path) -> anyhow::Result<Vec<PluginSource>> {
    let mut sources = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read plugins dir {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let manifest_path = path.with_extension("toml");
        let manifest = if manifest_path.exists() {
            let text = std::fs::read_to_string(&manifest_path)?;
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("bad manifest {}: {e}", manifest_path.display()))?
        } else {
            Manifest::default()
        };
        let bytes = std::fs::read(&path)?;
        sources.push(PluginSource {
            name,
            origin: path.display().to_string(),
            bytes,
            manifest,
        });
    }
    Ok(sources)
}

/// Compiles `bytes`, through the precompiled-code cache in `cache_dir` when given. The cache
/// key is the blake3 of the component plus the engine's compatibility hash, and only files
/// this server wrote (atomically, in its own data dir) are ever deserialized.
pub(super) fn compile(engine: &Engine, bytes: &[u8], cache_dir: Option<&Path>) -> anyhow::Result<Component> {
    let Some(cache_dir) = cache_dir else {
        return Ok(Component::new(engine, bytes)?);
    };
    use std::hash::{Hash, Hasher};
    let mut compat = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut compat);
    let key = format!("{}-{:016x}.cwasm", blake3::hash(bytes).to_hex(), compat.finish());
    let path = cache_dir.join(key);
    if path.exists() {
        // SAFETY: the file is in this server's own cache directory, was written by
        // `Engine::precompile_component` below and renamed into place atomically, and its
        // name binds it to these exact component bytes and this engine's configuration.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "discarding unusable cached component"),
        }
    }
    let compiled = engine.precompile_component(bytes)?;
    std::fs::create_dir_all(cache_dir)?;
    let tmp = cache_dir.join(format!(".tmp-{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, &compiled)?;
    std::fs::rename(&tmp, &path)?;
    // SAFETY: these bytes were produced by this engine just above.
    Ok(unsafe { Component::deserialize(engine, &compiled)? })
}

/// Pre-links `component` against every capability of the contract version it targets.
pub(super) fn prelink(
    engine: &Engine,
    linker: &Linker<CallState>,
    component: &Component,
) -> anyhow::Result<PluginPre> {
    PluginPre::new(engine, linker, component)
}
