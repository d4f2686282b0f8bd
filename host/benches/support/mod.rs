//! Shared by the benchmarks that measure the real `weft` binary: start it on a free port and
//! wait until it serves, percentiles, resident memory.

#![allow(dead_code)] // each benchmark uses part of it

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `weft serve`, killed when dropped; its data directory lives as long as it does.
pub(crate) struct Server {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The data directory.
    pub dir: tempfile::TempDir,
}

impl Server {
    /// `127.0.0.1:PORT`, for raw TCP clients.
    pub(crate) fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bin serve` on a free loopback port with its data in `dir`, plus `args`, logging at
/// `log`. Returns once `/healthz` answers 200, with the time that took.
pub(crate) fn start(bin: &Path, dir: tempfile::TempDir, args: &[&str], log: &str) -> (Server, Duration) {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .env("WEFT_LOG", log)
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting weft");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("weft exited before listening")
            .expect("weft's stdout");
        if let Some(rest) = line.strip_prefix("weft listening on ") {
            break rest.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let server = Server { child, base, dir };
    let http = reqwest::blocking::Client::new();
    let deadline = started + Duration::from_secs(300);
    while http
        .get(format!("{}/healthz", server.base))
        .send()
        .map(|r| r.status().as_u16())
        .ok()
        != Some(200)
    {
        assert!(Instant::now() < deadline, "weft did not become ready");
        std::thread::sleep(Duration::from_millis(2));
    }
    (server, started.elapsed())
}

/// The `p` quantile (0 to 1) of ascending `sorted` samples; zero when there are none.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Resident memory of process `pid` in MiB (0 where `/proc` is missing).
pub(crate) fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// A call's progress sink and asset reader that do nothing: the runtime benchmarks' nodes
/// report nothing and read no assets.
pub(crate) struct Nothing;

impl weft::runtime::ProgressSink for Nothing {
    fn report(&self, _: u32, _: u32, _: Option<String>) {}
    fn preview(&self, _: &'static str, _: Vec<u8>) {}
}

impl weft::runtime::AssetReader for Nothing {
    fn read(&self, _: &weft::runtime::AssetRef) -> Result<Vec<u8>, String> {
        Err("none".into())
    }
}
