//! Batched writes of the shared log: many jobs' events, status moves and outputs in one
//! transaction of a handful of statements, whatever the batch's size.
//!
//! - The rows a batch changes are locked first, in id order, the order every writer and
//!   the lease renewal use, so two batches never deadlock.
//! - Events are numbered per job by `job_event_counts`, whose row lock orders the appends
//!   of every process; the job's own row is only read (`KEY SHARE`), so events never hold
//!   back a claim.
//! - Moves are applied by the same rules as [`Store::update_job`](crate::store::Store::update_job)
//!   ([`JobUpdate::apply`]) and written with one `UPDATE … FROM unnest(…)`; the claim of a
//!   moved job is given up in the same statement.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;

use super::{job_from_row, to_json, JOB_COLUMNS, RELAXED};
use crate::store::coordinator::{EventNotice, LogWrite, StatusBody, Written};
use crate::store::{AssetRecord, JobRecord, JobStatus, StoreError};

/// Appends events `($1[i], body $3[i])` to their jobs' logs: each job's count goes up by
/// how many it has, and event `i` takes the number `$2[i]` below the job's new count. Jobs
/// that are gone are skipped. Returns each job's tenant and first new number.
const APPEND: &str = "WITH added AS (
        SELECT job, COUNT(*) AS count FROM unnest($1::text[]) AS job GROUP BY job),
     counted AS (
        INSERT INTO job_event_counts (job_id, n)
        SELECT a.job, a.count FROM added a JOIN jobs ON jobs.id = a.job ORDER BY a.job
        ON CONFLICT (job_id) DO UPDATE SET n = job_event_counts.n + excluded.n
        RETURNING job_id, n),
     appended AS (
        INSERT INTO job_events (job_id, n, body)
        SELECT e.job, c.n - e.below, e.body
        FROM unnest($1::text[], $2::bigint[], $3::text[]) AS e(job, below, body)
        JOIN counted c ON c.job_id = e.job)
     SELECT c.job_id, jobs.tenant, c.n - a.count + 1
     FROM counted c JOIN added a ON a.job = c.job_id JOIN jobs ON jobs.id = c.job_id";

/// Writes each job's row `($1[i], …)` as a batch left it, and gives up process `$11`'s
/// claim on those whose `$10[i]` says they moved.
const WRITE_JOBS: &str = "UPDATE jobs SET status = u.status, started_at = u.started_at,
        completed_at = u.completed_at, progress = u.progress, error = u.error, logs = u.logs,
        updated_at = u.updated_at, node_times = u.node_times,
        claimed_by = CASE WHEN u.moved AND jobs.claimed_by = $11 THEN NULL ELSE jobs.claimed_by END,
        lease_until = CASE WHEN u.moved AND jobs.claimed_by = $11 THEN NULL ELSE jobs.lease_until END
     FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[],
                 $6::text[], $7::text[], $8::timestamptz[], $9::text[], $10::bool[])
          AS u(id, status, started_at, completed_at, progress, error, logs, updated_at, node_times, moved)
     WHERE jobs.id = u.id";

/// Inserts the outputs `($1[i], …)` recorded by the batch's moves, inline.
const INSERT_OUTPUTS: &str = "INSERT INTO assets (id, tenant, blob, size_bytes, content_type, file_path,
        job_id, node_id, kind, tags, created_at, expires_at, output_index, content)
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
        $7::text[], $8::text[], $9::text[], $10::text[], $11::timestamptz[], $12::timestamptz[],
        $13::bigint[], $14::bytea[])";

/// A batch's rows as it leaves them, and what it appends.
#[derive(Default)]
struct Batch {
    /// Jobs whose rows the batch rewrites, as they stand; `true` once moved.
    jobs: HashMap<String, (JobRecord, bool)>,
    events: Vec<(String, String)>,
    outputs: Vec<(AssetRecord, bytes::Bytes)>,
    moved: Vec<Option<JobRecord>>,
}

impl Batch {
    /// Applies `write` to the rows read so far.
    fn apply(&mut self, write: LogWrite, now: DateTime<Utc>, status_body: &StatusBody) {
        match write {
            LogWrite::Event { job, body, progress } => {
                if let (Some(progress), Some((record, _))) = (progress, self.jobs.get_mut(&job)) {
                    if matches!(record.status, JobStatus::Running | JobStatus::Canceling) {
                        record.progress = serde_json::from_str(&progress).ok();
                    }
                }
                self.events.push((job, body));
            }
            LogWrite::Move {
                id,
                moves,
                mut update,
                announce,
            } => {
                let next = self
                    .jobs
                    .get(&id)
                    .and_then(|(job, _)| update.apply(job.clone(), &moves, now));
                if let Some(next) = &next {
                    self.events.extend(announce.into_iter().map(|body| (id.clone(), body)));
                    self.events.push((id.clone(), status_body(next)));
                    self.outputs.append(&mut update.outputs);
                    self.jobs.insert(id, (next.clone(), true));
                }
                self.moved.push(next);
            }
        }
    }
}

