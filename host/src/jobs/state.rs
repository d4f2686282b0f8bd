//! The job state machine: one table of allowed moves. Every status change in weft goes
//! through [`check`]; nothing else decides whether a move is legal.

use crate::store::JobStatus::{self, *};

/// What moves a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A worker starts it.
    Start,
    /// Its nodes all finished.
    Succeed,
    /// A node failed, or it cannot be resumed after a crash.
    Fail,
    /// A caller asked to cancel.
    CancelRequest,
    /// The running node stopped after a cancel request.
    CancelComplete,
    /// Retention ran out.
    Expire,
    /// Crash recovery puts a job that was running back in the queue.
    Requeue,
}

/// The allowed moves: (from, trigger, to).
pub const TRANSITIONS: &[(JobStatus, Trigger, JobStatus)] = &[
    (Queued, Trigger::Start, Running),
    (Queued, Trigger::CancelRequest, Canceled),
    (Queued, Trigger::Expire, Expired),
    (Running, Trigger::Succeed, Succeeded),
    (Running, Trigger::Fail, Failed),
    (Running, Trigger::CancelRequest, Canceling),
    (Running, Trigger::Expire, Expired),
    (Running, Trigger::Requeue, Queued),
    (Canceling, Trigger::CancelComplete, Canceled),
    (Canceling, Trigger::Expire, Expired),
    (Canceling, Trigger::Requeue, Canceled),
];

/// The status `trigger` moves a job in `from` to, if the move is allowed.
pub fn check(from: JobStatus, trigger: Trigger) -> Option<JobStatus> {
    TRANSITIONS
        .iter()
        .find(|(f, t, _)| *f == from && *t == trigger)
        .map(|(_, _, to)| *to)
}

/// The moves (from, to) that `trigger` allows.
pub fn moves(trigger: Trigger) -> Vec<(JobStatus, JobStatus)> {
    TRANSITIONS
        .iter()
        .filter(|(_, t, _)| *t == trigger)
        .map(|(f, _, to)| (*f, *to))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_have_no_moves() {
        for (from, _, _) in TRANSITIONS {
            assert!(!from.is_terminal(), "{from:?} is terminal but has a move");
        }
    }

    #[test]
    fn the_interface_lifecycle_is_allowed() {
        assert_eq!(check(Queued, Trigger::Start), Some(Running));
        assert_eq!(check(Running, Trigger::Succeed), Some(Succeeded));
        assert_eq!(check(Running, Trigger::CancelRequest), Some(Canceling));
        assert_eq!(check(Canceling, Trigger::CancelComplete), Some(Canceled));
        assert_eq!(check(Succeeded, Trigger::CancelRequest), None);
        assert_eq!(check(Canceling, Trigger::Succeed), None);
    }
}
