//! The models folder's listings, kept between catalogue reads and dropped when the folder
//! changes. A recursive watch on the models directory (inotify on Linux, as `serve --watch`
//! uses for plugins) reports every change; each report drops the listings at once, on the
//! watcher's thread, and the next read walks the folder again. So a file added or removed
//! is listed at the first read after its event, and reads in between cost no file-system
//! access.
//!
//! Where the watch cannot be trusted, every read walks, as before the cache: when the
//! directory cannot be watched (it does not exist yet, or the watch limit is reached), after
//! a watch error or lost events, when the directory itself is moved or removed, and when
//! one of its folders becomes a symlink (a watch is not extended through one). A walk never
//! runs on an async worker thread: there it runs in `block_in_place`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use notify::event::{EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher};

use super::models_dir::{ModelsDir, DIRECTORIES, FOLDERS};

/// How long after a folder appears listings are not kept: the watcher reports a new folder
/// before it watches it, so a file put in it meanwhile has no event of its own.
const NEW_FOLDER_SETTLE: Duration = Duration::from_secs(1);

/// The listings of one models directory, cached while a watch vouches for them.
pub(crate) struct ModelListings {
    dir: ModelsDir,
    cache: Arc<Cache>,
    /// Reports changes to `cache` for as long as it lives; none when the directory could
    /// not be watched (every listing walks).
    _watcher: Option<notify::RecommendedWatcher>,
}

impl ModelListings {
    /// The listings of `dir`, watched from now on if it can be.
    pub(crate) fn new(dir: ModelsDir) -> Self {
        let cache = Arc::new(Cache::default());
        let watcher = watch(dir.root(), cache.clone());
        cache.lock().watching = watcher.is_some();
        ModelListings {
            dir,
            cache,
            _watcher: watcher,
        }
    }

    /// The model files of `folder`, as [`ModelsDir::list`] gives them: from the cache when
    /// nothing changed since it was walked.
    pub(crate) fn list(&self, folder: &str) -> Vec<String> {
        let Some(index) = FOLDERS.iter().position(|f| *f == folder) else {
            return Vec::new();
        };
        let walk_began = {
            let state = self.cache.lock();
            if let Some(names) = &state.listings[index] {
                return names.clone();
            }
            (state.generation, Instant::now())
        };
        let names = off_async_threads(|| self.dir.list(folder));
        let mut state = self.cache.lock();
        if state.keeps(walk_began) {
            state.listings[index] = Some(names.clone());
        }
        names
    }
}

/// What the listings and the watcher share.
#[derive(Default)]
struct Cache {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Whether the watch reports every change; when not, no listing is kept.
    watching: bool,
    /// Counts the changes reported: a walk that began before the latest is not kept.
    generation: u64,
    /// Walks that begin before this are not kept (see [`NEW_FOLDER_SETTLE`]).
    settled_at: Option<Instant>,
    /// The kept listing of each of [`FOLDERS`].
    listings: [Option<Vec<String>>; FOLDERS.len()],
}

impl State {
    /// Whether a walk that began at `(generation, instant)` may be kept.
    fn keeps(&self, (generation, began): (u64, Instant)) -> bool {
        self.watching && generation == self.generation && self.settled_at.is_none_or(|at| began >= at)
    }

    /// Drops every listing.
    fn invalidate(&mut self) {
        self.generation += 1;
        self.listings = Default::default();
    }
}

impl Cache {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in one report of the watcher on `root`.
    fn note(&self, root: &Path, event: notify::Result<notify::Event>) {
        let event = match event {
            Ok(event) => event,
            Err(e) => return self.stop_trusting(root, &e.to_string()),
        };
        // Reading or writing a file's bytes changes no listing: loading a checkpoint, or
        // the thousands of writes of one being copied in, keep the listings.
        if matches!(
            event.kind,
            EventKind::Access(_) | EventKind::Modify(ModifyKind::Data(_))
        ) {
            return;
        }
        if event.need_rescan() {
            return self.stop_trusting(root, "file-system events were lost");
        }
        // Other folders of a ComfyUI models directory (`clip/`, `controlnet/`, ...) are not listed.
        if !event.paths.iter().any(|p| p == root || concerns_listing(root, p)) {
            return;
        }
        let root_moved = matches!(
            event.kind,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
        ) && event.paths.iter().any(|p| p == root);
        if root_moved {
            return self.stop_trusting(root, "the directory was moved or removed");
        }
        if event.paths.iter().any(|p| is_folder_symlink(root, p)) {
            return self.stop_trusting(root, "a models folder became a symlink");
        }
        let mut state = self.lock();
        if matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(_))
        ) {
            state.settled_at = Some(Instant::now() + NEW_FOLDER_SETTLE);
        }
        state.invalidate();
    }

    /// Gives up the cache for good: every listing walks from now on.
    fn stop_trusting(&self, root: &Path, why: &str) {
        let mut state = self.lock();
        if state.watching {
            tracing::info!(dir = %root.display(), reason = why, "models directory: listing it on every catalogue read");
        }
        state.watching = false;
        state.invalidate();
    }
}

/// Whether a change at `path` may change a listing: it is in one of `root`'s [`DIRECTORIES`]
/// or is one of them (or an entry of `root` that may become one).
fn concerns_listing(root: &Path, path: &Path) -> bool {
    path.parent() == Some(root) || DIRECTORIES.iter().any(|dir| path.starts_with(root.join(dir)))
}

