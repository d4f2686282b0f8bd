//! Replacing one plugin of a running server: a new [`Runtime`] that shares the engine, the
//! host functions and the host-memory budget of the old one, with the plugin's new build in
//! place of its old one. Callers swap the whole runtime at once, so the catalogue and the
//! validation that reads it change together, and a job that holds the old runtime keeps
//! calling the build it started with.

use std::sync::Arc;

use super::registry::{self, LoadedPlugin};
use super::{Catalog, PluginSource, Runtime};

impl Runtime {
    /// This runtime with `source` loaded in place of the plugin of the same name (or added
    /// beside the others when there is none). The new build is compiled (through the
    /// compiled-code cache), linked and described under the usual limits, and its classes
    /// must not collide with another plugin's; if any step fails, the error says why and
    /// this runtime is unchanged.
    pub fn with_plugin(&self, source: PluginSource) -> anyhow::Result<Arc<Runtime>> {
        let component = registry::compile(&self.engine, &source, self.config.cache_dir.as_deref())
            .map_err(|e| anyhow::anyhow!("is not a valid component: {e:#}"));
        let plugin = self.load_plugin(&source, component)?;
        let mut plugins: Vec<Arc<LoadedPlugin>> = self.plugins.clone();
        match plugins.iter().position(|p| p.name == source.name) {
            Some(index) => plugins[index] = Arc::new(plugin),
            None => plugins.push(Arc::new(plugin)),
        }
        let refused = self.refused.iter().filter(|r| r.name != source.name).cloned().collect();
        self.with_plugins(plugins, refused)
    }

    /// This runtime without plugin `name`; none when no such plugin is loaded.
    pub fn without_plugin(&self, name: &str) -> Option<Arc<Runtime>> {
        if !self.plugins.iter().any(|p| p.name == name) {
            return None;
        }
        let plugins = self.plugins.iter().filter(|p| p.name != name).cloned().collect();
        let refused = self.refused.iter().filter(|r| r.name != name).cloned().collect();
        self.with_plugins(plugins, refused).ok()
    }

    /// A runtime over the same engine with exactly `plugins`; an error naming the first
    /// class two of them define.
    fn with_plugins(
        &self,
        plugins: Vec<Arc<LoadedPlugin>>,
        refused: Vec<super::RefusedPlugin>,
    ) -> anyhow::Result<Arc<Runtime>> {
        let mut catalog = Catalog::default();
        for (index, plugin) in plugins.iter().enumerate() {
            catalog.check_new(&plugin.nodes).map_err(anyhow::Error::msg)?;
            for def in &plugin.nodes {
                catalog.insert(index, def.clone()).map_err(anyhow::Error::msg)?;
            }
        }
        Ok(Arc::new(Runtime {
            engine: self.engine.clone(),
            linker: self.linker.clone(),
            plugins,
            catalog,
            limits: self.limits.clone(),
            capabilities: self.capabilities.clone(),
            refused,
            host_memory: self.host_memory.clone(),
            call_permits: self.call_permits.clone(),
            config: self.config.clone(),
            _ticker: self._ticker.clone(),
        }))
    }
}
