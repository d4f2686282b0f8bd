//! Wake-ups between processes and the locks that show who is alive and who leads.
//!
//! - The listener keeps one connection with `LISTEN`. On it the process also holds its
//!   liveness lock, a session advisory lock the database drops the moment the connection
//!   closes (a kill -9 included), and, on one process at a time, the leader lock.
//! - The notifier sends `NOTIFY` outside every job's transaction (a `NOTIFY` inside one
//!   serialises commits on a global lock), coalesced: what arrives within a cooldown goes
//!   out together, work wake-ups once, event notices as arrays.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::{AsyncMessage, NoTls};

use super::claims::LIVENESS_LOCKS;
use crate::store::coordinator::{EventNotice, Signal};

/// The channel that wakes idle workers (a job was queued or released).
pub(super) const WORK: &str = "weft_work";
const CANCEL: &str = "weft_cancel";
const EVENT: &str = "weft_event";

/// The advisory-lock key held by the leader ("weftlead").
const LEADER_LOCK: i64 = 0x7765_6674_6c65_6164;

/// How often the listener tries to take the locks it lacks.
const LOCK_RETRY: Duration = Duration::from_millis(500);

/// The shortest time between two rounds of notifications from one process.
const NOTIFY_COOLDOWN: Duration = Duration::from_millis(1);

/// The most bytes of notices in one notification (PostgreSQL allows 8000).
const PAYLOAD_BYTES: usize = 7000;

/// Which wake-ups a process listens for, besides cancels: each notification is delivered to
/// every process listening on its channel (a transaction in each), so a process leaves out
/// those it has no use for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hears {
    /// Work wake-ups: the process runs jobs.
    pub work: bool,
    /// Event notices: the process serves event streams.
    pub events: bool,
}

impl Hears {
    /// Every wake-up.
    pub const ALL: Hears = Hears {
        work: true,
        events: true,
    };

    /// The `LISTEN` statements for these channels.
    fn statements(self) -> String {
        let mut listen = format!("LISTEN {CANCEL};");
        if self.work {
            listen.push_str(&format!(" LISTEN {WORK};"));
        }
        if self.events {
            listen.push_str(&format!(" LISTEN {EVENT};"));
        }
        listen
    }
}

/// What this process knows of its own standing among the processes.
#[derive(Default)]
pub(super) struct Standing {
    /// It holds its liveness lock: the others see its claims as alive.
    pub(super) alive: AtomicBool,
    /// It holds the leader lock.
    pub(super) leader: AtomicBool,
}

/// Keeps a `LISTEN` connection open (on the channels of `hears`), turning notifications into [`Signal`]s and holding
/// the liveness lock of process `process` (and the leader lock when it can get it); after
/// each (re)connection it sends [`Signal::Resync`], since notifications may have been
/// missed. `standing` follows what the connection holds.
pub(super) async fn listen(
    config: tokio_postgres::Config,
    process: String,
    hears: Hears,
    signals: broadcast::Sender<Signal>,
    standing: Arc<Standing>,
) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                serve_connection(&client, messages, &process, hears, &signals, &standing).await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the wake-up connection"),
        }
        standing.alive.store(false, Ordering::SeqCst);
        standing.leader.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Listens on `client` until its connection fails, taking the locks it lacks every
/// [`LOCK_RETRY`].
async fn serve_connection(
    client: &tokio_postgres::Client,
    messages: impl futures::Stream<Item = Result<AsyncMessage, tokio_postgres::Error>>,
    process: &str,
    hears: Hears,
    signals: &broadcast::Sender<Signal>,
    standing: &Standing,
) {
    tokio::pin!(messages);
    let listen = hears.statements();
    let mut subscribe = client.batch_execute(&listen).boxed();
    let mut subscribed = false;
    let mut retry = tokio::time::interval(LOCK_RETRY);
    // A busy process tries again a period after its last try, never in a burst of the
    // ticks it missed.
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut locking: Option<futures::future::BoxFuture<'_, Result<(bool, bool), tokio_postgres::Error>>> = None;
    loop {
        tokio::select! {
            done = &mut subscribe, if !subscribed => {
                if let Err(e) = done {
                    tracing::warn!(error = %e, "cannot LISTEN for wake-ups");
                    return;
                }
                subscribed = true;
                let _ = signals.send(Signal::Resync);
            }
            _ = retry.tick(), if subscribed && locking.is_none() => {
                let (alive, leader) = (standing.alive.load(Ordering::SeqCst), standing.leader.load(Ordering::SeqCst));
                if !(alive && leader) {
                    locking = Some(take_locks(client, process, alive, leader).boxed());
                }
            }
            taken = async { locking.as_mut().expect("guarded").await }, if locking.is_some() => {
                locking = None;
                match taken {
                    Ok((alive, leader)) => {
                        if alive && !standing.alive.swap(true, Ordering::SeqCst) {
                            // Claims wait for this: idle workers should try now.
                            let _ = signals.send(Signal::Resync);
                        }
                        standing.alive.store(alive, Ordering::SeqCst);
                        // Only a process the others see as alive leads.
                        standing.leader.store(alive && leader, Ordering::SeqCst);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot take the liveness and leader locks");
                        return;
                    }
                }
            }
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(n))) => deliver(signals, n.channel(), n.payload()),
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the wake-up connection failed");
                    return;
                }
                None => return,
            }
        }
    }
}

