//! The bounded run queue, fair across tenants: each tenant has its own FIFO and workers
//! take from the tenants in turn, so one tenant's burst does not starve another. Each tenant
//! may fill only its share of the capacity, so one tenant cannot lock the others out.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

#[derive(Default)]
struct Inner {
    /// Per-tenant FIFOs of job ids.
    tenants: BTreeMap<String, VecDeque<String>>,
    /// Round-robin order of tenants with queued jobs.
    turn: VecDeque<String>,
    len: usize,
}

/// The run queue.
pub struct Queue {
    inner: Mutex<Inner>,
    capacity: usize,
    tenant_capacity: usize,
    ready: Notify,
}

/// The queue is at capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull;

impl Queue {
    /// An empty queue holding at most `capacity` jobs, at most `tenant_capacity` of them of
    /// one tenant.
    pub fn new(capacity: usize, tenant_capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            capacity,
            tenant_capacity,
            ready: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `tenant` may queue another job: the queue is not full and the tenant has not
    /// filled its share. The place is taken by [`push`](Self::push).
    pub fn has_room(&self, tenant: &str) -> Result<(), QueueFull> {
        let inner = self.lock();
        let mine = inner.tenants.get(tenant).map_or(0, VecDeque::len);
        if inner.len >= self.capacity || mine >= self.tenant_capacity {
            Err(QueueFull)
        } else {
            Ok(())
        }
    }

    /// Appends `job` for `tenant`. `force` ignores the capacity (recovery after restart).
    pub fn push(&self, tenant: &str, job: String, force: bool) -> Result<(), QueueFull> {
        let mut inner = self.lock();
        let mine = inner.tenants.get(tenant).map_or(0, VecDeque::len);
        if !force && (inner.len >= self.capacity || mine >= self.tenant_capacity) {
            return Err(QueueFull);
        }
        let fifo = inner.tenants.entry(tenant.to_string()).or_default();
        let was_empty = fifo.is_empty();
        fifo.push_back(job);
        if was_empty {
            inner.turn.push_back(tenant.to_string());
        }
        inner.len += 1;
        drop(inner);
        self.ready.notify_one();
        Ok(())
    }

    /// Takes the next job, tenants in turn; waits while the queue is empty.
    pub async fn pop(&self) -> (String, String) {
        loop {
            let notified = self.ready.notified();
            if let Some(next) = self.try_pop() {
                return next;
            }
            notified.await;
        }
    }

    fn try_pop(&self) -> Option<(String, String)> {
        let mut inner = self.lock();
        let tenant = inner.turn.pop_front()?;
        let fifo = inner.tenants.get_mut(&tenant).expect("tenants in turn have a fifo");
        let job = fifo.pop_front().expect("tenants in turn have jobs");
        if fifo.is_empty() {
            inner.tenants.remove(&tenant);
        } else {
            inner.turn.push_back(tenant.clone());
        }
        inner.len -= 1;
        let more = inner.len > 0;
        drop(inner);
        if more {
            self.ready.notify_one();
        }
        Some((tenant, job))
    }

    /// Removes `job` if it is still waiting (it was canceled or expired).
    pub fn remove(&self, tenant: &str, job: &str) -> bool {
        let mut inner = self.lock();
        let Some(fifo) = inner.tenants.get_mut(tenant) else {
            return false;
        };
        let Some(pos) = fifo.iter().position(|j| j == job) else {
            return false;
        };
        fifo.remove(pos);
        if fifo.is_empty() {
            inner.tenants.remove(tenant);
            inner.turn.retain(|t| t != tenant);
        }
        inner.len -= 1;
        true
    }

    /// Removes `job` whichever tenant queued it.
    pub fn remove_any(&self, job: &str) -> bool {
        let tenant = {
            let inner = self.lock();
            inner
                .tenants
                .iter()
                .find(|(_, fifo)| fifo.iter().any(|j| j == job))
                .map(|(t, _)| t.clone())
        };
        tenant.is_some_and(|t| self.remove(&t, job))
    }

    /// The 0-based position at which `job` would be taken, counting the round-robin.
    pub fn position(&self, tenant: &str, job: &str) -> Option<usize> {
        let inner = self.lock();
        // From the back: the caller is most often the submission of the newest job, which
        // is then found at once instead of after every job queued before it.
        let index = inner.tenants.get(tenant)?.iter().rposition(|j| j == job)?;
        let turn = inner.turn.iter().position(|t| t == tenant)?;
        // Each full round takes one job from every tenant with jobs left.
        let mut ahead = 0;
        for (i, t) in inner.turn.iter().enumerate() {
            let len = inner.tenants[t].len();
            let rounds = if i < turn { index + 1 } else { index };
            ahead += len.min(rounds);
        }
        Some(ahead)
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tenants_take_turns() {
        let q = Queue::new(10, 10);
        for i in 0..3 {
            q.push("a", format!("a{i}"), false).unwrap();
        }
        q.push("b", "b0".into(), false).unwrap();
        assert_eq!(q.position("a", "a0"), Some(0));
        assert_eq!(q.position("b", "b0"), Some(1));
        assert_eq!(q.position("a", "a1"), Some(2));
        assert_eq!(q.pop().await.1, "a0");
        assert_eq!(q.pop().await.1, "b0");
        assert_eq!(q.pop().await.1, "a1");
    }

    #[test]
    fn capacity_is_enforced_and_remove_frees_room() {
        let q = Queue::new(1, 1);
        q.push("a", "x".into(), false).unwrap();
        assert_eq!(q.push("a", "y".into(), false), Err(QueueFull));
        assert!(q.remove("a", "x"));
        assert!(q.has_room("a").is_ok());
    }

    #[test]
    fn a_tenant_fills_only_its_share() {
        let q = Queue::new(4, 2);
        q.push("a", "a0".into(), false).unwrap();
        q.push("a", "a1".into(), false).unwrap();
        assert_eq!(q.has_room("a"), Err(QueueFull));
        assert_eq!(q.push("a", "a2".into(), false), Err(QueueFull));
        assert!(q.has_room("b").is_ok());
        q.push("b", "b0".into(), false).unwrap();
        q.push("b", "b1".into(), false).unwrap();
        assert_eq!(q.has_room("c"), Err(QueueFull), "the whole queue is full");
    }
}
