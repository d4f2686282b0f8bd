//! Black-box tests of video-to-music: `POST /proxy/audio/v2m/generate` on the real `weft`
//! binary, and the `VideoToMusic` → `SaveAudio` workflow through the job API. Every video
//! is generated here with ffmpeg's lavfi sources.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::blocking::multipart::{Form, Part};
use serde_json::{json, Value};
use support::{Options, Server};

const GENERATE: &str = "/proxy/audio/v2m/generate";

/// A `secs`-long H.264 video with a scene cut in the middle, at `size`.
fn make_video(dir: &Path, name: &str, secs: f64, size: &str) -> PathBuf {
    let out = dir.join(name);
    let half = secs / 2.0;
    let status = std::process::Command::new("ffmpeg")
        .args(["-y", "-v", "error", "-f", "lavfi", "-t"])
        .arg(format!("{half}"))
        .args(["-i", &format!("testsrc2=s={size}:r=10"), "-f", "lavfi", "-t"])
        .arg(format!("{}", secs - half))
        .args(["-i", &format!("smptebars=s={size}:r=10")])
        .args(["-filter_complex", "[0:v][1:v]concat=n=2:v=1:a=0[v]", "-map", "[v]"])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"])
        .arg(&out)
        .status()
        .expect("running ffmpeg");
    assert!(status.success(), "ffmpeg failed");
    out
}

/// (format name, duration) of a media file, by ffprobe.
fn probe(path: &Path) -> (String, f64) {
    let out = std::process::Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "format=format_name,duration",
            "-of",
            "json",
        ])
        .arg(path)
        .output()
        .expect("running ffprobe");
    assert!(out.status.success(), "ffprobe failed on {}", path.display());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let format = v["format"]["format_name"].as_str().unwrap_or("").to_string();
    let duration = v["format"]["duration"].as_str().unwrap().parse().unwrap();
    (format, duration)
}

fn video_part(bytes: Vec<u8>) -> Part {
    Part::bytes(bytes).file_name("clip.mp4").mime_str("video/mp4").unwrap()
}

/// POSTs `form` to the endpoint with `token` as the bearer (if any).
fn post(server: &Server, form: Form, token: Option<&str>) -> reqwest::blocking::Response {
    let mut request = server.http.post(server.url(GENERATE)).multipart(form);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    request.send().unwrap()
}

