//! An acquisition attempt from send to outcome ([`Attempt`]), and the order of a document
//! lock attempt's commands ([`DocumentAttempt`]).

use std::fmt::Debug;
use std::time::Duration;

use super::{Moment, Sent};
use crate::options::LockOptions;

/// An acquisition attempt always gets at least this long to answer (unless `expiry` is shorter),
/// even when the caller's deadline is nearer: a free lock must not be reported busy just because
/// the round trip outlasted a tiny timeout, and a primary that is busy for a few seconds must not
/// turn every `try_acquire` into an error. (Five seconds, not the driver's 30 s server selection:
/// a caller with a short timeout still hears of an unreachable server soon.)
pub(crate) const MIN_ATTEMPT_WAIT: Duration = Duration::from_secs(5);

/// Until when an attempt sent at `sent` is waited for: never longer than `expiry` after it (a
/// reply that late could not hold the lock for long anyway); with the caller's `deadline`, no
/// longer than the deadline or [`MIN_ATTEMPT_WAIT`] after the send, whichever is later.
pub(crate) fn attempt_reply_limit<I: Moment>(
    options: &LockOptions,
    sent: I,
    deadline: Option<I>,
) -> I {
    let longest = sent + options.expiry();
    match deadline {
        Some(deadline) => longest.min(deadline.max(sent + MIN_ATTEMPT_WAIT)),
        None => longest,
    }
}

/// Whether an attempt that got `reply` is settled: anything but a win is; a win is unless a
/// shutdown took the attempt's undo meanwhile, which `settle` (the family's `Work::settle` of
/// the attempt) tells, and is asked only then.
pub fn settled(reply: Reply, settle: impl FnOnce() -> bool) -> bool {
    reply != Reply::Won || settle()
}

/// How an attempt's command turned out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// It won the lease.
    Won,
    /// The lock is busy: nothing was written that the attempt holds.
    Busy,
    /// It failed with an error after which its write may have been applied (a lost reply, a
    /// cut connection, a write-concern error): its outcome is unknown.
    Unknown,
    /// It failed with an error that applied nothing (a duplicate key, a refused command).
    Refused,
}

/// What its caller is told of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tell {
    /// Nothing (yet, or any more: the caller was told already or left).
    Nothing,
    /// The lease it won: the caller holds the lock.
    Lease,
    /// Not acquired: the lock is busy, or what the attempt won is being ended by a shutdown.
    Busy,
    /// The attempt's error.
    Error,
    /// No reply came within the attempt's reply limit.
    NoReply,
}

/// What to do after an event of an [`Attempt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Step {
    /// Send the attempt's undo (the cleanup that ends whatever lease its lock id may hold).
    pub undo: bool,
    /// Release the lease it won: nobody will be handed it.
    pub release: bool,
    /// What the caller is told.
    pub tell: Tell,
}

impl Step {
    pub(super) const NOTHING: Step = Step {
        undo: false,
        release: false,
        tell: Tell::Nothing,
    };
}

/// One acquisition attempt from its send to its outcome: whether its caller still waits for it,
/// whether its undo went out, whether the caller was told.
///
/// The attempt always runs to its reply (or is given up at its reply limit): a caller that stops
/// waiting, a reply limit that passes, or an outcome that is unknown sends the undo at once
/// (once), and a win that nobody waits for any more is released, never handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attempt<I> {
    sent: Sent<I>,
    limit: I,
    caller_waits: bool,
    undo_sent: bool,
    told: bool,
}

impl<I: Moment> Attempt<I> {
    /// An attempt sent `now` by a caller who waits until `deadline` (`None`: no deadline).
    pub fn sent(options: &LockOptions, now: I, deadline: Option<I>) -> Attempt<I> {
        Attempt {
            sent: Sent(now),
            limit: attempt_reply_limit(options, now, deadline),
            caller_waits: true,
            undo_sent: false,
            told: false,
        }
    }

    /// The stamp of its request.
    pub fn request(&self) -> Sent<I> {
        self.sent
    }

    /// Until when its reply is waited for.
    pub fn reply_limit(&self) -> I {
        self.limit
    }

