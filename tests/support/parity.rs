//! What the whole-graph parity tests share: weft's per-machine cache directory (where the
//! random-weight checkpoints are written once), a patient job wait for full-size models, and
//! the latent tensor of a `.latent` file.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Server;

/// weft's per-machine cache directory, found as `weft` finds it.
pub(crate) fn cache_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("WEFT_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("weft")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("weft")))
        .unwrap_or_else(|| std::env::temp_dir().join("weft"))
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
