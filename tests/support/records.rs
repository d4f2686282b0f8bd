//! Store records for the tests that speak to a store directly.

use chrono::{DateTime, TimeDelta, Utc};
use weft::store::{JobRecord, JobStatus};

/// A queued job `id` of `tenant`, submitted at `created_at`, kept for a week.
pub(crate) fn queued_job(id: &str, tenant: &str, created_at: DateTime<Utc>) -> JobRecord {
    JobRecord {
        id: id.into(),
        tenant: tenant.into(),
        status: JobStatus::Queued,
        workflow: serde_json::json!({"1": {"class_type": "X", "inputs": {"b": 1, "a": 2}}}),
        labels: Default::default(),
        created_at,
        updated_at: created_at,
        started_at: None,
        completed_at: None,
        expires_at: created_at + TimeDelta::days(7),
        progress: None,
        error: None,
        logs: None,
        node_times: Vec::new(),
        seq: 0,
    }
}
