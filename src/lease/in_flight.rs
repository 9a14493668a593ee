//! Work of a family of locks that may leave a lease on the server until it is over: acquisition
//! attempts, releases, transfers, cleanups, a waiting writer's marker. Each piece of work is
//! tracked with what undoes it, so that [`Family::shut_down`](super::family::Family) can
//! finish the job: it waits for work whose outcome is still coming (attempts and transfers, at
//! most until the server gives up on them) and sends the undo of everything still under way
//! itself, on its own runtime, whatever runtime the work was started on (that one may not be
//! driven any more, or may be gone).
//!
//! Two rules keep a shutdown from leaving two holders:
//! - **A shutdown never undoes work whose outcome it has not waited for**: work that writes
//!   something other than its undo (an attempt, a transfer) carries a settle deadline, the
//!   instant by which the server has applied or given up on its last command; before then the
//!   shutdown waits for it.
//! - **Nobody is handed a lease whose undo was taken**: work that hands a lease to a caller first
//!   [`settles`](Tracked::settle) itself, which tells whether a shutdown took its undo (then
//!   the lease is being ended, and the caller is told there was none).
//!
//! Both are decided by the protocol core ([`protocol::Work`]), which the model checker drives
//! too; this module keeps its pieces behind a lock, names them, and runs the undos.

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::watch;

use super::protocol::{self, Settling};
use super::undo::Undo;
use crate::clock;
use crate::error::shown_name;
use crate::sync::Mutex;

/// What a shutdown must do about the work under way at one instant.
pub(crate) type Due = protocol::Due<clock::Instant, Undo>;

/// The work under way of one family of locks.
#[derive(Debug)]
pub(crate) struct InFlight {
    work: Mutex<Work>,
    /// Bumped whenever work starts, finishes or is abandoned.
    changes: watch::Sender<u64>,
}

impl Default for InFlight {
    fn default() -> InFlight {
        InFlight {
            work: Mutex::default(),
            changes: watch::Sender::new(0),
        }
    }
}

/// The pieces of work, decided on by the protocol core ([`protocol::Work`]), and the next id.
#[derive(Debug, Default)]
struct Work {
    next_id: u64,
    pieces: protocol::Work<clock::Instant, Undo>,
}

/// How many abandoned pieces of work a family keeps for its shutdown. Past that, the oldest is
/// forgotten: its lease (if any) ends at its expiry, as it would without a shutdown.
const MAX_ABANDONED: usize = 1024;

impl InFlight {
    fn changed(&self) {
        self.changes
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    /// Starts tracking a piece of work; it stays tracked until [`Tracked::finish`] (a
    /// [`Tracked`] dropped without finishing, its task cancelled by a runtime shutdown, leaves
    /// its undo due). `settle_by`: for an acquisition attempt or a transfer, when the server has
    /// applied or given up on its last command (sent with that time limit); until then the work
    /// may still change the lock document and hand the lease on by itself (an undo sent before
    /// it was applied would miss it). `None`: its undo is due at once (its work writes what its
    /// undo writes).
    pub(crate) fn track(
        self: &Arc<Self>,
        undo: Vec<Undo>,
        settle_by: Option<clock::Instant>,
    ) -> Tracked {
        let id = {
            let mut work = self.work.lock();
            let id = work.next_id;
            work.next_id += 1;
            work.pieces.track(id, undo, settle_by);
            id
        };
        self.changed();
        Tracked {
            in_flight: Arc::clone(self),
            id,
            finished: false,
        }
    }

    /// Sends `undo` in the background on `runtime`, as tracked work (a shutdown sends it again
    /// if it has not finished).
    pub(crate) fn spawn_undo(self: &Arc<Self>, runtime: &Handle, undo: Undo) {
        let tracked = self.track(vec![undo.clone()], None);
        runtime.spawn(async move {
            undo.send().await;
            tracked.finish();
        });
    }

    /// Notified of every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether no work is under way.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        self.work.lock().pieces.is_idle()
    }

    /// Takes the undo of every piece whose task ended unfinished (its runtime was dropped),
    /// forgetting those pieces: for a family that goes on without a shutdown to send them.
    pub(crate) fn take_abandoned(&self) -> Vec<Undo> {
        self.work.lock().pieces.take_abandoned()
    }

