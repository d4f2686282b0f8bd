//! `weft:node/diffusion` (contract 0.2.0): Stable Diffusion for nodes, by handle. Models
//! come from the operator's models folder ([`ModelsDir`]) through one [`ModelCache`] shared
//! by every job; conditioning, latents and images stay host-side. Sampling reports each
//! step as progress, and a cancel or the node's deadline stops it before the next step.
//!
//! Public face: [`DiffusionConfig`] (operator settings), [`Library`] (what all calls
//! share: the capability's configuration), [`DiffusionState`] (one call's part of
//! `CallState`), and [`Library::list`] for the catalogue's model-file combos.

mod controlnet;
mod embeddings;
mod latent_ops;
mod listings;
mod model_patches;
mod models_dir;
mod separate_files;
mod upscale;

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use wasmtime::component::{Linker, Resource};
use weft_types::NodeErrorCode;

use super::{own, CallState, Capabilities, Capability, CapabilityCtx, Own};
use crate::runtime::bindings::v0_2::weft::node::diffusion::{
    add_to_linker, Area, AreaFraction, Checkpoint, Host, InpaintConditioning, LatentChange, LatentCombination,
    SampleOptions, SizeConditioning as WitSizeConditioning,
};
use crate::runtime::bindings::v0_2::wit::{AssetRef, NodeError};
use crate::runtime::call::{read_asset, AssetReader, CallContext, Interrupt, ProgressSink};
use crate::runtime::limits::Limits;
use crate::runtime::memory::{Charge, Held, MemoryLimit};
use crate::runtime::value::{Handle, HandleRes, ImageRes, LatentRes, MaskRes};
use weft_compute::diffusion::{
    self as sd, Autoencoder, Conditioning, DiffusionModel, EncoderTexts, GuiderKind, Lora, ModelError, NoiseSpec,
    SampleFailure, SampleSettings, SizeConditioning, StandaloneVae, TextEncoder,
};
use weft_compute::models::{CheckpointModels, ModelCache, Sd1Vae, Unet};
use weft_compute::sampling::{SamplerKind, Scheduler, StepControl};
use weft_compute::values::{LatentBatch, Opaque};
use weft_compute::{device, ComputeError};

use embeddings::Embeddings;
use listings::ModelListings;
pub(crate) use models_dir::ModelsDir;

/// Operator settings of the diffusion capability (`weft serve --models-dir`,
/// `--model-cache-mib`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffusionConfig {
    /// The ComfyUI-style models directory; none means no model files.
    pub models_dir: Option<PathBuf>,
    /// Bytes of loaded weights kept for later jobs. 8 GiB by default: two SD1.5 checkpoints
    /// stored in float32 (about 4.3 GB each held), or an SDXL one stored in float16 (about 7).
    pub model_cache_bytes: u64,
}

impl DiffusionConfig {
    /// The default of [`model_cache_bytes`](Self::model_cache_bytes), in MiB
    /// (`--model-cache-mib`).
    pub const DEFAULT_MODEL_CACHE_MIB: u64 = 8192;
}

impl Default for DiffusionConfig {
    fn default() -> Self {
        DiffusionConfig {
            models_dir: None,
            model_cache_bytes: Self::DEFAULT_MODEL_CACHE_MIB << 20,
        }
    }
}

/// What every call shares: the models folder and the loaded models.
pub struct Library {
    /// What it was made from.
    config: DiffusionConfig,
    models_dir: Option<ModelsDir>,
    /// The models folder's listings, kept while it does not change.
    listings: Option<ModelListings>,
    cache: ModelCache,
    /// One gate per checkpoint file: jobs asking for the same file at once wait for one
    /// load instead of loading it twice.
    loading: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

impl Library {
    /// A library for `config`; models load onto the compute device on first use.
    pub fn new(config: &DiffusionConfig) -> Self {
        let models_dir = config.models_dir.clone().map(ModelsDir::new);
        Library {
            config: config.clone(),
            listings: models_dir.clone().map(ModelListings::new),
            models_dir,
            cache: ModelCache::new(config.model_cache_bytes, device::select_device()),
            loading: Mutex::default(),
        }
    }

    /// What the library was made from.
    pub fn config(&self) -> &DiffusionConfig {
        &self.config
    }

    /// The networks of checkpoint file `path` (called `name`), loaded once however many
    /// calls ask for it at the same time.
    fn checkpoint(&self, path: &Path, name: &str) -> Result<Arc<CheckpointModels>, ModelError> {
        let gate = self.gate(path);
        let _one_at_a_time = gate.lock().unwrap_or_else(|e| e.into_inner());
        sd::load_checkpoint(&self.cache, path, name)
    }

    /// The gate of the file at `path`: a load holds it, so others wait for that load.
    fn gate(&self, path: &Path) -> Arc<Mutex<()>> {
        self.loading
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }

    /// The files of models folder `folder` as they are now (nothing without a models
    /// directory): walked at the first call after the folder changed, kept until then.
    pub fn list(&self, folder: &str) -> Vec<String> {
        self.listings.as_ref().map(|l| l.list(folder)).unwrap_or_default()
    }

    fn resolve(&self, folder: &str, name: &str) -> Result<PathBuf, NodeError> {
        let dir = self.models_dir.as_ref().ok_or_else(|| NodeError {
            code: NodeErrorCode::ModelNotFound.into(),
            message: format!("{name:?}: this server has no models directory (weft serve --models-dir)"),
        })?;
        dir.resolve(folder, name).map_err(|e| NodeError {
            code: e.code().into(),
            message: e.to_string(),
        })
    }
}

impl Default for Library {
    fn default() -> Self {
        Library::new(&DiffusionConfig::default())
    }
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The diffusion capability.
pub struct Diffusion;

impl Capability for Diffusion {
    type Config = Arc<Library>;
    type State = DiffusionState;

    fn link(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        add_to_linker::<_, Own<Self>>(linker, own::<Self>)
    }