/// Tries to take the liveness lock (unless `alive`) and the leader lock (unless `leader`);
/// returns which of them the connection holds now.
async fn take_locks(
    client: &tokio_postgres::Client,
    process: &str,
    alive: bool,
    leader: bool,
) -> Result<(bool, bool), tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT CASE WHEN $1 THEN true ELSE pg_try_advisory_lock($2, hashtext($3)) END,
                    CASE WHEN $4 THEN true ELSE pg_try_advisory_lock($5) END",
            &[&alive, &LIVENESS_LOCKS, &process, &leader, &LEADER_LOCK],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Turns a notification on `channel` into signals.
fn deliver(signals: &broadcast::Sender<Signal>, channel: &str, payload: &str) {
    match channel {
        WORK => {
            let _ = signals.send(Signal::Work);
        }
        CANCEL => {
            let _ = signals.send(Signal::Cancel(payload.to_string()));
        }
        EVENT => match serde_json::from_str::<Vec<EventNotice>>(payload) {
            Ok(notices) => {
                for notice in notices {
                    let _ = signals.send(Signal::Event(notice));
                }
            }
            Err(_) => {
                let _ = signals.send(Signal::Resync);
            }
        },
        _ => {}
    }
}

/// What the notifier sends.
pub(super) enum Wake {
    /// Idle workers should claim.
    Work,
    /// A job should stop.
    Cancel(String),
    /// Jobs have new events.
    Events(Vec<EventNotice>),
}

/// Sends the notifications of one process, coalesced (see the module's docs). Its own
/// connection commits without waiting for the disk: a notification writes nothing durable.
pub(super) async fn notify(config: tokio_postgres::Config, mut wakes: mpsc::UnboundedReceiver<Wake>) {
    let mut pending = Vec::new();
    loop {
        let (client, connection) = match config.connect(NoTls).await {
            Ok(connected) => connected,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the notification connection");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        tokio::spawn(connection);
        if let Err(e) = client.batch_execute("SET synchronous_commit = off").await {
            tracing::warn!(error = %e, "cannot set up the notification connection");
            continue;
        }
        loop {
            if wakes.recv_many(&mut pending, 1024).await == 0 {
                return;
            }
            while let Ok(wake) = wakes.try_recv() {
                pending.push(wake);
            }
            let notifications = coalesce(std::mem::take(&mut pending));
            let sent = futures::future::try_join_all(
                notifications
                    .iter()
                    .map(|(channel, payload)| notify_one(&client, channel, payload)),
            )
            .await;
            if let Err(e) = sent {
                // Lost wake-ups delay, never lose: listeners also poll.
                tracing::warn!(error = %e, "cannot send notifications");
                break;
            }
            tokio::time::sleep(NOTIFY_COOLDOWN).await;
        }
    }
}

/// Sends one notification on `channel`.
async fn notify_one(
    client: &tokio_postgres::Client,
    channel: &str,
    payload: &str,
) -> Result<u64, tokio_postgres::Error> {
    client.execute("SELECT pg_notify($1, $2)", &[&channel, &payload]).await
}

/// The notifications that carry `wakes`: one work wake-up at most, each cancel, and the
/// event notices in as few arrays as fit a payload.
fn coalesce(wakes: Vec<Wake>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut work = false;
    let mut notices: Vec<String> = Vec::new();
    for wake in wakes {
        match wake {
            Wake::Work => work = true,
            Wake::Cancel(id) => out.push((CANCEL, id)),
            Wake::Events(list) => notices.extend(
                list.iter()
                    .map(|n| serde_json::to_string(n).expect("a notice serializes")),
            ),
        }
    }
    if work {
        out.push((WORK, String::new()));
    }
    let mut payload = String::new();
    for notice in notices {
        if !payload.is_empty() && payload.len() + notice.len() + 2 > PAYLOAD_BYTES {
            out.push((EVENT, format!("[{payload}]")));
            payload.clear();
        }
        if !payload.is_empty() {
            payload.push(',');
        }
        payload.push_str(&notice);
    }
    if !payload.is_empty() {
        out.push((EVENT, format!("[{payload}]")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(i: usize) -> EventNotice {
        EventNotice {
            job: format!("{i:036}"),
            n: i as u64,
            tenant: "default".into(),
        }
    }

    #[test]
    fn wake_ups_are_coalesced_into_one_work_notification_and_arrays_of_notices_that_fit() {
        let mut wakes = vec![Wake::Work, Wake::Cancel("j".into()), Wake::Work];
        wakes.extend((0..300).map(|i| Wake::Events(vec![notice(i)])));
        let sent = coalesce(wakes);
        assert_eq!(sent.iter().filter(|(c, _)| *c == WORK).count(), 1);
        assert_eq!(sent.iter().filter(|(c, _)| *c == CANCEL).count(), 1);
        let mut received = Vec::new();
        for (channel, payload) in sent.iter().filter(|(c, _)| *c == EVENT) {
            assert!(payload.len() <= PAYLOAD_BYTES, "{channel}: {} bytes", payload.len());
            received.extend(serde_json::from_str::<Vec<EventNotice>>(payload).unwrap());
        }
        assert_eq!(received, (0..300).map(notice).collect::<Vec<_>>());
    }
}