/// Whether `path` is one of `root`'s [`DIRECTORIES`], as a symlink.
fn is_folder_symlink(root: &Path, path: &Path) -> bool {
    path.parent() == Some(root)
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| DIRECTORIES.contains(&n))
        && path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink())
}

/// A recursive watch on `root` reporting to `cache`; none (logged) when it cannot be made.
fn watch(root: &Path, cache: Arc<Cache>) -> Option<notify::RecommendedWatcher> {
    // The watcher reports paths under `root` made absolute this way.
    let watched: PathBuf = match std::env::current_dir() {
        Ok(cwd) if root.is_relative() => cwd.join(root),
        _ => root.to_path_buf(),
    };
    let handler = move |event| cache.note(&watched, event);
    let watcher = notify::recommended_watcher(handler).and_then(|mut watcher| {
        watcher.watch(root, RecursiveMode::Recursive)?;
        Ok(watcher)
    });
    match watcher {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            tracing::info!(dir = %root.display(), error = %e, "models directory not watched: listing it on every catalogue read");
            None
        }
    }
}

/// Runs `work`, which blocks on the file system, off the async worker threads: on a worker
/// of a multi-threaded tokio runtime it runs in `block_in_place`, which hands the worker's
/// other tasks to another thread first.
fn off_async_threads<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"x").unwrap();
    }

    /// Lists `folder` until it gives `expected`: the watcher reports on its own thread, a
    /// moment after the change.
    fn eventually(listings: &ModelListings, folder: &str, expected: &[&str]) {
        for _ in 0..500 {
            if listings.list(folder) == expected {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(listings.list(folder), expected);
    }

    #[test]
    fn a_listing_is_kept_until_a_change_is_reported() {
        let root = tempfile::tempdir().unwrap();
        model(&root.path().join("checkpoints/a.safetensors"));
        let listings = ModelListings::new(ModelsDir::new(root.path().to_path_buf()));
        assert!(listings.cache.lock().watching, "a tempdir can be watched");
        assert_eq!(listings.list("checkpoints"), ["a.safetensors"]);
        assert_eq!(
            listings.cache.lock().listings[0].as_deref(),
            Some(&["a.safetensors".to_string()][..]),
            "kept while nothing changes"
        );

        model(&root.path().join("checkpoints/b.safetensors"));
        eventually(&listings, "checkpoints", &["a.safetensors", "b.safetensors"]);
        std::fs::remove_file(root.path().join("checkpoints/a.safetensors")).unwrap();
        eventually(&listings, "checkpoints", &["b.safetensors"]);
        model(&root.path().join("loras/new/c.safetensors"));
        eventually(&listings, "loras", &["new/c.safetensors"]);
    }

    #[test]
    fn changes_in_folders_that_are_not_listed_keep_the_listings() {
        let root = Path::new("/models");
        assert!(concerns_listing(
            root,
            Path::new("/models/checkpoints/sd/a.safetensors")
        ));
        assert!(concerns_listing(root, Path::new("/models/loras")));
        assert!(concerns_listing(root, Path::new("/models/new-folder")));
        assert!(concerns_listing(root, Path::new("/models/clip/a.safetensors")));
        assert!(concerns_listing(
            root,
            Path::new("/models/upscale_models/a.safetensors")
        ));
        assert!(!concerns_listing(
            root,
            Path::new("/models/checkpoints-old/a.safetensors")
        ));
    }

    #[test]
    fn a_walk_overtaken_by_a_change_is_not_kept() {
        let mut state = State {
            watching: true,
            ..State::default()
        };
        let began = (state.generation, Instant::now());
        assert!(state.keeps(began));
        state.invalidate();
        assert!(!state.keeps(began), "a change was reported during the walk");
        let began = (state.generation, Instant::now());
        state.settled_at = Some(Instant::now() + NEW_FOLDER_SETTLE);
        assert!(!state.keeps(began), "a new folder may not be watched yet");
        state.settled_at = None;
        state.watching = false;
        assert!(!state.keeps(began), "nothing is kept without a watch");
    }

    #[test]
    fn an_unwatchable_directory_is_walked_on_every_listing() {
        let root = tempfile::tempdir().unwrap();
        let missing = root.path().join("models");
        let listings = ModelListings::new(ModelsDir::new(missing.clone()));
        assert!(listings.list("checkpoints").is_empty());
        model(&missing.join("checkpoints/a.safetensors"));
        assert_eq!(listings.list("checkpoints"), ["a.safetensors"]);
        assert!(listings.cache.lock().listings.iter().all(Option::is_none));
    }

    #[test]
    fn a_removed_directory_stops_the_cache() {
        let root = tempfile::tempdir().unwrap();
        let models = root.path().join("models");
        model(&models.join("checkpoints/a.safetensors"));
        let listings = ModelListings::new(ModelsDir::new(models.clone()));
        assert_eq!(listings.list("checkpoints"), ["a.safetensors"]);
        std::fs::remove_dir_all(&models).unwrap();
        for _ in 0..500 {
            if !listings.cache.lock().watching {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!listings.cache.lock().watching);
        // Made again, unwatched: still listed at once.
        model(&models.join("checkpoints/b.safetensors"));
        assert_eq!(listings.list("checkpoints"), ["b.safetensors"]);
    }
}