    /// Takes the undo of every piece that is due at `now` (forgetting those pieces) and tells
    /// when the next one will be.
    pub(crate) fn take_due(&self, now: clock::Instant) -> Due {
        self.work.lock().pieces.take_due(now)
    }
}

/// A piece of work being tracked.
#[derive(Debug)]
pub(crate) struct Tracked {
    in_flight: Arc<InFlight>,
    id: u64,
    finished: bool,
}

impl Tracked {
    /// Adds to what undoes this work (a release that became a transfer: the waiter's lease
    /// too). False if a shutdown already took the work's undo (it would not send this one).
    #[must_use]
    pub(crate) fn add_undo(&self, undo: Undo) -> bool {
        self.in_flight.work.lock().pieces.add_undo(self.id, undo)
    }

    /// The work may change the lock document until `settle_by` (it is about to send a command
    /// with that server time limit): a shutdown waits until then before undoing it. False if a
    /// shutdown already took the work's undo: the caller must not send the command. (A command
    /// held up on the client, in a pool checkout or a server selection, longer than the time
    /// left can still land later, as a command delayed in the network can.)
    #[must_use]
    pub(crate) fn settle_by(&self, settle_by: clock::Instant) -> bool {
        let settled = self
            .in_flight
            .work
            .lock()
            .pieces
            .settle_by(self.id, settle_by);
        self.in_flight.changed();
        settled
    }

    /// The work's outcome is known: from now on nobody sends its undo. True if nobody took it
    /// before (what the work did stands, and may be handed to its caller); false if a shutdown
    /// took it (it is being undone: hand nothing on). Finishing afterwards changes nothing.
    #[must_use]
    pub(crate) fn settle(&self) -> bool {
        let settled = self.in_flight.work.lock().pieces.settle(self.id);
        self.in_flight.changed();
        settled
    }

    /// The work's outcome stays unknown: once it has settled (its settle deadline, when a command
    /// still on its way has been applied or given up), its undo is sent on `runtime`, unless a
    /// shutdown took it first. Until then it stays tracked, so a shutdown waits for it and then
    /// undoes it itself.
    pub(crate) fn undo_when_settled(self, runtime: &Handle) {
        runtime.spawn(async move {
            let undo = loop {
                let settling = self
                    .in_flight
                    .work
                    .lock()
                    .pieces
                    .settling(self.id, clock::now());
                match settling {
                    Settling::WaitUntil(at) => {
                        tokio::time::sleep_until(clock::wake_toward(at)).await;
                    }
                    Settling::Undo(undo) => break undo,
                    Settling::Taken => break Vec::new(),
                }
            };
            futures::future::join_all(undo.iter().map(Undo::send)).await;
            self.finish();
        });
    }

    /// The work is over: nothing of it is left to undo.
    pub(crate) fn finish(mut self) {
        self.finished = true;
        self.in_flight.work.lock().pieces.finish(self.id);
        self.in_flight.changed();
    }
}

