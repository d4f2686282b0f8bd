//! Host memory budgets and deadlines that cover host code: values made by host functions
//! are charged to their job within `--job-memory-mib`, going over is `node_memory_limit`
//! before anything is allocated, values are freed after their last reader, and a guest
//! blocked in WASI or a long output commit ends at the node's time limit or a cancel.

mod support;

use serde_json::{json, Value};
use support::{assert_failed_at_node, plugins_with, single, wait_running, Options, Server};

/// A server with the host-hog plugin, a 64 MiB job memory budget and no node cache (so
/// that only the job holds its values), plus `extra` flags.
fn server(extra: &[&str]) -> (Server, tempfile::TempDir) {
    let plugins = plugins_with(&["weft_test_host_hog"]);
    let mut args: Vec<String> = ["--job-memory-mib", "64", "--cache-mib", "0", "--job-cost", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let server = Server::with(Options {
        args,
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    (server, plugins)
}

/// After a hostile job the server must still run an ordinary one.
fn assert_host_alive(server: &Server) {
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "alive"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
}

/// Peak resident memory of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_guest_keeping_host_images_hits_the_job_memory_limit() {
    let (server, _p) = server(&[]);
    let job = server.run(single("HostileImageHoard", json!({"width": 1024, "height": 1024})));
    assert_failed_at_node(&job, "node_memory_limit", "1");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains("1024x1024 image"), "says what: {job}");
    assert!(message.contains("--job-memory-mib"), "says which budget: {job}");
    assert_host_alive(&server);
}

#[test]
fn a_65535_square_image_is_a_memory_limit_error_not_an_allocation() {
    let (server, _p) = server(&[]);
    let job = server.run(single("HostileImageHoard", json!({"width": 65535, "height": 65535})));
    assert_failed_at_node(&job, "node_memory_limit", "1");
    assert!(peak_rss_kib(server.pid()) < 2 << 20, "nothing near 50 GB was touched");
    assert_host_alive(&server);
}

#[test]
fn the_server_budget_bounds_every_job_together() {
    // Each job may hold 64 MiB, but the server only 32 MiB for all of them.
    let (server, _p) = server(&["--host-memory-mib", "32"]);
    let job = server.run(single("HostileImageHoard", json!({"width": 1024, "height": 1024})));
    assert_failed_at_node(&job, "node_memory_limit", "1");
    assert!(
        job["error"]["message"].as_str().unwrap().contains("--host-memory-mib"),
        "{job}"
    );
    assert_host_alive(&server);
}

#[test]
fn built_in_nodes_asking_for_huge_values_get_the_memory_limit() {
    let (server, _p) = server(&[]);
    let scale = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "lanczos", "width": 16384, "height": 16384, "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&scale, "node_memory_limit", "2");
    let latent = server.run(single(
        "EmptyLatentImage",
        json!({"width": 1024, "height": 1024, "batch_size": 4096}),
    ));
    assert_failed_at_node(&latent, "node_memory_limit", "1");
    let batch = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 64, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&batch, "node_memory_limit", "1");
    assert!(peak_rss_kib(server.pid()) < 2 << 20, "none of it was allocated");
    assert_host_alive(&server);
}

#[test]
fn an_image_declaring_huge_dimensions_is_refused_before_it_is_decoded() {
    let (server, _p) = server(&[]);
    // A small file (a few hundred KB) that decodes to 9000x9000 pixels: 3.6 GiB as floats.
    let mut png = Vec::new();
    image::GrayImage::new(9000, 9000)
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    assert!(png.len() < 1 << 20, "{} bytes", png.len());
    let asset = server.upload("bomb.png", png);
    let reference = json!({"__type": "core/ASSET", "info": {"id": asset["id"]}});
    let job = server.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": reference}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "bomb"}}
    }));
    assert_failed_at_node(&job, "node_memory_limit", "1");
    assert!(job["error"]["message"].as_str().unwrap().contains("decoding"), "{job}");
    let mask = server.run(single("LoadImageMask", json!({"image": reference, "channel": "red"})));
    assert_failed_at_node(&mask, "node_memory_limit", "1");
    assert!(peak_rss_kib(server.pid()) < 2 << 20, "the pixels were never decoded");
    assert_host_alive(&server);
}

