//! The client commands as a black box: `weft run` against a server and in-process, `--set`,
//! `--input`, the exit codes, `--json`, piped output without bars, and a stream cut
//! mid-run by a proxy that the run survives.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{plugins_with, weft_bin, Options, Server};

fn image_graph(width: u32) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": width, "height": 16, "batch_size": 1, "color": 255}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "cli"}}
    })
}

fn write_json(dir: &Path, name: &str, value: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

/// Runs `weft ARGS` with no WEFT_* settings inherited, stdout and stderr piped.
fn weft(args: &[&str]) -> Output {
    let mut cmd = Command::new(weft_bin());
    cmd.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("WEFT_") {
            cmd.env_remove(key);
        }
    }
    cmd.output().unwrap()
}

fn stdout_json(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {text:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn png_width(path: &Path) -> u32 {
    image::open(path).unwrap().width()
}

#[test]
fn weft_run_against_a_server_writes_the_outputs_and_sets_inputs() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let wf = write_json(dir.path(), "wf.json", &image_graph(16));
    let out_dir = dir.path().join("out");
    let out = weft(&[
        "run",
        &wf,
        "--server",
        &server.base,
        "--set",
        "1.width=24",
        "--out",
        out_dir.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = stdout_json(&out);
    assert_eq!(job["status"], "succeeded");
    let files = job["files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(png_width(Path::new(files[0].as_str().unwrap())), 24);
    // Piped output: no progress bars, no terminal control codes.
    assert!(!out.stdout.contains(&b'\r') && !out.stdout.contains(&0x1b));
    assert!(!out.stderr.contains(&0x1b));
    // The job is on the server, readable with `weft jobs`.
    let id = job["id"].as_str().unwrap();
    let got = weft(&["jobs", "get", id, "--server", &server.base, "--json"]);
    assert_eq!(got.status.code(), Some(0));
    assert_eq!(stdout_json(&got)["id"], id);
    let list = weft(&["jobs", "list", "--server", &server.base, "--json"]);
    assert_eq!(stdout_json(&list)["jobs"][0]["id"], id);
    let text = weft(&["jobs", "list", "--server", &server.base]);
    assert!(String::from_utf8_lossy(&text.stdout).contains(id));
}

#[test]
fn weft_run_in_process_uploads_an_input_and_writes_the_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let picture = dir.path().join("in.png");
    image::RgbImage::from_pixel(12, 7, image::Rgb([10, 200, 30]))
        .save(&picture)
        .unwrap();
    let wf = write_json(
        dir.path(),
        "wf.json",
        &json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": "photo"}}}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "copy"}}
        }),
    );
    let out_dir = dir.path().join("out");
    let input = format!("photo={}", picture.display());
    let out = weft(&["run", &wf, "--input", &input, "--out", out_dir.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("succeeded"), "{stdout}");
    let written: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(written.len(), 1);
    let copy = image::open(&written[0]).unwrap().to_rgb8();
    assert_eq!((copy.width(), copy.height()), (12, 7));
    assert_eq!(copy.get_pixel(3, 3).0, [10, 200, 30]);
    // An --input naming nothing in the workflow is a validation error.
    let out = weft(&["run", &wf, "--input", &format!("nothing={}", picture.display())]);
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn exit_codes_tell_failed_canceled_invalid_and_unreachable_apart() {
    let plugins = plugins_with(&["weft_test_panic", "weft_test_counter"]);
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    // A job that fails: 3, with the error in the JSON.
    let panics = write_json(dir.path(), "panic.json", &support::single("HostilePanic", json!({})));
    let out = weft(&[
        "run",
        &panics,
        "--server",
        &server.base,
        "--json",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3));
    let job = stdout_json(&out);
    assert_eq!(job["status"], "failed");
    assert!(job["error"]["code"].is_string());
    // A workflow that does not validate: 5, with the server's error envelope.
    let invalid = write_json(
        dir.path(),
        "bad.json",
        &json!({"1": {"class_type": "NoSuchNode", "inputs": {}}}),
    );
    let out = weft(&["run", &invalid, "--server", &server.base, "--json"]);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(stdout_json(&out)["error"]["code"], "invalid_workflow");
    // A UI-format workflow is refused as such.
    let ui = write_json(
        dir.path(),
        "ui.json",
        &json!({"nodes": [], "links": [], "version": 0.4}),
    );
    let out = weft(&["run", &ui, "--server", &server.base, "--json"]);
    assert_eq!(out.status.code(), Some(5));
    assert_eq!(stdout_json(&out)["error"]["code"], "workflow_format_ui");
    // No server there: 6.
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let out = weft(&["run", &panics, "--server", &format!("http://{free}"), "--json"]);
    assert_eq!(out.status.code(), Some(6));
    assert!(stdout_json(&out)["error"]["message"].is_string());
    // A job canceled while `weft run` follows it: 4.
    let slow = write_json(dir.path(), "slow.json", &support::slow_workflow(120.0));
    let child = Command::new(weft_bin())
        .args([
            "run",
            &slow,
            "--server",
            &server.base,
            "--json",
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = loop {
        let page: Value = server.get("/api/v2/jobs").json().unwrap();
        if let Some(id) = page["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["status"] == "running")
            .and_then(|j| j["id"].as_str())
        {
            break id.to_string();
        }
        assert!(Instant::now() < deadline, "the slow job never ran");
        std::thread::sleep(Duration::from_millis(50));
    };
    let cancel = weft(&["jobs", "cancel", &id, "--server", &server.base, "--json"]);
    assert_eq!(cancel.status.code(), Some(0));
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout_json(&out)["status"], "canceled");
    // `weft jobs watch` of the ended job gives the same code.
    let out = weft(&["jobs", "watch", &id, "--server", &server.base, "--json"]);
    assert_eq!(out.status.code(), Some(4));
    // A missing API key against an authenticated server: 7.
    let locked = Server::with(Options {
        args: vec!["--token".into(), "t0ken".into()],
        token: Some("t0ken".into()),
        ..Default::default()
    });
    let out = weft(&["jobs", "list", "--server", &locked.base, "--json"]);
    assert_eq!(out.status.code(), Some(7));
    let out = weft(&["jobs", "list", "--server", &locked.base, "--api-key", "t0ken", "--json"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn assets_upload_and_get_with_json() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("note.txt");
    std::fs::write(&file, b"hello assets").unwrap();
    let out = weft(&[
        "assets",
        "upload",
        file.to_str().unwrap(),
        "--server",
        &server.base,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let asset = stdout_json(&out);
    let id = asset["id"].as_str().unwrap();
    let copy = dir.path().join("copy.txt");
    let out = weft(&[
        "assets",
        "get",
        id,
        "--server",
        &server.base,
        "--out",
        copy.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout_json(&out)["id"], id);
    assert_eq!(std::fs::read(&copy).unwrap(), b"hello assets");
    let out = weft(&["assets", "get", "no-such-asset", "--server", &server.base, "--json"]);
    assert_eq!(out.status.code(), Some(5));
}

/// A TCP proxy to `upstream` that cuts the first connection carrying an event-stream
/// request one second after that request. Returns its base URL, whether the cut happened,
/// and every request head that went through.
fn cutting_proxy(upstream: &str) -> (String, Arc<AtomicBool>, Arc<Mutex<Vec<String>>>) {
    let upstream = upstream.trim_start_matches("http://").to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let cut_done = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (cut, log) = (cut_done.clone(), requests.clone());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (cut, log) = (cut.clone(), log.clone());
            let events_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
            // Client to server: note requests, and when an event stream was asked for.
            {
                let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (log, events_at, cut) = (log.clone(), events_at.clone(), cut.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                        if text.contains("/events HTTP/1.1") && !cut.load(Ordering::SeqCst) {
                            events_at.lock().unwrap().get_or_insert_with(Instant::now);
                        }
                        log.lock().unwrap().push(text);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
            // Server to client, cutting the first event stream after a second.
            std::thread::spawn(move || {
                let (mut from, mut to) = (server, client);
                from.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
                let mut buf = [0u8; 16384];
                loop {
                    let started = *events_at.lock().unwrap();
                    if started.is_some_and(|t| t.elapsed() > Duration::from_secs(1))
                        && !cut.swap(true, Ordering::SeqCst)
                    {
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                        return;
                    }
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        }
                        Err(_) => break,
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
            });
        }
    });
    (base, cut_done, requests)
}

#[test]
fn a_stream_dropped_mid_run_resumes_and_the_run_finishes() {
    let (server, _plugins) = support::slow_server(&[]);
    let (proxy, cut, requests) = cutting_proxy(&server.base);
    let dir = tempfile::tempdir().unwrap();
    let wf = write_json(dir.path(), "slow.json", &support::slow_workflow(4.0));
    let out_dir = dir.path().join("out");
    let out = weft(&[
        "run",
        &wf,
        "--server",
        &proxy,
        "--json",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout_json(&out)["status"], "succeeded");
    assert!(cut.load(Ordering::SeqCst), "the proxy never cut the stream");
    let requests = requests.lock().unwrap();
    let streams: Vec<&String> = requests.iter().filter(|r| r.contains("/events HTTP/1.1")).collect();
    assert!(streams.len() >= 2, "the stream was not reopened: {streams:?}");
    assert!(
        streams[1..]
            .iter()
            .any(|r| r.to_ascii_lowercase().contains("last-event-id:")),
        "the stream was not resumed with Last-Event-ID"
    );
}