    /// Whether its caller still waits for it.
    pub fn caller_waits(&self) -> bool {
        self.caller_waits && !self.told
    }

    /// Its caller stopped waiting (a timeout of its own, a cancellation, a shutdown): the undo
    /// goes out at once.
    pub fn caller_left(&mut self) -> Step {
        self.caller_waits = false;
        Step {
            undo: self.undo(),
            ..Step::NOTHING
        }
    }

    /// No reply came by `now`: when the reply limit has passed, the undo goes out and the caller
    /// hears there was no reply; a late win is released.
    pub fn waited(&mut self, now: I) -> Step {
        if now < self.limit || self.told {
            return Step::NOTHING;
        }
        let tell = self.tell(Tell::NoReply);
        Step {
            undo: self.undo(),
            release: false,
            tell,
        }
    }

    /// The reply came: what it means for the caller. `settled` is false when a shutdown took
    /// the attempt's undo meanwhile (it is ending what the attempt won: nobody is handed it).
    pub fn answered(&mut self, reply: Reply, settled: bool) -> Step {
        match reply {
            Reply::Won if self.caller_waits() && settled => Step {
                tell: self.tell(Tell::Lease),
                ..Step::NOTHING
            },
            Reply::Won => Step {
                release: true,
                undo: false,
                tell: self.tell(Tell::Busy),
            },
            Reply::Busy => Step {
                tell: self.tell(Tell::Busy),
                ..Step::NOTHING
            },
            Reply::Unknown => Step {
                undo: self.undo(),
                release: false,
                tell: self.tell(Tell::Error),
            },
            Reply::Refused => Step {
                tell: self.tell(Tell::Error),
                ..Step::NOTHING
            },
        }
    }

    /// Whether the undo goes out now (the first time only).
    fn undo(&mut self) -> bool {
        !std::mem::replace(&mut self.undo_sent, true)
    }

    /// `tell`, if the caller still waits and was not told yet.
    fn tell(&mut self, tell: Tell) -> Tell {
        if self.caller_waits() {
            self.told = true;
            tell
        } else {
            Tell::Nothing
        }
    }
}

/// The commands of one attempt to lock an application document (a document lock's attempt): a
/// lock command first; when it matches no unlocked document, an insert of the caller's document
/// if the caller gave one (`lock_or_insert`), then a lock command again, or else a read of
/// whether a matching document exists at all. A win's lease counts from the send of the lock
/// command that won it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocumentAttempt {
    inserts: bool,
    inserted: bool,
}

/// The next command of a [`DocumentAttempt`], or its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DocumentStep {
    /// Lock an unlocked matching document.
    Lock,
    /// Insert the caller's document, unlocked.
    Insert,
    /// Read (on the primary) whether a matching document exists: the lock is busy if one does,
    /// and the caller is told that none does otherwise.
    CheckExists,
    /// The lock is busy: a matching document exists, locked by someone else (or the caller's
    /// insert found one with its `_id`, or another caller locked the inserted one first).
    Busy,
}

impl DocumentAttempt {
    /// An attempt, inserting the caller's document if none matches when `inserts`; its first
    /// command is [`DocumentStep::Lock`].
    pub fn new(inserts: bool) -> DocumentAttempt {
        DocumentAttempt {
            inserts,
            inserted: false,
        }
    }

    /// A lock command matched no unlocked document: what comes next.
    pub fn no_match(&self) -> DocumentStep {
        match (self.inserts, self.inserted) {
            (_, true) => DocumentStep::Busy,
            (true, false) => DocumentStep::Insert,
            (false, false) => DocumentStep::CheckExists,
        }
    }

    /// The insert was answered: it inserted the document, or a document with its `_id` was there
    /// (`duplicate`: refused with a duplicate `_id`). Any other failure ends the attempt with that
    /// error.
    pub fn inserted(&mut self, duplicate: bool) -> DocumentStep {
        if duplicate {
            return DocumentStep::Busy;
        }
        self.inserted = true;
        DocumentStep::Lock
    }
}
