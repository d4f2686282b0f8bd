//! Black-box tests of the asset API: upload with dedup, expected hashes, from-hash, by-hash,
//! read, delete, ranged content, and the upload size limit (streamed, never buffered whole).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use reqwest::blocking::multipart::{Form, Part};
use serde_json::{json, Value};
use support::{Options, Server};

fn short(v: &Value) -> String {
    v.to_string().chars().take(600).collect()
}

fn send(rb: reqwest::blocking::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let r = rb.send().unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.bytes().unwrap().to_vec())
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

fn upload_form(name: &str, bytes: &[u8], expected_hash: Option<&str>) -> Form {
    let mut form = Form::new()
        .part("file", Part::bytes(bytes.to_vec()).file_name(name.to_string()))
        .text("file_path", name.to_string())
        .text("tags", "one")
        .text("tags", "two");
    if let Some(h) = expected_hash {
        form = form.text("expected_hash", h.to_string());
    }
    form
}

fn post_upload(server: &Server, form: Form) -> (u16, Value) {
    let (status, _, body) = send(server.request(reqwest::Method::POST, "/api/v2/assets").multipart(form));
    (status, json_of(&body))
}

fn blake3_of(bytes: &[u8]) -> String {
    format!("blake3:{}", blake3::hash(bytes).to_hex())
}

#[test]
fn upload_is_201_then_a_dedup_hit_is_200() {
    let server = Server::start();
    let data = b"hello asset".to_vec();
    let (status, first) = post_upload(&server, upload_form("dir/a.txt", &data, None));
    assert_eq!(status, 201, "{}", short(&first));
    assert_eq!(first["created_new"], true);
    for field in [
        "id",
        "hash",
        "size_bytes",
        "content_type",
        "file_path",
        "created_new",
        "created_at",
        "url",
        "url_expires_at",
        "expires_at",
        "job_id",
    ] {
        assert!(first.get(field).is_some(), "asset lacks {field}: {}", short(&first));
    }
    assert_eq!(first["size_bytes"], data.len());
    assert_eq!(first["file_path"], "dir/a.txt");
    assert!(first["hash"].is_null() || first["hash"] == blake3_of(&data).as_str());
    let (status, second) = post_upload(&server, upload_form("b.txt", &data, None));
    assert_eq!(status, 200, "{}", short(&second));
    assert_eq!(second["created_new"], false);
    assert_ne!(second["id"], first["id"]);
    let got: Value = server
        .get(&format!("/api/v2/assets/{}", first["id"].as_str().unwrap()))
        .json()
        .unwrap();
    assert_eq!(got["id"], first["id"]);
    assert_eq!(server.download(got["url"].as_str().unwrap()), data);
}

#[test]
fn wrong_expected_hash_is_409_hash_mismatch() {
    let server = Server::start();
    let data = b"checked".to_vec();
    let (status, body) = post_upload(&server, upload_form("c.txt", &data, Some(&blake3_of(b"other"))));
    assert_eq!(status, 409, "{}", short(&body));
    assert_eq!(body["error"]["code"], "hash_mismatch");
    let (status, body) = post_upload(&server, upload_form("c.txt", &data, Some(&blake3_of(&data))));
    assert_eq!(status, 201, "{}", short(&body));
    assert_eq!(body["hash"], blake3_of(&data).as_str());
}

#[test]
fn from_hash_makes_an_asset_or_answers_blob_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let key = |tenant: &str| support::new_key(dir.path(), tenant);
    let (a, b) = (key("a"), key("b"));
    let server = Server::with(Options {
        args: vec!["--auth".into(), "keys".into()],
        data_dir: Some(dir.path().to_path_buf()),
        token: Some(a.clone()),
        ..Default::default()
    });
    let data = b"shared bytes".to_vec();
    let hash = blake3_of(&data);
    server.upload("s.txt", data.clone());
    let (status, _, body) = send(
        server
            .request(reqwest::Method::POST, "/api/v2/assets/from-hash")
            .json(&json!({"hash": hash, "file_path": "again.txt"})),
    );
    let body = json_of(&body);
    assert_eq!(status, 201, "{}", short(&body));
    assert_eq!(body["file_path"], "again.txt");
    assert_eq!(body["size_bytes"], data.len());
    let (status, _, body) = send(
        server
            .request(reqwest::Method::POST, "/api/v2/assets/from-hash")
            .json(&json!({"hash": blake3_of(b"never uploaded")})),
    );
    assert_eq!(status, 404);
    assert_eq!(json_of(&body)["error"]["code"], "blob_not_found");
    // HEAD by-hash: 200 for the owner, no body.
    let (status, _, body) = send(server.request(reqwest::Method::HEAD, &format!("/api/v2/assets/by-hash/{hash}")));
    assert_eq!(status, 200);
    assert!(body.is_empty());
    // Another tenant: the same blob is not theirs.
    server.set_token(Some(&b));
    let (status, _, body) = send(
        server
            .request(reqwest::Method::POST, "/api/v2/assets/from-hash")
            .json(&json!({"hash": hash})),
    );
    assert_eq!(status, 404);
    assert_eq!(json_of(&body)["error"]["code"], "blob_not_found");
    let (status, _, body) = send(server.request(reqwest::Method::HEAD, &format!("/api/v2/assets/by-hash/{hash}")));
    assert_eq!(status, 404);
    assert!(body.is_empty());
}

