//! Black-box tests of durability: crash recovery after kill -9, and retention (expiry of a
//! running job, then removal of expired jobs, their outputs and blobs; previews, removed after
//! their own retention).

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

/// Waits for each of `ids`, the jobs of `text_workflow(prefix + index)`, and checks it
/// succeeded with its own text as its output.
fn assert_each_succeeded_with_its_text(server: &Server, ids: &[String], prefix: &str) {
    for (i, id) in ids.iter().enumerate() {
        let job = server.wait(id);
        assert_eq!(job["status"], "succeeded", "job {id}: {job}");
        let url = job["outputs"][0]["url"].as_str().unwrap();
        assert_eq!(server.download(url), format!("{prefix}{i}").as_bytes());
    }
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
    assert_each_succeeded_with_its_text(&server, &queued, "q");
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn retention_expires_a_running_job_then_removes_it_with_its_outputs_and_blobs() {
    let plugins = support::plugins_with(&["weft_test_counter"]);
    let server = Server::with(Options {
        args: [
            // Every output a blob file, so that the blob's removal can be seen.
            "--inline-output-kib",
            "0",
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

/// Where blob `hash` lives under `data_dir`.
fn blob_file(data_dir: &std::path::Path, hash: &str) -> std::path::PathBuf {
    data_dir.join("blobs").join(&hash[..2]).join(hash)
}

/// Writes a blob file no asset references, last modified `age` ago, as a crash between a
/// blob's write and its asset's commit leaves one.
fn plant_orphan(data_dir: &std::path::Path, content: &[u8], age: Duration) -> std::path::PathBuf {
    let path = blob_file(data_dir, blake3::hash(content).to_hex().as_str());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, content).unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(std::time::SystemTime::now() - age).unwrap();
    path
}

#[test]
fn orphaned_blobs_older_than_an_hour_are_swept_and_referenced_or_recent_ones_stay() {
    let server = Server::start();
    let uploaded = server.upload("kept.txt", b"an uploaded asset, referenced".to_vec());
    let hash = uploaded["hash"]
        .as_str()
        .unwrap()
        .trim_start_matches("blake3:")
        .to_string();
    let data_dir = server.kill();
    let referenced = blob_file(&data_dir, &hash);
    assert!(referenced.exists(), "uploaded blob at {}", referenced.display());
    std::fs::File::options()
        .write(true)
        .open(&referenced)
        .unwrap()
        .set_modified(std::time::SystemTime::now() - Duration::from_secs(7200))
        .unwrap();
    let old_orphan = plant_orphan(&data_dir, b"left by a crash two hours ago", Duration::from_secs(7200));
    let new_orphan = plant_orphan(
        &data_dir,
        b"written a minute ago, maybe still committing",
        Duration::from_secs(60),
    );

    let server = Server::with(Options {
        data_dir: Some(data_dir.clone()),
        ..Default::default()
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while old_orphan.exists() {
        assert!(std::time::Instant::now() < deadline, "the old orphan was never swept");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(referenced.exists(), "a referenced blob stays, however old");
    assert!(new_orphan.exists(), "a recent blob stays");
    let asset: Value = server
        .get(&format!("/api/v2/assets/{}", uploaded["id"].as_str().unwrap()))
        .json()
        .unwrap();
    assert_eq!(
        server.download(asset["url"].as_str().unwrap()),
        b"an uploaded asset, referenced"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
}

/// Enough jobs that the store's WAL is checkpointed several times while they are submitted
/// and run (about 8 MiB of WAL a checkpoint), then kill -9 right after the last 201: every
/// accepted job is there after the restart and finishes with its own output.
#[test]
fn no_accepted_job_is_lost_after_kill_9_across_wal_checkpoints() {
    let options = Options {
        args: vec!["--workers".into(), "2".into()],
        ..Default::default()
    };
    let server = Server::with(options.clone());
    let ids: Vec<String> = (0..800)
        .map(|i| {
            server.submit(text_workflow(&format!("c{i}")))["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let data_dir = server.kill();
    let server = Server::with(Options {
        data_dir: Some(data_dir.clone()),
        ..options
    });
    assert_each_succeeded_with_its_text(&server, &ids, "c");
    drop(server);
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn previews_are_temporary_outputs_removed_after_the_preview_retention_while_saved_images_stay() {
    let server = Server::with(Options {
        args: [
            "--inline-output-kib",
            "0",
            "--preview-retention-secs",
            "1",
            "--sweep-interval-secs",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Default::default()
    });
    let image =
        json!({"class_type": "EmptyImage", "inputs": {"width": 8, "height": 6, "batch_size": 1, "color": 0x336699}});
    let done = server.run(json!({
        "1": image,
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "kept"}}
    }));
    assert_eq!(done["status"], "succeeded", "{done}");
    let outputs = done["outputs"].as_array().unwrap();
    let by_node = |node: &str| outputs.iter().find(|o| o["node_id"] == node).unwrap().clone();
    let (preview, saved) = (by_node("2"), by_node("3"));
    assert_eq!(preview["temporary"], true, "{preview}");
    assert!(
        preview["name"].as_str().unwrap().starts_with("ComfyUI_temp"),
        "{preview}"
    );
    assert_eq!(saved["temporary"], false, "{saved}");
    // The same pixels and workflow: one blob, which the saved image keeps alive.
    assert_eq!(preview["hash"], saved["hash"]);

    // Gone after the preview retention: from the job's outputs and as an asset.
    let job_path = format!("/api/v2/jobs/{}", done["id"].as_str().unwrap());
    let preview_path = format!("/api/v2/assets/{}", preview["id"].as_str().unwrap());
    let mut job = Value::Null;
    for _ in 0..600 {
        job = server.get(&job_path).json().unwrap();
        if job["outputs"].as_array().unwrap().len() == 1 && server.get(&preview_path).status() == 404 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        server.get(&preview_path).status(),
        404,
        "the preview outlived its retention"
    );
    assert_eq!(job["outputs"].as_array().unwrap().len(), 1, "{job}");
    assert_eq!(job["outputs"][0]["id"], saved["id"]);
    let kept = server.download(saved["url"].as_str().unwrap());
    assert!(kept.starts_with(b"\x89PNG"), "the saved image lost its content");
}

#[test]
fn an_outputs_asset_is_retrievable_while_its_job_is_retained_previews_included_by_default() {
    let server = Server::start();
    let image = json!({"class_type": "EmptyImage", "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": 9}});
    let done = server.run(json!({
        "1": image,
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}
    }));
    assert_eq!(done["status"], "succeeded", "{done}");
    let preview = &done["outputs"][0];
    assert_eq!(preview["temporary"], true, "{preview}");
    let asset = server.get(&format!("/api/v2/assets/{}", preview["id"].as_str().unwrap()));
    assert_eq!(asset.status(), 200);
    let asset: Value = asset.json().unwrap();
    assert_eq!(
        asset["expires_at"], done["expires_at"],
        "the preview goes with its job: {asset}"
    );
}