/// Asserts a `{detail: {code, message}}` error with `status` and `code`.
fn assert_detail(response: reqwest::blocking::Response, status: u16, code: &str) {
    assert_eq!(response.status().as_u16(), status);
    let body: Value = response.json().unwrap();
    assert_eq!(body["detail"]["code"], code, "{body}");
    assert!(
        body["detail"]["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(body.as_object().unwrap().len(), 1, "{body}");
}

fn events(response: reqwest::blocking::Response) -> Vec<Value> {
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    assert_eq!(content_type, "application/x-ndjson");
    let text = response.text().unwrap();
    assert!(text.ends_with('\n'));
    text.lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

fn decode(event: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(event["data"].as_str().unwrap())
        .unwrap()
}

fn tmp_files(server: &Server) -> Vec<PathBuf> {
    std::fs::read_dir(server.data_dir.join("v2m-tmp"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Processes whose parent is `pid` (the server's ffmpeg/ffprobe children).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            out.push(child);
        }
    }
    out
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn events_follow_the_grammar_and_each_stream_is_one_wav_as_long_as_the_video() {
    let dir = tempfile::tempdir().unwrap();
    let video = make_video(dir.path(), "clip.mp4", 6.0, "160x90");
    let (_, video_duration) = probe(&video);
    let server = Server::start();
    let form = Form::new()
        .part("0.video", video_part(std::fs::read(&video).unwrap()))
        .text("prompt", "calm piano")
        .text("copies", "2");
    let events = events(post(&server, form, Some("any-token")));

    assert_eq!(events[0]["type"], "duration");
    assert!((events[0]["duration_sec"].as_f64().unwrap() - video_duration).abs() < 1e-3);
    assert_eq!(events[1]["type"], "titles");
    let titles = events[1]["titles"].as_array().unwrap();
    assert_eq!(titles.len(), 2);
    for (i, title) in events[2..4].iter().enumerate() {
        let keys: Vec<&str> = title.as_object().unwrap().keys().map(String::as_str).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                "copy_index",
                "display_tags",
                "prompt_index",
                "stream_index",
                "summary",
                "title",
                "type"
            ],
            "{title}"
        );
        assert_eq!(title["type"], "title");
        assert_eq!(title["stream_index"], i as u64);
        assert_eq!(title["copy_index"], i as u64);
        assert_eq!(title["prompt_index"], 0);
        assert_eq!(title["title"], titles[i]);
        assert!(!title["summary"].as_str().unwrap().is_empty());
        assert!(!title["display_tags"].as_array().unwrap().is_empty());
    }
    assert_eq!(events.last().unwrap(), &json!({"type": "complete"}));
    let chunks = &events[4..events.len() - 1];
    assert!(chunks.iter().all(|e| e["type"] == "audio_chunk"));
    let mut streams = [Vec::new(), Vec::new()];
    for chunk in chunks {
        assert_eq!(chunk.as_object().unwrap().len(), 3, "{chunk}");
        let index = chunk["stream_index"].as_u64().unwrap() as usize;
        streams[index].extend(decode(chunk));
    }
    assert_ne!(streams[0], streams[1], "copies differ");
    for (i, bytes) in streams.iter().enumerate() {
        assert_eq!(&bytes[..4], b"RIFF");
        let wav = dir.path().join(format!("stream{i}.wav"));
        std::fs::write(&wav, bytes).unwrap();
        let (format, duration) = probe(&wav);
        assert_eq!(format, "wav");
        assert!(
            (duration - video_duration).abs() < 1e-3,
            "stream {i}: {duration} s for a {video_duration} s video"
        );
    }
    assert!(tmp_files(&server).is_empty());
}

#[test]
fn missing_video_is_400_missing_video() {
    let server = Server::start();
    assert_detail(
        post(&server, Form::new().text("prompt", "epic"), Some("t")),
        400,
        "missing_video",
    );
    // An empty file part, as browsers send when no file was chosen.
    let form = Form::new().part("0.video", video_part(Vec::new()));
    assert_detail(post(&server, form, Some("t")), 400, "missing_video");
    // A reference that is not an asset of the caller's.
    let form = Form::new().text("video", "8d1f2b9e-0000-4000-8000-000000000000");
    assert_detail(post(&server, form, Some("t")), 400, "missing_video");
}

#[test]
fn unreadable_video_is_415_unsupported_video() {
    let server = Server::start();
    let form = Form::new().part("0.video", video_part(b"this is not a video at all".repeat(100)));
    assert_detail(post(&server, form, Some("t")), 415, "unsupported_video");
    // Audio only: readable, but there is no picture to score.
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("tone.wav");
    let status = std::process::Command::new("ffmpeg")
        .args(["-y", "-v", "error", "-f", "lavfi", "-i", "sine=d=1"])
        .arg(&wav)
        .status()
        .unwrap();
    assert!(status.success());
    let form = Form::new().part("0.video", video_part(std::fs::read(&wav).unwrap()));
    assert_detail(post(&server, form, Some("t")), 415, "unsupported_video");
    assert!(tmp_files(&server).is_empty());
}

#[test]
fn video_longer_than_the_limit_is_422_video_too_long() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::with(Options {
        args: vec!["--v2m-max-duration-secs".into(), "3".into()],
        ..Options::default()
    });
    let long = make_video(dir.path(), "long.mp4", 5.0, "64x36");
    let form = Form::new().part("0.video", video_part(std::fs::read(&long).unwrap()));
    assert_detail(post(&server, form, Some("t")), 422, "video_too_long");
    let short = make_video(dir.path(), "short.mp4", 2.0, "64x36");
    let form = Form::new().part("0.video", video_part(std::fs::read(&short).unwrap()));
    let events = events(post(&server, form, Some("t")));
    assert_eq!(events.last().unwrap()["type"], "complete");
    assert!(tmp_files(&server).is_empty());
}

#[test]
fn upload_over_the_size_limit_is_413_upload_too_large() {
    let server = Server::with(Options {
        args: vec!["--v2m-max-upload-bytes".into(), "20000".into()],
        ..Options::default()
    });
    // With a Content-Length.
    let form = Form::new().part("0.video", video_part(vec![7u8; 60_000]));
    assert_detail(post(&server, form, Some("t")), 413, "upload_too_large");
    // Chunked, with no length announced.
    let reader = std::io::Cursor::new(vec![7u8; 60_000]);
    let form = Form::new().part("0.video", Part::reader(reader).file_name("clip.mp4"));
    assert_detail(post(&server, form, Some("t")), 413, "upload_too_large");
    wait_until("temporary files are removed", || tmp_files(&server).is_empty());
}

#[test]
fn a_chunked_upload_past_the_whole_body_limit_is_413_upload_too_large_in_any_part() {
    let server = Server::with(Options {
        args: vec!["--v2m-max-upload-bytes".into(), "20000".into()],
        ..Options::default()
    });
    // Past the limit and the multipart slack together (282,144 bytes), sent with no length
    // announced: the limit is reached inside a part, where the multipart reader reports it
    // wrapped. Only a little past it, so that the rest of the body fits the socket's buffers
    // and the client has sent it all when the answer comes.
    let big = || std::io::Cursor::new(vec![7u8; 300_000]);
    let form = Form::new().part("0.video", Part::reader(big()).file_name("clip.mp4"));
    assert_detail(post(&server, form, Some("t")), 413, "upload_too_large");
    let form = Form::new().part("unknown", Part::reader(big()).file_name("x.bin"));
    assert_detail(post(&server, form, Some("t")), 413, "upload_too_large");
    wait_until("temporary files are removed", || tmp_files(&server).is_empty());
}

#[test]
fn a_bearer_token_is_required_and_checked_401_unauthorized() {
    let dir = tempfile::tempdir().unwrap();
    let video = std::fs::read(make_video(dir.path(), "clip.mp4", 1.0, "64x36")).unwrap();
    // `--auth none` still needs a bearer token on this endpoint; any is accepted.
    let server = Server::start();
    let response = post(&server, Form::new().part("0.video", video_part(video.clone())), None);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_detail(response, 401, "unauthorized");
    let response = server
        .http
        .post(server.url(GENERATE))
        .header("authorization", "Basic abc")
        .multipart(Form::new().part("0.video", video_part(video.clone())))
        .send()
        .unwrap();
    assert_detail(response, 401, "unauthorized");
    drop(server);

    // `--auth token`: checked like the job API.
    let server = Server::with(Options {
        args: vec!["--auth".into(), "token".into(), "--token".into(), "s3cret".into()],
        ..Options::default()
    });
    let form = || Form::new().part("0.video", video_part(video.clone()));
    assert_detail(post(&server, form(), None), 401, "unauthorized");
    assert_detail(post(&server, form(), Some("wrong")), 401, "unauthorized");
    let events = events(post(&server, form(), Some("s3cret")));
    assert_eq!(events.last().unwrap()["type"], "complete");
}

#[test]
fn generation_failure_is_500_generation_failed() {
    let server = Server::with(Options {
        args: vec!["--v2m-soundfont".into(), "/nonexistent/none.sf2".into()],
        ..Options::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let video = std::fs::read(make_video(dir.path(), "clip.mp4", 1.0, "64x36")).unwrap();
    let form = Form::new().part("0.video", video_part(video));
    assert_detail(post(&server, form, Some("t")), 500, "generation_failed");
}

#[test]
fn bad_copies_is_400_invalid_request() {
    let server = Server::with(Options {
        args: vec!["--v2m-max-copies".into(), "3".into()],
        ..Options::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let video = std::fs::read(make_video(dir.path(), "clip.mp4", 1.0, "64x36")).unwrap();
    for copies in ["0", "4", "-1", "two"] {
        let form = Form::new()
            .part("0.video", video_part(video.clone()))
            .text("copies", copies);
        assert_detail(post(&server, form, Some("t")), 400, "invalid_request");
    }
    let form = Form::new().part("0.video", video_part(video)).text("copies", "3");
    let events = events(post(&server, form, Some("t")));
    assert_eq!(events[1]["titles"].as_array().unwrap().len(), 3);
    assert!(tmp_files(&server).is_empty());
}

#[test]
fn an_asset_id_of_the_callers_is_a_video_reference() {
    let dir = tempfile::tempdir().unwrap();
    let video = make_video(dir.path(), "clip.mp4", 2.0, "64x36");
    let server = Server::start();
    let asset = server.upload("clip.mp4", std::fs::read(&video).unwrap());
    let form = Form::new().text("video", asset["id"].as_str().unwrap().to_string());
    let first = events(post(&server, form, Some("t")));
    assert_eq!(first.last().unwrap()["type"], "complete");
    // Same video, same prompt, no seed given: the same music.
    let form = Form::new().part("0.video", video_part(std::fs::read(&video).unwrap()));
    let again = events(post(&server, form, Some("t")));
    assert_eq!(first, again);
    assert!(tmp_files(&server).is_empty());
    // The asset is still there afterwards.
    assert_eq!(
        server
            .get(&format!("/api/v2/assets/{}", asset["id"].as_str().unwrap()))
            .status()
            .as_u16(),
        200
    );
}

/// Serves `body` to HTTP GETs on a loopback port; returns the port.
fn serve_file(body: Vec<u8>) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    port
}

#[test]
fn video_urls_need_an_allowed_host_and_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    let video = std::fs::read(make_video(dir.path(), "clip.mp4", 1.0, "64x36")).unwrap();
    let port = serve_file(video);
    let url = format!("http://127.0.0.1:{port}/clip.mp4");

    // No allowed hosts: no URLs.
    let server = Server::start();
    let form = Form::new().text("video", url.clone());
    assert_detail(post(&server, form, Some("t")), 400, "invalid_request");
    drop(server);

    // Allowed host, but it is a loopback address: refused (no SSRF).
    let allow = vec!["--v2m-allow-url-host".to_string(), "127.0.0.1".to_string()];
    let server = Server::with(Options {
        args: allow.clone(),
        ..Options::default()
    });
    let form = Form::new().text("video", url.clone());
    assert_detail(post(&server, form, Some("t")), 400, "invalid_request");
    let form = Form::new().text("video", format!("http://localhost:{port}/clip.mp4"));
    assert_detail(post(&server, form, Some("t")), 400, "invalid_request");
    drop(server);

    // Private addresses explicitly allowed by the operator: fetched.
    let mut args = allow;
    args.push("--v2m-allow-private-urls".into());
    let server = Server::with(Options {
        args,
        ..Options::default()
    });
    let events = events(post(&server, Form::new().text("video", url), Some("t")));
    assert_eq!(events[0]["type"], "duration");
    assert_eq!(events.last().unwrap()["type"], "complete");
    assert!(tmp_files(&server).is_empty());
}

/// Answers HTTP GETs on a loopback port with a large announced body that it then sends one
/// byte at a time, slowly, forever; returns the port.
fn serve_trickle() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: 1000000\r\n\r\n";
                let _ = stream.write_all(head.as_bytes());
                while stream.write_all(b"x").is_ok() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
    });
    port
}

#[test]
fn a_video_url_that_trickles_its_bytes_is_cut_off_at_the_download_timeout() {
    let port = serve_trickle();
    let server = Server::with(Options {
        args: [
            "--v2m-allow-url-host",
            "127.0.0.1",
            "--v2m-allow-private-urls",
            "--v2m-url-timeout-secs",
            "1",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    });
    let form = Form::new().text("video", format!("http://127.0.0.1:{port}/slow.mp4"));
    let response = post(&server, form, Some("t"));
    assert_eq!(response.status().as_u16(), 415);
    let body: Value = response.json().unwrap();
    assert_eq!(body["detail"]["code"], "unsupported_video", "{body}");
    assert!(
        body["detail"]["message"].as_str().unwrap().contains("took longer"),
        "{body}"
    );
    assert!(tmp_files(&server).is_empty(), "the partial download is removed");
}

/// Serves `body` over TLS on a loopback port, with a fresh self-signed certificate for
/// `localhost` and 127.0.0.1; returns the port and the certificate's PEM.
fn serve_file_tls(body: Vec<u8>) -> (u16, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let pem = cert.pem();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let (config, body) = (config.clone(), body.clone());
            std::thread::spawn(move || {
                let connection = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match tls.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return, // the client refused the certificate, or went away
                    }
                }
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: video/mp4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(reply.as_bytes());
                let _ = tls.write_all(&body);
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (port, pem)
}

#[test]
fn https_video_urls_are_fetched_with_a_verified_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let video = std::fs::read(make_video(dir.path(), "clip.mp4", 1.0, "64x36")).unwrap();
    let (port, pem) = serve_file_tls(video);
    let url = format!("https://localhost:{port}/clip.mp4");
    let allow = |extra: &[String]| {
        let mut args: Vec<String> = ["--v2m-allow-url-host", "localhost", "--v2m-allow-private-urls"]
            .map(String::from)
            .to_vec();
        args.extend_from_slice(extra);
        Server::with(Options {
            args,
            ..Options::default()
        })
    };

    // A certificate no trusted root signed: the fetch fails, before any stream starts.
    let server = allow(&[]);
    let response = post(&server, Form::new().text("video", url.clone()), Some("t"));
    assert_eq!(response.status().as_u16(), 415);
    let body: Value = response.json().unwrap();
    assert_eq!(body["detail"]["code"], "unsupported_video", "{body}");
    let message = body["detail"]["message"].as_str().unwrap();
    assert!(message.contains("TLS"), "{message}");
    assert!(tmp_files(&server).is_empty());
    drop(server);

    // Trusted by the operator's CA file: fetched and scored.
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, pem).unwrap();
    let server = allow(&["--v2m-url-ca-file".into(), ca.display().to_string()]);
    let events = events(post(&server, Form::new().text("video", url), Some("t")));
    assert_eq!(events[0]["type"], "duration");
    assert_eq!(events.last().unwrap()["type"], "complete");
    assert!(tmp_files(&server).is_empty());

    // Other schemes are refused outright.
    let form = Form::new().text("video", format!("ftp://localhost:{port}/clip.mp4"));
    assert_detail(post(&server, form, Some("t")), 400, "invalid_request");
}

