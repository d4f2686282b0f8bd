//! What the whole-graph parity tests share: weft's per-machine cache directory (where the
//! random-weight checkpoints are written once, and linked into models folders), a patient
//! job wait for full-size models, and the latent tensor of a `.latent` file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{weft_bin, Server};

/// weft's per-machine cache directory, found as `weft` finds it.
pub(crate) fn cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("WEFT_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("weft")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("weft")))
        .unwrap_or_else(|| std::env::temp_dir().join("weft"))
}

/// The checkpoint `weft models <command> --seed 0` writes, kept in the cache directory as
/// `<stem>-<first 12 of sha256>.safetensors` (the name `weft-compute`'s tests use too) and
/// written first if missing; its printed sha256 must be `sha256`.
pub(crate) fn cached_checkpoint(command: &str, stem: &str, sha256: &str) -> PathBuf {
    let cache = cache_dir();
    let cached = cache.join(format!("{stem}-{}.safetensors", &sha256[..12]));
    if !cached.is_file() {
        std::fs::create_dir_all(&cache).unwrap();
        let tmp = cached.with_extension(format!("{}.tmp", std::process::id()));
        let out = Command::new(weft_bin())
            .args(["models", command, "--seed", "0", "--out"])
            .arg(&tmp)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && printed.contains(sha256),
            "weft models {command} failed: {printed}"
        );
        std::fs::rename(&tmp, &cached).unwrap();
    }
    cached
}

/// A models folder `folder` in the cache directory whose `checkpoints/<name>` is `cached`
/// as a hard link (a symlink leaving the folder would be refused).
pub(crate) fn models_dir_with(cached: &Path, folder: &str, name: &str) -> PathBuf {
    let models = cache_dir().join(folder);
    let linked = models.join("checkpoints").join(name);
    std::fs::create_dir_all(linked.parent().unwrap()).unwrap();
    let same = |a: &Path, b: &Path| {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (std::fs::metadata(a), std::fs::metadata(b));
        matches!((a, b), (Ok(a), Ok(b)) if a.ino() == b.ino() && a.dev() == b.dev())
    };
    if !same(cached, &linked) {
        let _ = std::fs::remove_file(&linked);
        std::fs::hard_link(cached, &linked).unwrap();
    }
    models
}

/// Submits `workflow` and waits for it; a full-size checkpoint takes a while on a busy
/// machine, so the wait is generous (it bounds a hang, it is not a timing assertion).
pub(crate) fn run_long(server: &Server, workflow: Value) -> Value {
    let job = server.submit(workflow);
    let id = job["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if matches!(
            job["status"].as_str(),
            Some("succeeded" | "failed" | "canceled" | "expired")
        ) {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} did not finish: {job}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The shape and values of the float32 tensor `latent_tensor` of a ComfyUI `.latent`
/// (safetensors) file.
pub(crate) fn latent_values(bytes: &[u8]) -> (Vec<u64>, Vec<f32>) {
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    let entry = &header["latent_tensor"];
    assert_eq!(entry["dtype"], "F32", "{header}");
    let shape = entry["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    let offsets = entry["data_offsets"].as_array().unwrap();
    let (begin, end) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    let data = bytes[8 + len + begin..8 + len + end]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (shape, data)
}
