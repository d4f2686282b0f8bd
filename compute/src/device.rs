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

#[cfg(feature = "cuda")]
fn pick() -> (Device, String) {
    match Device::new_cuda(0) {
        Ok(d) => (d, "CUDA GPU 0 (built with the `cuda` feature)".to_string()),
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
