//! Video-to-music through the real HTTP endpoint: starts the `weft` binary, uploads a
//! generated 1-minute and 6-minute H.264 video, and prints the time from the end of the upload
//! to the first event and to the first audio chunk, and the real-time factor (seconds of
//! music per second of work, upload excluded).
//!
//! `cargo bench -p weft --bench v2m`. `WEFT_BENCH_V2M_SIZE` sets the video size
//! (default `1280x720`), `WEFT_BENCH_V2M_COPIES` the streams per request (default 1),
//! `WEFT_BENCH_BIN` another `weft` binary to measure.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::blocking::multipart::{Form, Part};

mod support;

/// A 60-second H.264 video at `size` and 25 fps with scene cuts every 20 s and a slow hue
/// drift; longer ones repeat it (stream copy, so generating them is quick).
fn make_video(dir: &Path, secs: u32, size: &str) -> PathBuf {
    let minute = dir.join("bench-60s.mp4");
    if !minute.exists() {
        let mut args: Vec<String> = vec!["-y".into(), "-v".into(), "error".into()];
        for source in ["testsrc2", "smptebars", "rgbtestsrc"] {
            args.extend(["-f", "lavfi", "-t", "20", "-i"].map(String::from));
            args.push(format!("{source}=s={size}:r=25"));
        }
        args.extend(
            [
                "-filter_complex",
                "[0:v][1:v][2:v]concat=n=3:v=1:a=0,hue=h=t*6[v]",
                "-map",
                "[v]",
            ]
            .map(String::from),
        );
        args.extend(
            [
                "-c:v",
                "libx264",
                "-preset",
                "ultrafast",
                "-crf",
                "30",
                "-pix_fmt",
                "yuv420p",
            ]
            .map(String::from),
        );
        args.push(minute.display().to_string());
        let status = Command::new("ffmpeg").args(&args).status().expect("running ffmpeg");
        assert!(status.success(), "ffmpeg failed");
    }
    if secs <= 60 {
        return minute;
    }
    let list = dir.join("list.txt");
    let entry = format!("file '{}'\n", minute.display());
    std::fs::write(&list, entry.repeat(secs.div_ceil(60) as usize)).unwrap();
    let out = dir.join(format!("bench-{secs}s.mp4"));
    let status = Command::new("ffmpeg")
        .args(["-y", "-v", "error", "-f", "concat", "-safe", "0", "-i"])
        .arg(&list)
        .args(["-c", "copy"])
        .arg(&out)
        .status()
        .expect("running ffmpeg");
    assert!(status.success(), "ffmpeg concat failed");
    out
}

/// Reads a file and notes when it reached its end (the upload is then complete, up to
/// socket buffering).
struct TimedReader {
    file: std::fs::File,
    done: Arc<Mutex<Option<Instant>>>,
}

impl Read for TimedReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.done.lock().unwrap().get_or_insert_with(Instant::now);
        }
        Ok(n)
    }
}

/// CPU seconds used by process `pid` and its reaped children (ffmpeg, ffprobe) so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<f64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().filter_map(|f| f.parse().ok()).collect())
        .unwrap_or_default();
    // After the state field: utime, stime, cutime, cstime are fields 14..=17 of the line.
    let ticks: f64 = fields.get(10..14).map_or(0.0, |f| f.iter().sum());
    ticks / 100.0
}

struct Run {
    first_event: Duration,
    first_chunk: Duration,
    complete: Duration,
    music_seconds: f64,
}

fn run(http: &reqwest::blocking::Client, base: &str, video: &Path, copies: u32) -> Run {
    let done = Arc::new(Mutex::new(None));
    let reader = TimedReader {
        file: std::fs::File::open(video).unwrap(),
        done: done.clone(),
    };
    let length = std::fs::metadata(video).unwrap().len();
    let form = Form::new()
        .part(
            "0.video",
            Part::reader_with_length(reader, length)
                .file_name("bench.mp4")
                .mime_str("video/mp4")
                .unwrap(),
        )
        .text("prompt", "cinematic strings and piano")
        .text("copies", copies.to_string());
    let response = http
        .post(format!("{base}/proxy/audio/v2m/generate"))
        .bearer_auth("bench")
        .multipart(form)
        .send()
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        200,
        "{}",
        response.text().unwrap_or_default()
    );
    let mut first_event = None;
    let mut first_chunk = None;
    let mut duration = 0.0;
    let mut lines = BufReader::new(response).lines();
    let complete = loop {
        let line = lines.next().expect("the stream ended without `complete`").unwrap();
        let now = Instant::now();
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        first_event.get_or_insert(now);
        match event["type"].as_str() {
            Some("duration") => duration = event["duration_sec"].as_f64().unwrap(),
            Some("audio_chunk") => {
                first_chunk.get_or_insert(now);
            }
            Some("complete") => break now,
            Some("error") => panic!("generation failed: {event}"),
            _ => {}
        }
    };
    let uploaded = done.lock().unwrap().expect("the upload was read to its end");
    Run {
        first_event: first_event.unwrap().saturating_duration_since(uploaded),
        first_chunk: first_chunk.unwrap().saturating_duration_since(uploaded),
        complete: complete.saturating_duration_since(uploaded),
        music_seconds: duration * f64::from(copies),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks
    }
    let size = std::env::var("WEFT_BENCH_V2M_SIZE").unwrap_or_else(|_| "1280x720".into());
    let copies: u32 = std::env::var("WEFT_BENCH_V2M_COPIES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(1);
    let dir = tempfile::tempdir().unwrap();
    let bin =
        std::env::var_os("WEFT_BENCH_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weft")), PathBuf::from);
    let (server, _) = support::start(&bin, tempfile::tempdir().unwrap(), &[], "warn");
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("video-to-music over HTTP ({size}, {copies} stream(s) per request, {cpus} CPUs)");
    for (label, secs) in [("1-minute", 60), ("6-minute", 360)] {
        let t = Instant::now();
        let video = make_video(dir.path(), secs, &size);
        let mb = std::fs::metadata(&video).unwrap().len() as f64 / 1e6;
        eprintln!(
            "generated the {label} video ({mb:.1} MB) in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        let _warm_up = (secs == 60).then(|| run(&http, &server.base, &video, copies));
        let cpu_before = cpu_seconds(server.child.id());
        let r = run(&http, &server.base, &video, copies);
        let cpu = cpu_seconds(server.child.id()) - cpu_before;
        println!(
            "{label:>9}: first event {:>6.3} s, first audio chunk {:>6.3} s, complete {:>6.2} s, \
             real-time factor {:>6.1}x ({:.0} s of music; {:.1} CPU s in the server and ffmpeg, \
             {:.0} s of music per CPU second)",
            r.first_event.as_secs_f64(),
            r.first_chunk.as_secs_f64(),
            r.complete.as_secs_f64(),
            r.music_seconds / r.complete.as_secs_f64(),
            r.music_seconds,
            cpu,
            r.music_seconds / cpu.max(1e-9),
        );
    }
}
