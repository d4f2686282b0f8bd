//! `cargo bench -p weft --bench engine`: prints
//! - per-node overhead of the runtime (fresh store, instantiate, call, drop) for a trivial node;
//! - graph validation time for 10, 100 and 1,000-node graphs;
//! - end to end through the real binary over HTTP: jobs per second and latency for a 3-node
//!   string graph and for the reference image graph (EmptyImage 64x64 -> ImageInvert ->
//!   SaveImage) from 4 client threads, with the split between validation, queueing and node
//!   execution, plus start-up time and idle RSS.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use weft::runtime::{CallContext, CancelToken, Runtime, RuntimeConfig, TailLog, Value as V};

mod support;
use support::{percentile, rss_mib, Nothing, Server};

// The runtime runs in this process: measure it with the server's allocator.
weft_allocator::install!();

fn per_node_overhead() {
    let runtime = Runtime::load(RuntimeConfig {
        concurrent_calls: 4,
        ..Default::default()
    })
    .expect("loading plugins");
    let ctx = CallContext {
        log: TailLog::new(64 << 10),
        cancel: CancelToken::new(),
        progress: Arc::new(Nothing),
        assets: Arc::new(Nothing),
        memory: runtime.job_memory(),
    };
    let call = || {
        runtime
            .call("PrimitiveString", vec![("value".into(), V::Text("x".into()))], &ctx)
            .unwrap()
    };
    for _ in 0..500 {
        call();
    }
    let mut samples = Vec::with_capacity(20_000);
    let started = Instant::now();
    for _ in 0..20_000 {
        let t = Instant::now();
        call();
        samples.push(t.elapsed());
    }
    let total = started.elapsed();
    samples.sort();
    println!(
        "per-node overhead (PrimitiveString: fresh store + instantiate + call + drop, pooling allocator): \
         median {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, {:.0} calls/s on one thread",
        percentile(&samples, 0.5).as_secs_f64() * 1e6,
        percentile(&samples, 0.9).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / total.as_secs_f64()
    );
    validation(&runtime);
}

/// A chain of `n - 1` StringConcatenate nodes ending in SaveText.
fn chain(n: usize) -> Value {
    let mut w = serde_json::Map::new();
    w.insert(
        "0".into(),
        json!({"class_type": "PrimitiveString", "inputs": {"value": "x"}}),
    );
    for i in 1..n - 1 {
        w.insert(i.to_string(), json!({"class_type": "StringConcatenate", "inputs": {"string_a": [(i - 1).to_string(), 0], "string_b": "y", "delimiter": ""}}));
    }
    w.insert(
        (n - 1).to_string(),
        json!({"class_type": "SaveText", "inputs": {"text": [(n - 2).to_string(), 0], "filename_prefix": "b"}}),
    );
    Value::Object(w)
}

fn validation(runtime: &Runtime) {
    for n in [10, 100, 1000] {
        let graph = chain(n);
        let mut samples = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            weft::graph::validate(&graph, &runtime.catalog()).unwrap();
            samples.push(t.elapsed());
        }
        samples.sort();
        println!(
            "validation of a {n}-node graph: median {:.1} µs, p99 {:.1} µs",
            percentile(&samples, 0.5).as_secs_f64() * 1e6,
            percentile(&samples, 0.99).as_secs_f64() * 1e6
        );
    }
}

/// Starts `weft` on `dir`; returns it and the time until it served.
fn start(dir: tempfile::TempDir) -> (Server, Duration) {
    support::start(Path::new(env!("CARGO_BIN_EXE_weft")), dir, &[], "warn")
}

fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn end_to_end(name: &str, server: &Server, workflow: Value, seconds: f64) {
    let threads = 4;
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let metrics_before = reqwest::blocking::get(format!("{}/metrics", server.base))
        .unwrap()
        .text()
        .unwrap();
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let base = server.base.clone();
            let mut workflow = workflow.clone();
            std::thread::spawn(move || {
                let http = reqwest::blocking::Client::new();
                let mut latencies = Vec::new();
                let mut wrong = 0;
                let mut i = 0u64;
                while Instant::now() < deadline {
                    // Vary one literal so every job runs its nodes instead of hitting the cache.
                    workflow["1"]["inputs"]["value"] = json!(format!("t{t}-{i}"));
                    if let Some(w) = workflow.get_mut("e") {
                        w["inputs"]["color"] = json!((t as u64 * 1_000_000 + i) % 0xFFFFFF);
                    }
                    i += 1;
                    let t0 = Instant::now();
                    let job: Value = http
                        .post(format!("{base}/api/v2/jobs"))
                        .json(&json!({"workflow": workflow}))
                        .send()
                        .unwrap()
                        .json()
                        .unwrap();
                    let url = format!("{base}{}", job["urls"]["self"].as_str().unwrap());
                    loop {
                        let j: Value = http.get(&url).send().unwrap().json().unwrap();
                        match j["status"].as_str().unwrap() {
                            "succeeded" => break,
                            "queued" | "running" => std::thread::sleep(Duration::from_micros(200)),
                            _ => {
                                wrong += 1;
                                break;
                            }
                        }
                    }
                    latencies.push(t0.elapsed());
                }
                (latencies, wrong)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut wrong = 0;
    for h in handles {
        let (l, w) = h.join().unwrap();
        all.extend(l);
        wrong += w;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let metrics = reqwest::blocking::get(format!("{}/metrics", server.base))
        .unwrap()
        .text()
        .unwrap();
    let jobs = metric_sum(&metrics, "weft_job_duration_seconds_count")
        - metric_sum(&metrics_before, "weft_job_duration_seconds_count");
    let per_job = |name: &str| (metric_sum(&metrics, name) - metric_sum(&metrics_before, name)) / jobs.max(1.0) * 1e6;
    println!(
        "{name}: {:.0} jobs/s from {threads} client threads (submit to succeeded, polling), latency median {:.2} ms, p99 {:.2} ms, {} jobs, {wrong} not succeeded",
        all.len() as f64 / elapsed,
        percentile(&all, 0.5).as_secs_f64() * 1e3,
        percentile(&all, 0.99).as_secs_f64() * 1e3,
        all.len()
    );
    println!(
        "  split per job (server side): queue wait {:.0} µs, run {:.0} µs of which node calls {:.0} µs",
        per_job("weft_queue_wait_seconds_sum"),
        per_job("weft_job_duration_seconds_sum"),
        per_job("weft_node_duration_seconds_sum"),
    );
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    per_node_overhead();
    let dir = tempfile::tempdir().unwrap();
    let (first, cold) = start(dir);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path()).unwrap();
    // Re-use the compiled-code cache of the first start for a warm start.
    let _ = Command::new("cp")
        .arg("-r")
        .arg(first.dir.path().join("cache"))
        .arg(dir.path())
        .status();
    drop(first);
    let (server, warm) = start(dir);
    println!(
        "start-up to ready: {:.0} ms cold (compiling plugins), {:.0} ms warm (cached)",
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_millis(500));
    println!("idle RSS after start-up: {:.1} MiB", rss_mib(server.child.id()));
    end_to_end(
        "3-node string graph",
        &server,
        json!({
            "1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}},
            "2": {"class_type": "StringConcatenate", "inputs": {"string_a": ["1", 0], "string_b": "y", "delimiter": "-"}},
            "3": {"class_type": "SaveText", "inputs": {"text": ["2", 0], "filename_prefix": "bench"}}
        }),
        8.0,
    );
    end_to_end(
        "EmptyImage 64x64 -> ImageInvert -> SaveImage",
        &server,
        json!({
            "1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}},
            "e": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["e", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "bench"}}
        }),
        8.0,
    );
    println!("RSS after the load: {:.1} MiB", rss_mib(server.child.id()));
}
