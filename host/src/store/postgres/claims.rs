//! The claim protocol's statements: tenants' turns in `queue_turns`, batched claims that
//! start the jobs they take, and the lapsed claims a rescue takes over.
//!
//! A claim locks the jobs it takes with `FOR NO KEY UPDATE SKIP LOCKED`, so claimers never
//! wait for each other, and the event log (which holds only a `KEY SHARE` on a job's row)
//! never holds a claim back.

use deadpool_postgres::Object;

use super::{job_from_row, parse_workflow, JOB_COLUMNS};
use crate::store::coordinator::ClaimedJob;
use crate::store::StoreError;

/// Holds tenant `$1`'s turn with a `KEY SHARE` lock, or gives the tenant one at the back of
/// the round; returns a row unless a concurrent statement got in between (then run it again).
/// Run wherever a job of the tenant becomes claimable: the lock does not hold back claims
/// (they take `NO KEY UPDATE`) nor other submissions, but the removal of an empty turn
/// waits for it (see [`prune_turns`]).
const JOIN_TURN: &str = "WITH held AS (
        SELECT tenant FROM queue_turns WHERE tenant = $1 FOR KEY SHARE),
     joined AS (
        INSERT INTO queue_turns (tenant, turn)
        SELECT $1, nextval('queue_turn_seq') WHERE NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (tenant) DO NOTHING RETURNING tenant)
     SELECT tenant FROM held UNION ALL SELECT tenant FROM joined";

/// Inserts job `$1` of tenant `$2` (columns as [`PgStore::insert_job`](super::PgStore)
/// writes them, labels `$10` = `$11`) and makes sure the tenant has a turn, as
/// [`JOIN_TURN`] does, in one statement. Returns how many turns it found or made: 0 when a
/// concurrent statement got in between (then see [`rejoin_turn`]).
pub(super) const INSERT_JOB: &str = "WITH job AS (
        INSERT INTO jobs (id, tenant, status, workflow, labels, created_at, updated_at, expires_at, progress)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id),
     labels AS (
        INSERT INTO job_labels (job_id, name, value)
        SELECT job.id, l.name, l.value FROM job, unnest($10::text[], $11::text[]) AS l(name, value)),
     held AS (
        SELECT tenant FROM queue_turns WHERE tenant = $2 FOR KEY SHARE),
     joined AS (
        INSERT INTO queue_turns (tenant, turn)
        SELECT $2, nextval('queue_turn_seq') WHERE NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (tenant) DO NOTHING RETURNING tenant)
     SELECT (SELECT COUNT(*) FROM held) + (SELECT COUNT(*) FROM joined) FROM job";

/// Gives tenant `tenant`, whose job is committed, a turn if it has none: the job being
/// visible, no claim removes the turn after.
pub(super) async fn rejoin_turn(conn: &Object, tenant: &str) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO queue_turns (tenant, turn) VALUES ($1, nextval('queue_turn_seq')) ON CONFLICT (tenant) DO NOTHING",
        &[&tenant],
    )
    .await?;
    Ok(())
}

/// How many times [`join_turn`] tries; each retry means a claim removed the turn between
/// the statement's look-up and its insert, which takes a rare interleaving.
const JOIN_ATTEMPTS: usize = 8;

/// Makes sure tenant `tenant` has a turn that stays until `tx` commits, for a job of the
/// tenant that `tx` makes claimable.
pub(in crate::store::postgres) async fn join_turn(
    tx: &tokio_postgres::Transaction<'_>,
    tenant: &str,
) -> Result<(), StoreError> {
    for _ in 0..JOIN_ATTEMPTS {
        if tx.query_opt(JOIN_TURN, &[&tenant]).await?.is_some() {
            return Ok(());
        }
    }
    Err(StoreError::Backend(format!(
        "tenant {tenant}'s queue turn kept changing under {JOIN_ATTEMPTS} attempts to hold it"
    )))
}

