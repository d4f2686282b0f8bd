//! The sandbox: hostile plugins each fail with a clean node error while the host lives on,
//! logs stay bounded and keep the tail, cancellation interrupts running nodes, and failing
//! calls leave memory and file descriptors flat.

mod support;

use serde_json::{json, Value};
use support::{assert_single_failed_in_class, plugins_with, single, wait_running, Options, Server};

/// A server with the hostile plugins loaded, a short node time limit and a small memory cap.
fn hostile_server(extra: &[&str]) -> (Server, tempfile::TempDir) {
    let plugins = plugins_with(&[
        "weft_test_loop",
        "weft_test_memory",
        "weft_test_stdout_flood",
        "weft_test_recursion",
        "weft_test_escape",
        "weft_test_panic",
        "weft_test_huge_output",
        "weft_test_counter",
    ]);
    let mut args: Vec<String> = [
        "--node-timeout-ms",
        "1500",
        "--node-memory-mib",
        "64",
        "--surface",
        "serverless",
        "--job-cost",
        "0",
    ]
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
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "alive"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "alive"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
}

#[test]
fn an_infinite_loop_is_stopped_at_the_node_time_limit() {
    let (server, _p) = hostile_server(&[]);
    let job = server.run(single("HostileLoop", json!({})));
    assert_single_failed_in_class(&job, "node_timeout", "HostileLoop");
    assert!(
        job["error"]["traceback"].as_str().is_some_and(|t| !t.is_empty()),
        "a trap carries its wasm backtrace: {job}"
    );
    assert_host_alive(&server);
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let (server, _p) = hostile_server(&[]);
    let job = server.run(single("HostileMemoryBomb", json!({"chunk_mib": 16, "graceful": false})));
    assert_single_failed_in_class(&job, "node_memory_limit", "HostileMemoryBomb");
    assert_host_alive(&server);
}

#[test]
fn a_stdout_flood_keeps_the_log_bounded_and_keeps_the_tail() {
    // A generous time limit: writing 100 MB through a debug build of the host takes a while.
    let (server, _p) = hostile_server(&["--log-kib", "64", "--node-timeout-ms", "120000"]);
    let job = server.run(single("HostileStdoutFlood", json!({"megabytes": 100})));
    assert_eq!(job["status"], "succeeded", "{job}");
    let logs = &job["logs"];
    assert_eq!(logs["truncated"], true, "{logs}");
    let text = logs["text"].as_str().unwrap();
    assert!(text.len() <= 64 * 1024, "the log is bounded: {} bytes", text.len());
    assert!(
        text.trim_end().ends_with("FLOOD-END-MARKER"),
        "the log keeps the newest bytes"
    );
    assert_host_alive(&server);
}

#[test]
fn deep_recursion_is_a_stack_overflow() {
    let (server, _p) = hostile_server(&[]);
    let job = server.run(single("HostileRecursion", json!({})));
    assert_single_failed_in_class(&job, "node_stack_overflow", "HostileRecursion");
    assert_host_alive(&server);
}

#[test]
fn files_sockets_and_environment_are_denied() {
    let (server, _p) = hostile_server(&[]);
    let job = server.run(single("HostileEscape", json!({"address": "127.0.0.1:80"})));
    assert_eq!(job["status"], "failed", "nothing may leak: {job}");
    assert_eq!(job["error"]["code"], "node_execution_error", "{job}");
    let message = job["error"]["message"].as_str().unwrap();
    assert!(message.contains("sandbox_held"), "{message}");
    for attempt in ["/etc/passwd", "tcp", "env"] {
        assert!(
            message.to_lowercase().contains(attempt),
            "the message reports the {attempt} attempt: {message}"
        );
    }
    assert_host_alive(&server);
}

#[test]
fn a_guest_panic_is_a_clean_node_error() {
    let (server, _p) = hostile_server(&[]);
    let job = server.run(single("HostilePanic", json!({})));
    assert_single_failed_in_class(&job, "node_panic", "HostilePanic");
    assert!(
        job["error"]["message"].as_str().unwrap().contains("hostile panic"),
        "{job}"
    );
    assert_host_alive(&server);
}

#[test]
fn an_absurdly_large_output_is_refused() {
    let (server, _p) = hostile_server(&[]);
    let job = server.run(single("HostileHugeOutput", json!({"mib": 512})));
    assert_eq!(job["status"], "failed", "{job}");
    let code = job["error"]["code"].as_str().unwrap();
    assert!(
        matches!(
            code,
            "node_memory_limit" | "node_output_too_large" | "node_hostcall_limit"
        ),
        "{job}"
    );
    // Under the memory cap but over the output cap.
    let (server, _p) = hostile_server(&[
        "--node-memory-mib",
        "256",
        "--hostcall-mib",
        "8",
        "--node-timeout-ms",
        "60000",
    ]);
    let job = server.run(single("HostileHugeOutput", json!({"mib": 32})));
    assert_single_failed_in_class(&job, "node_output_too_large", "HostileHugeOutput");
    let job =
        server.run(json!({"1": {"class_type": "HostileHugeFile", "inputs": {"mib": 32, "filename_prefix": "x"}}}));
    assert_single_failed_in_class(&job, "node_output_too_large", "HostileHugeFile");
    assert_eq!(job["outputs"], json!([]), "nothing was committed: {job}");
    assert_host_alive(&server);
}

