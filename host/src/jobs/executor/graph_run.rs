//! The state of one job's graph while it runs, with no effects of its own: which nodes wait
//! for inputs, which are to be looked up in the cache or to run (lowest plan index first),
//! the values not yet read, what each node left to commit and whose turn it is, and the
//! job's first failure. The executor asks it what to do next, does it (cache look-ups, node
//! calls, commits, events) and tells it what happened.

use std::collections::BTreeSet;
use weft_types::NodeErrorCode;

use super::commit::{Books, Commit, FinalMove, HeldOutput};
use super::node_event;
use crate::graph::{Plan, PlanInput};
use crate::jobs::cache::Entry;
use crate::jobs::events::NodePhase;
use crate::runtime::{CancelToken, Value};
use crate::store::JobError;

/// A node whose turn to commit came, with what it needs to commit.
pub(super) struct NextCommit {
    /// The node's plan index.
    pub(super) index: usize,
    /// What it left to commit (never [`Commit::Done`]).
    pub(super) work: Commit,
    /// The job's books, lent to the commit until it returns them.
    pub(super) books: Books,
    /// Whether it is the last node to commit, every other node done: its inline outputs
    /// are then held for the job's final move.
    pub(super) last: bool,
}

/// The scheduling and commit state of one job's plan.
pub(super) struct GraphRun<'p> {
    plan: &'p Plan,
    /// Per node: how many nodes that read its values have not started yet. Its values are
    /// dropped once the last of them has started (it holds its own copies), so a chain
    /// holds about two values at a time, not all of them (the cache keeps its own).
    readers: Vec<usize>,
    /// Per node: its links to nodes not finished yet.
    waiting: Vec<usize>,
    /// Per node: the nodes that link to it.
    dependents: Vec<Vec<usize>>,
    /// Per node: its values, while a node that reads them has not started.
    results: Vec<Vec<Value>>,
    /// What each node that ran (or was found in the cache) left to commit; outputs commit
    /// in plan order, one node at a time, so `next_commit` is the node whose turn it is.
    pending: Vec<Option<Commit>>,
    next_commit: usize,
    /// The job's books, here while no commit holds them; gone after a failed commit.
    books: Option<Books>,
    /// Nodes whose inputs are ready, not yet looked up in the cache (the last is next).
    fresh: Vec<usize>,
    /// Nodes to run, lowest plan index first.
    ready: BTreeSet<usize>,
    /// The job's first failure.
    failure: Option<JobError>,
    final_move: FinalMove,
    /// The job's cancel (or deadline).
    cancel: CancelToken,
    /// What the node calls stop on: the job's cancel, and the first failure, so that a
    /// failing branch stops the others.
    stop: CancelToken,
}

impl<'p> GraphRun<'p> {
    /// The start of a run of `plan`, for a job canceled by `cancel`: the nodes with no
    /// links are to be looked up, lowest plan index first.
    pub(super) fn new(plan: &'p Plan, cancel: &CancelToken) -> Self {
        let n = plan.nodes.len();
        let mut readers = vec![0usize; n];
        let mut waiting = vec![0usize; n];
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (index, links) in waiting.iter_mut().enumerate() {
            for source in plan.dependencies(index) {
                readers[source] += 1;
                *links += 1;
                dependents[source].push(index);
            }
        }
        let fresh = (0..n).rev().filter(|&i| waiting[i] == 0).collect();
        Self {
            plan,
            readers,
            waiting,
            dependents,
            results: vec![Vec::new(); n],
            pending: (0..n).map(|_| None).collect(),
            next_commit: 0,
            books: Some(Books::default()),
            fresh,
            ready: BTreeSet::new(),
            failure: None,
            final_move: FinalMove::default(),
            cancel: cancel.clone(),
            stop: cancel.child(),
        }
    }

