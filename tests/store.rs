//! One contract, two stores: every case here runs against the embedded SQLite store and
//! against PostgreSQL (a throw-away cluster the tests start, see `support::postgres`).
//! The cross-process coordination that only the PostgreSQL store offers is tested at the end.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use weft::store::postgres::PgStore;
use weft::store::{AssetRecord, Database, Deleted, JobRecord, JobStatus, JobUpdate, NodeTime, Store, StoreError};

/// A store of each kind, fresh: SQLite in a temp dir, PostgreSQL in a new database.
enum Kind {
    Sqlite,
    Postgres,
}

struct Fixture {
    store: Arc<dyn Store>,
    database: Database,
    _dir: tempfile::TempDir,
}

async fn open(kind: Kind) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let database = match kind {
        Kind::Sqlite => Database::Sqlite(dir.path().join("weft.db")),
        Kind::Postgres => {
            let url = tokio::task::spawn_blocking(support::postgres::fresh_database)
                .await
                .unwrap();
            Database::Postgres(url)
        }
    };
    let store = database.open().await.unwrap().store;
    Fixture {
        store,
        database,
        _dir: dir,
    }
}

/// Runs `case` against both stores, as two tests.
macro_rules! both {
    ($case:ident) => {
        mod $case {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$case(open(Kind::Sqlite).await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$case(open(Kind::Postgres).await).await;
            }
        }
    };
}

use support::records::queued_job as job;

fn asset(id: &str, tenant: &str, blob: &str, job_id: Option<&str>, index: Option<i64>) -> AssetRecord {
    AssetRecord {
        id: id.into(),
        tenant: tenant.into(),
        blob: blob.into(),
        size_bytes: 3,
        content_type: "text/plain".into(),
        file_path: "a.txt".into(),
        job_id: job_id.map(Into::into),
        node_id: job_id.map(|_| "1".into()),
        kind: None,
        tags: vec!["t".into()],
        created_at: Utc::now(),
        expires_at: None,
        output_index: index,
        inline: false,
    }
}

async fn a_job_reads_back_as_written_and_only_by_its_tenant(f: Fixture) {
    let mut j = job("j1", "a", Utc::now());
    j.labels = BTreeMap::from([("k".to_string(), "v".to_string())]);
    f.store.insert_job(j.clone(), None, 0).await.unwrap();
    let read = f.store.job("a", "j1").await.unwrap().unwrap();
    assert!(read.workflow.is_null(), "a record is read without its workflow");
    let workflow = f.store.job_workflow("j1").await.unwrap().unwrap();
    assert_eq!(workflow.to_string(), j.workflow.to_string(), "key order is kept");
    assert!(f.store.job_workflow("nope").await.unwrap().is_none());
    let workflows = f
        .store
        .workflows_of_jobs(&["j1".to_string(), "nope".to_string()])
        .await
        .unwrap();
    assert_eq!(workflows.len(), 1);
    assert_eq!(workflows["j1"].to_string(), j.workflow.to_string());
    assert_eq!(read.labels, j.labels);
    assert_eq!(read.status, JobStatus::Queued);
    assert_eq!(read.created_at.timestamp_micros(), j.created_at.timestamp_micros());
    assert!(f.store.job("b", "j1").await.unwrap().is_none());
    assert!(f.store.job_by_id("j1").await.unwrap().is_some());
    assert!(matches!(
        f.store.insert_job(j, None, 0).await,
        Err(StoreError::Conflict(_) | StoreError::Backend(_))
    ));
}
both!(a_job_reads_back_as_written_and_only_by_its_tenant);

async fn positions_grow_and_pages_follow_them_with_label_filters(f: Fixture) {
    let now = Utc::now();
    for i in 0..5 {
        let mut j = job(&format!("j{i}"), "a", now);
        j.labels = BTreeMap::from([("even".to_string(), (i % 2 == 0).to_string())]);
        f.store.insert_job(j, None, 0).await.unwrap();
    }
    f.store.insert_job(job("other", "b", now), None, 0).await.unwrap();
    let page = f.store.list_jobs("a", 2, None, &BTreeMap::new(), None).await.unwrap();
    let ids: Vec<_> = page.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["j4", "j3"]);
    assert!(page.jobs[0].seq > page.jobs[1].seq);
    let next = page.next.unwrap();
    assert!(f.store.job_seq_exists("a", next).await.unwrap());
    assert!(!f.store.job_seq_exists("b", next).await.unwrap());
    let rest = f
        .store
        .list_jobs("a", 10, Some(next), &BTreeMap::new(), None)
        .await
        .unwrap();
    let ids: Vec<_> = rest.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["j2", "j1", "j0"]);
    assert_eq!(rest.next, None);
    let even = BTreeMap::from([("even".to_string(), "true".to_string())]);
    let ids: Vec<String> = f
        .store
        .list_jobs("a", 10, None, &even, None)
        .await
        .unwrap()
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(ids, ["j4", "j2", "j0"]);
    let any_label = BTreeMap::new();
    let by_status = |status| f.store.list_jobs("a", 10, None, &any_label, Some(status));
    assert_eq!(by_status(JobStatus::Queued).await.unwrap().jobs.len(), 5);
    assert!(by_status(JobStatus::Succeeded).await.unwrap().jobs.is_empty());
}
both!(positions_grow_and_pages_follow_them_with_label_filters);

