//! The embedded store: SQLite in WAL mode, with one write connection. A write that finds
//! it free commits on the caller's thread; under load the writer thread commits many writes
//! in one transaction (group commit), so durable submissions are not limited to one fsync
//! each. A checkpointer thread copies the WAL back into the database, off the write path.
//! A transaction holding a write that must survive power loss (a submission, an upload, a
//! key, credits) commits with `synchronous = FULL`: the WAL is fsynced before the caller
//! hears back, so a 201 means durably recorded. Transactions of only state updates that
//! follow (start, outputs, finish) commit with `NORMAL`: they survive a process crash, and
//! the next FULL commit makes them durable too; after a power cut the worst case is a job
//! that ran again. Readers use their own connections, which WAL lets run beside the writer.

use std::any::Any;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use rusqlite::{params, Connection, OptionalExtension, Row};
use tokio::sync::oneshot;

use super::*;

/// Most writes folded into one transaction.
const MAX_GROUP: usize = 512;

/// The WAL's size, in pages, at which the checkpointer is asked to copy it back into the
/// database (8 MiB of 2 KiB pages): a job's pages are mostly the same few (the tables' and
/// indexes' last leaves), so fewer checkpoints copy each one fewer times.
const CHECKPOINT_PAGES: i32 = 4000;

/// The WAL's size, in pages, past which a commit checkpoints it itself (32 MiB of 2 KiB
/// pages), should the checkpointer fall behind.
const CHECKPOINT_PAGES_INLINE: i32 = 16_000;

thread_local! {
    /// The WAL's size in pages after the last commit on this thread, which SQLite reports
    /// to [`note_wal_pages`].
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

/// The write connection's WAL hook: keeps the WAL's size for the committing thread to read
/// once its commit returns. It replaces SQLite's own automatic checkpoints.
fn note_wal_pages(_wal: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

type Output = Result<Box<dyn Any + Send>, StoreError>;
type WriteOp = Box<dyn FnOnce(&Connection) -> Output + Send>;

struct WriteRequest {
    op: WriteOp,
    reply: oneshot::Sender<Output>,
    /// Whether the caller must not hear back before the write survives power loss.
    durable: bool,
}

/// How a write must be committed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// fsynced before the caller hears back.
    Durable,
    /// Survives a process crash; made durable by the next durable commit.
    Relaxed,
}

/// The write connection, shared by the writer thread and callers that find it idle.
struct WriteSide {
    /// The connection, and whether it now commits with `synchronous = FULL`.
    conn: Mutex<(Connection, bool)>,
    /// Requests sent to the writer thread and not yet taken by it.
    queued: AtomicUsize,
    /// Whether the connection's holder is committing a durable transaction, which waits
    /// for an fsync.
    syncing: AtomicBool,
    /// Whether the checkpointer has been asked to run and has not finished.
    checkpoint_asked: AtomicBool,
    /// Asks the checkpointer thread ([`checkpoint_when_asked`]) to run.
    checkpoint: mpsc::SyncSender<()>,
}

impl WriteSide {
    /// Commits `request` on the calling thread if nothing waits for the writer thread and
    /// the connection is free, or, for a write that needs no fsync, held by a commit that
    /// needs none either (its wait is then a few tens of microseconds of CPU, which costs
    /// less than two thread hand-offs); hands it back otherwise.
    fn commit_if_idle(&self, request: WriteRequest, health: &Mutex<StoreHealth>) -> Result<(), WriteRequest> {
        if self.queued.load(Ordering::Acquire) != 0 {
            return Err(request);
        }
        let mut conn = match self.conn.try_lock() {
            Ok(conn) => conn,
            Err(std::sync::TryLockError::Poisoned(e)) => self.recovered(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if !request.durable && !self.syncing.load(Ordering::Acquire) => {
                self.lock()
            }
            Err(std::sync::TryLockError::WouldBlock) => return Err(request),
        };
        self.commit(&mut conn, vec![request], health);
        Ok(())
    }

    /// [`commit_batch`], telling callers meanwhile whether it waits for an fsync; then asks
    /// for a checkpoint if the WAL has grown to [`CHECKPOINT_PAGES`].
    fn commit(&self, conn: &mut (Connection, bool), batch: Vec<WriteRequest>, health: &Mutex<StoreHealth>) {
        if batch.iter().any(|r| r.durable) {
            self.syncing_while(|| commit_batch(conn, batch, health));
        } else {
            commit_batch(conn, batch, health);
        }
        let pages = WAL_PAGES.with(Cell::take);
        if pages >= CHECKPOINT_PAGES_INLINE {
            // The checkpointer has fallen behind: this commit checkpoints itself.
            self.syncing_while(|| checkpoint(&conn.0));
        } else if pages >= CHECKPOINT_PAGES && !self.checkpoint_asked.swap(true, Ordering::AcqRel) {
            let _ = self.checkpoint.try_send(());
        }
    }

    /// Runs `work`, which waits for fsyncs while holding the connection: relaxed writes
    /// that come meanwhile go to the writer thread rather than wait for the mutex. The flag
    /// is cleared even if `work` panics (the writer is restarted after a panic), so relaxed
    /// writes do not go the slow way for ever after.
    fn syncing_while(&self, work: impl FnOnce()) {
        struct Cleared<'a>(&'a AtomicBool);
        impl Drop for Cleared<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        self.syncing.store(true, Ordering::Release);
        let _cleared = Cleared(&self.syncing);
        work();
    }

    /// The connection, waiting for it.
    fn lock(&self) -> std::sync::MutexGuard<'_, (Connection, bool)> {
        self.conn.lock().unwrap_or_else(|e| self.recovered(e.into_inner()))
    }

    /// `conn`, taken from a holder that panicked outside a request: whatever transaction it
    /// left open is rolled back before anyone writes again.
    fn recovered<'a>(
        &self,
        conn: std::sync::MutexGuard<'a, (Connection, bool)>,
    ) -> std::sync::MutexGuard<'a, (Connection, bool)> {
        let _ = conn.0.execute_batch("ROLLBACK");
        self.conn.clear_poison();
        conn
    }
}

/// The SQLite store.
pub struct SqliteStore {
    path: PathBuf,
    writer: mpsc::Sender<WriteRequest>,
    write_side: Arc<WriteSide>,
    readers: Arc<Mutex<Vec<Connection>>>,
    health: Arc<Mutex<StoreHealth>>,
}

/// The schema version this build knows, kept in SQLite's `user_version`. Version 1 is the
/// schema below; a later version adds a step to [`migrate`].
pub const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL UNIQUE,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,
    workflow TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    started_at TEXT,
    completed_at TEXT,
    expires_at TEXT NOT NULL,
    progress TEXT,
    error TEXT,
    logs TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_tenant ON jobs (tenant, seq);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, seq);
