//! The lease protocol's decisions, without I/O.
//!
//! What a holder may rely on and until when, when a renewal round goes out, when an unanswered
//! renewal is given up, and what becomes of an acquisition attempt's outcome are decided here, by
//! small state machines that are told the current instant and what happened, and answer with what
//! to do. They never read a clock, sleep, spawn or send (the shape of `quinn-proto` and `rustls`:
//! state and events in, decisions out).
//!
//! The engine runs them on its clocks: [`Lease`] inside every guard's lost signal
//! (`lost::LeaseState`), [`Renewals`], [`give_up_at`] and [`suspect_at`] in the renewal loop
//! (`renewal`), [`renewed_every_lease`] in every renewal of several leases in one command
//! (`renewal_commands`), [`Transaction`] in every lease-checked transaction (`held`), [`Attempt`] in
//! every acquisition attempt (`acquire`), [`DocumentAttempt`] in every attempt to lock a
//! document (`document_lock`), [`hands_over`], [`handover`] and [`transfer_answered`]
//! in every release (`release`, `handoff`), [`keeps_window`] in how a lease ends (`record`), [`Work`] in what a
//! shutdown waits for and undoes (`in_flight`, `family`). The model checker (`model/`, through the
//! hidden `crate::__model`) runs the very same code on its ticks: a decision exists once, so a
//! mistake planted in it changes what the checker explores.
//!
//! The rules, and why they are safe, are in DESIGN.md ("How it works"):
//! - a lease is relied on until the *send* instant of the last request that confirmed it, plus
//!   [`LockOptions::lease_lifetime`] (`expiry − safety margin − max_clock_skew`): the server may
//!   have applied the request at any instant after it was sent, and its `$$NOW` may run ahead of
//!   the client's clock by `max_clock_skew`;
//! - once that deadline has passed, nothing extends the lease (a confirmation that comes late
//!   may have been applied after the lease ended and another caller took the name);
//! - a caller that stops waiting for an attempt, or whose attempt's outcome is unknown, undoes
//!   it; a win nobody waits for any more is released, never handed out;
//! - a shutdown never undoes work whose outcome it has not waited for (an attempt or a transfer
//!   is waited for until its settle deadline), and nobody is handed a lease whose undo a
//!   shutdown took.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;
use std::ops::Add;
use std::time::Duration;

use crate::options::LockOptions;

/// An instant on a clock that never steps back: the engine's suspend-aware clock and Tokio's
/// clock, or the model checker's ticks.
pub trait Moment: Copy + Ord + Debug + Add<Duration, Output = Self> {
    /// How long after `earlier` this is (zero if it is not after).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for boot_time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for tokio::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// A request that can confirm a lease (an acquisition attempt, a transfer, a renewal), stamped
/// with the instant it was sent. Made only by [`Sent::now`] just before sending, and by
/// [`Renewals::round_sent`], so that a deadline can only count from a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sent<I>(I);

impl<I: Moment> Sent<I> {
    /// A request about to be sent `now`.
    pub fn now(now: I) -> Sent<I> {
        Sent(now)
    }

    /// When it was sent.
    pub fn at(self) -> I {
        self.0
    }
}

/// Where a lease stands for its holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase<I> {
    /// Held.
    Held {
        /// Presumed lost then, unless a confirmation extends it first; `None` for a lease
        /// without a deadline, held until it is marked lost or released.
        lost_at: Option<I>,
    },
    /// Lost.
    Lost {
        /// Whether [`Lease::mark_lost`] reported it (a deadline passing is noticed by whoever
        /// asks first, and reported by the renewal loop).
        announced: bool,
    },
    /// Released by its holder without having been lost.
    Released,
}

/// A lease as its holder sees it: until when it may rely on it.
///
/// Loss is sticky: once the deadline has been seen to pass, or the lease was marked lost, no
/// confirmation revives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease<I> {
    phase: Phase<I>,
    /// The end of the hold allowed by [`LockOptions::max_hold`]: no confirmation extends the
    /// deadline past it.
    hold_until: Option<I>,
    /// The request that confirmed the lease last (`None` for a lease without a deadline).
    confirmed: Option<Sent<I>>,
}

impl<I: Moment> Lease<I> {
    /// The lease won by `request`, whose reply arrived `now`: relied on until the request's send
    /// plus the lease's lifetime, never past `max_hold` after the send. A reply that came after
    /// that deadline yields a lease lost from the start.
    pub fn won(options: &LockOptions, request: Sent<I>, now: I) -> Lease<I> {
        let hold_until = options.max_hold().map(|max_hold| request.0 + max_hold);
        let mut lease = Lease {
            phase: Phase::Held {
                lost_at: Some(capped(request.0 + options.lease_lifetime(), hold_until)),
            },
            hold_until,
            confirmed: Some(request),
        };
        lease.settle(now);
        lease
    }

