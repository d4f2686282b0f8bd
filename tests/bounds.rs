//! Black-box tests of bounded work per request and of fairness between tenants: what a
//! caller or a plugin sends cannot make an answer grow without limit, and one tenant
//! cannot take the queue or the event streams from another.

mod support;

use serde_json::{json, Map, Value};
use support::{error_code, slow_workflow, Options, Server};

/// Submits `workflow`, returning the status and the raw body.
fn submit_raw(server: &Server, workflow: &Value) -> (u16, String) {
    let r = server.post("/api/v2/jobs", &json!({ "workflow": workflow }));
    (r.status().as_u16(), r.text().unwrap())
}

/// A cycle of `n` string nodes (node `i` reads node `i - 1`, node 1 reads node `n`),
/// saved by one output node.
fn cycle(n: usize) -> Value {
    let mut nodes = Map::new();
    for i in 1..=n {
        let previous = if i == 1 { n } else { i - 1 };
        nodes.insert(
            i.to_string(),
            json!({"class_type": "StringConcatenate",
                   "inputs": {"string_a": [previous.to_string(), 0], "string_b": "b", "delimiter": ""}}),
        );
    }
    nodes.insert(
        "save".into(),
        json!({"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}),
    );
    Value::Object(nodes)
}

#[test]
fn the_invalid_workflow_answer_to_a_cycle_stays_bounded_as_the_cycle_grows() {
    let server = Server::start();
    let mut sizes = Vec::new();
    for n in [200, 6_000] {
        let (status, text) = submit_raw(&server, &cycle(n));
        assert_eq!(status, 422);
        let body: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(error_code(&body), "invalid_workflow");
        let details = &body["error"]["details"];
        assert_eq!(details["error_count"], n, "every node of the cycle is counted");
        assert_eq!(details["truncated"], true);
        let listed: usize = details["node_errors"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_array().unwrap().len())
            .sum();
        assert!(listed > 0 && listed <= 100, "{listed} errors listed");
        let reason = details["node_errors"]["1"][0]["reason"].as_str();
        assert_eq!(reason, Some("dependency_cycle"), "{}", &text[..text.len().min(500)]);
        sizes.push(text.len());
    }
    assert!(
        sizes[1] < 64 << 10,
        "a 6,000-node cycle gets a {} byte answer",
        sizes[1]
    );
    assert!(
        sizes[1] <= sizes[0] + 1024,
        "the answer grew with the cycle: {} -> {} bytes",
        sizes[0],
        sizes[1]
    );
}

#[test]
fn a_small_invalid_workflow_lists_every_error_and_is_not_truncated() {
    let server = Server::start();
    let (status, text) = submit_raw(&server, &cycle(3));
    assert_eq!(status, 422);
    let body: Value = serde_json::from_str(&text).unwrap();
    let details = &body["error"]["details"];
    assert_eq!(details["error_count"], 3);
    assert_eq!(details["truncated"], false);
    for id in ["1", "2", "3"] {
        assert_eq!(details["node_errors"][id][0]["reason"], "dependency_cycle", "{text}");
    }
}

#[test]
fn a_value_not_in_a_long_combo_lists_a_bounded_number_of_choices() {
    // The combo is the models folder's checkpoints: a folder of many files is the largest
    // list of choices an operator can make, and a value that is not one of them is echoed.
    let models = tempfile::tempdir().unwrap();
    let checkpoints = models.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    for i in 0..2_000 {
        std::fs::write(
            checkpoints.join(format!("model-with-a-long-name-{i:05}.safetensors")),
            b"",
        )
        .unwrap();
    }
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.path().display().to_string()],
        ..Default::default()
    });
    let wrong = "w".repeat(1 << 20);
    let workflow = json!({
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": wrong}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    });
    let (status, text) = submit_raw(&server, &workflow);
    assert_eq!(status, 422, "{}", &text[..text.len().min(500)]);
    let body: Value = serde_json::from_str(&text).unwrap();
    let error = &body["error"]["details"]["node_errors"]["1"][0];
    assert_eq!(error["reason"], "value_not_in_list", "{}", &text[..text.len().min(500)]);
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("more"), "{message}");
    assert!(text.len() < 8 << 10, "the answer is {} bytes", text.len());
}

/// A server with the loud test plugin.
fn loud_server() -> (Server, tempfile::TempDir) {
    let plugins = support::plugins_with(&["weft_test_loud"]);
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    (server, plugins)
}

