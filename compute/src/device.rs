//! Run-time choice of the device the compute core's networks run on, and of the precision
//! each network computes in there.
//!
//! Without the `cuda` cargo feature everything runs on the CPU. With it (`cargo build
//! --features cuda`, which needs the CUDA toolkit's `nvcc` at build time) the first CUDA GPU
//! is used when one is present, and the CPU otherwise. The choice is logged once.
//!
//! On the CPU every network computes in float32 (weft's kernels). On a GPU the defaults are
//! ComfyUI's: the UNet and the text encoders in float16, the autoencoder in bfloat16 (never
//! float16: SDXL's overflows there). [`request_precision`] overrides them.

use std::sync::OnceLock;

use candle_core::{DType, Device};

/// The device to run networks on: CUDA GPU 0 when built with `cuda` and one is usable, else
/// the CPU. Logs which one, once per process.
pub fn select_device() -> Device {
    static CHOSEN: OnceLock<Device> = OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let (device, why) = pick();
            tracing::info!(device = describe(&device), "compute device: {why}");
            device
        })
        .clone()
}

/// A short name for `device` ("cpu" or "cuda:N").
pub fn describe(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(_) => format!("cuda:{:?}", device.location()),
        _ => format!("{:?}", device.location()),
    }
}

/// Set to `1`, matrix products and convolutions on a CUDA GPU use TF32 tensor cores (10-bit
/// mantissas, float32 range), as PyTorch does for convolutions by default. Off by default:
/// float32 keeps the GPU's images within ComfyUI's CPU parity tolerance.
#[cfg(feature = "cuda")]
const TF32_VARIABLE: &str = "WEFT_CUDA_TF32";

#[cfg(feature = "cuda")]
fn pick() -> (Device, String) {
    match Device::new_cuda(0) {
        Ok(d) => {
            let tf32 = std::env::var(TF32_VARIABLE).is_ok_and(|v| v == "1");
            candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
            let products = if tf32 { "TF32" } else { "float32" };
            (
                d,
                format!("CUDA GPU 0 (built with the `cuda` feature; {products} matrix products)"),
            )
        }
        Err(e) => (
            Device::Cpu,
            format!("CPU (built with the `cuda` feature but no usable GPU: {e})"),
        ),
    }
}

#[cfg(not(feature = "cuda"))]
fn pick() -> (Device, String) {
    (Device::Cpu, "CPU (built without the `cuda` feature)".to_string())
}

/// A floating-point format to compute in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// IEEE single precision.
    Float32,
    /// IEEE half precision (10-bit mantissa, range to 65504).
    Float16,
    /// bfloat16 (8-bit mantissa, float32's range).
    BFloat16,
}

impl Precision {
    /// The candle dtype of this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Float32 => DType::F32,
            Precision::Float16 => DType::F16,
            Precision::BFloat16 => DType::BF16,
        }
    }

    /// The name `--precision` takes and logs show ("float32", "float16", "bfloat16").
    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::Float16 => "float16",
            Precision::BFloat16 => "bfloat16",
        }
    }

    /// Parses [`Precision::name`], or `fp32` / `fp16` / `bf16`.
    pub fn parse(text: &str) -> Option<Precision> {
        match text {
            "float32" | "fp32" => Some(Precision::Float32),
            "float16" | "fp16" => Some(Precision::Float16),
            "bfloat16" | "bf16" => Some(Precision::BFloat16),
            _ => None,
        }
    }
}

/// The precision each network of a checkpoint computes and holds its weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Precisions {
    /// The denoising UNet.
    pub unet: Precision,
    /// The CLIP text encoders.
    pub text: Precision,
    /// The autoencoder.
    pub vae: Precision,
}

impl Precisions {
    /// Every network in float32.
    pub const FLOAT32: Precisions = Precisions {
        unet: Precision::Float32,
        text: Precision::Float32,
        vae: Precision::Float32,
    };

    /// The precisions on `device` under `requested` (`None`: the default). The CPU always
    /// computes in float32. On a GPU, by default, ComfyUI's: the UNet and text encoders in
    /// float16, the autoencoder in bfloat16; a requested precision applies to all three, except
    /// that the autoencoder never runs in float16 (SDXL's overflows), bfloat16 instead.
    pub fn for_device(device: &Device, requested: Option<Precision>) -> Precisions {
        if device.is_cpu() {
            Precisions::FLOAT32
        } else {
            Precisions::on_gpu(requested)
        }
    }

    /// The precisions on a GPU under `requested` (see [`Precisions::for_device`]).
    pub fn on_gpu(requested: Option<Precision>) -> Precisions {
        let networks = requested.unwrap_or(Precision::Float16);
        let vae = match requested {
            None | Some(Precision::Float16) => Precision::BFloat16,
            Some(other) => other,
        };
        Precisions {
            unet: networks,
            text: networks,
            vae,
        }
    }

    /// "unet float16, text float16, vae bfloat16".
    pub fn describe(&self) -> String {
        format!(
            "unet {}, text {}, vae {}",
            self.unet.name(),
            self.text.name(),
            self.vae.name()
        )
    }
}

static REQUESTED: OnceLock<Option<Precision>> = OnceLock::new();

/// Sets the precision networks compute in on a GPU for the rest of the process (`weft serve
/// --precision`); `None` keeps the defaults of [`Precisions::for_device`]. Only the first call
/// counts.
pub fn request_precision(requested: Option<Precision>) {
    let _ = REQUESTED.set(requested);
}

/// The precisions networks loaded on `device` use, under the process's request.
pub fn precisions(device: &Device) -> Precisions {
    Precisions::for_device(device, REQUESTED.get().copied().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_without_cuda() {
        let d = select_device();
        if !cfg!(feature = "cuda") {
            assert!(matches!(d, Device::Cpu));
            assert_eq!(describe(&d), "cpu");
        }
    }

    #[test]
    fn the_cpu_computes_in_float32_whatever_is_requested() {
        for requested in [None, Some(Precision::Float16), Some(Precision::BFloat16)] {
            assert_eq!(Precisions::for_device(&Device::Cpu, requested), Precisions::FLOAT32);
        }
    }

    #[test]
    fn precision_names_round_trip() {
        for p in [Precision::Float32, Precision::Float16, Precision::BFloat16] {
            assert_eq!(Precision::parse(p.name()), Some(p));
        }
        assert_eq!(Precision::parse("bf16"), Some(Precision::BFloat16));
        assert_eq!(Precision::parse("half"), None);
    }

    #[test]
    fn a_gpu_defaults_to_comfyui_precisions_and_never_runs_the_vae_in_float16() {
        let default = Precisions::on_gpu(None);
        assert_eq!(
            (default.unet, default.text, default.vae),
            (Precision::Float16, Precision::Float16, Precision::BFloat16)
        );
        assert_eq!(Precisions::on_gpu(Some(Precision::Float16)).vae, Precision::BFloat16);
        assert_eq!(Precisions::on_gpu(Some(Precision::Float32)), Precisions::FLOAT32);
        let bf16 = Precisions::on_gpu(Some(Precision::BFloat16));
        assert_eq!((bf16.unet, bf16.vae), (Precision::BFloat16, Precision::BFloat16));
    }
}