    /// A lease with no deadline of its own, lost only when marked so (the in-memory locks).
    pub fn unbounded() -> Lease<I> {
        Lease {
            phase: Phase::Held { lost_at: None },
            hold_until: None,
            confirmed: None,
        }
    }

    /// A lease held until `lost_at`, never past `hold_until` (for tests of what runs it).
    #[cfg(test)]
    pub(crate) fn until(lost_at: I, hold_until: Option<I>) -> Lease<I> {
        Lease {
            phase: Phase::Held {
                lost_at: Some(capped(lost_at, hold_until)),
            },
            hold_until,
            confirmed: None,
        }
    }

    /// Where the lease stands `now`: `Held` turns into `Lost` once its deadline has passed.
    pub fn settle(&mut self, now: I) -> Phase<I> {
        if let Phase::Held {
            lost_at: Some(lost_at),
        } = self.phase
            && now >= lost_at
        {
            self.phase = Phase::Lost { announced: false };
        }
        self.phase
    }

    /// Whether the lease is lost `now`.
    pub fn is_lost(&mut self, now: I) -> bool {
        matches!(self.settle(now), Phase::Lost { .. })
    }

    /// The deadline while held `now` (`None` once lost or released, or without one).
    pub fn lost_at(&mut self, now: I) -> Option<I> {
        match self.settle(now) {
            Phase::Held { lost_at } => lost_at,
            Phase::Lost { .. } | Phase::Released => None,
        }
    }

    /// When its loss is due to be reported: its deadline while held, `now` once the deadline has
    /// passed unreported (`None` once the loss was reported, or the lease released, or without
    /// a deadline). What the renewal loop wakes up for: a loss whose deadline passed while it
    /// was busy with something else is still reported.
    pub fn report_loss_at(&mut self, now: I) -> Option<I> {
        match self.settle(now) {
            Phase::Held { lost_at } => lost_at,
            Phase::Lost { announced: false } => Some(now),
            Phase::Lost { announced: true } | Phase::Released => None,
        }
    }

    /// The server confirmed the lease in reply to `request`, and the reply arrived `now`: the
    /// deadline moves to the request's send plus the lease's lifetime (never back, never past
    /// the end of the hold), but only if it has not passed: a lease whose deadline passed is lost
    /// for good, however its confirmation turned out. Returns whether the lease is still held.
    pub fn confirmed(&mut self, options: &LockOptions, request: Sent<I>, now: I) -> bool {
        match self.settle(now) {
            Phase::Held { lost_at: None } => true,
            Phase::Held {
                lost_at: Some(current),
            } => {
                let extended = capped(request.0 + options.lease_lifetime(), self.hold_until);
                self.phase = Phase::Held {
                    lost_at: Some(current.max(extended)),
                };
                self.confirmed = self.confirmed.max(Some(request));
                true
            }
            Phase::Lost { .. } | Phase::Released => false,
        }
    }

    /// Marks the lease lost (unless released); returns whether this is the first report of the
    /// loss (also when its deadline had already passed unreported).
    pub fn mark_lost(&mut self) -> bool {
        let first = matches!(
            self.phase,
            Phase::Held { .. } | Phase::Lost { announced: false }
        );
        if first {
            self.phase = Phase::Lost { announced: true };
        }
        first
    }

    /// Marks the lease released `now`, unless it is lost by then; returns whether it was.
    pub fn mark_released(&mut self, now: I) -> bool {
        let held = matches!(self.settle(now), Phase::Held { .. });
        if held {
            self.phase = Phase::Released;
        }
        held
    }

    /// Whether the hold allowed by `max_hold` is over `now`.
    pub fn hold_ended(&self, now: I) -> bool {
        self.hold_until.is_some_and(|hold_until| now >= hold_until)
    }

    /// When the lease wants its next renewal: a cadence after the request that confirmed it last
    /// was sent (not after its reply: a slow reply has eaten into the lease). `None` for a lease
    /// without a deadline.
    pub fn renew_by(&self, options: &LockOptions) -> Option<I> {
        self.confirmed
            .map(|request| request.0 + options.extension_cadence())
    }
}

/// The renewal inside a lease-checked transaction (`HeldLease::transaction`): the transaction's
/// first write renews the lease, filtered on it being ours and live, but the write counts only
/// once the transaction commits (until then nobody else can write the lease's document, and
/// nobody sees the renewal). Once committed, the lease is confirmed from the renewal's *send*,
/// like any renewal: the server evaluated its `$$NOW` at some instant after the send, not at the
/// commit, which may come much later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transaction<I> {
    renewal: Sent<I>,
}

impl<I: Moment> Transaction<I> {
    /// The transaction's renewal is sent `now`.
    pub fn renewal_sent(now: I) -> Transaction<I> {
        Transaction { renewal: Sent(now) }
    }