async fn concurrent_inserts_get_distinct_positions(f: Fixture) {
    let inserts = (0..40).map(|i| f.store.insert_job(job(&format!("j{i}"), "a", Utc::now()), None, 0));
    for r in futures::future::join_all(inserts).await {
        r.unwrap();
    }
    let page = f.store.list_jobs("a", 100, None, &BTreeMap::new(), None).await.unwrap();
    let mut seqs: Vec<i64> = page.jobs.iter().map(|j| j.seq).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), 40);
}
both!(concurrent_inserts_get_distinct_positions);

async fn idempotency_keys_last_24_hours_and_name_their_job(f: Fixture) {
    let then = Utc::now() - TimeDelta::hours(30);
    let at = |h| then + TimeDelta::hours(h);
    f.store
        .insert_job(job("j1", "t", then), Some("k".into()), 0)
        .await
        .unwrap();
    assert_eq!(
        f.store.idempotency_claim("t", "k", at(23)).await.unwrap(),
        Some(Some("j1".into()))
    );
    assert_eq!(f.store.idempotency_claim("t", "k", at(25)).await.unwrap(), None);
    assert_eq!(f.store.idempotency_claim("other", "k", at(1)).await.unwrap(), None);
    match f.store.insert_job(job("j2", "t", at(23)), Some("k".into()), 0).await {
        Err(StoreError::IdempotencyReuse { job_id }) => assert_eq!(job_id.as_deref(), Some("j1")),
        other => panic!("expected reuse, got {other:?}"),
    }
    assert!(
        f.store.job_by_id("j2").await.unwrap().is_none(),
        "a refused job is not written"
    );
    f.store
        .insert_job(job("j3", "t", at(25)), Some("k".into()), 0)
        .await
        .unwrap();
    match f
        .store
        .insert_job(job("j4", "t", Utc::now()), Some("k".into()), 0)
        .await
    {
        Err(StoreError::IdempotencyReuse { job_id }) => assert_eq!(job_id.as_deref(), Some("j3")),
        other => panic!("expected reuse, got {other:?}"),
    }
    assert_eq!(
        f.store
            .purge_idempotency(Utc::now() + TimeDelta::hours(1))
            .await
            .unwrap(),
        1
    );
    f.store
        .insert_job(job("j5", "t", Utc::now()), Some("k".into()), 0)
        .await
        .unwrap();
}
both!(idempotency_keys_last_24_hours_and_name_their_job);

async fn concurrent_duplicate_keys_make_exactly_one_job(f: Fixture) {
    let attempts = (0..20).map(|i| {
        f.store
            .insert_job(job(&format!("j{i}"), "t", Utc::now()), Some("same".into()), 0)
    });
    let results = futures::future::join_all(attempts).await;
    let made: Vec<usize> = (0..20).filter(|i| results[*i].is_ok()).collect();
    assert_eq!(made.len(), 1, "{results:?}");
    for r in results.iter().filter(|r| r.is_err()) {
        match r {
            Err(StoreError::IdempotencyReuse { job_id }) => assert_eq!(job_id, &Some(format!("j{}", made[0]))),
            other => panic!("expected reuse, got {other:?}"),
        }
    }
}
both!(concurrent_duplicate_keys_make_exactly_one_job);

