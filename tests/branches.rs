//! Independent branches of a graph run at the same time, up to `--workers` node calls: the
//! proofs are by behaviour, never by timing. The slow branches are `SlowCounter` nodes
//! counting for an hour, which never check for cancellation: a second one can only start
//! while the first runs if the branches run side by side, and a job holding one ends only
//! if the host interrupts it. What the server runs is watched on ComfyUI's `/ws`
//! (`executing` names each node as it starts) and in `/metrics` (node calls by class).

mod support;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{plugins_with, Options, Server};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// A server with the counter and panic test plugins, `workers` workers and a long node
/// time limit; keep the returned directory alive as long as the server.
fn server(workers: u32) -> (Server, tempfile::TempDir) {
    let plugins = plugins_with(&["weft_test_counter", "weft_test_panic"]);
    let server = Server::with(Options {
        args: vec![
            "--workers".into(),
            workers.to_string(),
            "--node-timeout-ms".into(),
            "3600000".into(),
        ],
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    (server, plugins)
}

/// A `/ws` connection, which hears about every job of the tenant.
struct Socket(WebSocket<MaybeTlsStream<TcpStream>>);

impl Socket {
    fn open(server: &Server) -> Socket {
        let url = format!("{}/ws?clientId=branches", server.base.replacen("http://", "ws://", 1));
        let (ws, _) = tungstenite::connect(url).expect("connecting to /ws");
        if let MaybeTlsStream::Plain(stream) = ws.get_ref() {
            stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        }
        Socket(ws)
    }

    /// Text messages until one for which `done` holds (included), within 240 s.
    fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match self.0.read() {
                Ok(Message::Text(text)) => {
                    let message: Value = serde_json::from_str(&text).unwrap();
                    let stop = done(&message);
                    seen.push(message);
                    if stop {
                        return seen;
                    }
                }
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading /ws: {e}"),
            }
        }
        panic!("the awaited message never came; saw {seen:?}");
    }

    /// Waits until every node of `nodes` has started (an `executing` message names it).
    fn until_started(&mut self, nodes: &[&str]) -> Vec<Value> {
        let mut seen = Vec::new();
        let mut missing: Vec<&str> = nodes.to_vec();
        while !missing.is_empty() {
            let got = self.until(|m| m["type"] == "executing" && missing.iter().any(|n| m["data"]["node"] == *n));
            let node = got.last().unwrap()["data"]["node"].as_str().unwrap().to_string();
            missing.retain(|n| *n != node);
            seen.extend(got);
        }
        seen
    }
}

/// Two branches that each count for an hour, then preview the count.
fn two_slow_branches() -> Value {
    json!({
        "a1": {"class_type": "SlowCounter", "inputs": {"seconds": 3600.0}},
        "a2": {"class_type": "PreviewAny", "inputs": {"source": ["a1", 0]}},
        "b1": {"class_type": "SlowCounter", "inputs": {"seconds": 3600.0}},
        "b2": {"class_type": "PreviewAny", "inputs": {"source": ["b1", 0]}}
    })
}

fn cancel(server: &Server, id: &str) {
    let r = server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert!(r.status().is_success(), "cancel refused: {}", r.status());
}

