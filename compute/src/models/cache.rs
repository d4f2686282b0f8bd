//! A cache of loaded SD1 networks with a memory budget: least recently used entries are
//! dropped until the bytes held fit the budget. Entries are keyed by file path, size,
//! modification time and layout, so a replaced file is loaded afresh.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context, Result};
use candle_core::Device;

use super::layout::ModelConfig;
use super::loader::{load_models, CheckpointModels};

#[derive(Debug, Clone, PartialEq)]
struct Key {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
    config: ModelConfig,
}

struct Entry {
    key: Key,
    bytes: u64,
    models: Arc<CheckpointModels>,
}

/// Loaded networks, least recently used first out, within `budget` bytes of weights.
pub struct ModelCache {
    budget: u64,
    device: Device,
    /// Most recently used last.
    entries: Mutex<Vec<Entry>>,
}

impl ModelCache {
    /// An empty cache holding at most `budget` bytes of weights on `device`. A single model
    /// larger than the budget is still returned, but not kept.
    pub fn new(budget: u64, device: Device) -> Self {
        ModelCache {
            budget,
            device,
            entries: Mutex::new(Vec::new()),
        }
    }

    /// The networks in `path` with layout `config`, loading them on a miss. The lock is not
    /// held while loading, so two callers may load the same file once each.
    pub fn get(&self, path: &Path, config: &ModelConfig) -> Result<Arc<CheckpointModels>> {
        let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        let key = Key {
            path: path.to_path_buf(),
            len: meta.len(),
            modified: meta.modified().ok(),
            config: config.clone(),
        };
        {
            let mut entries = self.entries.lock().expect("model cache lock");
            if let Some(i) = entries.iter().position(|e| e.key == key) {
                let e = entries.remove(i);
                let models = e.models.clone();
                entries.push(e);
                return Ok(models);
            }
        }
        let models = Arc::new(load_models(path, config, &self.device)?);
        let bytes = models.bytes;
        let mut entries = self.entries.lock().expect("model cache lock");
        entries.retain(|e| e.key.path != key.path || e.key.config != key.config);
        if bytes <= self.budget {
            entries.push(Entry {
                key,
                bytes,
                models: models.clone(),
            });
            let mut held: u64 = entries.iter().map(|e| e.bytes).sum();
            while held > self.budget {
                let e = entries.remove(0);
                held -= e.bytes;
            }
        }
        Ok(models)
    }

    /// Bytes of weights currently held.
    pub fn bytes_held(&self) -> u64 {
        self.entries
            .lock()
            .expect("model cache lock")
            .iter()
            .map(|e| e.bytes)
            .sum()
    }

    /// Number of cached models.
    pub fn len(&self) -> usize {
        self.entries.lock().expect("model cache lock").len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::layout::write_random_checkpoint;

    #[test]
    fn lru_by_bytes() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let cfg = ModelConfig::tiny();
        let paths: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("m{i}.safetensors"))).collect();
        for (i, p) in paths.iter().enumerate() {
            write_random_checkpoint(p, &cfg, i as u64)?;
        }
        let probe = ModelCache::new(u64::MAX, Device::Cpu);
        let one = probe.get(&paths[0], &cfg)?.bytes;
        assert!(one > 0);
        // Room for two models.
        let cache = ModelCache::new(one * 2 + one / 2, Device::Cpu);
        let a = cache.get(&paths[0], &cfg)?;
        let a2 = cache.get(&paths[0], &cfg)?;
        assert!(Arc::ptr_eq(&a, &a2), "second get is a hit");
        cache.get(&paths[1], &cfg)?;
        cache.get(&paths[0], &cfg)?; // 0 is now the most recent
        cache.get(&paths[2], &cfg)?; // evicts 1
        assert_eq!(cache.len(), 2);
        assert!(cache.bytes_held() <= one * 2 + one / 2);
        assert!(Arc::ptr_eq(&a, &cache.get(&paths[0], &cfg)?), "0 survived");
        // A budget smaller than one model keeps nothing but still serves it.
        let tiny = ModelCache::new(one / 2, Device::Cpu);
        tiny.get(&paths[0], &cfg)?;
        assert!(tiny.is_empty());
        Ok(())
    }
}
