//! Black-box test of `/healthz` when the store cannot write: the data directory is a small
//! tmpfs that is filled up under the running server, as a full disk would be.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use support::{Options, Server};

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u32) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "mounting a tmpfs failed (the test runs as root, as CI does)"
        );
        Tmpfs {
            path: dir.path().to_path_buf(),
            _dir: dir,
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Writes to `path` until the file system is full.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.flush();
}

fn health(server: &Server) -> (u16, Value) {
    let r = server.http.get(server.url("/healthz")).send().unwrap();
    (r.status().as_u16(), r.json().unwrap())
}

fn text_job() -> Value {
    json!({"workflow": {
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    }})
}

#[test]
fn healthz_reports_a_store_that_cannot_write_until_it_can_again() {
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"));
    if !matches!(is_root, Ok(true)) {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    if support::on_postgres() {
        eprintln!("skipped: the disk filled here holds the SQLite store; PostgreSQL keeps its data elsewhere");
        return;
    }
    let disk = Tmpfs::mount(256);
    let server = Server::with(Options {
        data_dir: Some(disk.path.join("data")),
        ..Default::default()
    });
    let (status, body) = health(&server);
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")), "{body}");
    assert_eq!(body["store"]["writer_running"], true, "{body}");
    assert_eq!(body["workers"]["running"], body["workers"]["configured"], "{body}");

    let filler = disk.path.join("filler");
    fill(&filler);
    let refused = server.post("/api/v2/jobs", &text_job());
    assert_ne!(refused.status().as_u16(), 201, "a job was accepted on a full disk");
    let (status, body) = health(&server);
    assert_eq!((status, body["status"].as_str()), (503, Some("failing")), "{body}");
    let failing = body["store"]["failing"].as_str().unwrap_or_default();
    assert!(failing.contains("full"), "{body}");

    std::fs::remove_file(&filler).unwrap();
    let r = server.post("/api/v2/jobs", &text_job());
    assert_eq!(r.status().as_u16(), 201);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait(&id)["status"], "succeeded");
    let (status, body) = health(&server);
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")), "{body}");
    drop(server);
}
