//! The PostgreSQL schema as numbered migrations. Each runs once, in order, in its own
//! transaction, under an advisory lock so that processes starting together do not race;
//! `weft_schema` records the versions applied. A database whose newest version is above
//! [`LATEST`] was migrated by a newer weft, and this one refuses to run on it.

use deadpool_postgres::Object;

use crate::store::StoreError;

/// The advisory lock key that serialises migrations (any constant unique to weft).
const MIGRATION_LOCK: i64 = 0x7765_6674_6d69_6772;

/// The migrations, in order: version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    seq BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,
    workflow TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    started_at TIMESTAMPTZ,
    completed_at TIMESTAMPTZ,
    expires_at TIMESTAMPTZ NOT NULL,
    progress TEXT,
    error TEXT,
    logs TEXT,
    claimed_by TEXT,
    lease_until TIMESTAMPTZ,
    event_seq BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX jobs_by_tenant ON jobs (tenant, seq);
CREATE INDEX jobs_by_tenant_status ON jobs (tenant, status, seq);
CREATE INDEX jobs_by_status ON jobs (status, seq);
CREATE INDEX jobs_by_expiry ON jobs (expires_at);
CREATE INDEX jobs_by_lease ON jobs (lease_until) WHERE claimed_by IS NOT NULL;
CREATE TABLE job_labels (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (job_id, name)
);
CREATE INDEX job_labels_by_value ON job_labels (name, value);
CREATE TABLE job_events (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    n BIGINT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (job_id, n)
);
CREATE TABLE queue_turns (
    tenant TEXT PRIMARY KEY,
    turn BIGINT NOT NULL
);
CREATE SEQUENCE queue_turn_seq;
CREATE TABLE assets (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    blob TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    content_type TEXT NOT NULL,
    file_path TEXT NOT NULL,
    job_id TEXT,
    node_id TEXT,
    kind TEXT,
    tags TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ,
    output_index BIGINT
);
CREATE INDEX assets_by_blob ON assets (blob, tenant);
CREATE INDEX assets_by_job ON assets (job_id, output_index);
CREATE INDEX assets_by_name ON assets (tenant, file_path);
CREATE TABLE user_files (
    tenant TEXT NOT NULL,
    path TEXT NOT NULL,
    content BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    modified_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, path)
);
CREATE TABLE idempotency_keys (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    job_id TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE TABLE tenants (
    name TEXT PRIMARY KEY,
    credits BIGINT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);
CREATE TABLE api_keys (
    key_hash TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL
);
"#,
    r#"
-- How long each node of a job took (a JSON array, set when the job ends).
ALTER TABLE jobs ADD COLUMN node_times TEXT;
"#,
    r#"
-- Turns hold the tenants with claimable jobs, in round-robin order: a tenant joins at the
-- back when its first job is queued, goes to the back when served and leaves when empty.
DELETE FROM queue_turns t WHERE NOT EXISTS (
    SELECT 1 FROM jobs j WHERE j.tenant = t.tenant AND j.status = 'queued' AND j.claimed_by IS NULL);
INSERT INTO queue_turns (tenant, turn)
SELECT tenant, nextval('queue_turn_seq') FROM (
    SELECT tenant, MIN(seq) AS first FROM jobs WHERE status = 'queued' AND claimed_by IS NULL
    GROUP BY tenant ORDER BY first) AS waiting
ON CONFLICT (tenant) DO NOTHING;
CREATE INDEX queue_turns_in_order ON queue_turns (turn);
"#,
    r#"
-- Small outputs keep their bytes in their asset's row.
ALTER TABLE assets ADD COLUMN content BYTEA;
"#,
    r#"
-- Each job's event count lives beside the job, not in its row: appending an event then
-- takes only a KEY SHARE on the job's row, and never holds back a claim.
CREATE TABLE job_event_counts (
    job_id TEXT PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    n BIGINT NOT NULL
);
INSERT INTO job_event_counts (job_id, n) SELECT id, event_seq FROM jobs WHERE event_seq > 0;
-- The claimable jobs alone, each tenant's in order: what a claim scans. Its order is
-- `seq + 0`, which no other index gives, so that the planner never walks another index in
-- `seq` order through the finished jobs instead, whatever its statistics say.
CREATE INDEX jobs_claimable ON jobs (tenant, (seq + 0)) WHERE status = 'queued' AND claimed_by IS NULL;
"#,
];

/// The newest schema version this build knows.
pub(crate) const LATEST: i64 = MIGRATIONS.len() as i64;

fn backend(e: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(super::error_text(&e))
}

/// Applies the migrations the database lacks; returns the versions applied. Fails, changing
/// nothing, when the database is at a version newer than [`LATEST`].
pub(crate) async fn migrate(conn: &mut Object) -> Result<Vec<i64>, StoreError> {
    let tx = conn.transaction().await.map_err(backend)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(backend)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS weft_schema (version BIGINT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
        .await
        .map_err(backend)?;
    let current: i64 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM weft_schema", &[])
        .await
        .map_err(backend)?
        .get(0);
    if current > LATEST {
        return Err(newer(current));
    }
    let mut applied = Vec::new();
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i64 + 1;
        tx.batch_execute(sql).await.map_err(backend)?;
        tx.execute("INSERT INTO weft_schema (version) VALUES ($1)", &[&version])
            .await
            .map_err(backend)?;
        applied.push(version);
    }
    tx.commit().await.map_err(backend)?;
    Ok(applied)
}

/// The refusal for a database migrated by a newer weft.
pub(crate) fn newer(version: i64) -> StoreError {
    StoreError::Backend(format!(
        "the database schema is at version {version}, newer than this weft knows ({LATEST}); run a newer weft"
    ))
}
