//! Cross-process coordination on PostgreSQL: claims tenant by tenant in `queue_turns` order
//! with `FOR UPDATE SKIP LOCKED` on the tenant's turn, leases
//! in `jobs.claimed_by` / `jobs.lease_until` (the database's clock), the event log in
//! `job_events`, and wake-ups with `LISTEN` / `NOTIFY` on one dedicated connection that is
//! re-made when it drops.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::store::coordinator::{Coordinator, Signal};
use crate::store::StoreError;

/// The channel that wakes idle workers (a job was queued or released).
pub(super) const WORK: &str = "weft_work";
const CANCEL: &str = "weft_cancel";
const EVENT: &str = "weft_event";

/// Appends event `$2` to job `$1`'s log (numbered by the job row's counter, whose lock
/// orders the appends of every process), sets the running job's progress to `$3` if given,
/// and notifies channel `$4` at commit with an [`EventNotice`](crate::store::EventNotice) as JSON.
const APPEND: &str = "WITH n AS (
        UPDATE jobs SET event_seq = event_seq + 1,
            progress = CASE WHEN $3::text IS NOT NULL AND status IN ('running', 'canceling') THEN $3 ELSE progress END
        WHERE id = $1 RETURNING event_seq, tenant),
     woken AS (
        SELECT pg_notify($4, json_build_object('job', $1::text, 'n', event_seq, 'tenant', tenant)::text) FROM n)
     INSERT INTO job_events (job_id, n, body)
     SELECT $1, n.event_seq, $2 FROM n, woken
     RETURNING n";

/// Holds tenant `$1`'s turn with a `KEY SHARE` lock, or gives the tenant one at the back of
/// the round; returns a row unless a concurrent statement got in between (then run it again).
/// Run wherever a job of the tenant becomes claimable: the lock does not hold back claims
/// (they take `NO KEY UPDATE`) nor other submissions, but a claim that would delete the turn
/// waits for it (see [`LEAVE_IF_EMPTY`]).
const JOIN_TURN: &str = "WITH held AS (
        SELECT tenant FROM queue_turns WHERE tenant = $1 FOR KEY SHARE),
     joined AS (
        INSERT INTO queue_turns (tenant, turn)
        SELECT $1, nextval('queue_turn_seq') WHERE NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (tenant) DO NOTHING RETURNING tenant)
     SELECT tenant FROM held UNION ALL SELECT tenant FROM joined";

/// Makes sure tenant `tenant` has a turn that stays until `tx` commits, for a job of the
/// tenant that `tx` makes claimable.
pub(super) async fn join_turn(tx: &tokio_postgres::Transaction<'_>, tenant: &str) -> Result<(), StoreError> {
    for _ in 0..JOIN_ATTEMPTS {
        if tx.query_opt(JOIN_TURN, &[&tenant]).await?.is_some() {
            return Ok(());
        }
    }
    Err(StoreError::Backend(format!(
        "tenant {tenant}'s queue turn kept changing under {JOIN_ATTEMPTS} attempts to hold it"
    )))
}

/// How many times [`join_turn`] tries; each retry means a claim removed the turn between
/// the statement's look-up and its insert, which takes a rare interleaving.
const JOIN_ATTEMPTS: usize = 8;

/// Claims, for process `$1` with a lease of `$2` seconds, the oldest claimable job of the
/// tenant whose turn comes first among those no other claimer holds (`{skip}` is `SKIP
/// LOCKED`; empty, it waits for the first turn), and moves the turn to the back of the round.
/// Returns the tenant and the job, or the tenant alone when it had nothing to claim. A plain
/// `FOR UPDATE` on the job waits out a short lock (an event being numbered) instead of
/// skipping to a younger job.
fn claim_next(skip: &str) -> String {
    format!(
        "WITH turn AS (
            SELECT tenant FROM queue_turns ORDER BY turn LIMIT 1 FOR NO KEY UPDATE {skip}),
         next AS (
            SELECT j.id FROM jobs j, turn
            WHERE j.tenant = turn.tenant AND j.status = 'queued' AND j.claimed_by IS NULL
            ORDER BY j.seq LIMIT 1 FOR UPDATE OF j),
         claimed AS (
            UPDATE jobs SET claimed_by = $1, lease_until = now() + make_interval(secs => $2)
            FROM next WHERE jobs.id = next.id RETURNING jobs.id),
         served AS (
            UPDATE queue_turns SET turn = nextval('queue_turn_seq')
            FROM turn WHERE queue_turns.tenant = turn.tenant AND EXISTS (SELECT 1 FROM claimed))
         SELECT turn.tenant, (SELECT id FROM claimed) FROM turn"
    )
}