/// Writes `writes` in one transaction on `tx` for process `process` (see
/// [`Coordinator::write`](crate::store::Coordinator::write)); the caller commits.
pub(super) async fn write(
    tx: &Transaction<'_>,
    process: &str,
    writes: Vec<LogWrite>,
    status_body: &StatusBody,
) -> Result<Written, StoreError> {
    let mut locked: Vec<&str> = writes
        .iter()
        .filter_map(|w| match w {
            LogWrite::Event { progress: None, .. } => None,
            LogWrite::Event { job, .. } => Some(job.as_str()),
            LogWrite::Move { id, .. } => Some(id.as_str()),
        })
        .collect();
    locked.sort_unstable();
    locked.dedup();
    let read = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE");
    let (_, rows) = futures::try_join!(tx.batch_execute(RELAXED), async {
        if locked.is_empty() {
            Ok(Vec::new())
        } else {
            tx.query(&read, &[&locked]).await
        }
    })?;
    let mut batch = Batch::default();
    for row in &rows {
        let job = job_from_row(row)?;
        batch.jobs.insert(job.id.clone(), (job, false));
    }
    let now = Utc::now();
    for write in writes {
        batch.apply(write, now, status_body);
    }
    let (_, _, notices) = futures::try_join!(
        write_jobs(tx, process, &batch),
        insert_outputs(tx, &batch.outputs),
        append(tx, &batch.events),
    )?;
    Ok(Written {
        moved: batch.moved,
        notices,
    })
}

/// Rewrites the rows the batch changed (moved or given progress).
async fn write_jobs(tx: &Transaction<'_>, process: &str, batch: &Batch) -> Result<(), StoreError> {
    if batch.jobs.is_empty() {
        return Ok(());
    }
    let jobs: Vec<&(JobRecord, bool)> = batch.jobs.values().collect();
    let ids: Vec<&str> = jobs.iter().map(|(j, _)| j.id.as_str()).collect();
    let statuses: Vec<&str> = jobs.iter().map(|(j, _)| j.status.as_str()).collect();
    let started: Vec<Option<DateTime<Utc>>> = jobs.iter().map(|(j, _)| j.started_at).collect();
    let completed: Vec<Option<DateTime<Utc>>> = jobs.iter().map(|(j, _)| j.completed_at).collect();
    let progress: Vec<Option<String>> = jobs.iter().map(|(j, _)| j.progress.as_ref().map(to_json)).collect();
    let errors: Vec<Option<String>> = jobs.iter().map(|(j, _)| j.error.as_ref().map(to_json)).collect();
    let logs: Vec<Option<String>> = jobs.iter().map(|(j, _)| j.logs.as_ref().map(to_json)).collect();
    let updated: Vec<DateTime<Utc>> = jobs.iter().map(|(j, _)| j.updated_at).collect();
    let node_times: Vec<Option<String>> = jobs
        .iter()
        .map(|(j, _)| (!j.node_times.is_empty()).then(|| to_json(&j.node_times)))
        .collect();
    let moved: Vec<bool> = jobs.iter().map(|(_, moved)| *moved).collect();
    tx.execute(
        WRITE_JOBS,
        &[
            &ids,
            &statuses,
            &started,
            &completed,
            &progress,
            &errors,
            &logs,
            &updated,
            &node_times,
            &moved,
            &process,
        ],
    )
    .await?;
    Ok(())
}

/// Inserts the outputs of the batch's moves.
async fn insert_outputs(tx: &Transaction<'_>, outputs: &[(AssetRecord, bytes::Bytes)]) -> Result<(), StoreError> {
    if outputs.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&AssetRecord) -> &str| outputs.iter().map(|(a, _)| f(a)).collect::<Vec<_>>();
    let optional = |f: fn(&AssetRecord) -> Option<&str>| outputs.iter().map(|(a, _)| f(a)).collect::<Vec<_>>();
    let sizes: Vec<i64> = outputs.iter().map(|(a, _)| a.size_bytes).collect();
    let tags: Vec<String> = outputs.iter().map(|(a, _)| to_json(&a.tags)).collect();
    let created: Vec<DateTime<Utc>> = outputs.iter().map(|(a, _)| a.created_at).collect();
    let expires: Vec<Option<DateTime<Utc>>> = outputs.iter().map(|(a, _)| a.expires_at).collect();
    let index: Vec<Option<i64>> = outputs.iter().map(|(a, _)| a.output_index).collect();
    let content: Vec<&[u8]> = outputs.iter().map(|(_, c)| c.as_ref()).collect();
    tx.execute(
        INSERT_OUTPUTS,
        &[
            &column(|a| &a.id),
            &column(|a| &a.tenant),
            &column(|a| &a.blob),
            &sizes,
            &column(|a| &a.content_type),
            &column(|a| &a.file_path),
            &optional(|a| a.job_id.as_deref()),
            &optional(|a| a.node_id.as_deref()),
            &optional(|a| a.kind.as_deref()),
            &tags,
            &created,
            &expires,
            &index,
            &content,
        ],
    )
    .await?;
    Ok(())
}

/// Appends `events` (job, body), in order, numbering each job's after its last.
async fn append(tx: &Transaction<'_>, events: &[(String, String)]) -> Result<Vec<EventNotice>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    // Each event's distance below its job's last new number.
    let mut remaining: HashMap<&str, i64> = HashMap::new();
    for (job, _) in events {
        *remaining.entry(job.as_str()).or_default() += 1;
    }
    let below: Vec<i64> = events
        .iter()
        .map(|(job, _)| {
            let left = remaining.get_mut(job.as_str()).expect("counted above");
            *left -= 1;
            *left
        })
        .collect();
    let jobs: Vec<&str> = events.iter().map(|(job, _)| job.as_str()).collect();
    let bodies: Vec<&str> = events.iter().map(|(_, body)| body.as_str()).collect();
    let rows = tx.query(APPEND, &[&jobs, &below, &bodies]).await?;
    Ok(rows
        .iter()
        .map(|r| EventNotice {
            job: r.get(0),
            tenant: r.get(1),
            n: r.get::<_, i64>(2).max(1) as u64,
        })
        .collect())
}
