//! Plugins: where components come from, what they may reach, and their compiled form.

use std::path::Path;

use serde::Deserialize;
use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

use super::capabilities::{CallState, Capabilities};
use super::catalog::NodeDef;
use super::worlds::PluginPre;
use super::RefusedPlugin;

/// A component to load, and what its manifest asks for.
#[derive(Debug, Clone)]
pub struct PluginSource {
    /// Plugin name: the file stem, or the built-in's name.
    pub name: String,
    /// Where it came from, for messages.
    pub origin: String,
    /// The component bytes.
    pub bytes: std::borrow::Cow<'static, [u8]>,
    /// Their blake3, in hex: the compiled-code cache's key and the nodes' `build`.
    pub hash: String,
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

/// A loaded plugin, ready to instantiate.
pub(crate) struct LoadedPlugin {
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

/// Lists the plugins of `dir`: each `*.wasm` with its optional `<stem>.toml` manifest, and
/// those refused because they or their manifests cannot be read.
pub(crate) fn scan_dir(dir: &Path) -> anyhow::Result<(Vec<PluginSource>, Vec<RefusedPlugin>)> {
    let mut sources = Vec::new();
    let mut refused = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read plugins dir {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wasm"))
        .collect();
    entries.sort();
    for path in entries {
        match read_source(&path) {
            Ok(source) => sources.push(source),
            Err(reason) => refused.push(RefusedPlugin {
                name: plugin_name(&path),
                origin: path.display().to_string(),
                reason,
            }),
        }
    }
    Ok((sources, refused))
}

/// The name of the plugin at `path`: its file stem.
fn plugin_name(path: &Path) -> String {
    path.file_stem().unwrap_or_default().to_string_lossy().into_owned()
}

/// Largest plugin component read (the JavaScript example, with its engine, is about 12 MB).
pub(super) const MAX_PLUGIN_BYTES: u64 = 256 * 1024 * 1024;

/// Largest plugin manifest read.
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

/// The bytes of `path`, or a message when it cannot be read or holds more than `max` bytes
/// (checked while reading, so a file that grows meanwhile is refused too).
fn read_capped(path: &Path, what: &str, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "{what} {} is larger than {} MiB",
            path.display(),
            max / (1024 * 1024)
        ));
    }
    Ok(bytes)
}

/// The plugin at `path` (a `.wasm` file) with its manifest (`<stem>.toml` beside it,
/// optional), named by its file stem; a message when either cannot be read or is larger
/// than its cap ([`MAX_PLUGIN_BYTES`]).
pub fn read_source(path: &Path) -> Result<PluginSource, String> {
    let manifest_path = path.with_extension("toml");
    let manifest = if manifest_path.exists() {
        let bytes = read_capped(&manifest_path, "manifest", MAX_MANIFEST_BYTES)?;
        let text =
            String::from_utf8(bytes).map_err(|_| format!("manifest {} is not UTF-8", manifest_path.display()))?;
        toml::from_str(&text).map_err(|e| format!("bad manifest {}: {e}", manifest_path.display()))?
    } else {
        Manifest::default()
    };
    let bytes = read_capped(path, "plugin", MAX_PLUGIN_BYTES)?;
    Ok(PluginSource {
        name: plugin_name(path),
        origin: path.display().to_string(),
        hash: blake3::hash(&bytes).to_hex().to_string(),
        bytes: bytes.into(),
        manifest,
    })
}

/// Compiles `source`, through the precompiled-code cache in `cache_dir` when given. The
/// cache key is the blake3 of the component plus the engine's compatibility hash, and only
/// files a server wrote (atomically, in its data dir or the operator's `--compile-cache`)
/// are ever deserialized.
pub(super) fn compile(engine: &Engine, source: &PluginSource, cache_dir: Option<&Path>) -> anyhow::Result<Component> {
    let bytes = &source.bytes[..];
    let Some(cache_dir) = cache_dir else {
        return Ok(Component::new(engine, bytes)?);
    };
    use std::hash::{Hash, Hasher};
    let mut compat = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut compat);
    let key = format!("{}-{:016x}.cwasm", source.hash, compat.finish());
    let path = cache_dir.join(key);
    if path.exists() {
        // SAFETY: the file is in the operator's cache directory, was written by
        // `Engine::precompile_component` below and renamed into place atomically, and its
        // name binds it to these exact component bytes and this engine's configuration.
        match unsafe { Component::deserialize_file(engine, &path) } {
            Ok(component) => return Ok(component),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "discarding unusable cached component"),
        }
    }
    let compiled = engine.precompile_component(bytes);
    // Compiling frees tens of MiB on this thread and on the compiler's pool (wasmtime's
    // parallel compilation), which the allocator would otherwise keep while the server idles.
    rayon::broadcast(|_| weft_allocator::release_free_memory());
    weft_allocator::release_free_memory();
    let compiled = compiled?;
    std::fs::create_dir_all(cache_dir)?;
    let tmp = cache_dir.join(format!(".tmp-{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, &compiled)?;
    std::fs::rename(&tmp, &path)?;
    // SAFETY: these bytes were produced by this engine just above.
    Ok(unsafe { Component::deserialize(engine, &compiled)? })
}

/// Pre-links `component` against every capability of the contract version it targets.
pub(super) fn prelink(engine: &Engine, linker: &Linker<CallState>, component: &Component) -> anyhow::Result<PluginPre> {
    PluginPre::new(engine, linker, component)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_over_their_cap_are_refused_with_a_message() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.wasm");
        std::fs::write(&path, vec![0u8; 4097]).unwrap();
        assert_eq!(read_capped(&path, "plugin", 4097).unwrap().len(), 4097);
        let refused = read_capped(&path, "plugin", 4096).unwrap_err();
        assert!(refused.contains("larger than"), "{refused}");
        std::fs::write(path.with_extension("toml"), vec![b'#'; 2 * 1024 * 1024]).unwrap();
        let Err(refused) = read_source(&path) else {
            panic!("a 2 MiB manifest is refused");
        };
        assert!(
            refused.contains("manifest") && refused.contains("larger than"),
            "{refused}"
        );
    }
}
