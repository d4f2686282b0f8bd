//! Shared harness of the black-box tests: start the real `weft` binary on a free port with
//! a temporary data dir, talk HTTP to it, and build the test plugins.

#![allow(dead_code)]

pub(crate) mod browser;
pub(crate) mod parity;
pub(crate) mod postgres;
pub(crate) mod records;
pub(crate) mod specs;
pub(crate) mod sse;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Repository root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Writes a tiny random-weight SD1 checkpoint to `path` with `weft models tiny-sd --seed`.
pub(crate) fn tiny_checkpoint(path: &Path, seed: u64) {
    tiny_model("tiny-sd", path, seed);
}

/// Writes a tiny random-weight model file to `path` with `weft models <command> --seed`
/// (`tiny-sd`, `tiny-sdxl`, `tiny-sdxl-refiner`, ...).
pub(crate) fn tiny_model(command: &str, path: &Path, seed: u64) {
    let status = Command::new(weft_bin())
        .args(["models", command, "--seed", &seed.to_string(), "--out"])
        .arg(path)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models {command} failed");
}

/// A server over the ComfyUI-style models folder `dir`, with the node cache off (every run
/// computes).
pub(crate) fn models_server(dir: &Path) -> Server {
    Server::with(Options {
        args: vec![
            "--models-dir".into(),
            dir.display().to_string(),
            "--cache-mib".into(),
            "0".into(),
        ],
        ..Default::default()
    })
}

/// Runs `graph`, asserting it succeeds, and returns each output's file name and bytes, the
/// PNGs first.
pub(crate) fn run_outputs(server: &Server, graph: Value) -> Vec<(String, Vec<u8>)> {
    let job = server.run(graph);
    assert_eq!(job["status"], "succeeded", "{job}");
    let mut files: Vec<(String, Vec<u8>)> = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let name = o["filename"].as_str().or(o["name"].as_str()).unwrap_or("").to_string();
            (name, server.download(o["url"].as_str().unwrap()))
        })
        .collect();
    files.sort_by_key(|(name, _)| !name.ends_with(".png"));
    files
}

/// The weft binary under test.
pub(crate) fn weft_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_weft"))
}

/// A running server, killed on drop.
pub(crate) struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its data dir (kept alive with the server unless `data` was given).
    pub data_dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    /// The HTTP client.
    pub http: reqwest::blocking::Client,
    /// Bearer token sent with every request, if any.
    token: std::sync::Mutex<Option<String>>,
}

/// How to start a server.
#[derive(Default, Clone)]
pub(crate) struct Options {
    /// Extra `weft serve` arguments.
    pub args: Vec<String>,
    /// Existing data dir (for restart tests).
    pub data_dir: Option<PathBuf>,
    /// Plugins dir.
    pub plugins_dir: Option<PathBuf>,
    /// Token to send.
    pub token: Option<String>,
    /// File the server's log (stderr, at `info`) goes to, instead of the test's stderr.
    pub log_file: Option<PathBuf>,
    /// `--database` (default: the data dir's own SQLite store, or with
    /// `WEFT_TEST_STORE=postgres` a fresh PostgreSQL database kept with the data dir).
    pub database: Option<String>,
    /// Extra environment variables (for example `AWS_*` for an S3 blob store).
    pub env: Vec<(String, String)>,
}

/// The file in a data dir that names the PostgreSQL database its tests use.
const TEST_DATABASE_FILE: &str = "test-database-url";

/// Whether the black-box tests run against PostgreSQL (`WEFT_TEST_STORE=postgres`).
pub(crate) fn on_postgres() -> bool {
    std::env::var("WEFT_TEST_STORE").is_ok_and(|s| s == "postgres")
}

/// The `--database` arguments for a server or command on `data_dir`: none with SQLite;
/// with `WEFT_TEST_STORE=postgres`, the data dir's database, made on first use.
pub(crate) fn database_args(data_dir: &Path) -> Vec<String> {
    if !on_postgres() {
        return Vec::new();
    }
    let file = data_dir.join(TEST_DATABASE_FILE);
    let url = match std::fs::read_to_string(&file) {
        Ok(url) => url.trim().to_string(),
        Err(_) => {
            let url = postgres::fresh_database();
            std::fs::create_dir_all(data_dir).unwrap();
            std::fs::write(&file, &url).unwrap();
            url
        }
    };
    vec!["--database".into(), url]
}

impl Server {
    /// Starts `weft serve` with default options.
    pub(crate) fn start() -> Server {
        Self::with(Options::default())
    }

