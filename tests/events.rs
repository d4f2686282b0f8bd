//! Black-box tests of the job event stream (SSE): snapshot on connect, live events with ids,
//! resume with Last-Event-ID, the end after the terminal status, the stream cap, keep-alive.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::sse::Sse;
use support::{plugins_with, slow_workflow, Options, Server};

fn wait_running_with_progress(server: &Server, id: &str) {
    for _ in 0..6000 {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if job["status"] == "running" && !job["progress"].is_null() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("job {id} never showed progress");
}

fn cancel(server: &Server, id: &str) -> Value {
    server
        .post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}))
        .json()
        .unwrap()
}

#[test]
fn snapshot_on_connect_carries_status_and_latest_progress() {
    let (server, _p) = support::slow_server(&[]);
    let job = server.submit(slow_workflow(300.0));
    let id = job["id"].as_str().unwrap();
    wait_running_with_progress(&server, id);
    let mut sse = Sse::open(&server, id, None);
    let status = sse.next_event().unwrap();
    assert_eq!(status.event, "status");
    assert_eq!(status.data["status"], "running");
    assert!(status.data.get("queue_position").is_some());
    assert!(status.data.get("logs").is_none());
    let progress = sse.next_event().unwrap();
    assert_eq!(progress.event, "progress");
    let value = progress.data["value"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&value));
    assert!(progress.data["nodes_total"].as_u64().unwrap() >= 1);
    assert!(progress.data.get("nodes_done").is_some());
    cancel(&server, id);
}

