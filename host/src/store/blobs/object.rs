//! Blobs in S3-compatible object storage (`--blob-dir s3://bucket/prefix`), through the
//! `object_store` crate. Keys are laid out as in a folder: `prefix/ab/abcd…` for blob
//! `abcd…`. A blob is written to a local spool file first (its hash is known only at the
//! end), then uploaded under its hash: one PUT, or a multipart upload when it is large. It is
//! acknowledged once the upload returned.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, ObjectStore, PutMode, PutPayload};
use tokio::io::AsyncWriteExt;

use super::{is_hex_hash, BlobStore, BlobWriter, ByteStream, LocalBlobs};

/// Blobs in an object store.
#[derive(Debug, Clone)]
pub struct ObjectBlobs {
    store: Arc<dyn ObjectStore>,
    /// The key prefix, without leading or trailing `/` (empty: the bucket's root).
    prefix: String,
    /// Local temp files: blobs being written, and copies of blobs read as files.
    spool: LocalBlobs,
}

impl ObjectBlobs {
    /// Blobs in S3 bucket `bucket` under `prefix`, configured (credentials, region,
    /// endpoint, plain HTTP) from the `AWS_*` environment variables, with temp files under
    /// `spool`. Nothing is contacted yet.
    pub fn s3(bucket: &str, prefix: &str, spool: &Path) -> std::io::Result<Self> {
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| std::io::Error::other(format!("configuring S3 bucket {bucket}: {e}")))?;
        Ok(Self {
            store: Arc::new(store),
            prefix: prefix.trim_matches('/').to_string(),
            spool: LocalBlobs::open(spool)?,
        })
    }

    /// The key of object `name` (a path under the prefix).
    fn key(&self, name: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(name)
        } else {
            Key::from(format!("{}/{name}", self.prefix))
        }
    }

    /// The key of blob `hash`.
    fn blob_key(&self, hash: &str) -> Key {
        let shard = hash.get(..2).unwrap_or("xx");
        self.key(&format!("{shard}/{hash}"))
    }

    /// Reads object `key`, if it exists.
    async fn get_small(&self, key: &Key) -> std::io::Result<Option<bytes::Bytes>> {
        match self.store.get(key).await {
            Ok(found) => Ok(Some(found.bytes().await.map_err(io_error)?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(io_error(e)),
        }
    }
}

/// An object store error as an I/O error (absent objects as `NotFound`).
fn io_error(e: object_store::Error) -> std::io::Error {
    match e {
        object_store::Error::NotFound { .. } => std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
        e => std::io::Error::other(format!("object storage: {e}")),
    }
}

#[async_trait::async_trait]
impl BlobStore for ObjectBlobs {
    fn writer(&self) -> std::io::Result<BlobWriter> {
        self.spool.writer()
    }

    async fn finish(&self, writer: BlobWriter) -> std::io::Result<(String, u64)> {
        let (hash, size, spooled) = tokio::task::spawn_blocking(move || writer.spooled())
            .await
            .map_err(std::io::Error::other)??;
        let mut file = tokio::fs::File::open(spooled.path()).await?;
        // Buffers up to 10 MiB and then PUTs; larger blobs go as a multipart upload.
        let mut upload = object_store::buffered::BufWriter::new(self.store.clone(), self.blob_key(&hash));
        if let Err(e) = tokio::io::copy(&mut file, &mut upload).await {
            let _ = upload.abort().await;
            return Err(e);
        }
        upload.shutdown().await?;
        Ok((hash, size))
    }

    async fn exists(&self, hash: &str) -> std::io::Result<bool> {
        if !is_hex_hash(hash) {
            return Ok(false);
        }
        match self.store.head(&self.blob_key(hash)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(io_error(e)),
        }
    }

    async fn read(&self, hash: &str, range: std::ops::Range<u64>) -> std::io::Result<ByteStream> {
        if !is_hex_hash(hash) {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        if range.is_empty() {
            return Ok(futures::stream::empty().boxed());
        }
        let options = GetOptions {
            range: Some(GetRange::Bounded(range)),
            ..Default::default()
        };
        let found = self
            .store
            .get_opts(&self.blob_key(hash), options)
            .await
            .map_err(io_error)?;
        Ok(found.into_stream().map_err(io_error).boxed())
    }

    fn file_path(&self, _hash: &str) -> Option<PathBuf> {
        None
    }

    fn spool_dir(&self) -> &Path {
        self.spool.spool_dir()
    }

    async fn older_than(&self, age: std::time::Duration) -> std::io::Result<Vec<String>> {
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(age).unwrap_or(chrono::Duration::MAX);
        let prefix = (!self.prefix.is_empty()).then(|| Key::from(self.prefix.as_str()));
        let mut listing = self.store.list(prefix.as_ref());
        let mut old = Vec::new();
        while let Some(object) = listing.next().await {
            let object = object.map_err(io_error)?;
            let name = object.location.filename().unwrap_or_default();
            if is_hex_hash(name) && object.last_modified < cutoff {
                old.push(name.to_string());
            }
        }
        Ok(old)
    }

    async fn remove(&self, hash: &str) -> std::io::Result<()> {
        if !is_hex_hash(hash) {
            return Ok(());
        }
        match self.store.delete(&self.blob_key(hash)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(io_error(e)),
        }
    }

    async fn shared_key(&self, name: &str) -> std::io::Result<[u8; 32]> {
        let key = self.key(name);
        let read = |bytes: Option<bytes::Bytes>| bytes.and_then(|b| <[u8; 32]>::try_from(b.as_ref()).ok());
        if let Some(found) = read(self.get_small(&key).await?) {
            return Ok(found);
        }
        let mine = super::random_key();
        let payload = PutPayload::from(mine.to_vec());
        // Created only if absent, so processes starting together agree; a server without
        // conditional writes gets a plain write (the last one wins, read back below).
        let created = match self.store.put_opts(&key, payload.clone(), PutMode::Create.into()).await {
            Ok(_) => true,
            Err(object_store::Error::AlreadyExists { .. }) => false,
            Err(object_store::Error::NotImplemented) => {
                self.store.put(&key, payload).await.map_err(io_error)?;
                false
            }
            Err(e) => return Err(io_error(e)),
        };
        if created {
            return Ok(mine);
        }
        read(self.get_small(&key).await?)
            .ok_or_else(|| std::io::Error::other(format!("object {key} is not a 32-byte key")))
    }
}
