//! The shared store: PostgreSQL, for many weft processes on many machines. A write that
//! must survive power loss (a submission, an upload, a key, credits) commits with the
//! server's `synchronous_commit` (on by default), so a 201 means durably recorded. The
//! state updates that follow (start, outputs, finish, events) commit with
//! `synchronous_commit = off`, as the SQLite store relaxes them: they survive a process
//! crash, and after a power cut the worst case is a job that runs again. Sequence numbers come from an identity
//! column, idempotency keys from a primary key, credits from a guarded `UPDATE`: no
//! read-then-write races between processes. The cross-process queue, leases, cancel and
//! event wake-ups are in [`coordinator`].

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

use super::*;

mod claims;
mod coordinator;
mod log;
mod schema;
mod wakeups;

pub use coordinator::PgCoordinator;
pub use wakeups::Hears;

/// The schema version this build migrates to.
pub const SCHEMA_VERSION: i64 = schema::LATEST;

/// Makes the current transaction's commit return before its WAL record is flushed.
pub(crate) const RELAXED: &str = "SET LOCAL synchronous_commit = off";

/// The connections of one process: how it names them in `pg_stat_activity` and how many
/// its pool may open. Besides the pool a process holds one connection for wake-ups and its
/// liveness lock, one for sending wake-ups, and up to [`LOCK_POOL_SIZE`] for blob-link locks
/// (opened only while an upload or a collection holds one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connections {
    /// `application_name` of every connection.
    pub application_name: String,
    /// The most connections the pool opens.
    pub pool_size: usize,
}

/// Pool connections for serving the API: submissions, reads and event streams.
const API_CONNECTIONS: usize = 12;

/// Pool connections for running jobs: the claimer, the log writer, the lease renewal and
/// the maintenance, plus one per two workers (a running job's own reads and writes).
const WORKER_CONNECTIONS: usize = 4;

/// The most pool connections job workers add, whatever their number.
const MOST_WORKER_CONNECTIONS: usize = 16;

impl Connections {
    /// For process `process` that serves the API (`api`) and runs `workers` job workers.
    pub fn for_process(process: &str, api: bool, workers: usize) -> Self {
        let mut pool_size = if api { API_CONNECTIONS } else { 0 };
        if workers > 0 {
            pool_size += (WORKER_CONNECTIONS + workers.div_ceil(2)).min(MOST_WORKER_CONNECTIONS);
        }
        Self {
            application_name: format!("weft {process}"),
            pool_size: pool_size.max(2),
        }
    }
}

impl Default for Connections {
    /// A process serving both the API and a few workers, named `weft`.
    fn default() -> Self {
        Self::for_process("", true, 4)
    }
}

/// Connections that hold blob-link locks ([`BlobLinkLock`]): a pool of their own, so that
/// callers holding a lock while they record an asset never wait for a connection that
/// other lock holders have taken.
const LOCK_POOL_SIZE: usize = 8;

/// The advisory-lock key of the blob-link lock ("weftblob").
const BLOB_LINK_LOCK_KEY: i64 = 0x7765_6674_626c_6f62;

/// The PostgreSQL store.
pub struct PgStore {
    pool: Pool,
    /// Connections for blob-link locks (see [`LOCK_POOL_SIZE`]).
    locks: Pool,
    config: tokio_postgres::Config,
    /// Why the latest health probe could not reach the database, until one can again.
    failing: Arc<std::sync::Mutex<Option<String>>>,
}

/// How often [`PgStore::health`]'s probe asks the database.
const HEALTH_PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The text of a database error, with the server's message when there is one.
fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        StoreError::Backend(error_text(&e))
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Backend(format!("database connection: {e}"))
    }
}

fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
}

