//! Black-box tests of scale-out: three real `weft` processes share one PostgreSQL database
//! (a throw-away cluster, see `support::postgres`) and one blob dir, as they would behind a
//! load balancer. A client cannot tell which process it talks to.

mod support;

use std::path::PathBuf;
use std::time::Instant;

use serde_json::{json, Value};
use support::sse::Sse;
use support::{plugins_with, slow_workflow, Options, Server};

/// What the processes of one test share.
struct Cluster {
    database: String,
    blobs: tempfile::TempDir,
    plugins: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Self {
        Cluster {
            database: support::postgres::fresh_database(),
            blobs: tempfile::tempdir().unwrap(),
            plugins: plugins_with(&["weft_test_counter", "weft_test_host_hog"]),
        }
    }

    /// Starts a process with `role` (and `extra` arguments) on the shared database. Its
    /// leases last 30 s unless `extra` says otherwise: on a loaded 2-core machine a process
    /// can miss a short lease's renewal, and its live jobs would then be rescued and run
    /// twice, which only the rescue test wants to provoke (by a kill).
    fn process(&self, role: &str, extra: &[&str]) -> Server {
        let mut args = vec![
            "--blob-dir".to_string(),
            self.blobs.path().display().to_string(),
            "--role".into(),
            role.into(),
        ];
        if !extra.contains(&"--lease-secs") {
            args.extend(["--lease-secs".to_string(), "30".to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        Server::with(Options {
            args,
            database: Some(self.database.clone()),
            plugins_dir: Some(self.plugins.path().to_path_buf()),
            ..Default::default()
        })
    }

    /// Runs `sql` on the shared database and returns its rows' first column as text.
    fn query(&self, sql: &str) -> Vec<String> {
        let url = self.database.clone();
        let sql = sql.to_string();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            client
                .query(&sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect()
        })
    }
}

fn save_text(text: &str) -> Value {
    json!({"1": {"class_type": "SaveText", "inputs": {"text": text, "filename_prefix": "t"}}})
}

fn id_of(job: &Value) -> String {
    job["id"].as_str().unwrap().to_string()
}

#[test]
fn a_thousand_jobs_submitted_round_robin_all_succeed_each_run_once() {
    let cluster = Cluster::new();
    let servers: Vec<Server> = (0..3).map(|_| cluster.process("all", &["--workers", "2"])).collect();
    let ids: Vec<String> = std::thread::scope(|s| {
        let submitters: Vec<_> = (0..6)
            .map(|t| {
                let servers = &servers;
                s.spawn(move || {
                    (0..1000)
                        .filter(|i| i % 6 == t)
                        .map(|i| id_of(&servers[i % 3].submit(save_text(&format!("job {i}")))))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        submitters.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ids.len(), 1000);
    for (i, id) in ids.iter().enumerate() {
        // Read back through a process other than the one that took the submission.
        let job = servers[(i + 1) % 3].wait(id);
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(job["outputs"].as_array().map(Vec::len), Some(1), "{job}");
    }
    // Each job was started exactly once: one `running` status event in its log. The log is
    // written behind the jobs' own rows: wait for it to hold every start.
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while cluster
        .query("SELECT COUNT(DISTINCT job_id)::text FROM job_events WHERE body LIKE '%\"status\":\"running\"%'")
        != ["1000"]
        && Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let starts = cluster.query(
        "SELECT COUNT(*)::text FROM job_events WHERE body LIKE '{\"kind\":\"status\"%' AND body LIKE '%\"status\":\"running\"%' GROUP BY job_id HAVING COUNT(*) <> 1",
    );
    assert!(starts.is_empty(), "jobs started more than once: {starts:?}");
    let started =
        cluster.query("SELECT COUNT(DISTINCT job_id)::text FROM job_events WHERE body LIKE '%\"status\":\"running\"%'");
    assert_eq!(started, ["1000"]);
    // A job's end gives up its claim in the log batch that records it: wait for the last.
    let claimed = "SELECT COUNT(DISTINCT claimed_by)::text FROM jobs WHERE claimed_by IS NOT NULL";
    while cluster.query(claimed) != ["0"] && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(cluster.query(claimed), ["0"], "every claim was released");
}

#[test]
fn a_stream_on_one_process_follows_a_job_run_by_another() {
    let cluster = Cluster::new();
    let api = cluster.process("api", &[]);
    let _worker = cluster.process("all", &["--workers", "1"]);
    let other_api = cluster.process("api", &[]);
    let job = api.submit(slow_workflow(1.5));
    let id = id_of(&job);
    let mut sse = Sse::open(&api, &id, None);
    let first = sse.next_event().unwrap();
    assert_eq!(first.event, "status");
    let mut frames = vec![first];
    let mut resume_at = None;
    while let Some(frame) = sse.next_event() {
        if frame.event == "progress" && resume_at.is_none() {
            resume_at = frame.id;
            frames.push(frame);
            break;
        }
        frames.push(frame);
    }
    let resume_at = resume_at.expect("a progress event from the worker");
    frames.extend(sse.rest());
    let statuses: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "status")
        .map(|f| f.data["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(statuses.last().map(String::as_str), Some("succeeded"), "{frames:?}");
    assert!(statuses.contains(&"running".to_string()), "{statuses:?}");
    assert!(frames.iter().any(|f| f.event == "output"), "{frames:?}");
    let ids: Vec<u64> = frames.iter().skip(1).map(|f| f.id.expect("event without id")).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids not rising: {ids:?}");
    // Resuming on a third process with Last-Event-ID replays what came after, from the log.
    let replayed = Sse::open(&other_api, &id, Some(resume_at)).rest();
    let after: Vec<u64> = frames.iter().filter_map(|f| f.id).filter(|n| *n > resume_at).collect();
    let replayed_ids: Vec<u64> = replayed
        .iter()
        .filter(|f| f.event != "status" || f.id != replayed.last().and_then(|l| l.id))
        .filter_map(|f| f.id)
        .collect();
    for n in &after[..after.len().saturating_sub(1)] {
        assert!(replayed_ids.contains(n), "event {n} not replayed: {replayed:?}");
    }
    assert_eq!(replayed.last().unwrap().data["status"], "succeeded");
}

/// Reads ComfyUI `/ws` text messages until `prompt_id`'s `executing` with a null node.
fn socket_messages_until_done(
    socket: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    prompt_id: &str,
) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        match socket.read().expect("a message within a minute, until the prompt ends") {
            tungstenite::Message::Text(text) => {
                let message: Value = serde_json::from_str(&text).unwrap();
                let done = message["type"] == "executing"
                    && message["data"]["node"].is_null()
                    && message["data"]["prompt_id"] == prompt_id;
                seen.push(message);
                if done {
                    return seen;
                }
            }
            _ => continue,
        }
    }
}

#[test]
fn a_comfyui_socket_on_one_process_sees_the_messages_of_a_prompt_run_by_another() {
    let cluster = Cluster::new();
    // An `api` process runs no jobs: the prompt runs on the other one.
    let api = cluster.process("api", &[]);
    let _worker = cluster.process("all", &["--workers", "1"]);
    let url = format!("{}/ws?clientId=watcher", api.base.replacen("http://", "ws://", 1));
    let (mut socket, _) = tungstenite::connect(url).unwrap();
    if let tungstenite::stream::MaybeTlsStream::Plain(stream) = socket.get_ref() {
        // A message that never comes fails the test instead of hanging it.
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
    }
    let prompt = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 5}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "ComfyUI"}}
    });
    let answer: Value = api
        .post("/prompt", &json!({"prompt": prompt, "client_id": "watcher"}))
        .json()
        .unwrap();
    let id = answer["prompt_id"].as_str().expect("a prompt id").to_string();
    let seen = socket_messages_until_done(&mut socket, &id);
    let kinds: Vec<&str> = seen
        .iter()
        .filter(|m| m["data"]["prompt_id"] == id.as_str())
        .filter_map(|m| m["type"].as_str())
        .collect();
    assert_eq!(kinds.first(), Some(&"execution_start"), "{kinds:?}");
    for kind in ["executing", "executed", "execution_success"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }
}

#[test]
fn a_killed_process_jobs_are_rescued_and_finish() {
    let cluster = Cluster::new();
    let api = cluster.process("api", &[]);
    let doomed = cluster.process("worker", &["--workers", "1", "--lease-secs", "2"]);
    let job = api.submit(slow_workflow(2.0));
    let id = id_of(&job);
    support::wait_running(&api, &id);
    // Accepted while the worker dies: queued behind the running job.
    let waiting: Vec<String> = (0..3)
        .map(|i| id_of(&api.submit(save_text(&format!("w{i}")))))
        .collect();
    doomed.kill();
    let _rescuer = cluster.process("worker", &["--workers", "2"]);
    let done = api.wait(&id);
    assert_eq!(done["status"], "succeeded", "{done}");
    for w in waiting {
        assert_eq!(api.wait(&w)["status"], "succeeded");
    }
}

/// A job that waits `seconds` without using a core (a sleep in WASI), then commits a
/// preview of its number.
fn sleeping(seconds: f64) -> Value {
    json!({
        "1": {"class_type": "HostileSleep", "inputs": {"seconds": seconds}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    })
}

#[test]
fn a_worker_killed_mid_batch_loses_no_job_and_each_ends_once_at_the_default_lease() {
    let cluster = Cluster::new();
    let api = cluster.process("api", &[]);
    // Default leases (30 s): the dead worker's claims lapse because its connection closed.
    let doomed = Server::with(Options {
        args: [
            "--blob-dir",
            &cluster.blobs.path().display().to_string(),
            "--role",
            "worker",
            "--workers",
            "8",
        ]
        .map(String::from)
        .to_vec(),
        database: Some(cluster.database.clone()),
        plugins_dir: Some(cluster.plugins.path().to_path_buf()),
        ..Default::default()
    });
    let ids: Vec<String> = (0..24).map(|_| id_of(&api.submit(sleeping(0.5)))).collect();
    let claimed_by_doomed = format!(
        "SELECT COUNT(*)::text FROM jobs WHERE status = 'running' AND claimed_by LIKE '{}-%'",
        doomed.pid()
    );
    let deadline = Instant::now() + std::time::Duration::from_secs(120);
    while cluster.query(&claimed_by_doomed)[0].parse::<u32>().unwrap() < 4 {
        assert!(Instant::now() < deadline, "the worker never took a batch");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    doomed.kill();
    let _survivor = cluster.process("worker", &["--workers", "8", "--lease-secs", "30"]);
    for id in &ids {
        let job = api.wait(id);
        assert_eq!(job["status"], "succeeded", "{job}");
    }
    let ended_twice = cluster.query(
        "SELECT job_id FROM job_events WHERE body LIKE '{\"kind\":\"status\"%' AND body LIKE '%\"status\":\"succeeded\"%'
         GROUP BY job_id HAVING COUNT(*) <> 1",
    );
    assert!(
        ended_twice.is_empty(),
        "jobs that ended more than once: {ended_twice:?}"
    );
    let ended = cluster
        .query("SELECT COUNT(DISTINCT job_id)::text FROM job_events WHERE body LIKE '%\"status\":\"succeeded\"%'");
    assert_eq!(ended, ["24"], "every job's end is in its log");
}

#[test]
fn concurrent_duplicate_idempotency_keys_across_processes_give_one_201() {
    let cluster = Cluster::new();
    let servers: Vec<Server> = (0..3).map(|_| cluster.process("all", &[])).collect();
    for round in 0..3 {
        let key = format!("key-{round}");
        let statuses: Vec<u16> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..12)
                .map(|i| {
                    let server = &servers[i % 3];
                    let key = key.clone();
                    s.spawn(move || {
                        server
                            .request(reqwest::Method::POST, "/api/v2/jobs")
                            .header("Idempotency-Key", key)
                            .json(&json!({"workflow": save_text("dup")}))
                            .send()
                            .unwrap()
                            .status()
                            .as_u16()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
        // The others are refused as a reused key (422 idempotency_key_reuse), never a 5xx.
        assert!(statuses.iter().all(|s| *s == 201 || *s == 422), "{statuses:?}");
    }
}

#[test]
fn a_cancel_sent_to_one_process_stops_the_job_running_on_another() {
    let cluster = Cluster::new();
    let api = cluster.process("api", &[]);
    let _worker = cluster.process("worker", &["--workers", "1"]);
    let job = api.submit(slow_workflow(300.0));
    let id = id_of(&job);
    support::wait_running(&api, &id);
    let canceled: Value = api
        .post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}))
        .json()
        .unwrap();
    assert_eq!(canceled["status"], "canceling", "{canceled}");
    let sent = Instant::now();
    let done = api.wait(&id);
    assert_eq!(done["status"], "canceled", "{done}");
    println!(
        "the node on the other process stopped {:?} after the cancel",
        sent.elapsed()
    );
}

#[test]
fn a_worker_only_process_serves_health_and_metrics_but_not_the_api() {
    let cluster = Cluster::new();
    let worker = cluster.process("worker", &[]);
    assert_eq!(worker.get("/healthz").status().as_u16(), 200);
    assert_eq!(worker.get("/metrics").status().as_u16(), 200);
    assert_eq!(worker.get("/api/v2/jobs").status().as_u16(), 404);
}

#[test]
fn api_and_worker_roles_need_a_shared_database() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(support::weft_bin())
        .args(["serve", "--role", "worker", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("postgres://"));
}

#[test]
fn db_migrate_applies_the_schema_and_refuses_a_newer_one() {
    let cluster = Cluster::new();
    let migrate = || {
        std::process::Command::new(support::weft_bin())
            .args(["db", "migrate", "--database", &cluster.database])
            .output()
            .unwrap()
    };
    let out = migrate();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let latest = format!("version {}", weft::store::postgres::SCHEMA_VERSION);
    assert!(String::from_utf8_lossy(&out.stdout).contains(&latest));
    assert_eq!(
        weft::store::postgres::SCHEMA_VERSION,
        5,
        "migration 5 counts events beside the jobs and indexes the claimable ones"
    );
    assert!(migrate().status.success(), "migrating again is a no-op");
    cluster.query("INSERT INTO weft_schema (version) VALUES (1000) RETURNING version::text");
    let out = migrate();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("newer"));
    let data: PathBuf = tempfile::tempdir().unwrap().keep();
    let serve = std::process::Command::new(support::weft_bin())
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--database",
            &cluster.database,
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!serve.status.success(), "serve refuses a newer schema");
    let _ = std::fs::remove_dir_all(data);
}
