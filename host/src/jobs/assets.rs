//! Assets: uploads, blobs adopted by hash, job outputs, reads and deletes, over the store's
//! records and the content-addressed blob directory.
//!
//! A small output is kept inline: its bytes go into its asset's row, in the same write as the
//! record, so it costs no blob file, no inode and no separate sync, and it lives and dies
//! with the record. Every read goes through [`Assets`], which serves either kind.
//!
//! The blob-lock rule lives here and only here: a blob is never garbage-collected while an
//! asset is being linked to it (an upload finished, a blob adopted by hash, an output
//! committed). Linking takes the lock shared, so links run side by side; garbage collection
//! takes it exclusive, so it sees either no asset yet (and the blob is not yet in place or is
//! re-linked after) or the new asset (and keeps the blob). The lock is this process's and,
//! with a store shared by several processes, the store's too ([`Store::lock_blob_links`]).
//! Reads need no lock: an open blob stays readable when its file is removed (a read from
//! object storage that loses its blob fails, as reading a deleted asset does).

use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::RwLock;

use crate::store::blobs::{self, is_hex_hash, BlobWriter, ByteStream, LocalFile};
use crate::store::{AssetRecord, BlobLinkLock, Blobs, Deleted, Store, StoreError};

/// Why an asset operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    /// The uploaded bytes do not have the hash the caller announced (both hex digests).
    #[error("the upload's hash is {actual}, not the expected {expected}")]
    HashMismatch {
        /// The hash the caller announced.
        expected: String,
        /// The hash of the bytes received.
        actual: String,
    },
    /// The caller has no asset over a blob with this hash, or the blob is gone.
    #[error("no such blob")]
    BlobNotFound,
    /// The asset is an output of a job that still exists.
    #[error("the asset is in use")]
    InUse,
    /// The store or the blob directory failed while `doing` something.
    #[error("{doing}: {message}")]
    Failed {
        /// What was being done, for the log.
        doing: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl AssetError {
    fn failed(doing: &'static str, error: impl std::fmt::Display) -> Self {
        AssetError::Failed {
            doing,
            message: error.to_string(),
        }
    }
}

/// Bytes an upload gathers before they are written to its file in one blocking task.
const WRITE_BATCH: usize = 256 << 10;

/// The bytes of an upload as they arrive: hashed on the way into a temporary file, which
/// is removed if the upload is abandoned. The file is written off the async threads, in
/// batches of up to [`WRITE_BATCH`] bytes.
pub struct Upload {
    /// The file; away only while a batch is being written (an upload dropped then leaves
    /// it to that task, which drops it, and so removes it, when the write is done).
    writer: Option<BlobWriter>,
    /// Chunks received and not yet written.
    pending: Vec<bytes::Bytes>,
    /// Bytes in `pending`.
    pending_bytes: usize,
    /// Bytes received, written or not.
    size: u64,
}

impl Upload {
    fn new(writer: BlobWriter) -> Self {
        Self {
            writer: Some(writer),
            pending: Vec::new(),
            pending_bytes: 0,
            size: 0,
        }
    }

    /// Appends `chunk`; a full batch is written before this returns.
    pub async fn write(&mut self, chunk: bytes::Bytes) -> Result<(), AssetError> {
        self.size += chunk.len() as u64;
        self.pending_bytes += chunk.len();
        self.pending.push(chunk);
        if self.pending_bytes >= WRITE_BATCH {
            self.flush().await?;
        }
        Ok(())
    }

    /// Bytes received so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Writes the pending chunks, on a blocking thread.
    async fn flush(&mut self) -> Result<(), AssetError> {
        let failed = |e: &dyn std::fmt::Display| AssetError::failed("writing a blob", e);
        let mut writer = self
            .writer
            .take()
            .ok_or_else(|| failed(&"an earlier write was abandoned"))?;
        if self.pending.is_empty() {
            self.writer = Some(writer);
            return Ok(());
        }
        let chunks = std::mem::take(&mut self.pending);
        self.pending_bytes = 0;
        let (writer, written) = tokio::task::spawn_blocking(move || {
            let written = chunks.iter().try_for_each(|chunk| writer.write_chunk(chunk));
            (writer, written)
        })
        .await
        .map_err(|e| failed(&e))?;
        self.writer = Some(writer);
        written.map_err(|e| failed(&e))
    }

    /// The file with every byte received written to it.
    async fn finish_writes(mut self) -> Result<BlobWriter, AssetError> {
        self.flush().await?;
        Ok(self.writer.take().expect("a flush that succeeded puts the writer back"))
    }
}

/// What the caller says about an uploaded file.
#[derive(Debug, Clone)]
pub struct UploadDetails {
    /// The tenant the asset belongs to.
    pub tenant: String,
    /// The file's name or path.
    pub file_path: String,
    /// Its content type; none: that of an earlier upload of the same bytes, else a guess
    /// from the file name.
    pub content_type: Option<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// When the asset expires; none: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// The hash (hex) the bytes must have.
    pub expected_hash: Option<String>,
}

/// The assets of every tenant and the blobs they point at.
pub struct Assets {
    store: Arc<dyn Store>,
    blobs: Blobs,
    /// Held shared while a blob is linked to a new asset, exclusive while unreferenced
    /// blobs are removed (this process's part of the blob-lock rule).
    link_lock: RwLock<()>,
}

/// The blob lock, held: this process's and the store's.
struct LinkGuard<G> {
    _store: BlobLinkLock,
    _local: G,
}

impl Assets {
    /// Assets recorded in `store`, with their bytes in `blobs`.
    pub fn new(store: Arc<dyn Store>, blobs: Blobs) -> Self {
        Self {
            store,
            blobs,
            link_lock: RwLock::new(()),
        }
    }

    /// Takes the blob lock shared, to link a blob to a new asset.
    async fn lock_link(&self) -> Result<LinkGuard<tokio::sync::RwLockReadGuard<'_, ()>>, StoreError> {
        let local = self.link_lock.read().await;
        Ok(LinkGuard {
            _store: self.store.lock_blob_links(false).await?,
            _local: local,
        })
    }

    /// Takes the blob lock exclusive, to remove unreferenced blobs.
    async fn lock_collect(&self) -> Result<LinkGuard<tokio::sync::RwLockWriteGuard<'_, ()>>, StoreError> {
        let local = self.link_lock.write().await;
        Ok(LinkGuard {
            _store: self.store.lock_blob_links(true).await?,
            _local: local,
        })
    }

    /// Starts receiving an upload's bytes (its file is made off the async threads).
    pub async fn receive(&self) -> Result<Upload, AssetError> {
        let blobs = self.blobs.clone();
        tokio::task::spawn_blocking(move || blobs.writer())
            .await
            .map_err(std::io::Error::other)
            .and_then(|made| made)
            .map(Upload::new)
            .map_err(|e| AssetError::failed("creating a blob", e))
    }

    /// Stores a received upload as a new asset. Returns it, and whether its bytes were new to
    /// the tenant (false when the tenant already had an asset with the same content).
    pub async fn upload(&self, upload: Upload, details: UploadDetails) -> Result<(AssetRecord, bool), AssetError> {
        let writer = upload.finish_writes().await?;
        let guard = self
            .lock_link()
            .await
            .map_err(|e| AssetError::failed("locking the blobs", e))?;
        let (hash, size) = self
            .blobs
            .finish(writer)
            .await
            .map_err(|e| AssetError::failed("storing an upload", e))?;
        if let Some(expected) = details.expected_hash {
            if expected != hash {
                drop(guard);
                let _ = self.collect_garbage(vec![hash.clone()]).await;
                return Err(AssetError::HashMismatch { expected, actual: hash });
            }
        }
        let existing = self
            .store
            .asset_by_blob(&details.tenant, &hash)
            .await
            .map_err(|e| AssetError::failed("deduplicating an upload", e))?;
        let content_type = details
            .content_type
            .or_else(|| existing.as_ref().map(|a| a.content_type.clone()))
            .unwrap_or_else(|| guess_content_type(&details.file_path).to_string());
        let asset = AssetRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: details.tenant,
            blob: hash,
            size_bytes: size as i64,
            content_type,
            file_path: details.file_path,
            job_id: None,
            node_id: None,
            kind: None,
            tags: details.tags,
            created_at: Utc::now(),
            expires_at: details.expires_at,
            output_index: None,
            inline: false,
        };
        self.insert(asset.clone(), None).await?;
        drop(guard);
        Ok((asset, existing.is_none()))
    }

    /// A new asset of `tenant` over a blob (hash `hash`, hex) that one of the tenant's
    /// assets already uses; another tenant's blob is [`AssetError::BlobNotFound`]. The new
    /// asset keeps the existing one's name unless `file_path` is given.
    pub async fn adopt(
        &self,
        tenant: &str,
        hash: &str,
        file_path: Option<String>,
        tags: Vec<String>,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<AssetRecord, AssetError> {
        let _guard = self
            .lock_link()
            .await
            .map_err(|e| AssetError::failed("locking the blobs", e))?;
        let existing = self
            .store
            .asset_by_blob(tenant, hash)
            .await
            .map_err(|e| AssetError::failed("finding a blob", e))?;
        // An inline asset's bytes are copied into the new one's row.
        let (stored, content) = match &existing {
            Some(asset) if asset.inline => {
                let content = self
                    .store
                    .asset_content(&asset.id)
                    .await
                    .map_err(|e| AssetError::failed("finding a blob", e))?;
                (content.is_some(), content)
            }
            Some(_) => (
                self.blobs
                    .exists(hash)
                    .await
                    .map_err(|e| AssetError::failed("finding a blob", e))?,
                None,
            ),
            None => (false, None),
        };
        let Some(existing) = existing.filter(|_| stored) else {
            return Err(AssetError::BlobNotFound);
        };
        let asset = AssetRecord {
            id: uuid::Uuid::new_v4().to_string(),
            file_path: file_path.unwrap_or_else(|| existing.file_path.clone()),
            job_id: None,
            node_id: None,
            kind: None,
            tags,
            created_at: Utc::now(),
            expires_at,
            output_index: None,
            ..existing
        };
        self.insert(asset.clone(), content).await?;
        Ok(asset)
    }

    /// Whether `tenant` has an asset over the blob with hash `hash` (hex).
    pub async fn has_blob(&self, tenant: &str, hash: &str) -> Result<bool, AssetError> {
        let found = self
            .store
            .asset_by_blob(tenant, hash)
            .await
            .map_err(|e| AssetError::failed("finding a blob", e))?;
        Ok(found.is_some())
    }

    /// `tenant`'s asset `id`.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<AssetRecord>, AssetError> {
        self.store
            .asset(tenant, id)
            .await
            .map_err(|e| AssetError::failed("reading an asset", e))
    }

    /// Asset `id` of whichever tenant (for signed content links).
    pub async fn get_any(&self, id: &str) -> Result<Option<AssetRecord>, AssetError> {
        self.store
            .asset_any(id)
            .await
            .map_err(|e| AssetError::failed("reading an asset", e))
    }

    /// Deletes `tenant`'s uploaded asset `id`, and its blob when no other asset uses it.
    /// `Ok(false)` when there is no such asset.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, AssetError> {
        match self.store.delete_asset(tenant, id).await {
            Ok(Deleted::Yes { blob }) => {
                let _ = self.collect_garbage(vec![blob]).await;
                Ok(true)
            }
            Ok(Deleted::NotFound) => Ok(false),
            Err(StoreError::InUse) => Err(AssetError::InUse),
            Err(e) => Err(AssetError::failed("deleting an asset", e)),
        }
    }

    /// The bytes of inline `asset`, read from its row.
    async fn inline_content(&self, asset: &AssetRecord) -> Result<bytes::Bytes, AssetError> {
        self.store
            .asset_content(&asset.id)
            .await
            .map_err(|e| AssetError::failed("reading an asset", e))?
            .ok_or_else(|| AssetError::failed("reading an asset", "its content is gone"))
    }

    /// Bytes `range` of `asset`'s content, streamed.
    pub async fn read(&self, asset: &AssetRecord, range: std::ops::Range<u64>) -> Result<ByteStream, AssetError> {
        if asset.inline {
            let content = self.inline_content(asset).await?;
            let end = (range.end as usize).min(content.len());
            let part = content.slice((range.start as usize).min(end)..end);
            return Ok(futures::stream::once(async move { Ok(part) }).boxed());
        }
        self.blobs
            .read(&asset.blob, range)
            .await
            .map_err(|e| AssetError::failed("reading a blob", e))
    }

    /// The whole content of `asset`, in memory (for small assets).
    pub async fn read_all(&self, asset: &AssetRecord) -> Result<Vec<u8>, AssetError> {
        if asset.inline {
            return Ok(self.inline_content(asset).await?.to_vec());
        }
        blobs::read_all(self.blobs.as_ref(), &asset.blob, asset.size_bytes.max(0) as u64)
            .await
            .map_err(|e| AssetError::failed("reading a blob", e))
    }

    /// `asset`'s content as a local file (the blob's own, or a temp copy removed on drop),
    /// for readers that need a path; a copy is refused over `max` bytes.
    pub async fn local_file(&self, asset: &AssetRecord, max: u64) -> Result<LocalFile, AssetError> {
        if let Some(path) = self.blob_file(asset) {
            return Ok(LocalFile::Stored(path));
        }
        let copy = LocalFile::Spooled(self.blobs.spool_dir().join(format!("{}.read", uuid::Uuid::new_v4())));
        self.download(asset, copy.path(), max).await?;
        Ok(copy)
    }

    /// Copies `asset`'s content into the new file `dest`, unless it is over `max` bytes. A
    /// partial file is left for the caller to remove.
    pub async fn download(&self, asset: &AssetRecord, dest: &Path, max: u64) -> Result<(), AssetError> {
        let size = asset.size_bytes.max(0) as u64;
        if size > max {
            return Err(AssetError::failed(
                "copying a blob",
                format!("the blob is over the {max} bytes allowed"),
            ));
        }
        let mut stream = self.read(asset, 0..size).await?;
        let copy = async {
            let mut file = tokio::fs::File::create(dest).await?;
            while let Some(chunk) = stream.next().await {
                file.write_all(&chunk?).await?;
            }
            file.flush().await
        };
        copy.await.map_err(|e| AssetError::failed("copying a blob", e))
    }

    /// The blob's own file, when blobs are files (none in object storage, nor for an inline
    /// asset).
    pub fn blob_file(&self, asset: &AssetRecord) -> Option<std::path::PathBuf> {
        if asset.inline {
            return None;
        }
        self.blobs.file_path(&asset.blob)
    }

    /// A random key kept beside the blobs, the same for every process sharing them.
    pub async fn shared_key(&self, name: &str) -> std::io::Result<[u8; 32]> {
        self.blobs.shared_key(name).await
    }

    /// Stores `bytes` as a blob, returning (hash hex, size). It stays collectable until an
    /// asset is recorded over it with [`commit_output`](Self::commit_output).
    pub(super) async fn put(&self, bytes: Vec<u8>) -> std::io::Result<(String, u64)> {
        blobs::put(self.blobs.as_ref(), bytes).await
    }

    /// Whether blob `hash` is stored (a store that cannot tell says no).
    pub(super) async fn blob_exists(&self, hash: &str) -> bool {
        self.blobs.exists(hash).await.unwrap_or(false)
    }

    /// Records a job output: inline with its `content`, or over a blob stored before (or
    /// cached from an earlier run).
    pub(super) async fn commit_output(&self, asset: AssetRecord, content: Option<bytes::Bytes>) -> Result<(), String> {
        if content.is_some() {
            return self.store.insert_asset(asset, content).await.map_err(|e| e.to_string());
        }
        let _guard = self.lock_link().await.map_err(|e| e.to_string())?;
        if !self.blobs.exists(&asset.blob).await.map_err(|e| e.to_string())? {
            return Err(format!("blob {} is missing", asset.blob));
        }
        self.store.insert_asset(asset, None).await.map_err(|e| e.to_string())
    }

    /// Deletes those of `candidates` (blob hashes) that no asset references; returns them.
    pub(super) async fn collect_garbage(&self, mut candidates: Vec<String>) -> Result<Vec<String>, StoreError> {
        candidates.sort();
        candidates.dedup();
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let _guard = self.lock_collect().await?;
        let orphans = self.store.unreferenced_blobs(candidates).await?;
        for hash in &orphans {
            if let Err(e) = self.blobs.remove(hash).await {
                tracing::warn!(blob = %hash, error = %e, "cannot remove blob");
            }
        }
        Ok(orphans)
    }

    /// Deletes every blob written more than `grace` ago that no asset references: what a
    /// crash or a failed commit left behind. The grace spares blobs whose asset is still
    /// being recorded. Returns them.
    pub(super) async fn collect_orphans(&self, grace: std::time::Duration) -> Result<Vec<String>, StoreError> {
        let old = self
            .blobs
            .older_than(grace)
            .await
            .map_err(|e| StoreError::Backend(format!("listing blobs: {e}")))?;
        let mut removed = Vec::new();
        for batch in old.chunks(1000) {
            removed.extend(self.collect_garbage(batch.to_vec()).await?);
        }
        Ok(removed)
    }

    async fn insert(&self, asset: AssetRecord, content: Option<bytes::Bytes>) -> Result<(), AssetError> {
        self.store
            .insert_asset(asset, content)
            .await
            .map_err(|e| AssetError::failed("recording an asset", e))
    }
}

