//! What a node call gets from its job: the log its output goes to, the cancel token, where
//! progress goes and where assets are read from. Invoking a node and the capabilities both
//! take the call's context from here, so neither imports the other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::bindings::wit;
use super::logs::TailLog;
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
        code: "missing_asset".into(),
        message,
    })
}

/// Cancels a job's node calls: checked by polite guests, enforced by epoch interruption.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not canceled.
    pub fn new() -> Self {
        Self::default()
    }
    /// Cancels; a running node is interrupted at the next epoch tick.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_canceled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
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
}
