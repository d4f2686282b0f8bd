//! Content-addressed blobs: one object per distinct content, named by its blake3 hash, behind
//! the [`BlobStore`] trait. Two backends: a local (or network-mounted) folder, [`local`], and
//! S3-compatible object storage, [`object`].
//!
//! Every blob is written the same way: its bytes are hashed as they arrive into a local temp
//! file ([`BlobWriter`]), then the backend makes it durable under its hash
//! ([`BlobStore::finish`]). A blob is acknowledged only once that returned.

pub mod local;
pub mod object;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;

pub use local::{is_hex_hash, BlobWriter, LocalBlobs, STALE_TEMP};
pub use object::ObjectBlobs;

/// A blob's bytes as they are read.
pub type ByteStream = BoxStream<'static, std::io::Result<bytes::Bytes>>;

/// The blob store, shared by every part of the server (and by every process of a shared
/// database).
pub type Blobs = Arc<dyn BlobStore>;

/// Where the blobs live: `--blob-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobLocation {
    /// A folder: local, or a network mount shared by several machines.
    Dir(PathBuf),
    /// An S3 bucket (or an S3-compatible server), under a key prefix (empty: the bucket's
    /// root). Credentials, region and endpoint come from the standard `AWS_*` variables.
    S3 {
        /// The bucket.
        bucket: String,
        /// The key prefix, without leading or trailing `/`.
        prefix: String,
    },
}

impl BlobLocation {
    /// Parses `--blob-dir`: `s3://bucket[/prefix]` is S3, anything else a folder.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let Some(rest) = text.strip_prefix("s3://") else {
            return Ok(BlobLocation::Dir(PathBuf::from(text)));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            anyhow::bail!("--blob-dir {text:?} names no bucket: use s3://bucket/prefix");
        }
        Ok(BlobLocation::S3 {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
        })
    }

    /// Opens the store. `spool` is a local folder for the temp files of blobs being written
    /// or copied out of a remote store (a folder's own `tmp` is used instead).
    pub fn open(&self, spool: &Path) -> std::io::Result<Blobs> {
        Ok(match self {
            BlobLocation::Dir(dir) => Arc::new(LocalBlobs::open(dir)?),
            BlobLocation::S3 { bucket, prefix } => Arc::new(ObjectBlobs::s3(bucket, prefix, spool)?),
        })
    }
}

/// Content-addressed blob storage. Hashes are blake3 hex digests; a name that is not one
/// (see [`is_hex_hash`]) is never stored, and reads as absent.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync + std::fmt::Debug {
    /// Starts writing a new blob into a local temp file.
    fn writer(&self) -> std::io::Result<BlobWriter>;

    /// Makes the blob `writer` wrote durable under its hash, and returns (hash hex, size).
    async fn finish(&self, writer: BlobWriter) -> std::io::Result<(String, u64)>;

    /// Whether blob `hash` is stored.
    async fn exists(&self, hash: &str) -> std::io::Result<bool>;

    /// Bytes `range` of blob `hash` (within its size), streamed.
    async fn read(&self, hash: &str, range: std::ops::Range<u64>) -> std::io::Result<ByteStream>;

    /// Blob `hash`'s own file, when the store keeps blobs as files (to read or hard-link
    /// without a copy); none for a remote store.
    fn file_path(&self, hash: &str) -> Option<PathBuf>;

    /// The folder for temp copies of blobs ([`local_file`]).
    fn spool_dir(&self) -> &Path;

    /// The blobs last written more than `age` ago (a blob written again, by an upload or an
    /// output of the same content, counts as new).
    async fn older_than(&self, age: std::time::Duration) -> std::io::Result<Vec<String>>;

    /// Removes blob `hash` if present.
    async fn remove(&self, hash: &str) -> std::io::Result<()>;

    /// A random 32-byte key stored beside the blobs under `name`, made by whichever
    /// process asks first: every process sharing the store reads the same key.
    async fn shared_key(&self, name: &str) -> std::io::Result<[u8; 32]>;
}

/// Stores `bytes` in `blobs`, returning (hash hex, size).
pub async fn put(blobs: &dyn BlobStore, bytes: Vec<u8>) -> std::io::Result<(String, u64)> {
    let mut writer = blobs.writer()?;
    let writer = tokio::task::spawn_blocking(move || writer.write_chunk(&bytes).map(|()| writer))
        .await
        .map_err(std::io::Error::other)??;
    blobs.finish(writer).await
}

/// The whole of blob `hash` (of `size` bytes) in memory.
pub async fn read_all(blobs: &dyn BlobStore, hash: &str, size: u64) -> std::io::Result<Vec<u8>> {
    let mut stream = blobs.read(hash, 0..size).await?;
    let mut bytes = Vec::with_capacity(size.min(64 << 20) as usize);
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    Ok(bytes)
}

/// A blob as a local file, for readers that need a path.
#[derive(Debug)]
pub enum LocalFile {
    /// The store's own file: read it in place.
    Stored(PathBuf),
    /// A temp copy, removed when this is dropped.
    Spooled(PathBuf),
}

impl LocalFile {
    /// Where the bytes are.
    pub fn path(&self) -> &Path {
        match self {
            LocalFile::Stored(path) | LocalFile::Spooled(path) => path,
        }
    }
}

impl Drop for LocalFile {
    fn drop(&mut self) {
        if let LocalFile::Spooled(path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// 32 random bytes (two v4 UUIDs' worth).
fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_dir_parses_folders_and_s3_urls() {
        assert_eq!(
            BlobLocation::parse("/srv/blobs").unwrap(),
            BlobLocation::Dir("/srv/blobs".into())
        );
        assert_eq!(
            BlobLocation::parse("s3://bucket/a/b/").unwrap(),
            BlobLocation::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(
            BlobLocation::parse("s3://bucket").unwrap(),
            BlobLocation::S3 {
                bucket: "bucket".into(),
                prefix: String::new()
            }
        );
        assert!(BlobLocation::parse("s3:///x").is_err());
    }
}
