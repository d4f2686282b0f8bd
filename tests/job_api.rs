//! Black-box tests of the v2 job API: submission, idempotency, states, listing, the queue,
//! links, surfaces, auth, errors and configuration. Each test is named after its rule.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::{json, Value};
use support::{slow_workflow, Options, Server};

/// A trivial valid workflow that writes `text` as a text output.
fn text_workflow(text: &str) -> Value {
    json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": text}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    })
}

fn asset_workflow(id: &str) -> Value {
    json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": id}}}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}
    })
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    s.chars().take(600).collect()
}

/// Sends a request, returning (status, headers, JSON body or Null).
fn send(rb: reqwest::blocking::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = rb.send().unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().unwrap_or_default();
    (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn submit_with(server: &Server, body: Value, key: Option<&str>) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut rb = server.request(reqwest::Method::POST, "/api/v2/jobs").json(&body);
    if let Some(k) = key {
        rb = rb.header("Idempotency-Key", k);
    }
    send(rb)
}

/// Asserts that `body` is the error envelope with `code`.
fn assert_envelope(body: &Value, code: &str) {
    let error = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("no envelope: {}", short(body)));
    assert_eq!(error["code"], code, "{}", short(body));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{}",
        short(body)
    );
}

fn server_with(args: &[&str]) -> Server {
    Server::with(Options {
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

fn job(server: &Server, id: &str) -> Value {
    server.get(&format!("/api/v2/jobs/{id}")).json().unwrap()
}

fn wait_status(server: &Server, id: &str, status: &str) -> Value {
    for _ in 0..6000 {
        let j = job(server, id);
        if j["status"] == status {
            return j;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("job {id} never reached {status}");
}

fn cancel(server: &Server, id: &str) -> Value {
    let r = server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(r.status().as_u16(), 200);
    r.json().unwrap()
}

fn db_bytes(data_dir: &std::path::Path) -> Vec<u8> {
    let mut all = Vec::new();
    for name in ["weft.db", "weft.db-wal"] {
        if let Ok(b) = std::fs::read(data_dir.join(name)) {
            all.extend(b);
        }
    }
    all
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn weft(args: &[&str]) -> String {
    let out = Command::new(support::weft_bin())
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "weft {args:?} failed");
    String::from_utf8(out.stdout).unwrap()
}

// ---------------------------------------------------------------- submit

#[test]
fn submit_returns_201_with_the_full_job_shape_and_no_logs() {
    let server = Server::start();
    let (status, _, job) = submit_with(&server, json!({"workflow": text_workflow("hi")}), None);
    assert_eq!(status, 201, "{}", short(&job));
    for field in [
        "id",
        "status",
        "created_at",
        "started_at",
        "completed_at",
        "expires_at",
        "queue_position",
        "progress",
        "outputs",
        "error",
        "urls",
    ] {
        assert!(job.get(field).is_some(), "missing {field}: {}", short(&job));
    }
    assert!(job.get("logs").is_none(), "logs present on self-hosted");
    assert_eq!(job["status"], "queued");
    assert!(uuid_like(job["id"].as_str().unwrap()));
    assert!(job["started_at"].is_null() && job["completed_at"].is_null() && job["error"].is_null());
    assert!(job["outputs"].is_array());
    assert!(job["expires_at"].is_string());
    if let Some(metrics) = job.get("metrics") {
        assert!(
            metrics.get("execution_ms").is_some_and(Value::is_null),
            "{}",
            short(&job)
        );
    }
    let done = server.wait(job["id"].as_str().unwrap());
    assert_eq!(done["status"], "succeeded", "{}", short(&done));
    assert!(done.get("logs").is_none());
    assert_eq!(done["outputs"][0]["type"], "text");
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36 && s.chars().filter(|c| *c == '-').count() == 4
}

#[test]
fn reserved_webhook_url_and_inputs_are_rejected() {
    let server = Server::start();
    for field in ["webhook_url", "inputs"] {
        let mut body = json!({"workflow": text_workflow("x")});
        body[field] = json!("https://example.com/hook");
        let (status, _, body) = submit_with(&server, body, None);
        assert!((400..500).contains(&status), "{field}: {status}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(field),
            "{}",
            short(&body)
        );
    }
    let list: Value = server.get("/api/v2/jobs").json().unwrap();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0);
}

#[test]
fn extra_data_is_a_closed_object() {
    let server = Server::start();
    let (status, _, body) = submit_with(
        &server,
        json!({"workflow": text_workflow("x"), "extra_data": {"surprise": "1"}}),
        None,
    );
    assert!((400..500).contains(&status), "{status}");
    assert!(body["error"]["code"].is_string());
    let (status, _, _) = submit_with(
        &server,
        json!({"workflow": text_workflow("x"), "extra_data": "nope"}),
        None,
    );
    assert!((400..500).contains(&status));
}

#[test]
fn extra_data_is_never_stored() {
    let server = Server::start();
    let secret = "PLATFORM-KEY-7f3a9c1e5b";
    let body = json!({"workflow": text_workflow("x"), "extra_data": {"api_key_platform_org": secret}});
    let (status, _, job) = submit_with(&server, body, None);
    assert_eq!(status, 201, "{}", short(&job));
    let id = job["id"].as_str().unwrap();
    server.wait(id);
    let wf: Value = server.get(&format!("/api/v2/jobs/{id}/workflow")).json().unwrap();
    assert_eq!(wf["format"], "api");
    assert_eq!(wf["workflow"], text_workflow("x"));
    assert!(!wf.to_string().contains(secret));
    assert!(!server
        .get(&format!("/api/v2/jobs/{id}"))
        .text()
        .unwrap()
        .contains(secret));
    assert!(
        !contains(&db_bytes(&server.data_dir), secret),
        "the database holds extra_data"
    );
}

#[test]
fn missing_asset_for_a_nonexistent_asset() {
    let server = Server::start();
    let id = "00000000-0000-4000-8000-000000000000";
    let (status, _, body) = submit_with(&server, json!({"workflow": asset_workflow(id)}), None);
    assert_eq!(status, 422);
    assert_envelope(&body, "missing_asset");
    assert!(body["error"]["details"].to_string().contains(id));
}

#[test]
fn malformed_json_gets_the_envelope() {
    let server = Server::start();
    let r = server
        .request(reqwest::Method::POST, "/api/v2/jobs")
        .header("content-type", "application/json")
        .body("{\"workflow\": ")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().unwrap();
    assert!(body["error"]["code"].is_string() && body["error"]["message"].is_string());
}

/// A large body is parsed off the async workers; its errors read as a small one's do, and a
/// large valid one is accepted.
#[test]
fn large_bodies_parse_like_small_ones() {
    let server = Server::start();
    let valid = json!({"workflow": text_workflow(&"x".repeat(512 << 10))}).to_string();
    let post = |body: String| {
        server
            .request(reqwest::Method::POST, "/api/v2/jobs")
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap()
    };
    let r = post(valid[..valid.len() - 3].to_string());
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().unwrap();
    assert_envelope(&body, "invalid_json");
    let r = post(valid);
    assert_eq!(r.status().as_u16(), 201);
}

#[test]
fn unknown_routes_wrong_methods_and_oversized_bodies_get_the_envelope() {
    let server = Server::start();
    let (status, _, body) = send(server.request(reqwest::Method::GET, "/api/v2/nope"));
    assert_eq!(status, 404);
    assert_envelope(&body, "not_found");
    let (status, _, body) = send(server.request(
        reqwest::Method::GET,
        "/api/v2/jobs/00000000-0000-4000-8000-000000000000",
    ));
    assert_eq!(status, 404);
    assert_envelope(&body, "not_found");
    let (status, _, body) = send(server.request(reqwest::Method::PUT, "/api/v2/jobs"));
    assert_eq!(status, 405, "{}", short(&body));
    assert!(body["error"]["code"].is_string());
    // 413: announce a body beyond the JSON limit; the server refuses on the header.
    let addr = server.base.strip_prefix("http://").unwrap().to_string();
    let mut tcp = TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "POST /api/v2/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 400000000\r\n\r\n{{"
    )
    .unwrap();
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    while let Ok(n) = tcp.read(&mut buf) {
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&response).contains("\"code\"") && String::from_utf8_lossy(&response).ends_with('}')
        {
            break;
        }
    }
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{}", &text[..text.len().min(300)]);
    assert!(text.contains("\"error\"") && text.contains("\"code\""));
}

// ---------------------------------------------------------------- idempotency

#[test]
fn idempotency_key_reuse_is_rejected_and_names_the_job() {
    let server = Server::start();
    let body = json!({"workflow": text_workflow("x")});
    let (status, _, first) = submit_with(&server, body.clone(), Some("key-1"));
    assert_eq!(status, 201);
    let (status, headers, again) = submit_with(&server, body, Some("key-1"));
    assert_eq!(status, 422);
    assert_envelope(&again, "idempotency_key_reuse");
    assert_eq!(again["error"]["details"]["job_id"], first["id"]);
    assert!(headers.get("idempotency-replayed").is_none());
    let list: Value = server.get("/api/v2/jobs").json().unwrap();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1, "a duplicate was executed");
}

#[test]
fn idempotency_key_reuse_with_a_different_body_is_rejected() {
    let server = Server::start();
    let (status, _, _) = submit_with(&server, json!({"workflow": text_workflow("a")}), Some("k"));
    assert_eq!(status, 201);
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("b")}), Some("k"));
    assert_eq!(status, 422);
    assert_envelope(&body, "idempotency_key_reuse");
}

