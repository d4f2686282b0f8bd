//! The operator's ComfyUI-style models folder: `checkpoints/`, `loras/`, `vae/` and
//! `embeddings/` under one directory. Files are listed by walking the folder (the catalogue
//! reads them through [`ModelListings`](super::listings::ModelListings), which keeps a walk
//! until the folder changes: no restart to pick up a new checkpoint), and a workflow's name is resolved only inside
//! its folder: absolute names, `..`, and symlinks that lead out of the folder are refused.

use std::path::{Component, Path, PathBuf};

/// The folders of a models directory that nodes may name files in.
pub(crate) const FOLDERS: [&str; 4] = ["checkpoints", "loras", "vae", "embeddings"];

/// File extensions listed (weft loads safetensors only).
const EXTENSIONS: [&str; 2] = ["safetensors", "sft"];

/// How deep listing descends into subfolders.
const MAX_DEPTH: usize = 8;

/// Why a model name was not resolved; each is a clean node error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum NameError {
    /// The name is absolute, empty, or has `..` / `.` parts.
    #[error("{name:?} is not a file name inside the {folder} folder")]
    Invalid {
        /// The models folder.
        folder: String,
        /// The name given.
        name: String,
    },
    /// The name leads out of its folder through a symlink.
    #[error("{name:?} leads outside the {folder} folder")]
    Escapes {
        /// The models folder.
        folder: String,
        /// The name given.
        name: String,
    },
    /// No such file (or no models directory, or an unknown folder).
    #[error("{name:?} is not in the {folder} folder")]
    NotFound {
        /// The models folder.
        folder: String,
        /// The name given.
        name: String,
    },
}

impl NameError {
    /// The node-error code.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            NameError::Invalid { .. } | NameError::Escapes { .. } => "invalid_model_name",
            NameError::NotFound { .. } => "model_not_found",
        }
    }
}

/// A models directory.
#[derive(Debug, Clone)]
pub(crate) struct ModelsDir {
    root: PathBuf,
}

impl ModelsDir {
    /// The models directory at `root` (its folders need not exist yet).
    pub(crate) fn new(root: PathBuf) -> Self {
        ModelsDir { root }
    }

    /// The directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The model files of `folder`, as names relative to it (`/`-separated), sorted. Files
    /// that resolve outside the folder are left out; a missing folder lists nothing.
    pub(crate) fn list(&self, folder: &str) -> Vec<String> {
        if !FOLDERS.contains(&folder) {
            return Vec::new();
        }
        let dir = self.root.join(folder);
        let Ok(base) = dir.canonicalize() else {
            return Vec::new();
        };
        let mut names = Vec::new();
        walk(&base, &dir, "", 0, &mut names);
        names.sort();
        names
    }

    /// The file that `name` means in `folder`, checked to stay inside the folder.
    pub(crate) fn resolve(&self, folder: &str, name: &str) -> Result<PathBuf, NameError> {
        let invalid = || NameError::Invalid {
            folder: folder.to_string(),
            name: name.to_string(),
        };
        let relative = Path::new(name);
        let plain = !name.is_empty()
            && !name.contains('\\')
            && relative.components().all(|c| matches!(c, Component::Normal(_)));
        if !plain || !FOLDERS.contains(&folder) {
            return Err(invalid());
        }
        let not_found = || NameError::NotFound {
            folder: folder.to_string(),
            name: name.to_string(),
        };
        let base = self.root.join(folder).canonicalize().map_err(|_| not_found())?;
        let file = base.join(relative).canonicalize().map_err(|_| not_found())?;
        if !file.starts_with(&base) {
            return Err(NameError::Escapes {
                folder: folder.to_string(),
                name: name.to_string(),
            });
        }
        if !file.is_file() {
            return Err(not_found());
        }
        Ok(file)
    }
}

/// Adds the model files under `dir` (shown as `prefix` + name) whose real path is in `base`.
/// Symlinked directories are not followed.
fn walk(base: &Path, dir: &Path, prefix: &str, depth: usize, names: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            if depth < MAX_DEPTH {
                walk(base, &path, &format!("{prefix}{name}/"), depth + 1, names);
            }
            continue;
        }
        let is_model = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
        let inside = path
            .canonicalize()
            .is_ok_and(|real| real.starts_with(base) && real.is_file());
        if is_model && inside {
            names.push(format!("{prefix}{name}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_only_inside_their_folder() {
        let root = tempfile::tempdir().unwrap();
        let ckpt = root.path().join("checkpoints");
        std::fs::create_dir_all(ckpt.join("sd1")).unwrap();
        std::fs::write(ckpt.join("a.safetensors"), b"x").unwrap();
        std::fs::write(ckpt.join("sd1/b.safetensors"), b"x").unwrap();
        std::fs::write(ckpt.join("notes.txt"), b"x").unwrap();
        std::fs::write(root.path().join("secret.safetensors"), b"x").unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(root.path().join("secret.safetensors"), ckpt.join("out.safetensors")).unwrap();
            std::os::unix::fs::symlink(ckpt.join("a.safetensors"), ckpt.join("in.safetensors")).unwrap();
        }
        let models = ModelsDir::new(root.path().to_path_buf());
        let listed = models.list("checkpoints");
        #[cfg(unix)]
        assert_eq!(listed, vec!["a.safetensors", "in.safetensors", "sd1/b.safetensors"]);
        assert!(models.resolve("checkpoints", "a.safetensors").is_ok());
        assert!(models.resolve("checkpoints", "sd1/b.safetensors").is_ok());
        let code = |name: &str| models.resolve("checkpoints", name).unwrap_err().code();
        assert_eq!(code("../secret.safetensors"), "invalid_model_name");
        assert_eq!(code("sd1/../a.safetensors"), "invalid_model_name");
        assert_eq!(
            code(&root.path().join("secret.safetensors").display().to_string()),
            "invalid_model_name"
        );
        assert_eq!(code(""), "invalid_model_name");
        assert_eq!(code("missing.safetensors"), "model_not_found");
        #[cfg(unix)]
        assert_eq!(code("out.safetensors"), "invalid_model_name");
        assert!(models.list("nowhere").is_empty());
        assert_eq!(models.list("loras"), Vec::<String>::new());
    }
}
