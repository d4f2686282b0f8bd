//! The claim protocol of processes sharing one PostgreSQL store: batched claims that start
//! jobs, tenants' turns, liveness, the leader, lapsed claims, and the batched log writes
//! that finish jobs. Each "process" here is a store (a pool) with its coordinator.

mod support;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use weft::store::postgres::{Connections, PgCoordinator, PgStore};
use weft::store::{AssetRecord, Coordinator, JobRecord, JobStatus, JobUpdate, LogWrite, Signal, Store};

use support::records::queued_job as job;

async fn pg() -> (Arc<PgStore>, String) {
    let url = tokio::task::spawn_blocking(support::postgres::fresh_database)
        .await
        .unwrap();
    (Arc::new(PgStore::connect(&url).await.unwrap()), url)
}

/// Another process on the database at `url`, its connections named `name`.
async fn process(url: &str, name: &str) -> Arc<PgStore> {
    let connections = Connections {
        application_name: name.to_string(),
        pool_size: 4,
    };
    Arc::new(PgStore::connect_as(url, &connections).await.unwrap())
}

/// The coordinator of process `name` on `store`, once the others can see it is alive.
async fn coordinator(store: &PgStore, name: &str, lease: Duration) -> Arc<PgCoordinator> {
    let c = store.coordinator(name.to_string(), lease);
    until("the process holds its liveness lock", || {
        let c = c.clone();
        async move { c.is_alive() }
    })
    .await;
    c
}

/// Polls `check` until it holds (changes seen from other sessions are awaited, not timed).
async fn until<F: std::future::Future<Output = bool>>(what: &str, check: impl Fn() -> F) {
    for _ in 0..1000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never: {what}");
}

async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn insert(store: &PgStore, ids: &[&str], tenant: &str) {
    for id in ids {
        store.insert_job(job(id, tenant, Utc::now()), None, 0).await.unwrap();
    }
}

async fn claim_ids(c: &PgCoordinator, n: usize) -> Vec<String> {
    c.claim(n).await.unwrap().into_iter().map(|j| j.job.id).collect()
}

