//! The node result cache: results keyed by class, inputs and ancestors' keys (as ComfyUI
//! keys them), kept per tenant, bounded in memory, least recently used evicted first.

use std::sync::Mutex;

use lru::LruCache;

use crate::runtime::Value;

/// A file an output node committed, kept so a cache hit commits the same content again.
#[derive(Debug, Clone)]
pub struct CachedFile {
    /// File name.
    pub name: String,
    /// Output type.
    pub kind: crate::runtime::OutputKind,
    /// Media type.
    pub content_type: String,
    /// blake3 hex of the content.
    pub blob: String,
    /// Size.
    pub size: u64,
}

/// A node's cached result.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its output values.
    pub values: Vec<Value>,
    /// Its committed files.
    pub files: Vec<CachedFile>,
}

fn weight(entry: &Entry) -> usize {
    use crate::runtime::Value::*;
    entry
        .values
        .iter()
        .map(|v| match v {
            Image(i) => i.data.len() * 4,
            Mask(m) => m.data.len() * 4,
            Latent(l) => l.data.len() * 4,
            Audio(a) => a.samples.len() * 4,
            other => other.copy_cost(),
        })
        .sum::<usize>()
        + 256
}

struct Inner {
    lru: LruCache<(String, [u8; 32]), (Entry, usize)>,
    bytes: usize,
}

/// The cache.
pub struct NodeCache {
    inner: Mutex<Inner>,
    budget: usize,
}

impl NodeCache {
    /// A cache holding at most about `budget` bytes of values.
    pub fn new(budget: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                lru: LruCache::unbounded(),
                bytes: 0,
            }),
            budget,
        }
    }

    /// `tenant`'s entry for `key`.
    pub fn get(&self, tenant: &str, key: &[u8; 32]) -> Option<Entry> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.lru.get(&(tenant.to_string(), *key)).map(|(e, _)| e.clone())
    }

    /// Stores `entry` for `tenant` and `key`, evicting old entries beyond the budget.
    pub fn put(&self, tenant: &str, key: [u8; 32], entry: Entry) {
        let size = weight(&entry);
        if size > self.budget {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, old)) = inner.lru.put((tenant.to_string(), key), (entry, size)) {
            inner.bytes -= old;
        }
        inner.bytes += size;
        while inner.bytes > self.budget {
            match inner.lru.pop_lru() {
                Some((_, (_, s))) => inner.bytes -= s,
                None => break,
            }
        }
    }

    /// Drops every entry whose committed files use one of `removed` (blobs garbage-collected
    /// since), so a later hit never points at a deleted blob.
    pub fn forget_blobs(&self, removed: &[String]) {
        if removed.is_empty() {
            return;
        }
        let removed: std::collections::HashSet<&str> = removed.iter().map(String::as_str).collect();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<(String, [u8; 32])> = inner
            .lru
            .iter()
            .filter(|(_, (entry, _))| entry.files.iter().any(|f| removed.contains(f.blob.as_str())))
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            if let Some((_, size)) = inner.lru.pop(&key) {
                inner.bytes -= size;
            }
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).lru.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_do_not_share_entries_and_the_budget_evicts() {
        let cache = NodeCache::new(1000);
        let e = Entry {
            values: vec![Value::Text("x".into())],
            files: vec![],
        };
        cache.put("a", [1; 32], e.clone());
        assert!(cache.get("a", &[1; 32]).is_some());
        assert!(cache.get("b", &[1; 32]).is_none());
        for i in 0..10u8 {
            cache.put("a", [i + 10; 32], e.clone());
        }
        assert!(cache.len() < 11);
        assert!(cache.get("a", &[1; 32]).is_none());
    }

    #[test]
    fn entries_whose_blobs_were_collected_are_forgotten() {
        let cache = NodeCache::new(1 << 20);
        let with_file = |blob: &str| Entry {
            values: vec![],
            files: vec![CachedFile {
                name: "out.txt".into(),
                kind: crate::runtime::OutputKind::Text,
                content_type: "text/plain".into(),
                blob: blob.into(),
                size: 1,
            }],
        };
        cache.put("a", [1; 32], with_file("aa"));
        cache.put("a", [2; 32], with_file("bb"));
        cache.forget_blobs(&["aa".to_string()]);
        assert!(cache.get("a", &[1; 32]).is_none());
        assert!(cache.get("a", &[2; 32]).is_some());
    }
}