/// How many calls of node class `class` the server has finished, by its metrics.
fn calls_of(server: &Server, class: &str) -> u64 {
    let text = server.get("/metrics").text().unwrap();
    let prefix = format!("weft_node_duration_seconds_count{{class=\"{class}\"");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// After the branches' job, both permits are free again: a 2-branch job runs to its end.
fn assert_both_workers_free(server: &Server) {
    let job = server.run(json!({
        "a": {"class_type": "PrimitiveString", "inputs": {"value": "a"}},
        "b": {"class_type": "PrimitiveString", "inputs": {"value": "b"}},
        "sa": {"class_type": "SaveText", "inputs": {"text": ["a", 0], "filename_prefix": "a"}},
        "sb": {"class_type": "SaveText", "inputs": {"text": ["b", 0], "filename_prefix": "b"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
}

#[test]
fn independent_branches_run_at_the_same_time() {
    let (server, _p) = server(2);
    let mut ws = Socket::open(&server);
    let job = server.submit(two_slow_branches());
    let id = job["id"].as_str().unwrap().to_string();
    // Each counter runs for an hour: the second starts only beside the first.
    let seen = ws.until_started(&["a1", "b1"]);
    assert!(
        !seen
            .iter()
            .any(|m| m["type"] == "executed" || m["type"] == "execution_error"),
        "a node finished first: {seen:?}"
    );
    let running: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
    assert_eq!(running["status"], "running", "{running}");
    assert_eq!(running["progress"]["nodes_total"], 4, "{running}");
    assert_eq!(running["progress"]["nodes_done"], 0, "{running}");
    // The current node is the one that started last.
    let last = seen.iter().rev().find(|m| m["type"] == "executing").unwrap()["data"]["node"].clone();
    assert_eq!(running["progress"]["current_node"], last, "{running}");
    cancel(&server, &id);
    assert_eq!(server.wait(&id)["status"], "canceled");
}

#[test]
fn cancel_stops_every_branch() {
    let (server, _p) = server(2);
    let mut ws = Socket::open(&server);
    let job = server.submit(two_slow_branches());
    let id = job["id"].as_str().unwrap().to_string();
    ws.until_started(&["a1", "b1"]);
    cancel(&server, &id);
    // Neither counter ever checks: the job ends only once both calls were interrupted.
    let done = server.wait(&id);
    assert_eq!(done["status"], "canceled", "{done}");
    assert_eq!(done["outputs"], json!([]), "{done}");
    assert_eq!(calls_of(&server, "SlowCounter"), 2);
    assert_both_workers_free(&server);
}

#[test]
fn a_failing_branch_fails_the_job_and_stops_the_other() {
    let (server, _p) = server(2);
    let mut ws = Socket::open(&server);
    let job = server.submit(json!({
        "a1": {"class_type": "SlowCounter", "inputs": {"seconds": 3600.0}},
        "a2": {"class_type": "PreviewAny", "inputs": {"source": ["a1", 0]}},
        "b1": {"class_type": "HostilePanic", "inputs": {}},
        "b2": {"class_type": "PreviewAny", "inputs": {"source": ["b1", 0]}}
    }));
    let id = job["id"].as_str().unwrap().to_string();
    ws.until_started(&["a1", "b1"]);
    // The counter runs for an hour and never checks: the job ends only if it is stopped.
    let done = server.wait(&id);
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(
        done["error"]["node_id"], "b1",
        "the failing node's error is the job's: {done}"
    );
    assert_eq!(done["error"]["class_type"], "HostilePanic", "{done}");
    assert_eq!(done["outputs"], json!([]), "{done}");
    assert_eq!(calls_of(&server, "SlowCounter"), 1);
    assert_both_workers_free(&server);
}

#[test]
fn outputs_commit_in_node_order_when_a_later_branch_finishes_first() {
    let (server, _p) = server(2);
    let mut ws = Socket::open(&server);
    // Plan order: a1, a2, b1, b2. Branch b is done long before a1's hour is up, and its
    // output must wait for a2's, which never comes: the job is canceled with nothing.
    let later_first = json!({
        "a1": {"class_type": "SlowCounter", "inputs": {"seconds": 3600.0}},
        "a2": {"class_type": "PreviewAny", "inputs": {"source": ["a1", 0]}},
        "b1": {"class_type": "PrimitiveString", "inputs": {"value": "b"}},
        "b2": {"class_type": "SaveText", "inputs": {"text": ["b1", 0], "filename_prefix": "b"}}
    });
    let job = server.submit(later_first);
    let id = job["id"].as_str().unwrap().to_string();
    ws.until_started(&["a1", "b2"]);
    let deadline = Instant::now() + Duration::from_secs(240);
    while calls_of(&server, "SaveText") < 1 {
        assert!(Instant::now() < deadline, "b2's call never returned");
        std::thread::sleep(Duration::from_millis(20));
    }
    let waiting: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
    assert_eq!(waiting["status"], "running", "{waiting}");
    assert_eq!(
        waiting["outputs"],
        json!([]),
        "b2's output went ahead of a2's: {waiting}"
    );
    cancel(&server, &id);
    let done = server.wait(&id);
    assert_eq!(done["status"], "canceled", "{done}");
    assert_eq!(done["outputs"], json!([]), "{done}");
    // With a branch a that ends, both commit, numbered in node order.
    let job = server.run(json!({
        "a1": {"class_type": "SlowCounter", "inputs": {"seconds": 0.5}},
        "a2": {"class_type": "PreviewAny", "inputs": {"source": ["a1", 0]}},
        "b1": {"class_type": "PrimitiveString", "inputs": {"value": "b"}},
        "b2": {"class_type": "SaveText", "inputs": {"text": ["b1", 0], "filename_prefix": "b"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let nodes: Vec<&str> = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["node_id"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["a2", "b2"], "{job}");
}
