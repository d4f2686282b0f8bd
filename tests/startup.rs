//! Black-box tests of start-up and configuration: a bad plugin is refused on its own
//! (reported in the log, `/healthz` and `weft nodes`) while the rest serve; the
//! self-hosted port opens only when the server is ready; a token is never ignored.

mod support;

use std::io::BufRead;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::{Options, Server};

/// A server with the built-ins, the counter plugin and `bad`, with a short describe limit.
fn server_with_bad_plugin(bad: &str) -> (Server, tempfile::TempDir) {
    let plugins = support::plugins_with(&["weft_test_counter", bad]);
    let server = Server::with(Options {
        args: vec!["--plugin-load-timeout-ms".into(), "500".into()],
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    (server, plugins)
}

/// The refusal `/healthz` reports for `plugin`.
fn refusal(server: &Server, plugin: &str) -> String {
    let health: Value = server.get("/healthz").json().unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    let refused = health["plugins"]["refused"].as_array().unwrap();
    let entry = refused
        .iter()
        .find(|p| p["name"] == plugin)
        .unwrap_or_else(|| panic!("{plugin} is not reported as refused: {health}"));
    entry["reason"].as_str().unwrap().to_string()
}

fn classes(server: &Server) -> Value {
    server.get("/api/v2/nodes").json().unwrap()
}

/// The rest serve: a built-in job runs and the counter plugin is listed.
fn the_rest_serve(server: &Server) {
    assert!(classes(server).get("SlowCounter").is_some());
    let done = server.run(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "fine"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    }));
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(server.download(done["outputs"][0]["url"].as_str().unwrap()), b"fine");
}

#[test]
fn a_plugin_whose_describe_never_returns_is_refused_within_its_load_limit() {
    let (server, _plugins) = server_with_bad_plugin("weft_test_slow_describe");
    let reason = refusal(&server, "weft_test_slow_describe");
    assert!(reason.contains("did not return within 500 ms"), "{reason}");
    the_rest_serve(&server);
}

#[test]
fn a_plugin_defining_a_class_already_defined_is_refused_whole() {
    let (server, _plugins) = server_with_bad_plugin("weft_test_collider");
    let reason = refusal(&server, "weft_test_collider");
    assert!(reason.contains("PrimitiveString"), "{reason}");
    assert!(
        classes(&server).get("ColliderOther").is_none(),
        "half of a refused plugin loaded"
    );
    the_rest_serve(&server);
}

#[test]
fn a_plugin_with_an_import_the_host_lacks_is_refused() {
    let (server, _plugins) = server_with_bad_plugin("weft_test_unlinkable");
    let reason = refusal(&server, "weft_test_unlinkable");
    assert!(reason.contains("linked"), "{reason}");
    assert!(classes(&server).get("HostileUnlinkable").is_none());
    the_rest_serve(&server);
}

#[test]
fn weft_nodes_reports_refused_plugins_and_lists_the_rest() {
    let plugins = support::plugins_with(&["weft_test_counter", "weft_test_collider", "weft_test_slow_describe"]);
    let out = Command::new(support::weft_bin())
        .args(["nodes", "--plugin-load-timeout-ms", "500", "--plugins-dir"])
        .arg(plugins.path())
        .env("WEFT_LOG", "off")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refused plugin weft_test_collider"), "{stderr}");
    assert!(stderr.contains("refused plugin weft_test_slow_describe"), "{stderr}");
    assert!(
        stdout.contains("SlowCounter") && stdout.contains("(2 refused)"),
        "{stdout}"
    );
}

/// Starts `weft serve` with `args` and returns it with its base URL, as soon as it prints
/// that it listens.
fn spawn(args: &[&str], data_dir: &std::path::Path) -> (std::process::Child, String) {
    let mut child = Command::new(support::weft_bin())
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .env("WEFT_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("weft exited before listening").unwrap();
        if let Some(rest) = line.strip_prefix("weft listening on ") {
            break rest.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (child, base)
}

#[test]
fn the_self_hosted_port_opens_when_the_server_is_ready() {
    // A slow plugin makes loading take a while; the first request after the port opens is
    // still served, never answered deployment_not_ready (a serverless-only code).
    let plugins = support::plugins_with(&["weft_test_slow_describe"]);
    let dir = tempfile::tempdir().unwrap();
    let plugins_dir = plugins.path().display().to_string();
    let (mut child, base) = spawn(
        &["--plugins-dir", &plugins_dir, "--plugin-load-timeout-ms", "1500"],
        dir.path(),
    );
    let http = reqwest::blocking::Client::new();
    let r = http
        .post(format!("{base}/api/v2/jobs"))
        .json(&json!({"workflow": {
            "1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}},
            "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
        }}))
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().unwrap();
    assert_eq!(status, 201, "{body}");
    let health = http.get(format!("{base}/healthz")).send().unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_token_without_an_auth_mode_turns_on_token_auth() {
    let server = Server::with(Options {
        args: vec!["--token".into(), "S3CRET".into()],
        ..Default::default()
    });
    let r = server.get("/api/v2/jobs");
    assert_eq!(r.status().as_u16(), 401, "a server given a token ran open");
    server.set_token(Some("wrong"));
    assert_eq!(server.get("/api/v2/jobs").status().as_u16(), 401);
    server.set_token(Some("S3CRET"));
    assert_eq!(server.get("/api/v2/jobs").status().as_u16(), 200);
}

#[test]
fn a_token_with_another_auth_mode_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["none", "keys"] {
        let out = Command::new(support::weft_bin())
            .args([
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--auth",
                mode,
                "--token",
                "S3CRET",
                "--data-dir",
            ])
            .arg(dir.path())
            .env("WEFT_LOG", "off")
            .output()
            .unwrap();
        assert!(!out.status.success(), "--auth {mode} --token started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--token"), "{stderr}");
    }
}

#[test]
fn an_unknown_precision_is_refused_at_start_with_the_names_it_takes() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(support::weft_bin())
        .args(["serve", "--addr", "127.0.0.1:0", "--precision", "half", "--data-dir"])
        .arg(dir.path())
        .env("WEFT_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success(), "--precision half started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("float16") && stderr.contains("bfloat16"), "{stderr}");
}