async fn concurrent_submissions_never_overspend_credits(f: Fixture) {
    assert_eq!(f.store.add_credits("t", 3).await.unwrap(), 3);
    let attempts = (0..12).map(|i| {
        f.store
            .insert_job(job(&format!("j{i}"), "t", Utc::now()), Some(format!("k{i}")), 1)
    });
    let results = futures::future::join_all(attempts).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 3);
    for refused in results.iter().filter(|r| r.is_err()) {
        assert!(
            matches!(refused, Err(StoreError::InsufficientCredits { balance: 0 })),
            "{refused:?}"
        );
    }
    assert_eq!(f.store.tenant("t").await.unwrap().unwrap().credits, 0);
    let refused = (0..12).find(|i| results[*i].is_err()).unwrap();
    assert_eq!(
        f.store
            .idempotency_claim("t", &format!("k{refused}"), Utc::now())
            .await
            .unwrap(),
        None,
        "a refused job claims no key"
    );
    assert_eq!(f.store.add_credits("t", -1).await.unwrap(), -1);
}
both!(concurrent_submissions_never_overspend_credits);

async fn a_status_moves_only_from_where_it_is(f: Fixture) {
    f.store.insert_job(job("j", "t", Utc::now()), None, 0).await.unwrap();
    let start = [(JobStatus::Queued, JobStatus::Running)];
    let started = f
        .store
        .update_job(
            "j",
            &start,
            JobUpdate {
                started_at: Some(Utc::now()),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(started.status, JobStatus::Running);
    assert!(started.started_at.is_some());
    assert!(f
        .store
        .update_job("j", &start, JobUpdate::default())
        .await
        .unwrap()
        .is_none());
    let done = f
        .store
        .update_job(
            "j",
            &[(JobStatus::Running, JobStatus::Succeeded)],
            JobUpdate {
                progress: Some(weft::store::Progress {
                    value: 1.0,
                    ..Default::default()
                }),
                node_times: Some(vec![node_time("1", false), node_time("2", true)]),
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert!(done.completed_at.is_some());
    let read = f.store.job_by_id("j").await.unwrap().unwrap();
    assert_eq!(read.status, JobStatus::Succeeded);
    assert_eq!(read.progress.unwrap().value, 1.0);
    assert_eq!(read.node_times, [node_time("1", false), node_time("2", true)]);
    assert!(f
        .store
        .update_job("missing", &start, JobUpdate::default())
        .await
        .unwrap()
        .is_none());
    let counts = f.store.count_by_status().await.unwrap();
    assert_eq!(counts, [(JobStatus::Succeeded, 1)]);
    assert!(f.store.jobs_with_status(&[JobStatus::Queued]).await.unwrap().is_empty());
    assert_eq!(
        f.store.jobs_with_status(&[JobStatus::Succeeded]).await.unwrap().len(),
        1
    );
}
both!(a_status_moves_only_from_where_it_is);

async fn a_tenants_unfinished_jobs_are_read_and_counted_without_the_other_tenants(f: Fixture) {
    let now = Utc::now();
    for (id, tenant) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")] {
        f.store.insert_job(job(id, tenant, now), None, 0).await.unwrap();
    }
    let start = [(JobStatus::Queued, JobStatus::Running)];
    f.store.update_job("a2", &start, JobUpdate::default()).await.unwrap();
    let active = [JobStatus::Queued, JobStatus::Running];
    let ids = |jobs: Vec<JobRecord>| jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
    let read = f.store.tenant_jobs_with_status("a", &active, 10).await.unwrap();
    assert_eq!(ids(read), ["a1", "a2", "a3"], "oldest first, tenant a only");
    let read = f.store.tenant_jobs_with_status("a", &active, 2).await.unwrap();
    assert_eq!(ids(read), ["a1", "a2"], "at most the limit");
    let read = f
        .store
        .tenant_jobs_with_status("a", &[JobStatus::Running], 10)
        .await
        .unwrap();
    assert_eq!(ids(read), ["a2"]);
    assert_eq!(f.store.count_tenant_jobs("a", &active).await.unwrap(), 3);
    assert_eq!(f.store.count_tenant_jobs("b", &active).await.unwrap(), 1);
    assert_eq!(f.store.count_tenant_jobs("c", &active).await.unwrap(), 0);
}
both!(a_tenants_unfinished_jobs_are_read_and_counted_without_the_other_tenants);

fn node_time(node_id: &str, cached: bool) -> NodeTime {
    NodeTime {
        node_id: node_id.into(),
        class_type: "X".into(),
        started_ms: 3,
        duration_ms: 7,
        cached,
    }
}

#[tokio::test]
async fn a_sqlite_database_of_schema_1_is_migrated_and_keeps_its_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weft.db");
    let store = weft::store::sqlite::SqliteStore::open(&path).unwrap();
    store.insert_job(job("old", "t", Utc::now()), None, 0).await.unwrap();
    store
        .insert_asset(asset("up", "t", "b1", None, None), None)
        .await
        .unwrap();
    drop(store);
    // Back to what version 1 held: no node times, no inline asset content.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE jobs DROP COLUMN node_times; ALTER TABLE assets DROP COLUMN content; PRAGMA user_version = 1;",
    )
    .unwrap();
    drop(conn);
    let store = weft::store::sqlite::SqliteStore::open(&path).unwrap();
    let old = store
        .job_by_id("old")
        .await
        .unwrap()
        .expect("the job survives the migration");
    assert!(old.node_times.is_empty());
    let upload = store
        .asset("t", "up")
        .await
        .unwrap()
        .expect("the asset survives the migration");
    assert!(!upload.inline, "an asset from before version 3 is a blob");
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, weft::store::sqlite::SCHEMA_VERSION);
}

