//! Everything persistent: jobs, assets, idempotency keys, tenants and API keys behind the
//! [`Store`] trait, and content-addressed blobs behind the [`blobs::BlobStore`] trait.
//!
//! The trait is async and free of SQLite-isms so that a PostgreSQL implementation (many
//! weft processes sharing one database) can follow; [`sqlite::SqliteStore`] is the embedded
//! default.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub mod blobs;
pub mod coordinator;
pub mod postgres;
mod records;
pub mod sqlite;

pub use blobs::Blobs;
pub use coordinator::{ClaimedJob, Coordinator, EventNotice, LogWrite, Signal, Written};
pub use records::*;

/// How long an idempotency key stays claimed after its first use. An older claim no longer
/// counts (see [`Store::insert_job`]), and retention purges it.
pub const IDEMPOTENCY_TTL: chrono::TimeDelta = chrono::TimeDelta::hours(24);

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The idempotency key was already presented; `job_id` names the job it made, if any.
    #[error("idempotency key already used")]
    IdempotencyReuse {
        /// The job the first request created.
        job_id: Option<String>,
    },
    /// A uniqueness rule was broken (for example a tenant name).
    #[error("{0}")]
    Conflict(String),
    /// The asset is an output of a job that still exists.
    #[error("asset is in use")]
    InUse,
    /// The tenant has fewer credits than the job costs; nothing was written.
    #[error("insufficient credits")]
    InsufficientCredits {
        /// The tenant's balance.
        balance: i64,
    },
    /// The database failed; whether the write happened is unknown.
    #[error("storage failure: {0}")]
    Backend(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// A change to a job's fields, applied with a status move (see [`Store::update_job`]).
#[derive(Debug, Clone, Default)]
pub struct JobUpdate {
    /// Set `started_at`.
    pub started_at: Option<DateTime<Utc>>,
    /// Set `completed_at`.
    pub completed_at: Option<DateTime<Utc>>,
    /// Set `progress`.
    pub progress: Option<Progress>,
    /// Set `error`.
    pub error: Option<JobError>,
    /// Set `logs`.
    pub logs: Option<JobLogs>,
    /// Set `node_times`.
    pub node_times: Option<Vec<NodeTime>>,
    /// Outputs kept inline (record and content), recorded in the move's own transaction:
    /// all of them if the job moves, none if it does not.
    pub outputs: Vec<(AssetRecord, bytes::Bytes)>,
}

impl JobUpdate {
    /// What `job` becomes when this update moves it along `moves` at `now`, as every
    /// [`Store::update_job`] writes it: none when its status is the `from` of no move. The
    /// job takes the move's `to` status and each field this update sets; a terminal status
    /// without a `completed_at` gets `now`, and `updated_at` is `now`. The outputs stay in
    /// the update, for the store to record in the same transaction.
    pub(crate) fn apply(
        &mut self,
        job: JobRecord,
        moves: &[(JobStatus, JobStatus)],
        now: DateTime<Utc>,
    ) -> Option<JobRecord> {
        let &(_, to) = moves.iter().find(|(from, _)| *from == job.status)?;
        let mut next = job;
        next.status = to;
        if let Some(t) = self.started_at.take() {
            next.started_at = Some(t);
        }
        if let Some(t) = self.completed_at.take() {
            next.completed_at = Some(t);
        }
        if let Some(p) = self.progress.take() {
            next.progress = Some(p);
        }
        if let Some(e) = self.error.take() {
            next.error = Some(e);
        }
        if let Some(l) = self.logs.take() {
            next.logs = Some(l);
        }
        if let Some(t) = self.node_times.take() {
            next.node_times = t;
        }
        if to.is_terminal() && next.completed_at.is_none() {
            next.completed_at = Some(now);
        }
        next.updated_at = now;
        Some(next)
    }
}

/// A page of jobs.
#[derive(Debug, Clone)]
pub struct JobPage {
    /// Jobs, newest first.
    pub jobs: Vec<JobRecord>,
    /// `seq` to continue after, when there may be more.
    pub next: Option<i64>,
}

/// Result of deleting an asset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    /// It was deleted; its blob may now be unreferenced.
    Yes {
        /// The blob it pointed at.
        blob: String,
    },
    /// There was no such asset for this tenant.
    NotFound,
}

