//! `embedding:NAME` in prompts: textual-inversion files found only inside the models
//! folder's `embeddings/`, by name or by name plus `.safetensors`, at the top or, as ComfyUI
//! searches every subfolder, in the first subfolder (by sorted path) that has it. ComfyUI also
//! tries `.pt` and `.bin`; those are pickles, which weft refuses with a clear error.

use weft_compute::diffusion::prompt::{Embedding, EmbeddingLookup};
use weft_compute::ComputeError;

use super::models_dir::{ModelsDir, NameError};

/// The folder embeddings are read from.
const FOLDER: &str = "embeddings";

/// Pickle formats ComfyUI loads with `torch.load`, which weft does not read.
const PICKLE_EXTENSIONS: [&str; 3] = ["pt", "bin", "ckpt"];

/// Embeddings of a models directory (none without one).
pub(crate) struct Embeddings<'a>(pub(crate) Option<&'a ModelsDir>);

impl EmbeddingLookup for Embeddings<'_> {
    fn find_for(&self, name: &str, key: &str) -> Result<Option<Embedding>, ComputeError> {
        let Some(dir) = self.0 else {
            return Err(ComputeError::invalid(format!(
                "embedding:{name}: this server has no models directory (weft serve --models-dir)"
            )));
        };
        let refused = |e: NameError| ComputeError::invalid(format!("embedding:{name}: {e}"));
        let pickle = |path: &std::path::Path| {
            path.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| PICKLE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        };
        let found = match dir.resolve(FOLDER, name) {
            Ok(path) => Some(path),
            Err(NameError::NotFound { .. }) => match dir.resolve(FOLDER, &format!("{name}.safetensors")) {
                Ok(path) => Some(path),
                Err(NameError::NotFound { .. }) => None,
                Err(e) => return Err(refused(e)),
            },
            Err(e) => return Err(refused(e)),
        };
        let found = match found {
            Some(path) => Some(path),
            None => in_subfolder(dir, name).map_err(refused)?,
        };
        let Some(path) = found else {
            let pickled = PICKLE_EXTENSIONS
                .iter()
                .any(|ext| dir.resolve(FOLDER, &format!("{name}.{ext}")).is_ok());
            if pickled {
                return Err(ComputeError::invalid(format!(
                    "embedding:{name} is a pickle (.pt/.bin) file, which weft does not load: convert it to .safetensors"
                )));
            }
            return Ok(None);
        };
        if pickle(&path) {
            return Err(ComputeError::invalid(format!(
                "embedding:{name} is a pickle file, which weft does not load: convert it to .safetensors"
            )));
        }
        Embedding::load(&path, name, key).map(Some)
    }
}

/// The first file of a subfolder of `embeddings/` called `name` or `name.safetensors`.
fn in_subfolder(dir: &ModelsDir, name: &str) -> Result<Option<std::path::PathBuf>, NameError> {
    if name.contains('/') {
        return Ok(None);
    }
    let with_extension = format!("{name}.safetensors");
    let listed = dir.list(FOLDER);
    let Some(relative) = listed.iter().find(|path| {
        path.rsplit_once('/')
            .is_some_and(|(_, file)| file == name || file == with_extension)
    }) else {
        return Ok(None);
    };
    dir.resolve(FOLDER, relative).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_inside_the_embeddings_folder() {
        let root = tempfile::tempdir().unwrap();
        let folder = root.path().join(FOLDER);
        std::fs::create_dir_all(&folder).unwrap();
        weft_compute::diffusion::prompt::write_random_embedding(&folder.join("style.safetensors"), 32, 2, 1).unwrap();
        weft_compute::diffusion::prompt::write_random_embedding(&root.path().join("secret.safetensors"), 32, 2, 1)
            .unwrap();
        std::fs::write(folder.join("old.pt"), b"PK").unwrap();
        std::fs::create_dir_all(folder.join("styles/b")).unwrap();
        std::fs::create_dir_all(folder.join("styles/a")).unwrap();
        weft_compute::diffusion::prompt::write_random_embedding(&folder.join("styles/b/deep.safetensors"), 32, 3, 1)
            .unwrap();
        weft_compute::diffusion::prompt::write_random_embedding(&folder.join("styles/a/deep.safetensors"), 32, 1, 1)
            .unwrap();
        let dir = ModelsDir::new(root.path().to_path_buf());
        let lookup = Embeddings(Some(&dir));
        let found = lookup.find("style").unwrap().unwrap();
        assert_eq!((found.rows(), found.width), (2, 32));
        assert_eq!(
            lookup.find("style.safetensors").unwrap().unwrap().vectors,
            found.vectors
        );
        assert_eq!(lookup.find("missing").unwrap(), None);
        // Subfolders are searched as ComfyUI does, the first by sorted path winning.
        assert_eq!(lookup.find("deep").unwrap().unwrap().rows(), 1);
        assert_eq!(lookup.find("deep.safetensors").unwrap().unwrap().rows(), 1);
        assert_eq!(lookup.find("styles/b/deep").unwrap().unwrap().rows(), 3);
        assert_eq!(lookup.find("b/deep").unwrap(), None);
        for refused in ["../secret", "../secret.safetensors", "/etc/passwd", "old", "old.pt"] {
            assert!(lookup.find(refused).is_err(), "{refused}");
        }
        assert!(Embeddings(None).find("style").is_err());
    }
}