CREATE INDEX IF NOT EXISTS jobs_by_tenant_status ON jobs (tenant, status, seq);
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at);
CREATE TABLE IF NOT EXISTS job_labels (
    job_id TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE INDEX IF NOT EXISTS job_labels_by_value ON job_labels (name, value);
CREATE TABLE IF NOT EXISTS assets (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    blob TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    file_path TEXT NOT NULL,
    job_id TEXT,
    node_id TEXT,
    kind TEXT,
    tags TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    output_index INTEGER
);
CREATE INDEX IF NOT EXISTS assets_by_blob ON assets (blob, tenant);
CREATE INDEX IF NOT EXISTS assets_by_job ON assets (job_id, output_index);
CREATE INDEX IF NOT EXISTS assets_by_name ON assets (tenant, file_path);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    job_id TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE TABLE IF NOT EXISTS user_files (
    tenant TEXT NOT NULL,
    path TEXT NOT NULL,
    content BLOB NOT NULL,
    created_at TEXT NOT NULL,
    modified_at TEXT NOT NULL,
    PRIMARY KEY (tenant, path)
);
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    credits INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_hash TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at TEXT NOT NULL
);
"#;

/// The page size of a new database, in bytes.
const PAGE_SIZE: i64 = 2048;

fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // Room for every statement the store prepares (rusqlite keeps 16 by default).
    conn.set_prepared_statement_cache_capacity(64);
    // A new database gets 2 KiB pages (an existing one keeps its own): every page a commit
    // changes is written whole to the WAL, and a job's three commits change about twenty.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: the WAL is fsynced at every commit. The writer relaxes it per transaction.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// Brings the schema to [`SCHEMA_VERSION`]; fails, changing nothing, when the database was
/// made by a newer weft.
fn migrate(conn: &Connection) -> Result<(), StoreError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "the database schema is at version {version}, newer than this weft knows ({SCHEMA_VERSION}); run a newer weft"
        )));
    }
    if version < 1 {
        // Version 1 is also what databases made before versioning hold: every statement is
        // `IF NOT EXISTS`.
        conn.execute_batch(&format!("BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = 1; COMMIT;"))?;
    }
    if version < 2 {
        // Version 2: how long each node of a job took.
        conn.execute_batch(
            "BEGIN IMMEDIATE; ALTER TABLE jobs ADD COLUMN node_times TEXT; PRAGMA user_version = 2; COMMIT;",
        )?;
    }
    if version < 3 {
        // Version 3: small outputs keep their bytes in their asset's row.
        conn.execute_batch(
            "BEGIN IMMEDIATE; ALTER TABLE assets ADD COLUMN content BLOB; PRAGMA user_version = 3; COMMIT;",
        )?;
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating) the database at `path`, migrates its schema, and starts its writer thread.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = open_connection(path)?;
        migrate(&conn)?;
        // Checkpoints run on the checkpointer thread, not in the commit that fills the WAL.
        conn.wal_hook(Some(note_wal_pages));
        let (tx, rx) = mpsc::channel::<WriteRequest>();
        let health = Arc::new(Mutex::new(StoreHealth {
            writer_running: true,
            ..StoreHealth::default()
        }));
        let writer_health = health.clone();
        let (checkpoint_tx, checkpoint_rx) = mpsc::sync_channel(1);
        let write_side = Arc::new(WriteSide {
            conn: Mutex::new((conn, true)),
            queued: AtomicUsize::new(0),
            syncing: AtomicBool::new(false),
            checkpoint_asked: AtomicBool::new(false),
            checkpoint: checkpoint_tx,
        });
        let writer_side = write_side.clone();
        let checkpoint_path = path.to_path_buf();
        let checkpoint_side = Arc::downgrade(&write_side);
        std::thread::Builder::new()
            .name("weft-store-checkpoint".into())
            .spawn(move || checkpoint_when_asked(&checkpoint_path, &checkpoint_side, &checkpoint_rx))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        std::thread::Builder::new()
            .name("weft-store-writer".into())
            .spawn(move || supervise_writer(&writer_side, &rx, &writer_health))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(Self {
            path: path.to_path_buf(),
            writer: tx,
            write_side,
            readers: Arc::new(Mutex::new(Vec::new())),
            health,
        })
    }

    /// Commits `op`. When nothing waits for the writer thread and its connection is free
    /// (or, for a relaxed write, busy with another commit that waits for no fsync), the
    /// calling thread commits it at once: the write then costs no hand-off to the writer
    /// thread and back (two thread wake-ups, and on a busy server a worker left idle
    /// meanwhile). Otherwise the writer thread takes it, folded into one transaction with
    /// whatever else waits.
    async fn write<R: Send + 'static>(
        &self,
        durability: Durability,
        op: impl FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let (reply, mut rx) = oneshot::channel();
        let op: WriteOp = Box::new(move |c| op(c).map(|r| Box::new(r) as Box<dyn Any + Send>));
        let request = WriteRequest {
            op,
            reply,
            durable: durability == Durability::Durable,
        };
        let out = match self.write_side.commit_if_idle(request, &self.health) {
            Ok(()) => rx
                .try_recv()
                .map_err(|_| StoreError::Backend("the store dropped a request".into()))??,
            Err(request) => {
                let queued = &self.write_side.queued;
                queued.fetch_add(1, Ordering::AcqRel);
                if self.writer.send(request).is_err() {
                    queued.fetch_sub(1, Ordering::AcqRel);
                    return Err(StoreError::Backend("the store writer has stopped".into()));
                }
                rx.await
                    .map_err(|_| StoreError::Backend("the store writer dropped a request".into()))??
            }
        };
        Ok(*out.downcast::<R>().expect("write result has the requested type"))
    }

    async fn read<R: Send + 'static>(
        &self,
        op: impl FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, StoreError> {
        let readers = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || with_reader(&readers, &path, op))
            .await
            .map_err(|e| StoreError::Backend(e.to_string()))?
    }

    /// Runs `op`, a lookup of one job by key, on the calling thread: with the database in
    /// the page cache it takes microseconds, less than a hand-off to a blocking thread and
    /// back, which is on the path of every status a client reads.
    fn read_now<R>(&self, op: impl FnOnce(&Connection) -> Result<R, StoreError>) -> Result<R, StoreError> {
        with_reader(&self.readers, &self.path, op)
    }
}

/// Runs `op` on a reader connection from `readers`, opening one on `path` if none is free.
fn with_reader<R>(
    readers: &Mutex<Vec<Connection>>,
    path: &Path,
    op: impl FnOnce(&Connection) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    let conn = readers.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let conn = match conn {
        Some(c) => c,
        None => open_connection(path)?,
    };
    let result = op(&conn);
    readers.lock().unwrap_or_else(|e| e.into_inner()).push(conn);
    result
}

