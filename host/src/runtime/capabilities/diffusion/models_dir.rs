//! The operator's ComfyUI-style models folder: `checkpoints/`, `loras/`, `vae/`,
//! `embeddings/`, `diffusion_models/` (and the legacy `unet/`), `text_encoders/` (and the
//! legacy `clip/`), `upscale_models/` and `controlnet/` (and the legacy `t2i_adapter/`) under one
//! directory. Files are listed by walking the folder (the catalogue
//! reads them through [`ModelListings`](super::listings::ModelListings), which keeps a walk
//! until the folder changes: no restart to pick up a new checkpoint), and a workflow's name is resolved only inside
//! its folder: absolute names, `..`, and symlinks that lead out of the folder are refused.

use std::path::{Component, Path, PathBuf};

/// The folders of a models directory that nodes may name files in.
pub(crate) const FOLDERS: [&str; 8] = [
    "checkpoints",
    "loras",
    "vae",
    "embeddings",
    "diffusion_models",
    "text_encoders",
    "upscale_models",
    "controlnet",
];

/// The directories of the models directory that hold model files: each folder's own, and
/// the legacy ones ComfyUI still lists under a folder's name (`unet`, `clip`, `t2i_adapter`).
pub(crate) const DIRECTORIES: [&str; 11] = [
    "checkpoints",
    "loras",
    "vae",
    "embeddings",
    "diffusion_models",
    "unet",
    "text_encoders",
    "clip",
    "upscale_models",
    "controlnet",
    "t2i_adapter",
];

/// The directories folder `folder` lists, in the order a name is looked up in them (as
/// ComfyUI's `folder_paths`: `diffusion_models` is `unet` and `diffusion_models`,
/// `text_encoders` is `text_encoders` and `clip`, `controlnet` is `controlnet` and
/// `t2i_adapter`).
fn directories(folder: &str) -> &'static [&'static str] {
    match folder {
        "diffusion_models" => &["unet", "diffusion_models"],
        "text_encoders" => &["text_encoders", "clip"],
        "checkpoints" => &["checkpoints"],
        "loras" => &["loras"],
        "vae" => &["vae"],
        "embeddings" => &["embeddings"],
        "upscale_models" => &["upscale_models"],
        "controlnet" => &["controlnet", "t2i_adapter"],
        _ => &[],
    }
}

/// File extensions listed (weft loads safetensors only, but for upscale models).
const EXTENSIONS: [&str; 2] = ["safetensors", "sft"];

/// File extensions listed in `upscale_models`: safetensors and PyTorch's zip files, which
/// the upscale models are read from without running their pickled code.
const UPSCALE_EXTENSIONS: [&str; 5] = ["safetensors", "sft", "pth", "pt", "ckpt"];

/// The file extensions listed in `folder`.
fn extensions(folder: &str) -> &'static [&'static str] {
    if folder == "upscale_models" {
        &UPSCALE_EXTENSIONS
    } else {
        &EXTENSIONS
    }
}

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

    /// The model files of `folder` (of each of its directories), as names relative to it
    /// (`/`-separated), sorted, each once. Files that resolve outside their directory are
    /// left out; a missing directory lists nothing.
    pub(crate) fn list(&self, folder: &str) -> Vec<String> {
        let mut names = Vec::new();
        for directory in directories(folder) {
            let dir = self.root.join(directory);
            if let Ok(base) = dir.canonicalize() {
                walk(&base, &dir, ("", extensions(folder)), 0, &mut names);
            }
        }
        names.sort();
        names.dedup();
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
        let mut escaped = false;
        for directory in directories(folder) {
            let Ok(base) = self.root.join(directory).canonicalize() else {
                continue;
            };
            let Ok(file) = base.join(relative).canonicalize() else {
                continue;
            };
            if !file.starts_with(&base) {
                escaped = true;
            } else if file.is_file() {
                return Ok(file);
            }
        }
        if escaped {
            return Err(NameError::Escapes {
                folder: folder.to_string(),
                name: name.to_string(),
            });
        }
        Err(not_found())
    }
}

/// Adds the model files under `dir` (shown as `prefix` + name, of one of `extensions`)
/// whose real path is in `base`. Symlinked directories are not followed.
fn walk(base: &Path, dir: &Path, (prefix, extensions): (&str, &[&str]), depth: usize, names: &mut Vec<String>) {
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
                walk(base, &path, (&format!("{prefix}{name}/"), extensions), depth + 1, names);
            }
            continue;
        }
        let is_model = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| extensions.contains(&e.to_ascii_lowercase().as_str()));
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

    #[test]
    fn the_legacy_unet_and_clip_directories_are_listed_and_resolved_under_the_new_names() {
        let root = tempfile::tempdir().unwrap();
        for (dir, file) in [
            ("unet", "old.safetensors"),
            ("diffusion_models", "new.safetensors"),
            ("clip", "clip_l.safetensors"),
            ("text_encoders", "clip_g.safetensors"),
        ] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
            std::fs::write(root.path().join(dir).join(file), b"x").unwrap();
        }
        let models = ModelsDir::new(root.path().to_path_buf());
        assert_eq!(models.list("diffusion_models"), ["new.safetensors", "old.safetensors"]);
        assert_eq!(
            models.list("text_encoders"),
            ["clip_g.safetensors", "clip_l.safetensors"]
        );
        assert!(models.resolve("diffusion_models", "old.safetensors").is_ok());
        assert!(models.resolve("text_encoders", "clip_l.safetensors").is_ok());
        assert_eq!(
            models.resolve("unet", "old.safetensors").unwrap_err().code(),
            "invalid_model_name"
        );
    }
}
