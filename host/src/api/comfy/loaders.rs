//! ComfyUI's core model loaders that its web editor requires to be defined, and that weft
//! does not run.
//!
//! The editor (1.27.x) maps model folders to loader classes in a table of ComfyUI's core
//! loaders and, on the first combo widget named `ckpt_name`, `lora_name` or `vae_name`,
//! reads the `name` of every class in that table. A class missing from `/object_info`
//! makes that read throw, so the node being built (the default graph's
//! `CheckpointLoaderSimple`) is left half-made, with no widgets and no `class_type`, and the
//! prompt the editor sends cannot run. Later editors skip missing classes; this one needs
//! them listed.
//!
//! So `/object_info` lists each of these classes that no plugin provides with ComfyUI's
//! signature (model-file combos of what weft lists in the folder, its outputs), marked
//! `deprecated`: the editor hides it in its node library and search, and a workflow that
//! names it loads with its widgets. A prompt that uses one is refused like any class weft
//! does not have, since none is in the catalogue.

use serde_json::{json, Map, Value as Json};

/// One input of a listed loader.
enum Input {
    /// A combo of the files of a models folder.
    Files(&'static str),
    /// A combo of fixed choices.
    Choice(&'static [&'static str]),
}

/// One of ComfyUI's core loaders, as ComfyUI describes it.
struct Loader {
    class: &'static str,
    display_name: &'static str,
    category: &'static str,
    inputs: &'static [(&'static str, Input)],
    outputs: &'static [&'static str],
}

/// The loaders of the editor's table (`modelToNodeStore`'s defaults) that weft's own
/// plugins do not provide.
const LOADERS: &[Loader] = &[
    Loader {
        class: "ImageOnlyCheckpointLoader",
        display_name: "Image Only Checkpoint Loader (img2vid model)",
        category: "loaders/video_models",
        inputs: &[("ckpt_name", Input::Files("checkpoints"))],
        outputs: &["MODEL", "CLIP_VISION", "VAE"],
    },
    Loader {
        class: "UNETLoader",
        display_name: "Load Diffusion Model",
        category: "advanced/loaders",
        inputs: &[
            ("unet_name", Input::Files("diffusion_models")),
            (
                "weight_dtype",
                Input::Choice(&["default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2"]),
            ),
        ],
        outputs: &["MODEL"],
    },
    Loader {
        class: "UpscaleModelLoader",
        display_name: "Load Upscale Model",
        category: "loaders",
        inputs: &[("model_name", Input::Files("upscale_models"))],
        outputs: &["UPSCALE_MODEL"],
    },
    Loader {
        class: "StyleModelLoader",
        display_name: "Load Style Model",
        category: "loaders",
        inputs: &[("style_model_name", Input::Files("style_models"))],
        outputs: &["STYLE_MODEL"],
    },
    Loader {
        class: "GLIGENLoader",
        display_name: "GLIGENLoader",
        category: "loaders",
        inputs: &[("gligen_name", Input::Files("gligen"))],
        outputs: &["GLIGEN"],
    },
];

/// The `/object_info` entries of the loaders that `provided` (is a class in the catalogue)
/// says no plugin provides, limited to `class` when one is asked for; `files` lists a
/// models folder.
pub(super) fn object_info(
    class: Option<&str>,
    provided: impl Fn(&str) -> bool,
    files: impl Fn(&str) -> Vec<String>,
) -> Vec<(String, Json)> {
    LOADERS
        .iter()
        .filter(|l| class.is_none_or(|c| c == l.class) && !provided(l.class))
        .map(|l| (l.class.to_string(), describe(l, &files)))
        .collect()
}

/// One loader in ComfyUI's `/object_info` shape.
fn describe(loader: &Loader, files: &impl Fn(&str) -> Vec<String>) -> Json {
    let required: Map<String, Json> = loader
        .inputs
        .iter()
        .map(|(name, input)| {
            let choices = match input {
                Input::Files(folder) => json!(files(folder)),
                Input::Choice(choices) => json!(choices),
            };
            (name.to_string(), json!([choices, {}]))
        })
        .collect();
    let order: Vec<&str> = loader.inputs.iter().map(|(name, _)| *name).collect();
    json!({
        "input": {"required": required, "optional": {}, "hidden": {}},
        "input_order": {"required": order, "optional": []},
        "output": loader.outputs,
        "output_is_list": vec![false; loader.outputs.len()],
        "output_name": loader.outputs,
        "name": loader.class,
        "display_name": loader.display_name,
        "description": "ComfyUI's loader, listed for ComfyUI's web editor: weft does not run it.",
        "category": loader.category,
        "output_node": false,
        "python_module": "weft.unavailable",
        "deprecated": true,
    })
}
