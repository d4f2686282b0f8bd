//! Cross-process coordination on PostgreSQL: batched claims tenant by tenant in
//! `queue_turns` order ([`claims`](super::claims)), leases in `jobs.claimed_by` /
//! `jobs.lease_until` (the database's clock) backed by each process's liveness lock, the
//! event log and batched moves in `job_events` ([`log`](super::log)), and wake-ups with
//! `LISTEN` / `NOTIFY` ([`wakeups`](super::wakeups)).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use tokio::sync::{broadcast, mpsc};

use super::claims::{self, join_turn};
use super::wakeups::{self, Hears, Standing, Wake};
use crate::store::coordinator::{ClaimedJob, Coordinator, LogWrite, Signal, StatusBody, Written};
use crate::store::StoreError;

/// The PostgreSQL coordinator of one process.
pub struct PgCoordinator {
    pool: Pool,
    process: String,
    lease: Duration,
    signals: broadcast::Sender<Signal>,
    /// What the notifier sends.
    wakes: mpsc::UnboundedSender<Wake>,
    standing: Arc<Standing>,
    /// The statements of [`claims`], made once.
    claim_batch: String,
    lapsed: String,
    take_over: String,
}

impl PgCoordinator {
    /// Starts listening for wake-ups and sending them, each on a connection of its own.
    pub(super) fn start(
        pool: Pool,
        config: tokio_postgres::Config,
        process: String,
        lease: Duration,
        hears: Hears,
    ) -> Arc<Self> {
        let (signals, _) = broadcast::channel(4096);
        let standing = Arc::new(Standing::default());
        tokio::spawn(wakeups::listen(
            config.clone(),
            process.clone(),
            hears,
            signals.clone(),
            standing.clone(),
        ));
        let (wakes, wakes_rx) = mpsc::unbounded_channel();
        tokio::spawn(wakeups::notify(config, wakes_rx));
        Arc::new(Self {
            pool,
            process,
            lease,
            signals,
            wakes,
            standing,
            claim_batch: claims::claim_batch(),
            lapsed: claims::lapsed(),
            take_over: claims::take_over(),
        })
    }

    fn lease_secs(&self) -> f64 {
        self.lease.as_secs_f64()
    }

    /// Whether the other processes see this one as alive (it holds its liveness lock).
    pub fn is_alive(&self) -> bool {
        self.standing.alive.load(Ordering::SeqCst)
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

    fn is_leader(&self) -> bool {
        self.standing.leader.load(Ordering::SeqCst)
    }

    async fn claim(&self, n: usize) -> Result<Vec<ClaimedJob>, StoreError> {
        // A claim the others could not see as alive would be rescued from under its run.
        if n == 0 || !self.is_alive() {
            return Ok(Vec::new());
        }
        let mut conn = self.pool.get().await?;
        let claim = conn.prepare_cached(&self.claim_batch).await?;
        let rows = conn
            .query(&claim, &[&self.process, &self.lease_secs(), &(n as i64)])
            .await?;
        let claimed = claims::claimed_jobs(&rows)?;
        if claimed.len() < n {
            // Short: some turns may be left with nothing to claim.
            claims::prune_turns(&mut conn).await?;
        }
        Ok(claimed)
    }

    async fn release(&self, id: &str) -> Result<(), StoreError> {
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        tx.batch_execute(super::RELAXED).await?;
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
        let lapsed = conn.prepare_cached(&self.lapsed).await?;
        Ok(conn.query(&lapsed, &[]).await?.iter().map(|r| r.get(0)).collect())
    }

    async fn take_over(&self, id: &str) -> Result<bool, StoreError> {
        let conn = self.pool.get().await?;
        let take_over = conn.prepare_cached(&self.take_over).await?;
        Ok(conn
            .execute(&take_over, &[&id, &self.process, &self.lease_secs()])
            .await?
            == 1)
    }

    async fn queue_position(&self, tenant: &str, id: &str) -> Result<Option<usize>, StoreError> {
        let conn = self.pool.get().await?;
        let position = conn.prepare_cached(claims::QUEUE_POSITION).await?;
        Ok(conn
            .query_opt(&position, &[&tenant, &id])
            .await?
            .map(|r| r.get::<_, i64>(0) as usize))
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

    async fn write(&self, writes: Vec<LogWrite>, status_body: &StatusBody) -> Result<Written, StoreError> {
        if writes.is_empty() {
            return Ok(Written::default());
        }
        let mut conn = self.pool.get().await?;
        let tx = conn.transaction().await?;
        let written = super::log::write(&tx, &self.process, writes, status_body).await?;
        tx.commit().await?;
        if !written.notices.is_empty() {
            let _ = self.wakes.send(Wake::Events(written.notices.clone()));
        }
        Ok(written)
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
        let wake = match signal {
            Signal::Work => Wake::Work,
            Signal::Cancel(id) => Wake::Cancel(id),
            Signal::Event(notice) => Wake::Events(vec![notice]),
            Signal::Resync => return Ok(()),
        };
        self.wakes
            .send(wake)
            .map_err(|_| StoreError::Backend("the notifier has stopped".into()))
    }

    fn signals(&self) -> broadcast::Receiver<Signal> {
        self.signals.subscribe()
    }
}