#[test]
fn idempotency_key_reuse_is_rejected_even_when_the_new_body_is_invalid() {
    let server = Server::start();
    let (status, _, first) = submit_with(&server, json!({"workflow": text_workflow("a")}), Some("k3"));
    assert_eq!(status, 201);
    let bad = json!({"workflow": {"1": {"class_type": "NoSuchClass", "inputs": {}}}});
    let (status, _, body) = submit_with(&server, bad, Some("k3"));
    assert_eq!(status, 422);
    assert_envelope(&body, "idempotency_key_reuse");
    assert_eq!(body["error"]["details"]["job_id"], first["id"]);
}

#[test]
fn idempotency_key_is_released_after_validation_failure() {
    let server = Server::start();
    let bad = json!({"workflow": {"1": {"class_type": "NoSuchClass", "inputs": {}}}});
    let (status, _, body) = submit_with(&server, bad, Some("k2"));
    assert_eq!(status, 422);
    assert_envelope(&body, "invalid_workflow");
    let (status, _, body) = submit_with(
        &server,
        json!({"workflow": asset_workflow("00000000-0000-4000-8000-000000000001")}),
        Some("k2"),
    );
    assert_envelope(&body, "missing_asset");
    assert_eq!(status, 422);
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("ok")}), Some("k2"));
    assert_eq!(status, 201, "{}", short(&body));
}