    /// The transaction committed, and the reply came `now`: see [`Lease::confirmed`], from the
    /// renewal's send. Returns whether the lease is still held.
    pub fn committed(self, lease: &mut Lease<I>, options: &LockOptions, now: I) -> bool {
        lease.confirmed(options, self.renewal, now)
    }
}

/// `deadline`, no later than `hold_until`.
fn capped<I: Moment>(deadline: I, hold_until: Option<I>) -> I {
    hold_until.map_or(deadline, |hold_until| deadline.min(hold_until))
}

/// Whether the reply to a renewal of `leases` leases in one command, which matched `matched`
/// documents, shows every one of them renewed. Each document matches at most once and holds at
/// least one of the leases, so only as many matches as leases means one lease per document, each
/// renewed; otherwise (several leases in one document, a semaphore's places or a
/// reader-writer lock's readers held by one process, or some lease gone) a read must tell which
/// are still live.
pub fn renewed_every_lease(matched: Option<i64>, leases: usize) -> bool {
    matched.is_some_and(|matched| usize::try_from(matched).is_ok_and(|n| n == leases))
}

/// How long to wait before retrying a failed renewal or release: a quarter of the cadence,
/// between 10 ms and a second.
pub fn retry_delay(options: &LockOptions) -> Duration {
    (options.extension_cadence() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// When the leases of a renewal loop are renewed next.
///
/// A round goes out every cadence; while a round is unanswered the next one waits, but only
/// until the unanswered commands are three quarters of the way to giving up ([`suspect_at`]): a
/// command hung on a half-open connection then stays in flight while the next round reaches the
/// server on other connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Renewals<I> {
    next: I,
}

impl<I: Moment> Renewals<I> {
    /// A schedule with a round due `now`.
    pub fn new(now: I) -> Renewals<I> {
        Renewals { next: now }
    }

    /// When the next round is planned, ignoring what is in flight.
    pub fn planned(&self) -> I {
        self.next
    }

    /// A lease that wants its first renewal at `renew_by` joined: no later than the round
    /// planned for the others when some are live (`others_live`), else at `renew_by`.
    pub fn lease_added(&mut self, renew_by: I, others_live: bool) {
        self.next = if others_live {
            self.next.min(renew_by)
        } else {
            renew_by
        };
    }

    /// When the next round goes out, given when each renewal in flight stops being waited for
    /// by the next round ([`suspect_at`]).
    pub fn due_at(&self, suspects: impl IntoIterator<Item = I>) -> I {
        suspects
            .into_iter()
            .max()
            .map_or(self.next, |suspect| suspect.max(self.next))
    }

    /// A round is sent `now`: the next one a cadence later. Returns the stamp of its requests.
    pub fn round_sent(&mut self, options: &LockOptions, now: I) -> Sent<I> {
        self.next = now + options.extension_cadence();
        Sent(now)
    }

    /// A renewal failed `now`: the next round no later than [`retry_delay`] from now.
    pub fn retry_soon(&mut self, options: &LockOptions, now: I) {
        self.next = self.next.min(now + retry_delay(options));
    }

    /// The next round goes out at once (its leases must be renewed in other commands).
    pub fn renew_now(&mut self, now: I) {
        self.next = now;
    }
}

/// When an unanswered renewal `request` stops being waited for: at the earliest deadline of the
/// leases it serves (`earliest_lost_at`, `None` once none is held), and at the latest when even a
/// reply could no longer extend them (its send plus the lease's lifetime).
pub fn give_up_at<I: Moment>(
    options: &LockOptions,
    request: Sent<I>,
    earliest_lost_at: Option<I>,
) -> I {
    let latest = request.0 + options.lease_lifetime();
    earliest_lost_at.map_or(request.0, |deadline| deadline.min(latest))
}

/// Three quarters of the way from sending `request` to giving it up at `give_up_at`: if it is
/// still unanswered then, the next round need not wait for it.
pub fn suspect_at<I: Moment>(request: Sent<I>, give_up_at: I) -> I {
    request.0 + give_up_at.since(request.0) * 3 / 4
}

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
    const NOTHING: Step = Step {
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
/// transfer's undo before its outcome came ([`Work::settle`]; asked only of an applied
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

/// The work under way of one family of locks that may leave a lease on the server (attempts,
/// releases, transfers, cleanups), each piece with what undoes it (`U`): what a shutdown waits
/// for and undoes. Pieces are named by their tracker's ids.
///
/// The rules that keep a shutdown from leaving two holders are decided here:
/// - a piece with a settle deadline (an attempt or a transfer: the instant by which the server
///   has applied or given up on its last command) is due to be undone only once that deadline
///   has passed ([`Work::take_due`]); every other piece at once;
/// - a piece whose undo was taken is gone: its work must not send another command
///   ([`Work::settle_by`] says false), nor start what its undo would miss ([`Work::add_undo`]),
///   nor hand on what it won ([`Work::settle`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Work<I, U> {
    pieces: BTreeMap<u64, Piece<I, U>>,
    /// Pieces whose task ended unfinished, oldest first.
    abandoned: VecDeque<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Piece<I, U> {
    undo: Vec<U>,
    /// `None`: due at once.
    settle_by: Option<I>,
}

/// What is due to be undone at one instant ([`Work::take_due`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Due<I, U> {
    /// Undo these now (their pieces are forgotten).
    pub undo: Vec<U>,
    /// The earliest settle deadline of the work still under way, if any.
    pub next: Option<I>,
}

/// Where a piece of unknown outcome stands ([`Work::settling`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Settling<I, U> {
    /// A command may still land until then.
    WaitUntil(I),
    /// Send this undo, then finish the piece (it stays tracked, due at once, until then).
    Undo(Vec<U>),
    /// A shutdown took the piece: it sends the undo.
    Taken,
}