/// Removes tenant `$1`'s turn if it has no claimable job, once the caller holds the turn
/// `FOR UPDATE`: that lock waits for the submissions holding the turn, and this statement's
/// snapshot, taken after, sees their jobs.
const LEAVE_IF_EMPTY: &str = "DELETE FROM queue_turns WHERE tenant = $1 AND NOT EXISTS (
        SELECT 1 FROM jobs WHERE tenant = $1 AND status = 'queued' AND claimed_by IS NULL)";

/// The PostgreSQL coordinator of one process.
pub struct PgCoordinator {
    pool: Pool,
    process: String,
    lease: Duration,
    signals: broadcast::Sender<Signal>,
    /// [`claim_next`] skipping the turns other claimers hold, and waiting for the first.
    claim_skipping: String,
    claim_waiting: String,
}

impl PgCoordinator {
    /// Starts listening for wake-ups on a connection of its own.
    pub(super) fn start(pool: Pool, config: tokio_postgres::Config, process: String, lease: Duration) -> Arc<Self> {
        let (signals, _) = broadcast::channel(4096);
        tokio::spawn(listen(config, signals.clone()));
        Arc::new(Self {
            pool,
            process,
            lease,
            signals,
            claim_skipping: claim_next("SKIP LOCKED"),
            claim_waiting: claim_next(""),
        })
    }

    fn lease_secs(&self) -> f64 {
        self.lease.as_secs_f64()
    }
}

