//! The records the store keeps. They are plain data: the rules that change them live in
//! `jobs`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A job's status, as the interface names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Accepted, waiting for a worker.
    Queued,
    /// A worker is running it.
    Running,
    /// Cancel requested while running.
    Canceling,
    /// Finished with every output.
    Succeeded,
    /// A node failed.
    Failed,
    /// Canceled.
    Canceled,
    /// Retention ran out.
    Expired,
}

impl JobStatus {
    /// Every status.
    pub const ALL: [JobStatus; 7] = [
        JobStatus::Queued,
        JobStatus::Running,
        JobStatus::Canceling,
        JobStatus::Succeeded,
        JobStatus::Failed,
        JobStatus::Canceled,
        JobStatus::Expired,
    ];

    /// Every status of a job that has not finished: the ones [`is_terminal`](Self::is_terminal)
    /// is false for. The queue, recovery and ComfyUI's `/queue` select jobs by it.
    pub const UNFINISHED: [JobStatus; 3] = [JobStatus::Queued, JobStatus::Running, JobStatus::Canceling];

    /// The interface's name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Running => "running",
            JobStatus::Canceling => "canceling",
            JobStatus::Succeeded => "succeeded",
            JobStatus::Failed => "failed",
            JobStatus::Canceled => "canceled",
            JobStatus::Expired => "expired",
        }
    }

    /// Parses the interface's name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Parses a status read from the database: one this version does not know (written by a
    /// newer one, or by hand) is an error that names it.
    pub fn from_stored(s: &str) -> Result<Self, super::StoreError> {
        Self::parse(s).ok_or_else(|| super::StoreError::Backend(format!("unknown job status {s:?} in the database")))
    }

    /// Whether no further transition can happen.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Succeeded | JobStatus::Failed | JobStatus::Canceled | JobStatus::Expired
        )
    }
}

/// A progress snapshot (the interface's `Progress`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Overall fraction, 0..=1.
    pub value: f64,
    /// Nodes finished (cached ones included).
    pub nodes_done: u32,
    /// Nodes the job runs.
    pub nodes_total: u32,
    /// Node running now.
    pub current_node: Option<String>,
    /// Its class.
    pub current_node_class: Option<String>,
    /// Step within the node.
    pub step: Option<u32>,
    /// Steps of the node.
    pub steps: Option<u32>,
    /// Human-readable text.
    pub message: Option<String>,
}

/// A job's failure (the interface's `JobError`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobError {
    /// Code, for example `node_execution_error`.
    pub code: String,
    /// Message.
    pub message: String,
    /// Failing node.
    pub node_id: Option<String>,
    /// Its class.
    pub class_type: Option<String>,
    /// wasm backtrace, when a guest trapped.
    pub traceback: Option<String>,
}

/// A captured log (the interface's `JobLogs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobLogs {
    /// The captured tail.
    pub text: String,
    /// Whether older output was dropped.
    pub truncated: bool,
    /// When it was read back.
    pub captured_at: DateTime<Utc>,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// UUID.
    pub id: String,
    /// Owner.
    pub tenant: String,
    /// Status.
    pub status: JobStatus,
    /// The workflow as submitted. `Null` in records read back from a store, which reads it
    /// only when asked ([`Store::job_workflow`](super::Store::job_workflow)).
    pub workflow: serde_json::Value,
    /// String labels given at submit (`metadata`).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it started running.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a terminal state.
    pub completed_at: Option<DateTime<Utc>>,
    /// Retention deadline.
    pub expires_at: DateTime<Utc>,
    /// Latest progress.
    pub progress: Option<Progress>,
    /// Failure detail.
    pub error: Option<JobError>,
    /// Captured log.
    pub logs: Option<JobLogs>,
    /// How long each node that ran took, in the order they ran (set when the job ends).
    #[serde(default)]
    pub node_times: Vec<NodeTime>,
    /// Ordering key: larger is newer.
    pub seq: i64,
}

/// How long one node of a job took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTime {
    /// The node's id in the workflow.
    pub node_id: String,
    /// Its class.
    pub class_type: String,
    /// When it started, in milliseconds after the job started running.
    pub started_ms: u64,
    /// How long it took, in milliseconds (its outputs' commit included).
    pub duration_ms: u64,
    /// Its result came from the node cache.
    pub cached: bool,
}

/// The tag the server gives a temporary output (a preview): it expires on its own, before
/// its job (see [`AssetRecord::is_temporary`]).
pub const TEMPORARY_OUTPUT_TAG: &str = "temporary";

/// An asset: a UUID record over a content-addressed blob.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssetRecord {
    /// UUID.
    pub id: String,
    /// Owner.
    pub tenant: String,
    /// blake3 hex of the content.
    pub blob: String,
    /// Size in bytes.
    pub size_bytes: i64,
    /// Media type.
    pub content_type: String,
    /// File name or path the uploader gave (or the output's name).
    pub file_path: String,
    /// Producing job, for outputs.
    pub job_id: Option<String>,
    /// Producing node, for outputs.
    pub node_id: Option<String>,
    /// Output type, for outputs.
    pub kind: Option<String>,
    /// Tags given at upload.
    pub tags: Vec<String>,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// When it may be removed; none for outputs (they live as long as their job), except
    /// temporary ones.
    pub expires_at: Option<DateTime<Utc>>,
    /// Position among its job's outputs.
    pub output_index: Option<i64>,
    /// Whether the content is kept in the database with this record (small outputs,
    /// [`Store::asset_content`](super::Store::asset_content)) rather than in the blob store.
    #[serde(default)]
    pub inline: bool,
}

impl AssetRecord {
    /// Whether this is a job's temporary output (a preview, ComfyUI's `temp` folder), tagged
    /// [`TEMPORARY_OUTPUT_TAG`] when committed.
    pub fn is_temporary(&self) -> bool {
        self.job_id.is_some() && self.tags.iter().any(|t| t == TEMPORARY_OUTPUT_TAG)
    }
}

/// A tenant: the unit of isolation.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantRecord {
    /// Name, unique.
    pub name: String,
    /// Credit balance (cloud and serverless surfaces).
    pub credits: i64,
}

/// A file of a tenant's user data (ComfyUI's saved workflows, settings, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct UserFile {
    /// Its path under the tenant's user data, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: i64,
    /// When it was first written.
    pub created: DateTime<Utc>,
    /// When it was last written.
    pub modified: DateTime<Utc>,
}

/// How a user-data write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum UserWrite {
    /// Written.
    Written(UserFile),
    /// Refused: the path is taken and overwriting was not asked for.
    Exists,
    /// Refused: the source of a move does not exist.
    Missing,
    /// Refused: the tenant's user data would exceed its bounds.
    Full,
}

/// Bounds of one tenant's user data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserDataLimits {
    /// Most files.
    pub files: i64,
    /// Most bytes in all.
    pub bytes: i64,
}

#[cfg(test)]
mod tests {
    use super::JobStatus;

    #[test]
    fn the_unfinished_statuses_are_the_ones_that_are_not_terminal() {
        let unfinished: Vec<JobStatus> = JobStatus::ALL.into_iter().filter(|s| !s.is_terminal()).collect();
        assert_eq!(unfinished, JobStatus::UNFINISHED);
    }
}