#[test]
fn every_transition_is_a_status_event_and_the_stream_ends_after_the_terminal_one() {
    let (server, _p) = support::slow_server(&["--workers", "1"]);
    let blocker = server.submit(slow_workflow(300.0));
    let bid = blocker["id"].as_str().unwrap().to_string();
    wait_running_with_progress(&server, &bid);
    let job = server.submit(slow_workflow(0.3));
    let id = job["id"].as_str().unwrap().to_string();
    let mut queued = Sse::open(&server, &id, None);
    let first = queued.next_event().unwrap();
    assert_eq!(first.event, "status");
    assert_eq!(first.data["status"], "queued");
    assert_eq!(first.data["queue_position"], 0);
    let mut running = Sse::open(&server, &bid, None);
    assert_eq!(running.next_event().unwrap().data["status"], "running");
    // running -> canceling -> canceled on the blocker's stream.
    cancel(&server, &bid);
    let frames = running.rest();
    let statuses: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "status")
        .map(|f| f.data["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(statuses, ["canceling", "canceled"]);
    assert_eq!(frames.last().unwrap().event, "status");
    // queued -> running -> succeeded on the other's, with progress and output events, ids rising.
    let frames = queued.rest();
    let statuses: Vec<_> = frames
        .iter()
        .filter(|f| f.event == "status")
        .map(|f| f.data["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(statuses, ["running", "succeeded"]);
    assert!(frames.iter().any(|f| f.event == "progress"));
    let at = frames
        .iter()
        .position(|f| f.event == "output")
        .expect("no output event");
    let output = &frames[at];
    assert_eq!(output.data["node_id"], "2");
    assert!(
        frames[at..]
            .iter()
            .any(|f| f.event == "status" && f.data["status"] == "succeeded"),
        "the output is told before the success it is part of: {frames:?}"
    );
    assert!(output.data["url"].is_string());
    let last = frames.last().unwrap();
    assert_eq!(
        (last.event.as_str(), last.data["status"].as_str()),
        ("status", Some("succeeded"))
    );
    assert!(last.data.get("logs").is_none());
    let ids: Vec<u64> = frames.iter().map(|f| f.id.expect("event without id")).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids not rising: {ids:?}");
    // A stream opened on a terminal job: the snapshot, then the end.
    let frames = Sse::open(&server, &id, None).rest();
    assert_eq!(frames[0].event, "status");
    assert_eq!(frames[0].data["status"], "succeeded");
    assert!(frames.iter().skip(1).all(|f| f.event == "progress"), "{frames:?}");
}

#[test]
fn last_event_id_resumes_after_that_event() {
    let (server, _p) = support::slow_server(&[]);
    let job = server.submit(slow_workflow(300.0));
    let id = job["id"].as_str().unwrap().to_string();
    wait_running_with_progress(&server, &id);
    let mut sse = Sse::open(&server, &id, None);
    let mut last = 0;
    for _ in 0..4 {
        let f = sse.next_event().unwrap();
        last = f.id.expect("event without id");
    }
    drop(sse);
    let mut resumed = Sse::open(&server, &id, Some(last));
    for _ in 0..3 {
        let f = resumed.next_event().unwrap();
        let fid = f.id.unwrap();
        assert!(
            fid > last || (fid == last && f.event == "status"),
            "event {fid} replayed after {last}"
        );
    }
    cancel(&server, &id);
    let frames = resumed.rest();
    assert_eq!(frames.last().unwrap().data["status"], "canceled");
}

#[test]
fn max_streams_gives_429_too_many_streams() {
    let (server, _p) = support::slow_server(&["--max-streams", "1"]);
    let job = server.submit(slow_workflow(300.0));
    let id = job["id"].as_str().unwrap().to_string();
    let mut open = Sse::open(&server, &id, None);
    assert_eq!(open.next_event().unwrap().event, "status");
    let r = server.get(&format!("/api/v2/jobs/{id}/events"));
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers()["retry-after"].to_str().unwrap().parse::<u64>().is_ok());
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams");
    let metrics = server.get("/metrics").text().unwrap();
    assert!(
        metrics.contains("weft_sse_streams 1"),
        "metrics do not count the open stream"
    );
    drop(open);
    cancel(&server, &id);
}

#[test]
fn an_idle_stream_gets_a_keep_alive_comment() {
    // The interval is 15 s; a queued job behind a blocker emits nothing, so the next frame
    // after the snapshot must be the keep-alive comment.
    let (server, _p) = support::slow_server(&["--workers", "1"]);
    let blocker = server.submit(slow_workflow(300.0));
    let bid = blocker["id"].as_str().unwrap().to_string();
    wait_running_with_progress(&server, &bid);
    let job = server.submit(slow_workflow(1.0));
    let id = job["id"].as_str().unwrap().to_string();
    let mut sse = Sse::open(&server, &id, None);
    assert_eq!(sse.next_event().unwrap().event, "status");
    let frame = sse.next_frame().unwrap();
    assert!(frame.comment.is_some(), "expected a comment, got {frame:?}");
    cancel(&server, &id);
    cancel(&server, &bid);
}

#[test]
fn what_a_node_writes_to_stdout_reaches_the_stream_as_a_log_event() {
    let plugins = plugins_with(&["weft_test_counter", "weft_test_stdout_flood"]);
    let server = Server::with(Options {
        args: vec!["--workers".into(), "1".into()],
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    // The only worker is busy, so the stream below opens while the job still waits.
    let blocker = server.submit(slow_workflow(300.0));
    let blocker = blocker["id"].as_str().unwrap();
    wait_running_with_progress(&server, blocker);
    let job = server.submit(json!({
        "1": {"class_type": "HostileStdoutFlood", "inputs": {"megabytes": 1}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    }));
    let id = job["id"].as_str().unwrap();
    let mut sse = Sse::open(&server, id, None);
    cancel(&server, blocker);
    let frames = sse.rest();
    let log = frames
        .iter()
        .find(|f| f.event == "log")
        .unwrap_or_else(|| panic!("no log event in {frames:?}"));
    assert_eq!(log.data["level"], "info");
    let message = log.data["message"].as_str().unwrap();
    assert!(message.ends_with("FLOOD-END-MARKER\n"), "the newest output is sent");
    assert!(
        message.len() <= 64 << 10,
        "a log event is bounded by the log tail, not by what the node wrote: {} bytes",
        message.len()
    );
    assert_eq!(frames.last().unwrap().data["status"], "succeeded");
}