#[test]
fn idempotency_key_is_released_after_queue_full() {
    let (server, _p) = support::slow_server(&["--workers", "1", "--queue-depth", "1"]);
    let running = server.submit(slow_workflow(300.0));
    wait_status(&server, running["id"].as_str().unwrap(), "running");
    let queued = server.submit(slow_workflow(300.0));
    let (status, headers, body) = submit_with(&server, json!({"workflow": text_workflow("x")}), Some("qk"));
    assert_eq!(status, 429);
    assert_envelope(&body, "queue_full");
    let retry: u64 = headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("integer Retry-After");
    assert!(retry >= 1);
    assert_eq!(cancel(&server, queued["id"].as_str().unwrap())["status"], "canceled");
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("x")}), Some("qk"));
    assert_eq!(status, 201, "{}", short(&body));
    cancel(&server, running["id"].as_str().unwrap());
}

#[test]
fn idempotency_key_is_released_after_insufficient_credits() {
    let server = server_with(&["--surface", "cloud", "--initial-credits", "0"]);
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("x")}), Some("ck"));
    assert_eq!(status, 402);
    assert_envelope(&body, "insufficient_credits");
    let mut args: Vec<String> = ["credits", "add", "--data-dir", server.data_dir.to_str().unwrap()]
        .map(String::from)
        .into();
    args.extend(support::database_args(&server.data_dir));
    args.extend(["--tenant", "default", "--amount", "1"].map(String::from));
    let balance = weft(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(balance.trim(), "1");
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("x")}), Some("ck"));
    assert_eq!(status, 201, "{}", short(&body));
}