async fn assets_outputs_and_their_lifetimes(f: Fixture) {
    f.store.insert_job(job("j", "t", Utc::now()), None, 0).await.unwrap();
    f.store
        .insert_asset(asset("up", "t", "b1", None, None), None)
        .await
        .unwrap();
    f.store
        .insert_asset(asset("o1", "t", "b2", Some("j"), Some(1)), None)
        .await
        .unwrap();
    f.store
        .insert_asset(asset("o0", "t", "b3", Some("j"), Some(0)), None)
        .await
        .unwrap();
    assert_eq!(f.store.asset("t", "up").await.unwrap().unwrap().tags, ["t"]);
    assert!(f.store.asset("u", "up").await.unwrap().is_none());
    assert!(f.store.asset_any("up").await.unwrap().is_some());
    assert_eq!(f.store.asset_by_blob("t", "b1").await.unwrap().unwrap().id, "up");
    assert!(f.store.asset_by_blob("u", "b1").await.unwrap().is_none());
    let outputs: Vec<String> = f
        .store
        .job_outputs("j")
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(outputs, ["o0", "o1"]);
    let by_job = f
        .store
        .outputs_of_jobs(&["j".to_string(), "none".to_string()])
        .await
        .unwrap();
    let ids: Vec<&str> = by_job["j"].iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["o0", "o1"], "each job's outputs in commit order");
    assert!(by_job.get("none").is_none_or(Vec::is_empty));
    assert!(matches!(f.store.delete_asset("t", "o0").await, Err(StoreError::InUse)));
    assert_eq!(f.store.delete_asset("u", "up").await.unwrap(), Deleted::NotFound);
    let orphans = f
        .store
        .unreferenced_blobs(vec!["b1".into(), "b2".into(), "zz".into()])
        .await
        .unwrap();
    assert_eq!(orphans, ["zz"]);
    assert_eq!(
        f.store.delete_asset("t", "up").await.unwrap(),
        Deleted::Yes { blob: "b1".into() }
    );
    let mut expiring = asset("old", "t", "b4", None, None);
    expiring.expires_at = Some(Utc::now() - TimeDelta::seconds(1));
    f.store.insert_asset(expiring, None).await.unwrap();
    assert_eq!(f.store.delete_expired_assets(Utc::now()).await.unwrap(), ["b4"]);
    f.store.delete_job_outputs("j").await.unwrap();
    assert!(f.store.job_outputs("j").await.unwrap().is_empty());
    f.store
        .insert_asset(asset("o2", "t", "b5", Some("j"), Some(0)), None)
        .await
        .unwrap();
    f.store.delete_job("j").await.unwrap();
    assert!(f.store.job_by_id("j").await.unwrap().is_none());
    assert!(
        f.store.asset_any("o2").await.unwrap().is_none(),
        "a job's outputs go with it"
    );
}