#[test]
fn cancel_interrupts_a_node_that_never_checks() {
    let (server, _p) = hostile_server(&["--node-timeout-ms", "600000"]);
    let job = server.submit(single("SlowCounter", json!({"seconds": 300.0})));
    let id = job["id"].as_str().unwrap();
    wait_running(&server, id);
    let canceled: Value = server
        .post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}))
        .json()
        .unwrap();
    assert!(
        matches!(canceled["status"].as_str(), Some("canceling") | Some("canceled")),
        "{canceled}"
    );
    let done = server.wait(id);
    assert_eq!(done["status"], "canceled", "{done}");
    assert_host_alive(&server);
}

#[test]
fn cancel_reaches_a_node_that_checks() {
    let (server, _p) = hostile_server(&["--node-timeout-ms", "600000"]);
    let job = server.submit(single("PoliteCounter", json!({"seconds": 300.0})));
    let id = job["id"].as_str().unwrap();
    wait_running(&server, id);
    server.post(&format!("/api/v2/jobs/{id}/cancel"), &json!({}));
    assert_eq!(server.wait(id)["status"], "canceled");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

#[test]
fn failing_calls_leave_memory_and_file_descriptors_flat() {
    let (server, _p) = hostile_server(&["--node-timeout-ms", "200"]);
    let failing = [
        single("HostilePanic", json!({})),
        single("HostileRecursion", json!({})),
        single("HostileMemoryBomb", json!({"chunk_mib": 16, "graceful": false})),
        single("HostileLoop", json!({})),
    ];
    let round = |n: usize| {
        for _ in 0..n {
            for w in &failing {
                assert_eq!(server.run(w.clone())["status"], "failed");
            }
        }
    };
    round(5);
    let (rss, fds) = (rss_kib(server.pid()), open_fds(server.pid()));
    round(25);
    let (rss_after, fds_after) = (rss_kib(server.pid()), open_fds(server.pid()));
    assert!(fds_after <= fds + 4, "file descriptors grew from {fds} to {fds_after}");
    assert!(
        rss_after < rss + 64 * 1024,
        "resident memory grew from {rss} KiB to {rss_after} KiB over 100 failing calls"
    );
}

#[test]
fn two_plugins_defining_one_class_the_second_is_refused_naming_both() {
    // One bad plugin no longer stops the server (issue 15): the first to define a class
    // keeps it, the second is refused with a line naming the class and both plugins.
    let dir = tempfile::tempdir().unwrap();
    let built = support::test_plugins_dir();
    std::fs::copy(built.join("weft_test_panic.wasm"), dir.path().join("first.wasm")).unwrap();
    std::fs::copy(built.join("weft_test_panic.wasm"), dir.path().join("second.wasm")).unwrap();
    let out = std::process::Command::new(support::weft_bin())
        .args(["nodes", "--plugins-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let refusal = stderr
        .lines()
        .find(|l| l.starts_with("refused plugin second"))
        .unwrap_or_else(|| panic!("no refusal of the second plugin: {stderr}"));
    assert!(
        refusal.contains("HostilePanic") && refusal.contains("first") && refusal.contains("second"),
        "{refusal}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("HostilePanic") && stdout.contains("(1 refused)"),
        "{stdout}"
    );
}

#[test]
fn a_plugin_gets_only_capabilities_its_manifest_asks_for_and_the_operator_grants() {
    let dir = tempfile::tempdir().unwrap();
    let built = support::test_plugins_dir();
    std::fs::copy(built.join("weft_test_escape.wasm"), dir.path().join("escape.wasm")).unwrap();
    std::fs::write(dir.path().join("escape.toml"), "[capabilities]\nenv = [\"PATH\"]\n").unwrap();
    // Asked for but not granted: still denied.
    let server = Server::with(Options {
        plugins_dir: Some(dir.path().to_path_buf()),
        args: vec!["--surface".into(), "serverless".into(), "--job-cost".into(), "0".into()],
        ..Default::default()
    });
    let job = server.run(single("HostileEscape", json!({"address": "127.0.0.1:9"})));
    assert_eq!(job["status"], "failed", "{job}");
    drop(server);
    // Asked for and granted: the environment variable is visible, nothing else.
    let server = Server::with(Options {
        plugins_dir: Some(dir.path().to_path_buf()),
        args: vec!["--grant".into(), "escape=env:PATH".into()],
        ..Default::default()
    });
    let job = server.run(single("HostileEscape", json!({"address": "127.0.0.1:9"})));
    assert_eq!(job["status"], "succeeded", "{job}");
    let preview = server.download(job["outputs"][0]["url"].as_str().unwrap());
    let text = String::from_utf8(preview).unwrap();
    assert!(text.starts_with("LEAKED:") && text.contains("PATH"), "{text}");
    assert!(!text.contains("read /etc/passwd: LEAKED"), "files stay closed: {text}");
    assert!(
        !text.contains("tcp connect 127.0.0.1:9: LEAKED"),
        "the network stays closed: {text}"
    );
}