/// Whether the tenant of turn `t` has a claimable job: probed turn by turn (a scalar
/// subquery, which the planner cannot turn into a scan of the whole queue), each probe one
/// step into the `jobs_claimable` index. Every scan of the claimable jobs here orders them
/// by `seq + 0`, the order of that index alone (see the schema).
const HAS_CLAIMABLE: &str = "(SELECT 1 FROM jobs j
        WHERE j.tenant = t.tenant AND j.status = 'queued' AND j.claimed_by IS NULL
        ORDER BY j.seq + 0 LIMIT 1) IS NOT NULL";

/// Claims, for process `$1` with a lease of `$2` seconds, up to `$3` claimable jobs and
/// starts them. The first `$3` tenants in turn order that have claimable jobs each offer
/// their oldest unlocked ones; the claim takes each tenant's first, then each one's second,
/// and so on, in turn order, so that tenants alternate as they do in the local queue. Each tenant served goes to the
/// back of the round, unless another claimer is moving it there at the same moment.
/// Returns the claimed jobs' columns ([`JOB_COLUMNS`]) and their workflows.
pub(super) fn claim_batch() -> String {
    let returned: Vec<String> = JOB_COLUMNS.split(", ").map(|c| format!("jobs.{c}")).collect();
    format!(
        "WITH turns AS (
            SELECT tenant, turn FROM queue_turns t WHERE {HAS_CLAIMABLE} ORDER BY turn LIMIT $3),
         offered AS (
            SELECT o.id, t.turn, row_number() OVER (PARTITION BY t.tenant ORDER BY o.seq) AS rank
            FROM turns t CROSS JOIN LATERAL (
                SELECT j.id, j.seq FROM jobs j
                WHERE j.tenant = t.tenant AND j.status = 'queued' AND j.claimed_by IS NULL
                ORDER BY j.seq + 0 LIMIT $3 FOR NO KEY UPDATE OF j SKIP LOCKED) o),
         chosen AS (
            SELECT id FROM offered ORDER BY rank, turn LIMIT $3),
         claimed AS (
            UPDATE jobs SET status = 'running', started_at = now(), updated_at = now(),
                claimed_by = $1, lease_until = now() + make_interval(secs => $2)
            FROM chosen WHERE jobs.id = chosen.id
            RETURNING {returned}, jobs.workflow),
         served AS (
            UPDATE queue_turns q SET turn = nextval('queue_turn_seq')
            FROM (SELECT tenant FROM queue_turns WHERE tenant IN (SELECT tenant FROM claimed)
                  ORDER BY tenant FOR NO KEY UPDATE SKIP LOCKED) s
            WHERE q.tenant = s.tenant)
         SELECT * FROM claimed ORDER BY seq",
        returned = returned.join(", ")
    )
}

/// Reads the rows of [`claim_batch`].
pub(super) fn claimed_jobs(rows: &[tokio_postgres::Row]) -> Result<Vec<ClaimedJob>, StoreError> {
    let workflow_column = JOB_COLUMNS.split(", ").count();
    rows.iter()
        .map(|row| {
            Ok(ClaimedJob {
                job: job_from_row(row)?,
                workflow: parse_workflow(row.get(workflow_column)),
            })
        })
        .collect()
}

/// The position of queued job `$2` of tenant `$1`, as the local queue counts it: `k`, the
/// tenant's claimable jobs ahead of it, plus from every other tenant with a turn at most
/// `k + 1` jobs if its turn comes first, else at most `k`. Each count stops at its cap, so
/// the cost grows with the position, not with the queue. No row when the job is not waiting.
pub(super) const QUEUE_POSITION: &str = "WITH me AS (
        SELECT seq FROM jobs WHERE id = $2 AND tenant = $1 AND status = 'queued' AND claimed_by IS NULL),
     ahead AS (
        SELECT COUNT(*) AS k FROM jobs j, me
        WHERE j.tenant = $1 AND j.status = 'queued' AND j.claimed_by IS NULL AND j.seq + 0 < me.seq),
     mine AS (
        SELECT COALESCE((SELECT turn FROM queue_turns WHERE tenant = $1), 9223372036854775807) AS turn),
     others AS (
        SELECT LEAST(
            (SELECT COUNT(*) FROM (
                SELECT 1 FROM jobs j WHERE j.tenant = t.tenant AND j.status = 'queued' AND j.claimed_by IS NULL
                ORDER BY j.seq + 0 LIMIT (SELECT k FROM ahead) + 1) AS capped),
            (SELECT k FROM ahead) + CASE WHEN t.turn < (SELECT turn FROM mine) THEN 1 ELSE 0 END) AS before
        FROM queue_turns t WHERE t.tenant <> $1)
     SELECT (ahead.k + COALESCE((SELECT SUM(before) FROM others), 0))::bigint FROM ahead, me";