#[test]
fn concurrent_duplicates_yield_exactly_one_201() {
    let server = Arc::new(Server::start());
    let barrier = Arc::new(std::sync::Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|_| {
            let (server, barrier) = (server.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                submit_with(&server, json!({"workflow": text_workflow("x")}), Some("same-key"))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let created: Vec<_> = results.iter().filter(|r| r.0 == 201).collect();
    assert_eq!(created.len(), 1);
    let id = &created[0].2["id"];
    for (status, _, body) in results.iter().filter(|r| r.0 != 201) {
        assert_eq!(*status, 422);
        assert_envelope(body, "idempotency_key_reuse");
        assert_eq!(&body["error"]["details"]["job_id"], id);
    }
    let list: Value = server.get("/api/v2/jobs").json().unwrap();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
}

// ---------------------------------------------------------------- states

#[test]
fn cancel_is_defined_in_every_state() {
    let (server, _p) = support::slow_server(&["--workers", "1"]);
    let running = server.submit(slow_workflow(300.0));
    let rid = running["id"].as_str().unwrap().to_string();
    wait_status(&server, &rid, "running");
    let queued = server.submit(slow_workflow(300.0));
    let qid = queued["id"].as_str().unwrap().to_string();
    // queued -> canceled directly.
    let c = cancel(&server, &qid);
    assert_eq!(c["status"], "canceled", "{}", short(&c));
    assert!(c.get("logs").is_none());
    // running -> canceling -> canceled.
    let c = cancel(&server, &rid);
    assert!(
        matches!(c["status"].as_str(), Some("canceling") | Some("canceled")),
        "{}",
        short(&c)
    );
    let done = server.wait(&rid);
    assert_eq!(done["status"], "canceled");
    // terminal: unchanged and idempotent.
    let again = cancel(&server, &rid);
    assert_eq!(again["status"], "canceled");
    assert_eq!(again["completed_at"], done["completed_at"]);
    let ok = server.run(text_workflow("x"));
    let c = cancel(&server, ok["id"].as_str().unwrap());
    assert_eq!(c["status"], "succeeded");
    assert_eq!(cancel(&server, ok["id"].as_str().unwrap())["status"], "succeeded");
    let (status, _, body) = send(server.request(
        reqwest::Method::POST,
        "/api/v2/jobs/00000000-0000-4000-8000-000000000000/cancel",
    ));
    assert_eq!(status, 404);
    assert_envelope(&body, "not_found");
}

#[test]
fn failed_jobs_carry_a_job_error_not_an_http_error() {
    let server = Server::start();
    let asset = server.upload("not-an-image.png", b"plain text, not a png".to_vec());
    let done = server.run(asset_workflow(asset["id"].as_str().unwrap()));
    assert_eq!(done["status"], "failed", "{}", short(&done));
    assert!(done["error"]["code"].is_string() && done["error"]["message"].is_string());
    assert_eq!(done["error"]["node_id"], "1");
}

// ---------------------------------------------------------------- list

#[test]
fn list_is_newest_first_with_limit_cursor_and_metadata_filters() {
    let server = Server::start();
    let mut ids = Vec::new();
    for i in 0..5 {
        let colour = if i % 2 == 0 { "red" } else { "blue" };
        let (status, _, job) = submit_with(
            &server,
            json!({"workflow": text_workflow("x"), "metadata": {"colour": colour, "n": i.to_string()}}),
            None,
        );
        assert_eq!(status, 201);
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v2/jobs?limit=2&cursor={c}"),
            None => "/api/v2/jobs?limit=2".to_string(),
        };
        let page: Value = server.get(&path).json().unwrap();
        let jobs = page["jobs"].as_array().unwrap();
        assert!(jobs.len() <= 2);
        for j in jobs {
            for field in ["id", "status", "create_time", "update_time", "metadata"] {
                assert!(j.get(field).is_some(), "list item lacks {field}");
            }
            seen.push(j["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) if !c.is_empty() => cursor = Some(c.to_string()),
            _ => {
                assert!(page["next_cursor"].is_null());
                break;
            }
        }
    }
    assert_eq!(seen, ids);
    let red: Value = server.get("/api/v2/jobs?metadata[colour]=red").json().unwrap();
    let red_ids: Vec<_> = red["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(red_ids, vec![ids[0].clone(), ids[2].clone(), ids[4].clone()]);
    for j in red["jobs"].as_array().unwrap() {
        assert_eq!(j["metadata"]["colour"], "red");
    }
    let one: Value = server
        .get("/api/v2/jobs?metadata%5Bcolour%5D=blue&metadata%5Bn%5D=3")
        .json()
        .unwrap();
    assert_eq!(one["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(one["jobs"][0]["id"], ids[1].as_str());
}

/// A page of the list shows each job with its own outputs (read for the whole page at once),
/// as `GET /api/v2/jobs/{id}` shows them.
#[test]
fn list_items_carry_each_jobs_own_outputs() {
    let server = Server::start();
    let mut ids = Vec::new();
    for text in ["one", "two", "three"] {
        let (status, _, job) = submit_with(&server, json!({"workflow": text_workflow(text)}), None);
        assert_eq!(status, 201);
        ids.push(job["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        wait_status(&server, id, "succeeded");
    }
    let page: Value = server.get("/api/v2/jobs").json().unwrap();
    let items = page["jobs"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    for item in items {
        let id = item["id"].as_str().unwrap();
        let alone = job(&server, id);
        assert_eq!(item["outputs"].as_array().map(Vec::len), Some(1), "{}", short(item));
        assert_eq!(item["outputs"], alone["outputs"], "job {id}");
    }
}

#[test]
fn metadata_labels_must_be_a_small_string_map() {
    let server = Server::start();
    let many: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for metadata in [json!({"n": 1}), json!(["a"]), Value::Object(many)] {
        let (status, _, body) = submit_with(
            &server,
            json!({"workflow": text_workflow("x"), "metadata": metadata}),
            None,
        );
        assert_eq!(status, 422);
        assert_envelope(&body, "metadata_invalid");
    }
}

#[test]
fn list_rejects_an_unknown_cursor_with_invalid_cursor() {
    let server = Server::start();
    for cursor in ["garbage", "c999999"] {
        let (status, _, body) = send(server.request(reqwest::Method::GET, &format!("/api/v2/jobs?cursor={cursor}")));
        assert!((400..500).contains(&status));
        assert_envelope(&body, "invalid_cursor");
    }
}

// ---------------------------------------------------------------- queue

#[test]
fn queue_full_is_429_with_an_integer_retry_after() {
    let (server, _p) = support::slow_server(&["--workers", "1", "--queue-depth", "2"]);
    let running = server.submit(slow_workflow(300.0));
    wait_status(&server, running["id"].as_str().unwrap(), "running");
    server.submit(slow_workflow(300.0));
    server.submit(slow_workflow(300.0));
    let (status, headers, body) = submit_with(&server, json!({"workflow": slow_workflow(1.0)}), None);
    assert_eq!(status, 429);
    assert_envelope(&body, "queue_full");
    assert!(headers["retry-after"].to_str().unwrap().parse::<u64>().is_ok());
}

#[test]
fn queue_position_is_true_for_queued_jobs() {
    let (server, _p) = support::slow_server(&["--workers", "1"]);
    let running = server.submit(slow_workflow(300.0));
    let rid = running["id"].as_str().unwrap().to_string();
    wait_status(&server, &rid, "running");
    assert!(job(&server, &rid)["queue_position"].is_null());
    let ids: Vec<String> = (0..4)
        .map(|_| server.submit(slow_workflow(300.0))["id"].as_str().unwrap().to_string())
        .collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(job(&server, id)["queue_position"], i, "position of job {i}");
    }
    cancel(&server, &ids[1]);
    assert_eq!(job(&server, &ids[2])["queue_position"], 1);
    assert_eq!(job(&server, &ids[3])["queue_position"], 2);
    for id in ids.iter().chain([&rid]) {
        cancel(&server, id);
    }
}

#[test]
fn scheduling_is_fair_across_tenants() {
    let plugins = support::plugins_with(&["weft_test_counter"]);
    let dir = tempfile::tempdir().unwrap();
    let key_a = support::new_key(dir.path(), "a");
    let key_b = support::new_key(dir.path(), "b");
    let server = Server::with(Options {
        args: vec!["--auth".into(), "keys".into(), "--workers".into(), "1".into()],
        data_dir: Some(dir.path().to_path_buf()),
        plugins_dir: Some(plugins.path().to_path_buf()),
        token: Some(key_a.clone()),
        ..Default::default()
    });
    let blocker = server.submit(slow_workflow(300.0));
    wait_status(&server, blocker["id"].as_str().unwrap(), "running");
    let a_jobs: Vec<String> = (0..10)
        .map(|_| server.submit(slow_workflow(0.05))["id"].as_str().unwrap().to_string())
        .collect();
    server.set_token(Some(&key_b));
    let b_job = server.submit(slow_workflow(0.05))["id"].as_str().unwrap().to_string();
    let b_pos = job(&server, &b_job)["queue_position"].as_u64().unwrap();
    assert!(b_pos <= 1, "tenant B waits behind A's burst: position {b_pos}");
    server.set_token(Some(&key_a));
    assert_eq!(job(&server, &a_jobs[9])["queue_position"], 10);
    cancel(&server, blocker["id"].as_str().unwrap());
    let a10 = server.wait(&a_jobs[9]);
    server.set_token(Some(&key_b));
    let b = server.wait(&b_job);
    let started = |j: &Value| chrono_like(j["started_at"].as_str().unwrap());
    assert!(started(&b) < started(&a10), "B started after A's 10th job");
}

fn chrono_like(s: &str) -> String {
    // RFC 3339 UTC timestamps of one format compare as text.
    s.to_string()
}

// ---------------------------------------------------------------- links

#[test]
fn urls_are_host_relative() {
    let server = Server::start();
    let job = server.submit(text_workflow("x"));
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["urls"]["self"], format!("/api/v2/jobs/{id}"));
    assert_eq!(job["urls"]["events"], format!("/api/v2/jobs/{id}/events"));
    assert_eq!(job["urls"]["cancel"], format!("/api/v2/jobs/{id}/cancel"));
}

#[test]
fn mount_prefix_serves_everything_under_it_and_links_carry_it() {
    let server = server_with(&["--mount-prefix", "/deployment/abc"]);
    let (status, _, _) = send(server.request(reqwest::Method::GET, "/api/v2/jobs"));
    assert_eq!(status, 404);
    let r = server.post("/deployment/abc/api/v2/jobs", &json!({"workflow": text_workflow("p")}));
    assert_eq!(r.status().as_u16(), 201);
    let job: Value = r.json().unwrap();
    let id = job["id"].as_str().unwrap();
    assert_eq!(job["urls"]["self"], format!("/deployment/abc/api/v2/jobs/{id}"));
    let mut done = Value::Null;
    for _ in 0..5000 {
        done = server.get(job["urls"]["self"].as_str().unwrap()).json().unwrap();
        if done["status"] == "succeeded" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(done["status"], "succeeded");
    let url = done["outputs"][0]["url"].as_str().unwrap();
    // Content links are absolute (`uri`), resolved against the request's origin.
    assert!(
        url.starts_with(&format!("{}/deployment/abc/api/v2/assets/", server.base)),
        "{url}"
    );
    assert_eq!(server.download(url), b"p");
    let (status, _, _) = send(server.request(reqwest::Method::GET, "/deployment/abc/api/v2/openapi.json"));
    assert_eq!(status, 200);
}

#[test]
fn output_urls_are_signed_expiring_and_work_without_credentials() {
    let server = Server::with(Options {
        args: vec!["--auth".into(), "token".into(), "--token".into(), "T0K".into()],
        token: Some("T0K".into()),
        ..Default::default()
    });
    let done = server.run(text_workflow("signed"));
    let output = &done["outputs"][0];
    let url = output["url"].as_str().unwrap();
    assert!(url.contains("sig=") && url.contains("expires="), "{url}");
    assert!(output["url_expires_at"].is_string());
    for field in [
        "node_id",
        "name",
        "type",
        "content_type",
        "size_bytes",
        "id",
        "hash",
        "url",
        "url_expires_at",
    ] {
        assert!(output.get(field).is_some(), "output lacks {field}");
    }
    // No credentials needed for a signed link.
    let r = server.http.get(server.url(url)).send().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.bytes().unwrap().as_ref(), b"signed");
    // Tampered signature refused.
    let (base, query) = url.split_once('?').unwrap();
    let tampered: String = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some(("sig", s)) => format!("sig={}", s.chars().rev().collect::<String>()),
            _ => p.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&");
    let r = server
        .http
        .get(server.url(&format!("{base}?{tampered}")))
        .send()
        .unwrap();
    assert!(matches!(r.status().as_u16(), 401 | 403 | 404), "{}", r.status());
    // A link that was signed with the server's own key but has expired is refused. It is
    // signed here as the server signs (keyed blake3 of `asset:expires` with the data dir's
    // link key), so only the expiry check can refuse it.
    let asset = output["id"].as_str().unwrap();
    // On PostgreSQL the key is shared by every process, in the shared blob dir.
    let key_dir = match support::on_postgres() {
        true => server.data_dir.join("blobs"),
        false => server.data_dir.clone(),
    };
    let key: [u8; 32] = std::fs::read(key_dir.join("link.key")).unwrap().try_into().unwrap();
    let sign =
        |expires: i64| blake3::keyed_hash(&key, format!("{asset}:{expires}").as_bytes()).to_hex()[..32].to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let fresh = server
        .http
        .get(server.url(&format!("{base}?expires={}&sig={}", now + 60, sign(now + 60))));
    assert_eq!(
        fresh.send().unwrap().status().as_u16(),
        200,
        "the test signs links as the server does"
    );
    let expired = format!("expires={}&sig={}", now - 60, sign(now - 60));
    let r = server
        .http
        .get(server.url(&format!("{base}?{expired}")))
        .send()
        .unwrap();
    assert!(matches!(r.status().as_u16(), 401 | 403 | 404), "{}", r.status());
    let body: Value = r.json().unwrap();
    assert!(body["error"]["code"].is_string());
}

// ---------------------------------------------------------------- surfaces

#[test]
fn logs_only_on_serverless_and_only_on_get() {
    let server = server_with(&["--surface", "serverless", "--initial-credits", "100"]);
    let (status, _, job) = submit_with(&server, json!({"workflow": text_workflow("x")}), None);
    assert_eq!(status, 201);
    assert!(job.get("logs").is_none(), "logs on POST");
    let id = job["id"].as_str().unwrap();
    let done = server.wait(id);
    let logs = done
        .get("logs")
        .unwrap_or_else(|| panic!("no logs after terminal: {}", short(&done)));
    assert!(logs["text"].is_string() && logs["truncated"].is_boolean() && logs["captured_at"].is_string());
    assert!(cancel(&server, id).get("logs").is_none(), "logs on cancel");
    // Failed jobs carry logs too.
    let asset = server.upload("bad.png", b"not a png".to_vec());
    let failed = server.run(asset_workflow(asset["id"].as_str().unwrap()));
    assert_eq!(failed["status"], "failed");
    assert!(failed.get("logs").is_some(), "failed job without logs");
}

#[test]
fn credits_are_drawn_down_and_402_when_out() {
    let server = server_with(&["--surface", "serverless", "--initial-credits", "2", "--job-cost", "1"]);
    server.submit(text_workflow("1"));
    server.submit(text_workflow("2"));
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("3")}), None);
    assert_eq!(status, 402);
    assert_envelope(&body, "insufficient_credits");
    let self_hosted = Server::start();
    for i in 0..3 {
        self_hosted.submit(text_workflow(&i.to_string()));
    }
}

#[test]
fn concurrent_submissions_never_spend_more_credits_than_the_tenant_has() {
    let server = server_with(&["--surface", "serverless", "--initial-credits", "3", "--job-cost", "1"]);
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let submits: Vec<_> = (0..16)
            .map(|i| {
                let server = &server;
                scope.spawn(move || submit_with(server, json!({"workflow": text_workflow(&format!("c{i}"))}), None).0)
            })
            .collect();
        submits.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 402).count(), 13, "{statuses:?}");
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("after")}), None);
    assert_eq!(status, 402);
    assert_envelope(&body, "insufficient_credits");
}

