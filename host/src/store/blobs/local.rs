//! Blobs in a folder: one file per distinct content, named by its blake3 hash, written
//! atomically (temp file, then rename). The folder may be a network mount shared by several
//! machines.

use std::io::Write;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::{BlobStore, ByteStream};

/// The blob directory.
#[derive(Debug, Clone)]
pub struct LocalBlobs {
    dir: PathBuf,
    /// `dir/tmp`: blobs being written, swept of crash leftovers at open.
    tmp: PathBuf,
}

/// A blob being written: bytes are hashed as they arrive.
pub struct BlobWriter {
    file: std::fs::File,
    tmp: PathBuf,
    hasher: blake3::Hasher,
    size: u64,
    blobs: LocalBlobs,
}

/// How old a temp file must be before it counts as left by a crash: writes in progress
/// touch theirs far more often.
pub const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(3600);

impl LocalBlobs {
    /// Opens (creating) the blob directory `dir`, and removes temp files a crash left. The
    /// directory may be shared by several processes (one PostgreSQL store): a temp file
    /// is removed only when it is [`STALE_TEMP`] old, so no other process is writing it.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir.join("tmp"))?;
        let cutoff = std::time::SystemTime::now()
            .checked_sub(STALE_TEMP)
            .unwrap_or(std::time::UNIX_EPOCH);
        for entry in std::fs::read_dir(dir.join("tmp"))? {
            let entry = entry?;
            if entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < cutoff) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            tmp: dir.join("tmp"),
        })
    }

    /// Where the blob `hash` (hex) lives.
    pub fn path(&self, hash: &str) -> PathBuf {
        let prefix = hash.get(..2).unwrap_or("xx");
        self.dir.join(prefix).join(hash)
    }

    /// Whether blob `hash` is on disk.
    pub fn exists(&self, hash: &str) -> bool {
        is_hex_hash(hash) && self.path(hash).exists()
    }

    /// Starts writing a new blob.
    pub fn writer(&self) -> std::io::Result<BlobWriter> {
        let tmp = self.tmp.join(uuid::Uuid::new_v4().to_string());
        let file = std::fs::File::create(&tmp)?;
        Ok(BlobWriter {
            file,
            tmp,
            hasher: blake3::Hasher::new(),
            size: 0,
            blobs: self.clone(),
        })
    }

    /// The blobs last written more than `age` ago (a blob written again, by an upload or an
    /// output of the same content, counts as new).
    fn older_than_sync(&self, age: std::time::Duration) -> std::io::Result<Vec<String>> {
        let cutoff = std::time::SystemTime::now()
            .checked_sub(age)
            .unwrap_or(std::time::UNIX_EPOCH);
        let mut old = Vec::new();
        for shard in std::fs::read_dir(&self.dir)? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for blob in std::fs::read_dir(shard.path())? {
                let blob = blob?;
                let name = blob.file_name().to_string_lossy().into_owned();
                if is_hex_hash(&name) && blob.metadata()?.modified()? < cutoff {
                    old.push(name);
                }
            }
        }
        Ok(old)
    }

    /// Removes blob `hash` if present.
    fn remove_sync(&self, hash: &str) -> std::io::Result<()> {
        if !is_hex_hash(hash) {
            return Ok(());
        }
        match std::fs::remove_file(self.path(hash)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

impl BlobWriter {
    /// Appends `chunk`.
    pub fn write_chunk(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        self.hasher.update(chunk);
        self.size += chunk.len() as u64;
        self.file.write_all(chunk)
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Ends the write without placing the blob: returns (hash hex, size, the temp file),
    /// which the caller then owns (a remote store uploads it and removes it).
    pub(super) fn spooled(mut self) -> std::io::Result<(String, u64, super::LocalFile)> {
        self.file.flush()?;
        let hash = self.hasher.finalize().to_hex().to_string();
        let tmp = super::LocalFile::Spooled(std::mem::take(&mut self.tmp));
        Ok((hash, self.size, tmp))
    }

    /// Makes the blob durable and moves it into place. Returns (hash hex, size). The rename
    /// is made durable too (its directory is synced, and the blob directory when the
    /// prefix directory is new), so an acknowledged upload survives a power loss.
    pub fn finish(mut self) -> std::io::Result<(String, u64)> {
        self.file.sync_all()?;
        let hash = self.hasher.finalize().to_hex().to_string();
        let path = self.blobs.path(&hash);
        let parent = path.parent().expect("blob paths have a parent");
        let placed = match std::fs::rename(&self.tmp, &path) {
            // The first blob of its prefix: make the prefix folder.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !parent.exists() => {
                std::fs::create_dir_all(parent)?;
                sync_dir(&self.blobs.dir)?;
                std::fs::rename(&self.tmp, &path)
            }
            placed => placed,
        };
        placed?;
        // The temp file is now the blob: nothing is left for `drop` to clean up.
        self.tmp = PathBuf::new();
        sync_dir(parent)?;
        Ok((hash, self.size))
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // After `finish` the temp file is gone (after `spooled` it is not ours); after an
        // abandoned upload this cleans up.
        if !self.tmp.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[async_trait::async_trait]
impl BlobStore for LocalBlobs {
    fn writer(&self) -> std::io::Result<BlobWriter> {
        LocalBlobs::writer(self)
    }

    async fn finish(&self, writer: BlobWriter) -> std::io::Result<(String, u64)> {
        blocking(move || writer.finish()).await
    }

    async fn exists(&self, hash: &str) -> std::io::Result<bool> {
        Ok(LocalBlobs::exists(self, hash))
    }

    async fn read(&self, hash: &str, range: std::ops::Range<u64>) -> std::io::Result<ByteStream> {
        if !is_hex_hash(hash) {
            return Err(std::io::ErrorKind::NotFound.into());
        }
        let mut file = tokio::fs::File::open(self.path(hash)).await?;
        file.seek(std::io::SeekFrom::Start(range.start)).await?;
        let len = range.end.saturating_sub(range.start);
        Ok(tokio_util::io::ReaderStream::new(file.take(len)).boxed())
    }

    fn file_path(&self, hash: &str) -> Option<PathBuf> {
        is_hex_hash(hash).then(|| self.path(hash))
    }

    fn spool_dir(&self) -> &Path {
        &self.tmp
    }

    async fn older_than(&self, age: std::time::Duration) -> std::io::Result<Vec<String>> {
        let blobs = self.clone();
        blocking(move || blobs.older_than_sync(age)).await
    }

    async fn remove(&self, hash: &str) -> std::io::Result<()> {
        let (blobs, hash) = (self.clone(), hash.to_string());
        blocking(move || blobs.remove_sync(&hash)).await
    }

    async fn shared_key(&self, name: &str) -> std::io::Result<[u8; 32]> {
        let (dir, name) = (self.dir.clone(), name.to_string());
        blocking(move || shared_key(&dir, &name)).await
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> std::io::Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(std::io::Error::other)?
}

/// The random 32-byte key in file `name` of folder `dir`, made (mode 0600) if missing.
/// Processes starting together agree: the key is placed with a hard link, which fails if
/// another process placed one first, and then theirs is read.
pub(crate) fn shared_key(dir: &Path, name: &str) -> std::io::Result<[u8; 32]> {
    let path = dir.join(name);
    let read = || -> Option<[u8; 32]> { <[u8; 32]>::try_from(std::fs::read(&path).ok()?.as_slice()).ok() };
    if let Some(key) = read() {
        return Ok(key);
    }
    std::fs::create_dir_all(dir)?;
    let key = super::random_key();
    let tmp = dir.join(format!("{name}.{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, key)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    }
    let placed = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    if placed.is_ok() {
        return Ok(key);
    }
    if let Some(theirs) = read() {
        return Ok(theirs);
    }
    // An unreadable or short key file (an interrupted write): replace it.
    let tmp = dir.join(format!("{name}.{}", uuid::Uuid::new_v4()));
    std::fs::write(&tmp, key)?;
    std::fs::rename(&tmp, &path)?;
    Ok(key)
}

/// Flushes directory `dir`'s entries (a rename or a new file in it) to disk. Directories
/// cannot be opened for syncing on Windows, where renames are journaled by NTFS.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Whether `s` looks like a blake3 hex digest (so it is safe in a path).
pub fn is_hex_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(blobs: &LocalBlobs, bytes: &[u8]) -> String {
        let mut writer = blobs.writer().unwrap();
        writer.write_chunk(bytes).unwrap();
        writer.finish().unwrap().0
    }

    #[test]
    fn a_blob_lands_in_its_prefix_folder_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(dir.path()).unwrap();
        let hash = store(&blobs, b"content");
        assert_eq!(std::fs::read(blobs.path(&hash)).unwrap(), b"content");
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn a_removed_prefix_folder_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = LocalBlobs::open(dir.path()).unwrap();
        let hash = store(&blobs, b"content");
        std::fs::remove_dir_all(blobs.path(&hash).parent().unwrap()).unwrap();
        assert_eq!(store(&blobs, b"content"), hash);
        assert_eq!(std::fs::read(blobs.path(&hash)).unwrap(), b"content");
    }
}
