//! With the `cuda` feature, compiles weft's CUDA kernels (`src/cuda/kernels.cu`) to PTX for
//! the compute capability in `CUDA_COMPUTE_CAP` (90, Hopper, by default) with the toolkit's
//! `nvcc`. Without it, nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed=src/cuda/kernels.cu");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    let capability = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".to_string());
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("weft_kernels.ptx");
    let status = std::process::Command::new("nvcc")
        .args(["--ptx", "-O3", &format!("-arch=compute_{capability}"), "-o"])
        .arg(&out)
        .arg("src/cuda/kernels.cu")
        .status()
        .expect("running nvcc (the `cuda` feature needs the CUDA toolkit on PATH)");
    assert!(status.success(), "nvcc failed on src/cuda/kernels.cu");
}