#[test]
fn deployment_stopped_after_an_operator_drain() {
    let server = server_with(&[
        "--surface",
        "serverless",
        "--initial-credits",
        "10",
        "--admin-token",
        "ADMIN",
    ]);
    server.submit(text_workflow("before"));
    let (status, _, body) = send(server.request(reqwest::Method::POST, "/api/v2/admin/drain"));
    assert_eq!(status, 401);
    assert_envelope(&body, "unauthorized");
    let r = server
        .http
        .post(server.url("/api/v2/admin/drain"))
        .bearer_auth("ADMIN")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (status, _, body) = submit_with(&server, json!({"workflow": text_workflow("after")}), None);
    assert_eq!(status, 422);
    assert_envelope(&body, "deployment_stopped");
}

#[test]
fn deployment_not_ready_while_plugins_load() {
    // Start the binary ourselves and submit the moment it listens: plugins compile on a fresh
    // data dir, so the job API is usually not ready yet. Either answer is legal; a not-ready
    // answer must be the 429 envelope with Retry-After, and healthz agrees with it.
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(support::weft_bin())
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--surface",
            "serverless",
            "--initial-credits",
            "5",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("WEFT_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let base = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some(rest) = line.strip_prefix("weft listening on ") {
            break rest.trim().to_string();
        }
    };
    let http = reqwest::blocking::Client::new();
    let r = http
        .post(format!("{base}/api/v2/jobs"))
        .json(&json!({"workflow": text_workflow("x")}))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    let body: Value = r.json().unwrap();
    if status == 429 {
        assert_envelope(&body, "deployment_not_ready");
        assert!(retry.unwrap().parse::<u64>().is_ok());
    } else {
        assert_eq!(status, 201, "{}", short(&body));
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn public_demo_accepts_callers_without_credentials_and_withholds_logs() {
    let server = Server::with(Options {
        args: [
            "--surface",
            "serverless",
            "--initial-credits",
            "10",
            "--public-demo",
            "--auth",
            "token",
            "--token",
            "T",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Default::default()
    });
    let done = server.run(text_workflow("demo"));
    assert_eq!(done["status"], "succeeded");
    assert!(done.get("logs").is_none(), "public demo returned logs");
    let (status, _, _) = send(server.http.get(server.url("/api/v2/jobs")).bearer_auth("wrong"));
    assert_eq!(status, 401);
}

// ---------------------------------------------------------------- auth

#[test]
fn static_token_auth_gives_401_unauthorized_without_the_token() {
    let server = server_with(&["--auth", "token", "--token", "s3cret"]);
    for token in [None, Some("wrong")] {
        server.set_token(token);
        for (method, path) in [
            (reqwest::Method::GET, "/api/v2/jobs"),
            (reqwest::Method::POST, "/api/v2/jobs"),
        ] {
            let (status, _, body) = send(
                server
                    .request(method, path)
                    .json(&json!({"workflow": text_workflow("x")})),
            );
            assert_eq!(status, 401);
            assert_envelope(&body, "unauthorized");
        }
    }
    server.set_token(Some("s3cret"));
    assert_eq!(server.get("/api/v2/jobs").status().as_u16(), 200);
}

#[test]
fn api_keys_scope_every_resource_to_its_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let key_a = support::new_key(dir.path(), "alpha");
    let key_b = support::new_key(dir.path(), "beta");
    assert!(key_a != key_b);
    let server = Server::with(Options {
        args: vec!["--auth".into(), "keys".into(), "--admin-token".into(), "ADM".into()],
        data_dir: Some(dir.path().to_path_buf()),
        token: Some(key_a.clone()),
        ..Default::default()
    });
    let asset = server.upload("a.txt", b"tenant a".to_vec());
    let aid = asset["id"].as_str().unwrap().to_string();
    let job = server.run(text_workflow("a"));
    let jid = job["id"].as_str().unwrap().to_string();
    server.set_token(Some(&key_b));
    for path in [
        format!("/api/v2/jobs/{jid}"),
        format!("/api/v2/jobs/{jid}/workflow"),
        format!("/api/v2/jobs/{jid}/events"),
        format!("/api/v2/assets/{aid}"),
        format!("/api/v2/assets/{aid}/content"),
    ] {
        let (status, _, body) = send(server.request(reqwest::Method::GET, &path));
        assert_eq!(status, 404, "{path}");
        assert_envelope(&body, "not_found");
    }
    let (status, _, _) = send(server.request(reqwest::Method::POST, &format!("/api/v2/jobs/{jid}/cancel")));
    assert_eq!(status, 404);
    let (status, _, _) = send(server.request(reqwest::Method::DELETE, &format!("/api/v2/assets/{aid}")));
    assert_eq!(status, 404);
    let list: Value = server.get("/api/v2/jobs").json().unwrap();
    assert_eq!(list["jobs"].as_array().unwrap().len(), 0);
    let (status, _, body) = submit_with(&server, json!({"workflow": asset_workflow(&aid)}), None);
    assert_eq!(status, 422);
    assert_envelope(&body, "missing_asset");
    // Authenticated but not allowed: a tenant key on the operator route.
    let (status, _, body) = send(server.request(reqwest::Method::POST, "/api/v2/admin/drain"));
    assert_eq!(status, 403);
    assert_envelope(&body, "forbidden");
    // Unknown key.
    server.set_token(Some("weft_not_a_key"));
    let (status, _, body) = send(server.request(reqwest::Method::GET, "/api/v2/jobs"));
    assert_eq!(status, 401);
    assert_envelope(&body, "unauthorized");
    // Keys are stored hashed.
    let db = db_bytes(dir.path());
    assert!(
        !contains(&db, &key_a) && !contains(&db, &key_b),
        "an API key is stored in clear"
    );
}

#[test]
fn non_loopback_without_auth_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(support::weft_bin())
        .args(["serve", "--addr", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("allow-unauthenticated"));
    let server = server_with(&["--addr", "0.0.0.0:0", "--allow-unauthenticated"]);
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
}

// ---------------------------------------------------------------- errors, operator, config

#[test]
fn upstream_error_messages_are_generic() {
    let server = Server::start();
    let asset = server.upload("gone.txt", b"soon gone".to_vec());
    let id = asset["id"].as_str().unwrap();
    // Break the backing storage under the server: remove every blob file.
    let blobs = server.data_dir.join("blobs");
    remove_files(&blobs);
    let (status, _, body) = send(server.request(reqwest::Method::GET, &format!("/api/v2/assets/{id}/content")));
    assert_eq!(status, 500, "{}", short(&body));
    assert_envelope(&body, "upstream_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        !message.contains('/') && !message.contains("blob") && !message.contains("os error"),
        "{message}"
    );
    assert!(body["error"]["details"].is_null());
}

fn remove_files(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            remove_files(&p);
        } else {
            std::fs::remove_file(&p).unwrap();
        }
    }
}

