//! What a node call gets from its job: the log its output goes to, the cancel token, where
//! progress goes and where assets are read from. Invoking a node and the capabilities both
//! take the call's context from here, so neither imports the other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use super::bindings::v0_1::wit;
use super::logs::TailLog;
use super::memory::JobMemory;
use super::value::AssetRef;

/// Where a node's progress reports go.
pub trait ProgressSink: Send + Sync {
    /// The node reached `step` of `steps`.
    fn report(&self, step: u32, steps: u32, message: Option<String>);

    /// A small preview of what the node is making (a sampler's current latent as an
    /// image), as `content_type` bytes. Sinks may drop previews that come too often.
    fn preview(&self, content_type: &'static str, data: Vec<u8>);
}

/// Reads uploaded assets for nodes such as `LoadImage`.
pub trait AssetReader: Send + Sync {
    /// The bytes of `asset`, or a message saying why not.
    fn read(&self, asset: &AssetRef) -> Result<Vec<u8>, String>;
}

/// The bytes of an asset the workflow referenced, read through `assets`, or the node error
/// for a missing one.
pub(crate) fn read_asset(assets: &dyn AssetReader, asset: wit::AssetRef) -> Result<Vec<u8>, wit::NodeError> {
    let reference = AssetRef {
        id: asset.id,
        hash: asset.hash,
        file_path: asset.file_path,
    };
    assets.read(&reference).map_err(|message| wit::NodeError {
        code: weft_types::NodeErrorCode::MissingAsset.into(),
        message,
    })
}

/// Cancels a job's node calls: checked by polite guests, enforced by epoch interruption,
/// and waited on by host functions that block (WASI sleeps and polls).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<CancelFlag>);

#[derive(Debug, Default)]
struct CancelFlag {
    canceled: AtomicBool,
    wake: Notify,
    /// The tokens made by [`CancelToken::child`], canceled with this one.
    children: std::sync::Mutex<Vec<std::sync::Weak<CancelFlag>>>,
}

impl CancelToken {
    /// A token that is not canceled.
    pub fn new() -> Self {
        Self::default()
    }
    /// A token canceled with this one (at once if this one is canceled already) and
    /// also on its own, without canceling this one.
    pub fn child(&self) -> Self {
        let child = Self::new();
        let mut children = self.0.children.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_canceled() {
            child.cancel();
        } else {
            children.retain(|c| c.strong_count() > 0);
            children.push(Arc::downgrade(&child.0));
        }
        child
    }
    /// Cancels, with every child token; a running node is interrupted at the next epoch
    /// tick, or at once when it is blocked in the host.
    pub fn cancel(&self) {
        let children = {
            let mut children = self.0.children.lock().unwrap_or_else(|e| e.into_inner());
            self.0.canceled.store(true, Ordering::SeqCst);
            std::mem::take(&mut *children)
        };
        self.0.wake.notify_waiters();
        for child in children.iter().filter_map(std::sync::Weak::upgrade) {
            CancelToken(child).cancel();
        }
    }
    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_canceled(&self) -> bool {
        self.0.canceled.load(Ordering::SeqCst)
    }
    /// Resolves once [`cancel`](Self::cancel) was called.
    pub async fn canceled(&self) {
        loop {
            let woken = self.0.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_canceled() {
                return;
            }
            woken.await;
        }
    }
}

/// Why a call was stopped: by the epoch callback in guest code, or by a host function
/// that checks between steps of long work or waits on the call's [`Deadline`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Interrupt {
    #[error("the node ran past its time limit")]
    Timeout,
    #[error("the job was canceled")]
    Canceled,
}

/// When one call must stop: at its time limit, or when its job is canceled. Guest code is
/// stopped by the epoch callback; host code checks [`Deadline::check`] between pieces of
/// work, and blocking host calls race [`Deadline::reached`].
#[derive(Debug, Clone)]
pub(crate) struct Deadline {
    at: Instant,
    cancel: CancelToken,
}

impl Deadline {
    /// A deadline at `at`, or earlier at `cancel`.
    pub(crate) fn new(at: Instant, cancel: CancelToken) -> Self {
        Self { at, cancel }
    }

    /// Why the call must stop now, if it must.
    pub(crate) fn check(&self) -> Result<(), Interrupt> {
        if self.cancel.is_canceled() {
            Err(Interrupt::Canceled)
        } else if Instant::now() >= self.at {
            Err(Interrupt::Timeout)
        } else {
            Ok(())
        }
    }

    /// Resolves when the call must stop, with the reason.
    pub(crate) async fn reached(&self) -> Interrupt {
        loop {
            let woken = self.cancel.0.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if let Err(why) = self.check() {
                return why;
            }
            tokio::select! {
                () = woken => {}
                () = tokio::time::sleep_until(self.at.into()) => {}
            }
        }
    }
}

/// Everything a node call needs from its job.
#[derive(Clone)]
pub struct CallContext {
    /// The job's log tail, which receives the guest's stdout and stderr.
    pub log: TailLog,
    /// The job's cancel token.
    pub cancel: CancelToken,
    /// Where progress goes.
    pub progress: Arc<dyn ProgressSink>,
    /// Where assets are read from.
    pub assets: Arc<dyn AssetReader>,
    /// The job's budget of host-held values.
    pub memory: Arc<JobMemory>,
}

#[cfg(test)]
mod tests {
    use super::CancelToken;

    #[test]
    fn a_child_token_is_canceled_with_its_parent_and_not_the_other_way() {
        let parent = CancelToken::new();
        let child = parent.child();
        child.cancel();
        assert!(!parent.is_canceled());
        let other = parent.child();
        parent.cancel();
        assert!(other.is_canceled());
        assert!(
            parent.child().is_canceled(),
            "a child of a canceled token starts canceled"
        );
    }

    #[tokio::test]
    async fn a_child_token_wakes_its_waiters_when_the_parent_is_canceled() {
        let parent = CancelToken::new();
        let child = parent.child();
        let waiter = tokio::spawn(async move { child.canceled().await });
        tokio::task::yield_now().await;
        parent.cancel();
        waiter.await.expect("the waiter ends");
    }
}