/// Copies the WAL back into the database each time it is asked, until the store's write
/// side is gone, in two passes. The first, on the checkpointer's own connection, runs
/// beside the writer and readers without blocking them: it copies what is committed and
/// waits for the two fsyncs, which is most of a checkpoint's time. The second, on the write
/// connection, holding it, copies the few commits made meanwhile: only a checkpoint that
/// nothing commits beside lets the next write start the WAL over from its beginning, where
/// its pages are rewritten in place instead of growing the file.
fn checkpoint_when_asked(path: &Path, side: &std::sync::Weak<WriteSide>, asked: &mpsc::Receiver<()>) {
    let conn = match open_connection(path) {
        Ok(conn) => conn,
        Err(e) => {
            tracing::warn!(error = %e, "the store's checkpointer cannot open the database; commits checkpoint themselves");
            return;
        }
    };
    while asked.recv().is_ok() {
        checkpoint(&conn);
        let Some(side) = side.upgrade() else { return };
        let write = side.lock();
        side.syncing_while(|| checkpoint(&write.0));
        side.checkpoint_asked.store(false, Ordering::Release);
    }
}

/// Copies what the WAL holds back into the database, as far as readers allow, without
/// waiting for any of them (`PASSIVE`).
fn checkpoint(conn: &Connection) {
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "the store's checkpoint failed");
    }
}

/// Runs the writer until every sender is gone, restarting it (with any half-done
/// transaction rolled back) if it ever panics outside a request; the requests of that batch
/// get an error. `health` records each restart, and that the writer stopped.
fn supervise_writer(side: &WriteSide, rx: &mpsc::Receiver<WriteRequest>, health: &Mutex<StoreHealth>) {
    while let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer_loop(side, rx, health))) {
        tracing::error!(panic = %crate::panic_message(&*panic), "the store writer panicked; it is restarted");
        let _ = side.lock().0.execute_batch("ROLLBACK");
        health.lock().unwrap_or_else(|e| e.into_inner()).writer_restarts += 1;
    }
    health.lock().unwrap_or_else(|e| e.into_inner()).writer_running = false;
}

/// Takes write requests and commits the queued ones together ([`commit_batch`]).
fn writer_loop(side: &WriteSide, rx: &mpsc::Receiver<WriteRequest>, health: &Mutex<StoreHealth>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(req) => batch.push(req),
                Err(_) => break,
            }
        }
        side.queued.fetch_sub(batch.len(), Ordering::AcqRel);
        side.commit(&mut side.lock(), batch, health);
    }
}

/// Runs `sql`, a statement without parameters or rows (`BEGIN`, `COMMIT`, ...), from the
/// connection's statement cache rather than parsing it again.
fn run(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Folds `batch` into one transaction on `conn` (fsynced if any request is durable; the
/// flag beside the connection tracks its `synchronous` mode), commits, then answers each.
/// A failing request is rolled back to its savepoint without touching the others (a batch
/// of one needs no savepoint: its transaction is rolled back). After the transaction
/// `health` says whether it hit a storage failure (a `Backend` error, or a transaction
/// that could not begin or commit).
fn commit_batch(conn: &mut (Connection, bool), batch: Vec<WriteRequest>, health: &Mutex<StoreHealth>) {
    let record = |failure: Option<String>| {
        let mut health = health.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(f), None) = (&failure, &health.failing) {
            tracing::error!(error = %f, "the store cannot write");
        }
        health.failing = failure;
    };
    let (conn, full) = conn;
    let durable = batch.iter().any(|r| r.durable);
    if durable != *full {
        let mode = if durable { "FULL" } else { "NORMAL" };
        if conn.pragma_update(None, "synchronous", mode).is_ok() {
            *full = durable;
        }
    }
    if let Err(e) = run(conn, "BEGIN IMMEDIATE") {
        record(Some(e.to_string()));
        for req in batch {
            let _ = req.reply.send(Err(StoreError::Backend(e.to_string())));
        }
        return;
    }
    let alone = batch.len() == 1;
    let mut results = Vec::with_capacity(batch.len());
    let mut failure = None;
    for req in batch {
        if !alone {
            let _ = run(conn, "SAVEPOINT op");
        }
        // A panicking request fails alone: the writer lives on for the others.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (req.op)(conn))).unwrap_or_else(|panic| {
            Err(StoreError::Backend(format!(
                "a store write panicked: {}",
                crate::panic_message(&*panic)
            )))
        });
        if let Err(e) = &out {
            if let StoreError::Backend(m) = e {
                failure = Some(m.clone());
            }
            if alone {
                let _ = run(conn, "ROLLBACK");
                record(failure);
                let _ = req.reply.send(out);
                return;
            }
            let _ = run(conn, "ROLLBACK TO op");
        }
        if !alone {
            let _ = run(conn, "RELEASE op");
        }
        results.push((req.reply, out));
    }
    match run(conn, "COMMIT") {
        Ok(()) => {
            record(failure);
            for (reply, out) in results {
                let _ = reply.send(out);
            }
        }
        Err(e) => {
            record(Some(e.to_string()));
            let _ = run(conn, "ROLLBACK");
            for (reply, _) in results {
                let _ = reply.send(Err(StoreError::Backend(format!("commit failed: {e}"))));
            }
        }
    }
}

/// Inserts `asset`'s row, with `content` when it is kept inline.
fn insert_asset_row(c: &Connection, asset: &AssetRecord, content: Option<&[u8]>) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO assets (id, tenant, blob, size_bytes, content_type, file_path, job_id, node_id, kind, tags, created_at, expires_at, output_index, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        asset.id,
        asset.tenant,
        asset.blob,
        asset.size_bytes,
        asset.content_type,
        asset.file_path,
        asset.job_id,
        asset.node_id,
        asset.kind,
        to_json(&asset.tags),
        time_text(asset.created_at),
        asset.expires_at.map(time_text),
        asset.output_index,
        content,
    ])?;
    Ok(())
}

/// The outputs of job `job_id`, in commit order.
fn outputs_of_job(c: &Connection, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
    let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE job_id = ?1 ORDER BY output_index");
    Ok(c.prepare_cached(&sql)?
        .query_map(params![job_id], asset_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?)
}

fn parse_time(s: Option<String>) -> Option<DateTime<Utc>> {
    s.and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn json_col<T: serde::de::DeserializeOwned>(s: Option<String>) -> Option<T> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("records serialize")
}

/// The columns [`job_from_row`] reads. The workflow is not among them: it can be megabytes,
/// and only a few readers need it ([`Store::job_workflow`] reads it).
const JOB_COLUMNS: &str = "id, seq, tenant, status, labels, created_at, updated_at, started_at, completed_at, expires_at, progress, error, logs, node_times";

/// A status read from column `column`; one this version does not know is an error that names
/// it, never a guess.
fn stored_status(column: usize, text: &str) -> rusqlite::Result<JobStatus> {
    JobStatus::from_stored(text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e)))
}

