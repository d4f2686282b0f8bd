//! Builds the built-in plugins (`plugins/`) for wasm32-wasip2 and embeds them in the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Built-in plugin crates, by directory under `plugins/`.
const BUILTINS: &[&str] = &["core", "image", "audio", "diffusion"];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for dir in ["plugins", "sdk", "types", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("builtin_plugins.rs");
    let present: Vec<&str> = BUILTINS
        .iter()
        .copied()
        .filter(|b| root.join("plugins").join(b).join("Cargo.toml").exists())
        .collect();
    let mut entries = String::new();
    if !present.is_empty() {
        let target_dir = root.join("target").join("wasm");
        build_plugins(&root, &target_dir);
        for name in present {
            let wasm = target_dir
                .join("wasm32-wasip2/release")
                .join(format!("weft_plugin_{name}.wasm"));
            assert!(
                wasm.exists(),
                "built-in plugin {name} was not produced at {}",
                wasm.display()
            );
            let hash = blake3::hash(&std::fs::read(&wasm).unwrap()).to_hex();
            entries.push_str(&format!(
                "    ({name:?}, include_bytes!({:?}), {hash:?}),\n",
                wasm.display().to_string()
            ));
        }
    }
    let code = format!("/// Built-in plugins: (name, component bytes, their blake3 in hex).\npub(crate) static BUILTIN_PLUGINS: &[(&str, &[u8], &str)] = &[\n{entries}];\n");
    std::fs::write(out, code).unwrap();
}

fn build_plugins(root: &Path, target_dir: &Path) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(root.join("plugins/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    // The outer cargo's settings must not leak into the guest build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_MAKEFLAGS",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("running cargo for the built-in plugins");
    if !status.success() {
        panic!(
            "building the built-in plugins for wasm32-wasip2 failed. \
             If the target is missing: `rustup target add wasm32-wasip2` (scripts/setup.sh does it)."
        );
    }
}
