//! A throw-away PostgreSQL for the tests. The first test of a run that needs one starts a
//! cluster (`initdb` into a temp dir, `postgres` on a free port and a private socket dir,
//! as the `postgres` user when running as root, since PostgreSQL refuses root); the later
//! tests of the run (every test binary, every test process) share it, each with a database
//! of its own. A watchdog stops the cluster and removes its directory a few seconds after
//! the last test process using it has exited. `WEFT_TEST_DATABASE_URL` (a URL of an existing
//! server whose user may create databases) is used instead when set.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Where PostgreSQL's binaries are (Debian's `postgresql` package).
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("WEFT_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions
        .pop()
        .expect("PostgreSQL is not installed: run scripts/setup.sh --with-tests (or set WEFT_TEST_DATABASE_URL)")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
    #[link_name = "flock"]
    fn libc_flock(fd: i32, operation: i32) -> i32;
}

const LOCK_SH: i32 = 1;
const LOCK_EX: i32 = 2;

fn flock(file: &File, operation: i32) {
    // SAFETY: the descriptor is open for the life of `file`.
    let rc = unsafe { libc_flock(file.as_raw_fd(), operation) };
    assert_eq!(rc, 0, "flock failed: {}", std::io::Error::last_os_error());
}

/// Runs a PostgreSQL program as the user that owns the cluster.
fn pg_command(program: &str) -> Command {
    let path = bin_dir().join(program);
    if is_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(path);
        cmd
    } else {
        Command::new(path)
    }
}

/// The shared cluster's URL prefix (`postgres://postgres@127.0.0.1:PORT`).
struct Cluster {
    base: String,
    /// Held (shared) for the life of this process, so the watchdog leaves the cluster up.
    _user: File,
}

fn run_key() -> String {
    std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| format!("pid{}", std::os::unix::process::parent_id()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_cluster() -> Cluster {
    let root = std::env::temp_dir().join(format!("weft-test-pg-{}", run_key()));
    std::fs::create_dir_all(&root).unwrap();
    // Only one process creates the cluster; the others wait for it here.
    let start_lock = File::create(root.join("start.lock")).unwrap();
    flock(&start_lock, LOCK_EX);
    let users = File::create(root.join("users.lock")).unwrap();
    flock(&users, LOCK_SH);
    let port_file = root.join("port");
    let alive = std::fs::read_to_string(&port_file)
        .ok()
        .filter(|_| !root.join("stopped").exists());
    let port = match alive {
        Some(port) => port.trim().to_string(),
        None => {
            let _ = std::fs::remove_file(root.join("stopped"));
            let port = free_port().to_string();
            let data = root.join("data");
            let sockets = root.join("sockets");
            let _ = std::fs::remove_dir_all(&data);
            std::fs::create_dir_all(&sockets).unwrap();
            if is_root() {
                let status = Command::new("chown")
                    .args(["-R", "postgres:postgres"])
                    .arg(&root)
                    .status()
                    .unwrap();
                assert!(status.success(), "chown of the cluster dir failed");
            }
            let out = pg_command("initdb")
                .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "-D"])
                .arg(&data)
                .output()
                .expect("running initdb");
            assert!(
                out.status.success(),
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400 -c fsync=off -c full_page_writes=off",
                sockets.display()
            );
            let status = pg_command("pg_ctl")
                .args(["start", "-w", "-t", "60", "-D"])
                .arg(&data)
                .arg("-l")
                .arg(root.join("postgres.log"))
                .args(["-o", &options])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("running pg_ctl");
            assert!(
                status.success(),
                "postgres did not start; see {}",
                root.join("postgres.log").display()
            );
            spawn_watchdog(&root, &data);
            std::fs::write(&port_file, &port).unwrap();
            port
        }
    };
    drop(start_lock);
    Cluster {
        base: format!("postgres://postgres@127.0.0.1:{port}"),
        _user: users,
    }
}

/// Stops the cluster once no test process has held `users.lock` for a few seconds.
fn spawn_watchdog(root: &Path, data: &Path) {
    let pg_ctl = bin_dir().join("pg_ctl");
    let stop = if is_root() {
        format!(
            "runuser -u postgres -- {} stop -m immediate -D {}",
            pg_ctl.display(),
            data.display()
        )
    } else {
        format!("{} stop -m immediate -D {}", pg_ctl.display(), data.display())
    };
    let root = root.display();
    let script = format!(
        "cd {root} && idle=0; while sleep 1; do \
           if flock -n -x users.lock true; then idle=$((idle+1)); else idle=0; fi; \
           if [ $idle -ge 5 ]; then \
             flock -x start.lock sh -c 'flock -n -x users.lock sh -c \"{stop} >/dev/null 2>&1; touch stopped; rm -rf data sockets port postgres.log\"' && \
             [ -e stopped ] && break; idle=0; \
           fi; \
         done"
    );
    Command::new("setsid")
        .args(["-f", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("starting the cluster watchdog");
}

fn cluster_base() -> &'static str {
    static CLUSTER: OnceLock<(String, Option<Cluster>)> = OnceLock::new();
    &CLUSTER
        .get_or_init(|| match std::env::var("WEFT_TEST_DATABASE_URL") {
            Ok(url) => (
                url.trim_end_matches('/')
                    .rsplit_once('/')
                    .map_or(url.clone(), |(b, _)| b.to_string()),
                None,
            ),
            Err(_) => {
                let cluster = start_cluster();
                (cluster.base.clone(), Some(cluster))
            }
        })
        .0
}

/// A new, empty database on the test cluster: its URL.
pub(crate) fn fresh_database() -> String {
    let base = cluster_base();
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let admin = format!("{base}/postgres");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .expect("connecting to the test cluster");
        let driver = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("creating a test database");
        drop(client);
        let _ = driver.await;
    });
    format!("{base}/{name}")
}