impl PgStore {
    /// Connects to the database at `url` (`postgres://...`), migrating its schema to the
    /// newest version this build knows; fails if it is newer.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_as(url, &Connections::default()).await
    }

    /// [`connect`](Self::connect), with `connections` named and sized as given.
    pub async fn connect_as(url: &str, connections: &Connections) -> Result<Self, StoreError> {
        let store = Self::connect_unmigrated(url, connections)?;
        let mut conn = store.pool.get().await?;
        schema::migrate(&mut conn).await?;
        store.start_health_probe();
        Ok(store)
    }

    /// Probes the database every [`HEALTH_PROBE_EVERY`] for as long as the store lives, so
    /// that `/healthz` reports a database that cannot be reached.
    fn start_health_probe(&self) {
        let (pool, failing) = (self.pool.clone(), Arc::downgrade(&self.failing));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(HEALTH_PROBE_EVERY).await;
                let outcome = match pool.get().await {
                    Ok(conn) => conn
                        .simple_query("SELECT 1")
                        .await
                        .map(drop)
                        .map_err(|e| error_text(&e)),
                    Err(e) => Err(format!("database connection: {e}")),
                };
                let Some(failing) = failing.upgrade() else {
                    return;
                };
                *failing.lock().unwrap_or_else(|e| e.into_inner()) = outcome.err();
            }
        });
    }

    /// Applies the migrations the database at `url` lacks; returns the versions applied.
    pub async fn migrate(url: &str) -> Result<Vec<i64>, StoreError> {
        let store = Self::connect_unmigrated(url, &Connections::default())?;
        let mut conn = store.pool.get().await?;
        schema::migrate(&mut conn).await
    }

    fn connect_unmigrated(url: &str, connections: &Connections) -> Result<Self, StoreError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Backend(format!("invalid database URL: {e}")))?;
        if config.get_application_name().is_none() {
            config.application_name(connections.application_name.trim());
        }
        let pool_of = |size: usize| {
            let manager = Manager::from_config(
                config.clone(),
                NoTls,
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(manager)
                .max_size(size)
                .runtime(deadpool_postgres::Runtime::Tokio1)
                .build()
                .map_err(|e| StoreError::Backend(format!("database pool: {e}")))
        };
        Ok(Self {
            pool: pool_of(connections.pool_size)?,
            locks: pool_of(LOCK_POOL_SIZE)?,
            config,
            failing: Arc::default(),
        })
    }

    /// The cross-process coordinator over this database, for a process named `process`
    /// whose claims last `lease` unless renewed.
    pub fn coordinator(&self, process: String, lease: std::time::Duration) -> Arc<PgCoordinator> {
        self.coordinator_hearing(process, lease, Hears::ALL)
    }

    /// [`coordinator`](Self::coordinator), listening only for the wake-ups of `hears`.
    pub fn coordinator_hearing(&self, process: String, lease: std::time::Duration, hears: Hears) -> Arc<PgCoordinator> {
        PgCoordinator::start(self.pool.clone(), self.config.clone(), process, lease, hears)
    }

    async fn rows(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, StoreError> {
        let conn = self.pool.get().await?;
        let stmt = conn.prepare_cached(sql).await?;
        Ok(conn.query(&stmt, args).await?)
    }

    async fn row(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Option<Row>, StoreError> {
        let conn = self.pool.get().await?;
        let stmt = conn.prepare_cached(sql).await?;
        Ok(conn.query_opt(&stmt, args).await?)
    }

    async fn exec(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        let conn = self.pool.get().await?;
        let stmt = conn.prepare_cached(sql).await?;
        Ok(conn.execute(&stmt, args).await?)
    }
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

fn job_from_row(row: &Row) -> Result<JobRecord, StoreError> {
    let status: String = row.get(3);
    let labels: String = row.get(4);
    Ok(JobRecord {
        id: row.get(0),
        seq: row.get(1),
        tenant: row.get(2),
        status: JobStatus::from_stored(&status)?,
        workflow: serde_json::Value::Null,
        labels: serde_json::from_str(&labels).unwrap_or_default(),
        created_at: row.get(5),
        updated_at: row.get(6),
        started_at: row.get(7),
        completed_at: row.get(8),
        expires_at: row.get(9),
        progress: json_col(row.get(10)),
        error: json_col(row.get(11)),
        logs: json_col(row.get(12)),
        node_times: json_col(row.get(13)).unwrap_or_default(),
    })
}

/// A job's stored workflow text, parsed (`Null` if it somehow is not JSON).
fn parse_workflow(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or(serde_json::Value::Null)
}

const ASSET_COLUMNS: &str = "id, tenant, blob, size_bytes, content_type, file_path, job_id, node_id, kind, tags, \
     created_at, expires_at, output_index, content IS NOT NULL";

/// The columns [`user_file_from_row`] reads.
const USER_FILE_COLUMNS: &str = "path, length(content)::BIGINT, created_at, modified_at";

/// Inserts `asset`'s row within `tx`, with `content` when it is kept inline.
async fn insert_asset_row(
    tx: &deadpool_postgres::Transaction<'_>,
    asset: &AssetRecord,
    content: Option<&[u8]>,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO assets (id, tenant, blob, size_bytes, content_type, file_path, job_id, node_id, kind, tags, created_at, expires_at, output_index, content)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        &[
            &asset.id,
            &asset.tenant,
            &asset.blob,
            &asset.size_bytes,
            &asset.content_type,
            &asset.file_path,
            &asset.job_id,
            &asset.node_id,
            &asset.kind,
            &to_json(&asset.tags),
            &asset.created_at,
            &asset.expires_at,
            &asset.output_index,
            &content,
        ],
    )
    .await?;
    Ok(())
}

fn user_file_from_row(row: &Row) -> UserFile {
    UserFile {
        path: row.get(0),
        size: row.get(1),
        created: row.get(2),
        modified: row.get(3),
    }
}

fn asset_from_row(row: &Row) -> AssetRecord {
    let tags: String = row.get(9);
    AssetRecord {
        id: row.get(0),
        tenant: row.get(1),
        blob: row.get(2),
        size_bytes: row.get(3),
        content_type: row.get(4),
        file_path: row.get(5),
        job_id: row.get(6),
        node_id: row.get(7),
        kind: row.get(8),
        tags: serde_json::from_str(&tags).unwrap_or_default(),
        created_at: row.get(10),
        expires_at: row.get(11),
        output_index: row.get(12),
        inline: row.get(13),
    }
}

impl PgStore {
    /// Records `job`, which claims no key and costs nothing, with its labels and its
    /// tenant's turn, in one statement: one round trip and one commit.
    async fn insert_plain_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        let conn = self.pool.get().await?;
        let insert = conn.prepare_cached(claims::INSERT_JOB).await?;
        let row = JobRow::new(job);
        if job_inserted(conn.query_one(&insert, &row.params()).await)? == 0 {
            // A claim removed the tenant's turn as the statement looked for it. The job is
            // committed now, so the turn given here stays.
            claims::rejoin_turn(&conn, &job.tenant).await?;
        }
        Ok(())
    }
}