async fn an_inline_asset_keeps_its_bytes_in_its_record_and_references_no_blob(f: Fixture) {
    f.store.insert_job(job("j", "t", Utc::now()), None, 0).await.unwrap();
    let mut small = asset("small", "t", "hh", Some("j"), Some(0));
    small.inline = true;
    let content = bytes::Bytes::from_static(b"inline bytes");
    f.store.insert_asset(small, Some(content.clone())).await.unwrap();
    f.store
        .insert_asset(asset("file", "t", "ff", Some("j"), Some(1)), None)
        .await
        .unwrap();
    let read: Vec<(String, bool)> = f
        .store
        .job_outputs("j")
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.id, a.inline))
        .collect();
    assert_eq!(read, [("small".to_string(), true), ("file".to_string(), false)]);
    assert!(f.store.asset("t", "small").await.unwrap().unwrap().inline);
    assert_eq!(f.store.asset_content("small").await.unwrap(), Some(content));
    assert_eq!(
        f.store.asset_content("file").await.unwrap(),
        None,
        "a blob's bytes are not in the record"
    );
    assert_eq!(f.store.asset_content("none").await.unwrap(), None);
    let orphans = f
        .store
        .unreferenced_blobs(vec!["hh".into(), "ff".into()])
        .await
        .unwrap();
    assert_eq!(orphans, ["hh"], "an inline asset holds no blob in the blob store");
    f.store.delete_job("j").await.unwrap();
    assert_eq!(
        f.store.asset_content("small").await.unwrap(),
        None,
        "its bytes go with it"
    );
}
both!(assets_outputs_and_their_lifetimes);
both!(an_inline_asset_keeps_its_bytes_in_its_record_and_references_no_blob);

async fn outputs_given_with_a_move_are_recorded_only_if_the_job_moves(f: Fixture) {
    f.store.insert_job(job("j", "t", Utc::now()), None, 0).await.unwrap();
    let running = [(JobStatus::Queued, JobStatus::Running)];
    f.store
        .update_job("j", &running, JobUpdate::default())
        .await
        .unwrap()
        .unwrap();
    let held = |id: &str, index: i64| {
        let mut output = asset(id, "t", &format!("hash-{id}"), Some("j"), Some(index));
        output.inline = true;
        (output, bytes::Bytes::from(format!("bytes of {id}")))
    };
    // A move that does not happen (the job is not queued) records none of them.
    let refused = JobUpdate {
        outputs: vec![held("lost", 0)],
        ..Default::default()
    };
    let moved = f.store.update_job("j", &running, refused).await.unwrap();
    assert!(moved.is_none());
    assert!(
        f.store.job_outputs("j").await.unwrap().is_empty(),
        "no output without the move"
    );
    // The final move records all of them with it, in order, bytes included.
    let succeed = JobUpdate {
        outputs: vec![held("first", 0), held("second", 1)],
        ..Default::default()
    };
    let done = [(JobStatus::Running, JobStatus::Succeeded)];
    let moved = f.store.update_job("j", &done, succeed).await.unwrap().unwrap();
    assert_eq!(moved.status, JobStatus::Succeeded);
    let (job, outputs) = f.store.job_with_outputs("t", "j").await.unwrap().unwrap();
    assert_eq!(job.status, JobStatus::Succeeded);
    let ids: Vec<&str> = outputs.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, ["first", "second"]);
    assert_eq!(
        f.store.asset_content("second").await.unwrap(),
        Some(bytes::Bytes::from("bytes of second"))
    );
}
both!(outputs_given_with_a_move_are_recorded_only_if_the_job_moves);

async fn expiring_jobs_are_found(f: Fixture) {
    let mut old = job("old", "t", Utc::now() - TimeDelta::days(8));
    old.expires_at = Utc::now() - TimeDelta::seconds(5);
    f.store.insert_job(old, None, 0).await.unwrap();
    f.store.insert_job(job("new", "t", Utc::now()), None, 0).await.unwrap();
    assert_eq!(
        f.store.jobs_expiring(Utc::now()).await.unwrap(),
        [("old".to_string(), JobStatus::Queued)]
    );
}
both!(expiring_jobs_are_found);

async fn tenants_and_keys(f: Fixture) {
    f.store.ensure_tenant("a", 5).await.unwrap();
    f.store.ensure_tenant("a", 99).await.unwrap();
    assert_eq!(f.store.tenant("a").await.unwrap().unwrap().credits, 5);
    assert!(f.store.tenant("b").await.unwrap().is_none());
    f.store.add_api_key("a", "hash").await.unwrap();
    assert_eq!(f.store.tenant_for_key("hash").await.unwrap().as_deref(), Some("a"));
    assert_eq!(f.store.tenant_for_key("other").await.unwrap(), None);
    assert!(f.store.add_api_key("b", "hash").await.is_err(), "a key hash is unique");
}
both!(tenants_and_keys);

