//! weft's built-in Stable Diffusion nodes, after ComfyUI's `nodes.py`: class names, inputs,
//! defaults, categories and display names as ComfyUI has them. Every node only orchestrates
//! the host's `diffusion` functions on handles: weights, conditioning, latents and pixels
//! never enter the plugin.

mod conditioning;
mod controlnet;
mod custom_sampling;
mod latent;
mod latent_ops;
mod loaders;
mod model_patches;
mod sampling;
mod upscale;
mod vae;

pub use conditioning::{
    CLIPSetLastLayer, CLIPTextEncode, CLIPTextEncodeSDXL, CLIPTextEncodeSDXLRefiner, ConditioningAverage,
    ConditioningCombine, ConditioningConcat, ConditioningSetArea, ConditioningSetAreaPercentage,
    ConditioningSetAreaStrength, ConditioningSetMask, ConditioningSetTimestepRange, ConditioningZeroOut,
    InpaintModelConditioning,
};
pub use controlnet::{ControlNetApply, ControlNetApplyAdvanced, ControlNetLoader, DiffControlNetLoader};
pub use custom_sampling::{
    AlignYourStepsScheduler, BasicGuider, BasicScheduler, BetaSamplingScheduler, CFGGuider, DisableNoise,
    DualCFGGuider, ExponentialScheduler, FlipSigmas, KSamplerSelect, KarrasScheduler, LaplaceScheduler, ManualSigmas,
    PolyexponentialScheduler, RandomNoise, SDTurboScheduler, SamplerCustom, SamplerCustomAdvanced, SamplerDpmpp2mSde,
    SamplerDpmpp2sAncestral, SamplerDpmpp3mSde, SamplerDpmppSde, SamplerEulerAncestral, SamplerLMS, SetFirstSigma,
    SplitSigmas, SplitSigmasDenoise, VPScheduler,
};
pub use latent::{
    EmptyLatentImage, LatentComposite, LatentFromBatch, LatentUpscale, LatentUpscaleBy, LoadLatent, RepeatLatentBatch,
    SaveLatent, SetLatentNoiseMask,
};
pub use latent_ops::{
    LatentAdd, LatentBatch, LatentBatchSeedBehavior, LatentBlend, LatentCompositeMasked, LatentCrop, LatentFlip,
    LatentInterpolate, LatentMultiply, LatentRotate, LatentSubtract,
};
pub use loaders::{
    CLIPLoader, CheckpointLoaderSimple, DualCLIPLoader, LoraLoader, LoraLoaderModelOnly, UNETLoader, VAELoader,
};
pub use model_patches::{ModelSamplingContinuousEDM, ModelSamplingDiscrete, RescaleCFG};
pub use sampling::{KSampler, KSamplerAdvanced};
pub use upscale::{ImageUpscaleWithModel, UpscaleModelLoader};
pub use vae::{VAEDecode, VAEEncode, VAEEncodeForInpaint};

/// ComfyUI's `MAX_RESOLUTION`.
pub const MAX_RESOLUTION: i64 = 16384;

weft_sdk::export_plugin!(
    CheckpointLoaderSimple,
    UpscaleModelLoader,
    ImageUpscaleWithModel,
    ControlNetLoader,
    DiffControlNetLoader,
    ControlNetApply,
    ControlNetApplyAdvanced,
    VAELoader,
    UNETLoader,
    CLIPLoader,
    DualCLIPLoader,
    LoraLoader,
    LoraLoaderModelOnly,
    CLIPTextEncode,
    CLIPTextEncodeSDXL,
    CLIPTextEncodeSDXLRefiner,
    CLIPSetLastLayer,
    ConditioningCombine,
    ConditioningAverage,
    ConditioningSetArea,
    ConditioningZeroOut,
    ConditioningSetTimestepRange,
    ConditioningConcat,
    ConditioningSetAreaPercentage,
    ConditioningSetAreaStrength,
    ConditioningSetMask,
    InpaintModelConditioning,
    EmptyLatentImage,
    LatentUpscale,
    LatentUpscaleBy,
    LatentComposite,
    LatentFromBatch,
    RepeatLatentBatch,
    SetLatentNoiseMask,
    SaveLatent,
    LoadLatent,
    LatentAdd,
    LatentSubtract,
    LatentMultiply,
    LatentInterpolate,
    LatentBlend,
    LatentBatch,
    LatentBatchSeedBehavior,
    LatentCrop,
    LatentFlip,
    LatentRotate,
    LatentCompositeMasked,
    KSampler,
    KSamplerAdvanced,
    SamplerCustom,
    SamplerCustomAdvanced,
    KSamplerSelect,
    SamplerEulerAncestral,
    SamplerDpmpp2sAncestral,
    SamplerLMS,
    SamplerDpmppSde,
    SamplerDpmpp2mSde,
    SamplerDpmpp3mSde,
    BasicScheduler,
    KarrasScheduler,
    ExponentialScheduler,
    PolyexponentialScheduler,
    LaplaceScheduler,
    VPScheduler,
    SDTurboScheduler,
    BetaSamplingScheduler,
    AlignYourStepsScheduler,
    SplitSigmas,
    SplitSigmasDenoise,
    FlipSigmas,
    SetFirstSigma,
    ManualSigmas,
    RandomNoise,
    DisableNoise,
    CFGGuider,
    BasicGuider,
    DualCFGGuider,
    ModelSamplingDiscrete,
    ModelSamplingContinuousEDM,
    RescaleCFG,
    VAEDecode,
    VAEEncode,
    VAEEncodeForInpaint,
);