/// A job's columns as [`claims::INSERT_JOB`] takes them.
struct JobRow<'a> {
    job: &'a JobRecord,
    status: &'static str,
    workflow: String,
    labels: String,
    progress: Option<String>,
    names: Vec<&'a str>,
    values: Vec<&'a str>,
}

impl<'a> JobRow<'a> {
    fn new(job: &'a JobRecord) -> Self {
        let (names, values) = job.labels.iter().map(|(n, v)| (n.as_str(), v.as_str())).unzip();
        Self {
            job,
            status: job.status.as_str(),
            workflow: job.workflow.to_string(),
            labels: to_json(&job.labels),
            progress: job.progress.as_ref().map(to_json),
            names,
            values,
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 11] {
        [
            &self.job.id,
            &self.job.tenant,
            &self.status,
            &self.workflow,
            &self.labels,
            &self.job.created_at,
            &self.job.updated_at,
            &self.job.expires_at,
            &self.progress,
            &self.names,
            &self.values,
        ]
    }
}

/// How many turns [`claims::INSERT_JOB`] found or made, or why it failed (a job with this id
/// exists, or the database failed).
fn job_inserted(inserted: Result<Row, tokio_postgres::Error>) -> Result<i64, StoreError> {
    match inserted {
        Ok(row) => Ok(row.get(0)),
        Err(e) if is_unique_violation(&e) => Err(StoreError::Conflict("a job with this id exists".into())),
        Err(e) => Err(e.into()),
    }
}

/// A blob-link lock: a transaction-level advisory lock on a connection of the lock pool,
/// released when the transaction ends.
struct AdvisoryLock(Option<deadpool_postgres::Object>);

impl Drop for AdvisoryLock {
    fn drop(&mut self) {
        let Some(conn) = self.0.take() else {
            return;
        };
        // Ending the transaction releases the lock. A connection that cannot end it is
        // closed instead of going back to the pool, which releases it too.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if conn.batch_execute("ROLLBACK").await.is_err() {
                        drop(deadpool_postgres::Object::take(conn));
                    }
                });
            }
            Err(_) => drop(deadpool_postgres::Object::take(conn)),
        }
    }
}