/// Turns whose tenant may have no claimable job, locked unless a submission (or a claim)
/// holds them: a submission in flight holds its tenant's turn, and this lock skips it.
const EMPTY_TURNS: &str = "SELECT tenant FROM queue_turns t WHERE (SELECT 1 FROM jobs j
        WHERE j.tenant = t.tenant AND j.status = 'queued' AND j.claimed_by IS NULL ORDER BY j.seq + 0 LIMIT 1) IS NULL
     ORDER BY turn LIMIT 64 FOR UPDATE SKIP LOCKED";

/// Removes the turns of `$1` (locked by [`EMPTY_TURNS`]) whose tenant has no claimable job.
/// The statement's snapshot is taken after the locks, so it sees every job committed by a
/// submission that held one of them.
const LEAVE_IF_EMPTY: &str = "DELETE FROM queue_turns t WHERE tenant = ANY($1) AND NOT EXISTS (
        SELECT 1 FROM jobs j WHERE j.tenant = t.tenant AND j.status = 'queued' AND j.claimed_by IS NULL)";

/// Removes the turns of tenants left with nothing to claim (a claim came back short), so
/// that a turn is held only by a tenant with claimable jobs.
pub(super) async fn prune_turns(conn: &mut Object) -> Result<(), StoreError> {
    let tx = conn.transaction().await?;
    tx.batch_execute(super::RELAXED).await?;
    let tenants: Vec<String> = tx.query(EMPTY_TURNS, &[]).await?.iter().map(|r| r.get(0)).collect();
    if !tenants.is_empty() {
        tx.execute(LEAVE_IF_EMPTY, &[&tenants]).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The advisory-lock namespace ("weft") of the locks that show a process is alive: each
/// process holds `(LIVENESS_LOCKS, hashtext(its name))` on its wake-up connection.
pub(super) const LIVENESS_LOCKS: i32 = 0x7765_6674;

/// Whether the claim of job row `j` lapsed: its process holds no liveness lock (its
/// connection is gone), or its lease ran out; or the job runs with no claim. `live` names
/// the liveness keys held (see [`with_live`]).
///
/// Each branch names its own statuses, so the claimed jobs are found through the lease index
/// and the unclaimed running ones through the status index: the queue is never scanned.
const LAPSED: &str = "(j.claimed_by IS NOT NULL AND j.status IN ('queued', 'running', 'canceling')
            AND (j.lease_until < now()
                 OR (hashtext(j.claimed_by)::bigint & 4294967295) NOT IN (SELECT key FROM live)))
        OR (j.claimed_by IS NULL AND j.status IN ('running', 'canceling'))";

/// `statement` (which reads [`LAPSED`]) after the `live` table of held liveness keys.
fn with_live(statement: &str) -> String {
    format!(
        "WITH live AS (
            SELECT objid::bigint AS key FROM pg_locks
            WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = {LIVENESS_LOCKS}
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
         {statement}"
    )
}

/// Ids of the jobs whose claim lapsed, oldest first.
pub(super) fn lapsed() -> String {
    with_live(&format!("SELECT j.id FROM jobs j WHERE {LAPSED} ORDER BY j.seq"))
}

/// Takes over job `$1`'s lapsed claim for process `$2` with a lease of `$3` seconds.
pub(super) fn take_over() -> String {
    with_live(&format!(
        "UPDATE jobs j SET claimed_by = $2, lease_until = now() + make_interval(secs => $3)
         WHERE j.id = $1 AND ({LAPSED})"
    ))
}
