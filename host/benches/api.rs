//! API benchmark: starts the release `weft` binary and measures, over plain keep-alive
//! HTTP/1.1 connections:
//! - durable `POST /api/v2/jobs` per second (closed loop, concurrent clients), p50/p99;
//! - p50/p99 of submissions paced at half that rate (open loop);
//! - `GET /api/v2/jobs/{id}` per second;
//! - idle RSS after start-up;
//! - the RSS held by 10,000 open SSE streams.
//!
//! Run with `cargo bench -p weft --bench api`. `WEFT_BENCH_SECS` sets the length of each
//! timed phase (default 5), `WEFT_BENCH_CLIENTS` the concurrent clients (default 32),
//! `WEFT_BENCH_STREAMS` the number of streams (default 10000).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

mod support;
use support::{percentile, rss_mib, Conn, Server};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Starts `weft` with a fresh data directory, `args` and, if given, a plugins directory.
fn start(args: &[&str], plugins: Option<&Path>) -> Server {
    let plugins = plugins.map(|p| p.display().to_string());
    let mut all = args.to_vec();
    if let Some(p) = &plugins {
        all.extend(["--plugins-dir", p.as_str()]);
    }
    let bin = Path::new(env!("CARGO_BIN_EXE_weft"));
    support::start(bin, tempfile::tempdir().unwrap(), &all, "error").0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

const WORKFLOW: &str = r#"{"workflow": {"1": {"class_type": "PrimitiveString", "inputs": {"value": "bench"}}, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}}"#;

/// Closed loop: `clients` connections, each sending back to back for `secs`.
fn closed_loop(
    addr: &str,
    clients: usize,
    secs: f64,
    make: impl Fn(usize) -> (String, String, Option<Vec<u8>>) + Sync,
) -> (f64, Vec<Duration>) {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(clients + 1);
    let (count, mut latencies) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let (stop, barrier, make) = (&stop, &barrier, &make);
                s.spawn(move || {
                    let mut conn = Conn::open(addr);
                    let mut lat = Vec::new();
                    barrier.wait();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let (method, path, body) = make(i);
                        let t = Instant::now();
                        let (status, resp) = conn.request(&method, &path, body.as_deref());
                        lat.push(t.elapsed());
                        assert!(
                            status == 200 || status == 201,
                            "{status}: {}",
                            String::from_utf8_lossy(&resp)
                        );
                        i += 1;
                    }
                    lat
                })
            })
            .collect();
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        let all: Vec<Duration> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        (all.len(), all)
    });
    latencies.sort();
    (count as f64 / secs, latencies)
}

/// Open loop: `rate` submissions per second spread over `clients` connections.
fn open_loop(addr: &str, clients: usize, rate: f64, secs: f64) -> Vec<Duration> {
    let per_client = rate / clients as f64;
    let interval = Duration::from_secs_f64(1.0 / per_client);
    let barrier = Barrier::new(clients);
    let mut latencies: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut conn = Conn::open(addr);
                    let mut lat = Vec::new();
                    barrier.wait();
                    let start = Instant::now() + interval.mul_f64(c as f64 / clients as f64);
                    let mut n = 0u32;
                    loop {
                        let due = start + interval * n;
                        if due.duration_since(start).as_secs_f64() > secs {
                            break;
                        }
                        let now = Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        // Latency from when the request was due: queueing in the client counts.
                        let (status, _) = conn.request("POST", "/api/v2/jobs", Some(WORKFLOW.as_bytes()));
                        lat.push(due.elapsed().max(Duration::ZERO));
                        assert_eq!(status, 201);
                        n += 1;
                    }
                    lat
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    latencies.sort();
    latencies
}