/// How the store's writer is doing, as `/healthz` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreHealth {
    /// Whether the writer is running (it is restarted when it stops on a panic).
    pub writer_running: bool,
    /// How many times the writer was restarted after a panic.
    pub writer_restarts: u64,
    /// The storage failure of the latest write transaction (a full disk, an I/O error, a
    /// damaged file), until a later one succeeds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
}

/// The lock that orders linking blobs to assets (shared) against removing the blobs no
/// asset references (exclusive), held until dropped. A store that one process uses alone
/// holds nothing here: that process's own lock orders it. A store shared by several
/// processes holds a database lock, so one process's garbage collection never removes a blob
/// another process is about to record.
#[derive(Default)]
pub struct BlobLinkLock {
    /// What holds the lock until it is dropped; none when nothing is needed.
    _held: Option<Box<dyn Send>>,
}

impl BlobLinkLock {
    /// A lock held by `guard` (released when `guard` is dropped).
    pub fn held_by(guard: Box<dyn Send>) -> Self {
        Self { _held: Some(guard) }
    }
}

impl StoreHealth {
    /// Whether writes are being stored.
    pub fn is_ok(&self) -> bool {
        self.writer_running && self.failing.is_none()
    }
}

/// Persistent state. Every method is scoped by tenant where the data is.
#[async_trait]
pub trait Store: Send + Sync {
    /// How the writer is doing.
    fn health(&self) -> StoreHealth;
    /// Records a new job durably; with `idempotency_key`, claims the key in the same
    /// transaction (fails with [`StoreError::IdempotencyReuse`] if it was claimed before);
    /// with a `cost` above zero, draws it from the tenant's credits in the same transaction
    /// (fails with [`StoreError::InsufficientCredits`], writing nothing, if the balance is
    /// short), so concurrent submissions can never overspend.
    async fn insert_job(&self, job: JobRecord, idempotency_key: Option<String>, cost: i64) -> Result<(), StoreError>;
    /// Whether `tenant`'s idempotency `key` is claimed and live at `now` (claimed less than
    /// [`IDEMPOTENCY_TTL`] before): `Some(job id)` if so. A fast pre-check; `insert_job` decides races.
    async fn idempotency_claim(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Option<String>>, StoreError>;
    /// A job of `tenant`. Like every job record read back, its `workflow` is `Null`:
    /// [`job_workflow`](Self::job_workflow) reads it, for the few readers that need it.
    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError>;
    /// A job of any tenant (for workers and maintenance).
    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError>;
    /// `tenant`'s jobs, newest first, older than `before` (a `seq`), with every label in `labels`.
    async fn list_jobs(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<i64>,
        labels: &BTreeMap<String, String>,
        status: Option<JobStatus>,
    ) -> Result<JobPage, StoreError>;
    /// Whether `seq` is the position of one of `tenant`'s jobs (for cursor checks).
    async fn job_seq_exists(&self, tenant: &str, seq: i64) -> Result<bool, StoreError>;
    /// Applies `update` and the move of `moves` (from, to) that starts at the job's current
    /// status, in one write; a move to a terminal status also sets `completed_at`. Returns
    /// the updated job, or `None` when no move starts at the current status.
    async fn update_job(
        &self,
        id: &str,
        moves: &[(JobStatus, JobStatus)],
        update: JobUpdate,
    ) -> Result<Option<JobRecord>, StoreError>;
    /// The workflow of job `id`, or `None` when there is no such job.
    async fn job_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError>;
    /// The workflows of each of `job_ids` that exists. The default asks
    /// [`job_workflow`](Self::job_workflow) once per job.
    async fn workflows_of_jobs(&self, job_ids: &[String]) -> Result<HashMap<String, serde_json::Value>, StoreError> {
        let mut workflows = HashMap::with_capacity(job_ids.len());
        for id in job_ids {
            if let Some(workflow) = self.job_workflow(id).await? {
                workflows.insert(id.clone(), workflow);
            }
        }
        Ok(workflows)
    }
    /// Every job in one of `statuses`, oldest first.
    async fn jobs_with_status(&self, statuses: &[JobStatus]) -> Result<Vec<JobRecord>, StoreError>;
    /// `tenant`'s jobs in one of `statuses`, oldest first, at most `limit`.
    async fn tenant_jobs_with_status(
        &self,
        tenant: &str,
        statuses: &[JobStatus],
        limit: usize,
    ) -> Result<Vec<JobRecord>, StoreError>;
    /// How many of `tenant`'s jobs are in one of `statuses`.
    async fn count_tenant_jobs(&self, tenant: &str, statuses: &[JobStatus]) -> Result<i64, StoreError>;
    /// Ids and statuses of jobs whose `expires_at` is before `now`.
    async fn jobs_expiring(&self, now: DateTime<Utc>) -> Result<Vec<(String, JobStatus)>, StoreError>;
    /// Deletes a job and its output assets.
    async fn delete_job(&self, id: &str) -> Result<(), StoreError>;
    /// Job counts by status.
    async fn count_by_status(&self) -> Result<Vec<(JobStatus, i64)>, StoreError>;

    /// Records an asset; with `content`, the bytes are kept with the record (the asset is
    /// `inline`) and no blob is needed.
    async fn insert_asset(&self, asset: AssetRecord, content: Option<bytes::Bytes>) -> Result<(), StoreError>;
    /// The bytes of inline asset `id` (any tenant's; the caller has checked ownership), or
    /// `None` when there is no such asset or its content lives in the blob store.
    async fn asset_content(&self, id: &str) -> Result<Option<bytes::Bytes>, StoreError>;
    /// An asset of `tenant`.
    async fn asset(&self, tenant: &str, id: &str) -> Result<Option<AssetRecord>, StoreError>;
    /// An asset of any tenant (for signed content links).
    async fn asset_any(&self, id: &str) -> Result<Option<AssetRecord>, StoreError>;
    /// An asset of `tenant` over blob `blob`, if any (dedup).
    async fn asset_by_blob(&self, tenant: &str, blob: &str) -> Result<Option<AssetRecord>, StoreError>;
    /// The newest upload (not an output) of `tenant` named `file_path`.
    async fn upload_named(&self, tenant: &str, file_path: &str) -> Result<Option<AssetRecord>, StoreError>;
    /// The distinct names of `tenant`'s uploads (not outputs) whose media type starts with
    /// `content_type_prefix`, newest first, at most `limit`.
    async fn upload_names(
        &self,
        tenant: &str,
        content_type_prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;
    /// The outputs of a job, in commit order.
    async fn job_outputs(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError>;
    /// The outputs of each of `job_ids`, each job's in commit order (a job without outputs
    /// may be missing from the map). One read where the store can: a page of jobs is listed
    /// with it. The default asks [`job_outputs`](Self::job_outputs) once per job.
    async fn outputs_of_jobs(&self, job_ids: &[String]) -> Result<HashMap<String, Vec<AssetRecord>>, StoreError> {
        let mut outputs = HashMap::with_capacity(job_ids.len());
        for id in job_ids {
            outputs.insert(id.clone(), self.job_outputs(id).await?);
        }
        Ok(outputs)
    }
    /// A job of `tenant` with its outputs, in commit order: what `GET /jobs/{id}` shows.
    /// One read where the store can (clients poll it); the default asks
    /// [`job`](Self::job), then [`job_outputs`](Self::job_outputs). PostgreSQL's store sends
    /// both queries together on one connection.
    async fn job_with_outputs(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<(JobRecord, Vec<AssetRecord>)>, StoreError> {
        let Some(job) = self.job(tenant, id).await? else {
            return Ok(None);
        };
        let outputs = self.job_outputs(&job.id).await?;
        Ok(Some((job, outputs)))
    }
    /// Deletes an uploaded asset; outputs of a live job are [`StoreError::InUse`].
    async fn delete_asset(&self, tenant: &str, id: &str) -> Result<Deleted, StoreError>;
    /// Deletes the assets whose `expires_at` passed (uploads given one, and temporary
    /// outputs); returns their blobs.
    async fn delete_expired_assets(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError>;
    /// Deletes a job's output assets (before it is run again).
    async fn delete_job_outputs(&self, job_id: &str) -> Result<(), StoreError>;
    /// Blob hashes that no asset references (inline assets do not reference the blob store).
    async fn unreferenced_blobs(&self, candidates: Vec<String>) -> Result<Vec<String>, StoreError>;
    /// Takes the [`BlobLinkLock`]: `exclusive` to remove unreferenced blobs, shared to link
    /// blobs to new assets. The default, for a store only one process uses, holds nothing.
    async fn lock_blob_links(&self, exclusive: bool) -> Result<BlobLinkLock, StoreError> {
        let _ = exclusive;
        Ok(BlobLinkLock::default())
    }

    /// A user-data file of `tenant` with its content.
    async fn user_file(&self, tenant: &str, path: &str) -> Result<Option<(UserFile, Vec<u8>)>, StoreError>;
    /// `tenant`'s user-data files whose path starts with `prefix`, by path.
    async fn user_files(&self, tenant: &str, prefix: &str) -> Result<Vec<UserFile>, StoreError>;
    /// Writes a user-data file within `limits`.
    async fn put_user_file(
        &self,
        tenant: &str,
        path: &str,
        content: Vec<u8>,
        overwrite: bool,
        limits: UserDataLimits,
    ) -> Result<UserWrite, StoreError>;
    /// Deletes a user-data file; false when there was none.
    async fn delete_user_file(&self, tenant: &str, path: &str) -> Result<bool, StoreError>;
    /// Moves a user-data file.
    async fn move_user_file(
        &self,
        tenant: &str,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<UserWrite, StoreError>;

    /// Removes idempotency claims made before `before`.
    async fn purge_idempotency(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;

    /// Creates a tenant (no-op if it exists) with `credits`.
    async fn ensure_tenant(&self, name: &str, credits: i64) -> Result<(), StoreError>;
    /// Stores an API key hash for `tenant`.
    async fn add_api_key(&self, tenant: &str, key_hash: &str) -> Result<(), StoreError>;
    /// The tenant owning the key with this hash.
    async fn tenant_for_key(&self, key_hash: &str) -> Result<Option<String>, StoreError>;
    /// A tenant.
    async fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, StoreError>;
    /// Adds `delta` credits (negative to draw down); returns the new balance.
    async fn add_credits(&self, tenant: &str, delta: i64) -> Result<i64, StoreError>;
    /// Hands back the memory the store holds only for speed (page caches, idle
    /// connections), when the process has gone idle. Stores that hold none keep the default.
    async fn release_caches(&self) {}
}

/// Where the store lives, as `--database` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// The embedded SQLite store in this file (one process).
    Sqlite(PathBuf),
    /// A PostgreSQL database shared by any number of processes (`postgres://...`).
    Postgres(String),
}

impl Database {
    /// Reads `--database`: a `postgres://` or `postgresql://` URL, a `sqlite://PATH` or a
    /// plain path; unset, `weft.db` in `data_dir`.
    pub fn parse(url: Option<&str>, data_dir: &Path) -> Self {
        match url.map(str::trim) {
            None | Some("") => Database::Sqlite(data_dir.join("weft.db")),
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                Database::Postgres(u.to_string())
            }
            Some(u) => Database::Sqlite(PathBuf::from(u.strip_prefix("sqlite://").unwrap_or(u))),
        }
    }

    /// Opens the store, migrating its schema to the newest version this build knows (and
    /// refusing a schema newer than that).
    pub async fn open(&self) -> Result<Opened, StoreError> {
        self.open_as(&postgres::Connections::default()).await
    }

    /// [`open`](Self::open), naming and sizing a PostgreSQL store's connections as
    /// `connections` says (SQLite has none to size).
    pub async fn open_as(&self, connections: &postgres::Connections) -> Result<Opened, StoreError> {
        match self {
            Database::Sqlite(path) => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))?;
                }
                Ok(Opened {
                    store: Arc::new(sqlite::SqliteStore::open(path)?),
                    postgres: None,
                })
            }
            Database::Postgres(url) => {
                let pg = Arc::new(postgres::PgStore::connect_as(url, connections).await?);
                Ok(Opened {
                    store: pg.clone(),
                    postgres: Some(pg),
                })
            }
        }
    }

    /// Applies the schema migrations the database lacks (`weft db migrate`); returns the
    /// schema version it is at.
    pub async fn migrate(&self) -> Result<i64, StoreError> {
        match self {
            Database::Sqlite(_) => {
                self.open().await?;
                Ok(sqlite::SCHEMA_VERSION)
            }
            Database::Postgres(url) => {
                postgres::PgStore::migrate(url).await?;
                Ok(postgres::SCHEMA_VERSION)
            }
        }
    }
}

/// An opened store.
pub struct Opened {
    /// The store.
    pub store: Arc<dyn Store>,
    /// The same store when it is PostgreSQL, which several processes can share.
    pub postgres: Option<Arc<postgres::PgStore>>,
}

/// Formats a time for storage: RFC 3339, UTC, microseconds, so text order is time order.
pub fn time_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(status: JobStatus) -> JobRecord {
        let then = DateTime::<Utc>::from_timestamp(1_700_000_000, 0).unwrap();
        JobRecord {
            id: "j".into(),
            tenant: "t".into(),
            status,
            workflow: serde_json::Value::Null,
            labels: BTreeMap::new(),
            created_at: then,
            updated_at: then,
            started_at: Some(then),
            completed_at: None,
            expires_at: then,
            progress: None,
            error: None,
            logs: None,
            node_times: Vec::new(),
            seq: 1,
        }
    }

