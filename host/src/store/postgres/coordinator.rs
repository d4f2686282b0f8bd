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

/// Gives tenant `$1` a turn at the back of the round, unless it has one: run wherever a job of
/// the tenant becomes claimable. The no-op update of an existing turn takes its row lock, so
/// it waits for a claim that holds the turn and may delete it, and then inserts it afresh.
pub(super) const JOIN_TURN: &str = "INSERT INTO queue_turns (tenant, turn) VALUES ($1, nextval('queue_turn_seq'))
     ON CONFLICT (tenant) DO UPDATE SET turn = queue_turns.turn";

/// Claims tenant `$1`'s oldest claimable job for process `$2` with a lease of `$3` seconds,
/// under the tenant's turn, which the caller holds: the turn goes to the back of the round,
/// or is removed when the tenant has nothing to claim. A plain `FOR UPDATE` waits out a
/// short lock on the job (an event being numbered) instead of skipping to a younger job.
const CLAIM_OLDEST: &str = "WITH next AS (
        SELECT id FROM jobs WHERE tenant = $1 AND status = 'queued' AND claimed_by IS NULL
        ORDER BY seq LIMIT 1 FOR UPDATE),
     claimed AS (
        UPDATE jobs SET claimed_by = $2, lease_until = now() + make_interval(secs => $3)
        FROM next WHERE jobs.id = next.id RETURNING jobs.id),
     served AS (
        UPDATE queue_turns SET turn = nextval('queue_turn_seq')
        WHERE tenant = $1 AND EXISTS (SELECT 1 FROM claimed)),
     emptied AS (
        DELETE FROM queue_turns WHERE tenant = $1 AND NOT EXISTS (SELECT 1 FROM claimed))
     SELECT id FROM claimed";

/// The PostgreSQL coordinator of one process.
pub struct PgCoordinator {
    pool: Pool,
    process: String,
    lease: Duration,
    signals: broadcast::Sender<Signal>,
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
            let tx = conn.transaction().await?;
            // The first turn no other claimer holds; when every turn is held, wait for the
            // first one instead of reporting an empty queue.
            let mut turn = tx
                .query_opt(
                    "SELECT tenant FROM queue_turns ORDER BY turn LIMIT 1 FOR UPDATE SKIP LOCKED",
                    &[],
                )
                .await?;
            if turn.is_none() {
                turn = tx
                    .query_opt("SELECT tenant FROM queue_turns ORDER BY turn LIMIT 1 FOR UPDATE", &[])
                    .await?;
            }
            let Some(turn) = turn else {
                return Ok(None);
            };
            let tenant: String = turn.get(0);
            // A statement of its own, so its snapshot is taken after the turn is held: every
            // job whose submission touched the turn before is seen.
            let claimed = tx
                .query_opt(CLAIM_OLDEST, &[&tenant, &self.process, &self.lease_secs()])
                .await?;
            tx.commit().await?;
            if let Some(row) = claimed {
                return Ok(Some((tenant, row.get(0))));
            }
            // The tenant had nothing left to claim; its turn is gone: try the next one.
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
            tx.execute(JOIN_TURN, &[&row.get::<_, &str>(0)]).await?;
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

    async fn renew_leases(&self) -> Result<u64, StoreError> {
        let conn = self.pool.get().await?;
        Ok(conn
            .execute(
                "UPDATE jobs SET lease_until = now() + make_interval(secs => $2) WHERE claimed_by = $1",
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
