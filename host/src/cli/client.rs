//! The HTTP side of the client commands: one connection to a weft server (base URL and
//! credentials), its requests, and how their failures map to exit codes.

use std::path::Path;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value as Json};

/// Exit codes of the client commands (`weft run`, `weft jobs`, `weft assets`).
pub(crate) mod exit {
    /// The command did what it was asked; for a job, it succeeded.
    pub(crate) const OK: i32 = 0;
    /// An unexpected failure (a server error, a file that cannot be written, ...).
    pub(crate) const OTHER: i32 = 1;
    /// The job failed.
    pub(crate) const JOB_FAILED: i32 = 3;
    /// The job was canceled (or expired before it ran).
    pub(crate) const JOB_CANCELED: i32 = 4;
    /// The request was refused as invalid: a workflow that does not validate, an unknown
    /// job, a bad argument.
    pub(crate) const VALIDATION: i32 = 5;
    /// The server could not be reached, or the connection was lost for good.
    pub(crate) const CONNECTION: i32 = 6;
    /// The server refused the credentials (401, 403).
    pub(crate) const AUTH: i32 = 7;
    /// Interrupted with Ctrl-C, the job left running.
    pub(crate) const INTERRUPTED: i32 = 130;
}

/// Why a client command failed.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The exit code.
    pub(crate) code: i32,
    /// What went wrong, for people.
    pub(crate) message: String,
    /// The server's error envelope, when it sent one.
    pub(crate) body: Option<Json>,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            body: None,
        }
    }

    /// A refused request or argument.
    pub(crate) fn validation(message: impl Into<String>) -> Self {
        Self::new(exit::VALIDATION, message)
    }

    fn connection(e: reqwest::Error) -> Self {
        Self::new(exit::CONNECTION, format!("cannot reach the server: {e}"))
    }

    /// Whether retrying the same request may help.
    pub(crate) fn is_connection(&self) -> bool {
        self.code == exit::CONNECTION
    }

    /// The failure as `--json` prints it.
    pub(crate) fn to_json(&self) -> Json {
        match &self.body {
            Some(body) if body.get("error").is_some() => body.clone(),
            _ => json!({"error": {"code": "client_error", "message": self.message}}),
        }
    }

    /// Prints the failure (as JSON on stdout with `--json`, else on stderr) and returns
    /// its exit code.
    pub(crate) fn report(&self, json_output: bool) -> i32 {
        if json_output {
            println!("{}", self.to_json());
        } else {
            eprintln!("error: {}", self.message);
            if let Some(nodes) = self
                .body
                .as_ref()
                .and_then(|b| b["error"]["details"]["node_errors"].as_object())
            {
                for (node, errors) in nodes {
                    for error in errors.as_array().into_iter().flatten() {
                        let message = error["message"].as_str().unwrap_or("invalid");
                        eprintln!("  node {node}: {message}");
                    }
                }
            }
        }
        self.code
    }
}

/// A failure from an HTTP error response.
fn from_response(status: StatusCode, body: Json) -> Failure {
    let code = match status.as_u16() {
        401 | 403 => exit::AUTH,
        400..=499 if status != StatusCode::TOO_MANY_REQUESTS => exit::VALIDATION,
        _ => exit::OTHER,
    };
    let message = match (body["error"]["code"].as_str(), body["error"]["message"].as_str()) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        _ => format!("the server answered {status}"),
    };
    Failure {
        code,
        message,
        body: Some(body),
    }
}

/// A connection to one server.
pub(crate) struct Connection {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

impl Connection {
    /// A connection to `server` (`http(s)://host[:port][/mount-prefix]`) with `key`.
    pub(crate) fn new(server: &str, key: Option<String>) -> Result<Self, Failure> {
        let url = url::Url::parse(server).map_err(|e| Failure::validation(format!("--server {server:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Failure::validation(format!(
                "--server {server:?} must be an http(s) URL"
            )));
        }
        // https on Mozilla's roots, with the ring provider the server side uses too.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| Failure::new(exit::OTHER, format!("building the HTTP client: {e}")))?;
        Ok(Self {
            base: server.trim_end_matches('/').to_string(),
            key: key.filter(|k| !k.is_empty()),
            http,
        })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, format!("{}/api/v2{path}", self.base));
        match &self.key {
            Some(key) => rb.bearer_auth(key),
            None => rb,
        }
    }

    async fn finish(rb: reqwest::RequestBuilder) -> Result<Json, Failure> {
        let response = rb.send().await.map_err(Failure::connection)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(Failure::connection)?;
        let body: Json = serde_json::from_slice(&bytes).unwrap_or(Json::Null);
        if status.is_success() {
            Ok(body)
        } else {
            Err(from_response(status, body))
        }
    }

    /// `GET path` (under `/api/v2`), as JSON.
    pub(crate) async fn get(&self, path: &str) -> Result<Json, Failure> {
        Self::finish(self.request(Method::GET, path).timeout(Duration::from_secs(60))).await
    }

    /// `POST path` with a JSON `body` and optional `Idempotency-Key`.
    pub(crate) async fn post(&self, path: &str, body: &Json, idempotency_key: Option<&str>) -> Result<Json, Failure> {
        let mut rb = self
            .request(Method::POST, path)
            .json(body)
            .timeout(Duration::from_secs(120));
        if let Some(key) = idempotency_key {
            rb = rb.header("Idempotency-Key", key);
        }
        Self::finish(rb).await
    }

    /// Uploads `file` as an asset.
    pub(crate) async fn upload(&self, file: &Path) -> Result<Json, Failure> {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "upload".into());
        let bytes = tokio::fs::read(file)
            .await
            .map_err(|e| Failure::validation(format!("cannot read {}: {e}", file.display())))?;
        let form = reqwest::multipart::Form::new()
            .part("file", reqwest::multipart::Part::bytes(bytes).file_name(name.clone()))
            .text("file_path", name);
        Self::finish(self.request(Method::POST, "/assets").multipart(form)).await
    }

    /// Opens job `id`'s event stream, resuming after `last_event_id`.
    pub(crate) async fn events(&self, id: &str, last_event_id: Option<&str>) -> Result<reqwest::Response, Failure> {
        let mut rb = self
            .request(Method::GET, &format!("/jobs/{id}/events"))
            .header("Accept", "text/event-stream");
        if let Some(last) = last_event_id {
            rb = rb.header("Last-Event-ID", last);
        }
        let response = rb.send().await.map_err(Failure::connection)?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.json().await.unwrap_or(Json::Null);
        Err(from_response(status, body))
    }

    /// Downloads `url` (a signed content link) into `dest`.
    pub(crate) async fn download(&self, url: &str, dest: &Path) -> Result<(), Failure> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let response = self.http.get(url).send().await.map_err(Failure::connection)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.json().await.unwrap_or(Json::Null);
            return Err(from_response(status, body));
        }
        let write_error = |e: std::io::Error| Failure::new(exit::OTHER, format!("writing {}: {e}", dest.display()));
        let mut file = tokio::fs::File::create(dest).await.map_err(write_error)?;
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            file.write_all(&chunk.map_err(Failure::connection)?)
                .await
                .map_err(write_error)?;
        }
        file.flush().await.map_err(write_error)?;
        Ok(())
    }
}

/// The exit code of a job that ended in `status`.
pub(crate) fn status_exit_code(status: &str) -> i32 {
    match status {
        "succeeded" => exit::OK,
        "failed" => exit::JOB_FAILED,
        "canceled" | "expired" => exit::JOB_CANCELED,
        _ => exit::OTHER,
    }
}
