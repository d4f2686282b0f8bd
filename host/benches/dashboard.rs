//! Dashboard benchmark: the jobs list with 100,000 jobs in the store. It fills a fresh
//! server with that many jobs (a 3-node string graph, one job in ten labelled
//! `shard=s0..s9` through its metadata), lets them run, then measures `GET /` pages over HTTP:
//! - the newest page, live;
//! - pages at depth 1,000, 50,000 and 99,000 (the "Older jobs" cursor);
//! - the status and label filters, newest page and deep.
//!
//! Run with `cargo bench -p weft --bench dashboard`. `WEFT_BENCH_JOBS` sets the number of
//! jobs (default 100000), `WEFT_BENCH_PAGES` the requests per measure (default 50), and
//! `WEFT_BENCH_BIN` another `weft` binary to measure than the one cargo built.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod support;
use support::percentile;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The submission body of job `i`.
fn job(i: usize) -> String {
    let labels = if i.is_multiple_of(10) {
        format!(r#", "metadata": {{"shard": "s{}"}}"#, (i / 10) % 10)
    } else {
        String::new()
    };
    format!(
        r#"{{"workflow": {{
            "1": {{"class_type": "PrimitiveString", "inputs": {{"value": "job {i}"}}}},
            "2": {{"class_type": "StringConcatenate", "inputs": {{"string_a": ["1", 0], "string_b": "x", "delimiter": " "}}}},
            "3": {{"class_type": "SaveText", "inputs": {{"text": ["2", 0], "filename_prefix": "bench"}}}}
        }}{labels}}}"#
    )
}

/// Submits `count` jobs from `threads` clients, waiting out `queue_full` answers.
fn fill(base: &str, count: usize, threads: usize) -> Duration {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let http = reqwest::blocking::Client::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return;
                    }
                    loop {
                        let r = http
                            .post(format!("{base}/api/v2/jobs"))
                            .header("content-type", "application/json")
                            .body(job(i))
                            .send()
                            .expect("submitting");
                        match r.status().as_u16() {
                            201 => break,
                            429 => std::thread::sleep(Duration::from_millis(50)),
                            other => panic!("submission answered {other}: {}", r.text().unwrap_or_default()),
                        }
                    }
                }
            });
        }
    });
    started.elapsed()
}

/// Times `pages` requests of `path`, checking each lists jobs; returns sorted latencies.
fn measure(http: &reqwest::blocking::Client, base: &str, path: &str, pages: usize) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..pages)
        .map(|_| {
            let t = Instant::now();
            let r = http.get(format!("{base}{path}")).send().expect("a page");
            assert_eq!(r.status().as_u16(), 200, "{path}");
            let body = r.text().unwrap();
            let elapsed = t.elapsed();
            assert!(body.contains("<tr data-job"), "{path} lists no jobs");
            elapsed
        })
        .collect();
    times.sort();
    times
}

fn main() {
    let count: usize = env_or("WEFT_BENCH_JOBS", 100_000);
    let pages: usize = env_or("WEFT_BENCH_PAGES", 50);
    let bin = std::env::var_os("WEFT_BENCH_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_weft").into());
    let bin = bin.as_path();
    let depth = (count * 2).to_string();
    let (server, _) = support::start(bin, tempfile::tempdir().unwrap(), &["--queue-depth", &depth], "error");
    let base = server.base.clone();
    let filled = fill(&base, count, 4);
    println!(
        "filled {count} jobs in {:.1} s ({:.0} submissions/s)",
        filled.as_secs_f64(),
        count as f64 / filled.as_secs_f64()
    );
    let http = reqwest::blocking::Client::new();
    // Let the queue drain, so the list is read as it is on a busy day's end.
    let drained = Instant::now();
    loop {
        let page = http
            .get(format!("{base}/?status=queued"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        if !page.contains("<tr data-job") || drained.elapsed() > Duration::from_secs(600) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    println!("queue drained after {:.1} s more", drained.elapsed().as_secs_f64());
    let seq = |fraction: f64| ((count as f64) * (1.0 - fraction)).max(60.0) as usize;
    let measures = [
        ("newest page".to_string(), "/".to_string()),
        (
            "page at depth 1,000".into(),
            format!("/?cursor=c{}", seq(1_000.0 / count as f64)),
        ),
        ("page at depth 50,000".into(), format!("/?cursor=c{}", seq(0.5))),
        ("page at depth 99,000".into(), format!("/?cursor=c{}", seq(0.99))),
        ("status=succeeded, newest".into(), "/?status=succeeded".into()),
        (
            "status=succeeded, depth 50,000".into(),
            format!("/?status=succeeded&cursor=c{}", seq(0.5)),
        ),
        ("label shard=s3, newest".into(), "/?label=shard%3Ds3".into()),
        (
            "label shard=s3, depth 50,000".into(),
            format!("/?label=shard%3Ds3&cursor=c{}", seq(0.5)),
        ),
    ];
    println!("| measure ({count} jobs, {pages} requests each) | p50 | p99 |");
    println!("|---|---|---|");
    for (name, path) in measures {
        let times = measure(&http, &base, &path, pages);
        println!(
            "| {name} | {:.2} ms | {:.2} ms |",
            percentile(&times, 0.5).as_secs_f64() * 1e3,
            percentile(&times, 0.99).as_secs_f64() * 1e3
        );
    }
}
