//! Committing a node's outputs: each file encoded (off the async thread when large),
//! checked against the job's output bounds, stored and recorded as the job's next output,
//! in order; the last node's small outputs are held for the job's final move.

use std::sync::Arc;
use std::time::Instant;
use weft_types::NodeErrorCode;

use chrono::Utc;

use crate::graph;
use crate::jobs::cache::CachedFile;
use crate::jobs::events::JobEvent;
use crate::jobs::outputs::{self, JobFiles};
use crate::jobs::Jobs;
use crate::runtime::{CancelToken, OutputFile, Value};
use crate::store::{AssetRecord, JobError, JobRecord, TEMPORARY_OUTPUT_TAG};

/// The failure code `Jobs::store_output` gives when its [`Until`] came first; the
/// commit loop turns it into the deadline's or the stop's outcome.
const ENCODE_INTERRUPTED: &str = "interrupted";

/// When an output's encode must stop: at the node's deadline, or once `stop` is canceled.
struct Until {
    deadline: Instant,
    stop: CancelToken,
}

/// Output files that encode from at most this many bytes, the job's workflow included (a
/// 64x64 RGB image is 12 KiB), are encoded on the async thread; larger ones on a blocking
/// thread.
const INLINE_ENCODE_BYTES: usize = 16 * 1024;

/// What a job has committed so far: the next output's index, and the bytes held.
#[derive(Default)]
pub(super) struct Committed {
    count: i64,
    bytes: u64,
}

/// A job's output books: what it committed so far, and its files' numbering.
pub(super) type Books = (Committed, JobFiles);

/// Whether one more output of `size` bytes fits bounds of `max_outputs` outputs and
/// `max_bytes` bytes, given what is `committed`; why not if not.
fn admit(max_outputs: usize, max_bytes: u64, committed: &Committed, size: u64) -> Result<(), String> {
    if committed.count as usize >= max_outputs {
        return Err(format!(
            "the job may commit at most {max_outputs} outputs (--max-job-outputs)"
        ));
    }
    if committed.bytes.saturating_add(size) > max_bytes {
        return Err(format!(
            "the job's outputs would exceed {} MiB in all (--max-job-output-mib)",
            max_bytes >> 20
        ));
    }
    Ok(())
}

/// What a node that ran leaves to commit when its turn comes.
pub(super) enum Commit {
    /// Nothing: the node is finished.
    Done,
    /// Files from the cache, stored already.
    Cached(Vec<CachedFile>),
    /// Files the call made, to encode and store, with the node's values for the cache and
    /// the time it may take.
    Made {
        files: Vec<OutputFile>,
        values: Option<Vec<Value>>,
        budget: std::time::Duration,
    },
}

/// What [`Jobs::commit_node`] returns.
pub(super) type CommitResult = (
    Result<Option<Vec<CachedFile>>, JobError>,
    Option<(Committed, JobFiles)>,
    Option<Vec<Value>>,
    Vec<HeldOutput>,
);

/// An inline output whose record waits for the job's final move, to be written in the same
/// transaction (see [`Jobs::commit_file`]).
pub(super) type HeldOutput = (AssetRecord, bytes::Bytes);

/// Most outputs of the last node that are held for the job's final move.
const MAX_HELD_OUTPUTS: usize = 8;

/// What the last node to commit leaves for the job's final move: its inline outputs, and
/// the announcement of its end, which follows them.
#[derive(Default)]
pub(super) struct FinalMove {
    /// The inline outputs held, in order.
    pub(super) outputs: Vec<HeldOutput>,
    /// The event that ends their node, announced after them.
    pub(super) finished: Option<JobEvent>,
}