    #[test]
    fn an_update_applies_only_along_a_listed_move_and_sets_only_its_fields() {
        let now = Utc::now();
        let moves = [(JobStatus::Queued, JobStatus::Running)];
        let mut update = JobUpdate {
            error: Some(JobError {
                code: "x".into(),
                message: "y".into(),
                node_id: None,
                class_type: None,
                traceback: None,
            }),
            ..JobUpdate::default()
        };
        assert_eq!(update.apply(job(JobStatus::Running), &moves, now), None);
        let moved = update.apply(job(JobStatus::Queued), &moves, now).unwrap();
        assert_eq!(moved.status, JobStatus::Running);
        assert_eq!(moved.error.unwrap().code, "x");
        assert_eq!(
            moved.started_at,
            job(JobStatus::Queued).started_at,
            "kept: not in the update"
        );
        assert_eq!((moved.completed_at, moved.updated_at), (None, now));
    }

    #[test]
    fn a_terminal_move_without_a_completion_time_completes_now() {
        let now = Utc::now();
        let moves = [(JobStatus::Running, JobStatus::Failed)];
        let failed = JobUpdate::default()
            .apply(job(JobStatus::Running), &moves, now)
            .unwrap();
        assert_eq!(failed.completed_at, Some(now));
        let given = now - chrono::TimeDelta::seconds(5);
        let mut update = JobUpdate {
            completed_at: Some(given),
            ..JobUpdate::default()
        };
        let failed = update.apply(job(JobStatus::Running), &moves, now).unwrap();
        assert_eq!(failed.completed_at, Some(given));
    }
}
