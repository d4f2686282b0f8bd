//! Run-time choice of the device the compute core's networks run on.
//!
//! Without the `cuda` cargo feature everything runs on the CPU. With it (`cargo build
//! --features cuda`, which needs the CUDA toolkit's `nvcc` at build time) the first CUDA GPU
//! is used when one is present, and the CPU otherwise. The choice is logged once.

use std::sync::OnceLock;

use candle_core::Device;

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
}
