//! A cache of loaded networks with a memory budget: least recently used entries are
//! dropped until the bytes held fit the budget. Entries are keyed by file paths, sizes,
//! modification times, what was loaded (a checkpoint, a UNet file, text-encoder files) and
//! layout, so a replaced file is loaded afresh.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context, Result};
use candle_core::Device;

use super::layout::ModelConfig;
use super::loader::{load_models, load_text, load_unet, CheckpointModels, TextModels, UnetModels};
use super::separate::UnetKeys;

/// One file of an entry, as it was when loaded.
#[derive(Debug, Clone, PartialEq)]
struct Stamp {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(path: &Path) -> Result<Stamp> {
        let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
        Ok(Stamp {
            path: path.to_path_buf(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Checkpoint,
    Unet(UnetKeys),
    Text,
}

#[derive(Debug, Clone, PartialEq)]
struct Key {
    files: Vec<Stamp>,
    kind: Kind,
    config: ModelConfig,
}

impl Key {
    /// Whether `other` is the same files read the same way (perhaps at another version).
    fn same_source(&self, other: &Key) -> bool {
        self.kind == other.kind
            && self.config == other.config
            && self
                .files
                .iter()
                .map(|f| &f.path)
                .eq(other.files.iter().map(|f| &f.path))
    }
}

/// Loaded networks of one entry.
#[derive(Clone)]
enum Held {
    Checkpoint(Arc<CheckpointModels>),
    Unet(Arc<UnetModels>),
    Text(Arc<TextModels>),
}

impl Held {
    fn bytes(&self) -> u64 {
        match self {
            Held::Checkpoint(m) => m.bytes,
            Held::Unet(m) => m.bytes,
            Held::Text(m) => m.bytes,
        }
    }
}

struct Entry {
    key: Key,
    bytes: u64,
    models: Held,
}

/// Loaded networks, least recently used first out, within `budget` bytes of weights:
/// whole checkpoints, and UNets and text encoders loaded from their own files.
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
        let key = Key {
            files: vec![Stamp::of(path)?],
            kind: Kind::Checkpoint,
            config: config.clone(),
        };
        match self.fetch(key, || {
            Ok(Held::Checkpoint(Arc::new(load_models(path, config, &self.device)?)))
        })? {
            Held::Checkpoint(m) => Ok(m),
            _ => anyhow::bail!("model cache: a checkpoint entry holds other networks"),
        }
    }

    /// The UNet file `path` (keys `keys`, layout `config`), loading it on a miss.
    pub fn get_unet(&self, path: &Path, config: &ModelConfig, keys: UnetKeys) -> Result<Arc<UnetModels>> {
        let key = Key {
            files: vec![Stamp::of(path)?],
            kind: Kind::Unet(keys),
            config: config.clone(),
        };
        match self.fetch(key, || {
            Ok(Held::Unet(Arc::new(load_unet(path, config, keys, &self.device)?)))
        })? {
            Held::Unet(m) => Ok(m),
            _ => anyhow::bail!("model cache: a UNet entry holds other networks"),
        }
    }

    /// The text encoders of layout `config` in `files` (one `(path, key prefix)` per
    /// encoder, in order), loading them on a miss.
    pub fn get_text(&self, files: &[(PathBuf, String)], config: &ModelConfig) -> Result<Arc<TextModels>> {
        let key = Key {
            files: files.iter().map(|(p, _)| Stamp::of(p)).collect::<Result<_>>()?,
            kind: Kind::Text,
            config: config.clone(),
        };
        match self.fetch(key, || {
            Ok(Held::Text(Arc::new(load_text(files, config, &self.device)?)))
        })? {
            Held::Text(m) => Ok(m),
            _ => anyhow::bail!("model cache: a text-encoder entry holds other networks"),
        }
    }

    /// The entry for `key`, or `load`'s networks kept under it.
    fn fetch(&self, key: Key, load: impl FnOnce() -> Result<Held>) -> Result<Held> {
        {
            let mut entries = self.entries.lock().expect("model cache lock");
            if let Some(i) = entries.iter().position(|e| e.key == key) {
                let e = entries.remove(i);
                let models = e.models.clone();
                entries.push(e);
                return Ok(models);
            }
        }
        let models = load()?;
        let bytes = models.bytes();
        let mut entries = self.entries.lock().expect("model cache lock");
        entries.retain(|e| !e.key.same_source(&key));
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