    fn new_state(library: &Arc<Library>, _: &Limits, call: &CallContext, _: &Capabilities) -> DiffusionState {
        DiffusionState {
            library: library.clone(),
            progress: call.progress.clone(),
            assets: call.assets.clone(),
        }
    }
}

/// One call's diffusion state: the shared library, where sampler steps are reported and
/// where latent files are read from.
pub struct DiffusionState {
    library: Arc<Library>,
    progress: Arc<dyn ProgressSink>,
    assets: Arc<dyn AssetReader>,
}

/// What this capability's host functions see: the core and its own state.
type Ctx<'a> = CapabilityCtx<'a, DiffusionState>;

fn node_error(code: impl Into<String>, message: impl Into<String>) -> NodeError {
    NodeError {
        code: code.into(),
        message: message.into(),
    }
}

fn compute_error(e: ComputeError) -> NodeError {
    node_error(e.code(), e.to_string())
}

fn model_error(e: ModelError) -> NodeError {
    node_error(e.code(), e.to_string())
}

/// `Ok(Err(..))` out of a host function for a node error.
macro_rules! fail {
    ($e:expr) => {
        return Ok(Err($e))
    };
}

/// The value of a `Result<T, NodeError>`, or returns the node error from the host function.
macro_rules! attempt {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => fail!(e),
        }
    };
}

// After the macros, which it uses.
mod custom_sampling;

impl Ctx<'_> {
    /// The payload of a handle of ComfyUI type `type_name`; a node error for another type.
    fn payload<T: Any + Send + Sync>(
        &self,
        handle: &Resource<HandleRes>,
        type_name: &str,
    ) -> wasmtime::Result<Result<Arc<T>, NodeError>> {
        let held = &self.core.table.get(handle)?.0;
        if &*held.type_name != type_name {
            return Ok(Err(node_error(
                NodeErrorCode::InvalidInput,
                format!("expected a {type_name} handle, got {}", held.type_name),
            )));
        }
        Ok(held.object.payload.clone().downcast::<T>().map_err(|_| {
            node_error(
                NodeErrorCode::InvalidInput,
                format!("this {type_name} was not made by the diffusion nodes"),
            )
        }))
    }

    /// Keeps `payload` as a handle of type `type_name`, paid for by `charge`.
    fn push_handle<T: Any + Send + Sync>(
        &mut self,
        type_name: &str,
        name: String,
        len: u32,
        payload: Arc<T>,
        charge: Charge,
    ) -> wasmtime::Result<Resource<HandleRes>> {
        let object = Opaque { name, len, payload };
        Ok(self
            .core
            .table
            .push(HandleRes(Handle::new(type_name, object, charge)))?)
    }

    /// Keeps a model-like payload: operator data in the model cache, charged nothing.
    fn push_model<T: Any + Send + Sync>(
        &mut self,
        type_name: &str,
        name: String,
        payload: Arc<T>,
    ) -> wasmtime::Result<Resource<HandleRes>> {
        let free = self.core.charge(0, String::new)?;
        self.push_handle(type_name, name, 0, payload, free)
    }

    /// Keeps `patched`, a patch of the `MODEL` handle `from`, under `from`'s name.
    fn push_patched_model(
        &mut self,
        from: &Resource<HandleRes>,
        patched: DiffusionModel,
    ) -> wasmtime::Result<Resource<HandleRes>> {
        let name = self.core.table.get(from)?.0.object.name.clone();
        self.push_model("MODEL", name, Arc::new(patched))
    }

    /// Keeps `guider`, made over the `MODEL` handle `model`, as a `GUIDER` under its name.
    fn push_guider(
        &mut self,
        model: &Resource<HandleRes>,
        guider: weft_compute::diffusion::Guider,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let name = self.core.table.get(model)?.0.object.name.clone();
        Ok(Ok(self.push_setting("GUIDER", name, guider)?))
    }

    fn push_conditioning(&mut self, c: Conditioning) -> wasmtime::Result<Resource<HandleRes>> {
        self.push_conditioning_with(c, 0)
    }

    /// Keeps `c`, charged for its tensors and `extra` bytes it holds besides (a control image).
    fn push_conditioning_with(&mut self, c: Conditioning, extra: u64) -> wasmtime::Result<Resource<HandleRes>> {
        let len = c.0.len() as u32;
        let mask_bytes = |e: &sd::CondEntry| {
            let inpaint = e.concat_latent_image.as_ref().map_or(0, |t| t.data.len())
                + e.concat_mask.as_ref().map_or(0, |m| m.data.len());
            e.mask.as_ref().map_or(0, |m| m.mask.data.len() as u64 * 4) + inpaint as u64 * 4
        };
        let bytes: u64 =
            c.0.iter()
                .map(|e| e.context.elem_count() as u64 * 4 + mask_bytes(e))
                .sum::<u64>()
                + extra;
        let charge = self.core.charge(bytes, || format!("a conditioning of {len} entries"))?;
        self.push_handle("CONDITIONING", format!("{len} entries"), len, Arc::new(c), charge)
    }

    fn latent(&self, handle: &Resource<LatentRes>) -> wasmtime::Result<Arc<Held<LatentBatch>>> {
        Ok(self.core.table.get(handle)?.0.clone())
    }

    /// Charges a latent batch of `shape` (and `extra` bytes of working space) before it is
    /// made; `what` names the work.
    fn charge_latent(&self, shape: [u32; 4], extra: u64, what: &str) -> Result<Charge, MemoryLimit> {
        let bytes = shape.iter().map(|&d| u64::from(d)).product::<u64>() * 4 + extra;
        let [b, c, h, w] = shape;
        self.core.charge(bytes, || format!("{what} ({b}x{c}x{h}x{w} latent)"))
    }

    /// Keeps `latent`, paid for by `charge` (trimmed to its real size).
    fn push_latent(&mut self, latent: LatentBatch, mut charge: Charge) -> wasmtime::Result<Resource<LatentRes>> {
        let mask = latent.noise_mask.as_ref().map_or(0, |m| m.data.len());
        charge.shrink_to((latent.data.len() + mask) as u64 * 4);
        Ok(self.core.table.push(LatentRes(Arc::new(Held::new(latent, charge))))?)
    }

    /// Why the call must stop now, if it must: a cancel, or its deadline passed.
    fn interruption(&self) -> Option<Interrupt> {
        self.core.deadline.check().err()
    }

    /// The question compute's forward passes ask between their blocks: whether this call
    /// must stop (its job was canceled or its deadline passed).
    fn stop_question(&self) -> impl Fn() -> bool + Sync + 'static {
        let deadline = self.core.deadline.clone();
        move || deadline.check().is_err()
    }

    /// A compute result as a host function's: an interrupted computation traps the call
    /// with the deadline's reason (`node_timeout` or the cancel), other failures are node
    /// errors.
    fn computed<T>(&self, result: Result<T, ComputeError>) -> wasmtime::Result<Result<T, NodeError>> {
        match result {
            Ok(value) => Ok(Ok(value)),
            Err(ComputeError::Interrupted) => Err(self.interruption().unwrap_or(Interrupt::Canceled).into()),
            Err(e) => Ok(Err(compute_error(e))),
        }
    }
}

