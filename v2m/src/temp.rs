//! Videos on disk for ffmpeg to read: uploads, downloads and node inputs are written to a
//! fresh file under the engine's temporary directory and removed when done.

use std::path::{Path, PathBuf};

use super::V2mError;

/// A video file that is removed when dropped, unless it is borrowed (a file that belongs to
/// someone else, read in place).
#[derive(Debug)]
pub struct TempVideo {
    path: PathBuf,
    owned: bool,
}

impl TempVideo {
    /// A fresh, not yet created file name under `dir`, owned: removed on drop if it exists.
    pub fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(format!("{}.video", uuid::Uuid::new_v4().simple())),
            owned: true,
        }
    }

    /// `path` read in place, never removed.
    pub fn borrowed(path: PathBuf) -> Self {
        Self { path, owned: false }
    }

    /// Where the video is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempVideo {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates `dir` for [`TempVideo`]s and removes the files a previous process left in it.
pub fn prepare_temp_dir(dir: &Path) -> Result<(), V2mError> {
    std::fs::create_dir_all(dir).map_err(|e| V2mError::GenerationFailed(format!("creating {}: {e}", dir.display())))?;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_videos_are_removed_and_borrowed_ones_kept() {
        let dir = std::env::temp_dir().join(format!("v2m-temp-{}", std::process::id()));
        prepare_temp_dir(&dir).unwrap();
        let owned = TempVideo::new(&dir);
        std::fs::write(owned.path(), b"x").unwrap();
        let kept = dir.join("kept.video");
        std::fs::write(&kept, b"y").unwrap();
        let owned_path = owned.path().to_path_buf();
        drop(owned);
        drop(TempVideo::borrowed(kept.clone()));
        assert!(!owned_path.exists());
        assert!(kept.exists());
        prepare_temp_dir(&dir).unwrap();
        assert!(!kept.exists(), "leftovers are removed");
        std::fs::remove_dir_all(dir).ok();
    }
}
