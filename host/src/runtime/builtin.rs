//! The plugins compiled into the `weft` binary (built for wasm32-wasip2 by `build.rs`).

use super::registry::{Manifest, PluginSource};

include!(concat!(env!("OUT_DIR"), "/builtin_plugins.rs"));

/// The built-in plugins, with empty manifests: they need no capabilities. Their bytes are
/// not copied, and their hashes were taken at build time, so a start that finds them in the
/// compiled-code cache never reads them.
pub(crate) fn sources() -> Vec<PluginSource> {
    BUILTIN_PLUGINS
        .iter()
        .map(|(name, bytes, hash)| PluginSource {
            name: (*name).to_string(),
            origin: format!("built-in:{name}"),
            bytes: std::borrow::Cow::Borrowed(bytes),
            hash: (*hash).to_string(),
            manifest: Manifest::default(),
        })
        .collect()
}