const LONG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_queued_job_is_claimed_by_exactly_one_of_several_processes_claiming_in_batches() {
    let (store, url) = pg().await;
    for i in 0..90 {
        insert(&store, &[&format!("j{i}")], &format!("t{}", i % 3)).await;
    }
    let mut claimers = Vec::new();
    for p in 0..3 {
        let other = process(&url, &format!("weft p{p}")).await;
        let c = coordinator(&other, &format!("p{p}"), LONG).await;
        for _ in 0..4 {
            let c = c.clone();
            claimers.push(tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let batch = claim_ids(&c, 4).await;
                    if batch.is_empty() {
                        return got;
                    }
                    got.extend(batch);
                }
            }));
        }
    }
    let mut all = Vec::new();
    for c in claimers {
        all.extend(c.await.unwrap());
    }
    all.sort();
    let before = all.len();
    all.dedup();
    assert_eq!(before, 90, "every job claimed");
    assert_eq!(all.len(), 90, "no job claimed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_take_tenants_in_turn_like_the_local_queue() {
    let (store, _) = pg().await;
    insert(&store, &["a0", "a1", "a2"], "a").await;
    insert(&store, &["b0"], "b").await;
    insert(&store, &["c0"], "c").await;
    let c = coordinator(&store, "p", LONG).await;
    let mut positions = Vec::new();
    for (tenant, id) in [("a", "a0"), ("a", "a1"), ("a", "a2"), ("b", "b0"), ("c", "c0")] {
        positions.push(c.queue_position(tenant, id).await.unwrap());
    }
    assert_eq!(
        positions,
        [Some(0), Some(3), Some(4), Some(1), Some(2)],
        "round-robin positions, as the local queue counts them"
    );
    assert_eq!(c.queue_position("b", "a0").await.unwrap(), None, "another tenant's job");
    assert_eq!(c.queued_counts("a").await.unwrap(), (5, 3));
    let mut order = Vec::new();
    loop {
        let one = claim_ids(&c, 1).await;
        if one.is_empty() {
            break;
        }
        order.extend(one);
    }
    assert_eq!(order, ["a0", "b0", "c0", "a1", "a2"]);
    assert_eq!(c.queued_counts("a").await.unwrap(), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_claim_takes_each_tenants_oldest_in_turn_before_anyones_next() {
    let (store, _) = pg().await;
    insert(&store, &["a0", "a1", "a2"], "a").await;
    insert(&store, &["b0", "b1"], "b").await;
    insert(&store, &["c0"], "c").await;
    let c = coordinator(&store, "p", LONG).await;
    let mut first = claim_ids(&c, 4).await;
    first.sort();
    assert_eq!(
        first,
        ["a0", "a1", "b0", "c0"],
        "every tenant's first, then the first tenant's second"
    );
    let mut second = claim_ids(&c, 4).await;
    second.sort();
    assert_eq!(second, ["a2", "b1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_job_is_running_for_its_process_with_its_workflow() {
    let (store, _) = pg().await;
    insert(&store, &["a0"], "a").await;
    let c = coordinator(&store, "p", LONG).await;
    let claimed = c.claim(8).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job.status, JobStatus::Running);
    assert!(claimed[0].job.started_at.is_some());
    assert_eq!(claimed[0].workflow, job("a0", "a", Utc::now()).workflow);
    let stored = store.job_by_id("a0").await.unwrap().unwrap();
    assert_eq!(stored.status, JobStatus::Running);
    assert!(c.lapsed().await.unwrap().is_empty(), "its claim is live");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_being_written_for_a_queued_job_never_holds_back_its_claim() {
    let (store, url) = pg().await;
    insert(&store, &["a0", "a1"], "a").await;
    // A log batch of another process in flight, numbering an event of the oldest job.
    let mut client = raw(&url).await;
    let writer = client.transaction().await.unwrap();
    writer
        .batch_execute(
            "INSERT INTO job_event_counts (job_id, n) VALUES ('a0', 1);
             INSERT INTO job_events (job_id, n, body) VALUES ('a0', 1, '{}');",
        )
        .await
        .unwrap();
    let c = coordinator(&store, "p", LONG).await;
    let claimed = tokio::time::timeout(LONG, claim_ids(&c, 1))
        .await
        .expect("the claim does not wait for the event");
    assert_eq!(claimed, ["a0"], "oldest first within a tenant");
    writer.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_another_claim_holds_are_skipped_and_claimable_again_when_it_does_not_commit() {
    let (store, url) = pg().await;
    insert(&store, &["a0", "a1", "a2"], "a").await;
    // Another claimer has locked the oldest job and dies before its claim commits.
    let mut client = raw(&url).await;
    let other = client.transaction().await.unwrap();
    other
        .execute("SELECT id FROM jobs WHERE id = 'a0' FOR NO KEY UPDATE", &[])
        .await
        .unwrap();
    let c = coordinator(&store, "p", LONG).await;
    assert_eq!(claim_ids(&c, 2).await, ["a1", "a2"], "claimers skip each other's rows");
    drop(other);
    drop(client);
    let mut again = Vec::new();
    for _ in 0..1000 {
        again = claim_ids(&c, 1).await;
        if !again.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(again, ["a0"], "claimable again once the other claim is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_finds_a_turn_empty_keeps_it_for_a_submission_in_flight() {
    let (store, url) = pg().await;
    insert(&store, &["a0"], "a").await;
    let c = coordinator(&store, "p", LONG).await;
    assert_eq!(claim_ids(&c, 1).await, ["a0"]);
    // A submission of tenant a in flight, as the store makes one: it holds the tenant's turn
    // (KEY SHARE) and has inserted its job, not yet committed.
    let mut client = raw(&url).await;
    let submit = client.transaction().await.unwrap();
    let held = submit
        .query("SELECT 1 FROM queue_turns WHERE tenant = 'a' FOR KEY SHARE", &[])
        .await
        .unwrap();
    assert_eq!(held.len(), 1, "the served tenant kept its turn");
    submit
        .execute(
            "INSERT INTO jobs (id, tenant, status, workflow, labels, created_at, updated_at, expires_at)
             VALUES ('a1', 'a', 'queued', '{}', '{}', now(), now(), now() + interval '1 day')",
            &[],
        )
        .await
        .unwrap();
    assert!(claim_ids(&c, 1).await.is_empty(), "nothing committed to claim");
    submit.commit().await.unwrap();
    assert_eq!(
        claim_ids(&c, 1).await,
        ["a1"],
        "the submitted job kept its tenant's turn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_jobs_whose_tenant_lost_its_turn_are_given_one_back() {
    let (store, url) = pg().await;
    insert(&store, &["a0"], "a").await;
    insert(&store, &["b0"], "b").await;
    // As a process of an older weft leaves them: queued, with no turn.
    raw(&url).await.batch_execute("DELETE FROM queue_turns").await.unwrap();
    let c = coordinator(&store, "p", LONG).await;
    assert!(claim_ids(&c, 1).await.is_empty(), "a job without a turn is not seen");
    assert_eq!(c.restore_turns().await.unwrap(), 2);
    assert_eq!(c.restore_turns().await.unwrap(), 0, "tenants with a turn keep it");
    assert_eq!(claim_ids(&c, 1).await, ["a0"]);
    assert_eq!(
        claim_ids(&c, 1).await,
        ["b0"],
        "turns given back in the order the tenants queued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_whose_lease_lapsed_is_taken_over_by_exactly_one_process() {
    let (store, _) = pg().await;
    insert(&store, &["j"], "t").await;
    let stuck = coordinator(&store, "stuck", Duration::from_millis(300)).await;
    assert_eq!(claim_ids(&stuck, 1).await, ["j"]);
    let a = coordinator(&store, "a", LONG).await;
    let b = coordinator(&store, "b", LONG).await;
    assert!(a.lapsed().await.unwrap().is_empty(), "a live lease is not lapsed");
    until("the lease lapses", || {
        let a = a.clone();
        async move { a.lapsed().await.unwrap() == ["j"] }
    })
    .await;
    let (ta, tb) = tokio::join!(a.take_over("j"), b.take_over("j"));
    assert!(ta.unwrap() ^ tb.unwrap(), "exactly one takes it over");
    assert!(a.lapsed().await.unwrap().is_empty());
    // A renewed lease does not lapse.
    insert(&store, &["k"], "t").await;
    let live = coordinator(&store, "live", Duration::from_millis(500)).await;
    assert_eq!(claim_ids(&live, 1).await, ["k"]);
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(live.renew_leases().await.unwrap(), 1);
    }
    assert!(!a.lapsed().await.unwrap().contains(&"k".to_string()));
}

/// Closes every connection of process `name` on the database at `url`, as its death does.
async fn kill_connections(url: &str, name: &str) {
    raw(url)
        .await
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_of_a_process_whose_connection_closed_lapse_at_once_whatever_the_lease() {
    let (store, url) = pg().await;
    insert(&store, &["j"], "t").await;
    let doomed = process(&url, "weft doomed").await;
    let c = coordinator(&doomed, "doomed", Duration::from_secs(3600)).await;
    assert_eq!(claim_ids(&c, 1).await, ["j"]);
    let rescuer = coordinator(&store, "rescuer", LONG).await;
    assert!(rescuer.lapsed().await.unwrap().is_empty(), "alive: not lapsed");
    kill_connections(&url, "weft doomed").await;
    until("the dead process's claim lapses", || {
        let r = rescuer.clone();
        async move { r.lapsed().await.unwrap() == ["j"] }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_live_process_leads_and_another_takes_over_when_it_dies() {
    let (_, url) = pg().await;
    let mut processes = Vec::new();
    for p in 0..3 {
        let store = process(&url, &format!("weft leader-{p}")).await;
        let c = coordinator(&store, &format!("leader-{p}"), LONG).await;
        processes.push((store, c));
    }
    let leaders = |ps: &[(Arc<PgStore>, Arc<PgCoordinator>)]| {
        ps.iter()
            .enumerate()
            .filter(|(_, (_, c))| c.is_leader())
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    until("a leader is elected", || {
        let one = leaders(&processes).len() == 1;
        async move { one }
    })
    .await;
    let first = leaders(&processes)[0];
    for _ in 0..10 {
        assert_eq!(leaders(&processes), [first], "one leader at a time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill_connections(&url, &format!("weft leader-{first}")).await;
    until("another process leads", || {
        let now = leaders(&processes);
        async move { now.len() == 1 && now[0] != first }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_locks_jobs_in_the_order_log_batches_do_and_never_deadlocks_with_one() {
    let (store, url) = pg().await;
    // "b" first: it is claimed first and lies first in the table, so a renewal that locked
    // rows in scan order would take "b" before "a".
    insert(&store, &["b", "a"], "t").await;
    let c = coordinator(&store, "p", LONG).await;
    assert_eq!(claim_ids(&c, 2).await.len(), 2);
    // A log batch of both jobs, as the log writes one: rows in id order, "a" locked first.
    let mut client = raw(&url).await;
    let batch = client.transaction().await.unwrap();
    let lock = "SELECT id FROM jobs WHERE id = $1 FOR NO KEY UPDATE";
    batch.execute(lock, &[&"a"]).await.unwrap();
    let renewal = tokio::spawn({
        let c = c.clone();
        async move { c.renew_leases().await }
    });
    // Once the renewal waits for "a", the batch goes on to "b": it must find "b" free.
    let watcher = raw(&url).await;
    let waiting =
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    until("the renewal waits for the batch", || async {
        watcher.query_one(waiting, &[]).await.unwrap().get::<_, i64>(0) > 0
    })
    .await;
    batch.execute(lock, &[&"b"]).await.expect("the batch is not deadlocked");
    batch.commit().await.unwrap();
    assert_eq!(renewal.await.unwrap().expect("the renewal is not deadlocked"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_of_one_job_are_numbered_once_across_processes_and_wake_the_others() {
    let (store, url) = pg().await;
    insert(&store, &["j"], "t").await;
    let other = process(&url, "weft b").await;
    let a = coordinator(&store, "a", LONG).await;
    let b = coordinator(&other, "b", LONG).await;
    let mut woken = b.signals();
    // Wait until b's listening connection is up: a wake-up from a reaches it.
    let deadline = tokio::time::Instant::now() + LONG;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "b never heard a wake-up");
        a.signal(Signal::Work).await.unwrap();
        if let Ok(Ok(Signal::Work)) = tokio::time::timeout(Duration::from_millis(200), woken.recv()).await {
            break;
        }
    }
    let appends = (0..20).map(|i| {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { c.append_event("j", format!("{{\"i\":{i}}}"), None).await.unwrap() }
    });
    let mut numbers = futures::future::join_all(appends).await;
    numbers.sort();
    assert_eq!(numbers, (1..=20).collect::<Vec<u64>>());
    loop {
        let s = tokio::time::timeout(LONG, woken.recv()).await.unwrap().unwrap();
        if let Signal::Event(notice) = s {
            assert_eq!((notice.job.as_str(), notice.tenant.as_str()), ("j", "t"));
            assert!((1..=20).contains(&notice.n));
            break;
        }
    }
    let after = a.events_after("j", 15, 100).await.unwrap();
    assert_eq!(after.iter().map(|e| e.0).collect::<Vec<_>>(), [16, 17, 18, 19, 20]);
    let latest = a.latest_events("j", 2).await.unwrap();
    assert_eq!(latest.iter().map(|e| e.0).collect::<Vec<_>>(), [19, 20]);
    a.signal(Signal::Cancel("j".into())).await.unwrap();
    loop {
        let s = tokio::time::timeout(LONG, woken.recv()).await.unwrap().unwrap();
        if s == Signal::Cancel("j".into()) {
            break;
        }
    }
}

/// The status event a test batch writes for a moved job.
fn status_body(job: &JobRecord) -> String {
    format!("{{\"status\":\"{}\"}}", job.status.as_str())
}

fn finish(id: &str, to: JobStatus, update: JobUpdate) -> LogWrite {
    LogWrite::Move {
        id: id.into(),
        moves: vec![(JobStatus::Running, to)],
        update: Box::new(update),
        announce: vec!["{\"announced\":true}".into()],
    }
}

fn output(id: &str, job: &str) -> AssetRecord {
    AssetRecord {
        id: id.into(),
        tenant: "t".into(),
        blob: String::new(),
        size_bytes: 2,
        content_type: "text/plain".into(),
        file_path: format!("{id}.txt"),
        job_id: Some(job.into()),
        node_id: Some("1".into()),
        kind: Some("output".into()),
        tags: vec![],
        created_at: Utc::now(),
        expires_at: None,
        output_index: Some(0),
        inline: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_batch_writes_moves_events_and_outputs_together_and_skips_what_is_gone() {
    let (store, _) = pg().await;
    insert(&store, &["j"], "t").await;
    let c = coordinator(&store, "p", LONG).await;
    assert_eq!(claim_ids(&c, 1).await, ["j"]);
    let done = JobUpdate {
        outputs: vec![(output("o1", "j"), bytes::Bytes::from_static(b"hi"))],
        ..JobUpdate::default()
    };
    let writes = vec![
        LogWrite::Event {
            job: "j".into(),
            body: "{\"first\":true}".into(),
            progress: None,
        },
        finish("j", JobStatus::Succeeded, done),
        LogWrite::Event {
            job: "gone".into(),
            body: "{}".into(),
            progress: None,
        },
        finish("gone", JobStatus::Succeeded, JobUpdate::default()),
        finish("j", JobStatus::Failed, JobUpdate::default()),
    ];
    let written = c.write(writes, &status_body).await.unwrap();
    let moved: Vec<Option<JobStatus>> = written.moved.iter().map(|m| m.as_ref().map(|j| j.status)).collect();
    assert_eq!(
        moved,
        [Some(JobStatus::Succeeded), None, None],
        "a job moves once; a job that is gone does not"
    );
    let log: Vec<String> = c
        .events_after("j", 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.1)
        .collect();
    assert_eq!(
        log,
        ["{\"first\":true}", "{\"announced\":true}", "{\"status\":\"succeeded\"}"]
    );
    assert_eq!(written.notices.len(), 1, "one notice for the job that exists");
    assert_eq!((written.notices[0].job.as_str(), written.notices[0].n), ("j", 1));
    let stored = store.job_by_id("j").await.unwrap().unwrap();
    assert_eq!(stored.status, JobStatus::Succeeded);
    assert!(stored.completed_at.is_some());
    let outputs = store.job_outputs("j").await.unwrap();
    assert_eq!(outputs.len(), 1);
    assert_eq!(store.asset_content("o1").await.unwrap().as_deref(), Some(&b"hi"[..]));
    assert!(c.lapsed().await.unwrap().is_empty());
    assert_eq!(c.renew_leases().await.unwrap(), 0, "the move gave up the claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_finish_sent_by_two_processes_at_once_moves_the_job_once() {
    let (store, url) = pg().await;
    insert(&store, &["j"], "t").await;
    let other = process(&url, "weft other").await;
    let a = coordinator(&store, "a", LONG).await;
    let b = coordinator(&other, "b", LONG).await;
    assert_eq!(claim_ids(&a, 1).await, ["j"]);
    let (ra, rb) = tokio::join!(
        a.write(
            vec![finish("j", JobStatus::Succeeded, JobUpdate::default())],
            &status_body
        ),
        b.write(vec![finish("j", JobStatus::Failed, JobUpdate::default())], &status_body),
    );
    let moved: Vec<JobStatus> = [ra.unwrap(), rb.unwrap()]
        .iter()
        .filter_map(|w| w.moved[0].as_ref().map(|j| j.status))
        .collect();
    assert_eq!(moved.len(), 1, "exactly one finish moves it: {moved:?}");
    let statuses: Vec<String> = a
        .events_after("j", 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.1)
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| s.contains("status")).count(),
        1,
        "one status event"
    );
    assert_eq!(store.job_by_id("j").await.unwrap().unwrap().status, moved[0]);
}
