//! The plugins compiled into the `weft` binary (built for wasm32-wasip2 by `build.rs`).

use super::registry::{Manifest, PluginSource};

include!(concat!(env!("OUT_DIR"), "/builtin_plugins.rs"));

/// The built-in plugins, with empty manifests: they need no capabilities.
pub(crate) fn sources() -> Vec<PluginSource> {
    BUILTIN_PLUGINS
        .iter()
        .map(|(name, bytes)| PluginSource {
            name: (*name).to_string(),
            origin: format!("built-in:{name}"),
            bytes: bytes.to_vec(),
            manifest: Manifest::default(),
        })
        .collect()
}