impl Jobs {
    /// Commits the files `work` left for `node`, in order, as the job's next outputs
    /// (numbered from `committed`). Returns the files (`None` when the job was stopped
    /// between files), the job's books back (`None` after a failure, when the job ends),
    /// the node's values for the cache, and, when `last` (no node commits after it), its
    /// inline outputs held for the job's final move instead of recorded now.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit_node(
        &self,
        job: &JobRecord,
        node: &graph::PlannedNode,
        work: Commit,
        mut committed: Committed,
        mut job_files: JobFiles,
        workflow_text: Arc<str>,
        stop: &CancelToken,
        last: bool,
    ) -> CommitResult {
        // Only a few outputs are held: a node with many commits them one by one, within its
        // time limit, rather than in one unbounded final transaction.
        let announced: usize = match &work {
            Commit::Done => 0,
            Commit::Cached(files) => files.len(),
            Commit::Made { files, .. } => files.iter().map(|f| f.data.files()).sum(),
        };
        let mut held = (last && announced <= MAX_HELD_OUTPUTS).then(Vec::new);
        let failed = |code: &str, message: String| -> CommitResult {
            let error = JobError {
                code: code.into(),
                message,
                node_id: Some(node.id.clone()),
                class_type: Some(node.class_type.clone()),
                traceback: None,
            };
            (Err(error), None, None, Vec::new())
        };
        match work {
            Commit::Done => (Ok(Some(Vec::new())), Some((committed, job_files)), None, Vec::new()),
            Commit::Cached(files) => {
                for file in &files {
                    if stop.is_canceled() {
                        return (Ok(None), Some((committed, job_files)), None, Vec::new());
                    }
                    if let Err(m) = self.admit_output(&committed, file.size) {
                        return failed(NodeErrorCode::JobOutputLimit.as_str(), m);
                    }
                    if let Err(m) = self
                        .commit_file(job, &node.id, file.clone(), &mut committed, held.as_mut())
                        .await
                    {
                        return failed(NodeErrorCode::OutputCommitFailed.as_str(), m);
                    }
                }
                (
                    Ok(Some(files)),
                    Some((committed, job_files)),
                    None,
                    held.unwrap_or_default(),
                )
            }
            Commit::Made { files, values, budget } => {
                // It stops at the node's deadline or at a stop, between files.
                let began = Instant::now();
                if committed.count as usize + announced > self.config.max_outputs {
                    let message = format!(
                        "the node would commit {announced} outputs; the job may commit at most {} (--max-job-outputs)",
                        self.config.max_outputs
                    );
                    return failed(NodeErrorCode::JobOutputLimit.as_str(), message);
                }
                let mut stored_files = Vec::new();
                // One file at a time: encoded, checked against the job's bounds, stored
                // and committed before the next is encoded. Encoding and the blob's
                // write and fsync run on a blocking thread, off the async workers.
                for file in files {
                    let file = Arc::new(file);
                    for index in 0..file.data.files() {
                        if stop.is_canceled() {
                            return (Ok(None), Some((committed, job_files)), None, Vec::new());
                        }
                        if began.elapsed() >= budget {
                            let message = "the node ran past its time limit while its outputs were committed".into();
                            return failed(NodeErrorCode::NodeTimeout.as_str(), message);
                        }
                        let until = Until {
                            deadline: began + budget,
                            stop: stop.clone(),
                        };
                        let stored = self
                            .store_output(file.clone(), index, job_files, workflow_text.clone(), &committed, until)
                            .await;
                        let (cached, returned) = match stored {
                            Ok(done) => done,
                            Err((ENCODE_INTERRUPTED, _)) if began.elapsed() >= budget => {
                                let message = "the node ran past its time limit while its outputs were encoded".into();
                                return failed(NodeErrorCode::NodeTimeout.as_str(), message);
                            }
                            Err((ENCODE_INTERRUPTED, _)) => {
                                let message = "the job was stopped while its outputs were encoded".into();
                                return failed(NodeErrorCode::Canceled.as_str(), message);
                            }
                            Err((code, message)) => return failed(code, message),
                        };
                        job_files = returned;
                        if let Err(m) = self
                            .commit_file(job, &node.id, cached.clone(), &mut committed, held.as_mut())
                            .await
                        {
                            return failed(NodeErrorCode::OutputCommitFailed.as_str(), m);
                        }
                        stored_files.push(cached);
                    }
                }
                (
                    Ok(Some(stored_files)),
                    Some((committed, job_files)),
                    values,
                    held.unwrap_or_default(),
                )
            }
        }
    }

    /// When a preview committed at `now` by `job` expires: after the preview retention if
    /// one is set, and never after its job.
    fn preview_expiry(&self, job: &JobRecord, now: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
        self.config
            .preview_retention
            .and_then(|kept| chrono::Duration::from_std(kept).ok())
            .and_then(|kept| now.checked_add_signed(kept))
            .map_or(job.expires_at, |gone| gone.min(job.expires_at))
    }

    /// Whether one more output of `size` bytes fits the job's output bounds; why not if not.
    fn admit_output(&self, committed: &Committed, size: u64) -> Result<(), String> {
        admit(self.config.max_outputs, self.config.max_output_bytes, committed, size)
    }

    /// Encodes file `index` of `file` (a large image stops at `until`), checks it against the
    /// job's output bounds and writes its blob, on a blocking thread. Returns the stored file
    /// and `job_files` back, or the failure's code and message ([`ENCODE_INTERRUPTED`] when
    /// `until` came first).
    async fn store_output(
        &self,
        file: Arc<OutputFile>,
        index: usize,
        mut job_files: JobFiles,
        workflow_text: Arc<str>,
        committed: &Committed,
        until: Until,
    ) -> Result<(CachedFile, JobFiles), (&'static str, String)> {
        let (max_outputs, max_bytes) = (self.config.max_outputs, self.config.max_output_bytes);
        let inline_max = self.config.inline_output_bytes;
        let committed = Committed {
            count: committed.count,
            bytes: committed.bytes,
        };
        // The workflow counts too: a PNG carries it in a text chunk.
        let small = file.data.source_len() + workflow_text.len() <= INLINE_ENCODE_BYTES;
        let temporary = file.temporary;
        let encode = move || {
            let ask = move || until.stop.is_canceled() || Instant::now() >= until.deadline;
            let stop = weft_compute::interrupt::Interrupt::new(&ask);
            let e = outputs::encode(&file, index, &mut job_files, &workflow_text, stop).map_err(|e| match e {
                outputs::EncodeError::Interrupted => (ENCODE_INTERRUPTED, String::new()),
                outputs::EncodeError::Failed(m) => ("output_encoding_failed", m),
            })?;
            admit(max_outputs, max_bytes, &committed, e.bytes.len() as u64)
                .map_err(|m| (NodeErrorCode::JobOutputLimit.as_str(), m))?;
            // A small file goes inline, into its asset's row: hashed here, never a blob.
            let inline = (e.bytes.len() <= inline_max).then(|| blake3::hash(&e.bytes).to_hex().to_string());
            Ok((e, inline, job_files))
        };
        // A small file is encoded here, in tens of microseconds, rather than handed to a
        // blocking thread and back (two thread wake-ups, which cost more on a loaded VM).
        let (e, inline, job_files) = if small {
            encode()?
        } else {
            tokio::task::spawn_blocking(encode).await.map_err(|e| {
                (
                    NodeErrorCode::OutputCommitFailed.as_str(),
                    format!("the output's write was lost: {e}"),
                )
            })??
        };
        let (blob, size, inline) = match inline {
            Some(hash) => {
                // Kept with the job's record and in the node cache: only its own bytes, not
                // the encoder's spare capacity (a 64x64 PNG of 1 KiB was held in 7 KiB).
                let mut bytes = e.bytes;
                bytes.shrink_to_fit();
                (hash, bytes.len() as u64, Some(bytes::Bytes::from(bytes)))
            }
            None => {
                let (blob, size) = self
                    .assets
                    .put(e.bytes)
                    .await
                    .map_err(|io| (NodeErrorCode::OutputCommitFailed.as_str(), io.to_string()))?;
                (blob, size, None)
            }
        };
        let cached = CachedFile {
            name: e.name,
            kind: e.kind,
            content_type: e.content_type,
            blob,
            size,
            inline,
            temporary,
        };
        Ok((cached, job_files))
    }

    /// Records `file` as the job's next output (numbered by `committed`, which then counts
    /// it) and announces it. With `held`, an inline file's record is added there instead,
    /// for the job's final move to write and announce; a blob's record is written at once,
    /// after those held before it, so that outputs stay in order.
    async fn commit_file(
        &self,
        job: &JobRecord,
        node_id: &str,
        file: CachedFile,
        committed: &mut Committed,
        held: Option<&mut Vec<HeldOutput>>,
    ) -> Result<(), String> {
        let now = Utc::now();
        let asset = AssetRecord {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: job.tenant.clone(),
            blob: file.blob,
            size_bytes: file.size as i64,
            content_type: file.content_type,
            file_path: file.name,
            job_id: Some(job.id.clone()),
            node_id: Some(node_id.to_string()),
            kind: Some(
                serde_json::to_value(file.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_else(|| "file".into()),
            ),
            tags: if file.temporary {
                vec![TEMPORARY_OUTPUT_TAG.to_string()]
            } else {
                Vec::new()
            },
            created_at: now,
            expires_at: file.temporary.then(|| self.preview_expiry(job, now)),
            output_index: Some(committed.count),
            inline: file.inline.is_some(),
        };
        let size = file.size;
        match (held, file.inline) {
            (Some(held), Some(content)) => held.push((asset, content)),
            (held, content) => {
                for (asset, content) in held.map(std::mem::take).unwrap_or_default() {
                    self.assets.commit_output(asset.clone(), Some(content)).await?;
                    self.publish(&job.id, JobEvent::Output(Box::new(asset)));
                }
                self.assets.commit_output(asset.clone(), content).await?;
                self.publish(&job.id, JobEvent::Output(Box::new(asset)));
            }
        }
        committed.count += 1;
        committed.bytes += size;
        Ok(())
    }
}