#[test]
fn a_huge_progress_message_is_cut_before_it_is_stored_or_served() {
    let (server, _plugins) = loud_server();
    let done = server.run(json!({"1": {"class_type": "HostileLoudProgress", "inputs": {"mib": 16}}}));
    assert_eq!(done["status"], "succeeded", "{done}");
    let message = done["progress"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", done.to_string().chars().take(2000).collect::<String>()));
    assert!(message.len() <= 1024, "progress message of {} bytes", message.len());
    assert!(message.starts_with('é') && message.contains("truncated"), "{message}");
    let id = done["id"].as_str().unwrap();
    let job = server.get(&format!("/api/v2/jobs/{id}")).text().unwrap();
    assert!(job.len() < 16 << 10, "GET of the job is {} bytes", job.len());
    let list = server.get("/api/v2/jobs").text().unwrap();
    assert!(list.len() < 16 << 10, "the job list is {} bytes", list.len());
}

#[test]
fn a_huge_node_error_message_is_cut_before_it_is_stored_or_served() {
    let (server, _plugins) = loud_server();
    let done = server.run(json!({
        "1": {"class_type": "HostileLoudError", "inputs": {"mib": 16}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    }));
    assert_eq!(done["status"], "failed", "{done}");
    assert!(
        done["error"]["code"].is_string(),
        "{}",
        done.to_string().chars().take(2000).collect::<String>()
    );
    let message = done["error"]["message"].as_str().unwrap();
    assert!(message.len() <= 8 << 10, "error message of {} bytes", message.len());
    assert!(message.contains("truncated"), "{message}");
    let id = done["id"].as_str().unwrap();
    let job = server.get(&format!("/api/v2/jobs/{id}")).text().unwrap();
    assert!(job.len() < 32 << 10, "GET of the job is {} bytes", job.len());
}

/// Two tenants, `a` and `b`, with keys, on a server with the counter plugin and `args`.
fn two_tenants(args: &[&str]) -> (Server, String, String, tempfile::TempDir, tempfile::TempDir) {
    let plugins = support::plugins_with(&["weft_test_counter"]);
    let dir = tempfile::tempdir().unwrap();
    let key_a = support::new_key(dir.path(), "a");
    let key_b = support::new_key(dir.path(), "b");
    let mut all = vec!["--auth".to_string(), "keys".to_string()];
    all.extend(args.iter().map(|s| s.to_string()));
    let server = Server::with(Options {
        args: all,
        data_dir: Some(dir.path().to_path_buf()),
        plugins_dir: Some(plugins.path().to_path_buf()),
        token: Some(key_a.clone()),
        ..Default::default()
    });
    (server, key_a, key_b, plugins, dir)
}

fn wait_running(server: &Server, id: &str) {
    for _ in 0..6000 {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if job["status"] == "running" {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("job {id} never ran");
}

#[test]
fn a_tenant_that_fills_its_share_of_the_queue_does_not_lock_out_another() {
    let (server, key_a, key_b, _p, _d) = two_tenants(&["--workers", "1", "--queue-depth", "4"]);
    let running = server.submit(slow_workflow(300.0));
    let running = running["id"].as_str().unwrap().to_string();
    wait_running(&server, &running);
    let mut mine = Vec::new();
    for _ in 0..2 {
        mine.push(server.submit(slow_workflow(300.0))["id"].as_str().unwrap().to_string());
    }
    let r = server.post("/api/v2/jobs", &json!({"workflow": slow_workflow(300.0)}));
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers()["retry-after"].to_str().unwrap().parse::<u64>().is_ok());
    let body: Value = r.json().unwrap();
    assert_eq!(error_code(&body), "queue_full");
    server.set_token(Some(&key_b));
    let theirs = server.submit(slow_workflow(300.0));
    assert_eq!(theirs["status"], "queued");
    let theirs = theirs["id"].as_str().unwrap().to_string();
    server.post(&format!("/api/v2/jobs/{theirs}/cancel"), &json!({}));
    server.set_token(Some(&key_a));
    for id in mine.iter().chain([&running]) {
        server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    }
}

#[test]
fn a_tenant_that_fills_its_share_of_event_streams_does_not_lock_out_another() {
    let (server, key_a, key_b, _p, _d) = two_tenants(&["--max-streams", "4"]);
    let job_a = server.submit(slow_workflow(300.0))["id"].as_str().unwrap().to_string();
    let open = |key: &str, id: &str| {
        server
            .http
            .get(server.url(&format!("/api/v2/jobs/{id}/events")))
            .bearer_auth(key)
            .send()
            .unwrap()
    };
    let streams: Vec<_> = (0..2).map(|_| open(&key_a, &job_a)).collect();
    for s in &streams {
        assert_eq!(s.status().as_u16(), 200);
    }
    let refused = open(&key_a, &job_a);
    assert_eq!(refused.status().as_u16(), 429);
    assert!(refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse::<u64>()
        .is_ok());
    let body: Value = refused.json().unwrap();
    assert_eq!(error_code(&body), "too_many_streams");
    server.set_token(Some(&key_b));
    let job_b = server.submit(slow_workflow(300.0))["id"].as_str().unwrap().to_string();
    let theirs = open(&key_b, &job_b);
    assert_eq!(theirs.status().as_u16(), 200, "tenant b cannot stream");
    drop(theirs);
    drop(streams);
    server.post(&format!("/api/v2/jobs/{job_b}/cancel"), &json!({}));
    server.set_token(Some(&key_a));
    server.post(&format!("/api/v2/jobs/{job_a}/cancel"), &json!({}));
}

#[test]
fn a_job_commits_at_most_its_output_count_and_fails_cleanly_past_it() {
    let server = Server::with(Options {
        args: ["--max-job-outputs", "4"].map(String::from).to_vec(),
        ..Default::default()
    });
    let four = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 4, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "four"}}
    }));
    assert_eq!(four["status"], "succeeded", "{four}");
    assert_eq!(four["outputs"].as_array().unwrap().len(), 4);
    let many = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 256, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "many"}}
    }));
    assert_eq!(many["status"], "failed", "{many}");
    assert_eq!(many["error"]["code"], "job_output_limit", "{many}");
    assert_eq!(many["error"]["node_id"], "2", "{many}");
    assert!(
        many["outputs"].as_array().unwrap().is_empty(),
        "nothing of the batch was committed"
    );
}