#[test]
fn a_client_that_disconnects_mid_stream_stops_the_work_and_leaks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let video = std::fs::read(make_video(dir.path(), "long.mp4", 120.0, "64x36")).unwrap();
    let server = Server::start();
    let pid = server.pid();
    for stop_after in ["duration", "audio_chunk"] {
        let form = Form::new()
            .part("0.video", video_part(video.clone()))
            .text("copies", "4");
        let response = post(&server, form, Some("t"));
        assert_eq!(response.status().as_u16(), 200);
        let mut reader = BufReader::new(response);
        loop {
            let mut line = String::new();
            assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended early");
            let event: Value = serde_json::from_str(&line).unwrap();
            assert_ne!(event["type"], "complete");
            if event["type"] == stop_after {
                break;
            }
        }
        drop(reader); // closes the connection mid-stream
        wait_until("no temporary video is left", || tmp_files(&server).is_empty());
        wait_until("no ffmpeg child is left", || children(pid).is_empty());
    }
    // Still healthy, and still generating.
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
    let short = std::fs::read(make_video(dir.path(), "short.mp4", 1.0, "64x36")).unwrap();
    let events = events(post(&server, Form::new().part("0.video", video_part(short)), Some("t")));
    assert_eq!(events.last().unwrap()["type"], "complete");
}