impl Ctx<'_> {
    /// Runs `sampling` with a step callback that reports each step (and a preview in the
    /// model's latent `colours`) and stops the run once the call must stop, and the
    /// interruption its forward passes ask. A stopped run traps the call with the reason;
    /// other failures are node errors.
    fn sample_reporting<T>(
        &self,
        colours: &weft_compute::preview::LatentRgb,
        sampling: impl FnOnce(
            &mut dyn FnMut(&weft_compute::sampling::StepInfo<'_>) -> StepControl,
            weft_compute::interrupt::Interrupt<'_>,
        ) -> Result<T, SampleFailure>,
    ) -> wasmtime::Result<Result<T, NodeError>> {
        if let Some(stop) = self.interruption() {
            return Err(stop.into());
        }
        let mut stopped_by = None;
        let stop = self.stop_question();
        let result = {
            let on_step = &mut |step: &weft_compute::sampling::StepInfo<'_>| {
                let progress = &self.state.progress;
                progress.report(step.step as u32 + 1, step.total as u32, None);
                if let Some(png) = preview_png(step.denoised, colours) {
                    progress.preview("image/png", png);
                }
                match self.interruption() {
                    None => StepControl::Continue,
                    Some(why) => {
                        stopped_by = Some(why);
                        StepControl::Stop
                    }
                }
            };
            sampling(on_step, weft_compute::interrupt::Interrupt::new(&stop))
        };
        match result {
            Ok(out) => Ok(Ok(out)),
            Err(SampleFailure::Stopped(_)) => Err(stopped_by.unwrap_or(Interrupt::Canceled).into()),
            Err(SampleFailure::Interrupted) => Err(self.interruption().unwrap_or(Interrupt::Canceled).into()),
            Err(SampleFailure::Compute(e)) => Ok(Err(compute_error(e))),
        }
    }

    /// Charges a VAE encode of `image`: its cropped copy, the working activations and the
    /// latent (with a noise mask at pixel resolution, for inpainting).
    fn charge_encode(&self, vae: &Autoencoder, image: &weft_compute::image::ImageBatch) -> Result<Charge, MemoryLimit> {
        let (b, w, h) = (image.batch, image.width, image.height);
        let pixels = tensor_bytes(&[u64::from(b), u64::from(h), u64::from(w)]);
        // The images are encoded one at a time.
        let working = Sd1Vae::encode_working_bytes(vae.config(), 1, (h as usize, w as usize));
        let bytes = pixels * 3 + working + pixels / 16 + pixels;
        self.core.charge(bytes, || format!("encoding {b} image(s) of {w}x{h}"))
    }
}

/// Bytes of one float32 tensor of `shape`.
fn tensor_bytes(shape: &[u64]) -> u64 {
    shape.iter().product::<u64>() * 4
}

/// Working memory of one UNet call of a sampling run on `latent` ([`Unet::working_bytes`]):
/// every latent of the batch once per conditioning entry (positive and, with guidance,
/// negative ones run in one batch), under the longest context.
fn unet_working_bytes(model: &DiffusionModel, shape: [u32; 4], conds: &[&Conditioning]) -> u64 {
    let [b, _, h, w] = shape.map(|d| d as usize);
    let entries: usize = conds.iter().map(|c| c.0.len()).sum();
    let tokens = conds
        .iter()
        .flat_map(|c| c.0.iter())
        .map(|e| e.context.dim(1).unwrap_or(0))
        .max()
        .unwrap_or(0);
    let controls = sd::controlnet::working_bytes(
        conds.iter().flat_map(|c| c.0.iter()),
        b * entries.max(1),
        (h, w),
        tokens,
    );
    Unet::working_bytes(&model.checkpoint.config, b * entries.max(1), (h, w), tokens) + controls
}