fn job_from_row(row: &Row) -> rusqlite::Result<JobRecord> {
    let status: String = row.get(3)?;
    let labels: String = row.get(4)?;
    Ok(JobRecord {
        id: row.get(0)?,
        seq: row.get(1)?,
        tenant: row.get(2)?,
        status: stored_status(3, &status)?,
        workflow: serde_json::Value::Null,
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        created_at: parse_time(row.get(5)?).unwrap_or_default(),
        updated_at: parse_time(row.get(6)?).unwrap_or_default(),
        started_at: parse_time(row.get(7)?),
        completed_at: parse_time(row.get(8)?),
        expires_at: parse_time(row.get(9)?).unwrap_or_default(),
        progress: json_col(row.get(10)?),
        error: json_col(row.get(11)?),
        logs: json_col(row.get(12)?),
        node_times: json_col(row.get(13)?).unwrap_or_default(),
    })
}

/// A job's stored workflow text, parsed (`Null` if it somehow is not JSON).
fn parse_workflow(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

/// `'queued','running'`: statuses as an SQL list (their names are fixed identifiers).
fn status_list(statuses: &[JobStatus]) -> String {
    statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

const ASSET_COLUMNS: &str = "id, tenant, blob, size_bytes, content_type, file_path, job_id, node_id, kind, tags, \
     created_at, expires_at, output_index, content IS NOT NULL";

fn user_file_from_row(row: &Row) -> rusqlite::Result<UserFile> {
    let time = |i: usize| -> rusqlite::Result<DateTime<Utc>> {
        let text: String = row.get(i)?;
        DateTime::parse_from_rfc3339(&text)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e)))
    };
    Ok(UserFile {
        path: row.get(0)?,
        size: row.get(1)?,
        created: time(2)?,
        modified: time(3)?,
    })
}

fn asset_from_row(row: &Row) -> rusqlite::Result<AssetRecord> {
    let tags: String = row.get(9)?;
    Ok(AssetRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        blob: row.get(2)?,
        size_bytes: row.get(3)?,
        content_type: row.get(4)?,
        file_path: row.get(5)?,
        job_id: row.get(6)?,
        node_id: row.get(7)?,
        kind: row.get(8)?,
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        created_at: parse_time(row.get(10)?).unwrap_or_default(),
        expires_at: parse_time(row.get(11)?),
        output_index: row.get(12)?,
        inline: row.get(13)?,
    })
}

fn job_where(conn: &Connection, clause: &str, args: impl rusqlite::Params) -> Result<Option<JobRecord>, StoreError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE {clause}");
    Ok(conn.prepare_cached(&sql)?.query_row(args, job_from_row).optional()?)
}