fn test_plugins() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let status = Command::new(root.join("scripts/build-wasm.sh"))
        .arg("test")
        .stdout(Stdio::null())
        .status()
        .ok()?;
    if !status.success() {
        return None;
    }
    let built = root.join("target/wasm/wasm32-wasip2/release/weft_test_counter.wasm");
    let dir = tempfile::tempdir().unwrap().keep();
    std::fs::copy(built, dir.join("weft_test_counter.wasm")).ok()?;
    Some(dir)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let secs: f64 = env_or("WEFT_BENCH_SECS", 5.0);
    let clients: usize = env_or("WEFT_BENCH_CLIENTS", 32);
    let streams: usize = env_or("WEFT_BENCH_STREAMS", 10_000);
    println!(
        "weft API benchmark ({} cores, {secs} s phases, {clients} clients)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let server = start(&["--queue-depth", "10000000", "--workers", "1"], None);
    std::thread::sleep(Duration::from_millis(500));
    println!("idle RSS after start-up: {:.1} MiB", rss_mib(server.child.id()));

    // Warm up.
    closed_loop(server.addr(), clients, 1.0, |_| {
        ("POST".into(), "/api/v2/jobs".into(), Some(WORKFLOW.as_bytes().to_vec()))
    });
    let (rate, lat) = closed_loop(server.addr(), clients, secs, |_| {
        ("POST".into(), "/api/v2/jobs".into(), Some(WORKFLOW.as_bytes().to_vec()))
    });
    println!(
        "durable POST /api/v2/jobs: {rate:.0}/s at {clients} clients, p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
    // Each phase gets a fresh server, so the backlog one phase queued does not run during
    // the next.
    drop(server);
    let server = start(&["--queue-depth", "10000000", "--workers", "1"], None);
    closed_loop(server.addr(), 4, 0.5, |_| {
        ("POST".into(), "/api/v2/jobs".into(), Some(WORKFLOW.as_bytes().to_vec()))
    });
    let half = rate / 2.0;
    let lat = open_loop(server.addr(), 16, half, secs);
    println!(
        "durable POST /api/v2/jobs at half load ({half:.0}/s paced): p50 {:.2} ms, p99 {:.2} ms ({} requests)",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        lat.len()
    );

    drop(server);
    let server = start(&["--queue-depth", "10000000", "--workers", "1"], None);
    let mut conn = Conn::open(server.addr());
    let (_, body) = conn.request("POST", "/api/v2/jobs", Some(WORKFLOW.as_bytes()));
    let job: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let path = format!("/api/v2/jobs/{}", job["id"].as_str().unwrap());
    let (rate, lat) = closed_loop(server.addr(), clients, secs, |_| ("GET".into(), path.clone(), None));
    println!(
        "GET /api/v2/jobs/{{id}}: {rate:.0}/s at {clients} clients, p50 {:.2} ms, p99 {:.2} ms",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
    drop(server);

    // SSE: streams on a job that stays queued behind a long-running one.
    let Some(plugins) = test_plugins() else {
        println!("SSE streams: skipped (the test plugins could not be built)");
        return;
    };
    let server = start(&["--workers", "1"], Some(&plugins));
    let mut conn = Conn::open(server.addr());
    let slow = br#"{"workflow": {"1": {"class_type": "SlowCounter", "inputs": {"seconds": 3600.0}}, "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}}}"#;
    let (status, _) = conn.request("POST", "/api/v2/jobs", Some(slow));
    assert_eq!(status, 201);
    let (status, body) = conn.request("POST", "/api/v2/jobs", Some(slow));
    assert_eq!(status, 201);
    let queued: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let events = format!(
        "GET /api/v2/jobs/{}/events HTTP/1.1\r\nHost: bench\r\n\r\n",
        queued["id"].as_str().unwrap()
    );
    std::thread::sleep(Duration::from_millis(500));
    let before = rss_mib(server.child.id());
    let t = Instant::now();
    let mut open = Vec::with_capacity(streams);
    for _ in 0..streams {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        s.write_all(events.as_bytes()).unwrap();
        open.push(s);
    }
    // Every stream must have its snapshot before we measure.
    let mut buf = [0u8; 4096];
    for s in &mut open {
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("event:status")
            && !String::from_utf8_lossy(&seen).contains("event: status")
        {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "stream closed: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_mib(server.child.id());
    println!(
        "{streams} open SSE streams: RSS {before:.1} MiB -> {after:.1} MiB, held {:.1} MiB ({:.1} KiB per stream; opened in {:.1} s)",
        after - before,
        (after - before) * 1024.0 / streams as f64,
        t.elapsed().as_secs_f64()
    );
    drop(open);
    let _ = Arc::new(());
}