    /// The plan being run.
    pub(super) fn plan(&self) -> &'p Plan {
        self.plan
    }

    /// The token the node calls stop on.
    pub(super) fn stop_token(&self) -> &CancelToken {
        &self.stop
    }

    /// Whether the calls were stopped: by the job's cancel or by a failure.
    pub(super) fn is_stopped(&self) -> bool {
        self.stop.is_canceled()
    }

    /// Whether the job was canceled.
    pub(super) fn is_canceled(&self) -> bool {
        self.cancel.is_canceled()
    }

    /// The next node whose inputs are ready, to be looked up in the cache.
    pub(super) fn next_fresh(&mut self) -> Option<usize> {
        self.fresh.pop()
    }

    /// Node `index` is not in the cache: it is to run.
    pub(super) fn not_cached(&mut self, index: usize) {
        self.ready.insert(index);
    }

    /// Node `index` was found in the cache as `entry`: it reads no inputs, holds its values
    /// for its readers and leaves its files to commit. Returns whether it is finished (it has
    /// no files), and so its dependents may start.
    pub(super) fn take_cached(&mut self, index: usize, entry: Entry) -> bool {
        self.release_inputs(index);
        let work = if entry.files.is_empty() {
            Commit::Done
        } else {
            Commit::Cached(entry.files)
        };
        self.ran(index, entry.values, work)
    }

    /// The lowest node that is to run, if any.
    pub(super) fn next_ready(&self) -> Option<usize> {
        self.ready.first().copied()
    }

    /// Whether nodes are waiting to be looked up in the cache or to run.
    pub(super) fn has_queued(&self) -> bool {
        !self.ready.is_empty() || !self.fresh.is_empty()
    }

    /// Node `index`, which was ready, starts: returns its inputs (dropping the values it was
    /// the last reader of), or the error for a link to an output its source did not return.
    pub(super) fn start(&mut self, index: usize) -> Result<Vec<(String, Value)>, JobError> {
        self.ready.remove(&index);
        let inputs = self.gather_inputs(index)?;
        self.release_inputs(index);
        Ok(inputs)
    }

    /// Node `index` ran (or was found in the cache) and returned `values`, leaving `work` to
    /// commit. Returns whether it is finished (nothing to commit): then its dependents whose
    /// other inputs are ready are to be looked up.
    pub(super) fn ran(&mut self, index: usize, values: Vec<Value>, work: Commit) -> bool {
        self.results[index] = if self.readers[index] > 0 { values } else { Vec::new() };
        let done = matches!(work, Commit::Done);
        if done {
            self.finished(index);
        }
        self.pending[index] = Some(work);
        done
    }

    /// The next node whose turn to commit came, if the job is not canceled, no commit holds
    /// the books and that node has run. Nodes with nothing to commit are passed over.
    pub(super) fn next_commit(&mut self) -> Option<NextCommit> {
        if self.cancel.is_canceled() {
            return None;
        }
        let n = self.plan.nodes.len();
        while self.books.is_some() && self.next_commit < n {
            match self.pending[self.next_commit].take() {
                None => return None,
                Some(Commit::Done) => self.next_commit += 1,
                Some(work) => {
                    let index = self.next_commit;
                    let last =
                        self.failure.is_none() && (index + 1..n).all(|i| matches!(self.pending[i], Some(Commit::Done)));
                    let books = self.books.take().expect("checked");
                    return Some(NextCommit {
                        index,
                        work,
                        books,
                        last,
                    });
                }
            }
        }
        None
    }

    /// A commit returned the job's `books` (`None` after it failed: no more commits).
    pub(super) fn books_returned(&mut self, books: Option<Books>) {
        self.books = books;
    }

    /// Node `index`, whose turn it was, committed its outputs, holding `held` for the job's
    /// final move: it is finished, and the next node's turn comes. Returns whether its end
    /// is announced now (`false` when it waits for the held outputs, in the final move).
    pub(super) fn committed(&mut self, index: usize, held: Vec<HeldOutput>) -> bool {
        let announce = held.is_empty();
        if !announce {
            self.final_move = FinalMove {
                outputs: held,
                finished: Some(node_event(&self.plan.nodes[index], NodePhase::Finished)),
            };
        }
        self.finished(index);
        self.next_commit += 1;
        announce
    }

    /// The job fails with `error`, unless it failed already: the calls stop. The commits
    /// of the nodes before the failing one go on.
    pub(super) fn fail(&mut self, error: JobError) {
        self.failure.get_or_insert(error);
        self.stop.cancel();
    }

    /// The job was canceled: the calls stop.
    pub(super) fn cancel(&self) {
        self.stop.cancel();
    }

    /// How the run ended, once nothing is left to wait on: its first failure, or what the
    /// last node held for the final move (the error for a run that stopped short unasked).
    pub(super) fn finish(self) -> Result<FinalMove, JobError> {
        if let Some(error) = self.failure {
            return Err(error);
        }
        let n = self.plan.nodes.len();
        if !self.stop.is_canceled() && self.next_commit < n {
            return Err(super::job_error(
                NodeErrorCode::InternalError.as_str(),
                format!("the job stopped after {} of its {n} nodes", self.next_commit),
            ));
        }
        Ok(self.final_move)
    }

    /// Node `index` is finished: the nodes that were waiting only for it are to be looked
    /// up, lowest plan index first.
    fn finished(&mut self, index: usize) {
        for &next in self.dependents[index].iter().rev() {
            self.waiting[next] -= 1;
            if self.waiting[next] == 0 {
                self.fresh.push(next);
            }
        }
    }

    /// The inputs of node `index`: its literals and copies of the values it links to, or the
    /// error for a link to an output its source did not return.
    fn gather_inputs(&self, index: usize) -> Result<Vec<(String, Value)>, JobError> {
        let plan = self.plan;
        let node = &plan.nodes[index];
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for (name, input) in &node.inputs {
            let value = match input {
                PlanInput::Literal(v) => v.clone(),
                PlanInput::Link { node: source, output } => match self.results[*source].get(*output) {
                    Some(v) => v.clone(),
                    None => {
                        return Err(JobError {
                            code: NodeErrorCode::NodeExecutionError.as_str().into(),
                            message: format!(
                                "input {name:?} links to output {output} of node {}, which returned only {} value(s)",
                                plan.nodes[*source].id,
                                self.results[*source].len()
                            ),
                            node_id: Some(node.id.clone()),
                            class_type: Some(node.class_type.clone()),
                            traceback: None,
                        })
                    }
                },
            };
            inputs.push((name.clone(), value));
        }
        Ok(inputs)
    }

    /// Node `index` no longer needs the values it links to: those it was the last reader of
    /// are dropped.
    fn release_inputs(&mut self, index: usize) {
        for source in self.plan.dependencies(index) {
            self.readers[source] -= 1;
            if self.readers[source] == 0 {
                self.results[source] = Vec::new();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::PlannedNode;
    use crate::jobs::cache::CachedFile;
    use crate::jobs::events::JobEvent;
    use crate::runtime::OutputKind;
    use crate::store::AssetRecord;

    /// A plan of nodes `0..links.len()`, node `i` reading output 0 of each node in
    /// `links[i]` (which must come before it).
    fn plan(links: &[&[usize]]) -> Plan {
        let nodes = links
            .iter()
            .enumerate()
            .map(|(index, sources)| PlannedNode {
                id: format!("n{index}"),
                class_type: "Test".into(),
                inputs: sources
                    .iter()
                    .enumerate()
                    .map(|(k, &node)| (format!("in{k}"), PlanInput::Link { node, output: 0 }))
                    .collect(),
                output_node: false,
                cache_key: None,
            })
            .collect();
        Plan { nodes }
    }

    /// A file stored already, as the cache holds it.
    fn file(name: &str) -> CachedFile {
        CachedFile {
            name: name.into(),
            kind: OutputKind::Image,
            content_type: "image/png".into(),
            blob: "0".repeat(64),
            size: 1,
            inline: None,
            temporary: false,
        }
    }

    /// An inline output of node `node_id`, held for the final move.
    fn held(node_id: &str) -> HeldOutput {
        let asset = AssetRecord {
            id: "a".into(),
            tenant: "t".into(),
            blob: "0".repeat(64),
            size_bytes: 1,
            content_type: "image/png".into(),
            file_path: "out.png".into(),
            job_id: Some("j".into()),
            node_id: Some(node_id.into()),
            kind: Some("image".into()),
            tags: Vec::new(),
            created_at: chrono::Utc::now(),
            expires_at: None,
            output_index: Some(0),
            inline: true,
        };
        (asset, bytes::Bytes::from_static(b"x"))
    }

    fn error(code: &str) -> JobError {
        JobError {
            code: code.into(),
            message: code.into(),
            node_id: None,
            class_type: None,
            traceback: None,
        }
    }

    /// Looks up every fresh node (none is in the cache) and starts every ready one; returns
    /// the nodes started, in order.
    fn start_ready(run: &mut GraphRun) -> Vec<usize> {
        while let Some(index) = run.next_fresh() {
            run.not_cached(index);
        }
        let mut started = Vec::new();
        while let Some(index) = run.next_ready() {
            run.start(index).expect("its inputs are there");
            started.push(index);
        }
        started
    }

    /// The commit whose turn came, committed with nothing held; returns its node.
    fn commit_next(run: &mut GraphRun) -> Option<usize> {
        let next = run.next_commit()?;
        run.books_returned(Some(next.books));
        run.committed(next.index, Vec::new());
        Some(next.index)
    }

    #[test]
    fn nodes_with_no_links_start_first_lowest_plan_index_first() {
        let plan = plan(&[&[], &[0], &[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        assert_eq!(start_ready(&mut run), vec![0, 2, 3]);
    }

    #[test]
    fn a_node_starts_only_once_every_node_it_reads_has_finished() {
        // A diamond: 0 feeds 1 and 2, which both feed 3.
        let plan = plan(&[&[], &[0], &[0], &[1, 2]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        assert_eq!(start_ready(&mut run), vec![0]);
        assert!(run.ran(0, vec![Value::Int(1)], Commit::Done));
        assert_eq!(start_ready(&mut run), vec![1, 2]);
        assert!(run.ran(2, vec![Value::Int(2)], Commit::Done));
        assert_eq!(start_ready(&mut run), Vec::<usize>::new());
        assert!(run.ran(1, vec![Value::Int(3)], Commit::Done));
        assert_eq!(start_ready(&mut run), vec![3]);
    }

    #[test]
    fn a_node_with_files_to_commit_holds_back_its_readers_until_it_commits() {
        let plan = plan(&[&[], &[0]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        assert!(!run.ran(0, vec![Value::Int(1)], Commit::Cached(vec![file("a.png")])));
        assert_eq!(start_ready(&mut run), Vec::<usize>::new());
        assert_eq!(commit_next(&mut run), Some(0));
        assert_eq!(start_ready(&mut run), vec![1]);
    }

    #[test]
    fn a_branch_runs_on_while_another_branch_is_still_running() {
        // Two branches: 0 -> 1 and 2 -> 3.
        let plan = plan(&[&[], &[0], &[], &[2]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        assert_eq!(start_ready(&mut run), vec![0, 2]);
        run.ran(2, vec![Value::Int(2)], Commit::Done);
        assert_eq!(start_ready(&mut run), vec![3]);
        run.ran(3, Vec::new(), Commit::Done);
        // Node 0 still runs: nothing commits past it.
        assert_eq!(commit_next(&mut run), None);
        run.ran(0, vec![Value::Int(0)], Commit::Done);
        assert_eq!(start_ready(&mut run), vec![1]);
        run.ran(1, Vec::new(), Commit::Done);
        // Nothing to commit: the turns pass over every node.
        assert_eq!(commit_next(&mut run), None);
        assert!(run.finish().is_ok());
    }

    #[test]
    fn outputs_commit_in_plan_order_whatever_order_the_calls_end_in() {
        let plan = plan(&[&[], &[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(2, Vec::new(), Commit::Cached(vec![file("c.png")]));
        assert!(run.next_commit().is_none(), "node 0 has not run");
        run.ran(0, Vec::new(), Commit::Cached(vec![file("a.png")]));
        let first = run.next_commit().expect("node 0's turn");
        assert_eq!(first.index, 0);
        run.ran(1, Vec::new(), Commit::Cached(vec![file("b.png")]));
        assert!(
            run.next_commit().is_none(),
            "one commit at a time: node 0 holds the books"
        );
        run.books_returned(Some(first.books));
        run.committed(0, Vec::new());
        assert_eq!(commit_next(&mut run), Some(1));
        assert_eq!(commit_next(&mut run), Some(2));
        assert_eq!(commit_next(&mut run), None);
        assert!(run.finish().is_ok());
    }

    #[test]
    fn a_node_with_nothing_to_commit_is_passed_over_in_the_commit_order() {
        let plan = plan(&[&[], &[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Done);
        run.ran(1, Vec::new(), Commit::Done);
        run.ran(2, Vec::new(), Commit::Cached(vec![file("c.png")]));
        assert_eq!(commit_next(&mut run), Some(2));
    }

    #[test]
    fn only_the_last_node_to_commit_with_every_other_node_done_holds_its_outputs() {
        let plan = plan(&[&[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Cached(vec![file("a.png")]));
        let first = run.next_commit().expect("node 0's turn");
        assert!(!first.last, "node 1 has not run");
        run.books_returned(Some(first.books));
        assert!(run.committed(0, Vec::new()), "nothing held: its end is announced now");
        run.ran(1, Vec::new(), Commit::Cached(vec![file("b.png")]));
        let second = run.next_commit().expect("node 1's turn");
        assert!(second.last);
        run.books_returned(Some(second.books));
        assert!(
            !run.committed(1, vec![held("n1")]),
            "its end waits for its held outputs"
        );
        let final_move = run.finish().expect("the run succeeded");
        assert_eq!(final_move.outputs.len(), 1);
        assert!(matches!(
            final_move.finished,
            Some(JobEvent::Node { ref node_id, phase: NodePhase::Finished, .. }) if node_id == "n1"
        ));
    }

    #[test]
    fn a_nodes_values_are_released_once_its_last_reader_has_started() {
        // 0 feeds 1 and 2.
        let plan = plan(&[&[], &[0], &[0]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, vec![Value::Int(7)], Commit::Done);
        while let Some(index) = run.next_fresh() {
            run.not_cached(index);
        }
        let inputs = run.start(1).expect("node 0 returned a value");
        assert!(matches!(inputs.as_slice(), [(name, Value::Int(7))] if name == "in0"));
        assert_eq!(run.results[0].len(), 1, "node 2 has yet to read it");
        let inputs = run.start(2).expect("node 0's value is still held");
        assert!(matches!(inputs.as_slice(), [(_, Value::Int(7))]));
        assert!(run.results[0].is_empty(), "its last reader started");
    }

    #[test]
    fn values_no_node_reads_are_not_kept() {
        let plan = plan(&[&[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, vec![Value::Int(7)], Commit::Done);
        assert!(run.results[0].is_empty());
    }

    #[test]
    fn a_node_taken_from_the_cache_releases_its_inputs_and_leaves_its_files_to_commit() {
        let plan = plan(&[&[], &[0]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, vec![Value::Int(7)], Commit::Done);
        let index = run.next_fresh().expect("node 1 is fresh");
        let entry = Entry {
            values: vec![Value::Int(8)],
            files: vec![file("b.png")],
        };
        assert!(!run.take_cached(index, entry), "its files are still to commit");
        assert!(run.results[0].is_empty(), "node 1 was node 0's only reader");
        assert!(!run.has_queued());
        assert_eq!(commit_next(&mut run), Some(1));
        assert!(run.finish().is_ok());
    }

    #[test]
    fn a_link_to_an_output_its_source_did_not_return_fails_the_reader() {
        let plan = plan(&[&[], &[0]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Done);
        while let Some(index) = run.next_fresh() {
            run.not_cached(index);
        }
        let e = run.start(1).expect_err("node 0 returned no value");
        assert_eq!(e.code, "node_execution_error");
        assert_eq!(e.node_id.as_deref(), Some("n1"));
        assert_eq!(
            e.message,
            "input \"in0\" links to output 0 of node n0, which returned only 0 value(s)"
        );
    }

    #[test]
    fn a_failure_stops_the_calls_but_the_nodes_before_it_still_commit() {
        let plan = plan(&[&[], &[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Cached(vec![file("a.png")]));
        run.fail(error("node_timeout"));
        assert!(run.is_stopped());
        assert!(!run.is_canceled());
        run.ran(2, Vec::new(), Commit::Cached(vec![file("c.png")]));
        let next = run.next_commit().expect("node 0 commits after the failure");
        assert_eq!(next.index, 0);
        assert!(!next.last, "a failed job makes no final move");
        run.books_returned(Some(next.books));
        run.committed(0, Vec::new());
        assert!(run.next_commit().is_none(), "the commits stop at the failed node");
        assert_eq!(run.finish().err().map(|e| e.code).as_deref(), Some("node_timeout"));
    }

    #[test]
    fn a_failed_commit_ends_the_commits_and_the_job_fails_with_it() {
        let plan = plan(&[&[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Cached(vec![file("a.png")]));
        run.ran(1, Vec::new(), Commit::Cached(vec![file("b.png")]));
        let next = run.next_commit().expect("node 0's turn");
        assert_eq!(next.index, 0);
        // The commit failed: it kept the books.
        run.books_returned(None);
        run.fail(error("job_output_limit"));
        assert!(run.next_commit().is_none(), "no books, no commit");
        assert_eq!(run.finish().err().map(|e| e.code).as_deref(), Some("job_output_limit"));
    }

    #[test]
    fn the_first_failure_is_the_jobs() {
        let plan = plan(&[&[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        run.fail(error("first"));
        run.fail(error("second"));
        assert_eq!(run.finish().err().map(|e| e.code).as_deref(), Some("first"));
    }

    #[test]
    fn a_cancel_during_a_commit_stops_the_commits_and_the_run_ends_without_error() {
        let cancel = CancelToken::new();
        let plan = plan(&[&[], &[]]);
        let mut run = GraphRun::new(&plan, &cancel);
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Cached(vec![file("a.png")]));
        run.ran(1, Vec::new(), Commit::Cached(vec![file("b.png")]));
        let next = run.next_commit().expect("node 0's turn");
        cancel.cancel();
        assert!(run.is_stopped(), "the job's cancel stops the calls");
        // The commit stopped between files: the books come back, the node is not committed.
        run.books_returned(Some(next.books));
        assert!(run.next_commit().is_none(), "a cancel stops the commits");
        let final_move = run.finish().expect("a cancel is no failure of the run");
        assert!(final_move.outputs.is_empty());
    }

    #[test]
    fn a_run_that_ends_short_of_its_nodes_unasked_is_an_internal_error() {
        let plan = plan(&[&[], &[]]);
        let mut run = GraphRun::new(&plan, &CancelToken::new());
        start_ready(&mut run);
        run.ran(0, Vec::new(), Commit::Done);
        assert!(run.next_commit().is_none(), "node 1 never ran");
        let Err(e) = run.finish() else {
            panic!("only 1 of 2 nodes finished");
        };
        assert_eq!(e.code, "internal_error");
        assert_eq!(e.message, "the job stopped after 1 of its 2 nodes");
    }

    #[test]
    fn a_canceled_run_that_ends_short_of_its_nodes_is_no_error() {
        let cancel = CancelToken::new();
        let plan = plan(&[&[], &[]]);
        let mut run = GraphRun::new(&plan, &cancel);
        start_ready(&mut run);
        run.cancel();
        assert!(run.is_stopped());
        assert!(run.finish().is_ok());
    }
}