/// `blake3:<hex>` or bare hex, as a hex digest.
pub fn parse_hash(text: &str) -> Option<String> {
    let hex = text.strip_prefix("blake3:").unwrap_or(text).to_ascii_lowercase();
    is_hex_hash(&hex).then_some(hex)
}

fn guess_content_type(path: &str) -> &'static str {
    let lower = path.to_ascii_lowercase();
    let ext = lower.rsplit('.').next().unwrap_or("");
    match ext {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mov" => "video/quicktime",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "flac" => "audio/flac",
        "txt" => "text/plain",
        "json" => "application/json",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::blobs::LocalBlobs;

    fn temp_files(dir: &Path) -> usize {
        std::fs::read_dir(dir.join("tmp")).unwrap().count()
    }

    #[tokio::test]
    async fn an_upload_written_in_batches_holds_every_byte_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(dir.path()).unwrap();
        let mut upload = Upload::new(blobs.writer().unwrap());
        let mut sent = Vec::new();
        for i in 0..80u8 {
            let chunk = vec![i; 10_000 + usize::from(i)];
            sent.extend_from_slice(&chunk);
            upload.write(chunk.into()).await.unwrap();
            assert_eq!(upload.size(), sent.len() as u64, "size counts bytes not yet written");
        }
        assert!(sent.len() > 2 * WRITE_BATCH, "the test spans several batches");
        let writer = upload.finish_writes().await.unwrap();
        let (hash, size) = writer.finish().unwrap();
        assert_eq!(size, sent.len() as u64);
        assert_eq!(hash, blake3::hash(&sent).to_hex().to_string());
        assert_eq!(std::fs::read(blobs.path(&hash)).unwrap(), sent);
    }

    #[tokio::test]
    async fn an_abandoned_upload_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(dir.path()).unwrap();
        let mut upload = Upload::new(blobs.writer().unwrap());
        upload.write(vec![7u8; WRITE_BATCH + 1].into()).await.unwrap();
        upload.write(vec![8u8; 10].into()).await.unwrap();
        assert_eq!(temp_files(dir.path()), 1);
        drop(upload);
        assert_eq!(temp_files(dir.path()), 0);
    }
}