#[test]
fn a_value_is_freed_once_its_last_reader_has_run() {
    // Each 1024x1024 image is 12 MiB, and the scale is charged 28 MiB besides its source
    // (its result, and the filter's 16 MiB RGBA pass). Kept all at once the chain needs
    // 76 MiB; freed after their last reader, 40 MiB, which fits a 48 MiB budget.
    let (server, _p) = server(&["--job-memory-mib", "48"]);
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
        "4": {"class_type": "ImageInvert", "inputs": {"image": ["3", 0]}},
        "5": {"class_type": "ImageScale", "inputs": {"image": ["4", 0], "upscale_method": "bilinear", "width": 1024, "height": 1024, "crop": "disabled"}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "chain"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    // The same chain with node 1 also read by the last node to run (nodes run in id order
    // where links allow) keeps it alive through the scale: 52 MiB, which does not fit.
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
        "4": {"class_type": "ImageInvert", "inputs": {"image": ["3", 0]}},
        "5": {"class_type": "ImageScale", "inputs": {"image": ["4", 0], "upscale_method": "bilinear", "width": 1024, "height": 1024, "crop": "disabled"}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "chain"}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "first"}}
    }));
    assert_failed_at_node(&job, "node_memory_limit", "5");
}

#[test]
fn a_guest_sleeping_in_wasi_ends_at_its_time_limit() {
    let (server, _p) = server(&["--node-timeout-ms", "1000"]);
    // Without the limit this sleeps an hour, far past the harness's wait for the job.
    let job = server.run(single("HostileSleep", json!({"seconds": 3600.0})));
    assert_failed_at_node(&job, "node_timeout", "1");
    assert_host_alive(&server);
}

#[test]
fn cancel_reaches_a_guest_sleeping_in_wasi() {
    let (server, _p) = server(&["--node-timeout-ms", "600000"]);
    let job = server.submit(single("HostileSleep", json!({"seconds": 3600.0})));
    let id = job["id"].as_str().unwrap();
    wait_running(&server, id);
    server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(server.wait(id)["status"], "canceled");
    assert_host_alive(&server);
}

#[test]
fn guests_sleeping_past_their_limit_free_their_workers_for_other_jobs() {
    let (server, _p) = server(&["--node-timeout-ms", "1000", "--workers", "2"]);
    let sleepers: Vec<Value> = (0..2)
        .map(|_| server.submit(single("HostileSleep", json!({"seconds": 3600.0}))))
        .collect();
    // Queued behind both sleepers: it runs only once a worker is free again.
    assert_host_alive(&server);
    for sleeper in sleepers {
        let done = server.wait(sleeper["id"].as_str().unwrap());
        assert_failed_at_node(&done, "node_timeout", "1");
    }
}

#[test]
fn the_output_commit_stops_at_the_node_time_limit() {
    // The output count bound is raised so that the time limit is what stops the commit, and
    // every output is a blob: kept inline in its database row, 4096 small PNGs commit in
    // about the limit's time on this machine.
    let (server, _p) = server(&[
        "--node-timeout-ms",
        "300",
        "--max-job-outputs",
        "100000",
        "--inline-output-kib",
        "0",
    ]);
    // 4096 PNGs, each encoded, hashed, written and synced as a blob, and recorded as a
    // database row: many times the limit's work.
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 32, "height": 32, "batch_size": 4096, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "many"}}
    }));
    assert_failed_at_node(&job, "node_timeout", "2");
    let committed = job["outputs"].as_array().map_or(0, Vec::len);
    assert!(committed < 4096, "the commit stopped early: {committed} files");
    assert_host_alive(&server);
}

#[test]
fn a_result_over_the_host_copy_budget_is_output_too_large() {
    let plugins = plugins_with(&["weft_test_huge_output"]);
    let server = Server::with(Options {
        args: ["--node-memory-mib", "512", "--job-cost", "0"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    // 150 MiB: over wasmtime's own 128 MiB copy budget as well as the 64 MiB default cap.
    let job = server.run(single("HostileHugeOutput", json!({"mib": 150})));
    assert_failed_at_node(&job, "node_output_too_large", "1");
    assert_host_alive(&server);
}