impl Host for Ctx<'_> {
    fn load_checkpoint(&mut self, ckpt_name: String) -> wasmtime::Result<Result<Checkpoint, NodeError>> {
        let library = self.state.library.clone();
        let path = attempt!(library.resolve("checkpoints", &ckpt_name));
        let models = attempt!(library.checkpoint(&path, &ckpt_name).map_err(model_error));
        let model = Arc::new(DiffusionModel::new(models.clone(), path.clone()));
        let clip = Arc::new(TextEncoder::new(models.clone(), path));
        let vae = Arc::new(Autoencoder::Checkpoint(models));
        Ok(Ok(Checkpoint {
            model: self.push_model("MODEL", ckpt_name.clone(), model)?,
            clip: self.push_model("CLIP", ckpt_name.clone(), clip)?,
            vae: self.push_model("VAE", ckpt_name, vae)?,
        }))
    }

    fn load_vae(&mut self, vae_name: String) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let path = attempt!(self.state.library.resolve("vae", &vae_name));
        let own = attempt!(StandaloneVae::load(&path, &vae_name, &device::select_device()).map_err(model_error));
        let vae = Arc::new(Autoencoder::File(Arc::new(own)));
        Ok(Ok(self.push_model("VAE", vae_name, vae)?))
    }

    fn load_unet(
        &mut self,
        unet_name: String,
        weight_dtype: String,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let model = attempt!(self.state.library.unet(&unet_name, &weight_dtype));
        Ok(Ok(self.push_model("MODEL", unet_name, Arc::new(model))?))
    }

    fn load_clip(
        &mut self,
        clip_names: Vec<String>,
        clip_type: String,
        device: String,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let clip = attempt!(self.state.library.clip(&clip_names, &clip_type, &device));
        Ok(Ok(self.push_model("CLIP", clip_names.join(" + "), Arc::new(clip))?))
    }

    fn load_lora(
        &mut self,
        model: Resource<HandleRes>,
        clip: Option<Resource<HandleRes>>,
        lora_name: String,
        strength_model: f64,
        strength_clip: f64,
    ) -> wasmtime::Result<Result<(Resource<HandleRes>, Option<Resource<HandleRes>>), NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let encoder = match &clip {
            Some(clip) => Some(attempt!(self.payload::<TextEncoder>(clip, "CLIP")?)),
            None => None,
        };
        let path = attempt!(self.state.library.resolve("loras", &lora_name));
        let lora = Arc::new(attempt!(Lora::read(&path, &lora_name).map_err(model_error)));
        let patched = attempt!(base.with_lora(lora.clone(), strength_model).map_err(model_error));
        let label = |name: &str| format!("{name} + {lora_name}");
        let model_name = label(&self.core.table.get(&model)?.0.object.name);
        let model = self.push_model("MODEL", model_name, Arc::new(patched))?;
        let clip = match (encoder, clip) {
            (Some(encoder), Some(handle)) => {
                let name = label(&self.core.table.get(&handle)?.0.object.name);
                let patched = attempt!(encoder.with_lora(lora, strength_clip).map_err(model_error));
                Some(self.push_model("CLIP", name, Arc::new(patched))?)
            }
            _ => None,
        };
        Ok(Ok((model, clip)))
    }

    fn model_sampling_discrete(
        &mut self,
        model: Resource<HandleRes>,
        sampling: String,
        zsnr: bool,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let patched = attempt!(model_patches::discrete(&base, &sampling, zsnr));
        Ok(Ok(self.push_patched_model(&model, patched)?))
    }

    fn model_sampling_continuous_edm(
        &mut self,
        model: Resource<HandleRes>,
        sampling: String,
        sigma_max: f64,
        sigma_min: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let patched = attempt!(model_patches::continuous_edm(&base, &sampling, sigma_max, sigma_min));
        Ok(Ok(self.push_patched_model(&model, patched)?))
    }

    fn rescale_cfg(
        &mut self,
        model: Resource<HandleRes>,
        multiplier: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let patched = attempt!(model_patches::rescale_cfg(&base, multiplier));
        Ok(Ok(self.push_patched_model(&model, patched)?))
    }

    fn clip_set_last_layer(
        &mut self,
        clip: Resource<HandleRes>,
        stop_at_clip_layer: i32,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let encoder = attempt!(self.payload::<TextEncoder>(&clip, "CLIP")?);
        let shorter = attempt!(encoder.with_last_layer(stop_at_clip_layer).map_err(compute_error));
        let name = self.core.table.get(&clip)?.0.object.name.clone();
        Ok(Ok(self.push_model("CLIP", name, Arc::new(shorter))?))
    }

    fn encode_text(
        &mut self,
        clip: Resource<HandleRes>,
        text: String,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        self.core.hostcalls.charge(text.len())?;
        let encoder = attempt!(self.payload::<TextEncoder>(&clip, "CLIP")?);
        let embeddings = Embeddings(self.state.library.models_dir.as_ref());
        let stop = self.stop_question();
        let encoded = encoder.encode(&text, Some(&embeddings), weft_compute::interrupt::Interrupt::new(&stop));
        let encoded = attempt!(self.computed(encoded)?);
        let conditioning = Conditioning::from_encoded(encoded.context, encoded.pooled, Default::default());
        Ok(Ok(self.push_conditioning(conditioning)?))
    }

    fn encode_text_sdxl(
        &mut self,
        clip: Resource<HandleRes>,
        text_g: String,
        text_l: String,
        size: WitSizeConditioning,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        self.core.hostcalls.charge(text_g.len() + text_l.len())?;
        let numbers = [
            size.width,
            size.height,
            size.crop_w,
            size.crop_h,
            size.target_width,
            size.target_height,
            size.aesthetic_score,
        ];
        if numbers.iter().flatten().any(|n| !n.is_finite()) {
            fail!(node_error(
                NodeErrorCode::InvalidInput,
                "size conditioning numbers must be finite"
            ));
        }
        let encoder = attempt!(self.payload::<TextEncoder>(&clip, "CLIP")?);
        let embeddings = Embeddings(self.state.library.models_dir.as_ref());
        let stop = self.stop_question();
        let texts = EncoderTexts {
            clip_l: &text_l,
            clip_g: &text_g,
        };
        let encoded = encoder.encode_each(texts, Some(&embeddings), weft_compute::interrupt::Interrupt::new(&stop));
        let encoded = attempt!(self.computed(encoded)?);
        let size = SizeConditioning {
            width: size.width,
            height: size.height,
            crop_w: size.crop_w,
            crop_h: size.crop_h,
            target_width: size.target_width,
            target_height: size.target_height,
            aesthetic_score: size.aesthetic_score,
        };
        Ok(Ok(self.push_conditioning(Conditioning::from_encoded(
            encoded.context,
            encoded.pooled,
            size,
        ))?))
    }

    fn conditioning_combine(
        &mut self,
        a: Resource<HandleRes>,
        b: Resource<HandleRes>,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let a = attempt!(self.payload::<Conditioning>(&a, "CONDITIONING")?);
        let b = attempt!(self.payload::<Conditioning>(&b, "CONDITIONING")?);
        Ok(Ok(self.push_conditioning(a.combine(&b))?))
    }

    fn conditioning_average(
        &mut self,
        target: Resource<HandleRes>,
        source: Resource<HandleRes>,
        target_strength: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let target = attempt!(self.payload::<Conditioning>(&target, "CONDITIONING")?);
        let source = attempt!(self.payload::<Conditioning>(&source, "CONDITIONING")?);
        let blended = attempt!(target.average(&source, target_strength).map_err(compute_error));
        Ok(Ok(self.push_conditioning(blended)?))
    }

    fn conditioning_set_area(
        &mut self,
        conditioning: Resource<HandleRes>,
        area: Area,
        strength: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let c = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        let out = c.set_area(area.width, area.height, area.x, area.y, strength);
        Ok(Ok(self.push_conditioning(out)?))
    }

    fn conditioning_concat(
        &mut self,
        conditioning_to: Resource<HandleRes>,
        conditioning_from: Resource<HandleRes>,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let to = attempt!(self.payload::<Conditioning>(&conditioning_to, "CONDITIONING")?);
        let from = attempt!(self.payload::<Conditioning>(&conditioning_from, "CONDITIONING")?);
        let out = attempt!(to.concat(&from).map_err(compute_error));
        Ok(Ok(self.push_conditioning(out)?))
    }

    fn conditioning_set_area_fraction(
        &mut self,
        conditioning: Resource<HandleRes>,
        area: AreaFraction,
        strength: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let c = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        let fractions = [area.width, area.height, area.x, area.y];
        if !fractions.iter().all(|f| (0.0..=1.0).contains(f)) {
            fail!(node_error(
                NodeErrorCode::InvalidInput,
                format!("an area's fractions must be between 0 and 1, got {fractions:?}"),
            ));
        }
        let out = c.set_area_fraction(area.width, area.height, area.x, area.y, strength);
        Ok(Ok(self.push_conditioning(out)?))
    }

    fn conditioning_set_strength(
        &mut self,
        conditioning: Resource<HandleRes>,
        strength: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let c = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        Ok(Ok(self.push_conditioning(c.set_strength(strength))?))
    }

    fn conditioning_set_mask(
        &mut self,
        conditioning: Resource<HandleRes>,
        mask: Resource<MaskRes>,
        strength: f64,
        to_bounds: bool,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let c = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        let mask = self.core.table.get(&mask)?.0.clone();
        let own_mask = Arc::new(weft_compute::image::MaskBatch::clone(&mask));
        Ok(Ok(self.push_conditioning(c.set_mask(own_mask, strength, to_bounds))?))
    }

    fn conditioning_zero_out(
        &mut self,
        conditioning: Resource<HandleRes>,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let c = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        let zero = attempt!(c.zero_out().map_err(compute_error));
        Ok(Ok(self.push_conditioning(zero)?))
    }

    fn conditioning_set_timestep_range(
        &mut self,
        conditioning: Resource<HandleRes>,
        start: f64,
        end: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let c = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        let ranged = attempt!(c.set_timestep_range(start, end).map_err(compute_error));
        Ok(Ok(self.push_conditioning(ranged)?))
    }

    fn empty_latent(
        &mut self,
        width: u32,
        height: u32,
        batch_size: u32,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let cell = sd::latent::PIXELS_PER_CELL;
        let shape = [batch_size, sd::latent::LATENT_CHANNELS, height / cell, width / cell];
        let charge = self.charge_latent(shape, 0, "an empty latent batch")?;
        let latent = attempt!(sd::latent::empty(width, height, batch_size).map_err(compute_error));
        Ok(Ok(self.push_latent(latent, charge)?))
    }

    fn latent_scale(
        &mut self,
        samples: Resource<LatentRes>,
        method: String,
        width: u32,
        height: u32,
        crop: String,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let latent = self.latent(&samples)?;
        let center = match crop.as_str() {
            "disabled" => false,
            "center" => true,
            other => fail!(node_error(
                NodeErrorCode::InvalidInput,
                format!("unknown crop {other:?}; expected disabled or center"),
            )),
        };
        let [b, c, _, _] = latent.shape;
        let copy = latent.data.len() as u64 * 4;
        let charge = self.charge_latent([b, c, height, width], copy, "scaling a latent")?;
        let scaled = attempt!(sd::latent::scale(&latent, &method, width, height, center).map_err(compute_error));
        Ok(Ok(self.push_latent(scaled, charge)?))
    }

    fn latent_composite(
        &mut self,
        destination: Resource<LatentRes>,
        source: Resource<LatentRes>,
        x: u32,
        y: u32,
        feather: u32,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let (to, from) = (self.latent(&destination)?, self.latent(&source)?);
        let cell = sd::latent::PIXELS_PER_CELL;
        let charge = self.charge_latent(to.shape, 0, "compositing latents")?;
        let out =
            attempt!(sd::latent::composite(&to, &from, x / cell, y / cell, feather / cell).map_err(compute_error));
        Ok(Ok(self.push_latent(out, charge)?))
    }

    fn latent_composite_masked(
        &mut self,
        destination: Resource<LatentRes>,
        source: Resource<LatentRes>,
        x: u32,
        y: u32,
        resize_source: bool,
        mask: Option<Resource<MaskRes>>,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let (to, from) = (self.latent(&destination)?, self.latent(&source)?);
        let mask = mask.map(|m| self.core.table.get(&m).map(|m| m.0.clone())).transpose()?;
        // The two latents reordered, the source resized and repeated, and the mask resized.
        let [b, c, h, w] = to.shape;
        let frame = u64::from(b.max(from.shape[0])) * u64::from(h.max(from.shape[2])) * u64::from(w.max(from.shape[3]));
        let working = (to.data.len() + from.data.len()) as u64 * 4 + frame * u64::from(c + 2) * 4;
        let charge = self.charge_latent([b, c, h, w], working, "compositing latents")?;
        let deadline = self.core.deadline.clone();
        let keep_going = || deadline.check().is_ok();
        let out = sd::latent_ops::composite_masked(
            &to,
            &from,
            (x, y),
            resize_source,
            mask.as_deref().map(|m| &**m),
            &keep_going,
        );
        match out {
            Err(ComputeError::Interrupted) => Err(self.interruption().unwrap_or(Interrupt::Canceled).into()),
            out => Ok(Ok(self.push_latent(attempt!(out.map_err(compute_error)), charge)?)),
        }
    }

    fn latent_from_batch(
        &mut self,
        samples: Resource<LatentRes>,
        batch_index: u32,
        length: u32,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let latent = self.latent(&samples)?;
        let charge = self.charge_latent(latent.shape, 0, "taking latents from a batch")?;
        Ok(Ok(self.push_latent(
            sd::latent::from_batch(&latent, batch_index, length),
            charge,
        )?))
    }

    fn repeat_latent_batch(
        &mut self,
        samples: Resource<LatentRes>,
        amount: u32,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let latent = self.latent(&samples)?;
        let [b, c, h, w] = latent.shape;
        let shape = [b.saturating_mul(amount.max(1)), c, h, w];
        let charge = self.charge_latent(shape, 0, "repeating a latent batch")?;
        let out = attempt!(sd::latent::repeat(&latent, amount.max(1)).map_err(compute_error));
        Ok(Ok(self.push_latent(out, charge)?))
    }

    fn set_latent_noise_mask(
        &mut self,
        samples: Resource<LatentRes>,
        mask: Resource<MaskRes>,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let latent = self.latent(&samples)?;
        let mask = self.core.table.get(&mask)?.0.clone();
        let copy = mask.data.len() as u64 * 4;
        let charge = self.charge_latent(latent.shape, copy, "setting a latent's noise mask")?;
        let own_mask = Arc::new(weft_compute::image::MaskBatch::clone(&mask));
        Ok(Ok(
            self.push_latent(sd::latent::with_noise_mask(&latent, own_mask), charge)?
        ))
    }

    fn latent_combine(
        &mut self,
        samples1: Resource<LatentRes>,
        samples2: Resource<LatentRes>,
        how: LatentCombination,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let (a, b) = (self.latent(&samples1)?, self.latent(&samples2)?);
        let how = latent_ops::combination(how);
        let (shape, resized) = latent_ops::combined_shape(&a, &b, how.is_none());
        let charge = self.charge_latent(shape, resized, "combining latents")?;
        let out = match how {
            Some(how) => sd::latent_ops::combine(&a, &b, how),
            None => sd::latent_ops::batch(&a, &b),
        };
        Ok(Ok(self.push_latent(attempt!(out.map_err(compute_error)), charge)?))
    }

    fn latent_transform(
        &mut self,
        samples: Resource<LatentRes>,
        transform: LatentChange,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let latent = self.latent(&samples)?;
        let charge = self.charge_latent(latent.shape, 0, "transforming a latent")?;
        let out = sd::latent_ops::transform(&latent, &latent_ops::transform(transform));
        Ok(Ok(self.push_latent(attempt!(out.map_err(compute_error)), charge)?))
    }

    fn load_latent(&mut self, file: AssetRef) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let bytes = attempt!(read_asset(&*self.state.assets, file.into()).map_err(NodeError::from));
        let charge = self.core.charge(bytes.len() as u64 * 2, || {
            format!("reading a {} KiB latent file", bytes.len().div_ceil(1024))
        })?;
        let latent = attempt!(sd::latent::read_latent_file(&bytes).map_err(compute_error));
        Ok(Ok(self.push_latent(latent, charge)?))
    }

    fn sample(
        &mut self,
        model: Resource<HandleRes>,
        positive: Resource<HandleRes>,
        negative: Resource<HandleRes>,
        latent: Resource<LatentRes>,
        options: SampleOptions,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let model = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let positive = attempt!(self.payload::<Conditioning>(&positive, "CONDITIONING")?);
        let guided = (options.cfg - 1.0).abs() > 1e-9;
        let negative = attempt!(self.payload::<Conditioning>(&negative, "CONDITIONING")?);
        let latent = self.latent(&latent)?;
        let sampler: SamplerKind = attempt!(options
            .sampler_name
            .parse()
            .map_err(|e: weft_compute::sampling::UnknownName| node_error(NodeErrorCode::InvalidInput, e.to_string())));
        let scheduler: Scheduler = attempt!(options
            .scheduler
            .parse()
            .map_err(|e: weft_compute::sampling::UnknownName| node_error(NodeErrorCode::InvalidInput, e.to_string())));
        if options.steps == 0 || options.steps > 10_000 {
            fail!(node_error(NodeErrorCode::InvalidInput, "steps must be 1..=10000"));
        }
        let settings = SampleSettings {
            seed: options.seed,
            steps: options.steps as usize,
            cfg: options.cfg,
            sampler,
            scheduler,
            denoise: options.denoise,
            add_noise: options.add_noise,
            start_step: options.start_at_step as usize,
            last_step: options.end_at_step as usize,
            force_full_denoise: !options.return_with_leftover_noise,
        };
        if let Some(stop) = self.interruption() {
            return Err(stop.into());
        }
        // The result, the sampler's working copies of the latent (noise, denoised, the two
        // guidance halves) and the UNet's working memory, before any of it is allocated.
        let conds: &[&Conditioning] = if guided { &[&positive, &negative] } else { &[&positive] };
        let working = 4 * latent.data.len() as u64 * 4 + unet_working_bytes(&model, latent.shape, conds);
        let charge = self.charge_latent(latent.shape, working, "sampling")?;
        let colours = model.checkpoint.config.latent_rgb();
        let sampled = self.sample_reporting(colours, |on_step, stop| {
            sd::ksample(&model, &positive, &negative, &latent, &settings, on_step, stop)
        })?;
        let out = attempt!(sampled);
        Ok(Ok(self.push_latent(out, charge)?))
    }

    fn load_upscale_model(&mut self, model_name: String) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        self.upscale_model(model_name)
    }

    fn upscale_image(
        &mut self,
        upscale_model: Resource<HandleRes>,
        image: Resource<ImageRes>,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        self.upscale(upscale_model, image)
    }

    fn load_controlnet(
        &mut self,
        control_net_name: String,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        self.controlnet(control_net_name)
    }

    fn controlnet_apply_advanced(
        &mut self,
        positive: Resource<HandleRes>,
        negative: Resource<HandleRes>,
        control_net: Resource<HandleRes>,
        image: Resource<ImageRes>,
        strength: f64,
        start: f64,
        end: f64,
    ) -> wasmtime::Result<Result<(Resource<HandleRes>, Resource<HandleRes>), NodeError>> {
        let settings = sd::ControlSettings {
            strength,
            range: (start, end),
        };
        self.controlnet_advanced((positive, negative), control_net, image, settings)
    }

    fn controlnet_apply(
        &mut self,
        conditioning: Resource<HandleRes>,
        control_net: Resource<HandleRes>,
        image: Resource<ImageRes>,
        strength: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        self.controlnet_simple(conditioning, control_net, image, strength)
    }

    fn vae_decode(
        &mut self,
        vae: Resource<HandleRes>,
        samples: Resource<LatentRes>,
    ) -> wasmtime::Result<Result<Resource<ImageRes>, NodeError>> {
        let models = attempt!(self.payload::<Autoencoder>(&vae, "VAE")?);
        let latent = self.latent(&samples)?;
        let cell = sd::latent::PIXELS_PER_CELL;
        let [b, _, h, w] = latent.shape;
        let (width, height) = (w.saturating_mul(cell), h.saturating_mul(cell));
        let image_bytes = tensor_bytes(&[u64::from(b), u64::from(height), u64::from(width), 3]);
        // The latents are decoded one at a time.
        let working = Sd1Vae::decode_working_bytes(models.config(), 1, (h as usize, w as usize));
        let mut charge = self.core.charge(image_bytes + working, || {
            format!("decoding {b} latent(s) into {width}x{height} images")
        })?;
        self.core.deadline.check()?;
        let stop = self.stop_question();
        let decoded = sd::vae::decode(&models, &latent, weft_compute::interrupt::Interrupt::new(&stop));
        let image = attempt!(self.computed(decoded)?);
        self.core.deadline.check()?;
        charge.shrink_to(image.data.len() as u64 * 4);
        Ok(Ok(self
            .core
            .table
            .push(ImageRes(Arc::new(Held::new(image, charge))))?))
    }

    fn vae_encode(
        &mut self,
        vae: Resource<HandleRes>,
        pixels: Resource<ImageRes>,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let models = attempt!(self.payload::<Autoencoder>(&vae, "VAE")?);
        let image = self.core.table.get(&pixels)?.0.clone();
        let charge = self.charge_encode(&models, &image)?;
        self.core.deadline.check()?;
        let stop = self.stop_question();
        let encoded = sd::vae::encode(&models, &image, weft_compute::interrupt::Interrupt::new(&stop));
        let latent = attempt!(self.computed(encoded)?);
        self.core.deadline.check()?;
        Ok(Ok(self.push_latent(latent, charge)?))
    }

    fn vae_encode_for_inpaint(
        &mut self,
        vae: Resource<HandleRes>,
        pixels: Resource<ImageRes>,
        mask: Resource<MaskRes>,
        grow_mask_by: u32,
    ) -> wasmtime::Result<Result<Resource<LatentRes>, NodeError>> {
        let models = attempt!(self.payload::<Autoencoder>(&vae, "VAE")?);
        let image = self.core.table.get(&pixels)?.0.clone();
        let mask = self.core.table.get(&mask)?.0.clone();
        let charge = self.charge_encode(&models, &image)?;
        self.core.deadline.check()?;
        let stop = self.stop_question();
        let stop = weft_compute::interrupt::Interrupt::new(&stop);
        let latent =
            attempt!(self.computed(sd::vae::encode_for_inpaint(&models, &image, &mask, grow_mask_by, stop))?);
        self.core.deadline.check()?;
        Ok(Ok(self.push_latent(latent, charge)?))
    }

    fn inpaint_model_conditioning(
        &mut self,
        positive: Resource<HandleRes>,
        negative: Resource<HandleRes>,
        vae: Resource<HandleRes>,
        pixels: Resource<ImageRes>,
        mask: Resource<MaskRes>,
        noise_mask: bool,
    ) -> wasmtime::Result<Result<InpaintConditioning, NodeError>> {
        let positive = attempt!(self.payload::<Conditioning>(&positive, "CONDITIONING")?);
        let negative = attempt!(self.payload::<Conditioning>(&negative, "CONDITIONING")?);
        let models = attempt!(self.payload::<Autoencoder>(&vae, "VAE")?);
        let image = self.core.table.get(&pixels)?.0.clone();
        let mask = self.core.table.get(&mask)?.0.clone();
        // The image is encoded twice, one image at a time: once greyed, once as it is.
        let charge = self.charge_encode(&models, &image)?;
        self.core.deadline.check()?;
        let stop = self.stop_question();
        let stop = weft_compute::interrupt::Interrupt::new(&stop);
        let conds = (positive.as_ref(), negative.as_ref());
        let encoded = sd::inpaint_model_conditioning(&models, conds, &image, &mask, noise_mask, stop);
        let out = attempt!(self.computed(encoded)?);
        self.core.deadline.check()?;
        Ok(Ok(InpaintConditioning {
            positive: self.push_conditioning(out.positive)?,
            negative: self.push_conditioning(out.negative)?,
            latent: self.push_latent(out.latent, charge)?,
        }))
    }

    fn sampler(
        &mut self,
        sampler_name: String,
        options: custom_sampling::WitSamplerOptions,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let sampler = attempt!(custom_sampling::custom_sampler(&sampler_name, &options));
        Ok(Ok(self.push_setting("SAMPLER", sampler_name, sampler)?))
    }

    fn basic_scheduler(
        &mut self,
        model: Resource<HandleRes>,
        scheduler: String,
        steps: u32,
        denoise: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let model = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let sigmas = attempt!(custom_sampling::basic_schedule(&model, &scheduler, steps, denoise));
        self.push_sigmas(sigmas)
    }

    fn formula_scheduler(
        &mut self,
        formula: custom_sampling::SigmaFormula,
        range: custom_sampling::SigmaRange,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let sigmas = attempt!(custom_sampling::formula_schedule(&formula, &range));
        self.push_sigmas(sigmas)
    }

    fn vp_scheduler(
        &mut self,
        steps: u32,
        beta_d: f64,
        beta_min: f64,
        eps_s: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let sigmas = attempt!(custom_sampling::vp_schedule(steps, beta_d, beta_min, eps_s));
        self.push_sigmas(sigmas)
    }

    fn sd_turbo_scheduler(
        &mut self,
        model: Resource<HandleRes>,
        steps: u32,
        denoise: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let model = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        if !(1..=10).contains(&steps) || !(0.0..=1.0).contains(&denoise) {
            fail!(node_error(
                NodeErrorCode::InvalidInput,
                format!("SDTurboScheduler takes 1 to 10 steps and a denoise of 0 to 1, got {steps} and {denoise}"),
            ));
        }
        let sigmas =
            weft_compute::sampling::sigma_schedules::sd_turbo(&model.model_sampling(), steps as usize, denoise);
        self.push_sigmas(sigmas)
    }

    fn beta_scheduler(
        &mut self,
        model: Resource<HandleRes>,
        steps: u32,
        alpha: f64,
        beta: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let model = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let shape_ok = [alpha, beta].iter().all(|v| v.is_finite() && *v > 0.0 && *v <= 50.0);
        if !(1..=10_000).contains(&steps) || !shape_ok {
            fail!(node_error(
                NodeErrorCode::InvalidInput,
                format!("BetaSamplingScheduler takes 1 to 10000 steps and alpha and beta above 0 up to 50, got {steps}, {alpha}, {beta}"),
            ));
        }
        let sigmas = weft_compute::sampling::beta(&model.model_sampling(), steps as usize, alpha, beta);
        self.push_sigmas(sigmas)
    }

    fn align_your_steps_scheduler(
        &mut self,
        model_type: String,
        steps: u32,
        denoise: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let sigmas = attempt!(custom_sampling::ays_schedule(&model_type, steps, denoise));
        self.push_sigmas(sigmas)
    }

    fn sigmas_from_values(&mut self, values: Vec<f32>) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        self.core.hostcalls.charge(values.len() * 4)?;
        self.push_sigmas(values)
    }

    fn sigmas_values(&mut self, sigmas: Resource<HandleRes>) -> wasmtime::Result<Result<Vec<f32>, NodeError>> {
        let sigmas = attempt!(self.sigmas(&sigmas)?);
        Ok(Ok(sigmas.values().to_vec()))
    }

    fn split_sigmas(
        &mut self,
        sigmas: Resource<HandleRes>,
        step: u32,
    ) -> wasmtime::Result<Result<(Resource<HandleRes>, Resource<HandleRes>), NodeError>> {
        let sigmas = attempt!(self.sigmas(&sigmas)?);
        let (high, low) = weft_compute::sampling::sigma_schedules::split(sigmas.values(), step as usize);
        let high = attempt!(self.push_sigmas(high)?);
        let low = attempt!(self.push_sigmas(low)?);
        Ok(Ok((high, low)))
    }

    fn split_sigmas_denoise(
        &mut self,
        sigmas: Resource<HandleRes>,
        denoise: f64,
    ) -> wasmtime::Result<Result<(Resource<HandleRes>, Resource<HandleRes>), NodeError>> {
        let sigmas = attempt!(self.sigmas(&sigmas)?);
        if !(0.0..=1.0).contains(&denoise) {
            fail!(node_error(
                NodeErrorCode::InvalidInput,
                format!("denoise must be 0 to 1, got {denoise}")
            ));
        }
        let (high, low) = weft_compute::sampling::sigma_schedules::split_denoise(sigmas.values(), denoise);
        let high = attempt!(self.push_sigmas(high)?);
        let low = attempt!(self.push_sigmas(low)?);
        Ok(Ok((high, low)))
    }

    fn flip_sigmas(&mut self, sigmas: Resource<HandleRes>) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let sigmas = attempt!(self.sigmas(&sigmas)?);
        self.push_sigmas(weft_compute::sampling::sigma_schedules::flip(sigmas.values()))
    }

    fn set_first_sigma(
        &mut self,
        sigmas: Resource<HandleRes>,
        sigma: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let sigmas = attempt!(self.sigmas(&sigmas)?);
        self.push_sigmas(weft_compute::sampling::sigma_schedules::set_first(
            sigmas.values(),
            sigma,
        ))
    }

    fn noise(&mut self, seed: u64, add: bool) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let name = if add { format!("seed {seed}") } else { "no noise".into() };
        Ok(Ok(self.push_setting("NOISE", name, NoiseSpec { seed, add })?))
    }

    fn cfg_guider(
        &mut self,
        model: Resource<HandleRes>,
        positive: Resource<HandleRes>,
        negative: Resource<HandleRes>,
        cfg: f64,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let positive = attempt!(self.payload::<Conditioning>(&positive, "CONDITIONING")?);
        let negative = attempt!(self.payload::<Conditioning>(&negative, "CONDITIONING")?);
        let kind = GuiderKind::Cfg {
            positive,
            negative,
            cfg,
        };
        let guider = attempt!(custom_sampling::guider(base, kind));
        self.push_guider(&model, guider)
    }

    fn basic_guider(
        &mut self,
        model: Resource<HandleRes>,
        conditioning: Resource<HandleRes>,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let conditioning = attempt!(self.payload::<Conditioning>(&conditioning, "CONDITIONING")?);
        let guider = attempt!(custom_sampling::guider(base, GuiderKind::Basic { conditioning }));
        self.push_guider(&model, guider)
    }

    fn dual_cfg_guider(
        &mut self,
        model: Resource<HandleRes>,
        cond1: Resource<HandleRes>,
        cond2: Resource<HandleRes>,
        negative: Resource<HandleRes>,
        scales: custom_sampling::DualCfg,
    ) -> wasmtime::Result<Result<Resource<HandleRes>, NodeError>> {
        let base = attempt!(self.payload::<DiffusionModel>(&model, "MODEL")?);
        let cond1 = attempt!(self.payload::<Conditioning>(&cond1, "CONDITIONING")?);
        let cond2 = attempt!(self.payload::<Conditioning>(&cond2, "CONDITIONING")?);
        let negative = attempt!(self.payload::<Conditioning>(&negative, "CONDITIONING")?);
        let kind = custom_sampling::dual_cfg(cond1, cond2, negative, &scales);
        let guider = attempt!(custom_sampling::guider(base, kind));
        self.push_guider(&model, guider)
    }

    fn sample_custom(
        &mut self,
        noise: Resource<HandleRes>,
        guider: Resource<HandleRes>,
        sampler: Resource<HandleRes>,
        sigmas: Resource<HandleRes>,
        latent: Resource<LatentRes>,
    ) -> wasmtime::Result<Result<(Resource<LatentRes>, Resource<LatentRes>), NodeError>> {
        self.run_custom(noise, guider, sampler, sigmas, latent)
    }
}