#[test]
fn operator_routes_answer() {
    let server = Server::start();
    let health: Value = server.get("/healthz").json().unwrap();
    assert_eq!(health["status"], "ok");
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    assert!(nodes["SaveText"]["input"]["required"].is_object());
    server.run(text_workflow("m"));
    let metrics = server.get("/metrics").text().unwrap();
    for name in [
        "weft_queue_depth",
        "weft_jobs{status=\"succeeded\"} 1",
        "weft_sse_streams",
        "_bucket{",
    ] {
        assert!(metrics.contains(name), "metrics lack {name}");
    }
    assert!(
        metrics.contains("weft_node") || metrics.contains("node"),
        "no node latency metric"
    );
}

#[test]
fn openapi_document_matches_the_router() {
    let server = Server::start();
    let doc: Value = server.get("/api/v2/openapi.json").json().unwrap();
    let paths = doc["paths"].as_object().unwrap();
    let id = "00000000-0000-4000-8000-000000000000";
    for (method, path, _, _) in weft::api::openapi::ROUTES {
        assert!(
            paths.get(*path).and_then(|p| p.get(*method)).is_some(),
            "{method} {path} not in the document"
        );
        let concrete = path.replace("{id}", id).replace("{hash}", "blake3:00");
        let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let r = server.request(m, &concrete).send().unwrap();
        let status = r.status().as_u16();
        let text = r.text().unwrap_or_default();
        // A 404 must be a resource miss, not a missing route.
        assert!(status != 405, "{method} {path}: 405");
        assert!(
            status != 404 || !text.contains("route not found"),
            "{method} {path}: no route"
        );
    }
    for used in [
        "/api/v2/jobs",
        "/api/v2/jobs/{id}",
        "/api/v2/jobs/{id}/workflow",
        "/api/v2/jobs/{id}/cancel",
        "/api/v2/jobs/{id}/events",
        "/api/v2/assets",
        "/api/v2/assets/from-hash",
        "/api/v2/assets/by-hash/{hash}",
        "/api/v2/assets/{id}",
        "/api/v2/assets/{id}/content",
    ] {
        assert!(paths.contains_key(used), "{used} missing from the document");
    }
}