#[async_trait]
impl Store for PgStore {
    /// Writes go straight to the database, so the "writer" is the database itself: running,
    /// and failing while the health probe cannot reach it.
    fn health(&self) -> StoreHealth {
        StoreHealth {
            writer_running: true,
            writer_restarts: 0,
            failing: self.failing.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    async fn insert_job(&self, job: JobRecord, idempotency_key: Option<String>, cost: i64) -> Result<(), StoreError> {
        if idempotency_key.is_none() && cost == 0 {
            return self.insert_plain_job(&job).await;
        }
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        if cost > 0 {
            // The row lock taken by the UPDATE serialises concurrent charges of one tenant.
            let charged = tx
                .execute(
                    "UPDATE tenants SET credits = credits - $2 WHERE name = $1 AND credits >= $2",
                    &[&job.tenant, &cost],
                )
                .await?;
            if charged == 0 {
                let balance = tx
                    .query_opt("SELECT credits FROM tenants WHERE name = $1", &[&job.tenant])
                    .await?
                    .map_or(0, |r| r.get::<_, i64>(0));
                return Err(StoreError::InsufficientCredits { balance });
            }
        }
        if let Some(key) = &idempotency_key {
            // A key lives IDEMPOTENCY_TTL from its first use: an older claim is replaced. The
            // primary key makes a concurrent claim of the same key wait for this transaction
            // and then find it.
            let live_after = job.created_at - IDEMPOTENCY_TTL;
            let claimed = tx
                .query_opt(
                    "INSERT INTO idempotency_keys (tenant, key, job_id, created_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tenant, key) DO UPDATE SET job_id = excluded.job_id, created_at = excluded.created_at
                     WHERE idempotency_keys.created_at < $5
                     RETURNING 1",
                    &[&job.tenant, key, &job.id, &job.created_at, &live_after],
                )
                .await?;
            if claimed.is_none() {
                let job_id = tx
                    .query_opt(
                        "SELECT job_id FROM idempotency_keys WHERE tenant = $1 AND key = $2",
                        &[&job.tenant, key],
                    )
                    .await?
                    .and_then(|r| r.get::<_, Option<String>>(0));
                return Err(StoreError::IdempotencyReuse { job_id });
            }
        }
        let row = JobRow::new(&job);
        let turns = job_inserted(tx.query_one(claims::INSERT_JOB, &row.params()).await)?;
        tx.commit().await?;
        if turns == 0 {
            claims::rejoin_turn(&conn, &job.tenant).await?;
        }
        Ok(())
    }

    async fn idempotency_claim(
        &self,
        tenant: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Option<String>>, StoreError> {
        let live_after = now - IDEMPOTENCY_TTL;
        Ok(self
            .row(
                "SELECT job_id FROM idempotency_keys WHERE tenant = $1 AND key = $2 AND created_at >= $3",
                &[&tenant, &key, &live_after],
            )
            .await?
            .map(|r| r.get(0)))
    }

    async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 AND tenant = $2");
        self.row(&sql, &[&id, &tenant])
            .await?
            .as_ref()
            .map(job_from_row)
            .transpose()
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        self.row(&sql, &[&id]).await?.as_ref().map(job_from_row).transpose()
    }

    async fn list_jobs(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<i64>,
        labels: &BTreeMap<String, String>,
        status: Option<JobStatus>,
    ) -> Result<JobPage, StoreError> {
        let before = before.unwrap_or(i64::MAX);
        let limit_plus = (limit as i64).saturating_add(1);
        let status = status.map(|s| s.as_str());
        let mut sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = $1 AND seq < $2");
        let mut args: Vec<&(dyn ToSql + Sync)> = vec![&tenant, &before];
        if let Some(status) = &status {
            args.push(status);
            sql.push_str(&format!(" AND status = ${}", args.len()));
        }
        let pairs: Vec<(&String, &String)> = labels.iter().collect();
        for (name, value) in &pairs {
            args.push(*name);
            args.push(*value);
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM job_labels l WHERE l.job_id = jobs.id AND l.name = ${} AND l.value = ${})",
                args.len() - 1,
                args.len()
            ));
        }
        args.push(&limit_plus);
        sql.push_str(&format!(" ORDER BY seq DESC LIMIT ${}", args.len()));
        let mut jobs: Vec<JobRecord> = self
            .rows(&sql, &args)
            .await?
            .iter()
            .map(job_from_row)
            .collect::<Result<_, _>>()?;
        let next = if jobs.len() > limit {
            jobs.truncate(limit);
            jobs.last().map(|j| j.seq)
        } else {
            None
        };
        Ok(JobPage { jobs, next })
    }

    async fn job_seq_exists(&self, tenant: &str, seq: i64) -> Result<bool, StoreError> {
        Ok(self
            .row("SELECT 1 FROM jobs WHERE tenant = $1 AND seq = $2", &[&tenant, &seq])
            .await?
            .is_some())
    }

    async fn update_job(
        &self,
        id: &str,
        moves: &[(JobStatus, JobStatus)],
        mut update: JobUpdate,
    ) -> Result<Option<JobRecord>, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.batch_execute(RELAXED).await?;
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 FOR NO KEY UPDATE");
        let Some(job) = tx
            .query_opt(&sql, &[&id])
            .await?
            .as_ref()
            .map(job_from_row)
            .transpose()?
        else {
            return Ok(None);
        };
        let now = Utc::now();
        let Some(next) = update.apply(job, moves, now) else {
            return Ok(None);
        };
        tx.execute(
            "UPDATE jobs SET status = $2, started_at = $3, completed_at = $4, progress = $5, error = $6, logs = $7, updated_at = $8, node_times = $9 WHERE id = $1",
            &[
                &next.id,
                &next.status.as_str(),
                &next.started_at,
                &next.completed_at,
                &next.progress.as_ref().map(to_json),
                &next.error.as_ref().map(to_json),
                &next.logs.as_ref().map(to_json),
                &now,
                &(!next.node_times.is_empty()).then(|| to_json(&next.node_times)),
            ],
        )
        .await?;
        for (asset, content) in &update.outputs {
            insert_asset_row(&tx, asset, Some(content)).await?;
        }
        tx.commit().await?;
        Ok(Some(next))
    }

    async fn job_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        let row = self.row("SELECT workflow FROM jobs WHERE id = $1", &[&id]).await?;
        Ok(row.map(|r| parse_workflow(r.get(0))))
    }

    async fn workflows_of_jobs(&self, job_ids: &[String]) -> Result<HashMap<String, serde_json::Value>, StoreError> {
        let rows = self
            .rows("SELECT id, workflow FROM jobs WHERE id = ANY($1)", &[&job_ids])
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), parse_workflow(r.get(1)))).collect())
    }

    async fn jobs_with_status(&self, statuses: &[JobStatus]) -> Result<Vec<JobRecord>, StoreError> {
        let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE status = ANY($1) ORDER BY seq");
        self.rows(&sql, &[&names]).await?.iter().map(job_from_row).collect()
    }

    async fn tenant_jobs_with_status(
        &self,
        tenant: &str,
        statuses: &[JobStatus],
        limit: usize,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql =
            format!("SELECT {JOB_COLUMNS} FROM jobs WHERE tenant = $1 AND status = ANY($2) ORDER BY seq LIMIT $3");
        self.rows(&sql, &[&tenant, &names, &limit])
            .await?
            .iter()
            .map(job_from_row)
            .collect()
    }

    async fn count_tenant_jobs(&self, tenant: &str, statuses: &[JobStatus]) -> Result<i64, StoreError> {
        let names: Vec<&str> = statuses.iter().map(|s| s.as_str()).collect();
        let row = self
            .row(
                "SELECT COUNT(*) FROM jobs WHERE tenant = $1 AND status = ANY($2)",
                &[&tenant, &names],
            )
            .await?;
        Ok(row.map_or(0, |r| r.get(0)))
    }

    async fn jobs_expiring(&self, now: DateTime<Utc>) -> Result<Vec<(String, JobStatus)>, StoreError> {
        Ok(self
            .rows("SELECT id, status FROM jobs WHERE expires_at < $1", &[&now])
            .await?
            .iter()
            .map(|r| {
                let status: String = r.get(1);
                Ok((r.get(0), JobStatus::from_stored(&status)?))
            })
            .collect::<Result<_, StoreError>>()?)
    }

    async fn delete_job(&self, id: &str) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.execute("DELETE FROM assets WHERE job_id = $1", &[&id]).await?;
        tx.execute("DELETE FROM jobs WHERE id = $1", &[&id]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn count_by_status(&self) -> Result<Vec<(JobStatus, i64)>, StoreError> {
        self.rows("SELECT status, COUNT(*) FROM jobs GROUP BY status", &[])
            .await?
            .iter()
            .map(|r| Ok((JobStatus::from_stored(r.get(0))?, r.get(1))))
            .collect()
    }

    async fn insert_asset(&self, asset: AssetRecord, content: Option<bytes::Bytes>) -> Result<(), StoreError> {
        // An upload is acknowledged to its caller; an output can be made again by a re-run.
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        if asset.job_id.is_some() {
            tx.batch_execute(RELAXED).await?;
        }
        insert_asset_row(&tx, &asset, content.as_deref()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn asset_content(&self, id: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        let row = self.row("SELECT content FROM assets WHERE id = $1", &[&id]).await?;
        Ok(row.and_then(|r| r.get::<_, Option<Vec<u8>>>(0)).map(bytes::Bytes::from))
    }

    async fn asset(&self, tenant: &str, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE id = $1 AND tenant = $2");
        Ok(self.row(&sql, &[&id, &tenant]).await?.as_ref().map(asset_from_row))
    }

    async fn asset_any(&self, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE id = $1");
        Ok(self.row(&sql, &[&id]).await?.as_ref().map(asset_from_row))
    }

    async fn asset_by_blob(&self, tenant: &str, blob: &str) -> Result<Option<AssetRecord>, StoreError> {
        let sql =
            format!("SELECT {ASSET_COLUMNS} FROM assets WHERE blob = $1 AND tenant = $2 ORDER BY created_at LIMIT 1");
        Ok(self.row(&sql, &[&blob, &tenant]).await?.as_ref().map(asset_from_row))
    }

    async fn upload_named(&self, tenant: &str, file_path: &str) -> Result<Option<AssetRecord>, StoreError> {
        let sql = format!(
            "SELECT {ASSET_COLUMNS} FROM assets WHERE tenant = $1 AND file_path = $2 AND job_id IS NULL \
             ORDER BY created_at DESC LIMIT 1"
        );
        Ok(self
            .row(&sql, &[&tenant, &file_path])
            .await?
            .as_ref()
            .map(asset_from_row))
    }

    async fn upload_names(
        &self,
        tenant: &str,
        content_type_prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = limit as i64;
        // A prefix compare without LIKE, so `%` and `_` match only themselves.
        let sql = "SELECT file_path FROM assets WHERE tenant = $1 AND job_id IS NULL \
                   AND starts_with(content_type, $2) GROUP BY file_path ORDER BY MAX(created_at) DESC LIMIT $3";
        Ok(self
            .rows(sql, &[&tenant, &content_type_prefix, &limit])
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn user_file(&self, tenant: &str, path: &str) -> Result<Option<(UserFile, Vec<u8>)>, StoreError> {
        let sql = format!("SELECT {USER_FILE_COLUMNS}, content FROM user_files WHERE tenant = $1 AND path = $2");
        Ok(self
            .row(&sql, &[&tenant, &path])
            .await?
            .map(|r| (user_file_from_row(&r), r.get(4))))
    }

    async fn user_files(&self, tenant: &str, prefix: &str) -> Result<Vec<UserFile>, StoreError> {
        let sql = format!(
            "SELECT {USER_FILE_COLUMNS} FROM user_files WHERE tenant = $1 AND starts_with(path, $2) ORDER BY path"
        );
        Ok(self
            .rows(&sql, &[&tenant, &prefix])
            .await?
            .iter()
            .map(user_file_from_row)
            .collect())
    }

    async fn put_user_file(
        &self,
        tenant: &str,
        path: &str,
        content: Vec<u8>,
        overwrite: bool,
        limits: UserDataLimits,
    ) -> Result<UserWrite, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        // One writer per tenant at a time, so two processes cannot both pass the limits.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('user_files:' || $1))",
            &[&tenant],
        )
        .await?;
        let existing = tx
            .query_opt(
                "SELECT length(content)::BIGINT FROM user_files WHERE tenant = $1 AND path = $2",
                &[&tenant, &path],
            )
            .await?
            .map(|r| r.get::<_, i64>(0));
        if existing.is_some() && !overwrite {
            return Ok(UserWrite::Exists);
        }
        let totals = tx
            .query_one(
                "SELECT COUNT(*)::BIGINT, COALESCE(SUM(length(content)), 0)::BIGINT FROM user_files WHERE tenant = $1",
                &[&tenant],
            )
            .await?;
        let (files, bytes): (i64, i64) = (totals.get(0), totals.get(1));
        let new_files = files + i64::from(existing.is_none());
        if new_files > limits.files || bytes - existing.unwrap_or(0) + content.len() as i64 > limits.bytes {
            return Ok(UserWrite::Full);
        }
        let now = Utc::now();
        let sql = format!(
            "INSERT INTO user_files (tenant, path, content, created_at, modified_at) VALUES ($1, $2, $3, $4, $4) \
             ON CONFLICT (tenant, path) DO UPDATE SET content = EXCLUDED.content, modified_at = EXCLUDED.modified_at \
             RETURNING {USER_FILE_COLUMNS}"
        );
        let row = tx.query_one(&sql, &[&tenant, &path, &content, &now]).await?;
        tx.commit().await?;
        Ok(UserWrite::Written(user_file_from_row(&row)))
    }

    async fn delete_user_file(&self, tenant: &str, path: &str) -> Result<bool, StoreError> {
        Ok(self
            .exec(
                "DELETE FROM user_files WHERE tenant = $1 AND path = $2",
                &[&tenant, &path],
            )
            .await?
            > 0)
    }

    async fn move_user_file(
        &self,
        tenant: &str,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<UserWrite, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        let exists = "SELECT 1 FROM user_files WHERE tenant = $1 AND path = $2 FOR UPDATE";
        if tx.query_opt(exists, &[&tenant, &from]).await?.is_none() {
            return Ok(UserWrite::Missing);
        }
        if from != to && tx.query_opt(exists, &[&tenant, &to]).await?.is_some() {
            if !overwrite {
                return Ok(UserWrite::Exists);
            }
            tx.execute(
                "DELETE FROM user_files WHERE tenant = $1 AND path = $2",
                &[&tenant, &to],
            )
            .await?;
        }
        let sql = format!(
            "UPDATE user_files SET path = $3, modified_at = $4 WHERE tenant = $1 AND path = $2 \
             RETURNING {USER_FILE_COLUMNS}"
        );
        let row = tx.query_one(&sql, &[&tenant, &from, &to, &Utc::now()]).await?;
        tx.commit().await?;
        Ok(UserWrite::Written(user_file_from_row(&row)))
    }

    async fn lock_blob_links(&self, exclusive: bool) -> Result<BlobLinkLock, StoreError> {
        let lock = if exclusive {
            "pg_advisory_xact_lock"
        } else {
            "pg_advisory_xact_lock_shared"
        };
        // Should the lock fail half-way, dropping the guard ends what began.
        let guard = AdvisoryLock(Some(self.locks.get().await?));
        if let Some(conn) = &guard.0 {
            conn.batch_execute(&format!("BEGIN; SELECT {lock}({BLOB_LINK_LOCK_KEY})"))
                .await?;
        }
        Ok(BlobLinkLock::held_by(Box::new(guard)))
    }

    async fn job_outputs(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
        let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE job_id = $1 ORDER BY output_index");
        Ok(self.rows(&sql, &[&job_id]).await?.iter().map(asset_from_row).collect())
    }

    async fn job_with_outputs(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<(JobRecord, Vec<AssetRecord>)>, StoreError> {
        let conn = self.pool.get().await?;
        let job_stmt = conn
            .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1 AND tenant = $2"))
            .await?;
        let outputs_stmt = conn
            .prepare_cached(&format!(
                "SELECT {ASSET_COLUMNS} FROM assets WHERE job_id = $1 ORDER BY output_index"
            ))
            .await?;
        // Both queries go out together on the one connection: one round trip, not two.
        let (job_args, outputs_args): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 1]) = ([&id, &tenant], [&id]);
        let (job, outputs) = tokio::try_join!(
            conn.query_opt(&job_stmt, &job_args),
            conn.query(&outputs_stmt, &outputs_args)
        )?;
        job.as_ref()
            .map(|row| Ok((job_from_row(row)?, outputs.iter().map(asset_from_row).collect())))
            .transpose()
    }

    async fn outputs_of_jobs(&self, job_ids: &[String]) -> Result<HashMap<String, Vec<AssetRecord>>, StoreError> {
        let sql = format!("SELECT {ASSET_COLUMNS} FROM assets WHERE job_id = ANY($1) ORDER BY job_id, output_index");
        let mut outputs: HashMap<String, Vec<AssetRecord>> = HashMap::with_capacity(job_ids.len());
        for asset in self.rows(&sql, &[&job_ids]).await?.iter().map(asset_from_row) {
            outputs
                .entry(asset.job_id.clone().unwrap_or_default())
                .or_default()
                .push(asset);
        }
        Ok(outputs)
    }

    async fn delete_asset(&self, tenant: &str, id: &str) -> Result<Deleted, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        let found = tx
            .query_opt(
                "SELECT job_id, blob FROM assets WHERE id = $1 AND tenant = $2 FOR UPDATE",
                &[&id, &tenant],
            )
            .await?;
        let Some(found) = found else {
            return Ok(Deleted::NotFound);
        };
        if found.get::<_, Option<String>>(0).is_some() {
            return Err(StoreError::InUse);
        }
        tx.execute("DELETE FROM assets WHERE id = $1", &[&id]).await?;
        tx.commit().await?;
        Ok(Deleted::Yes { blob: found.get(1) })
    }

    async fn delete_expired_assets(&self, now: DateTime<Utc>) -> Result<Vec<String>, StoreError> {
        Ok(self
            .rows(
                "DELETE FROM assets WHERE expires_at IS NOT NULL AND expires_at < $1 RETURNING blob",
                &[&now],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn delete_job_outputs(&self, job_id: &str) -> Result<(), StoreError> {
        self.exec("DELETE FROM assets WHERE job_id = $1", &[&job_id]).await?;
        Ok(())
    }

    async fn unreferenced_blobs(&self, candidates: Vec<String>) -> Result<Vec<String>, StoreError> {
        Ok(self
            .rows(
                "SELECT c FROM unnest($1::text[]) AS c WHERE NOT EXISTS (SELECT 1 FROM assets WHERE blob = c AND content IS NULL)",
                &[&candidates],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn purge_idempotency(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        self.exec("DELETE FROM idempotency_keys WHERE created_at < $1", &[&before])
            .await
    }

    async fn ensure_tenant(&self, name: &str, credits: i64) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO tenants (name, credits, created_at) VALUES ($1, $2, now()) ON CONFLICT (name) DO NOTHING",
            &[&name, &credits],
        )
        .await?;
        Ok(())
    }

    async fn add_api_key(&self, tenant: &str, key_hash: &str) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO api_keys (key_hash, tenant, created_at) VALUES ($1, $2, now())",
            &[&key_hash, &tenant],
        )
        .await?;
        Ok(())
    }

    async fn tenant_for_key(&self, key_hash: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .row("SELECT tenant FROM api_keys WHERE key_hash = $1", &[&key_hash])
            .await?
            .map(|r| r.get(0)))
    }

    async fn tenant(&self, name: &str) -> Result<Option<TenantRecord>, StoreError> {
        Ok(self
            .row("SELECT name, credits FROM tenants WHERE name = $1", &[&name])
            .await?
            .map(|r| TenantRecord {
                name: r.get(0),
                credits: r.get(1),
            }))
    }

    async fn add_credits(&self, tenant: &str, delta: i64) -> Result<i64, StoreError> {
        let row = self
            .row(
                "INSERT INTO tenants (name, credits, created_at) VALUES ($1, $2, now())
                 ON CONFLICT (name) DO UPDATE SET credits = tenants.credits + excluded.credits
                 RETURNING credits",
                &[&tenant, &delta],
            )
            .await?;
        row.map(|r| r.get(0))
            .ok_or_else(|| StoreError::Backend("adding credits returned nothing".into()))
    }
}