async fn a_schema_newer_than_this_build_is_refused(f: Fixture) {
    match &f.database {
        Database::Sqlite(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.pragma_update(None, "user_version", 999).unwrap();
        }
        Database::Postgres(url) => {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            client
                .batch_execute("INSERT INTO weft_schema (version) VALUES (999)")
                .await
                .unwrap();
        }
    }
    drop(f.store);
    let refused = f.database.open().await.err().expect("a newer schema is refused");
    assert!(refused.to_string().contains("newer"), "{refused}");
    assert!(f.database.migrate().await.is_err(), "migrate refuses it too");
}
both!(a_schema_newer_than_this_build_is_refused);

async fn a_status_this_build_does_not_know_is_an_error_that_names_it(f: Fixture) {
    f.store.insert_job(job("j1", "a", Utc::now()), None, 0).await.unwrap();
    // Written by a newer version, or by hand.
    match &f.database {
        Database::Sqlite(path) => {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute("UPDATE jobs SET status = 'paused' WHERE id = 'j1'", [])
                .unwrap();
        }
        Database::Postgres(url) => {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            client
                .batch_execute("UPDATE jobs SET status = 'paused' WHERE id = 'j1'")
                .await
                .unwrap();
        }
    }
    let error = f
        .store
        .job("a", "j1")
        .await
        .expect_err("an unknown status is not read as another");
    assert!(error.to_string().contains("paused"), "{error}");
    let error = f.store.job_by_id("j1").await.expect_err("nor by id");
    assert!(error.to_string().contains("paused"), "{error}");
    let error = f.store.count_by_status().await.expect_err("nor counted as another");
    assert!(error.to_string().contains("paused"), "{error}");
}
both!(a_status_this_build_does_not_know_is_an_error_that_names_it);

// ---- PostgreSQL only: blob links shared between processes (claims: tests/claims.rs) ----

async fn pg() -> (Arc<PgStore>, String) {
    let url = tokio::task::spawn_blocking(support::postgres::fresh_database)
        .await
        .unwrap();
    let Database::Postgres(_) = Database::parse(Some(&url), std::path::Path::new(".")) else {
        panic!("a postgres URL")
    };
    (Arc::new(PgStore::connect(&url).await.unwrap()), url)
}

/// The blob-link locks held or awaited in the test's database: (mode, granted). The lock's
/// key is "weftblob" as a 64-bit number, which `pg_locks` shows as two 32-bit halves.
async fn advisory_locks(url: &str) -> Vec<(String, bool)> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT mode, granted FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND classid = x'77656674'::int::oid AND objid = x'626c6f62'::int::oid AND objsubid = 1 \
             ORDER BY granted DESC, mode",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// Polls `advisory_locks` until `want` holds (the lock changes are seen from another
/// session, so they are awaited, not timed).
async fn until_locks(url: &str, want: impl Fn(&[(String, bool)]) -> bool) -> Vec<(String, bool)> {
    for _ in 0..600 {
        let locks = advisory_locks(url).await;
        if want(&locks) {
            return locks;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the advisory locks never reached the expected state: {:?}",
        advisory_locks(url).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn blob_collection_on_one_process_waits_for_links_in_progress_on_another() {
    let (store, url) = pg().await;
    let other = Arc::new(PgStore::connect(&url).await.unwrap());
    // Two processes link blobs at once: shared locks do not exclude each other.
    let link_a = store.lock_blob_links(false).await.unwrap();
    let link_b = other.lock_blob_links(false).await.unwrap();
    until_locks(&url, |l| l.iter().filter(|(m, g)| m == "ShareLock" && *g).count() == 2).await;
    // Collection waits until every link in progress is done.
    let collector = other.clone();
    let collect = tokio::spawn(async move { collector.lock_blob_links(true).await.unwrap() });
    until_locks(&url, |l| l.iter().any(|(m, g)| m == "ExclusiveLock" && !*g)).await;
    drop(link_a);
    until_locks(&url, |l| {
        l.iter().filter(|(m, g)| m == "ShareLock" && *g).count() == 1
            && l.iter().any(|(m, g)| m == "ExclusiveLock" && !*g)
    })
    .await;
    drop(link_b);
    let collecting = collect.await.unwrap();
    until_locks(&url, |l| l == [("ExclusiveLock".to_string(), true)]).await;
    // A link started during collection waits for it in turn.
    let linker = store.clone();
    let link = tokio::spawn(async move { linker.lock_blob_links(false).await.unwrap() });
    until_locks(&url, |l| l.iter().any(|(m, g)| m == "ShareLock" && !*g)).await;
    drop(collecting);
    drop(link.await.unwrap());
    until_locks(&url, <[_]>::is_empty).await;
}