#[test]
fn a_job_commits_at_most_its_output_bytes_and_fails_cleanly_past_them() {
    let server = Server::with(Options {
        args: ["--max-job-output-mib", "1"].map(String::from).to_vec(),
        ..Default::default()
    });
    let text = "x".repeat(400 << 10);
    let mut workflow = Map::new();
    for i in 1..=3 {
        workflow.insert(
            i.to_string(),
            json!({"class_type": "SaveText", "inputs": {"text": text, "filename_prefix": format!("part{i}")}}),
        );
    }
    let job = server.run(Value::Object(workflow));
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], "job_output_limit", "{job}");
    let committed: i64 = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["size_bytes"].as_i64().unwrap())
        .sum();
    assert!(committed <= 1 << 20, "{committed} bytes committed past a 1 MiB bound");
    assert_eq!(
        job["outputs"].as_array().unwrap().len(),
        2,
        "two 400 KiB texts fit, the third does not"
    );
}

/// A workflow saving an 8x8 batch of `batch` images, carrying an unconnected string node of
/// `padding` bytes (so the workflow embedded in each PNG is that large).
fn padded_image_batch(batch: u32, padding: usize) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": batch, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "padded"}},
        "9": {"class_type": "PrimitiveString", "inputs": {"value": "p".repeat(padding)}}
    })
}

fn committed_sizes(job: &Value) -> Vec<i64> {
    job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["size_bytes"].as_i64().unwrap())
        .collect()
}

#[test]
fn encoded_png_and_latent_outputs_count_against_the_output_bytes() {
    let server = Server::with(Options {
        args: ["--max-job-output-mib", "1"].map(String::from).to_vec(),
        ..Default::default()
    });
    // Sixteen 8x8 PNGs each carrying a 100 KiB workflow: 1.6 MB encoded, from 3 KiB of pixels.
    let pngs = server.run(padded_image_batch(16, 100 << 10));
    assert_eq!(pngs["status"], "failed", "{pngs}");
    assert_eq!(pngs["error"]["code"], "job_output_limit", "{pngs}");
    let sizes = committed_sizes(&pngs);
    assert!(!sizes.is_empty() && sizes.len() < 16, "{} PNGs committed", sizes.len());
    assert!(
        sizes.iter().all(|&s| s > 100 << 10),
        "each PNG counted as encoded: {sizes:?}"
    );
    assert!(sizes.iter().sum::<i64>() <= 1 << 20, "{sizes:?} past a 1 MiB bound");

    // Latents are counted as the .latent files they are saved as: 8 x 4 x 64 x 64 floats fit,
    // 20 do not.
    let latent = |batch: u32| {
        json!({
            "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": batch}},
            "2": {"class_type": "SaveLatent", "inputs": {"samples": ["1", 0], "filename_prefix": "l"}}
        })
    };
    let fits = server.run(latent(8));
    assert_eq!(fits["status"], "succeeded", "{fits}");
    assert!(committed_sizes(&fits)[0] >= 8 * 4 * 64 * 64 * 4, "{fits}");
    let over = server.run(latent(20));
    assert_eq!(over["status"], "failed", "{over}");
    assert_eq!(over["error"]["code"], "job_output_limit", "{over}");
    assert!(committed_sizes(&over).is_empty(), "{over}");
}

#[test]
fn a_batch_embeds_a_small_workflow_in_every_png_and_a_big_one_in_none() {
    let server = Server::start();
    let has_prompt = |png: &[u8]| png.windows(10).any(|w| w == b"tEXtprompt");

    let small = server.run(padded_image_batch(3, 10));
    assert_eq!(small["status"], "succeeded", "{small}");
    for output in small["outputs"].as_array().unwrap() {
        let png = server.download(output["url"].as_str().unwrap());
        assert!(
            has_prompt(&png),
            "ComfyUI's `prompt` chunk is kept for a small workflow"
        );
    }

    // A 200 KiB workflow is not copied into each of 32 PNGs.
    let big = server.run(padded_image_batch(32, 200 << 10));
    assert_eq!(big["status"], "succeeded", "{big}");
    let sizes = committed_sizes(&big);
    assert_eq!(sizes.len(), 32);
    assert!(sizes.iter().all(|&s| s < 4096), "{sizes:?}");
    let png = server.download(big["outputs"][0]["url"].as_str().unwrap());
    assert!(!has_prompt(&png));
}