/// A PNG of the first item of a sampler's `denoised` latent, mapped to colours as ComfyUI's
/// latent previews are (with the model's latent format's colours): 1/8 of the image's size.
/// `None` for latents it cannot show.
fn preview_png(
    denoised: &weft_compute::sampling::Tensor,
    colours: &weft_compute::preview::LatentRgb,
) -> Option<Vec<u8>> {
    let [_, channels, height, width] = denoised.shape[..] else {
        return None;
    };
    let first = weft_compute::sampling::Tensor::new(
        vec![1, channels, height, width],
        denoised.data.get(..channels * height * width)?.to_vec(),
    );
    let image = weft_compute::preview::latent_to_rgb_with(&first, colours).ok()?;
    weft_compute::codecs::encode_png(&image, 0, &[]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_loading_one_checkpoint_at_once_share_one_load() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("checkpoints")).unwrap();
        let path = root.path().join("checkpoints/tiny.safetensors");
        weft_compute::models::write_random_checkpoint(&path, &weft_compute::models::ModelConfig::tiny(), 1).unwrap();
        let library = Library::new(&DiffusionConfig {
            models_dir: Some(root.path().to_path_buf()),
            ..DiffusionConfig::default()
        });
        let resolved = library.resolve("checkpoints", "tiny.safetensors").unwrap();
        let loaded: Vec<Arc<CheckpointModels>> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..3)
                .map(|_| {
                    scope.spawn(|| {
                        let loaded = library.checkpoint(&resolved, "tiny.safetensors");
                        loaded.unwrap_or_else(|e| panic!("the checkpoint loads: {e}"))
                    })
                })
                .collect();
            runs.into_iter().map(|r| r.join().expect("no panic")).collect()
        });
        assert!(loaded.iter().all(|m| Arc::ptr_eq(m, &loaded[0])), "one load, shared");
        assert_eq!(library.list("checkpoints"), ["tiny.safetensors"]);
        assert_eq!(
            library.resolve("checkpoints", "../x").unwrap_err().code,
            "invalid_model_name"
        );
    }
}