/// Keeps a `LISTEN` connection open, turning notifications into [`Signal`]s; after each
/// (re)connection it sends [`Signal::Resync`], since notifications may have been missed.
async fn listen(config: tokio_postgres::Config, signals: broadcast::Sender<Signal>) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                let listen = format!("LISTEN {WORK}; LISTEN {CANCEL}; LISTEN {EVENT};");
                let subscribe = client.batch_execute(&listen);
                tokio::pin!(subscribe);
                let mut subscribed = false;
                loop {
                    tokio::select! {
                        done = &mut subscribe, if !subscribed => {
                            if let Err(e) = done {
                                tracing::warn!(error = %e, "cannot LISTEN for wake-ups");
                                break;
                            }
                            subscribed = true;
                            let _ = signals.send(Signal::Resync);
                        }
                        message = messages.next() => match message {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                let signal = match n.channel() {
                                    WORK => Signal::Work,
                                    CANCEL => Signal::Cancel(n.payload().to_string()),
                                    EVENT => match serde_json::from_str(n.payload()) {
                                        Ok(notice) => Signal::Event(notice),
                                        Err(_) => Signal::Resync,
                                    },
                                    _ => continue,
                                };
                                let _ = signals.send(signal);
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "the wake-up connection failed");
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the wake-up connection"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[async_trait]
impl Coordinator for PgCoordinator {
    fn process(&self) -> &str {
        &self.process
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    async fn claim(&self) -> Result<Option<(String, String)>, StoreError> {
        let mut conn = self.pool.get().await?;
        loop {
            // The first turn no other claimer holds; when every turn is held, wait for the
            // first one instead of reporting an empty queue.
            let skipping = conn.prepare_cached(&self.claim_skipping).await?;
            let mut claimed = conn.query_opt(&skipping, &[&self.process, &self.lease_secs()]).await?;
            if claimed.is_none() {
                let waiting = conn.prepare_cached(&self.claim_waiting).await?;
                claimed = conn.query_opt(&waiting, &[&self.process, &self.lease_secs()]).await?;
            }
            let Some(row) = claimed else {
                return Ok(None);
            };
            let tenant: String = row.get(0);
            if let Some(id) = row.get::<_, Option<String>>(1) {
                return Ok(Some((tenant, id)));
            }
            // Nothing to claim: the turn goes, unless a submission in flight brings a job.
            let tx = conn.transaction().await?;
            tx.execute("SELECT 1 FROM queue_turns WHERE tenant = $1 FOR UPDATE", &[&tenant])
                .await?;
            tx.execute(LEAVE_IF_EMPTY, &[&tenant]).await?;
            tx.commit().await?;
        }
    }

    async fn release(&self, id: &str) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        let released = tx
            .query_opt(
                "UPDATE jobs SET claimed_by = NULL, lease_until = NULL WHERE id = $1 AND claimed_by = $2
                 RETURNING tenant, status",
                &[&id, &self.process],
            )
            .await?;
        // A job released while queued (sent back by a rescue) is claimable again.
        if let Some(row) = released.filter(|r| r.get::<_, &str>(1) == "queued") {
            join_turn(&tx, row.get(0)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn restore_turns(&self) -> Result<u64, StoreError> {
        let conn = self.pool.get().await?;
        Ok(conn
            .execute(
                "INSERT INTO queue_turns (tenant, turn)
                 SELECT tenant, nextval('queue_turn_seq') FROM (
                    SELECT tenant, MIN(seq) AS first FROM jobs j
                    WHERE status = 'queued' AND claimed_by IS NULL
                      AND NOT EXISTS (SELECT 1 FROM queue_turns t WHERE t.tenant = j.tenant)
                    GROUP BY tenant ORDER BY first) AS waiting
                 ON CONFLICT (tenant) DO NOTHING",
                &[],
            )
            .await?)
    }

    /// Locks the rows in id order before writing them, as the event log's batches do: a
    /// renewal that locked them in scan order could deadlock with a batch, and with the
    /// releases and claims queued behind either on a row.
    async fn renew_leases(&self) -> Result<u64, StoreError> {
        let conn = self.pool.get().await?;
        Ok(conn
            .execute(
                "UPDATE jobs SET lease_until = now() + make_interval(secs => $2) WHERE id IN (
                    SELECT id FROM jobs WHERE claimed_by = $1 ORDER BY id FOR NO KEY UPDATE)",
                &[&self.process, &self.lease_secs()],
            )
            .await?)
    }

    async fn lapsed(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.pool.get().await?;
        Ok(conn
            .query(
                "SELECT id FROM jobs
                 WHERE (claimed_by IS NOT NULL AND lease_until < now() AND status IN ('queued', 'running', 'canceling'))
                    OR (claimed_by IS NULL AND status IN ('running', 'canceling'))
                 ORDER BY seq",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    async fn take_over(&self, id: &str) -> Result<bool, StoreError> {
        let conn = self.pool.get().await?;
        Ok(conn
            .execute(
                "UPDATE jobs SET claimed_by = $2, lease_until = now() + make_interval(secs => $3)
                 WHERE id = $1 AND status IN ('queued', 'running', 'canceling')
                   AND ((claimed_by IS NOT NULL AND lease_until < now())
                        OR (claimed_by IS NULL AND status IN ('running', 'canceling')))",
                &[&id, &self.process, &self.lease_secs()],
            )
            .await?
            == 1)
    }

    async fn queued(&self) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                "SELECT j.tenant, j.id FROM jobs j LEFT JOIN queue_turns t ON t.tenant = j.tenant
                 WHERE j.status = 'queued' AND j.claimed_by IS NULL
                 ORDER BY t.turn NULLS LAST,
                          MIN(j.seq) OVER (PARTITION BY j.tenant),
                          j.seq",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn queued_counts(&self, tenant: &str) -> Result<(usize, usize), StoreError> {
        let conn = self.pool.get().await?;
        let row = conn
            .query_one(
                "SELECT COUNT(*), COUNT(*) FILTER (WHERE tenant = $1) FROM jobs WHERE status = 'queued' AND claimed_by IS NULL",
                &[&tenant],
            )
            .await?;
        Ok((row.get::<_, i64>(0) as usize, row.get::<_, i64>(1) as usize))
    }

    async fn append_event(&self, job: &str, body: String, progress: Option<String>) -> Result<u64, StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.batch_execute(super::RELAXED).await?;
        // The counter's row lock numbers the events of a job in commit order whichever
        // process appends them, and the wake-up is sent at commit.
        let row = tx.query_opt(APPEND, &[&job, &body, &progress, &EVENT]).await?;
        tx.commit().await?;
        Ok(row.map_or(0, |r| r.get::<_, i64>(0) as u64))
    }

    async fn append_events(&self, events: Vec<(String, String, Option<String>)>) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.batch_execute(super::RELAXED).await?;
        let append = tx.prepare(APPEND).await?;
        // Sent together (the client pipelines them) and run in order, committed once.
        let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 4]> = events
            .iter()
            .map(|(job, body, progress)| [job as _, body as _, progress as _, &EVENT as _])
            .collect();
        futures::future::try_join_all(params.iter().map(|p| tx.execute(&append, p))).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn events_after(&self, job: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                "SELECT n, body FROM job_events WHERE job_id = $1 AND n > $2 ORDER BY n LIMIT $3",
                &[&job, &(after.min(i64::MAX as u64) as i64), &(limit as i64)],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get(1))).collect())
    }

    async fn latest_events(&self, job: &str, limit: usize) -> Result<Vec<(u64, String)>, StoreError> {
        let conn = self.pool.get().await?;
        let rows = conn
            .query(
                "SELECT n, body FROM (SELECT n, body FROM job_events WHERE job_id = $1 ORDER BY n DESC LIMIT $2) AS last ORDER BY n",
                &[&job, &(limit as i64)],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get(1))).collect())
    }

    async fn signal(&self, signal: Signal) -> Result<(), StoreError> {
        let (channel, payload) = match &signal {
            Signal::Work => (WORK, String::new()),
            Signal::Cancel(id) => (CANCEL, id.clone()),
            Signal::Event(notice) => (EVENT, serde_json::to_string(notice).expect("a notice serializes")),
            Signal::Resync => return Ok(()),
        };
        let conn = self.pool.get().await?;
        conn.execute("SELECT pg_notify($1, $2)", &[&channel, &payload]).await?;
        Ok(())
    }

    fn signals(&self) -> broadcast::Receiver<Signal> {
        self.signals.subscribe()
    }
}