impl<I, U> Default for Work<I, U> {
    fn default() -> Work<I, U> {
        Work {
            pieces: BTreeMap::new(),
            abandoned: VecDeque::new(),
        }
    }
}

impl<I: Moment, U: Clone> Work<I, U> {
    /// Starts tracking piece `id`, undone by `undo`, with a settle deadline if it may still
    /// change the lock document until then.
    pub fn track(&mut self, id: u64, undo: Vec<U>, settle_by: Option<I>) {
        self.pieces.insert(id, Piece { undo, settle_by });
    }

    /// Adds to what undoes `id` (a release that becomes a transfer: the waiters' leases too).
    /// False if a shutdown took its undo already (it would not send this one).
    pub fn add_undo(&mut self, id: u64, undo: U) -> bool {
        match self.pieces.get_mut(&id) {
            Some(piece) => {
                piece.undo.push(undo);
                true
            }
            None => false,
        }
    }

    /// `id` is about to send a command the server applies or gives up on by `at`: a shutdown
    /// waits until then before undoing it. False if a shutdown took its undo already: the
    /// command must not be sent.
    pub fn settle_by(&mut self, id: u64, at: I) -> bool {
        match self.pieces.get_mut(&id) {
            Some(piece) => {
                piece.settle_by = Some(at);
                true
            }
            None => false,
        }
    }

    /// The outcome of `id` is known: nobody sends its undo from now on. True if nobody took it
    /// before (what the work did stands, and may be handed to its caller); false if a shutdown
    /// took it (it is being undone: hand nothing on).
    pub fn settle(&mut self, id: u64) -> bool {
        self.pieces.remove(&id).is_some()
    }

    /// `id` is over: nothing of it is left to undo.
    pub fn finish(&mut self, id: u64) {
        self.pieces.remove(&id);
    }

    /// The task of `id` ended unfinished (its runtime was dropped): its undo is due at once, and
    /// kept for a shutdown, or a family that goes on, to send ([`Work::take_abandoned`]). At most
    /// `keep` abandoned pieces are kept: past that the oldest is forgotten, and its undo
    /// returned (its lease, if any, ends at its expiry).
    pub fn abandon(&mut self, id: u64, keep: usize) -> Option<Vec<U>> {
        if let Some(piece) = self.pieces.get_mut(&id) {
            piece.settle_by = None;
            self.abandoned.push_back(id);
        }
        if self.abandoned.len() > keep {
            let oldest = self.abandoned.pop_front()?;
            return self.pieces.remove(&oldest).map(|piece| piece.undo);
        }
        None
    }

    /// Takes the undo of every abandoned piece, forgetting them.
    pub fn take_abandoned(&mut self) -> Vec<U> {
        let abandoned = std::mem::take(&mut self.abandoned);
        abandoned
            .into_iter()
            .filter_map(|id| self.pieces.remove(&id))
            .flat_map(|piece| piece.undo)
            .collect()
    }

    /// Takes the undo of every piece due `now` (forgetting those pieces), and tells when the
    /// next will be: what a shutdown does, again and again, until nothing is left.
    pub fn take_due(&mut self, now: I) -> Due<I, U> {
        let due: Vec<u64> = self
            .pieces
            .iter()
            .filter(|(_, piece)| piece.settle_by.is_none_or(|settle_by| settle_by <= now))
            .map(|(id, _)| *id)
            .collect();
        self.abandoned.clear();
        let undo = due
            .into_iter()
            .filter_map(|id| self.pieces.remove(&id))
            .flat_map(|piece| piece.undo)
            .collect();
        let next = self
            .pieces
            .values()
            .filter_map(|piece| piece.settle_by)
            .min();
        Due { undo, next }
    }