#[test]
fn config_comes_from_env_and_toml_and_flags_override() {
    let capacity = |server: &Server| -> String {
        let text = server.get("/metrics").text().unwrap();
        text.lines()
            .find(|l| l.starts_with("weft_queue_capacity "))
            .unwrap()
            .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("weft.toml");
    std::fs::write(&file, "queue-depth = 1\nworkers = 1\n").unwrap();
    let server = server_with(&["--config", file.to_str().unwrap()]);
    assert_eq!(capacity(&server), "weft_queue_capacity 1");
    let server = server_with(&["--config", file.to_str().unwrap(), "--queue-depth", "5"]);
    assert_eq!(capacity(&server), "weft_queue_capacity 5");
    // SAFETY-free in edition 2021; nextest runs each test in its own process.
    std::env::set_var("WEFT_QUEUE_DEPTH", "3");
    let server = Server::start();
    assert_eq!(capacity(&server), "weft_queue_capacity 3");
    let server = server_with(&["--queue-depth", "4"]);
    assert_eq!(capacity(&server), "weft_queue_capacity 4");
    // Env beats the file.
    let server = server_with(&["--config", file.to_str().unwrap()]);
    assert_eq!(capacity(&server), "weft_queue_capacity 3");
    std::env::remove_var("WEFT_QUEUE_DEPTH");
}

#[test]
fn metrics_not_yet_available_are_null_then_integers() {
    let (server, _p) = support::slow_server(&["--workers", "1"]);
    let busy = server.submit(slow_workflow(30.0));
    let waiting = server.submit(slow_workflow(0.0));
    let id = waiting["id"].as_str().unwrap();
    let queued: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
    assert_eq!(queued["status"], "queued", "{}", short(&queued));
    assert!(queued["metrics"]["queue_ms"].is_null(), "{}", short(&queued));
    assert!(queued["metrics"]["execution_ms"].is_null(), "{}", short(&queued));
    server.post(
        &format!("/api/v2/jobs/{}/cancel", busy["id"].as_str().unwrap()),
        &json!({}),
    );
    let done = server.wait(id);
    assert_eq!(done["status"], "succeeded", "{}", short(&done));
    assert!(done["metrics"]["queue_ms"].is_u64(), "{}", short(&done));
    assert!(done["metrics"]["execution_ms"].is_u64(), "{}", short(&done));
}

#[test]
fn outputs_fill_incrementally_during_execution() {
    // Node 2's output is committed while node 3 still counts (for an hour, so the job is
    // still running whenever the poll below sees it); the job is then canceled.
    let (server, _plugins) = support::slow_server(&["--workers", "2"]);
    let submitted = server.submit(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "early"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "early"}},
        "3": {"class_type": "SlowCounter", "inputs": {"seconds": 3600.0}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}}
    }));
    let id = submitted["id"].as_str().unwrap().to_string();
    let mut seen = Value::Null;
    for _ in 0..6000 {
        seen = job(&server, &id);
        if !seen["outputs"].as_array().unwrap().is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(seen["status"], "running", "{seen}");
    let outputs = seen["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{seen}");
    assert_eq!(outputs[0]["node_id"], "2");
    cancel(&server, &id);
    let done = wait_status(&server, &id, "canceled");
    assert_eq!(
        done["outputs"].as_array().unwrap().len(),
        1,
        "a committed output stays: {done}"
    );
}

