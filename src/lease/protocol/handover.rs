//! Whether a release hands its lease over and to which local waiters ([`handover`]), and what
//! a transfer's outcome hands on ([`transfer_answered`]).

use std::fmt::Debug;

use crate::options::LockOptions;

/// Whether a release hands its lock over to local waiters in one command (a transfer) rather than
/// ending its lease and waking them: only when the lease has a queue of local waiters (`waiters`;
/// the queue tells whether anyone waits in it), when the lease was not lost
/// before the release was sent (a lost lease is not ours to hand on), and when the lock has no
/// `min_hold` (such a lock stays taken after its release: nothing to hand over yet).
pub fn hands_over(options: &LockOptions, lost_before: bool, waiters: bool) -> bool {
    waiters && !lost_before && options.min_hold().is_none()
}

/// After this many transfers in a row, a release of the lock is a plain one: the next local
/// waiter attempts as soon as it is over, and the waiters of other processes, woken by the same
/// release through their change stream, race it on equal terms (each is about one round trip
/// from the server) for the next acquisition.
pub const MAX_TRANSFERS_IN_A_ROW: u32 = 8;

/// A local waiter of a lock, as the release of a lease of it sees the line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InLine {
    /// Woken to attempt and not back waiting yet, or receiving a transfer already: passed over.
    pub busy: bool,
    /// Whether the releasing lease can be handed to it in the release's command: `None` if not
    /// (no offer standing, or a lease of another kind: a writer behind a writer), `Some(false)`
    /// to it alone (an exclusive lock's waiter, a semaphore's), `Some(true)` to it and to the
    /// waiters right behind it that can be handed the lease too (the readers behind a writer's
    /// release).
    pub takes_over: Option<bool>,
}

/// What a release does for its lock's local waiters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handover {
    /// Hand the lease over to the waiters at these places of the line, in one command.
    To(Vec<usize>),
    /// A plain release that wakes the waiters.
    Release {
        /// It ended a run of [`MAX_TRANSFERS_IN_A_ROW`] transfers: the other processes get
        /// their turn.
        run_ended: bool,
    },
}

/// Whom the release of a lease (one that [`hands_over`]) hands it to, given its lock's local
/// `line` in order and the count of transfers in a row the lock has had (updated here): the
/// first waiter not busy, if the lease can be handed to it, and for readers behind a writer the
/// ones right behind it as well; nobody if the first waiter not busy cannot take it (it is
/// never overtaken), or once [`MAX_TRANSFERS_IN_A_ROW`] transfers were made in a row.
pub fn handover(line: impl IntoIterator<Item = InLine>, transfers_in_a_row: &mut u32) -> Handover {
    let mut chosen = Vec::new();
    for (place, waiter) in line.into_iter().enumerate() {
        if waiter.busy {
            continue;
        }
        let Some(shares) = waiter.takes_over else {
            break;
        };
        chosen.push(place);
        if !shares {
            break;
        }
    }
    if chosen.is_empty() {
        *transfers_in_a_row = 0;
        return Handover::Release { run_ended: false };
    }
    if *transfers_in_a_row >= MAX_TRANSFERS_IN_A_ROW {
        *transfers_in_a_row = 0;
        return Handover::Release { run_ended: true };
    }
    *transfers_in_a_row += 1;
    Handover::To(chosen)
}

/// Whether the end of a lease keeps its lock's `min_hold` window: only when the lease was
/// `delivered` to a caller (someone may have run under it). A lease nobody was given (won after
/// its caller left, or the cleanup after an attempt whose outcome is unknown) ends at once,
/// window and all.
pub fn keeps_window(delivered: bool) -> bool {
    delivered
}

/// How a transfer's command turned out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferReply {
    /// It matched the releasing lease and wrote the waiters' leases.
    Applied,
    /// It matched nothing (the releasing lease was gone), or was never sent (a shutdown took the
    /// release's undo first): it wrote nothing.
    NotApplied,
    /// Its outcome is unknown (an error after which it may have been applied, or no reply
    /// within `expiry`).
    Unknown,
}

/// What to do once a transfer's outcome is in ([`transfer_answered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransferStep {
    /// Hand the waiters the leases the transfer wrote (otherwise they are told it did not
    /// happen, and go on waiting).
    pub hand_over: bool,
    /// Send the waiters' undos at once (their leases may exist).
    pub undo_waiters: bool,
    /// Leave the transfer tracked until its settle deadline, then send its undo (the releasing
    /// lease's and the waiters'): a try still on its way may land until then.
    pub undo_when_settled: bool,
}

/// What a transfer's outcome `reply` means. `settled` is false when a shutdown took the
/// transfer's undo before its outcome came ([`Work::settle`](super::Work::settle); asked only of an applied
/// transfer): that shutdown is ending the leases it wrote, so nobody is handed them.
pub fn transfer_answered(reply: TransferReply, settled: bool) -> TransferStep {
    match reply {
        TransferReply::Applied => TransferStep {
            hand_over: settled,
            undo_waiters: false,
            undo_when_settled: false,
        },
        TransferReply::NotApplied => TransferStep {
            hand_over: false,
            undo_waiters: false,
            undo_when_settled: false,
        },
        TransferReply::Unknown => TransferStep {
            hand_over: false,
            undo_waiters: true,
            undo_when_settled: true,
        },
    }
}