impl Drop for Tracked {
    /// Dropped unfinished (its task was cancelled, its runtime shut down): whatever it may have
    /// left is due to be undone at once.
    fn drop(&mut self) {
        if !self.finished {
            let forgotten = self
                .in_flight
                .work
                .lock()
                .pieces
                .abandon(self.id, MAX_ABANDONED);
            if let Some(undo) = forgotten {
                let name = undo.first().map(|undo| shown_name(&undo.name));
                tracing::debug!(lock = ?name, "forgot abandoned work: its lease, if any, ends at its expiry");
            }
            self.in_flight.changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn attempts_are_due_at_their_limit_other_work_at_once_and_finished_work_never() {
        let in_flight = Arc::new(InFlight::default());
        let now = clock::now();
        let limit = now + Duration::from_secs(5);
        let attempt = in_flight.track(Vec::new(), Some(limit));
        let release = in_flight.track(Vec::new(), None);
        let finished = in_flight.track(Vec::new(), None);
        finished.finish();
        let due = in_flight.take_due(now);
        assert_eq!(due.next, Some(limit), "the attempt waits for its limit");
        assert!(!in_flight.is_idle());
        // The release was taken (its undo sent by the caller); the attempt is due at its limit.
        drop(release);
        let due = in_flight.take_due(limit);
        assert_eq!(due.next, None);
        assert!(in_flight.is_idle());
        attempt.finish(); // a late finish of forgotten work changes nothing
        assert!(in_flight.is_idle());
    }

    #[tokio::test]
    async fn an_undo_added_after_a_shutdown_took_the_work_is_refused() {
        let undo = Undo::unanswered(Duration::from_secs(1)).await;
        let in_flight = Arc::new(InFlight::default());
        let release = in_flight.track(vec![undo.clone()], None);
        assert!(release.add_undo(undo.clone()), "still tracked: accepted");
        let due = in_flight.take_due(clock::now());
        assert_eq!(due.undo.len(), 2, "both undos are taken together");
        assert!(
            !release.add_undo(undo),
            "taken by a shutdown: the caller must not start what this undo would end"
        );
        release.finish();
        assert!(in_flight.is_idle());
    }

    #[tokio::test]
    async fn work_whose_undo_was_taken_hands_nothing_on_and_sends_nothing_more() {
        let undo = Undo::unanswered(Duration::from_secs(1)).await;
        let in_flight = Arc::new(InFlight::default());
        let now = clock::now();
        let transfer = in_flight.track(vec![undo.clone()], None);
        assert!(transfer.settle_by(now + Duration::from_secs(5)), "sent");
        let due = in_flight.take_due(now);
        assert!(due.undo.is_empty(), "a shutdown waits for the outcome");
        assert_eq!(due.next, Some(now + Duration::from_secs(5)));
        let due = in_flight.take_due(now + Duration::from_secs(5));
        assert_eq!(due.undo.len(), 1, "then undoes it");
        assert!(
            !transfer.settle_by(now + Duration::from_secs(6)),
            "taken: no command goes out after the undo"
        );
        assert!(!transfer.settle(), "taken: nothing is handed on");
        transfer.finish();

        let settled = in_flight.track(vec![undo], None);
        assert!(settled.settle(), "nobody took it: what it did stands");
        assert!(
            in_flight.take_due(now).undo.is_empty(),
            "and nobody undoes it"
        );
        settled.finish();
        assert!(in_flight.is_idle());
    }

    #[tokio::test]
    async fn work_of_unknown_outcome_is_undone_once_it_has_settled() {
        let undo = Undo::unanswered(Duration::from_millis(50)).await;
        let in_flight = Arc::new(InFlight::default());
        let transfer = in_flight.track(vec![undo], None);
        let settle_by = clock::now() + Duration::from_millis(400);
        assert!(transfer.settle_by(settle_by));
        transfer.undo_when_settled(&Handle::current());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let due = in_flight.take_due(clock::now());
        assert!(
            due.undo.is_empty() && due.next == Some(settle_by),
            "a try may still land: nothing is undone yet, and a shutdown waits"
        );
        let mut changes = in_flight.subscribe();
        tokio::time::timeout(Duration::from_secs(10), async {
            while !in_flight.is_idle() {
                let _ = changes.changed().await;
            }
        })
        .await
        .expect("undone and finished once settled");
    }

    #[test]
    fn abandoned_work_is_kept_up_to_a_bound() {
        let in_flight = Arc::new(InFlight::default());
        let live = in_flight.track(Vec::new(), None);
        for _ in 0..MAX_ABANDONED + 10 {
            drop(in_flight.track(Vec::new(), None));
        }
        assert_eq!(
            in_flight.work.lock().pieces.counts(),
            (MAX_ABANDONED + 1, MAX_ABANDONED)
        );
        assert!(
            in_flight.work.lock().pieces.tracks(live.id),
            "live work is never forgotten for abandoned work"
        );
        in_flight.take_due(clock::now());
        assert_eq!(in_flight.work.lock().pieces.counts().1, 0);
        drop(live);
    }

    #[test]
    fn work_dropped_unfinished_is_due_at_once() {
        let in_flight = Arc::new(InFlight::default());
        let now = clock::now();
        let attempt = in_flight.track(Vec::new(), Some(now + Duration::from_secs(60)));
        assert_eq!(
            in_flight.take_due(now).next,
            Some(now + Duration::from_secs(60))
        );
        drop(attempt);
        let due = in_flight.take_due(now);
        assert_eq!(due.next, None);
        assert!(in_flight.is_idle());
    }
}
