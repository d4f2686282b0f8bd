//! `weft serve --watch`: reloads a plugin of the plugins directory when its file (or its
//! manifest) changes. A new build replaces the old one through
//! [`Runtime::with_plugin`](crate::runtime::Runtime::with_plugin): the whole runtime is
//! swapped at once, so the catalogue and validation change together, and jobs already
//! running finish on the build they started with. A build that cannot be loaded is logged
//! and the previous one stays.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use notify::{RecursiveMode, Watcher};

use super::Jobs;
use crate::runtime::read_source;

/// How long the directory must stay quiet before changed files are reloaded: a copy or an
/// editor's save is several events, and the file is only whole after the last.
const SETTLE: Duration = Duration::from_millis(300);
/// The longest a reload waits for quiet while a file keeps changing.
const SETTLE_AT_MOST: Duration = Duration::from_secs(5);

/// Watches a plugins directory for as long as it lives.
pub struct PluginWatcher {
    _watcher: notify::RecommendedWatcher,
}

/// Starts watching `dir`, reloading into `jobs`' runtime on its own thread.
pub fn start(dir: &Path, jobs: Arc<Jobs>) -> anyhow::Result<PluginWatcher> {
    let (events, changes) = mpsc::channel::<notify::Result<notify::Event>>();
    let mut watcher = notify::recommended_watcher(events)?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|e| anyhow::anyhow!("cannot watch plugins dir {}: {e}", dir.display()))?;
    std::thread::Builder::new()
        .name("weft-plugin-watch".into())
        .spawn(move || reload_loop(&changes, &jobs))?;
    tracing::info!(dir = %dir.display(), "watching plugins for changes");
    Ok(PluginWatcher { _watcher: watcher })
}

/// Waits for changes, lets them settle, and reloads each changed plugin; ends when the
/// watcher is dropped.
fn reload_loop(changes: &mpsc::Receiver<notify::Result<notify::Event>>, jobs: &Jobs) {
    while let Ok(first) = changes.recv() {
        let mut changed = BTreeSet::new();
        note(&mut changed, first);
        let began = Instant::now();
        while began.elapsed() < SETTLE_AT_MOST {
            match changes.recv_timeout(SETTLE) {
                Ok(event) => note(&mut changed, event),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
        for path in changed {
            reload(&path, jobs);
        }
    }
}

/// Adds the plugin files `event` touched to `changed`: a `.wasm`, or the `.wasm` whose
/// manifest (`.toml`) it is.
fn note(changed: &mut BTreeSet<PathBuf>, event: notify::Result<notify::Event>) {
    let event = match event {
        Ok(event) => event,
        Err(e) => {
            tracing::warn!(error = %e, "plugin watch error");
            return;
        }
    };
    if event.kind.is_access() {
        return;
    }
    for path in event.paths {
        match path.extension().and_then(|x| x.to_str()) {
            Some("wasm") => {
                changed.insert(path);
            }
            Some("toml") => {
                changed.insert(path.with_extension("wasm"));
            }
            _ => {}
        }
    }
}

/// Loads the plugin at `path` in place of its previous build, or unloads it when the file
/// is gone.
fn reload(path: &Path, jobs: &Jobs) {
    let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    let current = jobs.runtime();
    if !path.exists() {
        if let Some(runtime) = current.without_plugin(&name) {
            jobs.replace_runtime(runtime);
            tracing::info!(plugin = %name, "plugin removed: its file is gone");
        }
        return;
    }
    let loaded = read_source(path)
        .map_err(anyhow::Error::msg)
        .and_then(|source| current.with_plugin(source));
    match loaded {
        Ok(runtime) => {
            let classes = runtime.catalog().iter().filter(|d| d.plugin == name).count();
            jobs.replace_runtime(runtime);
            tracing::info!(plugin = %name, classes, "plugin reloaded");
        }
        Err(e) => tracing::error!(
            plugin = %name,
            origin = %path.display(),
            reason = %format!("{e:#}"),
            "plugin reload refused: the new version cannot be loaded, the previous one stays loaded"
        ),
    }
}