#[test]
fn delete_is_204_and_409_asset_in_use_for_a_job_output() {
    let server = Server::start();
    let asset = server.upload("d.txt", b"delete me".to_vec());
    let id = asset["id"].as_str().unwrap();
    let (status, _, body) = send(server.request(reqwest::Method::DELETE, &format!("/api/v2/assets/{id}")));
    assert_eq!(status, 204);
    assert!(body.is_empty());
    let (status, _, body) = send(server.request(reqwest::Method::GET, &format!("/api/v2/assets/{id}")));
    assert_eq!(status, 404);
    assert_eq!(json_of(&body)["error"]["code"], "not_found");
    let (status, _, _) = send(server.request(reqwest::Method::DELETE, &format!("/api/v2/assets/{id}")));
    assert_eq!(status, 404);
    let job = server.run(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "out"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    }));
    let out = job["outputs"][0]["id"].as_str().unwrap();
    let record: Value = server.get(&format!("/api/v2/assets/{out}")).json().unwrap();
    assert_eq!(record["job_id"], job["id"]);
    let (status, _, body) = send(server.request(reqwest::Method::DELETE, &format!("/api/v2/assets/{out}")));
    assert_eq!(status, 409);
    assert_eq!(json_of(&body)["error"]["code"], "asset_in_use");
}

#[test]
fn content_supports_range_206_and_416() {
    let server = Server::start();
    let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    let asset = server.upload("r.bin", data.clone());
    let path = format!("/api/v2/assets/{}/content", asset["id"].as_str().unwrap());
    let (status, headers, body) = send(server.request(reqwest::Method::GET, &path));
    assert_eq!(status, 200);
    assert_eq!(body, data);
    assert_eq!(headers["accept-ranges"], "bytes");
    let (status, headers, body) = send(
        server
            .request(reqwest::Method::GET, &path)
            .header("Range", "bytes=10-19"),
    );
    assert_eq!(status, 206);
    assert_eq!(headers["content-range"], "bytes 10-19/1000");
    assert_eq!(body, &data[10..20]);
    let (status, _, body) = send(server.request(reqwest::Method::GET, &path).header("Range", "bytes=-5"));
    assert_eq!(status, 206);
    assert_eq!(body, &data[995..]);
    let (status, headers, body) = send(
        server
            .request(reqwest::Method::GET, &path)
            .header("Range", "bytes=5000-"),
    );
    assert_eq!(status, 416);
    assert_eq!(headers["content-range"], "bytes */1000");
    assert_eq!(json_of(&body)["error"]["code"], "range_not_satisfiable");
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Sends a multipart upload of `total` bytes by hand (chunked, so the server cannot judge it
/// by its length), reading the response on another thread. Returns (response, peak RSS KiB).
fn stream_upload(server: &Server, total: u64, chunked: bool) -> (String, u64) {
    let addr = server.base.strip_prefix("http://").unwrap().to_string();
    let mut tcp = TcpStream::connect(&addr).unwrap();
    let boundary = "weftboundary7";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file_path\"\r\n\r\nbig.bin\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let length = head.len() as u64 + total + tail.len() as u64;
    let framing = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {length}")
    };
    write!(
        tcp,
        "POST /api/v2/assets HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n{framing}\r\n\r\n"
    )
    .unwrap();
    let mut reader = tcp.try_clone().unwrap();
    let response = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 8192];
        reader.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            if text.contains("\r\n\r\n") && text.trim_end().ends_with('}') {
                break;
            }
        }
        String::from_utf8_lossy(&out).to_string()
    });
    let write = |tcp: &mut TcpStream, bytes: &[u8]| -> std::io::Result<()> {
        if chunked {
            write!(tcp, "{:x}\r\n", bytes.len())?;
            tcp.write_all(bytes)?;
            tcp.write_all(b"\r\n")
        } else {
            tcp.write_all(bytes)
        }
    };
    let mut peak = 0;
    let chunk = vec![0x5au8; 1 << 20];
    let mut sent = 0u64;
    let mut ok = write(&mut tcp, head.as_bytes()).is_ok();
    while ok && sent < total {
        let n = chunk.len().min((total - sent) as usize);
        ok = write(&mut tcp, &chunk[..n]).is_ok();
        sent += n as u64;
        peak = peak.max(rss_kib(server.pid()));
    }
    if ok {
        let _ = write(&mut tcp, tail.as_bytes());
        if chunked {
            let _ = tcp.write_all(b"0\r\n\r\n");
        }
    }
    let text = response.join().unwrap();
    (text, peak.max(rss_kib(server.pid())))
}

