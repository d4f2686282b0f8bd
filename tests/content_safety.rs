//! Black-box tests of what the server hands to browsers and clients: uploads and plugin
//! outputs cannot act as pages of the API's origin, a plugin cannot choose a path as an
//! output's name, metrics are the operator's when authentication is on, and signed links
//! never trust the request's `Host`.

mod support;

use serde_json::{json, Value};
use support::{error_code, Options, Server};

/// Uploads `bytes` as `name` with the part's media type `content_type`.
fn upload_typed(server: &Server, name: &str, content_type: &str, bytes: &[u8]) -> Value {
    let part = reqwest::blocking::multipart::Part::bytes(bytes.to_vec())
        .file_name(name.to_string())
        .mime_str(content_type)
        .unwrap();
    let form = reqwest::blocking::multipart::Form::new().part("file", part);
    let r = server
        .request(reqwest::Method::POST, "/api/v2/assets")
        .multipart(form)
        .send()
        .unwrap();
    assert!(r.status().is_success(), "upload failed: {}", r.status());
    r.json().unwrap()
}

/// The headers of `GET url`.
fn content_headers(server: &Server, url: &str) -> reqwest::header::HeaderMap {
    let r = server.request(reqwest::Method::GET, url).send().unwrap();
    assert_eq!(r.status().as_u16(), 200, "GET {url}");
    r.headers().clone()
}

fn header<'a>(headers: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    headers.get(name).map_or("", |v| v.to_str().unwrap())
}

#[test]
fn uploads_are_served_with_nosniff_in_a_sandbox_and_unsafe_types_as_attachments() {
    let server = Server::start();
    for (name, content_type, disposition) in [
        ("page.html", "text/html", "attachment"),
        ("drawing.svg", "image/svg+xml", "attachment"),
        ("feed.xml", "application/xml", "attachment"),
        ("app.js", "text/javascript", "attachment"),
        ("notes.txt", "text/plain", "inline"),
        ("pixel.png", "image/png", "inline"),
    ] {
        let asset = upload_typed(&server, name, content_type, b"<script>alert(document.domain)</script>");
        let id = asset["id"].as_str().unwrap();
        let headers = content_headers(&server, &format!("/api/v2/assets/{id}/content"));
        assert_eq!(header(&headers, "x-content-type-options"), "nosniff", "{name}");
        assert!(
            header(&headers, "content-security-policy").starts_with("sandbox"),
            "{name}: {headers:?}"
        );
        let got = header(&headers, "content-disposition");
        assert!(got.starts_with(disposition), "{name}: {got}");
    }
}

#[test]
fn a_plugin_output_cannot_name_a_path_or_be_served_as_a_page() {
    let plugins = support::plugins_with(&["weft_test_loud"]);
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    let done = server.run(json!({"1": {"class_type": "HostileFileName", "inputs": {
        "content": "<script>alert(document.domain)</script>",
        "extension": "png/../../../etc/x",
        "content_type": "text/html"
    }}}));
    assert_eq!(done["status"], "succeeded", "{done}");
    let output = &done["outputs"][0];
    let name = output["name"].as_str().unwrap();
    assert_eq!(name, "ok_00001_.bin", "the guest's extension reached the name");
    let headers = content_headers(&server, output["url"].as_str().unwrap());
    assert!(header(&headers, "content-disposition").starts_with("attachment"));
    assert_eq!(header(&headers, "x-content-type-options"), "nosniff");
    assert!(header(&headers, "content-security-policy").starts_with("sandbox"));
    // A plain extension of the guest's is kept.
    let done = server.run(json!({"1": {"class_type": "HostileFileName",
        "inputs": {"extension": "webp", "content_type": "image/webp", "content": "x"}}}));
    assert_eq!(done["outputs"][0]["name"], "ok_00001_.webp");
}

#[test]
fn metrics_need_the_operator_token_when_authentication_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let tenant = support::new_key(dir.path(), "t");
    let server = Server::with(Options {
        args: vec!["--auth".into(), "keys".into(), "--admin-token".into(), "ADM".into()],
        data_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    });
    let r = server.get("/metrics");
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(error_code(&r.json().unwrap()), "unauthorized");
    server.set_token(Some(&tenant));
    let r = server.get("/metrics");
    assert_eq!(r.status().as_u16(), 403, "a tenant reads every tenant's counts");
    server.set_token(Some("ADM"));
    let r = server.get("/metrics");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().unwrap().contains("weft_jobs{status="));
}

#[test]
fn metrics_are_refused_under_authentication_without_an_operator_token() {
    let server = Server::with(Options {
        args: vec!["--auth".into(), "token".into(), "--token".into(), "T".into()],
        token: Some("T".into()),
        ..Default::default()
    });
    assert_eq!(server.get("/metrics").status().as_u16(), 403);
}

fn text_workflow(text: &str) -> Value {
    json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": text}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    })
}

#[test]
fn signed_links_ignore_the_host_header() {
    let server = Server::start();
    let done = server.run(text_workflow("h"));
    let id = done["id"].as_str().unwrap();
    let r = server
        .request(reqwest::Method::GET, &format!("/api/v2/jobs/{id}"))
        .header("host", "evil.example")
        .header("x-forwarded-proto", "https")
        .send()
        .unwrap();
    let job: Value = r.json().unwrap();
    let url = job["outputs"][0]["url"].as_str().unwrap();
    assert!(url.starts_with(&format!("{}/api/v2/assets/", server.base)), "{url}");
    assert!(!url.contains("evil.example"), "{url}");
}

#[test]
fn signed_links_use_the_public_url_when_one_is_set() {
    let server = Server::with(Options {
        args: vec!["--public-url".into(), "https://weft.example.com".into()],
        ..Default::default()
    });
    let done = server.run(text_workflow("p"));
    let url = done["outputs"][0]["url"].as_str().unwrap();
    assert!(url.starts_with("https://weft.example.com/api/v2/assets/"), "{url}");
    let local = url.replacen("https://weft.example.com", &server.base, 1);
    assert_eq!(server.download(&local), b"p");
}

#[test]
fn a_public_url_with_a_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(support::weft_bin())
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--public-url",
            "https://x.example/a?b",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("WEFT_LOG", "off")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--public-url"));
}
