//! Shared by the benchmarks that measure the real `weft` binary: start it on a free port and
//! wait until it serves, percentiles, resident memory.

#![allow(dead_code)] // each benchmark uses part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
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

/// A minimal keep-alive HTTP/1.1 client connection (no allocation-heavy client library, so
/// that the load generator adds as little as it can to what is measured).
pub(crate) struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    /// Connects to `addr` (`HOST:PORT`), with Nagle's algorithm off.
    pub(crate) fn open(addr: &str) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    /// Sends one request and reads the whole response, by its length or, for a stream, its
    /// chunks up to the last: (status, body).
    pub(crate) fn request(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: bench\r\n");
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        if let Some(b) = body {
            out.extend_from_slice(b);
        }
        self.writer.write_all(&out).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut length = 0usize;
        let mut chunked = false;
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                } else if k.eq_ignore_ascii_case("transfer-encoding") {
                    chunked = v.trim().eq_ignore_ascii_case("chunked");
                }
            }
        }
        if !chunked {
            let mut body = vec![0u8; length];
            self.reader.read_exact(&mut body).unwrap();
            return (status, body);
        }
        let mut body = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim_end().split(';').next().unwrap_or(""), 16).unwrap();
            let start = body.len();
            body.resize(start + size, 0);
            self.reader.read_exact(&mut body[start..]).unwrap();
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            if size == 0 {
                return (status, body);
            }
        }
    }
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
