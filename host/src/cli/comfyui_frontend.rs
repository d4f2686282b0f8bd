//! `weft comfyui-frontend install [DIR]`: puts ComfyUI's official web editor (the PyPI
//! package `comfyui-frontend-package`, GPL-3.0, never bundled into weft) into DIR for
//! `weft serve --comfyui-frontend DIR`. It uses the machine's `python3 -m pip` to fetch the
//! wheel and Python's `zipfile` to unpack it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The package version whose server routes weft implements (ComfyUI 0.3.64 requires it).
pub(crate) const DEFAULT_VERSION: &str = "1.27.10";

/// The `comfyui-frontend` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum FrontendCommand {
    /// Downloads `comfyui-frontend-package` from PyPI and unpacks its static files into DIR.
    Install {
        /// Where the editor's files go (replaced if present).
        #[arg(default_value = "comfyui-frontend")]
        dir: PathBuf,
        /// The package version.
        #[arg(long, default_value = DEFAULT_VERSION)]
        version: String,
    },
}

impl FrontendCommand {
    /// Runs the subcommand.
    pub(crate) fn run(self) -> anyhow::Result<()> {
        match self {
            FrontendCommand::Install { dir, version } => install(&dir, &version),
        }
    }
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn install(dir: &Path, version: &str) -> anyhow::Result<()> {
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
        bail!("the version {version:?} is not a plain version number");
    }
    let work = tempfile_dir()?;
    let result = (|| {
        let wheels = work.join("wheels");
        run(
            Command::new("python3")
                .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"])
                .arg(format!("comfyui-frontend-package=={version}"))
                .arg("-d")
                .arg(&wheels),
            "pip download comfyui-frontend-package",
        )?;
        let wheel = std::fs::read_dir(&wheels)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .context("pip downloaded no wheel")?;
        let unpacked = work.join("unpacked");
        run(
            Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(&unpacked),
            "unpacking the wheel",
        )?;
        let static_dir = unpacked.join("comfyui_frontend_package").join("static");
        if !static_dir.join("index.html").is_file() {
            bail!("the wheel has no comfyui_frontend_package/static/index.html");
        }
        if dir.exists() {
            std::fs::remove_dir_all(dir).with_context(|| format!("replacing {}", dir.display()))?;
        }
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        if std::fs::rename(&static_dir, dir).is_err() {
            copy_tree(&static_dir, dir)?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result?;
    println!(
        "ComfyUI's editor {version} is in {}; serve it with: weft serve --comfyui-frontend {}",
        dir.display(),
        dir.display()
    );
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("weft-frontend-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