#[async_trait]
impl Store for SqliteStore {
    fn health(&self) -> StoreHealth {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Closes the idle reader connections (the next reads open new ones) and empties the
    /// writer's page cache; each connection's cache holds up to 2 MB of pages from the C
    /// allocator. The writer's thread hands its own free memory back too.
    async fn release_caches(&self) {
        let idle = std::mem::take(&mut *self.readers.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = tokio::task::spawn_blocking(move || drop(idle)).await;
        let shrunk = self
            .write(Durability::Relaxed, |c| {
                c.execute_batch("PRAGMA shrink_memory")?;
                weft_allocator::release_free_memory();
                Ok(())
            })
            .await;
        if let Err(e) = shrunk {
            tracing::debug!(error = %e, "the store could not shrink its page cache");
        }
    }

    async fn insert_job(&self, job: JobRecord, idempotency_key: Option<String>, cost: i64) -> Result<(), StoreError> {
        self.write(Durability::Durable, move |c| {
            if cost > 0 {
                let charged = c
                    .prepare_cached("UPDATE tenants SET credits = credits - ?2 WHERE name = ?1 AND credits >= ?2")?
                    .execute(params![job.tenant, cost])?;
                if charged == 0 {
                    let balance: Option<i64> = c
                        .prepare_cached("SELECT credits FROM tenants WHERE name = ?1")?
                        .query_row(params![job.tenant], |r| r.get(0))
                        .optional()?;
                    return Err(StoreError::InsufficientCredits {
                        balance: balance.unwrap_or(0),
                    });
                }
            }
            if let Some(key) = &idempotency_key {
                // A key lives IDEMPOTENCY_TTL from its first use, whether or not the sweeper
                // has purged it yet: an older claim is replaced.
                let live_after = time_text(job.created_at - IDEMPOTENCY_TTL);
                let existing: Option<Option<String>> = c
                    .prepare_cached(
                        "SELECT job_id FROM idempotency_keys WHERE tenant = ?1 AND key = ?2 AND created_at >= ?3",
                    )?
                    .query_row(params![job.tenant, key, live_after], |r| r.get(0))
                    .optional()?;
                if let Some(job_id) = existing {
                    return Err(StoreError::IdempotencyReuse { job_id });
                }
                c.prepare_cached(
                    "INSERT INTO idempotency_keys (tenant, key, job_id, created_at) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (tenant, key) DO UPDATE SET job_id = excluded.job_id, created_at = excluded.created_at",
                )?
                .execute(params![job.tenant, key, job.id, time_text(job.created_at)])?;
            }
            c.prepare_cached(
                "INSERT INTO jobs (id, seq, tenant, status, workflow, labels, created_at, updated_at, started_at, completed_at, expires_at, progress, error, logs)
                 VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs), ?2, ?3, ?4, ?5, ?6, ?7, NULL, NULL, ?8, ?9, NULL, NULL)",
            )?
            .execute(params![
                job.id,
                job.tenant,
                job.status.as_str(),
                job.workflow.to_string(),
                to_json(&job.labels),
                time_text(job.created_at),
                time_text(job.updated_at),
                time_text(job.expires_at),
                job.progress.as_ref().map(to_json),
            ])?;
            for (name, value) in &job.labels {
                c.prepare_cached("INSERT INTO job_labels (job_id, name, value) VALUES (?1, ?2, ?3)")?
                    .execute(params![job.id, name, value])?;
            }
            Ok(())
        })
        .await
    }

    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.read_now(|c| job_where(c, "id = ?1 AND tenant = ?2", params![id, tenant]))
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.read_now(|c| job_where(c, "id = ?1", params![id]))
    }

    async fn list_jobs(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<i64>,
        labels: &BTreeMap<String, String>,
        status: Option<JobStatus>,
    ) -> Result<JobPage, StoreError> {
        let tenant = tenant.to_string();
        let labels = labels.clone();
        self.read(move |c| {
            let mut sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = ?1 AND seq < ?2");
            let mut args: Vec<String> = vec![tenant, before.unwrap_or(i64::MAX).to_string()];
            if let Some(status) = status {
                args.push(status.as_str().to_string());
                sql.push_str(&format!(" AND status = ?{}", args.len()));
            }
            for (name, value) in &labels {
                args.push(name.clone());
                args.push(value.clone());
                sql.push_str(&format!(
                    " AND EXISTS (SELECT 1 FROM job_labels l WHERE l.job_id = jobs.id AND l.name = ?{} AND l.value = ?{})",
                    args.len() - 1,
                    args.len()
                ));
            }
            sql.push_str(&format!(" ORDER BY seq DESC LIMIT {}", limit + 1));
            let mut stmt = c.prepare(&sql)?;
            let params = rusqlite::params_from_iter(args.iter().enumerate().map(|(i, a)| {
                if i == 1 {
                    rusqlite::types::Value::Integer(a.parse().unwrap_or(i64::MAX))
                } else {
                    rusqlite::types::Value::Text(a.clone())
                }
            }));
            let mut jobs = stmt.query_map(params, job_from_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            let next = if jobs.len() > limit {
                jobs.truncate(limit);
                jobs.last().map(|j| j.seq)
            } else {
                None
            };
            Ok(JobPage { jobs, next })
        })
        .await
    }

    async fn job_seq_exists(&self, tenant: &str, seq: i64) -> Result<bool, StoreError> {
        let tenant = tenant.to_string();
        self.read(move |c| {
            Ok(c.prepare_cached("SELECT 1 FROM jobs WHERE tenant = ?1 AND seq = ?2")?
                .query_row(params![tenant, seq], |_| Ok(()))
                .optional()?
                .is_some())
        })
        .await
    }

    async fn update_job(
        &self,
        id: &str,
        moves: &[(JobStatus, JobStatus)],
        mut update: JobUpdate,
    ) -> Result<Option<JobRecord>, StoreError> {
        let id = id.to_string();
        let moves = moves.to_vec();
        self.write(Durability::Relaxed, move |c| {
            let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1");
            let Some(job) = c.prepare_cached(&sql)?.query_row(params![id], job_from_row).optional()? else {
                return Ok(None);
            };
            let now = Utc::now();
            let Some(next) = update.apply(job, &moves, now) else {
                return Ok(None);
            };
            c.prepare_cached(
                "UPDATE jobs SET status = ?2, started_at = ?3, completed_at = ?4, progress = ?5, error = ?6, logs = ?7, updated_at = ?8, node_times = ?9 WHERE id = ?1",
            )?
            .execute(params![
                next.id,
                next.status.as_str(),
                next.started_at.map(time_text),
                next.completed_at.map(time_text),
                next.progress.as_ref().map(to_json),
                next.error.as_ref().map(to_json),
                next.logs.as_ref().map(to_json),
                time_text(now),
                (!next.node_times.is_empty()).then(|| to_json(&next.node_times)),
            ])?;
            for (asset, content) in &update.outputs {
                insert_asset_row(c, asset, Some(content))?;
            }
            Ok(Some(next))
        })
        .await
    }

    async fn job_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let id = id.to_string();
        // Parsed on the reader's blocking thread, as whole records are.
        self.read(move |c| {
            let text: Option<String> = c
                .prepare_cached("SELECT workflow FROM jobs WHERE id = ?1")?
                .query_row(params![id], |r| r.get(0))
                .optional()?;
            Ok(text.as_deref().map(parse_workflow))
        })
        .await
    }

    async fn workflows_of_jobs(&self, job_ids: &[String]) -> Result<HashMap<String, serde_json::Value>, StoreError> {
        let job_ids = job_ids.to_vec();
        self.read(move |c| {
            let mut workflows = HashMap::with_capacity(job_ids.len());
            // SQLite binds at most 32,766 parameters a statement.
            for ids in job_ids.chunks(1_000) {
                let marks = vec!["?"; ids.len()].join(", ");
                let sql = format!("SELECT id, workflow FROM jobs WHERE id IN ({marks})");
                let mut stmt = c.prepare(&sql)?;
                let rows = stmt.query_map(rusqlite::params_from_iter(ids), |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
                })?;
                for row in rows {
                    let (id, text) = row?;
                    workflows.insert(id, parse_workflow(&text));
                }
            }
            Ok(workflows)
        })
        .await
    }

    async fn jobs_with_status(&self, statuses: &[JobStatus]) -> Result<Vec<JobRecord>, StoreError> {
        let list = status_list(statuses);
        self.read(move |c| {
            let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE status IN ({list}) ORDER BY seq");
            Ok(c.prepare(&sql)?
                .query_map([], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn tenant_jobs_with_status(
        &self,
        tenant: &str,
        statuses: &[JobStatus],
        limit: usize,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let (tenant, list) = (tenant.to_string(), status_list(statuses));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |c| {
            let sql = format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = ?1 AND status IN ({list}) ORDER BY seq LIMIT ?2"
            );
            Ok(c.prepare_cached(&sql)?
                .query_map(params![tenant, limit], job_from_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn count_tenant_jobs(&self, tenant: &str, statuses: &[JobStatus]) -> Result<i64, StoreError> {
        let (tenant, list) = (tenant.to_string(), status_list(statuses));
        self.read(move |c| {
            let sql = format!("SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND status IN ({list})");
            Ok(c.prepare_cached(&sql)?.query_row(params![tenant], |r| r.get(0))?)
        })
        .await
    }

    async fn jobs_expiring(&self, now: DateTime<Utc>) -> Result<Vec<(String, JobStatus)>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT id, status FROM jobs WHERE expires_at < ?1")?;
            let rows = stmt.query_map(params![time_text(now)], |r| {
                let s: String = r.get(1)?;
                Ok((r.get::<_, String>(0)?, stored_status(1, &s)?))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn delete_job(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        self.write(Durability::Durable, move |c| {
            c.execute("DELETE FROM assets WHERE job_id = ?1", params![id])?;
            c.execute("DELETE FROM job_labels WHERE job_id = ?1", params![id])?;
            c.execute("DELETE FROM jobs WHERE id = ?1", params![id])?;
            Ok(())
        })
        .await
    }

    async fn count_by_status(&self) -> Result<Vec<(JobStatus, i64)>, StoreError> {
        self.read(|c| {
            let mut stmt = c.prepare_cached("SELECT status, COUNT(*) FROM jobs GROUP BY status")?;
            let rows = stmt.query_map([], |r| {
                Ok((stored_status(0, &r.get::<_, String>(0)?)?, r.get::<_, i64>(1)?))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn insert_asset(&self, asset: AssetRecord, content: Option<bytes::Bytes>) -> Result<(), StoreError> {
        // An upload is acknowledged to its caller; an output can be made again by a re-run.
        let durability = if asset.job_id.is_some() {
            Durability::Relaxed
        } else {
            Durability::Durable
        };
        self.write(durability, move |c| insert_asset_row(c, &asset, content.as_deref()))
            .await
    }

    async fn asset_content(&self, id: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            let content: Option<Option<Vec<u8>>> = c
                .prepare_cached("SELECT content FROM assets WHERE id = ?1")?
                .query_row(params![id], |r| r.get(0))
                .optional()?;
            Ok(content.flatten().map(bytes::Bytes::from))
        })
        .await
    }

    async fn asset(&self, tenant: &str, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.read(move |c| {
            let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE id = ?1 AND tenant = ?2");
            Ok(c.prepare_cached(&sql)?
                .query_row(params![id, tenant], asset_from_row)
                .optional()?)
        })
        .await
    }

    async fn asset_any(&self, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        let id = id.to_string();
        self.read(move |c| {
            let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE id = ?1");
            Ok(c.prepare_cached(&sql)?
                .query_row(params![id], asset_from_row)
                .optional()?)
        })
        .await
    }

    async fn asset_by_blob(&self, tenant: &str, blob: &str) -> Result<Option<AssetRecord>, StoreError> {
        let (tenant, blob) = (tenant.to_string(), blob.to_string());
        self.read(move |c| {
            let sql = format!(
                "SELECT {ASSET_COLUMNS} FROM assets WHERE blob = ?1 AND tenant = ?2 ORDER BY created_at LIMIT 1"
            );
            Ok(c.prepare_cached(&sql)?
                .query_row(params![blob, tenant], asset_from_row)
                .optional()?)
        })
        .await
    }

    async fn upload_named(&self, tenant: &str, file_path: &str) -> Result<Option<AssetRecord>, StoreError> {
        let (tenant, file_path) = (tenant.to_string(), file_path.to_string());
        self.read(move |c| {
            let sql = format!(
                "SELECT {ASSET_COLUMNS} FROM assets WHERE tenant = ?1 AND file_path = ?2 AND job_id IS NULL \
                 ORDER BY created_at DESC LIMIT 1"
            );
            Ok(c.prepare_cached(&sql)?
                .query_row(params![tenant, file_path], asset_from_row)
                .optional()?)
        })
        .await
    }

    async fn upload_names(
        &self,
        tenant: &str,
        content_type_prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let (tenant, pattern) = (tenant.to_string(), format!("{}%", content_type_prefix.replace('%', "")));
        let limit = limit as i64;
        self.read(move |c| {
            let sql = "SELECT file_path FROM assets WHERE tenant = ?1 AND job_id IS NULL AND content_type LIKE ?2 \
                       GROUP BY file_path ORDER BY MAX(created_at) DESC LIMIT ?3";
            Ok(c.prepare_cached(sql)?
                .query_map(params![tenant, pattern, limit], |row| row.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()?)
        })
        .await
    }

    async fn user_file(&self, tenant: &str, path: &str) -> Result<Option<(UserFile, Vec<u8>)>, StoreError> {
        let (tenant, path) = (tenant.to_string(), path.to_string());
        self.read(move |c| {
            Ok(c.prepare_cached(
                "SELECT path, length(content), created_at, modified_at, content FROM user_files \
                 WHERE tenant = ?1 AND path = ?2",
            )?
            .query_row(params![tenant, path], |row| Ok((user_file_from_row(row)?, row.get(4)?)))
            .optional()?)
        })
        .await
    }

    async fn user_files(&self, tenant: &str, prefix: &str) -> Result<Vec<UserFile>, StoreError> {
        let (tenant, prefix) = (tenant.to_string(), prefix.to_string());
        self.read(move |c| {
            // Prefix compare without LIKE, so `%` and `_` in names match only themselves.
            Ok(c.prepare_cached(
                "SELECT path, length(content), created_at, modified_at FROM user_files \
                 WHERE tenant = ?1 AND substr(path, 1, length(?2)) = ?2 ORDER BY path",
            )?
            .query_map(params![tenant, prefix], user_file_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn put_user_file(
        &self,
        tenant: &str,
        path: &str,
        content: Vec<u8>,
        overwrite: bool,
        limits: UserDataLimits,
    ) -> Result<UserWrite, StoreError> {
        let (tenant, path) = (tenant.to_string(), path.to_string());
        self.write(Durability::Durable, move |c| {
            let existing: Option<(i64, String)> = c
                .prepare_cached("SELECT length(content), created_at FROM user_files WHERE tenant = ?1 AND path = ?2")?
                .query_row(params![tenant, path], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            if existing.is_some() && !overwrite {
                return Ok(UserWrite::Exists);
            }
            let (files, bytes): (i64, i64) = c
                .prepare_cached("SELECT COUNT(*), COALESCE(SUM(length(content)), 0) FROM user_files WHERE tenant = ?1")?
                .query_row(params![tenant], |r| Ok((r.get(0)?, r.get(1)?)))?;
            let old = existing.as_ref().map_or(0, |e| e.0);
            let new_files = files + i64::from(existing.is_none());
            if new_files > limits.files || bytes - old + content.len() as i64 > limits.bytes {
                return Ok(UserWrite::Full);
            }
            let now = time_text(Utc::now());
            let created = existing.map_or(now.clone(), |e| e.1);
            c.prepare_cached(
                "INSERT OR REPLACE INTO user_files (tenant, path, content, created_at, modified_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![tenant, path, content, created, now])?;
            let file = c
                .prepare_cached(
                    "SELECT path, length(content), created_at, modified_at FROM user_files WHERE tenant = ?1 AND path = ?2",
                )?
                .query_row(params![tenant, path], user_file_from_row)?;
            Ok(UserWrite::Written(file))
        })
        .await
    }

    async fn delete_user_file(&self, tenant: &str, path: &str) -> Result<bool, StoreError> {
        let (tenant, path) = (tenant.to_string(), path.to_string());
        self.write(Durability::Durable, move |c| {
            Ok(c.execute(
                "DELETE FROM user_files WHERE tenant = ?1 AND path = ?2",
                params![tenant, path],
            )? > 0)
        })
        .await
    }

    async fn move_user_file(
        &self,
        tenant: &str,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<UserWrite, StoreError> {
        let (tenant, from, to) = (tenant.to_string(), from.to_string(), to.to_string());
        self.write(Durability::Durable, move |c| {
            let exists = |path: &str| -> Result<bool, StoreError> {
                Ok(c.prepare_cached("SELECT 1 FROM user_files WHERE tenant = ?1 AND path = ?2")?
                    .query_row(params![tenant, path], |_| Ok(()))
                    .optional()?
                    .is_some())
            };
            if !exists(&from)? {
                return Ok(UserWrite::Missing);
            }
            if from != to && exists(&to)? {
                if !overwrite {
                    return Ok(UserWrite::Exists);
                }
                c.execute("DELETE FROM user_files WHERE tenant = ?1 AND path = ?2", params![tenant, to])?;
            }
            let now = time_text(Utc::now());
            c.execute(
                "UPDATE user_files SET path = ?3, modified_at = ?4 WHERE tenant = ?1 AND path = ?2",
                params![tenant, from, to, now],
            )?;
            let file = c
                .prepare_cached(
                    "SELECT path, length(content), created_at, modified_at FROM user_files WHERE tenant = ?1 AND path = ?2",
                )?
                .query_row(params![tenant, to], user_file_from_row)?;
            Ok(UserWrite::Written(file))
        })
        .await
    }

    async fn job_outputs(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.read_now(|c| outputs_of_job(c, job_id))
    }

    async fn job_with_outputs(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<(JobRecord, Vec<AssetRecord>)>, StoreError> {
        // Both in one read transaction, so that the outputs are those of the status read
        // with them.
        self.read_now(|c| {
            let tx = c.unchecked_transaction()?;
            let Some(job) = job_where(&tx, "id = ?1 AND tenant = ?2", params![id, tenant])? else {
                return Ok(None);
            };
            let outputs = outputs_of_job(&tx, &job.id)?;
            tx.finish()?;
            Ok(Some((job, outputs)))
        })
    }

    async fn outputs_of_jobs(&self, job_ids: &[String]) -> Result<HashMap<String, Vec<AssetRecord>>, StoreError> {
        let job_ids = job_ids.to_vec();
        self.read(move |c| {
            let mut outputs: HashMap<String, Vec<AssetRecord>> = HashMap::with_capacity(job_ids.len());
            // SQLite binds at most 32,766 parameters a statement.
            for ids in job_ids.chunks(1_000) {
                let marks = vec!["?"; ids.len()].join(", ");
                let sql = format!(
                    "SELECT {ASSET_COLUMNS} FROM assets WHERE job_id IN ({marks}) ORDER BY job_id, output_index"
                );
                let rows = c
                    .prepare(&sql)?
                    .query_map(rusqlite::params_from_iter(ids), asset_from_row)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                for asset in rows {
                    let job = asset.job_id.clone().unwrap_or_default();
                    outputs.entry(job).or_default().push(asset);
                }
            }
            Ok(outputs)
        })
        .await
    }

    async fn delete_asset(&self, tenant: &str, id: &str) -> Result<Deleted, StoreError> {
        let (tenant, id) = (tenant.to_string(), id.to_string());
        self.write(Durability::Durable, move |c| {
            let found: Option<(Option<String>, String)> = c
                .prepare_cached("SELECT job_id, blob FROM assets WHERE id = ?1 AND tenant = ?2")?
                .query_row(params![id, tenant], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            match found {
                None => Ok(Deleted::NotFound),
                Some((Some(_), _)) => Err(StoreError::InUse),
                Some((None, blob)) => {
                    c.execute("DELETE FROM assets WHERE id = ?1", params![id])?;
                    Ok(Deleted::Yes { blob })
                }
            }
        })
        .await
    }

    async fn delete_expired_assets(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        self.write(Durability::Durable, move |c| {
            let cut = time_text(now);
            let blobs = c
                .prepare_cached("SELECT blob FROM assets WHERE expires_at IS NOT NULL AND expires_at < ?1")?
                .query_map(params![cut], |r| r.get(0))?
                .collect::<rusqlite::Result<Vec<String>>>()?;
            c.execute(
                "DELETE FROM assets WHERE expires_at IS NOT NULL AND expires_at < ?1",
                params![cut],
            )?;
            Ok(blobs)
        })
        .await
    }

    async fn delete_job_outputs(&self, job_id: &str) -> Result<(), StoreError> {
        let job_id = job_id.to_string();
        self.write(Durability::Relaxed, move |c| {
            c.execute("DELETE FROM assets WHERE job_id = ?1", params![job_id])?;
            Ok(())
        })
        .await
    }

    async fn unreferenced_blobs(&self, candidates: Vec<String>) -> Result<Vec<String>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT 1 FROM assets WHERE blob = ?1 AND content IS NULL LIMIT 1")?;
            let mut orphans = Vec::new();
            for hash in candidates {
                if stmt.query_row(params![hash], |_| Ok(())).optional()?.is_none() {
                    orphans.push(hash);
                }
            }
            Ok(orphans)
        })
        .await
    }

    async fn purge_idempotency(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        self.write(Durability::Durable, move |c| {
            Ok(c.execute(
                "DELETE FROM idempotency_keys WHERE created_at < ?1",
                params![time_text(before)],
            )? as u64)
        })
        .await
    }

    async fn ensure_tenant(&self, name: &str, credits: i64) -> Result<(), StoreError> {
        let name = name.to_string();
        self.write(Durability::Durable, move |c| {
            c.execute(
                "INSERT INTO tenants (name, credits, created_at) VALUES (?1, ?2, ?3) ON CONFLICT (name) DO NOTHING",
                params![name, credits, time_text(Utc::now())],
            )?;
            Ok(())
        })
        .await
    }

    async fn add_api_key(&self, tenant: &str, key_hash: &str) -> Result<(), StoreError> {
        let (tenant, key_hash) = (tenant.to_string(), key_hash.to_string());
        self.write(Durability::Durable, move |c| {
            c.execute(
                "INSERT INTO api_keys (key_hash, tenant, created_at) VALUES (?1, ?2, ?3)",
                params![key_hash, tenant, time_text(Utc::now())],
            )?;
            Ok(())
        })
        .await
    }

    async fn idempotency_claim(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Option<String>>, StoreError> {
        let (tenant, key) = (tenant.to_string(), key.to_string());
        let live_after = time_text(now - IDEMPOTENCY_TTL);
        self.read(move |c| {
            Ok(c.prepare_cached(
                "SELECT job_id FROM idempotency_keys WHERE tenant = ?1 AND key = ?2 AND created_at >= ?3",
            )?
            .query_row(params![tenant, key, live_after], |r| r.get(0))
            .optional()?)
        })
        .await
    }

    async fn tenant_for_key(&self, key_hash: &str) -> Result<Option<String>, StoreError> {
        let key_hash = key_hash.to_string();
        self.read(move |c| {
            Ok(c.prepare_cached("SELECT tenant FROM api_keys WHERE key_hash = ?1")?
                .query_row(params![key_hash], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    async fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, StoreError> {
        let name = name.to_string();
        self.read(move |c| {
            Ok(c.prepare_cached("SELECT name, credits FROM tenants WHERE name = ?1")?
                .query_row(params![name], |r| {
                    Ok(TenantRecord {
                        name: r.get(0)?,
                        credits: r.get(1)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    async fn add_credits(&self, tenant: &str, delta: i64) -> Result<i64, StoreError> {
        let tenant = tenant.to_string();
        self.write(Durability::Durable, move |c| {
            c.execute(
                "INSERT INTO tenants (name, credits, created_at) VALUES (?1, 0, ?2) ON CONFLICT (name) DO NOTHING",
                params![tenant, time_text(Utc::now())],
            )?;
            c.execute(
                "UPDATE tenants SET credits = credits + ?2 WHERE name = ?1",
                params![tenant, delta],
            )?;
            Ok(
                c.query_row("SELECT credits FROM tenants WHERE name = ?1", params![tenant], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, created_at: DateTime<Utc>) -> JobRecord {
        JobRecord {
            id: id.into(),
            tenant: "t".into(),
            status: JobStatus::Queued,
            workflow: serde_json::json!({}),
            labels: Default::default(),
            created_at,
            updated_at: created_at,
            started_at: None,
            completed_at: None,
            expires_at: created_at + chrono::Duration::days(7),
            progress: None,
            error: None,
            logs: None,
            node_times: Vec::new(),
            seq: 0,
        }
    }

    /// The clock is injected through the job's `created_at`, which is when a key is claimed.
    #[tokio::test]
    async fn idempotency_keys_expire_after_24_hours() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("weft.db")).unwrap();
        let then = Utc::now() - chrono::Duration::hours(30);
        store.insert_job(job("j1", then), Some("k".into()), 0).await.unwrap();
        let at = |h| then + chrono::Duration::hours(h);
        assert_eq!(
            store.idempotency_claim("t", "k", at(23)).await.unwrap(),
            Some(Some("j1".into()))
        );
        assert_eq!(store.idempotency_claim("t", "k", at(25)).await.unwrap(), None);
        assert_eq!(store.idempotency_claim("other", "k", at(1)).await.unwrap(), None);
        // Within 24 hours of the claim: rejected, naming the job.
        match store
            .insert_job(job("j2", then + chrono::Duration::hours(23)), Some("k".into()), 0)
            .await
        {
            Err(StoreError::IdempotencyReuse { job_id }) => assert_eq!(job_id.as_deref(), Some("j1")),
            other => panic!("expected reuse, got {other:?}"),
        }
        // After 24 hours (not yet purged): the key is free again.
        store
            .insert_job(job("j3", then + chrono::Duration::hours(25)), Some("k".into()), 0)
            .await
            .unwrap();
        match store.insert_job(job("j4", Utc::now()), Some("k".into()), 0).await {
            Err(StoreError::IdempotencyReuse { job_id }) => assert_eq!(job_id.as_deref(), Some("j3")),
            other => panic!("expected reuse, got {other:?}"),
        }
        // The sweeper's purge drops keys older than the cut-off.
        assert_eq!(
            store
                .purge_idempotency(Utc::now() + chrono::Duration::hours(1))
                .await
                .unwrap(),
            1
        );
        store
            .insert_job(job("j5", Utc::now()), Some("k".into()), 0)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_panicking_write_fails_alone_and_the_writer_lives_on() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("weft.db")).unwrap();
        let failed = store
            .write(Durability::Durable, |_| -> Result<(), StoreError> { panic!("a bug") })
            .await;
        match failed {
            Err(StoreError::Backend(m)) => assert!(m.contains("a bug"), "{m}"),
            other => panic!("expected a backend error, got {other:?}"),
        }
        store.insert_job(job("after", Utc::now()), None, 0).await.unwrap();
        assert!(store.job("t", "after").await.unwrap().is_some());
    }

    /// Without the checkpointer the WAL would grow to the 32 MiB at which commits
    /// checkpoint it themselves; with it, it starts over once it has reached 8 MiB. Each
    /// write waits for a checkpoint it asked for to finish: writes as fast as a loop of
    /// fresh 64 KiB blobs can outrun the checkpointer's copying, which is what the 32 MiB
    /// fallback is for.
    #[tokio::test]
    async fn the_checkpointer_starts_the_wal_over_before_commits_would_checkpoint_it_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weft.db");
        let store = SqliteStore::open(&path).unwrap();
        let writes = 768;
        for i in 0..writes {
            store
                .write(Durability::Durable, move |c| {
                    c.execute(
                        "INSERT INTO user_files (tenant, path, content, created_at, modified_at) VALUES ('t', ?1, ?2, '', '')",
                        params![format!("f{i}"), vec![i as u8; 64 * 1024]],
                    )?;
                    Ok(())
                })
                .await
                .unwrap();
            let asked = std::time::Instant::now();
            while store.write_side.checkpoint_asked.load(Ordering::Acquire) {
                assert!(asked.elapsed().as_secs() < 60, "the checkpointer never finished");
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        let wal = std::fs::metadata(dir.path().join("weft.db-wal")).unwrap().len();
        assert!(wal < 24 << 20, "the WAL grew to {wal} bytes");
        let kept: i64 = store
            .read(|c| Ok(c.query_row("SELECT count(*) FROM user_files", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(kept, writes);
    }

    #[tokio::test]
    async fn a_job_is_recorded_only_if_the_tenant_can_pay_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("weft.db")).unwrap();
        assert_eq!(store.add_credits("t", 3).await.unwrap(), 3);
        let attempts = (0..10).map(|i| store.insert_job(job(&format!("j{i}"), Utc::now()), Some(format!("k{i}")), 1));
        let results = futures::future::join_all(attempts).await;
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
        for refused in results.iter().filter(|r| r.is_err()) {
            assert!(
                matches!(refused, Err(StoreError::InsufficientCredits { balance: 0 })),
                "{refused:?}"
            );
        }
        assert_eq!(store.tenant("t").await.unwrap().unwrap().credits, 0);
        // A refused job claims no idempotency key.
        let refused_key = (0..10).find(|i| results[*i].is_err()).unwrap();
        assert_eq!(
            store
                .idempotency_claim("t", &format!("k{refused_key}"), Utc::now())
                .await
                .unwrap(),
            None
        );
    }
}
