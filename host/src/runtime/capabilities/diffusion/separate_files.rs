//! `load-unet` and `load-clip`: ComfyUI's `UNETLoader`, `CLIPLoader` and `DualCLIPLoader`
//! on the `diffusion_models` and `text_encoders` folders, through the library's model cache
//! (loaded once however many calls ask for the same file at the same time).

use std::path::PathBuf;

use weft_types::NodeErrorCode;

use super::{model_error, node_error, Library};
use crate::runtime::bindings::v0_2::wit::NodeError;
use weft_compute::diffusion::{self as sd, ClipKind, DiffusionModel, TextEncoder};

/// `CLIPLoader`'s and `DualCLIPLoader`'s `device` choices: weights stay on the compute
/// device either way.
const DEVICES: [&str; 2] = ["default", "cpu"];

impl Library {
    /// `UNETLoader`: the UNet file `unet_name` of the `diffusion_models` folder. The fp8
    /// `weight_dtype` choices compute as `default` (weft computes in float32 on the CPU, the
    /// weights held in the file's precision; in the GPU precision on a GPU).
    pub(super) fn unet(&self, unet_name: &str, weight_dtype: &str) -> Result<DiffusionModel, NodeError> {
        if !sd::WEIGHT_DTYPES.contains(&weight_dtype) {
            return Err(node_error(
                NodeErrorCode::InvalidInput,
                format!(
                    "weight_dtype {weight_dtype:?} is not one of {}",
                    sd::WEIGHT_DTYPES.join(", ")
                ),
            ));
        }
        let path = self.resolve("diffusion_models", unet_name)?;
        let gate = self.gate(&path);
        let _one_at_a_time = gate.lock().unwrap_or_else(|e| e.into_inner());
        sd::load_unet(&self.cache, &path, unet_name).map_err(model_error)
    }

    /// `CLIPLoader` (one name) or `DualCLIPLoader` (two) of type `clip_type`, files of the
    /// `text_encoders` folder.
    pub(super) fn clip(&self, clip_names: &[String], clip_type: &str, device: &str) -> Result<TextEncoder, NodeError> {
        if !DEVICES.contains(&device) {
            return Err(node_error(
                NodeErrorCode::InvalidInput,
                format!("device {device:?} is not one of {}", DEVICES.join(", ")),
            ));
        }
        let kind = ClipKind::of(clip_type, clip_names.len()).map_err(|e| node_error(NodeErrorCode::InvalidInput, e))?;
        let files: Vec<(PathBuf, String)> = clip_names
            .iter()
            .map(|name| Ok((self.resolve("text_encoders", name)?, name.clone())))
            .collect::<Result<_, NodeError>>()?;
        let gate = self.gate(&files[0].0);
        let _one_at_a_time = gate.lock().unwrap_or_else(|e| e.into_inner());
        sd::load_clip(&self.cache, &files, kind).map_err(model_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::capabilities::diffusion::DiffusionConfig;

    #[test]
    fn bad_choices_are_invalid_input_before_any_file_is_read() {
        let library = Library::new(&DiffusionConfig::default());
        let code = |e: NodeError| e.code;
        assert_eq!(
            code(library.unet("x.safetensors", "fp4").err().unwrap()),
            "invalid_input"
        );
        let names = ["a.safetensors".to_string()];
        assert_eq!(
            code(library.clip(&names, "flux2", "default").err().unwrap()),
            "invalid_input"
        );
        assert_eq!(
            code(library.clip(&names, "stable_diffusion", "gpu9").err().unwrap()),
            "invalid_input"
        );
        // A supported type goes on to the (missing) models directory.
        assert_eq!(
            code(library.clip(&names, "stable_diffusion", "cpu").err().unwrap()),
            "model_not_found"
        );
    }
}