    /// For `id`, whose outcome stays unknown, `now`: wait until its settle deadline, or send its
    /// undo (it stays tracked, due at once, until finished: a shutdown meanwhile sends it too,
    /// which is harmless, and never finds the piece gone before its undo went out).
    pub fn settling(&mut self, id: u64, now: I) -> Settling<I, U> {
        match self.pieces.get_mut(&id) {
            None => Settling::Taken,
            Some(Piece {
                settle_by: Some(at),
                ..
            }) if now < *at => Settling::WaitUntil(*at),
            Some(piece) => {
                piece.settle_by = None;
                Settling::Undo(piece.undo.clone())
            }
        }
    }

    /// Whether no work is under way.
    pub fn is_idle(&self) -> bool {
        self.pieces.is_empty()
    }

    /// How many pieces are tracked, and how many of them are abandoned.
    pub fn counts(&self) -> (usize, usize) {
        (self.pieces.len(), self.abandoned.len())
    }

    /// Whether `id` is tracked.
    pub fn tracks(&self, id: u64) -> bool {
        self.pieces.contains_key(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_of_several_leases_renews_them_all_only_with_a_match_per_lease() {
        assert!(renewed_every_lease(Some(3), 3));
        // Two leases in one document (one process's places of a semaphore): one match.
        assert!(!renewed_every_lease(Some(1), 2));
        assert!(!renewed_every_lease(Some(0), 1));
        assert!(!renewed_every_lease(Some(-1), 1));
        assert!(
            !renewed_every_lease(None, 1),
            "no count: read which are live"
        );
    }

    /// Milliseconds on a test clock.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    struct Ms(u64);

    impl Add<Duration> for Ms {
        type Output = Ms;
        fn add(self, duration: Duration) -> Ms {
            Ms(self.0 + u64::try_from(duration.as_millis()).unwrap())
        }
    }

    impl Moment for Ms {
        fn since(self, earlier: Ms) -> Duration {
            Duration::from_millis(self.0.saturating_sub(earlier.0))
        }
    }

    /// A lease of 1 s renewed every 200 ms, with a 10 ms margin and 190 ms of skew: relied on
    /// for 800 ms after a send.
    fn options() -> LockOptions {
        LockOptions::builder()
            .expiry(Duration::from_secs(1))
            .extension_cadence(Duration::from_millis(200))
            .max_clock_skew(Duration::from_millis(190))
            .build()
            .unwrap()
    }

    #[test]
    fn a_deadline_counts_from_the_send_not_the_reply() {
        let options = options();
        assert_eq!(options.lease_lifetime(), Duration::from_millis(800));
        let mut lease = Lease::won(&options, Sent::now(Ms(1_000)), Ms(1_250));
        assert!(!lease.is_lost(Ms(1_799)));
        assert_eq!(lease.lost_at(Ms(1_250)), Some(Ms(1_800)));
        assert_eq!(lease.renew_by(&options), Some(Ms(1_200)));
        // A renewal sent at 1 200 and answered at 1 290 relies on the lease until 2 000.
        assert!(lease.confirmed(&options, Sent::now(Ms(1_200)), Ms(1_290)));
        assert_eq!(lease.lost_at(Ms(1_290)), Some(Ms(2_000)));
        assert_eq!(lease.renew_by(&options), Some(Ms(1_400)));
        // An older request answered later never moves the deadline back.
        assert!(lease.confirmed(&options, Sent::now(Ms(1_100)), Ms(1_300)));
        assert_eq!(lease.lost_at(Ms(1_300)), Some(Ms(2_000)));
        assert_eq!(lease.renew_by(&options), Some(Ms(1_400)));
    }

    #[test]
    fn a_reply_after_the_deadline_neither_wins_nor_extends() {
        let options = options();
        let mut late = Lease::won(&options, Sent::now(Ms(0)), Ms(800));
        assert!(
            late.is_lost(Ms(800)),
            "a win answered at its deadline is lost"
        );
        let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
        assert!(!lease.confirmed(&options, Sent::now(Ms(750)), Ms(800)));
        assert!(lease.is_lost(Ms(800)));
        assert!(!lease.confirmed(&options, Sent::now(Ms(790)), Ms(810)));
        assert!(lease.mark_lost(), "the first report of the loss");
        assert!(!lease.mark_lost());
    }

    #[test]
    fn a_loss_is_due_to_be_reported_until_it_is_reported() {
        let options = options();
        let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
        assert_eq!(lease.report_loss_at(Ms(10)), Some(Ms(800)), "its deadline");
        // Past the deadline (the loop looked away), the loss is due at once, and stays due
        // until reported: its deadline alone (`lost_at`) is gone by then.
        assert_eq!(lease.lost_at(Ms(900)), None);
        assert_eq!(lease.report_loss_at(Ms(900)), Some(Ms(900)));
        assert_eq!(lease.report_loss_at(Ms(950)), Some(Ms(950)));
        assert!(lease.mark_lost());
        assert_eq!(lease.report_loss_at(Ms(1_000)), None, "reported");
        let mut released = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
        released.mark_released(Ms(20));
        assert_eq!(released.report_loss_at(Ms(900)), None);
        assert_eq!(Lease::<Ms>::unbounded().report_loss_at(Ms(900)), None);
    }

    #[test]
    fn max_hold_caps_every_deadline_and_unbounded_leases_have_none() {
        let options = LockOptions::builder()
            .expiry(Duration::from_secs(1))
            .extension_cadence(Duration::from_millis(200))
            .max_clock_skew(Duration::from_millis(190))
            .max_hold(Duration::from_millis(1_200))
            .build()
            .unwrap();
        let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
        assert_eq!(lease.lost_at(Ms(10)), Some(Ms(800)));
        assert!(lease.confirmed(&options, Sent::now(Ms(600)), Ms(610)));
        assert_eq!(
            lease.lost_at(Ms(610)),
            Some(Ms(1_200)),
            "not 1 400: the hold ends"
        );
        assert!(!lease.hold_ended(Ms(1_199)));
        assert!(lease.hold_ended(Ms(1_200)));
        assert!(lease.is_lost(Ms(1_200)));
        let mut unbounded = Lease::<Ms>::unbounded();
        assert!(unbounded.confirmed(&options, Sent::now(Ms(0)), Ms(u64::MAX / 2)));
        assert_eq!(unbounded.lost_at(Ms(u64::MAX / 2)), None);
        assert_eq!(unbounded.renew_by(&options), None);
        assert!(unbounded.mark_released(Ms(u64::MAX / 2)));
        assert!(!unbounded.mark_lost(), "a released lease is never lost");
    }

    #[test]
    fn rounds_go_a_cadence_apart_and_wait_for_a_suspect_round_only_so_long() {
        let options = options();
        let mut renewals = Renewals::new(Ms(0));
        renewals.lease_added(Ms(200), false);
        assert_eq!(renewals.due_at([]), Ms(200));
        let round = renewals.round_sent(&options, Ms(200));
        assert_eq!(renewals.planned(), Ms(400));
        // Unanswered, the round is given up at its leases' deadline at the latest, and
        // the next round waits for it until three quarters of the way there.
        let give_up = give_up_at(&options, round, Some(Ms(1_300)));
        assert_eq!(give_up, Ms(1_000));
        assert_eq!(give_up_at(&options, round, Some(Ms(350))), Ms(350));
        assert_eq!(give_up_at(&options, round, None), Ms(200));
        assert_eq!(suspect_at(round, give_up), Ms(800));
        assert_eq!(renewals.due_at([suspect_at(round, give_up)]), Ms(800));
        assert_eq!(
            renewals.due_at([Ms(300)]),
            Ms(400),
            "never before the planned round"
        );
        renewals.retry_soon(&options, Ms(300));
        assert_eq!(renewals.planned(), Ms(350));
        renewals.lease_added(Ms(600), true);
        assert_eq!(
            renewals.planned(),
            Ms(350),
            "no later than planned for the others"
        );
        renewals.renew_now(Ms(310));
        assert_eq!(renewals.planned(), Ms(310));
    }

    #[test]
    fn an_attempt_whose_caller_left_is_undone_once_and_its_win_released() {
        let options = options();
        let mut attempt = Attempt::sent(&options, Ms(0), None);
        assert_eq!(attempt.reply_limit(), Ms(1_000));
        let left = attempt.caller_left();
        assert!(left.undo && !left.release && left.tell == Tell::Nothing);
        let won = attempt.answered(Reply::Won, true);
        assert!(!won.undo && won.release && won.tell == Tell::Nothing);
        assert!(!attempt.caller_left().undo, "one undo");
    }

    #[test]
    fn an_unanswered_or_unknown_attempt_is_undone_and_a_late_win_released() {
        let options = options();
        let mut attempt = Attempt::sent(&options, Ms(0), Some(Ms(10)));
        assert_eq!(
            attempt.reply_limit(),
            Ms(1_000),
            "at least 5 s, at most the expiry"
        );
        assert_eq!(attempt.waited(Ms(999)), Step::NOTHING);
        let given_up = attempt.waited(Ms(1_000));
        assert!(given_up.undo && given_up.tell == Tell::NoReply);
        let late = attempt.answered(Reply::Won, true);
        assert!(late.release && !late.undo && late.tell == Tell::Nothing);

        let mut unknown = Attempt::sent(&options, Ms(0), None);
        let step = unknown.answered(Reply::Unknown, true);
        assert!(step.undo && step.tell == Tell::Error);
        let mut refused = Attempt::sent(&options, Ms(0), None);
        let step = refused.answered(Reply::Refused, true);
        assert!(!step.undo && step.tell == Tell::Error);
    }

    #[test]
    fn a_win_is_handed_out_only_to_a_waiting_caller_whose_attempt_a_shutdown_left_alone() {
        let options = options();
        let mut attempt = Attempt::sent(&options, Ms(0), None);
        assert_eq!(attempt.answered(Reply::Won, true).tell, Tell::Lease);
        let mut taken = Attempt::sent(&options, Ms(0), None);
        let step = taken.answered(Reply::Won, false);
        assert!(
            step.release && step.tell == Tell::Busy,
            "released, and not acquired"
        );
        let mut busy = Attempt::sent(&options, Ms(0), None);
        assert_eq!(busy.answered(Reply::Busy, true).tell, Tell::Busy);
        assert_eq!(busy.waited(Ms(10_000)), Step::NOTHING, "told already");
    }

    #[test]
    fn a_release_hands_over_only_a_live_lease_without_min_hold_to_waiters() {
        let plain = options();
        assert!(hands_over(&plain, false, true));
        assert!(!hands_over(&plain, false, false), "nobody waits");
        assert!(!hands_over(&plain, true, true), "lost before its release");
        let min_hold = LockOptions::builder()
            .min_hold(Duration::from_millis(500))
            .build()
            .unwrap();
        assert!(!hands_over(&min_hold, false, true), "stays taken");
    }

    #[test]
    fn a_document_attempt_inserts_once_and_then_locks_or_finds_the_lock_busy() {
        let plain = DocumentAttempt::new(false);
        assert_eq!(plain.no_match(), DocumentStep::CheckExists);
        let mut inserting = DocumentAttempt::new(true);
        assert_eq!(inserting.no_match(), DocumentStep::Insert);
        let mut duplicate = inserting;
        assert_eq!(duplicate.inserted(true), DocumentStep::Busy);
        assert_eq!(inserting.inserted(false), DocumentStep::Lock);
        assert_eq!(inserting.no_match(), DocumentStep::Busy, "inserts once");
    }

    #[test]
    fn a_release_hands_over_to_the_first_free_waiter_that_takes_it_and_the_sharers_behind() {
        let waiter = |busy, takes_over| InLine { busy, takes_over };
        let mut in_a_row = 0;
        let line = [waiter(true, Some(false)), waiter(false, Some(false))];
        assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![1]));
        assert_eq!(in_a_row, 1);
        // The first free waiter cannot take it (a writer behind a writer's release): nobody
        // behind it overtakes it, and the run of transfers ends.
        let line = [waiter(false, None), waiter(false, Some(false))];
        let plain = Handover::Release { run_ended: false };
        assert_eq!(handover(line, &mut in_a_row), plain);
        assert_eq!(in_a_row, 0);
        // Readers behind a writer's release, up to the first that cannot take it.
        let line = [
            waiter(false, Some(true)),
            waiter(true, None),
            waiter(false, Some(true)),
            waiter(false, None),
            waiter(false, Some(true)),
        ];
        assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![0, 2]));
        assert_eq!(handover([], &mut in_a_row), plain, "nobody waits");
        // A run of transfers ends at its bound, then starts again.
        let line = [waiter(false, Some(false))];
        for _ in 0..MAX_TRANSFERS_IN_A_ROW {
            assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![0]));
        }
        let ended = Handover::Release { run_ended: true };
        assert_eq!(handover(line, &mut in_a_row), ended);
        assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![0]));
    }

    #[test]
    fn only_a_lease_someone_was_given_keeps_its_window() {
        assert!(keeps_window(true));
        assert!(!keeps_window(false), "nobody ran under it");
    }

    #[test]
    fn a_transfer_hands_over_only_what_it_applied_and_no_shutdown_took() {
        let handed = transfer_answered(TransferReply::Applied, true);
        assert!(handed.hand_over && !handed.undo_waiters && !handed.undo_when_settled);
        let taken = transfer_answered(TransferReply::Applied, false);
        assert!(
            !taken.hand_over && !taken.undo_waiters && !taken.undo_when_settled,
            "the shutdown that took it ends the leases"
        );
        let missed = transfer_answered(TransferReply::NotApplied, true);
        assert!(!missed.hand_over && !missed.undo_waiters && !missed.undo_when_settled);
        let unknown = transfer_answered(TransferReply::Unknown, true);
        assert!(!unknown.hand_over && unknown.undo_waiters && unknown.undo_when_settled);
    }

    #[test]
    fn a_shutdown_waits_for_work_until_its_settle_deadline_and_then_undoes_it() {
        let mut work = Work::<Ms, &str>::default();
        work.track(1, vec!["attempt"], Some(Ms(500)));
        work.track(2, vec!["release"], None);
        work.track(3, vec!["finished"], None);
        work.finish(3);
        let due = work.take_due(Ms(0));
        assert_eq!(due.undo, vec!["release"]);
        assert_eq!(
            due.next,
            Some(Ms(500)),
            "the attempt waits for its deadline"
        );
        let due = work.take_due(Ms(499));
        assert!(due.undo.is_empty());
        let due = work.take_due(Ms(500));
        assert_eq!((due.undo, due.next), (vec!["attempt"], None));
        assert!(work.is_idle());
        work.finish(1); // a late finish of forgotten work changes nothing
        assert!(work.is_idle());
    }

    #[test]
    fn work_whose_undo_was_taken_sends_nothing_more_and_hands_nothing_on() {
        let mut work = Work::<Ms, &str>::default();
        work.track(1, vec!["releasing"], None);
        assert!(work.add_undo(1, "waiter"), "still tracked: accepted");
        assert!(work.settle_by(1, Ms(500)), "sent");
        assert!(work.take_due(Ms(499)).undo.is_empty());
        assert_eq!(work.take_due(Ms(500)).undo, vec!["releasing", "waiter"]);
        assert!(!work.settle_by(1, Ms(600)), "taken: no command goes out");
        assert!(!work.add_undo(1, "later"), "taken: nothing more is started");
        assert!(!work.settle(1), "taken: nothing is handed on");

        work.track(2, vec!["attempt"], Some(Ms(500)));
        assert!(work.settle(2), "nobody took it: what it did stands");
        assert!(!work.tracks(2), "settled: no longer tracked");
        assert!(
            work.take_due(Ms(1_000)).undo.is_empty(),
            "and nobody undoes it"
        );
    }

    #[test]
    fn work_of_unknown_outcome_is_undone_once_settled_unless_a_shutdown_took_it() {
        let mut work = Work::<Ms, &str>::default();
        work.track(1, vec!["transfer"], Some(Ms(500)));
        assert_eq!(work.settling(1, Ms(100)), Settling::WaitUntil(Ms(500)));
        assert_eq!(work.settling(1, Ms(500)), Settling::Undo(vec!["transfer"]));
        assert!(work.tracks(1), "tracked until its undo went out");
        assert_eq!(
            work.take_due(Ms(0)).undo,
            vec!["transfer"],
            "due at once for a shutdown meanwhile"
        );
        assert_eq!(work.settling(1, Ms(600)), Settling::Taken);
    }

    #[test]
    fn abandoned_work_is_due_at_once_and_kept_up_to_a_bound() {
        let mut work = Work::<Ms, u64>::default();
        work.track(0, vec![0], Some(Ms(60_000)));
        for id in 1..=4 {
            work.track(id, vec![id], Some(Ms(60_000)));
            let forgotten = work.abandon(id, 3);
            assert_eq!(
                forgotten,
                (id == 4).then(|| vec![1]),
                "the oldest past three"
            );
        }
        assert_eq!(work.counts(), (4, 3));
        assert!(
            work.tracks(0),
            "live work is never forgotten for abandoned work"
        );
        assert_eq!(work.take_abandoned(), vec![2, 3, 4]);
        assert_eq!(work.counts(), (1, 0));
        work.track(5, vec![5], Some(Ms(60_000)));
        work.abandon(5, 3);
        let due = work.take_due(Ms(0));
        assert_eq!((due.undo, due.next), (vec![5], Some(Ms(60_000))));
        assert_eq!(work.counts(), (1, 0));
    }

    #[test]
    fn the_engines_clocks_measure_time_since_an_earlier_instant_and_never_below_zero() {
        let now = boot_time::Instant::now();
        let later = now + Duration::from_millis(250);
        assert_eq!(later.since(now), Duration::from_millis(250));
        assert_eq!(now.since(later), Duration::ZERO);
        let now = tokio::time::Instant::now();
        let later = now + Duration::from_millis(250);
        assert_eq!(later.since(now), Duration::from_millis(250));
        assert_eq!(now.since(later), Duration::ZERO);
        // What the renewal loop makes of them: a round unanswered three quarters of the way.
        assert_eq!(
            suspect_at(Sent::now(now), later),
            now + Duration::from_micros(187_500)
        );
    }

    #[test]
    fn the_reply_limit_is_at_least_five_seconds_and_at_most_the_expiry() {
        let options = LockOptions::builder()
            .expiry(Duration::from_secs(30))
            .build()
            .unwrap();
        let ms = |ms: u64| Ms(ms);
        assert_eq!(attempt_reply_limit(&options, ms(0), None), ms(30_000));
        assert_eq!(attempt_reply_limit(&options, ms(0), Some(ms(0))), ms(5_000));
        assert_eq!(
            attempt_reply_limit(&options, ms(0), Some(ms(7_000))),
            ms(7_000)
        );
        assert_eq!(
            attempt_reply_limit(&options, ms(0), Some(ms(60_000))),
            ms(30_000)
        );
    }
}
