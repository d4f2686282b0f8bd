//! Loading checkpoints for the diffusion nodes: which layout a file has, loading it
//! through the shared [`ModelCache`], and the errors a node reports for a bad file.

use std::path::Path;
use std::sync::Arc;

use crate::models::layout::{detect_config, open_checkpoint, sd2_predicts_v, Family, ModelConfig};
use crate::models::safetensors::{CheckpointError, SafetensorsIndex, DEFAULT_MAX_HEADER};
use crate::models::{CheckpointModels, ModelCache};

/// Why a model file could not be used. Messages name the file as the workflow did, never
/// the operator's path.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The file is not a model weft can use: truncated, malformed, another architecture.
    #[error("{0}")]
    Invalid(String),
    /// Loading failed for another reason.
    #[error("{0}")]
    Failed(String),
}

impl ModelError {
    /// The node-error code.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::NotFound(_) => "model_not_found",
            ModelError::Invalid(_) => "invalid_model",
            ModelError::Failed(_) => "compute_failed",
        }
    }

    /// The error for a failure on the file at `path`, which the workflow called `name`.
    pub fn from_checkpoint(e: &CheckpointError, path: &Path, name: &str) -> Self {
        let message = e.to_string().replace(&path.display().to_string(), name);
        match e {
            CheckpointError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ModelError::NotFound(format!("{name}: no such model file"))
            }
            CheckpointError::Io { .. } => ModelError::Failed(message),
            _ => ModelError::Invalid(message),
        }
    }

    /// The error for a load of the file at `path` (called `name`) that failed with `e`.
    pub(crate) fn from_load(e: anyhow::Error, path: &Path, name: &str) -> Self {
        match e.downcast_ref::<CheckpointError>() {
            Some(c) => Self::from_checkpoint(c, path, name),
            None => ModelError::Failed(format!("{name}: {e:#}").replace(&path.display().to_string(), name)),
        }
    }
}

/// The layout of the checkpoint at `path`: Stable Diffusion 1.x, SD2.x (eps or v prediction,
/// as the file says), SDXL (with the transformer depths the file has, so distilled SDXL
/// models load too), the SDXL refiner, or weft's tiny test layouts (`weft models tiny-sd`). Other families and incomplete files are
/// [`CheckpointError`]s that say what was found.
pub fn detect_layout(path: &Path) -> Result<ModelConfig, CheckpointError> {
    let index = SafetensorsIndex::open(path, DEFAULT_MAX_HEADER)?;
    let unsupported = |detail: String| CheckpointError::WrongArch {
        path: path.to_path_buf(),
        detail,
    };
    match detect_config(&index) {
        Ok(config) => Ok(config),
        Err(found) => {
            for tiny in [
                ModelConfig::tiny(),
                ModelConfig::tiny_sdxl(),
                ModelConfig::tiny_sdxl_refiner(),
                ModelConfig::tiny_sd2(),
            ] {
                match open_checkpoint(path, &tiny, DEFAULT_MAX_HEADER) {
                    Ok(index) if tiny.family == Family::Sd2 => {
                        let v_prediction = sd2_predicts_v(&index).map_err(unsupported)?;
                        return Ok(ModelConfig { v_prediction, ..tiny });
                    }
                    Ok(_) => return Ok(tiny),
                    Err(CheckpointError::MissingKeys { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(unsupported(found))
        }
    }
}

/// The networks of the checkpoint at `path` (called `name` in messages), from `cache` or
/// loaded into it.
pub fn load_checkpoint(cache: &ModelCache, path: &Path, name: &str) -> Result<Arc<CheckpointModels>, ModelError> {
    let layout = detect_layout(path).map_err(|e| ModelError::from_checkpoint(&e, path, name))?;
    cache
        .get(path, &layout)
        .map_err(|e| ModelError::from_load(e, path, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::write_random_checkpoint;

    #[test]
    fn bad_files_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("tiny.safetensors");
        write_random_checkpoint(&good, &ModelConfig::tiny(), 3).unwrap();
        assert_eq!(detect_layout(&good).unwrap(), ModelConfig::tiny());

        let cache = ModelCache::new(u64::MAX, candle_core::Device::Cpu);
        let error = |path: &Path, name: &str| load_checkpoint(&cache, path, name).err().expect("a load error");
        let missing = error(&dir.path().join("nope.safetensors"), "nope.safetensors");
        assert_eq!(missing.code(), "model_not_found");

        let bytes = std::fs::read(&good).unwrap();
        let cut = dir.path().join("cut.safetensors");
        std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
        let truncated = error(&cut, "cut.safetensors");
        assert_eq!(truncated.code(), "invalid_model");
        assert!(truncated.to_string().contains("cut.safetensors"), "{truncated}");
        assert!(
            !truncated.to_string().contains(&dir.path().display().to_string()),
            "{truncated}"
        );

        let junk = dir.path().join("junk.safetensors");
        std::fs::write(&junk, b"not a safetensors file at all").unwrap();
        assert_eq!(error(&junk, "junk").code(), "invalid_model");
    }
}