#[test]
fn the_route_respects_the_mount_prefix() {
    let server = Server::with(Options {
        args: vec!["--mount-prefix".into(), "/deployment/abc".into()],
        ..Options::default()
    });
    let response = server
        .http
        .post(server.url(&format!("/deployment/abc{GENERATE}")))
        .multipart(Form::new().text("prompt", "x"))
        .send()
        .unwrap();
    assert_detail(response, 401, "unauthorized");
}

#[test]
fn video_to_music_then_save_audio_produces_an_audio_output() {
    let dir = tempfile::tempdir().unwrap();
    let video = make_video(dir.path(), "clip.mp4", 3.0, "64x36");
    let (_, video_duration) = probe(&video);
    let server = Server::start();
    let asset = server.upload("clip.mp4", std::fs::read(&video).unwrap());
    let reference = json!({"__type": "core/ASSET", "info": {"id": asset["id"]}});
    let job = server.run(json!({
        "1": {"class_type": "VideoToMusic", "inputs": {"video": reference, "prompt": "happy piano", "seed": 7}},
        "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/weft"}},
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let outputs = job["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "{job}");
    assert_eq!(outputs[0]["type"], "audio");
    assert_eq!(outputs[0]["content_type"], "audio/wav");
    let bytes = server.download(outputs[0]["url"].as_str().unwrap());
    let wav = dir.path().join("out.wav");
    std::fs::File::create(&wav).unwrap().write_all(&bytes).unwrap();
    let (format, duration) = probe(&wav);
    assert_eq!(format, "wav");
    assert!(
        (duration - video_duration).abs() < 1e-3,
        "{duration} vs {video_duration}"
    );
    let mut header = [0u8; 4];
    std::io::Cursor::new(&bytes).read_exact(&mut header).unwrap();
    assert_eq!(&header, b"RIFF");
}
