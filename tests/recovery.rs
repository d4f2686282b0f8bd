//! Black-box tests of durability: crash recovery after kill -9, and retention (expiry of a
//! running job, then removal of expired jobs, their outputs and blobs).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::{slow_workflow, Options, Server};

fn text_workflow(text: &str) -> Value {
    json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": text}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    })
}

fn wait_status(server: &Server, id: &str, status: &str) -> Value {
    for _ in 0..6000 {
        let j: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if j["status"] == status {
            return j;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("job {id} never reached {status}");
}

#[test]
fn no_accepted_job_is_lost_after_kill_9() {
    let plugins = support::plugins_with(&["weft_test_counter"]);
    let options = Options {
        args: vec!["--workers".into(), "1".into()],
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    };
    let server = Server::with(options.clone());
    let running = server.submit(slow_workflow(2.0))["id"].as_str().unwrap().to_string();
    wait_status(&server, &running, "running");
    let mut queued = Vec::new();
    for i in 0..20 {
        queued.push(
            server.submit(text_workflow(&format!("q{i}")))["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let data_dir = server.kill();
    let server = Server::with(Options {
        data_dir: Some(data_dir.clone()),
        ..options
    });
    // The interrupted job runs again from the start and succeeds; every queued one runs.
    let job = server.wait(&running);
    assert_eq!(job["status"], "succeeded", "the interrupted job was not re-run: {job}");
    assert!(job["error"].is_null(), "{job}");
    assert_eq!(job["progress"]["nodes_done"], job["progress"]["nodes_total"], "{job}");
    for (i, id) in queued.iter().enumerate() {
        let job = server.wait(id);
        assert_eq!(job["status"], "succeeded", "job {id}");
        let url = job["outputs"][0]["url"].as_str().unwrap();
        assert_eq!(server.download(url), format!("q{i}").as_bytes());
    }
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn retention_expires_a_running_job_then_removes_it_with_its_outputs_and_blobs() {
    let plugins = support::plugins_with(&["weft_test_counter"]);
    let server = Server::with(Options {
        args: [
            "--retention-secs",
            "4",
            "--sweep-interval-secs",
            "1",
            "--expired-grace-secs",
            "1",
            "--workers",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    let text = format!("retained-{}", std::process::id());
    let done = server.run(text_workflow(&text));
    assert_eq!(done["status"], "succeeded");
    let blob = server
        .data_dir
        .join("blobs")
        .join(&blake3::hash(text.as_bytes()).to_hex()[..2])
        .join(blake3::hash(text.as_bytes()).to_hex().as_str());
    assert!(blob.exists(), "output blob not at {}", blob.display());
    let output = done["outputs"][0]["id"].as_str().unwrap().to_string();
    let slow = server.submit(slow_workflow(3600.0));
    let slow_id = slow["id"].as_str().unwrap().to_string();
    let expired = wait_status(&server, &slow_id, "expired");
    assert!(expired["completed_at"].is_string());
    // Stopped: the one worker is free again.
    let next = server.run(text_workflow("after"));
    assert_eq!(next["status"], "succeeded");
    // Removed afterwards: the expired job, the succeeded job, its output and its blob.
    let gone = |path: &str| server.get(path).status().as_u16() == 404;
    for _ in 0..1000 {
        if gone(&format!("/api/v2/jobs/{slow_id}")) && gone(&format!("/api/v2/assets/{output}")) && !blob.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(gone(&format!("/api/v2/jobs/{slow_id}")), "expired job still there");
    assert!(gone(&format!("/api/v2/jobs/{}", done["id"].as_str().unwrap())));
    assert!(gone(&format!("/api/v2/assets/{output}")), "output still there");
    assert!(!blob.exists(), "blob file still there");
}