    /// Starts `weft serve` with `options`, waiting until it is ready.
    pub(crate) fn with(options: Options) -> Server {
        let (temp, data_dir) = match options.data_dir.clone() {
            Some(d) => (None, d),
            None => {
                let t = tempfile::tempdir().unwrap();
                let d = t.path().to_path_buf();
                (Some(t), d)
            }
        };
        let mut cmd = Command::new(weft_bin());
        cmd.arg("serve")
            .arg("--addr")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir);
        if let Some(p) = &options.plugins_dir {
            cmd.arg("--plugins-dir").arg(p);
        }
        match &options.database {
            Some(database) => {
                cmd.arg("--database").arg(database);
            }
            None => {
                cmd.args(database_args(&data_dir));
                if on_postgres() {
                    // Short leases: a killed server's jobs are rescued soon after a restart.
                    cmd.args(["--lease-secs", "2"]);
                }
            }
        }
        cmd.args(&options.args)
            .env("WEFT_COMPILE_CACHE", compile_cache())
            .envs(options.env.iter().cloned())
            .stdout(Stdio::piped());
        match &options.log_file {
            Some(path) => cmd
                .stderr(std::fs::File::create(path).expect("creating the log file"))
                .env("WEFT_LOG", "info"),
            None => cmd.stderr(Stdio::inherit()).env("WEFT_LOG", "warn"),
        };
        let mut child = cmd.spawn().expect("starting weft");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(rest) = line.strip_prefix("weft listening on ") {
                        break rest.trim().to_string();
                    }
                }
                _ => {
                    let status = child.wait().unwrap();
                    panic!("weft exited before listening: {status}");
                }
            }
        };
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let mut server = Server {
            child,
            base,
            data_dir,
            _temp: temp,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap(),
            token: std::sync::Mutex::new(options.token),
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("weft exited while starting: {status}");
            }
            if let Ok(r) = self.http.get(format!("{}/healthz", self.base)).send() {
                if r.status().as_u16() == 200 {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("weft did not become ready");
    }

    /// `base + path` (an absolute URL is returned as it is).
    pub(crate) fn url(&self, path: &str) -> String {
        if path.starts_with("http://") || path.starts_with("https://") {
            return path.to_string();
        }
        format!("{}{}", self.base, path)
    }

    fn auth(&self, rb: reqwest::blocking::RequestBuilder) -> reqwest::blocking::RequestBuilder {
        match self.token.lock().unwrap().as_ref() {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Sends `token` (or none) as the bearer token from now on.
    pub(crate) fn set_token(&self, token: Option<&str>) {
        *self.token.lock().unwrap() = token.map(String::from);
    }

    /// GET `path`.
    pub(crate) fn get(&self, path: &str) -> reqwest::blocking::Response {
        self.auth(self.http.get(self.url(path))).send().unwrap()
    }

    /// POST JSON to `path`.
    pub(crate) fn post(&self, path: &str, body: &Value) -> reqwest::blocking::Response {
        self.auth(self.http.post(self.url(path)).json(body)).send().unwrap()
    }

    /// A request builder with auth.
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        self.auth(self.http.request(method, self.url(path)))
    }

    /// Submits `workflow`, asserting 201, returning the job.
    pub(crate) fn submit(&self, workflow: Value) -> Value {
        let r = self.post("/api/v2/jobs", &json!({ "workflow": workflow }));
        let status = r.status().as_u16();
        let body: Value = r.json().unwrap();
        assert_eq!(status, 201, "submit failed: {body}");
        body
    }

    /// Polls job `id` until it is terminal, returning it.
    pub(crate) fn wait(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(240);
        loop {
            let job: Value = self.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
            let status = job["status"].as_str().unwrap_or("").to_string();
            if matches!(status.as_str(), "succeeded" | "failed" | "canceled" | "expired") {
                return job;
            }
            assert!(Instant::now() < deadline, "job {id} did not finish: {job}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Submits and waits.
    pub(crate) fn run(&self, workflow: Value) -> Value {
        let job = self.submit(workflow);
        self.wait(job["id"].as_str().unwrap())
    }

    /// Downloads an output or asset by its `url` (host-relative).
    pub(crate) fn download(&self, url: &str) -> Vec<u8> {
        let r = self.http.get(self.url(url)).send().unwrap();
        assert_eq!(r.status().as_u16(), 200, "download of {url} failed");
        r.bytes().unwrap().to_vec()
    }

    /// Uploads `bytes` as an asset named `name`, returning the asset record.
    pub(crate) fn upload(&self, name: &str, bytes: Vec<u8>) -> Value {
        let (status, body) = self.try_upload(name, bytes);
        assert!(status == 201 || status == 200, "upload failed: {status} {body}");
        body
    }

    /// Uploads `bytes` as an asset named `name`: the answer's status and body.
    pub(crate) fn try_upload(&self, name: &str, bytes: Vec<u8>) -> (u16, Value) {
        let form = reqwest::blocking::multipart::Form::new()
            .part(
                "file",
                reqwest::blocking::multipart::Part::bytes(bytes).file_name(name.to_string()),
            )
            .text("file_path", name.to_string());
        let r = self
            .request(reqwest::Method::POST, "/api/v2/assets")
            .multipart(form)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json().unwrap())
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server hard (SIGKILL) and waits for it.
    pub(crate) fn kill(mut self) -> PathBuf {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = self.data_dir.clone();
        if let Some(t) = self._temp.take() {
            // Keep the data dir for a restart.
            let _ = t.keep();
        }
        dir
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the hostile test plugins (a no-op when up to date) and returns the directory of
/// their components.
pub(crate) fn test_plugins_dir() -> PathBuf {
    let status = Command::new(root().join("scripts/build-wasm.sh"))
        .arg("test")
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "building the test plugins failed");
    root().join("target/wasm/wasm32-wasip2/release")
}

/// A plugins dir holding only the named components from the test build.
pub(crate) fn plugins_with(names: &[&str]) -> tempfile::TempDir {
    let built = test_plugins_dir();
    let dir = tempfile::tempdir().unwrap();
    for name in names {
        let file = format!("{name}.wasm");
        std::fs::copy(built.join(&file), dir.path().join(&file)).unwrap_or_else(|e| panic!("copying {file}: {e}"));
    }
    dir
}

/// The error envelope's code.
pub(crate) fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// Creates an API key for `tenant` in `data_dir` with `weft keys create`, returning the key
/// (printed on the command's last line).
pub(crate) fn new_key(data_dir: &Path, tenant: &str) -> String {
    let out = Command::new(weft_bin())
        .args(["keys", "create", "--tenant", tenant, "--data-dir"])
        .arg(data_dir)
        .args(database_args(data_dir))
        .output()
        .unwrap();
    assert!(out.status.success(), "weft keys create failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .to_string()
}

/// A server with the counter test plugin (`SlowCounter`, `PoliteCounter`) and `args`; keep
/// the returned directory alive as long as the server.
pub(crate) fn slow_server(args: &[&str]) -> (Server, tempfile::TempDir) {
    let plugins = plugins_with(&["weft_test_counter"]);
    let server = Server::with(Options {
        args: args.iter().map(|s| s.to_string()).collect(),
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    (server, plugins)
}

/// Waits (up to 20 s) until job `id` runs and has reported a step.
pub(crate) fn wait_running(server: &Server, id: &str) {
    for _ in 0..4000 {
        let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
        if job["status"] == "running" && job["progress"]["step"].is_u64() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("job {id} never ran");
}

/// Node `1` of `class` (with `inputs`) feeding a `PreviewAny` output node `2`.
pub(crate) fn single(class: &str, inputs: Value) -> Value {
    json!({
        "1": {"class_type": class, "inputs": inputs},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    })
}

/// Asserts that `job` failed with error `code`, blamed on node `node_id`.
pub(crate) fn assert_failed_at_node(job: &Value, code: &str, node_id: &str) {
    assert_eq!(job["status"], "failed", "{job}");
    assert_eq!(job["error"]["code"], code, "{job}");
    assert_eq!(job["error"]["node_id"], node_id, "{job}");
}

/// Asserts that `job`, a [`single`] workflow, failed with error `code` in its node `1`, of
/// class `class`, with a message.
pub(crate) fn assert_single_failed_in_class(job: &Value, code: &str, class: &str) {
    assert_failed_at_node(job, code, "1");
    assert_eq!(job["error"]["class_type"], class, "{job}");
    assert!(!job["error"]["message"].as_str().unwrap_or("").is_empty(), "{job}");
}

/// A workflow that counts for `seconds` (`SlowCounter` from the counter test plugin, see
/// [`slow_server`]) and previews the count.
pub(crate) fn slow_workflow(seconds: f64) -> Value {
    json!({
        "1": {"class_type": "SlowCounter", "inputs": {"seconds": seconds}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    })
}

/// A client that keeps no cookies and follows no redirects.
pub(crate) fn raw_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Logs in to the dashboard over HTTP with `key` and returns the `weft_session=...` cookie
/// pair.
pub(crate) fn session_cookie(server: &Server, key: &str) -> String {
    let r = raw_client()
        .post(server.url("/login"))
        .header("Origin", &server.base)
        .form(&[("key", key), ("next", "/")])
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "cookie lacks {attribute}: {set}");
    }
    set.split(';').next().unwrap().to_string()
}

/// The compiled-code cache every test server shares (`--compile-cache`), so that a server
/// with a fresh data dir does not compile the built-in plugins again: seconds of CPU each.
pub(crate) fn compile_cache() -> PathBuf {
    root().join("target/test-compile-cache")
}
