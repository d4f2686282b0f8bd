//! Black-box tests of the graceful shutdown: on SIGTERM the server takes no new job, lets
//! the running ones finish within `--shutdown-grace-secs`, queues again (with its claim
//! released) a job still running after it, and exits 0; a second SIGTERM exits at once.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{slow_workflow, Options, Server};

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

const SIGTERM: i32 = 15;

/// A `weft serve` under test, started here rather than by [`Server`] so that it can be
/// signalled and its exit status read. Killed on drop if still running.
struct Serving {
    child: Child,
    base: String,
    http: reqwest::blocking::Client,
}

impl Serving {
    /// Starts `weft serve` on `data_dir` with the counter test plugin in `plugins` and
    /// `args`, waiting until it is ready.
    fn start(data_dir: &Path, plugins: &Path, args: &[&str]) -> Serving {
        let mut child = Command::new(support::weft_bin())
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .arg("--plugins-dir")
            .arg(plugins)
            .args(support::database_args(data_dir))
            .args(args)
            .env("WEFT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting weft");
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(rest) = line.strip_prefix("weft listening on ") {
                        break rest.trim().to_string();
                    }
                }
                _ => panic!("weft exited before listening: {:?}", child.wait()),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        let serving = Serving {
            child,
            base,
            http: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !serving.get("/healthz").is_some_and(|r| r.status().is_success()) {
            assert!(Instant::now() < deadline, "weft did not become ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        serving
    }

    fn get(&self, path: &str) -> Option<reqwest::blocking::Response> {
        self.http.get(format!("{}{path}", self.base)).send().ok()
    }

    /// Job `id` as the server reads it.
    fn job(&self, id: &str) -> Value {
        self.get(&format!("/api/v2/jobs/{id}")).unwrap().json().unwrap()
    }

    /// Submits `workflow`, asserting 201; the job's id.
    fn submit(&self, workflow: Value) -> String {
        let r = self
            .http
            .post(format!("{}/api/v2/jobs", self.base))
            .json(&serde_json::json!({ "workflow": workflow }))
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 201, "submit failed");
        r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string()
    }

    /// Waits (up to 60 s) until job `id` runs and has reported a step.
    fn wait_running(&self, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let job = self.job(id);
            if job["status"] == "running" && job["progress"]["step"].is_u64() {
                return;
            }
            assert!(Instant::now() < deadline, "job {id} never ran: {job}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM.
    fn sigterm(&self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill has no memory preconditions; the pid is our child's, not yet waited for.
        let rc = unsafe { libc_kill(pid, SIGTERM) };
        assert_eq!(rc, 0, "kill failed: {}", std::io::Error::last_os_error());
    }

    /// Whether it is still running.
    fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits (up to `within`) for it to exit; its status.
    fn exit_status(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "weft did not exit within {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A data dir kept after its servers stop (for the restart), with the counter plugin.
fn setup() -> (tempfile::TempDir, tempfile::TempDir) {
    (
        tempfile::tempdir().unwrap(),
        support::plugins_with(&["weft_test_counter"]),
    )
}

/// Restarts on `data_dir` with a lease of 600 s: a job that ran here again at once was not
/// held by a claim left behind.
fn restart(data_dir: &Path, plugins: &Path) -> Server {
    Server::with(Options {
        data_dir: Some(data_dir.to_path_buf()),
        plugins_dir: Some(plugins.to_path_buf()),
        args: ["--lease-secs", "600"].map(String::from).to_vec(),
        ..Default::default()
    })
}

/// The stored status of job `id` in the SQLite store of `data_dir`, read with no server
/// running (none with PostgreSQL).
fn stored_status(data_dir: &Path, id: &str) -> Option<String> {
    if support::on_postgres() {
        return None;
    }
    let db: PathBuf = data_dir.join("weft.db");
    let conn = rusqlite::Connection::open(db).unwrap();
    Some(
        conn.query_row("SELECT status FROM jobs WHERE id = ?1", [id], |row| row.get(0))
            .unwrap(),
    )
}

#[test]
fn sigterm_lets_a_running_job_finish_within_the_grace_period_and_exits_zero() {
    let (data, plugins) = setup();
    let mut server = Serving::start(
        data.path(),
        plugins.path(),
        &["--shutdown-grace-secs", "60", "--lease-secs", "600"],
    );
    let id = server.submit(slow_workflow(1.5));
    server.wait_running(&id);
    server.sigterm();
    // During the grace period the server still answers, and the job runs on.
    std::thread::sleep(Duration::from_millis(200));
    assert!(server.is_running(), "the server exited before its job finished");
    assert_eq!(server.job(&id)["status"], "running");
    let status = server.exit_status(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "a graceful shutdown exits 0: {status}");
    drop(server);
    let server = restart(data.path(), plugins.path());
    let job: Value = server.get(&format!("/api/v2/jobs/{id}")).json().unwrap();
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(
        job["outputs"].as_array().map(Vec::len),
        Some(1),
        "its output is committed: {job}"
    );
}

#[test]
fn sigterm_releases_the_claim_of_a_job_past_the_grace_period_so_a_restart_runs_it_at_once() {
    let (data, plugins) = setup();
    let mut server = Serving::start(
        data.path(),
        plugins.path(),
        &["--shutdown-grace-secs", "1", "--lease-secs", "600"],
    );
    let id = server.submit(slow_workflow(4.0));
    server.wait_running(&id);
    server.sigterm();
    let status = server.exit_status(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "a graceful shutdown exits 0: {status}");
    drop(server);
    if let Some(stored) = stored_status(data.path(), &id) {
        assert_eq!(stored, "queued", "the interrupted job is queued again");
    }
    // Run again from the start, long before the 600 s lease could have lapsed.
    let server = restart(data.path(), plugins.path());
    let began = Instant::now();
    let job = server.wait(&id);
    assert_eq!(job["status"], "succeeded", "{job}");
    assert!(
        began.elapsed() < Duration::from_secs(120),
        "the job waited for a lease: {:?}",
        began.elapsed()
    );
    assert!(job["error"].is_null(), "{job}");
    assert_eq!(job["progress"]["nodes_done"], job["progress"]["nodes_total"], "{job}");
}

#[test]
fn a_job_submitted_during_the_grace_period_is_accepted_and_runs_after_a_restart() {
    let (data, plugins) = setup();
    let mut server = Serving::start(
        data.path(),
        plugins.path(),
        &["--shutdown-grace-secs", "60", "--workers", "2", "--lease-secs", "600"],
    );
    let running = server.submit(slow_workflow(2.0));
    server.wait_running(&running);
    server.sigterm();
    std::thread::sleep(Duration::from_millis(200));
    // Accepted durably, but not started here: a free worker takes no new job while draining.
    let late = server.submit(slow_workflow(0.1));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.job(&late)["status"], "queued");
    let status = server.exit_status(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{status}");
    drop(server);
    let server = restart(data.path(), plugins.path());
    assert_eq!(server.wait(&running)["status"], "succeeded");
    assert_eq!(server.wait(&late)["status"], "succeeded");
}

#[test]
fn a_second_sigterm_exits_at_once() {
    let (data, plugins) = setup();
    let mut server = Serving::start(
        data.path(),
        plugins.path(),
        &["--shutdown-grace-secs", "600", "--lease-secs", "600"],
    );
    let id = server.submit(slow_workflow(600.0));
    server.wait_running(&id);
    server.sigterm();
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.is_running(), "the first SIGTERM waits for the running job");
    server.sigterm();
    let status = server.exit_status(Duration::from_secs(10));
    assert_eq!(status.code(), Some(128 + SIGTERM), "{status}");
}
