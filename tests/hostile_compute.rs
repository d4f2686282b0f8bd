//! Hostile sizes for the host's heavy work: a sampler's working memory is charged to its job
//! before anything is allocated (a latent too large for the budget is `node_memory_limit`
//! at once, naming its size), a cancel reaches a sampler step running on a large latent
//! (inside the UNet, not only between steps), and one long host operation (a lanczos scale
//! of one large image) stops at the node's deadline instead of running on past it.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Options, Server};

/// The checkpoint name ComfyUI's default workflow uses.
const CHECKPOINT: &str = "v1-5-pruned-emaonly.safetensors";

/// A models directory with a tiny random-weight checkpoint named [`CHECKPOINT`].
fn models_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("checkpoints")).unwrap();
    support::tiny_checkpoint(&dir.path().join("checkpoints").join(CHECKPOINT), 0);
    dir
}

/// A server over `models` (none: no models directory) with the node cache off, plus `args`.
fn server(models: Option<&Path>, args: &[&str]) -> Server {
    let mut all: Vec<String> = ["--cache-mib", "0"].iter().map(|s| s.to_string()).collect();
    if let Some(models) = models {
        all.extend(["--models-dir".to_string(), models.display().to_string()]);
    }
    all.extend(args.iter().map(|a| a.to_string()));
    Server::with(Options {
        args: all,
        ..Default::default()
    })
}

/// ComfyUI's default graph at `width` x `height` pixels and `steps` steps.
fn sampling_graph(width: u32, height: u32, steps: u32) -> Value {
    json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": 1, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": height, "width": width}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a lighthouse"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "blurry"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "hostile", "images": ["8", 0]}}
    })
}

/// Peak resident memory of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Polls job `id` until it is terminal or `limit` has passed since `since`; the job, or a
/// panic naming how far it got.
fn wait_within(server: &Server, id: &str, since: Instant, limit: Duration) -> Value {
    loop {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if matches!(
            job["status"].as_str(),
            Some("succeeded" | "failed" | "canceled" | "expired")
        ) {
            return job;
        }
        assert!(since.elapsed() < limit, "not done {limit:?} on: {job}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_sampler_over_the_job_budget_fails_with_node_memory_limit_before_allocating() {
    let models = models_dir();
    // The default job budget (4 GiB): a 16384x16384 image is a 2048x2048 latent, whose
    // UNet activations alone (the CFG batch of 2, 32 channels at full size) are 1 GiB each.
    let server = server(Some(models.path()), &[]);
    let job = server.run(sampling_graph(16384, 16384, 1));
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "node_memory_limit", "{job}");
    assert_eq!(job["error"]["node_id"], "3", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains("2048x2048 latent"), "names the size: {job}");
    assert!(message.contains("--job-memory-mib"), "names the budget: {job}");
    assert!(
        peak_rss_kib(server.pid()) < 2 << 20,
        "the working memory was never allocated"
    );
    // An ordinary size still samples.
    assert_eq!(server.run(sampling_graph(64, 64, 1))["status"], "succeeded");
}

#[test]
fn a_cancel_ends_a_running_sampler_step_on_a_large_latent() {
    let models = models_dir();
    let server = server(Some(models.path()), &[]);
    // A 512x512 latent: one step's self-attention over 262,144 tokens is minutes of work,
    // and the first step is never reached before the cancel.
    let job = server.submit(sampling_graph(4096, 4096, 1));
    let id = job["id"].as_str().unwrap();
    wait_for_node(&server, id, "KSampler", Duration::from_secs(60));
    // Well inside the step's forward pass.
    std::thread::sleep(Duration::from_millis(1500));
    let asked = Instant::now();
    let r = server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(r.status().as_u16(), 200);
    let done = wait_within(&server, id, asked, Duration::from_secs(5));
    assert_eq!(done["status"], "canceled", "{done}");
}

#[test]
fn a_large_scale_stops_at_the_node_deadline() {
    // One lanczos upscale of a 4096x1365 image to 16384x5461 (89 M pixels through two
    // 6-tap passes: over 5 s of work uninterrupted) under a 1 s node timeout.
    let server = server(None, &["--node-timeout-ms", "1000"]);
    let submitted = Instant::now();
    let job = server.submit(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4096, "height": 1365, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "lanczos", "width": 16384, "height": 5461, "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "scaled"}}
    }));
    let id = job["id"].as_str().unwrap();
    // The source takes a fraction of a second; then the timeout, and 3 s of grace.
    let done = wait_within(&server, id, submitted, Duration::from_secs(5));
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "node_timeout", "{done}");
    assert_eq!(done["error"]["node_id"], "2", "{done}");
}

#[test]
fn a_cancel_ends_video_to_music_analysis_promptly() {
    // An "ffmpeg" that never answers (ffprobe is the real one): the analysis would wait out
    // its own five-minute limit; a cancel must end the job, and the decoder, at once.
    let dir = tempfile::tempdir().unwrap();
    let video = dir.path().join("clip.mp4");
    let made = std::process::Command::new("ffmpeg")
        .args([
            "-y",
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc2=s=64x48:r=10",
            "-t",
            "1",
        ])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"])
        .arg(&video)
        .status()
        .unwrap();
    assert!(made.success());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let stalled = bin.join("ffmpeg");
    std::fs::write(&stalled, "#!/bin/sh\nexec sleep 120\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stalled, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let server = Server::with(Options {
        args: vec!["--cache-mib".into(), "0".into()],
        env: vec![("PATH".into(), path)],
        ..Default::default()
    });
    let asset = server.upload("clip.mp4", std::fs::read(&video).unwrap());
    let reference = json!({"__type": "core/ASSET", "info": {"id": asset["id"]}});
    let job = server.submit(json!({
        "1": {"class_type": "VideoToMusic", "inputs": {"video": reference, "prompt": "piano", "seed": 1}},
        "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/weft"}}
    }));
    let id = job["id"].as_str().unwrap();
    wait_for_node(&server, id, "VideoToMusic", Duration::from_secs(30));
    // Inside the analysis, waiting on the stalled decoder.
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let r = server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(r.status().as_u16(), 200);
    let done = wait_within(&server, id, asked, Duration::from_secs(5));
    assert_eq!(done["status"], "canceled", "{done}");
}

/// Waits until job `id` runs a node of `class` (at most `within`; it must not fail first).
fn wait_for_node(server: &Server, id: &str, class: &str, within: Duration) {
    let started = Instant::now();
    loop {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if job["progress"]["current_node_class"] == class {
            return;
        }
        assert_eq!(job["status"].as_str().map(|s| s == "failed"), Some(false), "{job}");
        assert!(started.elapsed() < within, "{class} never started: {job}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