/// Reads one HTTP response with a `Content-Length` body from `tcp`; returns its head and body.
fn read_response(tcp: &mut TcpStream) -> (String, String) {
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    tcp.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    loop {
        let text = String::from_utf8_lossy(&response).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = text[..end].to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if response.len() >= end + 4 + length {
                return (text[..end].to_string(), text[end + 4..end + 4 + length].to_string());
            }
        }
        let n = tcp.read(&mut buf).expect("the connection stays open for the response");
        assert!(
            n > 0,
            "the server closed the connection: {}",
            String::from_utf8_lossy(&response)
        );
        response.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn a_cancel_whose_body_arrives_after_its_headers_keeps_the_connection_alive() {
    let (server, _plugins) = support::slow_server(&[]);
    let job = server.submit(slow_workflow(300.0));
    let id = job["id"].as_str().unwrap();
    let addr = server.base.strip_prefix("http://").unwrap().to_string();
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_nodelay(true).unwrap();
    // As Python's http.client sends it: the head, then the body in a packet of its own.
    write!(
        tcp,
        "POST /api/v2/jobs/{id}/cancel HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    )
    .unwrap();
    tcp.flush().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    tcp.write_all(b"{}").unwrap();
    let (head, body) = read_response(&mut tcp);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains("cancel"), "{body}");
    // The same connection serves the next request.
    write!(tcp, "GET /api/v2/jobs/{id} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (head, _) = read_response(&mut tcp);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[test]
fn a_cancel_with_a_large_body_is_refused() {
    let (server, _plugins) = support::slow_server(&[]);
    let job = server.submit(slow_workflow(300.0));
    let big = json!({"padding": "x".repeat(100_000)});
    let r = server.post(&format!("/api/v2/jobs/{}/cancel", job["id"].as_str().unwrap()), &big);
    assert_eq!(r.status(), 413);
    cancel(&server, job["id"].as_str().unwrap());
}
