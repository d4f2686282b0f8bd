//! The node result cache: results keyed by class, inputs and ancestors' keys (as ComfyUI
//! keys them), kept per tenant, bounded in memory, least recently used evicted first, and
//! aged out once unused for a while, so an idle server hands the memory back. A large
//! result that its node made in well under a millisecond is not kept: running the node
//! again costs less than holding the result (see [`NodeCache::put`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// The content itself, for a small output kept inline with its asset record (none: it
    /// is blob `blob`).
    pub inline: Option<bytes::Bytes>,
    /// A preview, committed as a temporary output.
    pub temporary: bool,
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
        + entry
            .files
            .iter()
            .map(|f| f.inline.as_ref().map_or(0, |b| b.len()))
            .sum::<usize>()
        + 256
}

/// Results up to this weight are always kept: they take no more than a page of memory.
const SMALL_RESULT: usize = 4096;

/// A larger result is kept only if its node took at least this long to make it.
const WORTH_KEEPING: Duration = Duration::from_millis(1);

/// An entry with its weight and when it was last stored or read.
struct Held {
    entry: Entry,
    size: usize,
    used: Instant,
}

struct Inner {
    lru: LruCache<(String, [u8; 32]), Held>,
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
        let held = inner.lru.get_mut(&(tenant.to_string(), *key))?;
        held.used = Instant::now();
        Some(held.entry.clone())
    }

    /// Stores `entry` for `tenant` and `key`, evicting old entries beyond the budget, if
    /// it is worth keeping: small (at most [`SMALL_RESULT`] bytes), or `cost` (the time its
    /// node took to make it) at least [`WORTH_KEEPING`]. Returns whether it was stored.
    ///
    /// Every result kept is memory the next job cannot reuse, so each new result lands on
    /// pages the process never touched; a fast node's large result (an `EmptyImage`, an
    /// `ImageInvert`) costs more to fault in than to make again.
    pub fn put(&self, tenant: &str, key: [u8; 32], entry: Entry, cost: Duration) -> bool {
        let size = weight(&entry);
        if size > self.budget || (size > SMALL_RESULT && cost < WORTH_KEEPING) {
            return false;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let held = Held {
            entry,
            size,
            used: Instant::now(),
        };
        if let Some(old) = inner.lru.put((tenant.to_string(), key), held) {
            inner.bytes -= old.size;
        }
        inner.bytes += size;
        while inner.bytes > self.budget {
            match inner.lru.pop_lru() {
                Some((_, old)) => inner.bytes -= old.size,
                None => break,
            }
        }
        true
    }

    /// Drops the entries last stored or read before `since`; returns the bytes freed.
    pub fn evict_unused_since(&self, since: Instant) -> usize {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut freed = 0;
        // Least recently used first: the first entry used since then ends the walk.
        while inner.lru.peek_lru().is_some_and(|(_, held)| held.used < since) {
            if let Some((_, old)) = inner.lru.pop_lru() {
                inner.bytes -= old.size;
                freed += old.size;
            }
        }
        freed
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
            .filter(|(_, held)| {
                held.entry
                    .files
                    .iter()
                    .any(|f| f.inline.is_none() && removed.contains(f.blob.as_str()))
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in stale {
            if let Some(old) = inner.lru.pop(&key) {
                inner.bytes -= old.size;
            }
        }
    }

    /// Bytes held (by the cache's own weighing of values).
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).bytes
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
        cache.put("a", [1; 32], e.clone(), Duration::ZERO);
        assert!(cache.get("a", &[1; 32]).is_some());
        assert!(cache.get("b", &[1; 32]).is_none());
        for i in 0..10u8 {
            cache.put("a", [i + 10; 32], e.clone(), Duration::ZERO);
        }
        assert!(cache.len() < 11);
        assert!(cache.get("a", &[1; 32]).is_none());
    }

    #[test]
    fn a_large_result_is_kept_only_if_its_node_took_a_millisecond_or_more() {
        let cache = NodeCache::new(1 << 20);
        let large = || Entry {
            values: vec![Value::Text("x".repeat(SMALL_RESULT))],
            files: vec![],
        };
        let small = Entry {
            values: vec![Value::Text("x".into())],
            files: vec![],
        };
        assert!(!cache.put("a", [1; 32], large(), Duration::from_micros(50)));
        assert!(
            cache.get("a", &[1; 32]).is_none(),
            "made again for less than it costs to keep"
        );
        assert!(cache.put("a", [2; 32], large(), WORTH_KEEPING));
        assert!(cache.get("a", &[2; 32]).is_some());
        assert!(
            cache.put("a", [3; 32], small, Duration::ZERO),
            "a small result is always kept"
        );
    }

    #[test]
    fn entries_unused_since_a_time_are_aged_out_and_used_ones_stay() {
        let cache = NodeCache::new(1 << 20);
        let e = Entry {
            values: vec![Value::Text("x".into())],
            files: vec![],
        };
        // The sleeps only make sure the clock has moved between the marks and the uses.
        let tick = || std::thread::sleep(std::time::Duration::from_millis(1));
        let before = Instant::now();
        tick();
        cache.put("a", [1; 32], e.clone(), Duration::ZERO);
        cache.put("a", [2; 32], e.clone(), Duration::ZERO);
        cache.put("a", [3; 32], e, Duration::ZERO);
        assert_eq!(cache.evict_unused_since(before), 0, "all were used since");
        tick();
        let mark = Instant::now();
        tick();
        assert!(cache.get("a", &[2; 32]).is_some(), "a read counts as a use");
        assert!(cache.evict_unused_since(mark) > 0);
        assert_eq!(cache.len(), 1);
        assert!(cache.get("a", &[2; 32]).is_some());
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
                inline: None,
                temporary: false,
            }],
        };
        cache.put("a", [1; 32], with_file("aa"), Duration::ZERO);
        cache.put("a", [2; 32], with_file("bb"), Duration::ZERO);
        cache.forget_blobs(&["aa".to_string()]);
        assert!(cache.get("a", &[1; 32]).is_none());
        assert!(cache.get("a", &[2; 32]).is_some());
    }
}