#[test]
fn upload_over_the_limit_is_refused_with_413_and_never_buffered() {
    let server = Server::with(Options {
        args: vec!["--max-upload-bytes".into(), "10000000".into()],
        ..Default::default()
    });
    let before = rss_kib(server.pid());
    // Announced length over the limit: refused on the header.
    let (text, _) = stream_upload(&server, 200_000_000, false);
    assert!(text.starts_with("HTTP/1.1 413"), "{}", &text[..text.len().min(300)]);
    assert!(text.contains("\"error\"") && text.contains("\"code\""));
    // Chunked, so the server must stream and count: refused once past the limit.
    let (text, peak) = stream_upload(&server, 200_000_000, true);
    assert!(text.starts_with("HTTP/1.1 413"), "{}", &text[..text.len().min(300)]);
    assert!(text.contains("payload_too_large"));
    let grown_mib = peak.saturating_sub(before) / 1024;
    assert!(
        grown_mib < 60,
        "RSS grew by {grown_mib} MiB while a 200 MB body was sent"
    );
    // Nothing is left behind and the server still works.
    let list = server.upload("small.txt", b"fine".to_vec());
    assert_eq!(list["size_bytes"], 4);
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

#[test]
fn small_outputs_are_kept_in_the_database_and_read_like_any_asset() {
    let server = Server::with(Options {
        args: vec!["--inline-output-kib".into(), "1".into()],
        ..Default::default()
    });
    let blob_path = |hash: &str| {
        let hex = hash.trim_start_matches("blake3:");
        server.data_dir.join("blobs").join(&hex[..2]).join(hex)
    };
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 255}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "small"}}
    }));
    assert_eq!(job["status"], "succeeded", "{}", short(&job));
    let small = &job["outputs"][0];
    let large_job = server.run(json!({
        "1": {"class_type": "SaveText", "inputs": {"text": "x".repeat(4000), "filename_prefix": "large"}}
    }));
    assert_eq!(large_job["status"], "succeeded", "{}", short(&large_job));
    let large = &large_job["outputs"][0];
    let small_hash = small["hash"].as_str().unwrap();
    assert!(small["size_bytes"].as_u64().unwrap() <= 1024, "{small}");
    assert!(!blob_path(small_hash).exists(), "a small output makes no blob file");
    assert!(
        blob_path(large["hash"].as_str().unwrap()).exists(),
        "an output over --inline-output-kib is a blob"
    );

    // Read whole, by range, and through a signed link.
    let png = server.download(small["url"].as_str().unwrap());
    assert_eq!(blake3_of(&png), small_hash);
    let decoded = image::load_from_memory(&png).unwrap().to_rgba8();
    assert_eq!(decoded.dimensions(), (8, 8));
    let content = format!("/api/v2/assets/{}/content", small["id"].as_str().unwrap());
    let (status, headers, body) = send(
        server
            .request(reqwest::Method::GET, &content)
            .header("Range", "bytes=1-3"),
    );
    assert_eq!(status, 206);
    assert_eq!(headers["content-range"], format!("bytes 1-3/{}", png.len()).as_str());
    assert_eq!(body, b"PNG");
    let (status, _, body) = send(
        server
            .request(reqwest::Method::GET, &content)
            .header("Range", "bytes=-4"),
    );
    assert_eq!(status, 206);
    assert_eq!(body, &png[png.len() - 4..]);

    // A later job reads it as an input (a path-needing reader gets a copy).
    let again = server.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": small["id"]}}}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inverted"}}
    }));
    assert_eq!(again["status"], "succeeded", "{}", short(&again));
    let inverted = server.download(again["outputs"][0]["url"].as_str().unwrap());
    let inverted = image::load_from_memory(&inverted).unwrap().to_rgba8();
    let original = decoded.get_pixel(0, 0).0;
    assert_eq!(
        inverted.get_pixel(0, 0).0[..3],
        [255 - original[0], 255 - original[1], 255 - original[2]]
    );

    // Adopted by hash, the new asset has the same bytes, and deleting it leaves the output.
    let (status, _, body) = send(
        server
            .request(reqwest::Method::POST, "/api/v2/assets/from-hash")
            .json(&json!({"hash": small_hash, "file_path": "kept.png"})),
    );
    let adopted = json_of(&body);
    assert_eq!(status, 201, "{}", short(&adopted));
    let adopted_id = adopted["id"].as_str().unwrap();
    let (status, _, body) = send(server.request(reqwest::Method::GET, &format!("/api/v2/assets/{adopted_id}/content")));
    assert_eq!(status, 200);
    assert_eq!(body, png);
    let (status, _, _) = send(server.request(reqwest::Method::DELETE, &format!("/api/v2/assets/{adopted_id}")));
    assert_eq!(status, 204);
    let (status, _, body) = send(server.request(reqwest::Method::GET, &content));
    assert_eq!(status, 200);
    assert_eq!(body, png);
    assert!(
        files_under(&server.data_dir.join("blobs"))
            .iter()
            .all(|f| !f.to_string_lossy().contains(small_hash.trim_start_matches("blake3:"))),
        "no blob was made for the small output along the way"
    );
}
