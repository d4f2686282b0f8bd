//! `cargo bench -p weft --bench claims`: the claim protocol of the shared store with N
//! simulated processes (1 to 100), to show that claims, finishes and wake-ups do not
//! degrade as processes are added. Each simulated process is what a `weft` worker process
//! brings to the database: its own pool, wake-up connection (with its liveness lock) and
//! notifier, and a claimer that claims up to 8 jobs at a time and finishes each at once
//! through the batched log, as if the jobs took no time. A queue of 20,000 jobs of 20
//! tenants is drained at each N; printed per N: jobs/s, claim and finish latency (p50,
//! p99), the jobs per claim, and the database's transactions and WAL bytes per job.
//!
//! It uses the tests' throw-away PostgreSQL (`tests/support/postgres.rs`, `fsync` off) or
//! `WEFT_TEST_DATABASE_URL`. `WEFT_BENCH_PROCESSES=1,10` picks the process counts, and
//! `WEFT_BENCH_CLAIM=N` the most jobs a claim takes (8).

use std::sync::Arc;
use std::time::{Duration, Instant};

use weft::store::postgres::{Connections, Hears, PgCoordinator, PgStore};
use weft::store::{Coordinator, JobRecord, JobStatus, LogWrite};

#[path = "../../tests/support/postgres.rs"]
#[allow(dead_code)]
mod postgres;

const JOBS: i64 = 20_000;
const TENANTS: i64 = 20;
/// The most jobs a claim takes, unless `WEFT_BENCH_CLAIM` says otherwise.
const CLAIM: usize = 8;

fn claim_size() -> usize {
    std::env::var("WEFT_BENCH_CLAIM")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CLAIM)
}

/// The latencies one simulated process saw, and how many jobs its claims took.
#[derive(Default)]
struct Seen {
    claims: Vec<Duration>,
    finishes: Vec<Duration>,
    jobs: usize,
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

async fn sql(url: &str, statement: &str) -> Vec<tokio_postgres::Row> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client.query(statement, &[]).await.unwrap()
}

/// A database with the schema and a queue of [`JOBS`] jobs, each tenant with its turn.
async fn queue() -> (String, Arc<PgStore>) {
    let url = tokio::task::spawn_blocking(postgres::fresh_database).await.unwrap();
    let store = Arc::new(PgStore::connect(&url).await.unwrap());
    sql(
        &url,
        &format!(
            "INSERT INTO jobs (id, tenant, status, workflow, labels, created_at, updated_at, expires_at)
             SELECT 'j' || i, 't' || (i % {TENANTS}), 'queued', '{{}}', '{{}}', now(), now(), now() + interval '1 day'
             FROM generate_series(1, {JOBS}) AS i"
        ),
    )
    .await;
    sql(&url, "ANALYZE jobs").await;
    let first = store.coordinator("setup".into(), Duration::from_secs(30));
    first.restore_turns().await.unwrap();
    (url, store)
}

/// One simulated process: claims and finishes until the queue is empty.
async fn simulate(c: Arc<PgCoordinator>) -> Seen {
    let mut seen = Seen::default();
    let status = |job: &JobRecord| format!("{{\"status\":\"{}\"}}", job.status.as_str());
    loop {
        let t = Instant::now();
        let claimed = c.claim(claim_size()).await.unwrap();
        seen.claims.push(t.elapsed());
        if claimed.is_empty() {
            return seen;
        }
        seen.jobs += claimed.len();
        let finishes = claimed
            .iter()
            .map(|j| LogWrite::Move {
                id: j.job.id.clone(),
                moves: vec![(JobStatus::Running, JobStatus::Succeeded)],
                update: Box::default(),
                announce: Vec::new(),
            })
            .collect();
        let t = Instant::now();
        c.write(finishes, &status).await.unwrap();
        seen.finishes.push(t.elapsed());
    }
}

/// Drains a queue with `processes` simulated processes and prints the figures.
async fn run(processes: usize) {
    let (url, _store) = queue().await;
    let mut coordinators = Vec::new();
    for p in 0..processes {
        let connections = Connections {
            application_name: format!("weft sim-{p}"),
            pool_size: 1,
        };
        let store = PgStore::connect_as(&url, &connections).await.unwrap();
        let worker = Hears {
            work: true,
            events: false,
        };
        coordinators.push(store.coordinator_hearing(format!("sim-{p}"), Duration::from_secs(30), worker));
    }
    while !coordinators.iter().all(|c| c.is_alive()) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statements = |rows: Vec<tokio_postgres::Row>| rows[0].get::<_, i64>(0);
    let count = "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()";
    let wal = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint";
    let before = statements(sql(&url, count).await);
    let wal_before = statements(sql(&url, wal).await);
    let started = Instant::now();
    let runs: Vec<_> = coordinators.iter().map(|c| tokio::spawn(simulate(c.clone()))).collect();
    let mut all = Seen::default();
    for run in runs {
        let seen = run.await.unwrap();
        all.claims.extend(seen.claims);
        all.finishes.extend(seen.finishes);
        all.jobs += seen.jobs;
    }
    let elapsed = started.elapsed();
    let transactions = statements(sql(&url, count).await) - before;
    let wal_bytes = statements(sql(&url, wal).await) - wal_before;
    let claims = all.claims.len();
    println!(
        "{processes:>4} processes: {:>6.0} jobs/s; claim p50 {:>6.2} ms p99 {:>6.2} ms; finish p50 {:>6.2} ms p99 {:>6.2} ms; {:.1} jobs/claim; {:.2} transactions and {:.0} WAL bytes per job",
        all.jobs as f64 / elapsed.as_secs_f64(),
        percentile(&mut all.claims, 0.5).as_secs_f64() * 1e3,
        percentile(&mut all.claims, 0.99).as_secs_f64() * 1e3,
        percentile(&mut all.finishes, 0.5).as_secs_f64() * 1e3,
        percentile(&mut all.finishes, 0.99).as_secs_f64() * 1e3,
        all.jobs as f64 / claims as f64,
        transactions as f64 / all.jobs as f64,
        wal_bytes as f64 / all.jobs as f64,
    );
    assert_eq!(all.jobs as i64, JOBS, "every job claimed once");
}

fn main() {
    let counts: Vec<usize> = std::env::var("WEFT_BENCH_PROCESSES")
        .unwrap_or_else(|_| "1,2,10,50,100".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!(
        "claim protocol, {JOBS} jobs of {TENANTS} tenants, claims of up to {}, on {} cores (load {})",
        claim_size(),
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
    for n in counts {
        runtime.block_on(run(n));
    }
}
