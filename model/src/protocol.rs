//! The lease protocol of the exclusive lock, and of the other kinds ([`Kind`]), as a
//! [`stateright`] model.
//!
//! Three callers contend for one lock name: two tasks of one process (one family of locks, or two
//! in [`Config::two_families_and_a_shutdown`]; either way a release can hand the lock to the other
//! in one command) reach the server through router R0, a
//! task of another process through router R1, whose clock is ahead of R0's by the whole
//! `max_clock_skew`. Time advances in ticks of [`TICK_MS`]; every client reads the real time
//! (its local clock runs at the real rate), every router its own clock. Every holder writes to a
//! protected resource with a fenced write ([`distributed_lock_mongodb::Fence`]'s filter), which may
//! stay in flight up to [`Config::write_max_delay`] ticks: in the handoff configuration
//! [`WRITE_MAX_DELAY`], long enough to arrive after a later holder's.
//!
//! The servers apply the crate's own commands ([`distributed_lock_mongodb::__model`]) through
//! [`crate::eval`]; the clients decide with the crate's own protocol core, the state machines the
//! engine runs: each holder's [`code::Lease`] (its deadline, counted from the send of the
//! request that confirmed it, and the rule that nothing extends a lease whose deadline passed)
//! and [`code::Renewals`] (when it renews, and how soon after a failure), each attempt's
//! [`code::Attempt`] (its reply limit, when its undo goes out, and that a win nobody waits for is
//! released), each release's [`code::hands_over`], [`code::handover`] and
//! [`code::transfer_answered`] (whether it becomes a transfer, to which waiter of the line, and
//! what a transfer's outcome hands on or undoes), and each family's
//! [`code::Work`] (what its shutdown waits for and undoes, and whether a late outcome may still be
//! handed on). A mistake in those decisions, made in the crate, changes what the checker explores. What the model adds is the network and the callers: a message stays in flight
//! up to [`Config::max_delay`] ticks (so messages overtake each other), and within a budget of
//! faults a message is lost (its sender sees an error: the outcome of its command is unknown) or
//! a request is delivered twice; one caller may stop waiting during an attempt; a family of locks
//! of the first process may be shut down, or the whole process crash; an operator may force the
//! lock's release, or delete its document by hand; the callers' locks may have a `min_hold`
//! window (each its own: a waiter's may differ from the releaser's), which every holder's way of
//! ending its lease must keep.
//!
//! Modelling choices, each the crate's behaviour or a conservative stand-in for it:
//! - A holder has at most one renewal in flight: the engine's loop sends another round when an
//!   unanswered one is three quarters of the way to being given up ([`code::suspect_at`]), the
//!   model waits for it (fewer confirmations, earlier deadlines: never a safer world). A renewal
//!   whose outcome is unknown is not counted as confirming anything, and the next one goes out
//!   as [`code::Renewals::retry_soon`] says.
//! - The server applies a request within [`Config::max_delay`] ticks of its send or never: the
//!   model's stand-in for the server-side time limit (`ATTEMPT_SERVER_TIME`) that gives attempts
//!   and transfers their settle deadline (a shutdown waits that long, then undoes them).
//! - Work without a settle deadline (a release, an undo) is a message already sent; a shutdown
//!   sending its undo again is a duplicate: a request applied twice, which the configurations
//!   with faults explore.
//! - A crash of process 0 stops its callers where they are: they send nothing more, replies to
//!   them are dropped, and its requests already in flight still reach the server. Its leases end
//!   at their expiry (or, with a `min_hold`, at the end of their window, if later).
//! - A purge runs the crate's filter on the lock's document and on [`others`], as its server
//!   would (the lock's own lease never ends a day before the horizon: the purge leaves it).
//! - A lease-checked transaction ([`Config::a_lease_checked_transaction`]): its renewal is
//!   applied at once but kept apart until the commit, and every other write of the lock's
//!   document waits until the transaction ends (then applies, in arrival order, with `$$NOW` as
//!   it is then), as MongoDB's writes wait for a document an open transaction wrote. Its own
//!   messages are never lost or duplicated (the crate's retries of a transaction are not
//!   modelled); the server aborts one left open after [`TRANSACTION_LIFETIME_TICKS`].
//! - With [`Config::batch_renewals`], a semaphore's places held by one family are renewed in the
//!   same round, in one command (the engine's loop does so for the second and later leases of a
//!   round: with three or more leases in the family, or once it stopped reading the server's
//!   clock); then, unless the reply's count shows each renewed
//!   ([`code::renewed_every_lease`]), a read tells which are live. Each holder keeps its own
//!   [`code::Renewals`]: a round goes out when either is due and takes the other along.
//!   Otherwise each lease is renewed alone, as the engine renews a family's only two.
//! - Replies are not duplicated: the driver matches each reply to its request by id, so a reply
//!   arrives once or not at all. Requests are duplicated (a retried write applied twice).
//! - The runs with a cancelled caller or a shutdown ([`Config::a_caller_leaves`],
//!   [`Config::a_provider_shuts_down`]) have no network faults: with both, the state space is
//!   too large for CI's time budget. The faults' effect on cleanups is checked in
//!   [`Config::handoff_and_faults`], where a reply limit abandons an attempt as a cancel does.
//!
//! Clients act as soon as something is due (an attempt, a renewal, a deadline, a reply limit), and
//! time advances only when nothing is; a holder releases after its `hold_ticks`. So every path
//! makes progress, and liveness is checked up to [`Config::horizon`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Add;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use distributed_lock_mongodb::__model as code;
use distributed_lock_mongodb::{DEFAULT_FENCE_FIELD, LockOptions};
use mongodb::bson::{Bson, DateTime, Document, doc};
use stateright::{Checker, Model, Property};

use crate::eval;

/// One tick of model time.
pub const TICK_MS: i64 = 100;
/// A long holder releases this many ticks after it learned it acquired: longer than a lease
/// lasts without renewal, so that a holder whose renewals fail still holds at its deadline.
pub const LONG_HOLD_TICKS: u8 = 5;
/// A caller that found the lock busy attempts again this many ticks later.
pub const POLL_TICKS: u8 = 2;
/// In the handoff configuration, a fenced write to the protected resource may stay in flight
/// this many ticks: longer than a short hold, so that it can arrive after the next holder's
/// write. (Elsewhere a tick, as other messages: the state space stays within CI's budget.)
pub const WRITE_MAX_DELAY: u8 = 4;
/// A document lock's checkpoint may stay in flight this many ticks: longer than a lease (its
/// caller waits `expiry` for the reply, then goes on; the write may still land), so that it can
/// arrive after its lease ended.
pub const CHECKPOINT_MAX_DELAY: u8 = 7;
/// The server aborts a transaction left open this many ticks (MongoDB's
/// `transactionLifetimeLimitSeconds`, 60 s by default; shorter in the model, whose leases are
/// shorter too): a transaction whose commit or abort never came stops holding the lock's
/// document then.
pub const TRANSACTION_LIFETIME_TICKS: u8 = 10;
/// A holder that extends its lease by hand ([`Caller::extends`]) extends it by this many ticks
/// every other round: less than is left of it then.
pub const SHORT_EXTENSION_TICKS: u8 = 3;
/// The lock's name.
const NAME: &str = "lock";
/// Router R1's clock is ahead of R0's by this much: the whole `max_clock_skew`.
const R1_AHEAD_MS: i64 = 200;
/// The epoch of the model's clocks, in ms: far from 0, as real clocks are.
const EPOCH_MS: i64 = 1_700_000_000_000;

/// The lock's options in the model: a lease of 600 ms renewed every 200 ms, clocks within 200 ms,
/// and a `min_hold` of that many ticks if given.
pub fn options(min_hold_ticks: Option<u8>) -> LockOptions {
    let builder = LockOptions::builder()
        .expiry(Duration::from_millis(600))
        .extension_cadence(Duration::from_millis(200))
        .max_clock_skew(Duration::from_millis(R1_AHEAD_MS as u64));
    match min_hold_ticks {
        Some(ticks) => builder.min_hold(Duration::from_millis(u64::from(ticks) * TICK_MS as u64)),
        None => builder,
    }
    .build()
    .expect("valid options")
}

/// An instant of the clients' clock (which runs at the real rate) in ms: what the crate's
/// protocol core runs on in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct At(pub i64);

impl At {
    /// The start of `tick`.
    pub fn tick(tick: u8) -> At {
        At(i64::from(tick) * TICK_MS)
    }
}

impl Add<Duration> for At {
    type Output = At;
    fn add(self, duration: Duration) -> At {
        At(self.0 + i64::try_from(duration.as_millis()).expect("a small duration"))
    }
}

impl code::Moment for At {
    fn since(self, earlier: At) -> Duration {
        Duration::from_millis(u64::try_from(self.0 - earlier.0).unwrap_or(0))
    }
}

/// A mistake planted in the model's commands, to show that the checker finds what it must find.
/// (Mistakes in the clients' decisions are planted in the crate itself, whose protocol core the
/// model runs: `scripts/plant-mistakes`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mistake {
    /// The server applies a transfer without checking that the releasing lease is still the
    /// stored one (the transfer's filter and its "free" test look at the name only): a transfer
    /// that arrives after the releasing lease ended, and after another caller acquired the lock,
    /// takes the lock from that caller.
    TransferOfALostLease,
    /// The cleanup after an attempt whose outcome is unknown is filtered by the lock's name
    /// instead of the attempt's lock id.
    CleanupByName,
    /// A takeover keeps the stored fencing token instead of the next one.
    TokenNotIncremented,
    /// A lease a transfer won is handed to its waiter even when the waiter no longer waits (its
    /// own attempt won first, or it left): the rule of the crate's engine (`acquire::waiting`: a guard
    /// nobody receives is ended at once) that the model's clients copy, broken in the copy. It
    /// breaks the model's bookkeeping of what callers want, which must then yield a path.
    TransferToALeaver,
    /// A transaction given up at its lease's deadline while its renewal is on its way is
    /// aborted at once, not once the renewal is answered (the crate's engine before the fix;
    /// the model's clients copy that rule): the abort may overtake the renewal, which then
    /// opens a transaction nobody ends.
    AbortAtOnce,
    /// A guard's `extend` overwrites the lease's end with `$$NOW + by` instead of keeping the
    /// later of the two: an extension by less than is left shortens the lease on the server,
    /// while its holder keeps its later deadline.
    ExtensionShortens,
}

impl Mistake {
    /// Every planted mistake.
    pub const ALL: [Mistake; 6] = [
        Mistake::TransferOfALostLease,
        Mistake::CleanupByName,
        Mistake::TokenNotIncremented,
        Mistake::TransferToALeaver,
        Mistake::AbortAtOnce,
        Mistake::ExtensionShortens,
    ];
}

/// A caller: its process (a release hands the lock to a waiter of the same process; process 0
/// reaches the server through router R0, the others through R1), its family of locks (the
/// locks of one `Provider`, or of one lock object built apart: what a shutdown ends; each
/// process has one unless a configuration gives it two), and how many ticks it holds the lock
/// once it learned it acquired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    pub process: u8,
    pub family: u8,
    pub hold_ticks: u8,
    /// Whether it stores details with its lease (`{owner: "C<n>"}`, n its index).
    pub details: bool,
    /// Its lock's `min_hold`, in ticks: an acquisition of its keeps the lock taken at least that
    /// long (by the server's clock), whatever it does. Callers of one lock may differ: each lock
    /// object has its own options, and a release hands the lock over with the waiter's.
    pub min_hold: Option<u8>,
    /// In a reader-writer lock ([`Kind::ReaderWriter`]), whether it reads (else it writes).
    pub reads: bool,
    /// In a document lock ([`Kind::Document`]), whether it writes a `checkpoint` of its work
    /// as it starts holding (`checkpointedBy`: its token), which keeps its lease.
    pub checkpoints: bool,
    /// In a document lock, whether it ends its hold with a `replace` of the whole document
    /// (`committedBy`: its token, and the lock field keeps only the token) rather than a
    /// `commit`.
    pub replaces: bool,
    /// In an exclusive lock, whether it runs a lease-checked transaction (the guards'
    /// `transaction`) as it starts holding, instead of a fenced write: the transaction renews
    /// the lease and writes the protected resource, both applied at its commit.
    pub transaction: bool,
    /// Whether its lease is kept by hand rather than renewed in the background
    /// (`auto_renew(false)`): each of its rounds is a guard's `extend` instead of a renewal, by
    /// this many ticks and by [`SHORT_EXTENSION_TICKS`] in turn (less than is left of the lease
    /// then: an extension never shortens it).
    pub extends: Option<u8>,
    /// In a semaphore, how many places it asks for at once (`acquire_many`); a waiter for more
    /// than one places a waiting mark (`waiting`) that holds the places it needs back from the
    /// others. (Such a caller has no peer in its process: no release hands it places.)
    pub places: u8,
    /// In a reader-writer lock, a reader whose lease is upgradeable (`acquire_upgradeable_read`):
    /// it joins only while no other upgradeable lease is live, waits in no line of local waiters
    /// (as the crate's does not), and holds until its upgrade ([`Caller::upgrades`]) is done.
    pub upgradeable: bool,
    /// In a reader-writer lock, a writer that is the upgrade of that caller's upgradeable read
    /// lease (`UpgradeableReadGuard::upgrade`, then `downgrade` after its `hold_ticks`): it
    /// attempts only while that lease is held, wins when it is the only live reader's (however
    /// a writer waits), and leaves its wait when that lease is lost. It is in no line of local
    /// waiters, as the crate's upgrade is not.
    pub upgrades: Option<u8>,
    /// In an exclusive lock, whether its lock is fair (`fair(true)`): each wait takes a place in
    /// the document's line with its first attempt that fails, and renews it with the next ones;
    /// only the first live place may take the lock (or be handed it by a release). Every caller
    /// of a fair lock is fair.
    pub fair: bool,
    /// In an exclusive lock, a revoking waiter (`acquire_revoking`) that gives the holder this
    /// many ticks of grace: each of its attempts that fails places or renews its request (its
    /// wait's marker), which caps the holder's renewals once the grace is over and keeps the
    /// lock for this wait once it is free.
    pub revokes: Option<u8>,
    /// Its lock's `max_idle`, in ticks: the lease is renewed only while its work reports
    /// progress that often.
    pub max_idle: Option<u8>,
    /// With `max_idle`, whether its work reports progress at every tick it holds (else its work
    /// stalls at once: it never reports any).
    pub progresses: bool,
}

/// What the checker explores.
#[derive(Clone, Debug)]
pub struct Config {
    pub mistake: Option<Mistake>,
    pub callers: Vec<Caller>,
    /// How many messages may be lost or duplicated in one run.
    pub faults: u8,
    /// How many ticks a request may stay in flight.
    pub max_delay: u8,
    /// How many ticks a fenced write (or a document lock's commit) may stay in flight.
    pub write_max_delay: u8,
    /// Whether a reply may take a tick longer than the others.
    pub slow_replies: bool,
    /// The last tick: liveness must be reached by then.
    pub horizon: u8,
    /// Whether one caller may stop waiting during an attempt.
    pub cancel: bool,
    /// The families of locks one of which may shut down, once, at any moment (empty: none).
    pub shut_down: Vec<u8>,
    /// A step one router's clock may take, once, at any moment (an NTP step, a resumed VM).
    pub clock_step: Option<ClockStep>,
    /// How many ticks process 0 may stand still, once, at any moment (a stop-the-world pause, a
    /// starved runtime): its callers act on nothing, and the replies that reach it wait, to be
    /// handled as it resumes, before its timers.
    pub pause: Option<u8>,
    /// Whether an operator may force the lock's release, once, at any moment
    /// (`Provider::force_release` through router R0): a lease ended early by someone else.
    pub force_release: bool,
    /// Whether an operator may ask the holder to let go, once, at any moment
    /// (`Provider::request_revocation` through router R0, a grace of one tick).
    pub operator_revokes: bool,
    /// Whether process 0 may crash, once, at any moment: its callers stop, sending nothing more,
    /// and what reaches it is lost.
    pub crash: bool,
    /// Whether an operator may purge the collection, once, at any moment (`purge_expired`
    /// through router R0). Beside the lock's document the collection holds [`others`].
    pub purge: bool,
    /// Whether an operator may delete the lock's document by hand, once, at any moment (say
    /// `db.distributed_locks.deleteOne({_id: "lock"})` in the shell): a lease ended early by
    /// someone who does not use the crate, and the fencing token's history gone with it.
    pub delete_by_hand: bool,
    /// Whether the operator's forced release ([`Config::force_release`]) of a semaphore or a
    /// reader-writer lock ends every lease (`force_release_all`) rather than one
    /// (`force_release_holder`).
    pub force_release_all: bool,
    /// Which kind of lock the callers share: an exclusive lock, or another kind's commands.
    pub kind: Kind,
    /// In a document lock, whether the document is missing at the start and every caller
    /// locks it with `lock_or_insert`: an attempt that matches no unlocked document inserts the
    /// caller's document (unless it exists: a duplicate `_id`, and the lock is busy), then tries
    /// to lock it again, in a second command.
    pub lock_or_insert: bool,
    /// A semaphore's places held by one family are renewed in one command (the crate does so
    /// for the second and later leases of a round: a round with three or more leases of the
    /// family, or once the loop stopped reading the server's clock); otherwise each goes alone,
    /// as the crate renews two.
    pub batch_renewals: bool,
    /// A semaphore's count an operator may set, once, at any moment (`set_max_count` through
    /// router R0): the stored count rules from then on; holders keep their places.
    pub resize: Option<u8>,
}

/// Which kind of lock the model runs. Every kind but the exclusive lock keeps no details and no
/// `min_hold` (the crate refuses one), and no operator deletes its document or purges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `MongoDistributedLock`.
    Exclusive,
    /// A semaphore of this many places (`MongoDistributedSemaphore`): its leases are members of
    /// the document's `holders` array. An operator's forced release ends one place, or every
    /// one ([`Config::force_release_all`]).
    Semaphore(u8),
    /// `MongoDistributedReaderWriterLock`: each caller reads or writes ([`Caller::reads`]);
    /// readers are members of the document's `readers` array, the writer's lease is embedded
    /// under `writer`, and a waiting writer's marker under `waitingWriter` holds new readers
    /// back. A writer's release hands the lock to a local reader. Callers wait until served
    /// unless one stops waiting ([`Config::cancel`]: a writer's marker is removed then, else by
    /// its win); an operator's forced release ends every lease, or one
    /// ([`Config::force_release_all`]); no shutdown.
    ReaderWriter,
    /// `DocumentLock`: the lease is embedded in the application's document under
    /// [`DOCUMENT_LOCK_FIELD`], and a holder ends it with a `commit` of its work
    /// (`committedBy`: its token), in one update filtered on its live lease, or a `replace` of
    /// the whole document ([`Caller::replaces`]), and may write a `checkpoint` first
    /// ([`Caller::checkpoints`]); callers may insert the document ([`Config::lock_or_insert`]).
    /// No transfers (a document lock hands nothing over), no forced release.
    Document,
}

/// The lock field of the model's document lock (the crate's default).
pub const DOCUMENT_LOCK_FIELD: &str = "lock";

/// The other documents of the lock's collection, which only a purge reads: a lock whose lease
/// ended two days ago (`old`, which the purge deletes), and application documents whose
/// `expiresAt` is as old but whose shape is not a lock's (one with a field no lock has, one
/// without a fencing token), which nothing may touch.
pub fn others() -> [Document; 3] {
    let two_days_ago = DateTime::from_millis(EPOCH_MS - 2 * 24 * 3_600_000);
    [
        doc! { "_id": "old", "expiresAt": two_days_ago, "fencingToken": 7_i64 },
        doc! { "_id": "order-1", "expiresAt": two_days_ago, "fencingToken": 3_i64, "total": 12 },
        doc! { "_id": "session-9", "expiresAt": two_days_ago },
    ]
}

/// A step of one router's clock: `by_ms` forward (positive) or back (negative).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClockStep {
    pub router: u8,
    pub by_ms: i64,
}

impl Default for Config {
    /// Three callers: a long holder and a short one in process 0 (router R0), a short one in
    /// process 1 (router R1).
    fn default() -> Config {
        Config {
            mistake: None,
            callers: vec![
                Caller {
                    process: 0,
                    family: 0,
                    hold_ticks: LONG_HOLD_TICKS,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
                Caller {
                    process: 0,
                    family: 0,
                    hold_ticks: 1,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
                Caller {
                    process: 1,
                    family: 1,
                    hold_ticks: 1,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
            ],
            faults: 1,
            max_delay: 1,
            write_max_delay: 1,
            slow_replies: false,
            horizon: 30,
            cancel: false,
            shut_down: Vec::new(),
            clock_step: None,
            pause: None,
            force_release: false,
            operator_revokes: false,
            crash: false,
            purge: false,
            delete_by_hand: false,
            force_release_all: false,
            kind: Kind::Exclusive,
            lock_or_insert: false,
            batch_renewals: false,
            resize: None,
        }
    }
}

impl Config {
    /// Routers whose clocks differ, slow replies, and one fault: a long holder in process 0
    /// (router R0), which stores details with its lease, and a caller of process 1 (router R1),
    /// which stores none. What the deadline arithmetic is for.
    pub fn clocks_and_delays() -> Config {
        Config {
            callers: vec![
                Caller {
                    process: 0,
                    family: 0,
                    hold_ticks: LONG_HOLD_TICKS,
                    details: true,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
                Caller {
                    process: 1,
                    family: 1,
                    hold_ticks: 1,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
            ],
            slow_replies: true,
            ..Config::default()
        }
    }

    /// Three callers (two of one process, so releases hand the lock over) and one fault: what
    /// transfers and cleanups are for. The short holder of process 0 stores details with its
    /// lease, the others none: a transfer writes the waiter's details, and no one else's.
    pub fn handoff_and_faults() -> Config {
        let mut callers = Config::default().callers;
        callers[1].details = true;
        Config {
            callers,
            write_max_delay: WRITE_MAX_DELAY,
            ..Config::default()
        }
    }

    /// Three callers, one of which stops waiting during an attempt.
    pub fn a_caller_leaves() -> Config {
        Config {
            faults: 0,
            cancel: true,
            ..Config::default()
        }
    }

    /// [`Config::a_caller_leaves`] with one network fault: too large for CI (13.8 million
    /// states, three minutes and a gigabyte on a 2-core machine), run by `cargo run -p lease-model --release
    /// --example long_runs`. At the usual horizon of 3 s a slow path (a fault, a cancel, a
    /// transfer) is still serving its last caller when time runs out; by 4 s every caller is
    /// served on every path.
    pub fn a_caller_leaves_with_a_fault() -> Config {
        Config {
            faults: 1,
            horizon: 40,
            ..Config::a_caller_leaves()
        }
    }

    /// Three callers, and process 0 shuts its provider down at any moment.
    pub fn a_provider_shuts_down() -> Config {
        Config {
            faults: 0,
            shut_down: vec![0],
            ..Config::default()
        }
    }

    /// Three callers, two of them in process 0 but of two families (two `Provider`s of one
    /// service, or a provider and a lock object built apart), so that a release hands the lock
    /// from one family to the other; either family shuts down at any moment; replies may be
    /// slow, so that a transfer's reply can come after its settle deadline, when a shutdown of
    /// the releasing family undoes it.
    pub fn two_families_and_a_shutdown() -> Config {
        Config {
            callers: vec![
                Caller {
                    process: 0,
                    family: 0,
                    hold_ticks: LONG_HOLD_TICKS,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
                Caller {
                    process: 0,
                    family: 1,
                    hold_ticks: 1,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
                Caller {
                    process: 1,
                    family: 2,
                    hold_ticks: 1,
                    details: false,
                    min_hold: None,
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
            ],
            faults: 0,
            slow_replies: true,
            shut_down: vec![0, 1],
            ..Config::default()
        }
    }

    /// Three callers, and at any moment router R1's clock steps back by twice `max_clock_skew`:
    /// from 200 ms ahead of R0's to 200 ms behind it, the largest step back that keeps the
    /// routers within `max_clock_skew` of each other (the assumption the lock is built on). A
    /// clock that steps back is what a fencing token must outlast: `$$NOW` after the step may be
    /// earlier than the previous holder's.
    pub fn a_router_clock_steps_back() -> Config {
        Config {
            faults: 0,
            clock_step: Some(ClockStep {
                router: 1,
                by_ms: -2 * R1_AHEAD_MS,
            }),
            ..Config::default()
        }
    }

    /// Three callers, requests that may stay in flight two ticks (longer than the margin a
    /// lease's deadline leaves), and process 0 stands still for two ticks at any moment: a reply
    /// that reaches it meanwhile is handled after its holder's deadline passed, before the
    /// holder notices the deadline (the order a starved renewal loop may take).
    pub fn a_process_pauses() -> Config {
        Config {
            faults: 0,
            max_delay: 2,
            pause: Some(2),
            ..Config::default()
        }
    }

    /// Three callers, and at any moment an operator forces the lock's release (the crate's
    /// `force_release` command): the holder whose lease it ended may go on believing it holds
    /// until its next renewal's reply, which must tell it (by design, the one window in which
    /// two callers believe they hold the lock; fencing covers it).
    pub fn an_operator_ends_a_lease() -> Config {
        Config {
            faults: 0,
            force_release: true,
            ..Config::default()
        }
    }

    /// Three callers, and at any moment an operator deletes the lock's document by hand (not
    /// with the crate): outside the lock's assumptions ("every writer of the lock collection
    /// uses this crate"), so what holds is less, and stated: as with a forced release, the
    /// holder whose lease went hears of it at its next renewal, and no renewal, release or
    /// transfer brings the deleted lease back; fencing tokens start over from `$$NOW`, so the
    /// next may be below the deleted lease's (router R1 reads 200 ms ahead of R0), but not below
    /// the deletion's time less `max_clock_skew`, and they increase again from there.
    pub fn an_operator_deletes_the_lock() -> Config {
        Config {
            faults: 0,
            delete_by_hand: true,
            ..Config::default()
        }
    }

    /// Routers whose clocks differ, slow replies and one fault, as in
    /// [`Config::clocks_and_delays`]; the long holder's lease is not renewed
    /// (`auto_renew(false)`): it extends it by hand every round, by 700 ms (more than a
    /// renewal gives) and 300 ms (less than is left, which must change nothing) in turn, and
    /// would hold 1.2 s: long enough for a late reply to its second long extension to matter,
    /// and for its lease to expire while held when one is lost. An extension lost, or answered
    /// late, must leave the holder believing no more than the server keeps.
    pub fn a_lease_extended_by_hand() -> Config {
        let mut callers = Config::clocks_and_delays().callers;
        callers[0].extends = Some(7);
        callers[0].hold_ticks = 12;
        Config {
            callers,
            // (Its hold is longer than the default long holder's, and a lost extension reply
            // can keep the lock taken until the extension's end: more time to serve both.)
            horizon: 40,
            ..Config::clocks_and_delays()
        }
    }

    /// [`Config::a_lease_extended_by_hand`] for another kind of lock, whose leases' extension
    /// writes another layout: a semaphore of one place (an array member), a reader-writer
    /// lock's writers (the `writer` field), a document lock (a field of the application's
    /// document). No caller stores details (only exclusive locks keep them in the model).
    pub fn a_lease_extended_by_hand_in(kind: Kind) -> Config {
        let mut config = Config::a_lease_extended_by_hand();
        for caller in &mut config.callers {
            caller.details = false;
        }
        Config { kind, ..config }
    }

    /// Three callers, a lock with a `min_hold` of 600 ms (as long as the lease, three times the
    /// most the routers' clocks differ, so that a window cut short by a short hold shows), and at any moment an operator forces the lock's release or process 0 crashes
    /// (once each): no acquisition may come inside an earlier holder's window, however its lease
    /// ended (a release, a forced release, a crash), and no release hands such a lock over.
    pub fn min_hold_windows() -> Config {
        Config {
            callers: with_min_hold(Config::default().callers, 6),
            faults: 0,
            force_release: true,
            crash: true,
            ..Config::default()
        }
    }

    /// Two callers of two processes, either of which may stop waiting during an attempt, and a
    /// lock with a `min_hold` of 400 ms: a lease won after its caller left is ended by a cleanup,
    /// window and all (nobody ran under it), while every way of ending a lease a caller was given
    /// keeps its window.
    pub fn a_caller_leaves_a_min_hold_lock() -> Config {
        Config {
            callers: vec![
                Caller {
                    process: 0,
                    family: 0,
                    hold_ticks: 1,
                    details: false,
                    min_hold: Some(4),
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
                Caller {
                    process: 1,
                    family: 1,
                    hold_ticks: 1,
                    details: false,
                    min_hold: Some(4),
                    reads: false,
                    checkpoints: false,
                    replaces: false,
                    transaction: false,
                    extends: None,
                    places: 1,
                    upgradeable: false,
                    upgrades: None,
                    fair: false,
                    revokes: None,
                    max_idle: None,
                    progresses: false,
                },
            ],
            ..Config::a_caller_leaves()
        }
    }

    /// Three callers whose locks' options differ: the long holder of process 0 has no
    /// `min_hold`, its neighbour in process 0 a `min_hold` of 600 ms, the caller of process 1
    /// none. A release of the long holder hands the lock to its neighbour (its own lock has no
    /// window to keep), and the lease the transfer writes is the one the neighbour's own attempt
    /// would: with its window, which the caller of process 1 must then wait out. Replies may be
    /// slow. (With a network fault as well, the long holder, a hung reply and the window leave
    /// the last caller unserved at the horizon; the faults with transfers are
    /// [`Config::handoff_and_faults`]'s.)
    pub fn a_waiter_with_a_min_hold() -> Config {
        let mut callers = Config::default().callers;
        callers[1].min_hold = Some(6);
        Config {
            callers,
            faults: 0,
            slow_replies: true,
            ..Config::default()
        }
    }

    /// A semaphore of two places and the three default callers (two of one process, so
    /// releases hand places over), with routers whose clocks differ and one fault (with slow
    /// replies too, it has over nine million states: `examples/long_runs.rs`): at most two hold
    /// a place at once, in every interleaving.
    pub fn a_semaphore_of_two_places() -> Config {
        Config {
            kind: Kind::Semaphore(2),
            ..Config::default()
        }
    }

    /// A semaphore of two places whose count an operator sets to one at any moment
    /// (`set_max_count`, through router R0): holders keep their places, and no admission leaves
    /// more places taken than the stored count; every caller is still served. No network fault
    /// (with one: 5.2 million states).
    pub fn a_semaphore_whose_count_is_set_lower() -> Config {
        Config {
            kind: Kind::Semaphore(2),
            resize: Some(1),
            faults: 0,
            ..Config::default()
        }
    }

    /// A semaphore of two places: the long holder and the short one of process 0 ask one place
    /// each, the caller of process 1 both at once (`acquire_many(2)`), as one lease in one
    /// command; while it waits, its mark holds the places it needs back from the others. At
    /// most two places are held at once, by weight.
    pub fn a_semaphore_with_weighted_places() -> Config {
        let mut callers = Config::default().callers;
        callers[2].places = 2;
        Config {
            callers,
            kind: Kind::Semaphore(2),
            ..Config::default()
        }
    }

    /// A reader-writer lock: a writer (the long holder) and a reader in process 0, so the
    /// writer's release hands the lock to the reader, and a writer in process 1, whose marker
    /// holds the reader back while it waits; routers whose clocks differ and one fault. No
    /// writer holds beside anyone, in every interleaving.
    pub fn a_reader_writer_lock() -> Config {
        let mut callers = Config::default().callers;
        callers[1].reads = true;
        Config {
            callers,
            kind: Kind::ReaderWriter,
            write_max_delay: WRITE_MAX_DELAY,
            horizon: 40,
            ..Config::default()
        }
    }

    /// A reader-writer lock with an upgradeable reader (the long holder, in process 0) and its
    /// upgrade (process 0), beside a caller of process 1 that reads (`reads`) or writes; routers
    /// whose clocks differ and one fault. The upgrade waits for a plain reader to leave, holding
    /// new ones back, or wins while the other writer waits (its marker stays); no writer gets in
    /// beside the upgradeable reader but its upgrade.
    pub fn an_upgradeable_reader_beside(reads: bool) -> Config {
        let mut callers = Config::default().callers;
        callers[0].reads = true;
        callers[0].upgradeable = true;
        callers[1].upgrades = Some(0);
        callers[2].reads = reads;
        Config {
            callers,
            kind: Kind::ReaderWriter,
            write_max_delay: WRITE_MAX_DELAY,
            horizon: 40,
            ..Config::default()
        }
    }

    /// A fair lock (`fair(true)`) among the three callers, with handoffs in process 0 and one
    /// fault: each wait takes a place in line with its first failed attempt; only the first live
    /// place may take the lock, by an attempt or a release's transfer (which otherwise ends the
    /// releasing lease alone); a wait that ends removes its place. "A fair lock serves its
    /// waiters in line order".
    pub fn a_fair_lock() -> Config {
        let mut callers = Config::default().callers;
        for caller in &mut callers {
            caller.fair = true;
        }
        Config {
            callers,
            horizon: 40,
            ..Config::default()
        }
    }

    /// An exclusive lock whose caller of process 1 asks the holder to let go
    /// (`acquire_revoking`, a grace of one tick), while the long holder of process 0 ignores the
    /// request and a caller of process 0 waits plainly, with one fault: the holder's renewals stop
    /// once the grace is over, it loses the lock, and the lock, once free, is kept for the asker.
    /// "No lease is renewed once a revocation's grace is over", "a lock kept for a revoking
    /// waiter goes to nobody else", and every property of the exclusive lock.
    pub fn a_revoking_waiter() -> Config {
        let mut callers = Config::default().callers;
        callers[2].revokes = Some(1);
        Config {
            callers,
            horizon: 40,
            ..Config::default()
        }
    }

    /// The semaphore of [`Self::a_semaphore_of_two_places`], one of whose places an operator
    /// asks to let go at any moment (`Provider::request_revocation_of`, a grace of one tick),
    /// without network faults: that place's renewals stop once the grace is over, and the other
    /// places' go on (the places of one family are renewed in one command).
    pub fn an_operator_revokes_a_place() -> Config {
        Config {
            faults: 0,
            operator_revokes: true,
            horizon: 40,
            ..Config::a_semaphore_of_two_places()
        }
    }

    /// The exclusive lock of the default configuration, whose holder an operator asks to let go
    /// at any moment (`Provider::request_revocation`, a grace of one tick, keeping the lock for
    /// nobody), without network faults: the holder's renewals stop once the grace is over.
    pub fn an_operator_revokes() -> Config {
        Config {
            faults: 0,
            operator_revokes: true,
            horizon: 40,
            ..Config::default()
        }
    }

    /// Callers whose lock has a `max_idle` of two ticks: the long holder of process 0, whose work
    /// stalls at once (it reports no progress), and the caller of process 1, which holds five
    /// ticks and reports progress at every tick, with one fault: "a holder whose work
    /// stalls holds no longer than max_idle" (counted from the send of the request that won its
    /// lease), while a holder that reports progress keeps its lease past it.
    pub fn a_holder_whose_work_stalls() -> Config {
        let mut callers = Config::default().callers;
        for caller in &mut callers {
            caller.max_idle = Some(2);
        }
        callers[2].progresses = true;
        callers[2].hold_ticks = 5;
        Config {
            callers,
            horizon: 40,
            ..Config::default()
        }
    }

    /// The fair lock of [`Self::a_fair_lock`], one of whose callers stops waiting during an
    /// attempt, without network faults: its place leaves the line (`line::removal`, once the
    /// attempt it left in flight has its outcome), so the waiters behind it are not held back.
    pub fn a_fair_waiter_leaves() -> Config {
        Config {
            faults: 0,
            cancel: true,
            ..Config::a_fair_lock()
        }
    }

    /// A fair semaphore of two places among the three callers (`fair(true)`), the caller of
    /// process 1 asking for both at once: waits take places in line, only the first live place
    /// may be admitted (a waiter for one place behind a waiter for two is not let in beside the
    /// holder, though its place would fit), and a release hands a place to a local waiter only
    /// when it is first in line.
    pub fn a_fair_semaphore() -> Config {
        let mut config = Config::a_semaphore_with_weighted_places();
        for caller in &mut config.callers {
            caller.fair = true;
        }
        config.horizon = 40;
        config
    }

    /// The reader-writer lock of [`Self::a_reader_writer_lock`], fair (`fair(true)`): each
    /// writer's wait takes a place in line, only the first live place may take the lock, and a
    /// live place holds new readers back (the reader's transfer from the writer of its process
    /// included). "A fair lock serves its waiters in line order": no writer passes a place ahead
    /// of its own, and no reader joins while a waiting writer's place is live.
    pub fn a_fair_reader_writer_lock() -> Config {
        let mut config = Config::a_reader_writer_lock();
        for caller in &mut config.callers {
            caller.fair = true;
        }
        config
    }

    /// The fair reader-writer lock of [`Self::a_fair_reader_writer_lock`], one of whose callers
    /// stops waiting during an attempt, without network faults: a writer that leaves takes its
    /// place out of the line, so the reader is not held back by it.
    pub fn a_fair_writer_leaves() -> Config {
        Config {
            faults: 0,
            cancel: true,
            ..Config::a_fair_reader_writer_lock()
        }
    }

    /// Two upgradeable readers, one in each process (the one of process 0 with its upgrade):
    /// the other joins only once the first one's lease has ended, so no document ever stores
    /// two.
    pub fn two_upgradeable_readers() -> Config {
        let mut config = Config::an_upgradeable_reader_beside(true);
        config.callers[2].upgradeable = true;
        config
    }

    /// The reader-writer lock of [`Self::a_reader_writer_lock`], one of whose callers stops
    /// waiting during an attempt, without network faults: a writer that leaves removes its
    /// waiting marker (`WaitingWriter::remove`), so the reader is not held back by it.
    pub fn a_writer_stops_waiting() -> Config {
        Config {
            faults: 0,
            cancel: true,
            ..Config::a_reader_writer_lock()
        }
    }

    /// The reader-writer lock of [`Self::a_reader_writer_lock`], and at any moment an operator
    /// ends every lease of it (`force_release_all`), without network faults: each holder hears
    /// of it at its next renewal.
    pub fn an_operator_ends_a_reader_writer_lock() -> Config {
        Config {
            faults: 0,
            force_release: true,
            force_release_all: true,
            horizon: 30,
            ..Config::a_reader_writer_lock()
        }
    }

    /// The reader-writer lock of [`Self::a_reader_writer_lock`], and at any moment an operator
    /// ends the first live lease `holders()` shows, the writer's or a reader's
    /// (`Provider::force_release_holder`), without network faults: its holder hears of it at
    /// its next renewal, and the others' leases stay.
    pub fn an_operator_ends_one_reader_writer_lease() -> Config {
        Config {
            force_release_all: false,
            ..Config::an_operator_ends_a_reader_writer_lock()
        }
    }

    /// The semaphore of [`Self::a_semaphore_of_two_places`], and at any moment an operator
    /// ends every place (`force_release_all`), without network faults.
    pub fn an_operator_ends_every_semaphore_place() -> Config {
        Config {
            force_release_all: true,
            ..Config::an_operator_ends_a_semaphore_place()
        }
    }

    /// A document lock, the three default callers and one fault (a lost reply to an attempt
    /// brings the cleanup by lock id): each holder commits its work into the document as it ends
    /// its lease (its only write), and a commit applies only under its sender's live lease.
    pub fn a_document_lock() -> Config {
        Config {
            kind: Kind::Document,
            ..Config::default()
        }
    }

    /// The document lock of [`Self::a_document_lock`], whose commits may stay in flight four
    /// ticks, long enough to arrive after their lease ended, without network faults (with one,
    /// it has 2.6 million states, and the slow commits of three holders in a row outlast the
    /// horizon).
    pub fn a_document_lock_with_slow_commits() -> Config {
        Config {
            kind: Kind::Document,
            faults: 0,
            write_max_delay: WRITE_MAX_DELAY,
            ..Config::default()
        }
    }

    /// The document lock of [`Self::a_document_lock`], one fault, missing at the start: every
    /// caller locks it with `lock_or_insert` (lock, insert, lock again, three commands), so the
    /// first attempts insert it, one insert hits the duplicate `_id` of another's, an inserter
    /// may find the document locked by someone else before its third command, and an attempt
    /// whose first command found it locked may find it unlocked, but there, at its insert (then
    /// it waits a poll, as for a busy lock). Two callers, one of each process: with three, the
    /// last one's extra round trips and polls outlast the horizon.
    pub fn a_document_lock_or_insert() -> Config {
        let mut config = Config {
            lock_or_insert: true,
            ..Config::a_document_lock()
        };
        config.callers.remove(1);
        config
    }

    /// The document lock of [`Self::a_document_lock`], one fault, whose holders write their
    /// work every way a `DocumentGuard` can: the long holder of process 0 checkpoints as it
    /// starts holding and commits as it ends, its neighbour replaces the whole document, the
    /// caller of process 1 checkpoints and replaces. A checkpoint is on its way while its
    /// sender holds (it may arrive after the sender's end, or after its lease ended), and the
    /// token a replace leaves is the one the next holder's must follow.
    pub fn a_document_lock_that_checkpoints_and_replaces() -> Config {
        let mut config = Config::a_document_lock();
        for (caller, (checkpoints, replaces)) in
            config
                .callers
                .iter_mut()
                .zip([(true, false), (false, true), (true, true)])
        {
            caller.checkpoints = checkpoints;
            caller.replaces = replaces;
        }
        config
    }

    /// The semaphore of [`Self::a_semaphore_of_two_places`], and at any moment an operator ends
    /// the first live place `holders()` shows (`Provider::force_release_holder`), without
    /// network faults (with one, it has over five million states: `examples/long_runs.rs`): its
    /// holder hears of it at its
    /// next renewal, and until then the others still number at most `max_count`.
    pub fn an_operator_ends_a_semaphore_place() -> Config {
        Config {
            kind: Kind::Semaphore(2),
            faults: 0,
            force_release: true,
            batch_renewals: true,
            ..Config::default()
        }
    }

    /// Two callers; the long holder of process 0 runs a lease-checked transaction as it starts
    /// holding (`HeldLease::transaction`): its first write renews the lease, filtered on it
    /// being ours and live, its work writes the protected resource, and both apply at its
    /// commit; until the transaction ends, every other write of the lock's document waits (as
    /// MongoDB's do for a document an open transaction wrote), and the renewal loop keeps off the
    /// lease. Replies may be slow, so that a commit can come long after its renewal was
    /// applied; one fault (not of the transaction's own messages: the crate's retries of those
    /// are not modelled). Once committed, the lease counts from the renewal's send
    /// ([`code::Transaction`]).
    pub fn a_lease_checked_transaction() -> Config {
        let mut callers = Config::clocks_and_delays().callers;
        callers[0].transaction = true;
        callers[0].details = false;
        // Holding on after its transaction, long enough for its renewals to meet the lease's end.
        callers[0].hold_ticks = 9;
        Config {
            callers,
            slow_replies: true,
            ..Config::default()
        }
    }

    /// Three callers, and at any moment router R0's clock steps forward by the whole
    /// `max_clock_skew`, to read what R1's does: the largest forward step the assumptions allow.
    /// A lease R0 wrote before the step ends earlier in real time by as much. At any moment too,
    /// an operator purges the collection, which also holds [`others`] (with `$$NOW` as R0 reads
    /// it, before or after its step).
    pub fn a_router_clock_steps_forward() -> Config {
        Config {
            faults: 0,
            clock_step: Some(ClockStep {
                router: 0,
                by_ms: R1_AHEAD_MS,
            }),
            purge: true,
            ..Config::default()
        }
    }
}

/// `callers`, each with a `min_hold` of `ticks`.
fn with_min_hold(callers: Vec<Caller>, ticks: u8) -> Vec<Caller> {
    callers
        .into_iter()
        .map(|caller| Caller {
            min_hold: Some(ticks),
            ..caller
        })
        .collect()
}

/// The protocol under the [`Config`]'s conditions.
#[derive(Clone, Debug)]
pub struct LeaseProtocol {
    pub config: Config,
    /// Each caller's lock options (they differ in `min_hold` only).
    options: Vec<LockOptions>,
    /// The commands the server has applied so far, each built once: the crate builds them from
    /// the lock ids, the token and the options alone, and building them again for every delivery
    /// (the crate's code, unoptimized in test builds) took half of the checker's time.
    commands: Arc<RwLock<HashMap<CommandKey, Arc<Command>>>>,
}

/// A command the server applies: a filter, and the update of what it matched.
#[derive(Debug)]
struct Command {
    filter: Document,
    update: Vec<Document>,
}

/// Which [`Command`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum CommandKey {
    /// An attempt of `client` with this lock id (its options, its details if any; a
    /// reader-writer lock's writer, its wait's marker; an upgrade, the upgradeable reader's
    /// lease it upgrades).
    Attempt {
        lock_id: u8,
        client: u8,
        marker: u8,
        reading: Option<u8>,
    },
    /// A renewal of `client`'s lease `lock_id`, or with `by` > 0 its extension by that many
    /// ticks (a guard's `extend`; the filter is the same).
    Renew {
        lock_id: u8,
        client: u8,
        by: u8,
    },
    /// A release (or cleanup) of `client`'s lease `lock_id`.
    Release {
        lock_id: u8,
        cleanup: bool,
        client: u8,
    },
    /// A transfer from lease `releasing` to lease `waiter` of caller `client` (its options, its
    /// details if any).
    Transfer {
        releasing: u8,
        waiter: u8,
        client: u8,
        marker: u8,
    },
    /// A document lock's `commit` of lease `lock_id`, writing its `token` as `committedBy`;
    /// with `replace`, a `replace` of the whole document by one that says so.
    Commit {
        lock_id: u8,
        token: i64,
        replace: bool,
    },
    /// A document lock's `checkpoint` under lease `lock_id`, writing its `token` as
    /// `checkpointedBy`.
    Checkpoint {
        lock_id: u8,
        token: i64,
    },
    /// A fenced write of the protected resource with this token.
    Write(i64),
    /// The purge's delete.
    Purge,
    /// A semaphore's renewal of the places `lock_ids` in one `update` command (its filter and
    /// update), and the read that tells which of them are live (its pipeline, as `update`).
    RenewMany {
        lock_ids: [u8; 2],
    },
    ReadLive {
        lock_ids: [u8; 2],
    },
}

impl LeaseProtocol {
    pub fn new(config: Config) -> LeaseProtocol {
        // The bookkeeping keeps one lease ended early, and no window across a deletion.
        assert!(
            !(config.delete_by_hand && config.force_release),
            "a deletion by hand and a forced release in one configuration"
        );
        assert!(
            !(config.delete_by_hand && config.callers.iter().any(|c| c.min_hold.is_some())),
            "a deletion by hand of a lock with a min_hold"
        );
        // What the model keeps of the other kinds: no details, no window, no deletion or purge;
        // no shutdown of a reader-writer lock, no forced release of a document lock.
        if config.kind != Kind::Exclusive {
            let unkept = config.delete_by_hand
                || config.purge
                || (config.callers.iter()).any(|c| c.details || c.min_hold.is_some())
                || (config.kind == Kind::ReaderWriter && !config.shut_down.is_empty())
                || (config.kind == Kind::Document && config.force_release);
            assert!(
                !unkept,
                "{:?} with what the model does not keep of it",
                config.kind
            );
        }
        LeaseProtocol {
            options: config
                .callers
                .iter()
                .map(|caller| {
                    let options = options(caller.min_hold);
                    let mut builder = options.to_builder().fair(caller.fair);
                    if let Some(ticks) = caller.max_idle {
                        builder = builder.max_idle(Duration::from_millis(ticks_ms(ticks) as u64));
                    }
                    match caller.extends {
                        Some(_) => builder.auto_renew(false).build(),
                        None => builder.build(),
                    }
                    .expect("valid options")
                })
                .collect(),
            config,
            commands: Arc::default(),
        }
    }

    /// The command `key` names, as the crate builds it (with the planted mistake, if any).
    fn command(&self, key: CommandKey) -> Arc<Command> {
        let cached = self
            .commands
            .read()
            .expect("not poisoned")
            .get(&key)
            .cloned();
        cached.unwrap_or_else(|| {
            let built = Arc::new(self.build(key));
            let mut commands = self.commands.write().expect("not poisoned");
            Arc::clone(commands.entry(key).or_insert(built))
        })
    }

    fn build(&self, key: CommandKey) -> Command {
        // (A fenced write and the purge are the same for every kind.)
        if !matches!(key, CommandKey::Purge | CommandKey::Write(_)) {
            match self.config.kind {
                Kind::Exclusive => {}
                Kind::Semaphore(places) => return self.build_for_semaphore(key, places.into()),
                Kind::ReaderWriter => return self.build_for_reader_writer(key),
                Kind::Document => return self.build_for_document_lock(key),
            }
        }
        match key {
            CommandKey::Attempt {
                lock_id,
                client,
                marker,
                ..
            } => {
                let (lock_id, options) = (lock_id_name(lock_id), self.options_of(client));
                let details = self.details_of(client).map(details_of);
                let revokes = self.config.callers[usize::from(client)].revokes;
                let update = if let Some(grace) = revokes {
                    code::revoking_attempt_update(
                        &lock_id,
                        options,
                        details.as_ref(),
                        &marker_of(marker),
                        ticks_ms(grace),
                        0,
                    )
                } else if options.fair() {
                    code::fair_attempt_update(
                        &lock_id,
                        options,
                        details.as_ref(),
                        &marker_of(marker),
                    )
                } else {
                    code::attempt_update(&lock_id, options, details.as_ref())
                };
                Command {
                    filter: code::attempt_filter(NAME),
                    update: self.planted_token(update),
                }
            }
            CommandKey::Renew {
                lock_id,
                client,
                by: 0,
            } => Command {
                filter: code::renew_filter(NAME, &lock_id_name(lock_id)),
                update: code::renew_update(self.options_of(client)),
            },
            CommandKey::Renew {
                lock_id,
                client,
                by,
            } => Command {
                filter: code::extend_filter(NAME, &lock_id_name(lock_id)),
                update: if self.mistake(Mistake::ExtensionShortens) {
                    vec![doc! { "$set": { "expiresAt": { "$add": ["$$NOW", ticks_ms(by)] } } }]
                } else {
                    code::extend_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                        ticks_ms(by),
                    )
                },
            },
            CommandKey::Release {
                lock_id, cleanup, ..
            } => Command {
                filter: if self.mistake(Mistake::CleanupByName) {
                    code::attempt_filter(NAME)
                } else {
                    code::release_filter(NAME, &lock_id_name(lock_id))
                },
                update: if cleanup {
                    code::cleanup_update(&lock_id_name(lock_id))
                } else {
                    code::release_update(&lock_id_name(lock_id))
                },
            },
            CommandKey::Transfer {
                releasing,
                waiter,
                client,
                marker,
            } => {
                let (waiter, releasing) = (lock_id_name(waiter), lock_id_name(releasing));
                let filter = code::transfer_filter(NAME, &releasing, &waiter);
                let (options, details) = (self.options_of(client), self.details_of(client));
                let details = details.map(details_of);
                let revokes = self.config.callers[usize::from(client)].revokes;
                let update = if let Some(grace) = revokes {
                    code::revoking_transfer_update(
                        &waiter,
                        options,
                        &releasing,
                        details.as_ref(),
                        &marker_of(marker),
                        ticks_ms(grace),
                        0,
                    )
                } else if options.fair() {
                    let wait = marker_of(marker);
                    code::fair_transfer_update(
                        &waiter,
                        options,
                        &releasing,
                        details.as_ref(),
                        &wait,
                    )
                } else {
                    code::transfer_update(&waiter, options, &releasing, details.as_ref())
                };
                if self.mistake(Mistake::TransferOfALostLease) {
                    Command {
                        filter: code::attempt_filter(NAME),
                        update: take_whatever_is_stored(update),
                    }
                } else {
                    Command {
                        filter,
                        update: self.planted_token(update),
                    }
                }
            }
            CommandKey::Purge => Command {
                filter: code::purge_filter(),
                update: Vec::new(),
            },
            CommandKey::Write(token) => Command {
                filter: code::fenced_filter(doc! { "_id": "resource" }, token),
                update: vec![doc! { "$set": { DEFAULT_FENCE_FIELD: token } }],
            },
            CommandKey::Commit { .. } | CommandKey::Checkpoint { .. } => {
                unreachable!("a document lock's only")
            }
            CommandKey::RenewMany { .. } | CommandKey::ReadLive { .. } => {
                unreachable!("a semaphore's only")
            }
        }
    }

    /// The command `key` names for a semaphore of `places` places, as `semaphore.rs` and the
    /// engine build it.
    fn build_for_semaphore(&self, key: CommandKey, places: u32) -> Command {
        let semaphore = |filter, update| Command { filter, update };
        match key {
            CommandKey::Attempt {
                lock_id,
                client,
                marker,
                ..
            } => semaphore(
                code::attempt_filter(NAME),
                code::semaphore::attempt_update(
                    &lock_id_name(lock_id),
                    self.places_of(client),
                    places,
                    self.options_of(client),
                    // (A fair caller's wait always has a place in line, its first included.)
                    (marker > 0 || self.options_of(client).fair())
                        .then(|| marker_of(marker))
                        .as_deref(),
                ),
            ),
            CommandKey::Renew {
                lock_id,
                client,
                by,
            } => semaphore(
                code::semaphore::renew_filter(NAME, &lock_id_name(lock_id)),
                match by {
                    0 => code::semaphore::renew_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                    ),
                    by => code::semaphore::extend_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                        ticks_ms(by),
                    ),
                },
            ),
            // A cleanup is a release: a semaphore keeps no window.
            CommandKey::Release { lock_id, .. } => semaphore(
                code::semaphore::release_filter(NAME, &lock_id_name(lock_id)),
                code::semaphore::release_update(&lock_id_name(lock_id)),
            ),
            CommandKey::Transfer {
                releasing,
                waiter,
                client,
                marker,
            } => {
                let (waiter, releasing) = (lock_id_name(waiter), lock_id_name(releasing));
                assert_eq!(
                    self.places_of(client),
                    1,
                    "no release hands several places over"
                );
                let options = self.options_of(client);
                let wait = options.fair().then(|| marker_of(marker));
                semaphore(
                    code::semaphore::transfer_filter(NAME, &releasing, &waiter),
                    code::semaphore::transfer_update(
                        &waiter,
                        1,
                        places,
                        options,
                        &releasing,
                        wait.as_deref(),
                    ),
                )
            }
            CommandKey::RenewMany { lock_ids } | CommandKey::ReadLive { lock_ids } => {
                let lock_ids = lock_ids.map(lock_id_name);
                // (The model's callers of a semaphore share its options.)
                let (filter, update, read) =
                    code::semaphore::renew_many(NAME, self.options_of(0_usize), &lock_ids);
                match key {
                    CommandKey::RenewMany { .. } => semaphore(filter, update),
                    _ => semaphore(Document::new(), read),
                }
            }
            CommandKey::Purge | CommandKey::Write(_) => unreachable!("built as for any kind"),
            CommandKey::Commit { .. } | CommandKey::Checkpoint { .. } => {
                unreachable!("a document lock's only")
            }
        }
    }

    /// The command `key` names for a reader-writer lock, as `rw_lock/attempt.rs` and the engine
    /// build it.
    fn build_for_reader_writer(&self, key: CommandKey) -> Command {
        use code::reader_writer as rw;
        let reads = |client: u8| self.config.callers[usize::from(client)].reads;
        let upgradeable = |client: u8| self.config.callers[usize::from(client)].upgradeable;
        let command = |filter, update| Command { filter, update };
        match key {
            CommandKey::Attempt {
                lock_id,
                client,
                marker,
                reading,
            } => command(
                code::attempt_filter(NAME),
                rw::attempt_update(
                    &lock_id_name(lock_id),
                    reads(client),
                    self.options_of(client),
                    &marker_of(marker),
                    upgradeable(client),
                    reading.map(lock_id_name).as_deref(),
                ),
            ),
            CommandKey::Renew {
                lock_id,
                client,
                by,
            } => command(
                rw::renew_filter(NAME, &lock_id_name(lock_id), reads(client)),
                match by {
                    0 => rw::renew_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                        reads(client),
                    ),
                    by => rw::extend_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                        reads(client),
                        ticks_ms(by),
                    ),
                },
            ),
            // (A reader-writer lock keeps no window; a writer's cleanup forgets a fair lock's
            // `servedWait`.)
            CommandKey::Release {
                lock_id,
                client,
                cleanup,
            } => command(
                rw::release_filter(NAME, &lock_id_name(lock_id), reads(client)),
                rw::release_update(&lock_id_name(lock_id), reads(client), cleanup),
            ),
            // Only a writer's release hands over, and only to readers.
            CommandKey::Transfer {
                releasing,
                waiter,
                client,
                ..
            } => {
                let (waiter, releasing) = (lock_id_name(waiter), lock_id_name(releasing));
                command(
                    rw::transfer_filter(NAME, &releasing, &waiter),
                    rw::transfer_update(
                        &waiter,
                        self.options_of(client),
                        &releasing,
                        upgradeable(client),
                    ),
                )
            }
            CommandKey::Purge | CommandKey::Write(_) => unreachable!("built as for any kind"),
            CommandKey::RenewMany { .. } | CommandKey::ReadLive { .. } => {
                unreachable!("a semaphore's only")
            }
            CommandKey::Commit { .. } | CommandKey::Checkpoint { .. } => {
                unreachable!("a document lock's only")
            }
        }
    }

    /// The command `key` names for a document lock, as `document_lock/` and the engine build it.
    fn build_for_document_lock(&self, key: CommandKey) -> Command {
        use code::document_lock as document;
        let field = DOCUMENT_LOCK_FIELD;
        let command = |filter, update| Command { filter, update };
        match key {
            CommandKey::Attempt {
                lock_id, client, ..
            } => command(
                document::attempt_filter(NAME, field),
                document::attempt_update(&lock_id_name(lock_id), self.options_of(client), field),
            ),
            CommandKey::Renew {
                lock_id,
                client,
                by,
            } => command(
                document::renew_filter(NAME, &lock_id_name(lock_id), field),
                match by {
                    0 => document::renew_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                        field,
                    ),
                    by => document::extend_update(
                        self.options_of(client),
                        &lock_id_name(lock_id),
                        field,
                        ticks_ms(by),
                    ),
                },
            ),
            // A holder's end without a commit (a lost lease, a guard dropped), or the cleanup
            // after an attempt whose outcome is unknown (any document with the lock id).
            CommandKey::Release {
                lock_id, cleanup, ..
            } => command(
                if cleanup {
                    document::cleanup_filter(&lock_id_name(lock_id), field)
                } else {
                    document::release_filter(NAME, &lock_id_name(lock_id), field)
                },
                document::release_update(&lock_id_name(lock_id), field),
            ),
            // An update of operators, not a pipeline: one element.
            CommandKey::Commit {
                lock_id,
                token,
                replace: false,
            } => command(
                document::commit_filter(NAME, &lock_id_name(lock_id), field),
                vec![document::commit_update(
                    doc! { "$set": { "committedBy": token } },
                    field,
                )],
            ),
            // A whole document (its `_id` is the filter's): one element.
            CommandKey::Commit {
                lock_id,
                token,
                replace: true,
            } => command(
                document::commit_filter(NAME, &lock_id_name(lock_id), field),
                vec![document::replacement(
                    doc! { "committedBy": token },
                    field,
                    token,
                )],
            ),
            // The same filter: `checkpoint` and `commit` share `write_while_held`.
            CommandKey::Checkpoint { lock_id, token } => command(
                document::commit_filter(NAME, &lock_id_name(lock_id), field),
                vec![doc! { "$set": { "checkpointedBy": token } }],
            ),
            CommandKey::Transfer { .. } => unreachable!("a document lock hands nothing over"),
            CommandKey::Purge | CommandKey::Write(_) => unreachable!("built as for any kind"),
            CommandKey::RenewMany { .. } | CommandKey::ReadLive { .. } => {
                unreachable!("a semaphore's only")
            }
        }
    }

    /// What an attempt or a transfer of `client`'s `lock_id` reads from the document it
    /// returned: the token it won, if it won (a reader's: 0, it has none).
    fn won(&self, document: &Document, client: u8, lock_id: u8) -> Option<i64> {
        let lock_id = &lock_id_name(lock_id);
        let won = match self.config.kind {
            Kind::Exclusive => code::attempt_won(document, lock_id),
            Kind::Semaphore(places) => {
                { code::semaphore::won(document, lock_id, self.places_of(client), places.into()) }
                    .expect("the model's callers agree on the count")
            }
            Kind::ReaderWriter => {
                let reads = self.config.callers[usize::from(client)].reads;
                code::reader_writer::won(document, reads, lock_id)
                    .map(|token| if reads { Some(0) } else { token })
            }
            Kind::Document => {
                code::document_lock::won(document, lock_id, DOCUMENT_LOCK_FIELD).map(Some)
            }
        };
        won.map(|token| token.expect("a numeric token"))
    }

    /// Whether the upgrade of `client`'s upgradeable read lease believes it holds the write
    /// lease.
    fn upgraded(&self, state: &State, client: usize) -> bool {
        (0..state.clients.len()).any(|other| {
            self.config.callers[other].upgrades == Some(u8::try_from(client).expect("small"))
                && state.believes_it_holds(other)
        })
    }

    /// Whether `client` reads a reader-writer lock: it has no fencing token.
    fn reads(&self, client: usize) -> bool {
        self.config.kind == Kind::ReaderWriter && self.config.callers[client].reads
    }

    /// Whether `client`'s attempt (placing `marker`, 0 for none) through `router` asks places
    /// that would fit beside the live leases of the semaphore, while another wait's live mark
    /// holds them back.
    fn held_back_by_a_mark(&self, state: &State, router: u8, client: u8, marker: u8) -> bool {
        let Kind::Semaphore(max_count) = self.config.kind else {
            return false;
        };
        let Some(lock) = &state.lock else {
            return false;
        };
        let now = self.server_now(state, router).timestamp_millis();
        let marked = lock.waiting.is_some_and(|(wait, _, expires_at)| {
            expires_at > now && (marker == 0 || wait != marker)
        });
        let taken = lock.live_places(now);
        marked && taken + i64::from(self.places_of(client)) <= i64::from(max_count)
    }

    /// Whether, as router `router` reads the stored line now, the place of another caller that
    /// still waits is live and ahead of the wait `marker` of `client` (anywhere in line, if that
    /// wait has no place): then a fair lock must not let `client` in.
    fn waiter_ahead(&self, state: &State, router: u8, client: u8, marker: u8) -> bool {
        let caller = &self.config.callers[usize::from(client)];
        // (An upgrade passes the line: its writers wait for its reader.)
        if !caller.fair || caller.upgrades.is_some() {
            return false;
        }
        let Some(lock) = &state.lock else {
            return false;
        };
        let now = self.server_now(state, router).timestamp_millis();
        let live = lock.line.iter().filter(|&&(_, end)| end > now);
        let ahead = live.take_while(|&&(wait, _)| wait != marker);
        ahead.into_iter().any(|&(wait, _)| {
            state.clients.iter().enumerate().any(|(other, waiter)| {
                other != usize::from(client)
                    && waiter.wait == Some(wait)
                    && matches!(waiter.phase, Phase::Idle { .. } | Phase::Attempting { .. })
            })
        })
    }

    /// Whether `client`'s attempt through `router` asks places that the semaphore's configured
    /// count would admit beside the live leases, while a count an operator set lower is stored.
    fn fits_the_old_count(&self, state: &State, router: u8, client: u8) -> bool {
        let Kind::Semaphore(max_count) = self.config.kind else {
            return false;
        };
        let Some(lock) = state
            .lock
            .as_ref()
            .filter(|lock| lock.resized_at_ms.is_some())
        else {
            return false;
        };
        let now = self.server_now(state, router).timestamp_millis();
        let taken = lock.live_places(now);
        let places = i64::from(self.places_of(client));
        lock.max_count
            .is_some_and(|count| count < i64::from(max_count))
            && taken + places <= i64::from(max_count)
    }

    /// After an admission through `router`: the places of the live leases (by its clock) fit
    /// the stored count. (A count set lower leaves its holders beyond it, evicting nobody, but
    /// then admits nobody until they fit.)
    fn check_within_count(&self, state: &mut State, router: u8) {
        if !matches!(self.config.kind, Kind::Semaphore(_)) {
            return;
        }
        let Some(lock) = &state.lock else {
            return;
        };
        let now = self.server_now(state, router).timestamp_millis();
        let taken = lock.live_places(now);
        state.admitted_within_count &= lock.max_count.is_some_and(|count| taken <= count);
    }

    /// How many places `client` asks of a semaphore at once.
    fn places_of(&self, client: impl Into<usize>) -> u32 {
        self.config.callers[client.into()].places.into()
    }

    fn mistake(&self, mistake: Mistake) -> bool {
        self.config.mistake == Some(mistake)
    }

    /// The options of `client`'s lock.
    /// Whether every caller whose work stalls (a `max_idle` and no progress) believes it holds
    /// only until `max_idle` after the send of the request that won its lease.
    fn stalled_holders_let_go(&self, state: &State) -> bool {
        (0..state.clients.len()).all(|client| {
            let caller = &self.config.callers[client];
            let (Some(ticks), false) = (caller.max_idle, caller.progresses) else {
                return true;
            };
            match &state.clients[client].phase {
                Phase::Holding(hold) if state.believes_it_holds(client) => {
                    let At(now) = state.at();
                    let At(won_at) = hold.won_at;
                    now < won_at + ticks_ms(ticks)
                }
                _ => true,
            }
        })
    }

    /// Whether a caller of the lock revokes (only then are the revocation checks computed, so
    /// that they split no states elsewhere).
    fn kind_revokes(&self) -> bool {
        self.config.operator_revokes
            || (self.config.callers.iter()).any(|caller| caller.revokes.is_some())
    }

    /// Whether `client`'s wait takes a place in a fair lock's line: a fair lock's caller's,
    /// except a reader's and an upgrade's (which waits with a waiting writer's marker).
    fn in_line(&self, client: u8) -> bool {
        let caller = &self.config.callers[usize::from(client)];
        caller.fair && !caller.reads && caller.upgrades.is_none()
    }

    fn options_of(&self, client: impl Into<usize>) -> &LockOptions {
        &self.options[client.into()]
    }

    /// Whether any caller's lock has a `min_hold`, so that windows are tracked.
    fn windows(&self) -> bool {
        self.config
            .callers
            .iter()
            .any(|caller| caller.min_hold.is_some())
    }

    /// The details `client` stores with its lease: its index, if it stores any.
    fn details_of(&self, client: u8) -> Option<u8> {
        self.config.callers[usize::from(client)]
            .details
            .then_some(client)
    }
}

/// A caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    /// Its process: 0 (clients 0 and 1) or 1.
    pub process: u8,
    /// Its family of locks.
    pub family: u8,
    pub phase: Phase,
    /// Acquisitions it still wants.
    pub rounds: u8,
    /// Whether it waits in line (an attempt of it found the lock busy): a local release may hand
    /// the lock to it.
    pub queued: bool,
    /// An attempt its caller stopped waiting for (its lock id, and what the crate decides of
    /// it): if it wins, it is released.
    pub abandoned: Option<(u8, code::Attempt<At>)>,
    /// The lock id a release in flight is handing the lock over to it with (it keeps polling
    /// meanwhile, as the crate's waiters do).
    pub offer: Option<u8>,
    /// A reader-writer lock's writer that waits: the lock id of its wait's first attempt, which
    /// names its waiting marker (a new wait, a new marker, as the crate's `WaitingWriter`).
    pub wait: Option<u8>,
    /// The marker of a wait its writer's caller left, removed once the attempt it left in
    /// flight has its outcome (that attempt keeps the crate's `WaitingWriter` alive).
    pub removal_after: Option<u8>,
    /// The lease of a transaction given up at its deadline while its renewal was in flight:
    /// the abort goes out once the renewal's reply is in (an abort that overtook the renewal
    /// would find no transaction, and the renewal would open one nobody ends).
    pub abort_after: Option<u8>,
}

/// What a caller is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Attempts at tick `at`.
    Idle {
        at: u8,
    },
    /// Sent an attempt with `lock_id`; waits for its reply.
    Attempting {
        lock_id: u8,
        attempt: code::Attempt<At>,
    },
    Holding(Hold),
    /// Wants nothing more (or its process was shut down).
    Done,
}

/// A held lease as its holder sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    pub lock_id: u8,
    pub token: i64,
    /// The lease as the crate's protocol core keeps it: its local deadline.
    pub lease: code::Lease<At>,
    /// When it renews next.
    pub renewals: code::Renewals<At>,
    /// A renewal in flight.
    pub renewing: Option<code::Sent<At>>,
    /// Whether its next extension by hand ([`Caller::extends`]) is a short one.
    pub short_next: bool,
    pub since: u8,
    /// Its lease-checked transaction, while open.
    pub transaction: Option<Transacting>,
    /// When the request that won it was sent (from then on `max_idle` counts).
    pub won_at: At,
}

/// A holder's open lease-checked transaction, as the crate's `HeldLease::transaction` runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transacting {
    /// Its renewal, as the crate's protocol core keeps it.
    pub renewal: code::Transaction<At>,
    /// Its commit is sent (else its renewal is, and the holder waits for the reply).
    pub committing: bool,
}

/// A transaction's renewal the server applied, pending until the transaction ends: the lock
/// document it wrote (visible at the commit), and from when.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pending {
    pub client: u8,
    pub lock_id: u8,
    pub lock: Option<LockDocument>,
    pub since: u8,
}

/// A message in flight.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Message {
    /// An attempt; a reader-writer lock's writer sends its wait's `marker` (else 0), an upgrade
    /// the lease of the upgradeable reader it upgrades (`reading`).
    Attempt {
        client: u8,
        lock_id: u8,
        sent: u8,
        marker: u8,
        reading: Option<u8>,
    },
    AttemptReply {
        client: u8,
        lock_id: u8,
        won: Option<i64>,
        /// The send of the attempt's lock command that won, when not its first command (a
        /// `lock_or_insert`'s third): the win's lease counts from it.
        relocked: Option<code::Sent<At>>,
    },
    /// A renewal, or with `by` > 0 an extension by that many ticks ([`Caller::extends`]).
    Renew {
        client: u8,
        lock_id: u8,
        sent: code::Sent<At>,
        by: u8,
    },
    RenewReply {
        client: u8,
        lock_id: u8,
        sent: code::Sent<At>,
        live: bool,
        by: u8,
    },
    /// A holder's release, or (`cleanup`) the cleanup of a lease nobody was given: after an
    /// attempt or a transfer whose outcome is unknown, or a win nobody receives (the same
    /// update, but for a `min_hold` window, which a release keeps and a cleanup ends).
    Release {
        client: u8,
        lock_id: u8,
        cleanup: bool,
    },
    /// A release handing the lock over: `from` releases its lease `releasing`, `waiter` is
    /// handed a lease `lock_id` (a fair lock's with the place of its wait `marker`, else 0).
    Transfer {
        from: u8,
        releasing: u8,
        waiter: u8,
        lock_id: u8,
        sent: code::Sent<At>,
        marker: u8,
    },
    TransferReply {
        from: u8,
        waiter: u8,
        lock_id: u8,
        sent: code::Sent<At>,
        token: Option<i64>,
    },
    /// A fenced write to the protected resource.
    Write { client: u8, token: i64 },
    /// A reader-writer lock's writer whose wait ended without the lock removes its marker.
    RemoveMarker { client: u8, marker: u8 },
    /// A document lock's holder commits its work (or replaces the document with it), ending its
    /// lease `lock_id` in the same write.
    Commit {
        client: u8,
        lock_id: u8,
        token: i64,
        replace: bool,
    },
    /// A document lock's holder writes a checkpoint of its work, keeping its lease `lock_id`.
    Checkpoint { client: u8, lock_id: u8, token: i64 },
    /// The insert of a `lock_or_insert` attempt `lock_id` whose first command matched no
    /// unlocked document (answered by the attempt's reply, or followed by its next command, as
    /// its `steps` say).
    Insert {
        client: u8,
        lock_id: u8,
        steps: code::DocumentAttempt,
    },
    /// The lock command of a `lock_or_insert` attempt `lock_id` after it inserted the document,
    /// sent at `sent` (answered by the attempt's reply, or followed by its next command).
    LockInserted {
        client: u8,
        lock_id: u8,
        steps: code::DocumentAttempt,
        sent: code::Sent<At>,
    },
    /// The renewal of two places of a semaphore that holders of one family hold, in one `update`
    /// command: the renewal loop's round for the leases of one process in one document.
    RenewMany {
        clients: [u8; 2],
        lock_ids: [u8; 2],
        sent: code::Sent<At>,
    },
    /// The read that follows a renewal of several leases whose reply did not show each renewed:
    /// which of them are live.
    ReadLive {
        clients: [u8; 2],
        lock_ids: [u8; 2],
        sent: code::Sent<At>,
    },
    RenewManyReply {
        clients: [u8; 2],
        lock_ids: [u8; 2],
        sent: code::Sent<At>,
        live: [bool; 2],
    },
    /// The first write of a lease-checked transaction: the renewal of lease `lock_id`, applied
    /// at once but visible only at the commit; every other write of the lock's document waits
    /// for the transaction's end.
    TransactionRenew { client: u8, lock_id: u8 },
    TransactionRenewReply {
        client: u8,
        lock_id: u8,
        matched: bool,
    },
    /// The commit of the transaction, with its work: a write of the holder's `token` to the
    /// protected resource (not fenced: the renewal in the same transaction is its check).
    TransactionCommit { client: u8, lock_id: u8, token: i64 },
    TransactionCommitReply {
        client: u8,
        lock_id: u8,
        committed: bool,
    },
    /// The transaction's abort: nothing of it applies.
    TransactionAbort { client: u8, lock_id: u8 },
}

impl Message {
    fn has_reply(&self) -> bool {
        matches!(
            self,
            Message::Attempt { .. }
                | Message::Insert { .. }
                | Message::LockInserted { .. }
                | Message::Renew { .. }
                | Message::RenewMany { .. }
                | Message::ReadLive { .. }
                | Message::Transfer { .. }
                | Message::TransactionRenew { .. }
                | Message::TransactionCommit { .. }
        )
    }

    fn is_request(&self) -> bool {
        !matches!(
            self,
            Message::AttemptReply { .. }
                | Message::RenewReply { .. }
                | Message::RenewManyReply { .. }
                | Message::TransferReply { .. }
                | Message::TransactionRenewReply { .. }
                | Message::TransactionCommitReply { .. }
        )
    }

    /// Whether it is a transaction's: never lost or applied twice in the model (the crate's
    /// retries of a transaction are not modelled).
    fn of_a_transaction(&self) -> bool {
        matches!(
            self,
            Message::TransactionRenew { .. }
                | Message::TransactionRenewReply { .. }
                | Message::TransactionCommit { .. }
                | Message::TransactionCommitReply { .. }
                | Message::TransactionAbort { .. }
        )
    }

    /// Whether it is a request that writes the lock's document, and so waits while a
    /// transaction holds it.
    fn writes_the_lock(&self) -> bool {
        self.is_request()
            && !self.of_a_transaction()
            && !matches!(
                self,
                Message::Write { .. } | Message::Insert { .. } | Message::ReadLive { .. }
            )
    }
}

/// A message in flight: its age in ticks, and for a reply, at which age it arrives.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InFlight {
    pub message: Message,
    pub age: u8,
    pub latency: u8,
}

/// The lock document as stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LockDocument {
    pub lock_id: Option<u8>,
    pub expires_at_ms: Option<i64>,
    pub token: Option<i64>,
    /// `minHoldUntil`, as stored (a lock with a `min_hold`).
    pub min_hold_until_ms: Option<i64>,
    /// Whose `details` are stored (the caller's index).
    pub details: Option<u8>,
    /// A semaphore's `maxCount` and `holders` (`expiresAt` and `token` are then the document's
    /// retention and its last token).
    pub max_count: Option<i64>,
    pub holders: Vec<Member>,
    /// A reader-writer lock's leases (`expiresAt` is then the document's retention).
    pub reader_writer: Option<ReaderWriter>,
    /// A document lock's lease (the `lock` field) and the token of the last commit
    /// (`committedBy`).
    pub embedded: Option<EmbeddedLease>,
    pub committed_by: Option<i64>,
    /// A semaphore's waiting mark: the wait it names, the places it holds back, its expiry.
    pub waiting: Option<(u8, i64, i64)>,
    /// When an operator set a semaphore's count (`resizedAt`).
    pub resized_at_ms: Option<i64>,
    /// A fair lock's line: each place's wait and expiry, in order.
    pub line: Vec<(u8, i64)>,
    /// A fair lock's wait the current (or last) lease came from (`servedWait`).
    pub served_wait: Option<u8>,
    /// An exclusive lock's revocation request (`revoke`).
    pub revoke: Option<Revoke>,
}

/// A revocation request, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Revoke {
    /// The asker's wait (`None`: an operator's request).
    pub wait: Option<u8>,
    /// The lease it asks to end.
    pub target: Option<u8>,
    pub grace_until_ms: i64,
    pub expires_at_ms: i64,
    pub priority: i64,
    pub reserves: bool,
}

/// The id the model's operator gives its revocation request.
const OPERATOR_REQUEST: &str = "operator";

/// A reader-writer lock's leases, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReaderWriter {
    /// The readers: each one's lock id and expiry.
    pub readers: Vec<(u8, i64)>,
    /// The `writer` field: a lease, or only the last token once its lease ended.
    pub writer: Option<EmbeddedLease>,
    /// The waiting writer's marker: its wait and expiry.
    pub waiting: Option<(u8, i64)>,
    /// The reader whose lease is upgradeable (`upgradeable: true`), if one is stored (at most
    /// one is: a safety property).
    pub upgradeable: Option<u8>,
}

/// A lease embedded in a field: a reader-writer lock's `writer`, a document lock's `lock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EmbeddedLease {
    pub lock_id: Option<u8>,
    pub expires_at_ms: Option<i64>,
    pub token: Option<i64>,
}

/// A lease among a semaphore's `holders`, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Member {
    pub lock_id: u8,
    pub expires_at_ms: i64,
    pub token: i64,
    /// How many places it takes (`places`, 1 where absent).
    pub places: i64,
    /// A fair semaphore's: the wait whose place in line it came from (`servedWait`).
    pub served_wait: Option<u8>,
}

impl LockDocument {
    /// The places a semaphore's leases live at `now` (server time, in ms) take.
    fn live_places(&self, now: i64) -> i64 {
        (self.holders.iter())
            .filter(|member| member.expires_at_ms > now)
            .map(|member| member.places)
            .sum()
    }

    /// The stored end of the lease `lock_id`, wherever its kind keeps it.
    fn end_of(&self, lock_id: u8) -> Option<i64> {
        let embedded = |lease: &EmbeddedLease| {
            (lease.lock_id == Some(lock_id))
                .then_some(lease.expires_at_ms)
                .flatten()
        };
        if self.lock_id == Some(lock_id) {
            return self.expires_at_ms;
        }
        let member = self.holders.iter().find(|m| m.lock_id == lock_id);
        let reader_writer = self.reader_writer.as_ref().and_then(|rw| {
            let reader = rw.readers.iter().find(|&&(id, _)| id == lock_id);
            reader
                .map(|&(_, end)| end)
                .or_else(|| rw.writer.as_ref().and_then(embedded))
        });
        member
            .map(|m| m.expires_at_ms)
            .or(reader_writer)
            .or_else(|| self.embedded.as_ref().and_then(embedded))
    }

    /// Whether it stores the lease `lock_id`, live or not.
    fn stores(&self, lock_id: u8) -> bool {
        self.lock_id == Some(lock_id)
            || self.holders.iter().any(|m| m.lock_id == lock_id)
            || self.reader_writer.as_ref().is_some_and(|rw| {
                rw.readers.iter().any(|&(id, _)| id == lock_id)
                    || rw.writer.is_some_and(|w| w.lock_id == Some(lock_id))
            })
            || self
                .embedded
                .is_some_and(|lease| lease.lock_id == Some(lock_id))
    }

    /// Whether it stores a lease, live or not.
    fn stores_any(&self) -> bool {
        self.lock_id.is_some()
            || !self.holders.is_empty()
            || self.reader_writer.as_ref().is_some_and(|rw| {
                !rw.readers.is_empty() || rw.writer.is_some_and(|w| w.lock_id.is_some())
            })
            || self.embedded.is_some_and(|lease| lease.lock_id.is_some())
    }
}

impl EmbeddedLease {
    /// As stored: `{id, expiresAt, fencingToken}`, each if present.
    fn stored(self) -> Document {
        let mut field = Document::new();
        if let Some(lock_id) = self.lock_id {
            field.insert("id", lock_id_name(lock_id));
        }
        if let Some(expires_at) = self.expires_at_ms {
            field.insert("expiresAt", DateTime::from_millis(expires_at));
        }
        if let Some(token) = self.token {
            field.insert("fencingToken", token);
        }
        field
    }

    fn read(field: &Document) -> EmbeddedLease {
        EmbeddedLease {
            lock_id: field.get_str("id").ok().map(model_lock_id),
            expires_at_ms: field
                .get_datetime("expiresAt")
                .ok()
                .map(|at| at.timestamp_millis()),
            token: token_of(field.get("fencingToken")),
        }
    }
}

/// The members of a semaphore document's `holders`.
fn members(document: &Document) -> Vec<Member> {
    let Ok(holders) = document.get_array("holders") else {
        return Vec::new();
    };
    holders
        .iter()
        .map(|member| {
            let member = member.as_document().expect("a member is a document");
            Member {
                lock_id: model_lock_id(member.get_str("id").expect("a member's id")),
                expires_at_ms: member
                    .get_datetime("expiresAt")
                    .expect("a member's expiry")
                    .timestamp_millis(),
                token: token_of(member.get("fencingToken")).expect("a member's token"),
                places: token_of(member.get("places")).unwrap_or(1),
                served_wait: member
                    .get_str("servedWait")
                    .ok()
                    .map(|wait| wait[1..].parse().expect("a model wait")),
            }
        })
        .collect()
}

/// A stored token.
fn token_of(value: Option<&Bson>) -> Option<i64> {
    value.map(|token| match token {
        Bson::Int64(token) => *token,
        Bson::Int32(token) => i64::from(*token),
        other => panic!("token {other}"),
    })
}

/// The waiting-writer marker of the wait whose first attempt had lock id `wait`.
fn marker_of(wait: u8) -> String {
    format!("M{wait}")
}

/// The model's number of a lock id (`L<n>`).
fn model_lock_id(name: &str) -> u8 {
    name[1..].parse().expect("a model lock id")
}

/// What a deletion by hand of the lock's document ended. The document's history is gone with
/// it: the next token comes from `$$NOW` alone, of a router whose clock may be behind the earlier
/// holders', so it may be below the earlier tokens, but never below the deletion's time less
/// `max_clock_skew` (× 1,000, a token's unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deletion {
    /// The largest token held before it (`i64::MIN` if none): the deleted lease's, written after
    /// all of those, must exceed it.
    pub held_before: i64,
    /// The largest token held or stored before it (`i64::MIN` if none).
    pub before: i64,
    /// Its real time, in ms since the epoch.
    pub at_ms: i64,
}

/// The details caller `client` stores with its lease.
fn details_of(client: u8) -> Document {
    doc! { "owner": format!("C{client}") }
}

/// What undoes a piece of work: a release of `lock_id` (a cleanup if `cleanup`), sent as
/// `client`'s (through its router).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Undo {
    pub client: u8,
    pub lock_id: u8,
    pub cleanup: bool,
}

/// A family of locks: its work under way, and whether it was shut down.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Family {
    pub work: code::Work<At, Undo>,
    pub shut_down: bool,
}

/// Whether the end of a lease is a cleanup (its `min_hold` window ends with it) rather than a
/// release (the window stays), as the crate's protocol core decides from whether the lease was
/// `delivered` to a caller.
fn ends_at_once(delivered: bool) -> bool {
    !code::keeps_window(delivered)
}

/// The piece of work that tracks the attempt or the transfer of lease `lock_id` in the family
/// that sends it (lock ids are never reused, so neither are pieces).
fn piece(lock_id: u8) -> u64 {
    u64::from(lock_id) * 2
}

/// The piece that tracks a transfer of lease `lock_id` in the waiter's family.
fn receiving_piece(lock_id: u8) -> u64 {
    piece(lock_id) + 1
}

/// The whole system at one instant.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    pub lock: Option<LockDocument>,
    /// The token the protected resource stores (written by fenced writes).
    pub resource: Option<i64>,
    pub clients: Vec<Client>,
    /// Messages in flight (kept sorted: one state per set).
    pub network: Vec<InFlight>,
    /// The latency of the replies the server sends now: 1 tick, or 2 for a slow reply.
    reply_latency: u8,
    pub faults_left: u8,
    pub next_lock_id: u8,
    pub may_cancel: bool,
    pub may_shut_down: bool,
    /// Each family's work under way, as the crate's protocol core keeps it: what its shutdown
    /// waits for and undoes.
    pub families: Vec<Family>,
    /// Transfers whose outcome stayed unknown, undone once settled (family, piece).
    pub settling: Vec<(u8, u64)>,
    /// How far ahead of real time each router's clock reads (R0, R1), in ms.
    pub router_clocks_ms: [i64; 2],
    /// Each process's transfers in a row (of its queue for the lock), as the crate's queue
    /// counts them for `code::handover`.
    pub transfers_in_a_row: [u32; 2],
    pub may_step_clock: bool,
    pub may_pause: bool,
    /// Process 0 stands still until this tick.
    pub paused_until: Option<u8>,
    pub may_force_release: bool,
    pub may_revoke: bool,
    /// Whether the operator's resize ([`Config::resize`]) is still to come.
    pub may_resize: bool,
    /// No semaphore admission left its places beyond the stored count (by the admitting
    /// router's clock).
    pub admitted_within_count: bool,
    /// The lease an operator ended (by a forced release, or by deleting the lock's document),
    /// and when.
    pub forced: Vec<(u8, At)>,
    pub may_delete: bool,
    /// After a deletion by hand, what it ended.
    pub deletion: Option<Deletion>,
    /// For coverage: a token after a deletion by hand was not larger than every earlier one.
    pub token_went_back: bool,
    /// The largest token any holder has held so far (since the deletion by hand, if any).
    pub max_token_held: Option<i64>,
    /// False once a holder got a token not larger than every earlier holder's (after a deletion
    /// by hand: than every holder's since), or a lease written after a deletion by hand a token
    /// below its bound ([`Deletion`]).
    pub tokens_increase: bool,
    /// False once the resource accepted a write with a token older than one it stored.
    pub stale_writes_refused: bool,
    /// False once a caller was handed a lease it was not asking for (it had all it wanted): the
    /// model's bookkeeping of what callers want, checked as a property so that a mistake that
    /// breaks it yields a path, not a crash of the checker.
    pub granted_only_when_asked: bool,
    /// False once a renewal or a release matched a lease that was not its sender's (someone
    /// else's lease renewed or ended: the filters by lock id are what prevents it).
    pub touched_only_own: bool,
    /// False once the holder of a lease an operator ended still believed it held the lock
    /// after handling the reply to a renewal it sent after the end.
    pub told_promptly: bool,
    /// For coverage: the resource refused a write with a token older than the one it stored.
    pub stale_write_refused: bool,
    /// For coverage: a release handed the lock to a local waiter; a lease was taken over after
    /// it ended; a lease won by an attempt whose caller had left was released.
    pub transferred: bool,
    pub taken_over: bool,
    pub abandoned_win_released: bool,
    /// For coverage: a renewal reached the server after another client had taken the lock.
    pub renewal_met_another: bool,
    /// A holder's extension matched its lease but left a later end it did not reach as it was.
    pub extension_kept_a_later_end: bool,
    /// An attempt on a semaphore whose places would have fit was refused for another wait's
    /// mark.
    pub mark_held_places_back: bool,
    /// A semaphore's caller holds several places at once.
    pub several_places_held: bool,
    /// An attempt the semaphore's configured count would admit was refused under a count an
    /// operator set lower.
    pub set_count_kept_an_attempt_out: bool,
    /// No caller of a fair lock took it (by an attempt or a transfer) while the live place of
    /// another caller that still waited was ahead of its own in line.
    pub served_in_line_order: bool,
    /// An attempt found a fair lock free (a fair semaphore with room for what it asks) and
    /// stayed out, a live place of another waiter being ahead of its own (a coverage flag).
    pub line_kept_a_free_lock: bool,
    /// No lease was renewed (or extended) while a live revocation request targeting it had its
    /// grace over.
    pub no_renewal_past_grace: bool,
    /// No caller took the lock (by an attempt or a transfer) while a live request kept it for
    /// another wait.
    pub kept_for_its_asker: bool,
    /// A renewal of a live lease was refused because a request's grace was over.
    pub grace_capped_a_renewal: bool,
    /// An attempt found the lock free but kept for another wait, and did not take it.
    pub reservation_kept_a_free_lock: bool,
    /// A revoking caller took the lock.
    pub asker_took_the_lock: bool,
    /// An operator's request reached a holder.
    pub operator_asked_a_holder: bool,
    /// A holder whose work reports progress held past `max_idle` after its acquisition.
    pub progress_kept_a_lease: bool,
    /// A holder whose work stalls lost its lease.
    pub stalled_holder_lost: bool,
    /// A wait that ended without the lock took its place out of the line (a coverage flag).
    pub place_given_up: bool,
    /// Every lock document stored held at most one upgradeable reader's lease.
    pub one_upgradeable_reader: bool,
    /// An upgrade's attempt found another reader's lease live, and waited (a coverage flag).
    pub upgrade_waited_for_a_reader: bool,
    /// An upgrade won while another writer's marker held new readers back, and left it there
    /// (a coverage flag).
    pub upgrade_left_a_writers_marker: bool,
    /// An upgrade won beside its own live read lease (a coverage flag).
    pub upgraded_beside_its_read: bool,
    /// An upgradeable reader's attempt failed while another's upgradeable lease was live (a
    /// coverage flag).
    pub upgradeable_kept_out_by_another: bool,
    /// For coverage: an operator ended a lease a caller held.
    pub operator_ended_a_held_lease: bool,
    /// For coverage: a transfer applied, but its reply came after a shutdown took its undo.
    pub transfer_undone_by_a_shutdown: bool,
    /// With a `min_hold`: when the server wrote each lease (by lock id): the tick, and the
    /// writing router's clock (its `$$NOW`, in ms).
    pub acquired_at: BTreeMap<u8, (u8, i64)>,
    /// With a `min_hold`: the end of the latest window of a lease handed to a caller, in real
    /// ms and by the clock of the router that wrote it (its `minHoldUntil`).
    pub window_until_ms: Option<(i64, i64)>,
    /// False once a caller was handed a lease the server wrote inside an earlier holder's
    /// `min_hold` window: by the writing router's clock, before the stored end of the window;
    /// or in real time, earlier than its end by more than `max_clock_skew` (the most the routers'
    /// clocks may differ).
    pub min_hold_kept: bool,
    /// For coverage: a cleanup ended a lease nobody was given inside its window, window and all.
    pub cleanup_ended_a_window: bool,
    /// False once the end of a lease nobody was given left the lock taken by its window.
    pub cleanups_keep_no_window: bool,
    /// With a `min_hold`: the leases handed to a caller (by lock id).
    pub delivered: BTreeSet<u8>,
    pub may_crash: bool,
    /// Process 0 crashed: its callers do nothing more.
    pub crashed: bool,
    /// False once an attempt won a lease whose document carried details that were not its
    /// caller's (another holder's left behind, or none where it stores some).
    pub details_are_the_holders: bool,
    /// For coverage: an attempt won over a document holding another caller's details.
    pub details_replaced: bool,
    pub may_purge: bool,
    /// Which of [`others`] a purge deleted.
    pub others_deleted: [bool; 3],
    /// For coverage: an attempt found no holder, yet the lock taken by a `min_hold` window (its
    /// holder's lease ended early: released, forced or crashed).
    pub window_kept_an_attempt_out: bool,
    /// For coverage: a transfer gave its waiter a lease with a `min_hold` window.
    pub transfer_wrote_a_window: bool,
    /// False once a document lock holder's write (`commit`, `replace`, `checkpoint`) applied
    /// without its sender's live lease, or after a commit with a newer token.
    pub commits_while_held: bool,
    /// For coverage: a holder's write was refused, its lease over.
    pub commit_refused: bool,
    /// For coverage: a `replace` applied; a `checkpoint` applied; one refused after its lease
    /// ended (not overtaken by its sender's own end).
    pub replaced: bool,
    pub checkpointed: bool,
    pub checkpoint_refused: bool,
    /// For coverage: an operator's forced release of one reader-writer lease ended a reader's.
    pub operator_ended_a_reader: bool,
    /// For coverage: a `lock_or_insert` inserted the document; one found it there.
    pub inserted: bool,
    pub insert_refused: bool,
    /// For coverage: the places of one family were renewed in one command; the read after such
    /// a renewal found one of them gone and the other live.
    pub renewed_together: bool,
    pub read_found_one_gone: bool,
    /// A lease-checked transaction's renewal, applied and pending until the transaction ends.
    pub transaction: Option<Pending>,
    /// Writes of the lock's document that wait for the open transaction's end, in arrival
    /// order.
    pub blocked: Vec<Message>,
    /// False once a transaction's work committed after a later holder's write to the
    /// resource, or without its lease stored.
    pub transactions_in_order: bool,
    /// For coverage: a transaction committed; a write waited for one; a transaction's work was
    /// not committed because its lease's deadline passed first.
    pub transaction_committed: bool,
    pub write_waited_for_a_transaction: bool,
    pub transaction_given_up_at_the_deadline: bool,
    /// For coverage: a transaction's renewal that its holder had given up on the way matched,
    /// and opened the transaction.
    pub late_renewal_opened_a_transaction: bool,
}

impl State {
    fn now_ms(&self) -> i64 {
        i64::from(self.now) * TICK_MS
    }

    /// Now, on the clients' clock.
    fn at(&self) -> At {
        At::tick(self.now)
    }

    /// Whether `client` holds the lock by its own account: a lease its protocol core does not
    /// count as lost.
    pub fn believes_it_holds(&self, client: usize) -> bool {
        matches!(&self.clients[client].phase, Phase::Holding(hold) if !is_lost(hold.lease, self.at()))
    }

    /// Whether the transaction open on the server, if any, is one its holder still ends: it
    /// runs it, will abort it once its renewal's reply is in, or its commit or abort is on its
    /// way. (Else it holds the lock's document, and every writer waits, until the server's
    /// lifetime limit.)
    fn open_transaction_owned(&self) -> bool {
        let Some(pending) = &self.transaction else {
            return true;
        };
        let (client, lock_id) = (pending.client, pending.lock_id);
        let caller = &self.clients[usize::from(client)];
        let runs_it = matches!(
            &caller.phase,
            Phase::Holding(hold) if hold.lock_id == lock_id && hold.transaction.is_some()
        );
        let ends_it = |message: &Message| {
            matches!(
                *message,
                Message::TransactionCommit { client: c, lock_id: l, .. }
                | Message::TransactionAbort { client: c, lock_id: l } if (c, l) == (client, lock_id)
            )
        };
        runs_it
            || caller.abort_after == Some(lock_id)
            || self
                .network
                .iter()
                .any(|in_flight| ends_it(&in_flight.message))
    }

    /// Whether `client` holds the lease an operator ended, by a forced release or a deletion by
    /// hand (it hears of it at its next renewal).
    fn ended_by_operator(&self, client: usize) -> bool {
        matches!(
            &self.clients[client].phase,
            Phase::Holding(hold) if self.forced.iter().any(|&(forced, _)| hold.lock_id == forced)
        )
    }

    fn send(&mut self, message: Message) {
        let latency = if message.is_request() {
            0
        } else {
            self.reply_latency
        };
        self.network.push(InFlight {
            message,
            age: 0,
            latency,
        });
        self.network.sort();
    }

    /// The client is done with an acquisition: it wants another, or nothing more.
    fn next_round(&mut self, client: usize) {
        let now = self.now;
        let caller = &mut self.clients[client];
        caller.phase = if caller.rounds > 0 {
            Phase::Idle { at: now + 1 }
        } else {
            Phase::Done
        };
    }
}

/// Why a caller stops waiting for its attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leave {
    /// Its reply limit passed.
    NoReply,
    /// It was cancelled.
    Cancelled,
    /// A transfer handed it the lock meanwhile.
    Transferred,
    /// Its provider shuts down.
    ShutDown,
}

/// What can happen next. What a client must do at a given time (attempt, renew, presume its
/// lease lost, give up on a reply, release after its `hold_ticks`) it does as the tick
/// begins, in a fixed order: those steps are local and commute, and fixing their order keeps the
/// state space small without losing behaviours.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Time advances one tick (only when no request has been in flight for `max_delay`); the
    /// replies in flight arrive.
    Tick,
    /// A request reaches the server, which applies it and replies (a slow reply arrives a tick
    /// later than the others).
    Deliver { index: usize, slow: bool },
    /// A fault: the message is lost; a request's sender, or a reply's receiver, sees an error.
    Lose(usize),
    /// A fault: the message is lost silently (a half-open connection): nobody hears of it.
    Hang(usize),
    /// A fault: the request is applied, and stays in flight to be applied again.
    Duplicate(usize),
    /// The caller stops waiting during its attempt.
    Cancel(usize),
    /// A family of locks of process 0 is shut down ([`Config::shut_down`]).
    ShutDown(u8),
    /// A router's clock steps ([`Config::clock_step`]).
    StepClock,
    /// Process 0 stands still ([`Config::pause`]).
    Pause,
    /// An operator forces the lock's release ([`Config::force_release`]).
    ForceRelease,
    /// An operator asks the holder to let go ([`Config::operator_revokes`]).
    OperatorRevokes,
    /// Process 0 crashes ([`Config::crash`]).
    Crash,
    /// An operator purges the collection ([`Config::purge`]).
    Purge,
    /// An operator deletes the lock's document by hand ([`Config::delete_by_hand`]).
    DeleteByHand,
    /// An operator sets a semaphore's count ([`Config::resize`]).
    Resize,
}

impl LeaseProtocol {
    /// Whether the lock is kept for another wait than `client`'s (`marker`): a live request that
    /// reserves it, of another wait, is stored (as seen through `router`).
    fn reserved_for_other(&self, state: &State, router: u8, client: u8, marker: u8) -> bool {
        let now = self.server_now(state, router).timestamp_millis();
        let ours = (self.config.callers[usize::from(client)].revokes.is_some()).then_some(marker);
        let request = state.lock.as_ref().and_then(|lock| lock.revoke);
        request.is_some_and(|request| {
            request.expires_at_ms > now && request.reserves && request.wait != ours
        })
    }

    /// Whether the renewals of lease `lock_id` are capped: a live request targets it and its
    /// grace is over (as seen through `router`).
    fn capped(&self, state: &State, router: u8, lock_id: u8) -> bool {
        let now = self.server_now(state, router).timestamp_millis();
        let lock = state.lock.as_ref();
        let holds = lock.is_some_and(|lock| {
            lock.lock_id == Some(lock_id)
                || (lock.holders.iter()).any(|member| member.lock_id == lock_id)
        });
        holds
            && lock.and_then(|lock| lock.revoke).is_some_and(|request| {
                request.expires_at_ms > now
                    && request.target == Some(lock_id)
                    && request.grace_until_ms <= now
            })
    }

    fn server_now(&self, state: &State, router: u8) -> DateTime {
        let ahead = state.router_clocks_ms[usize::from(router)];
        DateTime::from_millis(EPOCH_MS + state.now_ms() + ahead)
    }

    fn router_of(state: &State, client: u8) -> u8 {
        state.clients[usize::from(client)].process
    }

    fn stored(state: &State) -> Document {
        let mut document = doc! { "_id": NAME };
        if let Some(lock) = &state.lock {
            if let Some(lock_id) = lock.lock_id {
                document.insert("lockId", lock_id_name(lock_id));
            }
            if let Some(expires_at) = lock.expires_at_ms {
                document.insert("expiresAt", DateTime::from_millis(expires_at));
            }
            if let Some(token) = lock.token {
                document.insert("fencingToken", token);
            }
            if let Some(until) = lock.min_hold_until_ms {
                document.insert("minHoldUntil", DateTime::from_millis(until));
            }
            if let Some(wait) = lock.served_wait {
                document.insert("servedWait", marker_of(wait));
            }
            if let Some(request) = lock.revoke {
                let mut stored = doc! {
                    "id": request.wait.map_or_else(|| OPERATOR_REQUEST.to_owned(), marker_of),
                    "graceUntil": DateTime::from_millis(request.grace_until_ms),
                    "expiresAt": DateTime::from_millis(request.expires_at_ms),
                    "priority": request.priority,
                    "reserves": request.reserves,
                };
                if let Some(target) = request.target {
                    stored.insert("target", lock_id_name(target));
                }
                document.insert("revoke", stored);
            }
            if !lock.line.is_empty() {
                let line: Vec<Document> = (lock.line.iter())
                    .map(|&(wait, expires_at)| {
                        doc! { "id": marker_of(wait), "expiresAt": DateTime::from_millis(expires_at) }
                    })
                    .collect();
                document.insert("line", line);
            }
            if let Some(client) = lock.details {
                document.insert("details", details_of(client));
            }
            if let Some(max_count) = lock.max_count {
                document.insert("maxCount", max_count);
                let holders: Vec<Document> = lock
                    .holders
                    .iter()
                    .map(|member| {
                        let mut stored = doc! {
                            "id": lock_id_name(member.lock_id),
                            "expiresAt": DateTime::from_millis(member.expires_at_ms),
                            "fencingToken": member.token,
                        };
                        if let Some(wait) = member.served_wait {
                            stored.insert("servedWait", marker_of(wait));
                        }
                        if member.places > 1 {
                            stored.insert("places", member.places);
                        }
                        stored
                    })
                    .collect();
                document.insert("holders", holders);
                if let Some(at) = lock.resized_at_ms {
                    document.insert("resizedAt", DateTime::from_millis(at));
                }
                if let Some((wait, places, expires_at)) = lock.waiting {
                    document.insert(
                        "waiting",
                        doc! {
                            "id": marker_of(wait),
                            "places": places,
                            "expiresAt": DateTime::from_millis(expires_at),
                        },
                    );
                }
            }
            if let Some(rw) = &lock.reader_writer {
                let readers: Vec<Document> = rw
                    .readers
                    .iter()
                    .map(|&(lock_id, expires_at)| {
                        let mut reader = doc! {
                            "id": lock_id_name(lock_id),
                            "expiresAt": DateTime::from_millis(expires_at),
                        };
                        if rw.upgradeable == Some(lock_id) {
                            reader.insert("upgradeable", true);
                        }
                        reader
                    })
                    .collect();
                document.insert("readers", readers);
                if let Some(writer) = rw.writer {
                    document.insert("writer", writer.stored());
                }
                if let Some((client, expires_at)) = rw.waiting {
                    document.insert(
                        "waitingWriter",
                        doc! { "id": marker_of(client), "expiresAt": DateTime::from_millis(expires_at) },
                    );
                }
            }
            if let Some(lease) = lock.embedded {
                document.insert(DOCUMENT_LOCK_FIELD, lease.stored());
            }
            if let Some(token) = lock.committed_by {
                document.insert("committedBy", token);
            }
        }
        document
    }

    fn store(state: &mut State, document: &Document) {
        let upgradeable = document.get_array("readers").map_or(0, |readers| {
            (readers.iter())
                .filter(|reader| {
                    reader
                        .as_document()
                        .is_some_and(|reader| reader.get_bool("upgradeable") == Ok(true))
                })
                .count()
        });
        state.one_upgradeable_reader &= upgradeable <= 1;
        let line = document.get_array("line").map_or_else(
            |_| Vec::new(),
            |line| {
                (line.iter())
                    .map(|place| {
                        let place = place.as_document().expect("a place is a document");
                        let id = place.get_str("id").expect("a place's id");
                        let expires_at = place.get_datetime("expiresAt").expect("an expiry");
                        (
                            id[1..].parse().expect("a model wait"),
                            expires_at.timestamp_millis(),
                        )
                    })
                    .collect()
            },
        );
        let revoke = document.get_document("revoke").ok().map(|request| {
            let id = request.get_str("id").expect("a request's id");
            let date = |field| {
                (request.get_datetime(field))
                    .expect("a request's dates")
                    .timestamp_millis()
            };
            Revoke {
                wait: (id != OPERATOR_REQUEST).then(|| id[1..].parse().expect("a model wait")),
                target: request.get_str("target").ok().map(model_lock_id),
                grace_until_ms: date("graceUntil"),
                expires_at_ms: date("expiresAt"),
                priority: token_of(request.get("priority")).expect("a priority"),
                reserves: request.get_bool("reserves").expect("reserves"),
            }
        });
        state.lock = Some(LockDocument {
            revoke,
            line,
            served_wait: document
                .get_str("servedWait")
                .ok()
                .map(|wait| wait[1..].parse().expect("a model wait")),
            lock_id: document.get_str("lockId").ok().map(model_lock_id),
            expires_at_ms: document
                .get_datetime("expiresAt")
                .ok()
                .map(|at| at.timestamp_millis()),
            token: token_of(document.get("fencingToken")),
            min_hold_until_ms: document
                .get_datetime("minHoldUntil")
                .ok()
                .map(|at| at.timestamp_millis()),
            details: document.get_document("details").ok().map(|details| {
                let owner = details.get_str("owner").expect("a model owner");
                owner[1..].parse().expect("a model client")
            }),
            max_count: document.get("maxCount").map(|count| match count {
                Bson::Int64(count) => *count,
                other => panic!("maxCount {other}"),
            }),
            holders: members(document),
            reader_writer: document
                .get_array("readers")
                .ok()
                .map(|readers| ReaderWriter {
                    readers: readers
                        .iter()
                        .map(|reader| {
                            let reader = reader.as_document().expect("a reader is a document");
                            let expires_at = reader.get_datetime("expiresAt").expect("an expiry");
                            let id = reader.get_str("id").expect("a reader's id");
                            (model_lock_id(id), expires_at.timestamp_millis())
                        })
                        .collect(),
                    upgradeable: readers.iter().find_map(|reader| {
                        let reader = reader.as_document()?;
                        (reader.get_bool("upgradeable") == Ok(true))
                            .then(|| model_lock_id(reader.get_str("id").expect("a reader's id")))
                    }),
                    writer: document
                        .get_document("writer")
                        .ok()
                        .map(EmbeddedLease::read),
                    waiting: document.get_document("waitingWriter").ok().map(|marker| {
                        let id = marker.get_str("id").expect("a marker's id");
                        let expires_at = marker.get_datetime("expiresAt").expect("an expiry");
                        (
                            id[1..].parse().expect("a model client"),
                            expires_at.timestamp_millis(),
                        )
                    }),
                }),
            embedded: document
                .get_document(DOCUMENT_LOCK_FIELD)
                .ok()
                .map(EmbeddedLease::read),
            committed_by: token_of(document.get("committedBy")),
            resized_at_ms: document
                .get_datetime("resizedAt")
                .ok()
                .map(|at| at.timestamp_millis()),
            waiting: document.get_document("waiting").ok().map(|mark| {
                let id = mark.get_str("id").expect("a mark's id");
                let places = token_of(mark.get("places")).expect("a mark's places");
                let expires_at = mark.get_datetime("expiresAt").expect("an expiry");
                (
                    id[1..].parse().expect("a model wait"),
                    places,
                    expires_at.timestamp_millis(),
                )
            }),
        });
    }

    /// Runs an update command (`findAndModify` returning the document after it, or `update`) on
    /// the lock document: the new document if `filter` matched (or `upsert` created it).
    fn update(
        &self,
        state: &mut State,
        router: u8,
        filter: &Document,
        pipeline: &[Document],
        upsert: bool,
    ) -> Option<Document> {
        // MongoDB refuses an upsert whose filter holds `$expr` (error 224), whether or not a
        // document matches: a command the crate sends so is a mistake the model must not hide.
        assert!(
            !(upsert && filter.contains_key("$expr")),
            "MongoDB refuses $expr in an upsert's filter: {filter}"
        );
        let now = self.server_now(state, router);
        let existing = state.lock.is_some().then(|| Self::stored(state));
        let target = match existing {
            Some(document) if eval::matches(filter, &document, now) => document,
            Some(_) => return None,
            None if upsert => doc! { "_id": NAME },
            None => return None,
        };
        let updated = eval::apply_pipeline(pipeline, &target, now);
        // A lease that ended by expiring (not by a release, which removes the lock id).
        let expired_before = target.contains_key("lockId")
            && target
                .get_datetime("expiresAt")
                .is_ok_and(|expires_at| *expires_at <= now);
        if expired_before && updated.get("lockId") != target.get("lockId") {
            state.taken_over = true;
        }
        if self.config.kind == Kind::Document {
            let lease = |document: &Document| {
                document
                    .get_document(DOCUMENT_LOCK_FIELD)
                    .ok()
                    .map(EmbeddedLease::read)
            };
            let (before, after) = (lease(&target), lease(&updated));
            let expired = before.is_some_and(|lease| {
                lease.lock_id.is_some()
                    && lease
                        .expires_at_ms
                        .is_some_and(|until| until <= now.timestamp_millis())
            });
            state.taken_over |= expired
                && after.and_then(|lease| lease.lock_id) != before.and_then(|lease| lease.lock_id);
        }
        if matches!(self.config.kind, Kind::Semaphore(_)) {
            Self::admitted(state, &target, &updated, now);
        }
        // A lease an operator ended that a duplicate of its own attempt wrote again (a request
        // applied twice, which MongoDB's retryable writes prevent, but the model allows): live on
        // the server once more, so its holder holds it, neither exempt nor owed a loss.
        let stored_before: Vec<bool> = (state.forced.iter())
            .map(|&(lock_id, _)| state.lock.as_ref().is_some_and(|lock| lock.stores(lock_id)))
            .collect();
        // A lease written after a deletion by hand: its token starts over from `$$NOW`, by the
        // assumption on the routers' clocks no earlier than the deletion less their skew.
        if let Some(deletion) = state.deletion
            && updated.get("lockId") != target.get("lockId")
            && updated.contains_key("lockId")
        {
            let token = updated.get_i64("fencingToken").expect("a numeric token");
            let skew = self.options[0].max_clock_skew().as_millis();
            let skew = i64::try_from(skew).expect("small");
            state.tokens_increase &= token >= (deletion.at_ms - skew) * 1_000;
            state.token_went_back |= token <= deletion.before;
        }
        if self.windows()
            && updated.get("lockId") != target.get("lockId")
            && let Ok(lock_id) = updated.get_str("lockId")
        {
            let lock_id = lock_id[1..].parse().expect("a model lock id");
            let written = (state.now, now.timestamp_millis() - EPOCH_MS);
            state.acquired_at.entry(lock_id).or_insert(written);
        }
        Self::store(state, &updated);
        let mut before = stored_before.into_iter();
        state.forced.retain(|&(lock_id, _)| {
            let written_again = !before.next().unwrap_or(true)
                && state.lock.as_ref().is_some_and(|lock| lock.stores(lock_id));
            !written_again
        });
        Some(updated)
    }

    /// A semaphore command turned `target` into `updated`: each lease it admitted must have a
    /// token above every token admitted before (the semaphore's tokens increase in the order the
    /// server admits its holders, who may hear of it in another order); an admission that
    /// dropped an expired lease took a place over.
    fn admitted(state: &mut State, target: &Document, updated: &Document, now: DateTime) {
        let before = members(target);
        let expired = before
            .iter()
            .any(|member| member.expires_at_ms <= now.timestamp_millis());
        for member in members(updated) {
            if before.iter().any(|old| old.lock_id == member.lock_id) {
                continue;
            }
            state.taken_over |= expired;
            state.tokens_increase &= state.max_token_held.is_none_or(|max| member.token > max);
            state.max_token_held = Some(
                state
                    .max_token_held
                    .map_or(member.token, |max| max.max(member.token)),
            );
        }
    }

    /// Runs an update of operators (`update`, not a pipeline) on the lock document: whether
    /// `filter` matched.
    fn apply_operators(
        &self,
        state: &mut State,
        router: u8,
        filter: &Document,
        update: &Document,
    ) -> bool {
        self.write_matching(state, router, filter, |document| {
            eval::apply_operators(update, &document)
        })
    }

    /// Stores what `write` makes of the lock document if `filter` matches it (by `router`'s
    /// clock): whether it matched.
    fn write_matching(
        &self,
        state: &mut State,
        router: u8,
        filter: &Document,
        write: impl FnOnce(Document) -> Document,
    ) -> bool {
        let now = self.server_now(state, router);
        let document = Self::stored(state);
        let matched = state.lock.is_some() && eval::matches(filter, &document, now);
        if matched {
            Self::store(state, &write(document));
        }
        matched
    }

    fn planted_token(&self, update: Vec<Document>) -> Vec<Document> {
        if self.mistake(Mistake::TokenNotIncremented) {
            keep_the_stored_token(update)
        } else {
            update
        }
    }

    /// Applies a document lock holder's write of its work (`commit`, `replace`, `checkpoint`)
    /// of `client`'s lease `lock_id`, whose token is `token`.
    fn deliver_holder_write(
        &self,
        state: &mut State,
        client: u8,
        lock_id: u8,
        token: i64,
        key: CommandKey,
    ) {
        let write = self.command(key);
        let router = Self::router_of(state, client);
        let now = self.server_now(state, router);
        // What the filter is for: the sender's own lease, live by this router's clock; and then
        // each holder's writes come after the previous holder's commit, in token order.
        let held = state
            .lock
            .as_ref()
            .and_then(|lock| lock.embedded)
            .is_some_and(|lease| {
                lease.lock_id == Some(lock_id)
                    && lease
                        .expires_at_ms
                        .is_some_and(|until| until > now.timestamp_millis())
            });
        let before = state.lock.as_ref().and_then(|lock| lock.committed_by);
        let applied = match key {
            CommandKey::Commit { replace: true, .. } => {
                self.replace(state, router, &write.filter, &write.update[0])
            }
            _ => self.apply_operators(state, router, &write.filter, &write.update[0]),
        };
        if applied {
            let in_order = before.is_none_or(|before| before < token);
            state.commits_while_held &= held && in_order;
            match key {
                CommandKey::Commit { replace: true, .. } => state.replaced = true,
                CommandKey::Checkpoint { .. } => state.checkpointed = true,
                _ => {}
            }
        } else if let CommandKey::Checkpoint { .. } = key {
            // (Not overtaken by its sender's own commit or replace: after its lease ended.)
            let own_end_first =
                state.lock.as_ref().and_then(|lock| lock.committed_by) == Some(token);
            state.checkpoint_refused |= !held && !own_end_first;
        } else {
            state.commit_refused |= !held;
        }
    }

    /// The reply to `client`'s renewal of its lease `lock_id` sent at `sent` (with `by` > 0, its
    /// extension by that many ticks): still `live`, or not (the crate's renewal loop,
    /// `renewed`, and a guard's `extend`).
    fn renewal_answered(
        &self,
        state: &mut State,
        client: u8,
        lock_id: u8,
        sent: code::Sent<At>,
        live: bool,
        by: u8,
    ) {
        let client = usize::from(client);
        let now = state.at();
        let Phase::Holding(hold) = &mut state.clients[client].phase else {
            return;
        };
        if hold.lock_id != lock_id || hold.renewing != Some(sent) {
            return;
        }
        hold.renewing = None;
        // The crate's extension rule: only a lease whose deadline has not passed is
        // extended, from the renewal's (or the extension's) send.
        let options = &self.options[client];
        let extended = match by {
            0 => live && hold.lease.confirmed(options, sent, now),
            by => {
                let by = Duration::from_millis(ticks_ms(by).unsigned_abs());
                live && hold.lease.extended(options, by, sent, now)
            }
        };
        if !extended {
            self.lost(state, client);
        }
        // Sent after an operator ended this lease: its reply must have told the holder.
        if state
            .forced
            .iter()
            .any(|&(forced, at)| forced == lock_id && sent.at() > at)
            && state.believes_it_holds(client)
        {
            state.told_promptly = false;
        }
    }

    /// `client`'s renewal of its lease `lock_id` failed: it renews again (its deadline still
    /// stands).
    fn renewal_failed(&self, state: &mut State, client: u8, lock_id: u8) {
        let now = state.at();
        if let Phase::Holding(hold) = &mut state.clients[usize::from(client)].phase
            && hold.lock_id == lock_id
        {
            hold.renewing = None;
            hold.renewals.retry_soon(self.options_of(client), now);
        }
    }

    /// The writes that waited for a transaction apply, in their order, once it ended.
    fn release_blocked(&self, state: &mut State) {
        for message in std::mem::take(&mut state.blocked) {
            self.deliver(state, message);
        }
    }

    /// Runs a `replace` (`replaceOne`) of the lock document: `replacement`, with the stored
    /// `_id`, if `filter` matched.
    fn replace(
        &self,
        state: &mut State,
        router: u8,
        filter: &Document,
        replacement: &Document,
    ) -> bool {
        self.write_matching(state, router, filter, |document| {
            let mut replaced = doc! { "_id": document.get("_id").cloned().unwrap_or(Bson::Null) };
            replaced.extend(replacement.clone());
            replaced
        })
    }

    /// Applies a message that reached its destination.
    fn deliver(&self, state: &mut State, message: Message) {
        // A write of the lock's document waits while a transaction holds it (MongoDB: "the
        // write waits until the transaction ends").
        if state.transaction.is_some() && message.writes_the_lock() {
            state.write_waited_for_a_transaction = true;
            state.blocked.push(message);
            return;
        }
        match message {
            Message::Attempt {
                client,
                lock_id,
                sent: _,
                marker,
                reading,
            } => {
                let details = self.details_of(client);
                let attempt = self.command(CommandKey::Attempt {
                    lock_id,
                    client,
                    marker,
                    reading,
                });
                let router = Self::router_of(state, client);
                let replaced_details = state.lock.as_ref().and_then(|lock| lock.details);
                // (A coverage flag: kept false without a window, so that it splits no states.)
                let window_alone = self.windows()
                    && state.lock.as_ref().is_some_and(|lock| {
                        lock.lock_id.is_none()
                            && lock.min_hold_until_ms.is_some_and(|until| {
                                until > self.server_now(state, router).timestamp_millis()
                            })
                    });
                // Whether the places asked would fit beside the live leases, but for another
                // wait's mark (a coverage flag, computed only for a semaphore with a mark).
                let fits_but_for_a_mark = self.held_back_by_a_mark(state, router, client, marker);
                let fits_the_old_count = self.fits_the_old_count(state, router, client);
                let stored_before = state.lock.as_ref().is_some_and(|lock| lock.stores(lock_id));
                let ahead = self.waiter_ahead(state, router, client, marker);
                let reserved = self.reserved_for_other(state, router, client, marker);
                let free = state.lock.as_ref().is_none_or(|lock| {
                    let now = self.server_now(state, router).timestamp_millis();
                    match self.config.kind {
                        // (A semaphore: the places asked fit beside the live leases.)
                        Kind::Semaphore(max_count) => {
                            lock.live_places(now) + i64::from(self.places_of(client))
                                <= i64::from(max_count)
                        }
                        // (A reader-writer lock: no live writer nor marker, and for a writer
                        // no live reader.)
                        Kind::ReaderWriter => lock.reader_writer.as_ref().is_none_or(|rw| {
                            let ended = |end: Option<i64>| end.is_none_or(|end| end <= now);
                            (self.reads(usize::from(client))
                                || rw.readers.iter().all(|&(_, end)| end <= now))
                                && ended(rw.writer.and_then(|writer| writer.expires_at_ms))
                                && ended(rw.waiting.map(|(_, end)| end))
                        }),
                        _ => {
                            lock.lock_id.is_none()
                                || lock.expires_at_ms.is_some_and(|end| end <= now)
                        }
                    }
                });
                // (A document lock's attempt is no upsert: it matches an unlocked document or
                // nothing, and then the lock is busy.)
                let upsert = self.config.kind != Kind::Document;
                let won = self
                    .update(state, router, &attempt.filter, &attempt.update, upsert)
                    .and_then(|document| self.won(&document, client, lock_id));
                state.window_kept_an_attempt_out |= window_alone && won.is_none();
                state.mark_held_places_back |= fits_but_for_a_mark && won.is_none();
                state.set_count_kept_an_attempt_out |= fits_the_old_count && won.is_none();
                // (An attempt applied again finds its lease there: no admission.)
                if won.is_some() && !stored_before {
                    self.check_within_count(state, router);
                }
                state.several_places_held |=
                    won.is_some() && self.config.callers[usize::from(client)].places > 1;
                state.served_in_line_order &= won.is_none() || !ahead || stored_before;
                state.line_kept_a_free_lock |= ahead && free && won.is_none();
                state.kept_for_its_asker &= won.is_none() || !reserved || stored_before;
                state.reservation_kept_a_free_lock |= reserved && free && won.is_none();
                if self.config.callers[usize::from(client)].revokes.is_some() && won.is_some() {
                    state.asker_took_the_lock = true;
                }
                if reading.is_some() {
                    self.cover_upgrade(state, router, marker, won.is_some());
                }
                let caller = &self.config.callers[usize::from(client)];
                if caller.upgradeable && won.is_none() {
                    let now = self.server_now(state, router).timestamp_millis();
                    let rw = state
                        .lock
                        .as_ref()
                        .and_then(|lock| lock.reader_writer.as_ref());
                    state.upgradeable_kept_out_by_another |= rw.is_some_and(|rw| {
                        rw.readers
                            .iter()
                            .any(|&(id, end)| rw.upgradeable == Some(id) && end > now)
                    });
                }
                if won.is_some() {
                    self.check_details(state, details, replaced_details);
                }
                if won.is_none() && self.config.kind == Kind::Document {
                    // No unlocked document matched: what comes next is the crate's.
                    let steps = code::DocumentAttempt::new(self.config.lock_or_insert);
                    self.document_step(state, client, lock_id, steps, steps.no_match());
                    return;
                }
                state.send(Message::AttemptReply {
                    client,
                    lock_id,
                    won,
                    relocked: None,
                });
            }
            Message::Insert {
                client,
                lock_id,
                mut steps,
            } => {
                // The caller's document, unless one exists (a duplicate `_id`, locked or not).
                let duplicate = state.lock.is_some();
                if duplicate {
                    state.insert_refused = true;
                } else {
                    let inserted = code::document_lock::insertion_of(
                        doc! { "status": "new" },
                        NAME,
                        DOCUMENT_LOCK_FIELD,
                    )
                    .expect("the model's new document is valid");
                    Self::store(state, &inserted);
                    state.inserted = true;
                }
                let step = steps.inserted(duplicate);
                self.document_step(state, client, lock_id, steps, step);
            }
            Message::LockInserted {
                client,
                lock_id,
                steps,
                sent,
            } => {
                let attempt = self.command(CommandKey::Attempt {
                    lock_id,
                    client,
                    marker: 0,
                    reading: None,
                });
                let router = Self::router_of(state, client);
                let won = self
                    .update(state, router, &attempt.filter, &attempt.update, false)
                    .and_then(|document| self.won(&document, client, lock_id));
                if won.is_none() {
                    self.document_step(state, client, lock_id, steps, steps.no_match());
                    return;
                }
                state.send(Message::AttemptReply {
                    client,
                    lock_id,
                    won,
                    relocked: Some(sent),
                });
            }
            Message::AttemptReply {
                client,
                lock_id,
                won,
                relocked,
            } => {
                let reply = match won {
                    Some(_) => code::Reply::Won,
                    None => code::Reply::Busy,
                };
                let client = usize::from(client);
                self.attempt_answered(state, client, lock_id, reply, won, relocked);
            }
            Message::Renew {
                client,
                lock_id,
                sent,
                by,
            } => {
                let renew = self.command(CommandKey::Renew {
                    lock_id,
                    client,
                    by,
                });
                let router = Self::router_of(state, client);
                let (ours, any) = state.lock.as_ref().map_or((false, false), |lock| {
                    (lock.stores(lock_id), lock.stores_any())
                });
                let end_before = state.lock.as_ref().and_then(|lock| lock.end_of(lock_id));
                let capped = self.kind_revokes() && self.capped(state, router, lock_id);
                let lease_live = state.lock.as_ref().is_some_and(|lock| {
                    let now = self.server_now(state, router).timestamp_millis();
                    lock.end_of(lock_id).is_some_and(|end| end > now)
                });
                let live = self
                    .update(state, router, &renew.filter, &renew.update, false)
                    .is_some();
                state.no_renewal_past_grace &= !(capped && live);
                state.grace_capped_a_renewal |= capped && lease_live && !live;
                let end_after = state.lock.as_ref().and_then(|lock| lock.end_of(lock_id));
                state.extension_kept_a_later_end |=
                    by > 0 && live && end_before.is_some() && end_before == end_after;
                state.renewal_met_another |= any && !ours;
                if live && !ours {
                    state.touched_only_own = false;
                }
                state.send(Message::RenewReply {
                    client,
                    lock_id,
                    sent,
                    live,
                    by,
                });
            }
            Message::RenewReply {
                client,
                lock_id,
                sent,
                live,
                by,
            } => self.renewal_answered(state, client, lock_id, sent, live, by),
            Message::RenewMany {
                clients,
                lock_ids,
                sent,
            } => {
                let renew = self.command(CommandKey::RenewMany { lock_ids });
                let router = Self::router_of(state, clients[0]);
                let ours = state
                    .lock
                    .as_ref()
                    .is_some_and(|lock| lock_ids.iter().any(|&lock_id| lock.stores(lock_id)));
                // The leases whose renewals a revocation's grace caps, and their ends.
                let capped: Vec<(u8, Option<i64>)> = (lock_ids.iter())
                    .filter(|&&lock_id| self.kind_revokes() && self.capped(state, router, lock_id))
                    .map(|&lock_id| {
                        (
                            lock_id,
                            state.lock.as_ref().and_then(|lock| lock.end_of(lock_id)),
                        )
                    })
                    .collect();
                let matched = self
                    .update(state, router, &renew.filter, &renew.update, false)
                    .is_some();
                for (lock_id, before) in capped {
                    let after = state.lock.as_ref().and_then(|lock| lock.end_of(lock_id));
                    state.no_renewal_past_grace &= after == before;
                    state.grace_capped_a_renewal |= after == before;
                }
                if matched && !ours {
                    state.touched_only_own = false;
                }
                state.renewed_together = true;
                // The crate's decision: all renewed, or a read to tell which.
                if code::renewed_every_lease(Some(i64::from(matched)), lock_ids.len()) {
                    state.send(Message::RenewManyReply {
                        clients,
                        lock_ids,
                        sent,
                        live: [true; 2],
                    });
                } else {
                    state.send(Message::ReadLive {
                        clients,
                        lock_ids,
                        sent,
                    });
                }
            }
            Message::ReadLive {
                clients,
                lock_ids,
                sent,
            } => {
                let read = self.command(CommandKey::ReadLive { lock_ids });
                let router = Self::router_of(state, clients[0]);
                let now = self.server_now(state, router);
                let stored: Vec<Document> =
                    state.lock.iter().map(|_| Self::stored(state)).collect();
                let rows = eval::aggregate(&read.update, &stored, now);
                let live_ids: Vec<String> = (rows.iter())
                    .filter_map(|row| row.get_array("ours").ok())
                    .flatten()
                    .filter_map(|lock_id| lock_id.as_str().map(str::to_owned))
                    .collect();
                let live = lock_ids.map(|lock_id| live_ids.contains(&lock_id_name(lock_id)));
                state.read_found_one_gone |= live[0] != live[1];
                state.send(Message::RenewManyReply {
                    clients,
                    lock_ids,
                    sent,
                    live,
                });
            }
            Message::RenewManyReply {
                clients,
                lock_ids,
                sent,
                live,
            } => {
                for index in 0..2 {
                    self.renewal_answered(
                        state,
                        clients[index],
                        lock_ids[index],
                        sent,
                        live[index],
                        0,
                    );
                }
            }
            Message::Release {
                client,
                lock_id,
                cleanup,
            } => {
                let release = self.command(CommandKey::Release {
                    lock_id,
                    cleanup,
                    client,
                });
                let router = Self::router_of(state, client);
                let server_now = self.server_now(state, router).timestamp_millis();
                let in_window = state.lock.as_ref().is_some_and(|lock| {
                    lock.lock_id == Some(lock_id)
                        && lock
                            .min_hold_until_ms
                            .is_some_and(|until| until > server_now)
                });
                let ours = state.lock.as_ref().is_some_and(|lock| lock.stores(lock_id));
                let ended = self
                    .update(state, router, &release.filter, &release.update, false)
                    .is_some();
                if ended && !ours {
                    state.touched_only_own = false;
                }
                // However the crate chose to end it (`code::keeps_window`): a lease never handed to
                // a caller, ended inside its window.
                if ended && in_window && !state.delivered.contains(&lock_id) {
                    state.cleanup_ended_a_window |= cleanup;
                    // Nobody ran under that lease: nothing of its window may stay.
                    state.cleanups_keep_no_window &= state
                        .lock
                        .as_ref()
                        .is_some_and(|lock| lock.expires_at_ms.is_some_and(|at| at <= server_now));
                }
            }
            Message::Transfer {
                from,
                releasing,
                waiter,
                lock_id,
                sent,
                marker,
            } => {
                let details = self.details_of(waiter);
                let transfer = self.command(CommandKey::Transfer {
                    releasing,
                    waiter: lock_id,
                    client: waiter,
                    marker,
                });
                let router = Self::router_of(state, waiter);
                let ahead = self.waiter_ahead(state, router, waiter, marker);
                let reserved = self.reserved_for_other(state, router, waiter, marker);
                let replaced_details = state.lock.as_ref().and_then(|lock| lock.details);
                let stored_before = state.lock.as_ref().is_some_and(|lock| lock.stores(lock_id));
                let token = self
                    .update(state, router, &transfer.filter, &transfer.update, false)
                    .and_then(|document| self.won(&document, waiter, lock_id));
                state.kept_for_its_asker &= token.is_none() || !reserved || stored_before;
                if token.is_some() {
                    self.check_details(state, details, replaced_details);
                    state.served_in_line_order &= !ahead || stored_before;
                    if !stored_before {
                        self.check_within_count(state, router);
                    }
                    state.transfer_wrote_a_window |= state
                        .lock
                        .as_ref()
                        .is_some_and(|lock| lock.min_hold_until_ms.is_some());
                }
                state.send(Message::TransferReply {
                    from,
                    waiter,
                    lock_id,
                    sent,
                    token,
                });
            }
            Message::TransferReply {
                from,
                waiter,
                lock_id,
                sent,
                token,
            } => {
                let waiter = usize::from(waiter);
                // As the crate's release decides (`code::transfer_answered`): a transfer whose
                // undo the releasing family's shutdown took hands nothing on.
                let reply = match token {
                    Some(_) => code::TransferReply::Applied,
                    None => code::TransferReply::NotApplied,
                };
                let releasing_family = Self::family_of(state, from);
                let releasing_family = &mut state.families[releasing_family];
                let settled = reply != code::TransferReply::Applied
                    || releasing_family.work.settle(piece(lock_id));
                releasing_family.work.finish(piece(lock_id));
                let family = Self::family_of(state, u8::try_from(waiter).expect("small"));
                state.families[family].work.finish(receiving_piece(lock_id));
                let step = code::transfer_answered(reply, settled);
                // (Not a duplicate's second reply, whose piece is gone without a shutdown.)
                state.transfer_undone_by_a_shutdown |=
                    !settled && state.families[Self::family_of(state, from)].shut_down;
                if state.clients[waiter].offer != Some(lock_id) {
                    return;
                }
                state.clients[waiter].offer = None;
                let token = token.filter(|_| step.hand_over);
                if token.is_some()
                    && matches!(state.clients[waiter].phase, Phase::Holding(_) | Phase::Done)
                    && !self.mistake(Mistake::TransferToALeaver)
                {
                    // Its own attempt won first (possible only when the lease the transfer
                    // replaced ended early, by an operator): the crate drops the transferred
                    // guard undelivered, which ends that lease at once.
                    state.send(Message::Release {
                        client: u8::try_from(waiter).expect("small"),
                        lock_id,
                        cleanup: ends_at_once(false),
                    });
                    return;
                }
                if let Some(token) = token {
                    state.transferred = true;
                    // An attempt of its own still in flight is abandoned: if it wins after all,
                    // it is released.
                    self.leave_attempt(state, waiter, Leave::Transferred);
                    self.hold(state, waiter, lock_id, token, sent);
                }
            }
            Message::Commit {
                client,
                lock_id,
                token,
                replace,
            } => {
                let key = CommandKey::Commit {
                    lock_id,
                    token,
                    replace,
                };
                self.deliver_holder_write(state, client, lock_id, token, key);
            }
            Message::Checkpoint {
                client,
                lock_id,
                token,
            } => {
                let key = CommandKey::Checkpoint { lock_id, token };
                self.deliver_holder_write(state, client, lock_id, token, key);
            }
            Message::RemoveMarker { client, marker } => {
                let router = Self::router_of(state, client);
                if self.in_line(client) {
                    let (filter, pipeline) = code::line_removal(NAME, &marker_of(marker));
                    let removed = self.update(state, router, &filter, &pipeline, false);
                    state.place_given_up |= removed.is_some();
                    return;
                }
                let revokes = self.config.callers[usize::from(client)].revokes.is_some();
                let (filter, update) = match self.config.kind {
                    Kind::Exclusive if revokes => code::revoke_removal(NAME, &marker_of(marker)),
                    Kind::Semaphore(_) => code::semaphore::marker_removal(NAME, &marker_of(marker)),
                    _ => code::reader_writer::remove_marker(NAME, &marker_of(marker)),
                };
                self.apply_operators(state, router, &filter, &update);
            }
            Message::TransactionRenew { client, lock_id } => {
                // The renewal's command, as the crate's transaction builds it (the renewal of one
                // lease), applied in the transaction: kept apart until the commit.
                let renew = self.command(CommandKey::Renew {
                    lock_id,
                    client,
                    by: 0,
                });
                let router = Self::router_of(state, client);
                let before = state.lock.clone();
                let ours = before.as_ref().is_some_and(|lock| lock.stores(lock_id));
                let matched = self
                    .update(state, router, &renew.filter, &renew.update, false)
                    .is_some();
                let written = std::mem::replace(&mut state.lock, before);
                if matched && !ours {
                    state.touched_only_own = false;
                }
                // Its holder gave it up on the way (the lease's deadline passed first).
                let given_up = !matches!(
                    &state.clients[usize::from(client)].phase,
                    Phase::Holding(hold) if hold.lock_id == lock_id && hold.transaction.is_some()
                );
                state.late_renewal_opened_a_transaction |= matched && given_up;
                if matched {
                    state.transaction = Some(Pending {
                        client,
                        lock_id,
                        lock: written,
                        since: state.now,
                    });
                }
                state.send(Message::TransactionRenewReply {
                    client,
                    lock_id,
                    matched,
                });
            }
            Message::TransactionRenewReply {
                client,
                lock_id,
                matched,
            } => {
                let sender = client;
                let client = usize::from(client);
                let at = state.at();
                // Given up at its deadline: the abort follows the renewal's outcome.
                if state.clients[client].abort_after == Some(lock_id) {
                    state.clients[client].abort_after = None;
                    state.send(Message::TransactionAbort {
                        client: sender,
                        lock_id,
                    });
                    return;
                }
                let Phase::Holding(hold) = &mut state.clients[client].phase else {
                    return;
                };
                let Some(transaction) = hold.transaction.as_mut() else {
                    return;
                };
                if hold.lock_id != lock_id || transaction.committing {
                    return;
                }
                // The work is done at once; it is committed unless the lease's deadline passed
                // first (the crate's `is_lost` before the commit).
                if matched && !is_lost(hold.lease, at) {
                    transaction.committing = true;
                    let token = hold.token;
                    state.send(Message::TransactionCommit {
                        client: sender,
                        lock_id,
                        token,
                    });
                } else {
                    // Not ours any more: the crate aborts and reports the lease lost; its
                    // renewal loop finds out at its next round.
                    hold.transaction = None;
                    state.send(Message::TransactionAbort {
                        client: sender,
                        lock_id,
                    });
                }
            }
            Message::TransactionCommit {
                client,
                lock_id,
                token,
            } => {
                let committed = match state.transaction.take() {
                    Some(pending) if pending.client == client && pending.lock_id == lock_id => {
                        // Nothing else wrote the lock meanwhile, and the work comes after every
                        // earlier holder's write.
                        let ours = state.lock.as_ref().is_some_and(|lock| lock.stores(lock_id));
                        let in_order = state.resource.is_none_or(|stored| stored < token);
                        state.transactions_in_order &= ours && in_order;
                        state.lock = pending.lock;
                        state.resource = Some(token);
                        state.transaction_committed = true;
                        true
                    }
                    // Aborted by the server (its lifetime limit): nothing applies.
                    other => {
                        state.transaction = other;
                        false
                    }
                };
                state.send(Message::TransactionCommitReply {
                    client,
                    lock_id,
                    committed,
                });
                self.release_blocked(state);
            }
            Message::TransactionCommitReply {
                client,
                lock_id,
                committed,
            } => {
                let client = usize::from(client);
                let at = state.at();
                let Phase::Holding(hold) = &mut state.clients[client].phase else {
                    return;
                };
                let Some(transaction) = hold.transaction else {
                    return;
                };
                if hold.lock_id != lock_id || !transaction.committing {
                    return;
                }
                hold.transaction = None;
                // The crate's protocol core: the lease counts from the renewal's send.
                if committed
                    && !transaction
                        .renewal
                        .committed(&mut hold.lease, &self.options[client], at)
                {
                    self.lost(state, client);
                }
            }
            Message::TransactionAbort { client, lock_id } => {
                if state
                    .transaction
                    .as_ref()
                    .is_some_and(|pending| pending.client == client && pending.lock_id == lock_id)
                {
                    state.transaction = None;
                    self.release_blocked(state);
                }
            }
            Message::Write { client: _, token } => {
                let resource = match state.resource {
                    Some(stored) => doc! { "_id": "resource", DEFAULT_FENCE_FIELD: stored },
                    None => doc! { "_id": "resource" },
                };
                let write = self.command(CommandKey::Write(token));
                let stale = state.resource.is_some_and(|stored| stored >= token);
                if eval::matches(&write.filter, &resource, DateTime::from_millis(EPOCH_MS)) {
                    if stale {
                        state.stale_writes_refused = false;
                    }
                    let written = eval::apply_operators(&write.update[0], &resource);
                    state.resource = written.get_i64(DEFAULT_FENCE_FIELD).ok();
                } else if stale {
                    state.stale_write_refused = true;
                }
            }
        }
    }

    /// The next command of `client`'s document lock attempt `lock_id`, `step`, as the crate's
    /// protocol core orders them (`code::DocumentAttempt`, whose state is `steps`): the insert,
    /// the lock command after it (sent now, counted from now), or the attempt's reply that the
    /// lock is busy. The read of whether a matching document exists is no command in the model:
    /// its document is there from the start unless callers insert it, and nobody deletes it, so
    /// the read finds it and the lock is busy.
    fn document_step(
        &self,
        state: &mut State,
        client: u8,
        lock_id: u8,
        steps: code::DocumentAttempt,
        step: code::DocumentStep,
    ) {
        let message = match step {
            code::DocumentStep::Insert => Message::Insert {
                client,
                lock_id,
                steps,
            },
            code::DocumentStep::Lock => Message::LockInserted {
                client,
                lock_id,
                steps,
                sent: code::Sent::now(state.at()),
            },
            code::DocumentStep::CheckExists | code::DocumentStep::Busy => Message::AttemptReply {
                client,
                lock_id,
                won: None,
                relocked: None,
            },
        };
        state.send(message);
    }

    /// What becomes of the reply to `client`'s attempt `lock_id` (`token`: the one it won, if
    /// it won), as the crate's [`code::Attempt`] decides: the undo goes out, a win nobody waits
    /// for is released, and a caller that still waits holds the lock, waits in line, or tries
    /// again.
    fn attempt_answered(
        &self,
        state: &mut State,
        client: usize,
        lock_id: u8,
        reply: code::Reply,
        token: Option<i64>,
        relocked: Option<code::Sent<At>>,
    ) {
        // The attempt is work of its family until its outcome is in: a win whose undo the
        // family's shutdown took is released, not handed out.
        let work = &mut state.families[usize::from(state.clients[client].family)].work;
        let settled = code::settled(reply, || work.settle(piece(lock_id)));
        work.finish(piece(lock_id));
        let caller = &mut state.clients[client];
        let (step, request) = match (&mut caller.phase, &mut caller.abandoned) {
            (
                Phase::Attempting {
                    lock_id: awaited,
                    attempt,
                },
                _,
            ) if *awaited == lock_id => (attempt.answered(reply, settled), attempt.request()),
            (_, Some((abandoned, attempt))) if *abandoned == lock_id => {
                let answered = (attempt.answered(reply, settled), attempt.request());
                caller.abandoned = None;
                if let Some(marker) = caller.removal_after.take() {
                    state.send(Message::RemoveMarker {
                        client: u8::try_from(client).expect("small"),
                        marker,
                    });
                }
                answered
            }
            _ => return,
        };
        // A win's lease counts from the send of the lock command that won it.
        let request = relocked.unwrap_or(request);
        let id = u8::try_from(client).expect("small");
        if step.undo {
            state.send(Message::Release {
                client: id,
                lock_id,
                cleanup: ends_at_once(false),
            });
        }
        if step.release {
            // Won after its caller left: the guard is dropped undelivered, which releases it.
            state.abandoned_win_released = true;
            state.send(Message::Release {
                client: id,
                lock_id,
                cleanup: ends_at_once(false),
            });
        }
        let now = state.now;
        match step.tell {
            code::Tell::Lease => {
                let token = token.expect("a win has a token");
                self.hold(state, client, lock_id, token, request);
            }
            code::Tell::Busy => {
                // (An upgrade, and an upgradeable reader, wait in no line.)
                let caller = &self.config.callers[client];
                let queues = caller.upgrades.is_none() && !caller.upgradeable;
                let caller = &mut state.clients[client];
                caller.queued = queues;
                caller.phase = Phase::Idle {
                    at: now + POLL_TICKS,
                };
            }
            code::Tell::Error | code::Tell::NoReply => {
                state.clients[client].phase = Phase::Idle { at: now + 1 };
            }
            code::Tell::Nothing => {}
        }
    }

    /// `client` holds the lease `lock_id` with `token`, won by `request`: its deadline and its
    /// renewals as the crate's protocol core keeps them.
    fn hold(
        &self,
        state: &mut State,
        client: usize,
        lock_id: u8,
        token: i64,
        request: code::Sent<At>,
    ) {
        // A lease an operator ended before its winner heard of the win is exempt: by design its
        // holder believes it holds it until its first renewal's reply (fencing covers that).
        let ended_early = state.forced.iter().any(|&(forced, _)| forced == lock_id);
        // (A semaphore's are checked at admission; a reader has none.)
        let exclusive = !matches!(self.config.kind, Kind::Semaphore(_)) && !self.reads(client);
        if exclusive && state.max_token_held.is_some_and(|max| token <= max) && !ended_early {
            state.tokens_increase = false;
        }
        match state.deletion {
            _ if !exclusive => {}
            // The deleted lease, handed to its winner after the deletion: written after every
            // lease held before it, and compared with those only (the tokens since start over).
            Some(deletion) if ended_early => {
                state.tokens_increase &= token > deletion.held_before;
            }
            _ => {
                state.max_token_held =
                    Some(state.max_token_held.map_or(token, |max| max.max(token)));
            }
        }
        let options = &self.options[client];
        if self.windows() {
            // Every acquisition, with a window of its own or not, must come after the windows
            // of the leases handed out before it.
            state.delivered.insert(lock_id);
            let (tick, by_router) = state.acquired_at[&lock_id];
            let acquired_ms = i64::from(tick) * TICK_MS;
            let skew = i64::try_from(options.max_clock_skew().as_millis()).expect("small");
            if let Some((until, until_by_router)) = state.window_until_ms
                && (acquired_ms < until - skew || by_router < until_by_router)
            {
                state.min_hold_kept = false;
            }
        }
        if let Some(ticks) = self.config.callers[client].min_hold {
            let (tick, by_router) = state.acquired_at[&lock_id];
            let acquired_ms = i64::from(tick) * TICK_MS;
            let window = i64::from(ticks) * TICK_MS;
            let (until, until_by_router) = (acquired_ms + window, by_router + window);
            state.window_until_ms = Some(match state.window_until_ms {
                Some((before, before_by_router)) => {
                    (before.max(until), before_by_router.max(until_by_router))
                }
                None => (until, until_by_router),
            });
        }
        let (now, at) = (state.now, state.at());
        let rounds = state.clients[client].rounds.checked_sub(1);
        state.granted_only_when_asked &= rounds.is_some();
        let lease = code::Lease::won(options, request, at);
        let mut renewals = code::Renewals::new(at);
        renewals.lease_added(lease.renew_by(options).unwrap_or(at), false);
        let caller = &mut state.clients[client];
        caller.rounds = rounds.unwrap_or(0);
        caller.queued = false;
        caller.wait = None; // (a writer's marker went with its win)
        // A lease-checked transaction starts with its renewal.
        let transacts =
            self.config.kind == Kind::Exclusive && self.config.callers[client].transaction;
        let transaction = transacts.then(|| Transacting {
            renewal: code::Transaction::renewal_sent(at),
            committing: false,
        });
        caller.phase = Phase::Holding(Hold {
            lock_id,
            token,
            lease,
            renewals,
            renewing: None,
            short_next: false,
            since: now,
            transaction,
            won_at: request.at(),
        });
        // The holder writes to the protected resource at once, with its token (a reader has none
        // and does not write; a document lock's holder writes with its commit, and may write a
        // checkpoint first; a holder that runs a transaction writes in it).
        let sender = u8::try_from(client).expect("small");
        if transacts {
            state.send(Message::TransactionRenew {
                client: sender,
                lock_id,
            });
        } else if self.config.kind == Kind::Document {
            if self.config.callers[client].checkpoints {
                state.send(Message::Checkpoint {
                    client: sender,
                    lock_id,
                    token,
                });
            }
        } else if !self.reads(client) {
            state.send(Message::Write {
                client: sender,
                token,
            });
        }
    }

    /// The holder presumes its lease lost: it stops, and its release goes out anyway. A
    /// transaction waiting for its renewal's reply is aborted (the crate's `unless_lost`); one
    /// whose commit is sent waits for the commit's outcome (the crate's `commit` does not watch
    /// the lease), and its holder is done.
    fn lost(&self, state: &mut State, client: usize) {
        let caller = &self.config.callers[client];
        state.stalled_holder_lost |= caller.max_idle.is_some() && !caller.progresses;
        if let Phase::Holding(hold) = &state.clients[client].phase {
            let lock_id = hold.lock_id;
            let renewal_in_flight = hold
                .transaction
                .is_some_and(|transaction| !transaction.committing);
            if renewal_in_flight {
                state.transaction_given_up_at_the_deadline = true;
                if self.mistake(Mistake::AbortAtOnce) {
                    state.send(Message::TransactionAbort {
                        client: u8::try_from(client).expect("small"),
                        lock_id,
                    });
                } else {
                    state.clients[client].abort_after = Some(lock_id);
                }
            }
            state.send(Message::Release {
                client: u8::try_from(client).expect("small"),
                lock_id,
                cleanup: ends_at_once(true),
            });
            state.next_round(client);
        }
    }

    /// The outcome of `message` is unknown to its sender (lost, or its reply lost): what the
    /// crate does then.
    fn failed(&self, state: &mut State, message: &Message) {
        match *message {
            // The attempt's cleanup goes out at once, and the caller tries again.
            Message::Attempt {
                client, lock_id, ..
            }
            | Message::Insert {
                client, lock_id, ..
            }
            | Message::LockInserted {
                client, lock_id, ..
            }
            | Message::AttemptReply {
                client, lock_id, ..
            } => {
                let unknown = code::Reply::Unknown;
                self.attempt_answered(state, usize::from(client), lock_id, unknown, None, None);
            }
            // The renewal failed: the holder renews again (its deadline still stands).
            Message::Renew {
                client, lock_id, ..
            }
            | Message::RenewReply {
                client, lock_id, ..
            } => self.renewal_failed(state, client, lock_id),
            Message::RenewMany {
                clients, lock_ids, ..
            }
            | Message::ReadLive {
                clients, lock_ids, ..
            }
            | Message::RenewManyReply {
                clients, lock_ids, ..
            } => {
                for index in 0..2 {
                    self.renewal_failed(state, clients[index], lock_ids[index]);
                }
            }
            // As the crate's release decides: the waiter's lease, if the transfer took effect, is
            // ended at once, and it waits on; the whole transfer is undone once settled.
            Message::Transfer {
                from,
                waiter,
                lock_id,
                ..
            }
            | Message::TransferReply {
                from,
                waiter,
                lock_id,
                ..
            } => {
                if state.crashed && state.clients[usize::from(from)].process == 0 {
                    return; // nobody is left to hear of it
                }
                let step = code::transfer_answered(code::TransferReply::Unknown, true);
                let family = Self::family_of(state, waiter);
                state.families[family].work.finish(receiving_piece(lock_id));
                if state.clients[usize::from(waiter)].offer == Some(lock_id) {
                    state.clients[usize::from(waiter)].offer = None;
                }
                if step.undo_waiters {
                    state.send(Message::Release {
                        client: waiter,
                        lock_id,
                        cleanup: ends_at_once(false),
                    });
                }
                let releasing_family = u8::try_from(Self::family_of(state, from)).expect("small");
                if step.undo_when_settled {
                    state.settling.push((releasing_family, piece(lock_id)));
                    state.settling.sort_unstable();
                } else {
                    state.families[usize::from(releasing_family)]
                        .work
                        .finish(piece(lock_id));
                }
            }
            // A lost release leaves the lease to its expiry; a lost write is just not applied.
            // A lost commit too: the lease ends at its expiry, the work is not written; a lost
            // checkpoint is not written. A lost marker removal leaves the marker to its expiry.
            Message::Release { .. }
            | Message::Write { .. }
            | Message::Commit { .. }
            | Message::Checkpoint { .. }
            | Message::RemoveMarker { .. } => {}
            // Never faulted (`Message::of_a_transaction`).
            Message::TransactionRenew { .. }
            | Message::TransactionRenewReply { .. }
            | Message::TransactionCommit { .. }
            | Message::TransactionCommitReply { .. }
            | Message::TransactionAbort { .. } => {}
        }
    }

    /// Does what each client must do by now: attempt, give up on a reply, presume its lease lost,
    /// renew, release after its `hold_ticks`.
    fn run_due(&self, state: &mut State) {
        self.run_work(state);
        for client in 0..state.clients.len() {
            let (now, at) = (state.now, state.at());
            if state.clients[client].process == 0
                && state.paused_until.is_some_and(|until| now < until)
            {
                continue; // standing still
            }
            let id = u8::try_from(client).expect("small");
            // An upgrade attempts only while its upgradeable reader holds, and its wait ends when
            // that lease is lost (the crate's `upgrade` returns `LockLost`).
            let waits = matches!(
                state.clients[client].phase,
                Phase::Idle { .. } | Phase::Attempting { .. }
            );
            let reading = match self.config.callers[client].upgrades {
                Some(reader) if waits => match self.held_lease(state, usize::from(reader)) {
                    Some(lease) => Some(lease),
                    None => {
                        self.upgrade_without_its_reader(state, client, usize::from(reader));
                        continue;
                    }
                },
                _ => None,
            };
            // A caller whose work makes progress reports it at every tick it holds.
            if self.config.callers[client].progresses
                && let Phase::Holding(hold) = &mut state.clients[client].phase
            {
                let held = hold.lease.progressed(&self.options[client], at);
                let idle = self.config.callers[client].max_idle.map_or(0, ticks_ms);
                state.progress_kept_a_lease |= held && at.0 >= hold.won_at.0 + idle;
            }
            match state.clients[client].phase.clone() {
                Phase::Idle { at: due } if due <= now => {
                    let lock_id = state.next_lock_id;
                    state.next_lock_id += 1;
                    let attempt = code::Attempt::sent(&self.options[client], at, None);
                    state.clients[client].phase = Phase::Attempting { lock_id, attempt };
                    let family = usize::from(state.clients[client].family);
                    state.families[family].work.track(
                        piece(lock_id),
                        vec![Undo {
                            client: id,
                            lock_id,
                            cleanup: ends_at_once(false),
                        }],
                        Some(self.settle_by(at)),
                    );
                    let marks = match self.config.kind {
                        Kind::ReaderWriter => !self.reads(client),
                        Kind::Semaphore(_) => {
                            self.config.callers[client].places > 1
                                || self.config.callers[client].fair
                        }
                        Kind::Exclusive => {
                            self.config.callers[client].fair
                                || self.config.callers[client].revokes.is_some()
                        }
                        Kind::Document => false,
                    };
                    let marker = if marks {
                        *state.clients[client].wait.get_or_insert(lock_id)
                    } else {
                        0
                    };
                    state.send(Message::Attempt {
                        client: id,
                        lock_id,
                        sent: now,
                        marker,
                        reading,
                    });
                }
                Phase::Attempting { attempt, .. } if at >= attempt.reply_limit() => {
                    self.leave_attempt(state, client, Leave::NoReply);
                }
                Phase::Holding(hold) if is_lost(hold.lease, at) => self.lost(state, client),
                // (Not while its transaction is open: the transaction borrows the guard.)
                // (Nor while its upgrade is under way: the upgrade borrows the guard.)
                Phase::Holding(hold)
                    if now >= hold.since + self.config.callers[client].hold_ticks
                        && hold.transaction.is_none()
                        && !self.upgrade_under_way(state, client) =>
                {
                    self.release(state, client);
                }
                // The renewal loop keeps off a lease inside a transaction, which renews it.
                Phase::Holding(hold)
                    if hold.renewing.is_none()
                        && hold.transaction.is_none()
                        && at >= hold.renewals.due_at([]) =>
                {
                    // The renewal loop's round renews every lease of the family in it; the places
                    // of a semaphore that one family holds go in one command.
                    let partner = self.renewal_partner(state, client);
                    let mut round = |client: usize| {
                        let Phase::Holding(hold) = &mut state.clients[client].phase else {
                            unreachable!("holding");
                        };
                        let sent = hold.renewals.round_sent(&self.options[client], at);
                        hold.renewing = Some(sent);
                        (u8::try_from(client).expect("small"), hold.lock_id, sent)
                    };
                    let (_, lock_id, sent) = round(client);
                    match partner {
                        Some(other) => {
                            let (other_id, other_lock_id, _) = round(other);
                            let ((first, first_lock), (second, second_lock)) = if id < other_id {
                                ((id, lock_id), (other_id, other_lock_id))
                            } else {
                                ((other_id, other_lock_id), (id, lock_id))
                            };
                            state.send(Message::RenewMany {
                                clients: [first, second],
                                lock_ids: [first_lock, second_lock],
                                sent,
                            });
                        }
                        None => {
                            // A holder that keeps its lease by hand extends it instead.
                            let caller = &self.config.callers[client];
                            let Phase::Holding(hold) = &mut state.clients[client].phase else {
                                unreachable!("holding");
                            };
                            let by = match caller.extends {
                                Some(_) if hold.short_next => SHORT_EXTENSION_TICKS,
                                Some(long) => long,
                                None => 0,
                            };
                            hold.short_next = caller.extends.is_some() && !hold.short_next;
                            state.send(Message::Renew {
                                client: id,
                                lock_id,
                                sent,
                                by,
                            });
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// What an upgrade's attempt (of the wait whose marker is `marker`) met, as router `router`
    /// reads the stored lock after it: for the coverage flags.
    fn cover_upgrade(&self, state: &mut State, router: u8, marker: u8, won: bool) {
        let now = self.server_now(state, router).timestamp_millis();
        let Some(rw) = state
            .lock
            .as_ref()
            .and_then(|lock| lock.reader_writer.as_ref())
        else {
            return;
        };
        let live_readers = rw.readers.iter().filter(|&&(_, end)| end > now).count();
        let others_marker = rw
            .waiting
            .is_some_and(|(wait, end)| wait != marker && end > now);
        state.upgrade_waited_for_a_reader |= !won && live_readers > 1;
        state.upgraded_beside_its_read |= won && live_readers == 1;
        state.upgrade_left_a_writers_marker |= won && others_marker;
    }

    /// The lease `client` holds and believes live, if it does.
    fn held_lease(&self, state: &State, client: usize) -> Option<u8> {
        match &state.clients[client].phase {
            Phase::Holding(hold) if !is_lost(hold.lease, state.at()) => Some(hold.lock_id),
            _ => None,
        }
    }

    /// Whether the upgrade of `client`'s upgradeable read lease is still to be done.
    fn upgrade_under_way(&self, state: &State, client: usize) -> bool {
        (0..state.clients.len()).any(|other| {
            self.config.callers[other].upgrades == Some(u8::try_from(client).expect("small"))
                && state.clients[other].phase != Phase::Done
        })
    }

    /// The upgrade `client` finds its upgradeable `reader` holding nothing: it waits for the
    /// lease to be won; once that lease has been lost (its holder is done), the upgrade's wait
    /// ends as the crate's does on the lost signal: an attempt in flight is left (its cleanup
    /// goes out, a late win is released), and the waiting marker is removed once no attempt is
    /// in flight.
    fn upgrade_without_its_reader(&self, state: &mut State, client: usize, reader: usize) {
        if state.clients[reader].phase != Phase::Done {
            return; // not won yet
        }
        if matches!(state.clients[client].phase, Phase::Attempting { .. }) {
            self.leave_attempt(state, client, Leave::Cancelled);
        }
        let caller = &mut state.clients[client];
        if let Some(marker) = caller.wait.take() {
            match caller.abandoned {
                Some(_) => caller.removal_after = Some(marker),
                None => state.send(Message::RemoveMarker {
                    client: u8::try_from(client).expect("small"),
                    marker,
                }),
            }
        }
        let caller = &mut state.clients[client];
        caller.rounds = 0;
        caller.phase = Phase::Done;
    }

    /// Another holder of a semaphore's place in `client`'s family whose lease the renewal loop
    /// renews in the same round (none in flight, no transaction open).
    fn renewal_partner(&self, state: &State, client: usize) -> Option<usize> {
        if !(self.config.batch_renewals && matches!(self.config.kind, Kind::Semaphore(_))) {
            return None;
        }
        let family = state.clients[client].family;
        (0..state.clients.len()).find(|&other| {
            other != client
                && state.clients[other].family == family
                && matches!(
                    &state.clients[other].phase,
                    Phase::Holding(hold) if hold.renewing.is_none()
                        && hold.transaction.is_none()
                        && !is_lost(hold.lease, state.at())
                )
        })
    }

    /// The caller stops waiting for its attempt (for `why`): what the crate's [`code::Attempt`]
    /// decides goes out (the undo), and the attempt is kept so that a late win is released.
    fn leave_attempt(&self, state: &mut State, client: usize, why: Leave) {
        let (now, at) = (state.now, state.at());
        let Phase::Attempting {
            lock_id,
            mut attempt,
        } = state.clients[client].phase.clone()
        else {
            return;
        };
        let step = match why {
            Leave::NoReply => attempt.waited(at),
            Leave::Cancelled | Leave::Transferred | Leave::ShutDown => attempt.caller_left(),
        };
        let caller = &mut state.clients[client];
        caller.abandoned = Some((lock_id, attempt));
        if why != Leave::Transferred {
            caller.phase = Phase::Idle { at: now + 1 };
        }
        // A writer whose caller left ends its wait: its marker is removed (`WaitingWriter`'s
        // drop) once the attempt in flight, which keeps the marker too, has its outcome; a
        // writer whose reply did not come waits on, marker and all.
        if matches!(why, Leave::Cancelled | Leave::ShutDown) {
            caller.removal_after = caller.wait.take();
        }
        if step.undo {
            state.send(Message::Release {
                client: u8::try_from(client).expect("small"),
                lock_id,
                cleanup: ends_at_once(false),
            });
        }
    }

    /// Whether `message` is a reply to a caller of process 0.
    fn to_process_0(&self, state: &State, message: &Message) -> bool {
        let receiver = match *message {
            Message::AttemptReply { client, .. }
            | Message::RenewReply { client, .. }
            | Message::TransactionRenewReply { client, .. }
            | Message::TransactionCommitReply { client, .. } => client,
            Message::TransferReply { waiter, .. } => waiter,
            Message::RenewManyReply { clients, .. } => clients[0],
            _ => return false,
        };
        state.clients[usize::from(receiver)].process == 0
    }

    /// The kind of lease `client` holds or waits for.
    fn lease_kind(&self, client: usize) -> code::LeaseKind {
        match self.config.kind {
            Kind::Exclusive => code::LeaseKind::Exclusive,
            Kind::Semaphore(_) => code::LeaseKind::Place,
            Kind::ReaderWriter if self.reads(client) => code::LeaseKind::Reader,
            Kind::ReaderWriter => code::LeaseKind::Writer,
            Kind::Document => code::LeaseKind::Document,
        }
    }

    /// The local waiter a release by `client` hands its lease to, as the crate's protocol core
    /// decides (`code::handover`, each waiter's `code::takes_over`) over the line of `client`'s
    /// process: the callers of the process that wait in line, in caller order (one of the orders
    /// the crate's line, kept in order of arrival, can take). A caller receiving a transfer is
    /// busy; no other is (the model's releases wake nobody). Counts the process's transfers in a
    /// row, as the crate's queue does.
    fn local_waiter(&self, state: &mut State, client: usize) -> Option<usize> {
        let process = state.clients[client].process;
        let releasing = self.lease_kind(client);
        let line: Vec<usize> = (0..state.clients.len())
            .filter(|&other| {
                let waiter = &state.clients[other];
                other != client
                    && waiter.process == process
                    && waiter.queued
                    && matches!(waiter.phase, Phase::Idle { .. } | Phase::Attempting { .. })
            })
            .collect();
        let waiters: Vec<code::InLine> = line
            .iter()
            .map(|&other| code::InLine {
                busy: state.clients[other].offer.is_some(),
                takes_over: code::takes_over(releasing, self.lease_kind(other)),
            })
            .collect();
        let in_a_row = &mut state.transfers_in_a_row[usize::from(process)];
        match code::handover(waiters, in_a_row) {
            code::Handover::To(places) => {
                // The model's bookkeeping hands a lease to one waiter at a time (it has one reader
                // per process): a release to several would be beyond it, and yields a path.
                state.granted_only_when_asked &= places.len() == 1;
                places.first().map(|&place| line[place])
            }
            code::Handover::Release { .. } => None,
        }
    }

    fn release(&self, state: &mut State, client: usize) {
        let Phase::Holding(hold) = state.clients[client].phase.clone() else {
            return;
        };
        // Called only before the holder's deadline (`run_due` presumes a lease lost first): the
        // holder believes its lease live; whether it still is, the server's filter decides.
        let waiter = if code::hands_over(&self.options[client], false, true) {
            self.local_waiter(state, client)
        } else {
            None
        };
        match waiter {
            Some(waiter) => {
                let lock_id = state.next_lock_id;
                state.next_lock_id += 1;
                state.clients[waiter].offer = Some(lock_id);
                let sent = code::Sent::now(state.at());
                let (from, to) = (
                    u8::try_from(client).expect("small"),
                    u8::try_from(waiter).expect("small"),
                );
                // Work of both families until its outcome is in: each one's shutdown waits for
                // it until it has settled, then undoes it.
                let settle_by = Some(self.settle_by(sent.at()));
                let releasing = &mut state.families[usize::from(state.clients[client].family)];
                // The releasing lease ends as its release would; the waiter's is a cleanup.
                let (ending, cleanup) = (
                    Undo {
                        client: from,
                        lock_id: hold.lock_id,
                        cleanup: ends_at_once(true),
                    },
                    Undo {
                        client: to,
                        lock_id,
                        cleanup: ends_at_once(false),
                    },
                );
                releasing
                    .work
                    .track(piece(lock_id), vec![ending, cleanup], settle_by);
                let receiving = &mut state.families[usize::from(state.clients[waiter].family)];
                receiving
                    .work
                    .track(receiving_piece(lock_id), vec![cleanup], settle_by);
                // (A fair lock's waiter is handed the lock with the place of its wait.)
                let marker = state.clients[waiter].wait.unwrap_or(0);
                state.send(Message::Transfer {
                    from,
                    releasing: hold.lock_id,
                    waiter: to,
                    lock_id,
                    sent,
                    marker,
                });
            }
            // A document lock's holder commits its work, which ends its lease.
            None if self.config.kind == Kind::Document => state.send(Message::Commit {
                client: u8::try_from(client).expect("small"),
                lock_id: hold.lock_id,
                token: hold.token,
                replace: self.config.callers[client].replaces,
            }),
            None => state.send(Message::Release {
                client: u8::try_from(client).expect("small"),
                lock_id: hold.lock_id,
                cleanup: ends_at_once(true),
            }),
        }
        state.next_round(client);
    }

    /// A write just gave the lock a new holder that stores `details` (the caller's index, if it
    /// stores any), over a document that held `replaced`: the stored details must be the new
    /// holder's.
    fn check_details(&self, state: &mut State, details: Option<u8>, replaced: Option<u8>) {
        let stored = state.lock.as_ref().and_then(|lock| lock.details);
        state.details_are_the_holders &= stored == details;
        state.details_replaced |= replaced.is_some_and(|before| Some(before) != details);
    }

    /// `family` shuts down: its holders' leases are undone at once, its callers leave their
    /// attempts and want nothing more, and its work under way is waited for until settled, then
    /// undone, as the crate's protocol core decides (`code::Work::take_due`, in [`Self::run_work`]).
    fn shut_down(&self, state: &mut State, family: u8) {
        state.may_shut_down = false;
        state.families[usize::from(family)].shut_down = true;
        for client in 0..state.clients.len() {
            if state.clients[client].family != family {
                continue;
            }
            let id = u8::try_from(client).expect("small");
            match state.clients[client].phase.clone() {
                Phase::Holding(hold) => state.send(Message::Release {
                    client: id,
                    lock_id: hold.lock_id,
                    cleanup: ends_at_once(true),
                }),
                Phase::Attempting { .. } => self.leave_attempt(state, client, Leave::ShutDown),
                Phase::Idle { .. } | Phase::Done => {}
            }
            state.clients[client].phase = Phase::Done;
            state.clients[client].rounds = 0;
        }
        self.run_work(state);
    }

    /// What the families' work under way needs by now: a shut-down family undoes what is due
    /// (`code::Work::take_due`), and a transfer whose outcome stayed unknown is undone once it
    /// has settled (`code::Work::settling`).
    fn run_work(&self, state: &mut State) {
        let at = state.at();
        // Process 0 does nothing while it stands still, nor ever after it crashed.
        let still = state.crashed || state.paused_until.is_some_and(|until| state.now < until);
        let acts = |state: &State, family: usize| {
            !still
                || !state
                    .clients
                    .iter()
                    .any(|client| usize::from(client.family) == family && client.process == 0)
        };
        for family in 0..state.families.len() {
            if state.families[family].shut_down && acts(state, family) {
                let due = state.families[family].work.take_due(at);
                Self::send_undo(state, due.undo);
            }
        }
        for (family, id) in std::mem::take(&mut state.settling) {
            if !acts(state, usize::from(family)) {
                state.settling.push((family, id));
                continue;
            }
            let work = &mut state.families[usize::from(family)].work;
            match work.settling(id, at) {
                code::Settling::WaitUntil(_) => state.settling.push((family, id)),
                code::Settling::Undo(undo) => {
                    work.finish(id);
                    Self::send_undo(state, undo);
                }
                code::Settling::Taken => {}
            }
        }
    }

    fn send_undo(state: &mut State, undo: Vec<Undo>) {
        for Undo {
            client,
            lock_id,
            cleanup,
        } in undo
        {
            state.send(Message::Release {
                client,
                lock_id,
                cleanup,
            });
        }
    }

    /// The settle deadline of a command sent `at`. The model's server applies a request within
    /// [`Config::max_delay`] ticks of its send or never (the crate's server-side time limit,
    /// `ATTEMPT_SERVER_TIME`, for the model's network): a shutdown that waits past then undoes
    /// whatever it applied.
    fn settle_by(&self, at: At) -> At {
        At(at.0 + i64::from(self.config.max_delay) * TICK_MS + 1)
    }

    /// The family of locks of `client`.
    fn family_of(state: &State, client: u8) -> usize {
        usize::from(state.clients[usize::from(client)].family)
    }
}

impl LeaseProtocol {
    fn initial(&self) -> State {
        let client = |caller: &Caller| Client {
            process: caller.process,
            family: caller.family,
            phase: Phase::Idle { at: 0 },
            rounds: 1,
            queued: false,
            abandoned: None,
            offer: None,
            wait: None,
            removal_after: None,
            abort_after: None,
        };
        State {
            now: 0,
            // A document lock's document is the application's: there before anyone locks it,
            // unless the callers insert it.
            lock: (self.config.kind == Kind::Document && !self.config.lock_or_insert).then(|| {
                LockDocument {
                    lock_id: None,
                    expires_at_ms: None,
                    token: None,
                    min_hold_until_ms: None,
                    details: None,
                    max_count: None,
                    holders: Vec::new(),
                    line: Vec::new(),
                    served_wait: None,
                    revoke: None,
                    reader_writer: None,
                    embedded: None,
                    committed_by: None,
                    waiting: None,
                    resized_at_ms: None,
                }
            }),
            resource: None,
            clients: self.config.callers.iter().map(client).collect(),
            network: Vec::new(),
            reply_latency: 1,
            faults_left: self.config.faults,
            next_lock_id: 0,
            may_cancel: self.config.cancel,
            may_shut_down: !self.config.shut_down.is_empty(),
            families: vec![
                Family::default();
                usize::from(
                    self.config
                        .callers
                        .iter()
                        .map(|caller| caller.family)
                        .max()
                        .unwrap_or(0)
                ) + 1
            ],
            settling: Vec::new(),
            router_clocks_ms: [0, R1_AHEAD_MS],
            transfers_in_a_row: [0, 0],
            may_step_clock: self.config.clock_step.is_some(),
            may_pause: self.config.pause.is_some(),
            paused_until: None,
            may_force_release: self.config.force_release,
            may_revoke: self.config.operator_revokes,
            may_resize: self.config.resize.is_some(),
            admitted_within_count: true,
            forced: Vec::new(),
            max_token_held: None,
            tokens_increase: true,
            stale_writes_refused: true,
            granted_only_when_asked: true,
            touched_only_own: true,
            told_promptly: true,
            stale_write_refused: false,
            transferred: false,
            taken_over: false,
            abandoned_win_released: false,
            renewal_met_another: false,
            extension_kept_a_later_end: false,
            mark_held_places_back: false,
            several_places_held: false,
            set_count_kept_an_attempt_out: false,
            served_in_line_order: true,
            line_kept_a_free_lock: false,
            no_renewal_past_grace: true,
            kept_for_its_asker: true,
            grace_capped_a_renewal: false,
            reservation_kept_a_free_lock: false,
            asker_took_the_lock: false,
            operator_asked_a_holder: false,
            progress_kept_a_lease: false,
            stalled_holder_lost: false,
            place_given_up: false,
            one_upgradeable_reader: true,
            upgrade_waited_for_a_reader: false,
            upgrade_left_a_writers_marker: false,
            upgraded_beside_its_read: false,
            upgradeable_kept_out_by_another: false,
            operator_ended_a_held_lease: false,
            transfer_undone_by_a_shutdown: false,
            acquired_at: BTreeMap::new(),
            window_until_ms: None,
            min_hold_kept: true,
            cleanup_ended_a_window: false,
            cleanups_keep_no_window: true,
            delivered: BTreeSet::new(),
            may_crash: self.config.crash,
            crashed: false,
            details_are_the_holders: true,
            details_replaced: false,
            may_purge: self.config.purge,
            may_delete: self.config.delete_by_hand,
            deletion: None,
            token_went_back: false,
            others_deleted: [false; 3],
            window_kept_an_attempt_out: false,
            transfer_wrote_a_window: false,
            commits_while_held: true,
            commit_refused: false,
            replaced: false,
            checkpointed: false,
            checkpoint_refused: false,
            operator_ended_a_reader: false,
            inserted: false,
            insert_refused: false,
            renewed_together: false,
            read_found_one_gone: false,
            transaction: None,
            blocked: Vec::new(),
            transactions_in_order: true,
            transaction_committed: false,
            write_waited_for_a_transaction: false,
            transaction_given_up_at_the_deadline: false,
            late_renewal_opened_a_transaction: false,
        }
    }
}

impl Model for LeaseProtocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut state = self.initial();
        self.run_due(&mut state);
        vec![state]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        let mut overdue = false;
        for (index, in_flight) in state.network.iter().enumerate() {
            if in_flight.message.is_request() {
                actions.push(Action::Deliver { index, slow: false });
                if self.config.slow_replies && in_flight.message.has_reply() {
                    actions.push(Action::Deliver { index, slow: true });
                }
                let max_delay = match in_flight.message {
                    Message::Write { .. } | Message::Commit { .. } => self.config.write_max_delay,
                    Message::Checkpoint { .. } => CHECKPOINT_MAX_DELAY,
                    _ => self.config.max_delay,
                };
                overdue |= in_flight.age >= max_delay;
            }
            if state.faults_left > 0 && !in_flight.message.of_a_transaction() {
                actions.push(Action::Lose(index));
                actions.push(Action::Hang(index));
                if in_flight.message.is_request() {
                    actions.push(Action::Duplicate(index));
                }
            }
        }
        for client in 0..state.clients.len() {
            if matches!(state.clients[client].phase, Phase::Attempting { .. }) && state.may_cancel {
                actions.push(Action::Cancel(client));
            }
        }
        if state.may_shut_down {
            for &family in &self.config.shut_down {
                actions.push(Action::ShutDown(family));
            }
        }
        if state.may_step_clock {
            actions.push(Action::StepClock);
        }
        if state.may_pause {
            actions.push(Action::Pause);
        }
        if state.may_revoke {
            actions.push(Action::OperatorRevokes);
        }
        if state.may_force_release {
            actions.push(Action::ForceRelease);
        }
        if state.may_resize {
            actions.push(Action::Resize);
        }
        if state.may_crash {
            actions.push(Action::Crash);
        }
        if state.may_purge {
            actions.push(Action::Purge);
        }
        if state.may_delete {
            actions.push(Action::DeleteByHand);
        }
        if !overdue && state.now < self.config.horizon {
            actions.push(Action::Tick);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => {
                state.now += 1;
                // The server aborts a transaction left open too long.
                if state
                    .transaction
                    .as_ref()
                    .is_some_and(|pending| state.now >= pending.since + TRANSACTION_LIFETIME_TICKS)
                {
                    state.transaction = None;
                    self.release_blocked(&mut state);
                }
                // Replies arrive as their tick begins, in a fixed order: each changes only its
                // receiver.
                for in_flight in &mut state.network {
                    in_flight.age += 1;
                }
                let paused = state.paused_until.is_some_and(|until| state.now < until);
                let (arrived, in_flight): (Vec<_>, Vec<_>) = std::mem::take(&mut state.network)
                    .into_iter()
                    .partition(|in_flight| {
                        !in_flight.message.is_request()
                            && in_flight.age >= in_flight.latency
                            && !(paused && self.to_process_0(&state, &in_flight.message))
                    });
                state.network = in_flight;
                for reply in arrived {
                    self.deliver(&mut state, reply.message);
                }
                self.run_due(&mut state);
            }
            Action::Deliver { index, slow } => {
                let message = state.network.remove(index).message;
                state.reply_latency = if slow { 2 } else { 1 };
                self.deliver(&mut state, message);
                state.reply_latency = 1;
            }
            Action::Lose(index) => {
                state.faults_left -= 1;
                let message = state.network.remove(index).message;
                self.failed(&mut state, &message);
            }
            Action::Hang(index) => {
                state.faults_left -= 1;
                state.network.remove(index);
            }
            Action::Duplicate(index) => {
                state.faults_left -= 1;
                let message = state.network[index].message.clone();
                self.deliver(&mut state, message);
            }
            Action::Cancel(client) => {
                state.may_cancel = false;
                self.leave_attempt(&mut state, client, Leave::Cancelled);
            }
            Action::ShutDown(family) => self.shut_down(&mut state, family),
            Action::Pause => {
                state.may_pause = false;
                state.paused_until = self.config.pause.map(|ticks| state.now + ticks);
            }
            Action::Resize => {
                state.may_resize = false;
                let count = self.config.resize.expect("a resize");
                let (filter, update) = code::semaphore::set_count(NAME, count.into());
                self.update(&mut state, 0, &filter, &update, true);
            }
            Action::OperatorRevokes => {
                state.may_revoke = false;
                let now = self.server_now(&state, 0).timestamp_millis();
                let (held, (filter, pipeline)) = match self.config.kind {
                    // The semaphore's first live place.
                    Kind::Semaphore(_) => {
                        let place = (state.lock.iter())
                            .flat_map(|lock| lock.holders.iter())
                            .find(|member| member.expires_at_ms > now)
                            .map(|member| member.lock_id);
                        let name = lock_id_name(place.unwrap_or(0));
                        let grace = ticks_ms(1);
                        let asked = code::semaphore::operator_revocation(
                            NAME,
                            &name,
                            OPERATOR_REQUEST,
                            grace,
                        );
                        (place, asked)
                    }
                    _ => (
                        state.lock.as_ref().and_then(|lock| lock.lock_id),
                        code::operator_revocation(NAME, OPERATOR_REQUEST, ticks_ms(1)),
                    ),
                };
                let asked = self
                    .update(&mut state, 0, &filter, &pipeline, false)
                    .is_some();
                state.operator_asked_a_holder |= asked;
                // Only a live lease is asked to end, and the request targets it.
                state.no_renewal_past_grace &= !asked
                    || state
                        .lock
                        .as_ref()
                        .and_then(|lock| lock.revoke)
                        .is_some_and(|request| request.target == held && !request.reserves);
            }
            Action::ForceRelease => {
                state.may_force_release = false;
                let now = self.server_now(&state, 0).timestamp_millis();
                let lock = state.lock.clone();
                let live_places: Vec<u8> = (lock.iter())
                    .flat_map(|lock| lock.holders.iter())
                    .filter(|member| member.expires_at_ms > now)
                    .map(|member| member.lock_id)
                    .collect();
                let at = state.at();
                let ended: Vec<u8> = match self.config.kind {
                    Kind::ReaderWriter if self.config.force_release_all => {
                        // `force_release_all`: the writer's lease and every reader's.
                        let (filter, update) = code::reader_writer::force_release_all(NAME);
                        let rw = lock.as_ref().and_then(|lock| lock.reader_writer.clone());
                        let leases = rw.map(|rw| {
                            let writer = rw.writer.and_then(|writer| writer.lock_id);
                            let readers = rw.readers.into_iter().map(|(lock_id, _)| lock_id);
                            writer.into_iter().chain(readers).collect()
                        });
                        (self.update(&mut state, 0, &filter, &update, false))
                            .and(leases)
                            .unwrap_or_default()
                    }
                    Kind::Exclusive | Kind::Document => {
                        let (filter, update) = (
                            code::force_release_filter(NAME),
                            code::force_release_update(),
                        );
                        let stored = lock.as_ref().and_then(|lock| lock.lock_id);
                        (self.update(&mut state, 0, &filter, &update, false))
                            .and(stored)
                            .into_iter()
                            .collect()
                    }
                    // The first live lease `holders()` shows (by R0's clock): the writer's, else
                    // the first reader's, ended with `force_release_holder`.
                    Kind::ReaderWriter => {
                        let rw = lock.as_ref().and_then(|lock| lock.reader_writer.clone());
                        let live = |until: Option<i64>| until.is_some_and(|until| until > now);
                        let writer = (rw.iter())
                            .filter_map(|rw| rw.writer)
                            .filter(|writer| live(writer.expires_at_ms))
                            .filter_map(|writer| writer.lock_id)
                            .map(|lock_id| (lock_id, false));
                        let readers = (rw.iter())
                            .flat_map(|rw| rw.readers.iter())
                            .filter(|&&(_, until)| live(Some(until)))
                            .map(|&(lock_id, _)| (lock_id, true));
                        match writer.chain(readers).next() {
                            Some((lock_id, reads)) => {
                                let (filter, update) = code::reader_writer::force_release_holder(
                                    NAME,
                                    &lock_id_name(lock_id),
                                    reads,
                                );
                                let ended = self.update(&mut state, 0, &filter, &update, false);
                                state.operator_ended_a_reader |= reads && ended.is_some();
                                ended.map(|_| lock_id).into_iter().collect()
                            }
                            None => Vec::new(),
                        }
                    }
                    // `force_release_all`: every place.
                    Kind::Semaphore(_) if self.config.force_release_all => {
                        let (filter, update) = code::semaphore::force_release_all(NAME);
                        if self.apply_operators(&mut state, 0, &filter, &update) {
                            live_places
                        } else {
                            Vec::new()
                        }
                    }
                    // The first live place `holders()` shows (by R0's clock), ended with
                    // `force_release_holder`.
                    Kind::Semaphore(_) => match live_places.first() {
                        Some(&lock_id) => {
                            let (filter, update) =
                                code::semaphore::force_release(NAME, &lock_id_name(lock_id));
                            (self.update(&mut state, 0, &filter, &update, false))
                                .map(|_| lock_id)
                                .into_iter()
                                .collect()
                        }
                        None => Vec::new(),
                    },
                };
                state
                    .forced
                    .extend(ended.into_iter().map(|lock_id| (lock_id, at)));
                state.operator_ended_a_held_lease =
                    (0..state.clients.len()).any(|client| state.ended_by_operator(client));
            }
            Action::DeleteByHand => {
                state.may_delete = false;
                let now = self.server_now(&state, 0).timestamp_millis();
                if let Some(lock) = state.lock.take() {
                    // A live lease ended early (an expired one's holder has let it go already).
                    if let Some(lock_id) = lock.lock_id
                        && lock.expires_at_ms.is_some_and(|until| until > now)
                    {
                        state.forced.push((lock_id, state.at()));
                        state.operator_ended_a_held_lease =
                            (0..state.clients.len()).any(|client| state.ended_by_operator(client));
                    }
                    let held = state.max_token_held.take();
                    state.deletion = Some(Deletion {
                        held_before: held.unwrap_or(i64::MIN),
                        // The stored token may be a lease's whose winner has not heard yet.
                        before: held.max(lock.token).unwrap_or(i64::MIN),
                        at_ms: EPOCH_MS + state.now_ms(),
                    });
                }
            }
            Action::Purge => {
                state.may_purge = false;
                let purge = self.command(CommandKey::Purge);
                let now = self.server_now(&state, 0);
                if state.lock.is_some() && eval::matches(&purge.filter, &Self::stored(&state), now)
                {
                    state.lock = None;
                }
                for (deleted, document) in state.others_deleted.iter_mut().zip(others()) {
                    *deleted |= eval::matches(&purge.filter, &document, now);
                }
            }
            Action::Crash => {
                state.may_crash = false;
                state.crashed = true;
                for client in &mut state.clients {
                    if client.process == 0 {
                        client.phase = Phase::Done;
                        client.abandoned = None;
                        client.offer = None;
                        client.rounds = 0;
                    }
                }
            }
            Action::StepClock => {
                state.may_step_clock = false;
                if let Some(step) = self.config.clock_step {
                    state.router_clocks_ms[usize::from(step.router)] += step.by_ms;
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let always = SAFETY.map(|(name, holds)| Property::always(name, holds));
        let sometimes = COVERAGE.map(|(name, reached)| Property::sometimes(name, reached));
        let served = Property::eventually(LIVENESS, |_, state: &State| {
            state
                .clients
                .iter()
                .all(|client| client.phase == Phase::Done)
        });
        always
            .into_iter()
            .chain([served])
            .chain(sometimes)
            .collect()
    }
}

/// A property of a state, by name.
type Condition = (&'static str, fn(&LeaseProtocol, &State) -> bool);

/// What every state must keep, in the order [`broken`] looks for a counterexample.
pub const SAFETY: [Condition; 19] = [
    (
        "a holder whose work stalls holds no longer than max_idle",
        |protocol, state| protocol.stalled_holders_let_go(state),
    ),
    (
        "a fair lock serves its waiters in line order",
        |_, state| state.served_in_line_order,
    ),
    (
        "no lease is renewed once a revocation's grace is over",
        |_, state| state.no_renewal_past_grace,
    ),
    (
        "a lock kept for a revoking waiter goes to nobody else",
        |_, state| state.kept_for_its_asker,
    ),
    (
        "a reader-writer lock stores at most one upgradeable reader",
        |_, state| state.one_upgradeable_reader,
    ),
    (
        "a semaphore admits no lease beyond its count",
        |_, state| state.admitted_within_count,
    ),
    // Except the holder of a lease an operator ended, until its next renewal's reply (the
    // property below): by design, a forced release does not ask the holder.
    // A semaphore's: at most `max_count` holders at once; a reader-writer lock's: readers, or
    // one writer.
    ("mutual exclusion", |model, state| {
        let holders = (0..state.clients.len())
            .filter(|&client| state.believes_it_holds(client) && !state.ended_by_operator(client));
        // (A semaphore's holder counts its places.)
        let (readers, writers) = holders.fold((0, 0), |(readers, writers), client| {
            if model.reads(client) && model.upgraded(state, client) {
                (readers, writers) // beside its own upgrade, which counts as the writer
            } else if model.reads(client) {
                (readers + 1, writers)
            } else {
                (
                    readers,
                    writers + usize::from(model.config.callers[client].places),
                )
            }
        });
        match model.config.kind {
            Kind::ReaderWriter => writers == 0 || (writers == 1 && readers == 0),
            Kind::Semaphore(places) => writers <= usize::from(places),
            Kind::Exclusive | Kind::Document => writers <= 1,
        }
    }),
    (
        "a holder whose lease an operator ended hears of it at its next renewal",
        |_, state| state.told_promptly,
    ),
    (
        "fencing tokens increase in acquisition order",
        |_, state| state.tokens_increase,
    ),
    ("no stale fenced write is accepted", |_, state| {
        state.stale_writes_refused
    }),
    (
        "a renewal or release touches only its sender's lease",
        |_, state| state.touched_only_own,
    ),
    (
        "no acquisition inside an earlier holder's min_hold window",
        |_, state| state.min_hold_kept,
    ),
    (
        "a lease nobody was given keeps no min_hold window",
        |_, state| state.cleanups_keep_no_window,
    ),
    (
        "a lease carries its holder's details and no one else's",
        |_, state| state.details_are_the_holders,
    ),
    (
        "a purge deletes no document that is not a lock's",
        |_, state| !state.others_deleted[1] && !state.others_deleted[2],
    ),
    (
        "a holder's commit, replace or checkpoint applies only under its live lease, in token order",
        |_, state| state.commits_while_held,
    ),
    (
        "a lease-checked transaction commits only under its lease, after earlier holders' writes",
        |_, state| state.transactions_in_order,
    ),
    (
        "an open transaction is one its holder still ends",
        |_, state| state.open_transaction_owned(),
    ),
    (BOOKKEEPING, |_, state| state.granted_only_when_asked),
];

/// What every run must reach by its horizon.
pub const LIVENESS: &str = "every caller is served";

/// What some runs reach, so that the model is seen to explore it (each configuration's test
/// names the ones it must reach).
pub const COVERAGE: [Condition; 42] = [
    (
        "a holder whose work reports progress holds past max_idle",
        |_, state| state.progress_kept_a_lease,
    ),
    (
        "a holder whose work stalls loses its lease to max_idle",
        |_, state| state.stalled_holder_lost,
    ),
    ("an operator asks a holder to let go", |_, state| {
        state.operator_asked_a_holder
    }),
    ("a wait that ends gives its place in line up", |_, state| {
        state.place_given_up
    }),
    (
        "a revocation's grace stops the holder's renewals",
        |_, state| state.grace_capped_a_renewal,
    ),
    (
        "a lock kept for a revoking waiter keeps another out",
        |_, state| state.reservation_kept_a_free_lock,
    ),
    ("a revoking waiter takes the lock", |_, state| {
        state.asker_took_the_lock
    }),
    (
        "a place ahead in line keeps a waiter out of a free fair lock",
        |_, state| state.line_kept_a_free_lock,
    ),
    (
        "an upgradeable reader waits while another's lease is live",
        |_, state| state.upgradeable_kept_out_by_another,
    ),
    (
        "an upgrade takes the write lease beside its own read lease",
        |_, state| state.upgraded_beside_its_read,
    ),
    ("an upgrade waits while a plain reader holds", |_, state| {
        state.upgrade_waited_for_a_reader
    }),
    (
        "an upgrade leaves another writer's marker in place",
        |_, state| state.upgrade_left_a_writers_marker,
    ),
    (
        "a count set lower keeps out an attempt the old one admitted",
        |_, state| state.set_count_kept_an_attempt_out,
    ),
    (
        "a waiting mark holds free places back from a waiter for fewer",
        |_, state| state.mark_held_places_back,
    ),
    (
        "a semaphore's caller holds several places at once",
        |_, state| state.several_places_held,
    ),
    (
        "an extension leaves a later end it does not reach as it is",
        |_, state| state.extension_kept_a_later_end,
    ),
    ("a release hands the lock to a local waiter", |_, state| {
        state.transferred
    }),
    ("a lease is taken over after it ended", |_, state| {
        state.taken_over
    }),
    ("an operator ends a held lease", |_, state| {
        state.operator_ended_a_held_lease
    }),
    (
        "a renewal reaches the server after another took the lock",
        |_, state| state.renewal_met_another,
    ),
    ("a stale fenced write is refused", |_, state| {
        state.stale_write_refused
    }),
    (
        "a lease won after its caller left is released",
        |_, state| state.abandoned_win_released,
    ),
    (
        "a shutdown undoes a transfer whose reply comes after it",
        |_, state| state.transfer_undone_by_a_shutdown,
    ),
    (
        "an acquisition replaces another holder's details",
        |_, state| state.details_replaced,
    ),
    (
        "a purge deletes a lock whose lease ended over a day ago",
        |_, state| state.others_deleted[0],
    ),
    (
        "a cleanup ends a lease nobody was given, window and all",
        |_, state| state.cleanup_ended_a_window,
    ),
    (
        "a window keeps an attempt out after its holder's lease ended",
        |_, state| state.window_kept_an_attempt_out,
    ),
    (
        "a transfer gives its waiter a lease with a min_hold window",
        |_, state| state.transfer_wrote_a_window,
    ),
    (
        "a token after a deletion by hand is below an earlier one",
        |_, state| state.token_went_back,
    ),
    ("a commit is refused after its lease ended", |_, state| {
        state.commit_refused
    }),
    ("a holder replaces the document", |_, state| state.replaced),
    ("a holder's checkpoint applies", |_, state| {
        state.checkpointed
    }),
    (
        "a checkpoint is refused after its lease ended",
        |_, state| state.checkpoint_refused,
    ),
    ("an operator ends a reader's lease", |_, state| {
        state.operator_ended_a_reader
    }),
    ("a caller inserts the document", |_, state| state.inserted),
    ("an insert finds the document there", |_, state| {
        state.insert_refused
    }),
    (
        "the places of one family are renewed in one command",
        |_, state| state.renewed_together,
    ),
    (
        "the read after a renewal of several places finds one gone",
        |_, state| state.read_found_one_gone,
    ),
    ("a lease-checked transaction commits", |_, state| {
        state.transaction_committed
    }),
    ("a write of the lock waits for a transaction", |_, state| {
        state.write_waited_for_a_transaction
    }),
    (
        "a transaction is given up at its lease's deadline",
        |_, state| state.transaction_given_up_at_the_deadline,
    ),
    (
        "a renewal its holder gave up on the way opens the transaction",
        |_, state| state.late_renewal_opened_a_transaction,
    ),
];

/// Whether `lease` is lost `at` (asked of a copy: the state is only read).
fn is_lost(mut lease: code::Lease<At>, at: At) -> bool {
    lease.is_lost(at)
}

/// `ticks` of model time in ms.
fn ticks_ms(ticks: u8) -> i64 {
    i64::from(ticks) * TICK_MS
}

/// The model's lock ids, as stored: `L<n>`.
fn lock_id_name(lock_id: u8) -> String {
    format!("L{lock_id}")
}

/// The planted [`Mistake::TransferOfALostLease`]: every `$cond` of the pipeline takes its
/// "free" branch.
fn take_whatever_is_stored(pipeline: Vec<Document>) -> Vec<Document> {
    fn rewrite(value: Bson) -> Bson {
        match value {
            Bson::Document(document) => {
                if let Ok(branches) = document.get_array("$cond") {
                    return rewrite(branches[1].clone());
                }
                Bson::Document(
                    document
                        .into_iter()
                        .map(|(key, value)| (key, rewrite(value)))
                        .collect(),
                )
            }
            Bson::Array(items) => Bson::Array(items.into_iter().map(rewrite).collect()),
            other => other,
        }
    }
    pipeline
        .into_iter()
        .map(|stage| match rewrite(Bson::Document(stage)) {
            Bson::Document(stage) => stage,
            _ => unreachable!("a stage stays a document"),
        })
        .collect()
}

/// The planted [`Mistake::TokenNotIncremented`]: the fencing token written on a takeover is the
/// stored one (in the new holder's document the acquisition writes).
fn keep_the_stored_token(pipeline: Vec<Document>) -> Vec<Document> {
    pipeline
        .into_iter()
        .map(|mut stage| {
            if let Ok(replacement) = stage.get_document_mut("$replaceWith")
                && let Ok(branches) = replacement.get_array_mut("$cond")
                && let Some(Bson::Document(holder)) = branches.get_mut(1)
            {
                holder.insert("fencingToken", doc! { "$ifNull": ["$fencingToken", 0_i64] });
            }
            stage
        })
        .collect()
}

/// The model's own bookkeeping, checked as a safety property.
pub const BOOKKEEPING: &str = "a caller is handed a lease only while it asks for one";

/// Explores every state of `config` and prints, as `name`, how many there were and how long it
/// took.
pub fn explore(name: &str, config: Config) -> impl Checker<LeaseProtocol> {
    let started = Instant::now();
    let checker = LeaseProtocol::new(config).checker().spawn_bfs().join();
    println!(
        "{name}: {} states ({} unique), depth {}, in {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker
}

/// The first property of [`SAFETY`], then [`LIVENESS`], the checker found a counterexample to,
/// with that counterexample narrated ([`narrate`]).
pub fn broken(checker: &impl Checker<LeaseProtocol>) -> Option<(&'static str, Vec<String>)> {
    let names = SAFETY.map(|(name, _)| name);
    names.into_iter().chain([LIVENESS]).find_map(|property| {
        let path = checker.discovery(property)?;
        Some((property, narrate(&path.into_vec())))
    })
}

/// A counterexample (or example) as lines a person can follow: for each step, the time, what
/// happened, the stored lease (as router R0 reads its expiry) and who believes it holds the lock.
pub fn narrate(path: &[(State, Option<Action>)]) -> Vec<String> {
    let mut lines = Vec::new();
    for window in path.windows(2) {
        let ((before, action), (after, _)) = (&window[0], &window[1]);
        let Some(action) = action else { continue };
        let what = match action {
            Action::Tick => format!("time passes to {} ms", after.now_ms()),
            Action::Deliver { index, slow } => format!(
                "{:?} reaches the server{}",
                before.network[*index].message,
                if *slow {
                    " (its reply will be slow)"
                } else {
                    ""
                }
            ),
            Action::Lose(index) => format!("{:?} is lost", before.network[*index].message),
            Action::Hang(index) => format!(
                "{:?} hangs (half-open connection)",
                before.network[*index].message
            ),
            Action::Duplicate(index) => {
                format!("{:?} is applied twice", before.network[*index].message)
            }
            Action::Cancel(client) => format!("client {client}'s caller stops waiting"),
            Action::ShutDown(family) => format!("family {family} of process 0 shuts down"),
            Action::Pause => format!(
                "process 0 stands still until {} ms",
                i64::from(after.paused_until.unwrap_or(0)) * TICK_MS
            ),
            Action::StepClock => format!(
                "a router's clock steps: R0 reads {} ms, R1 {} ms ahead of real time",
                after.router_clocks_ms[0], after.router_clocks_ms[1]
            ),
            Action::Crash => "process 0 crashes".to_owned(),
            Action::Purge => format!(
                "an operator purges the collection: deleted {:?} of the others",
                after.others_deleted
            ),
            Action::Resize => format!(
                "an operator sets the semaphore's count to {:?}",
                after.lock.as_ref().and_then(|lock| lock.max_count)
            ),
            Action::DeleteByHand => match after.forced.first() {
                Some((lock_id, _)) => {
                    format!("an operator deletes the lock's document by hand, holding L{lock_id}")
                }
                None => "an operator deletes the lock's document by hand".to_owned(),
            },
            Action::OperatorRevokes => "an operator asks the holder to let go".to_owned(),
            Action::ForceRelease if after.forced.is_empty() => {
                "an operator forces a release: no lease to end".to_owned()
            }
            Action::ForceRelease => {
                let ended: Vec<String> = (after.forced.iter())
                    .map(|(lock_id, _)| format!("L{lock_id}"))
                    .collect();
                format!("an operator forces the release of {}", ended.join(", "))
            }
        };
        let window = match after.lock.as_ref().and_then(|lock| lock.min_hold_until_ms) {
            Some(until) => format!(", window until {} ms", until - EPOCH_MS),
            None => String::new(),
        };
        let stored = match &after.lock {
            Some(LockDocument {
                embedded,
                committed_by,
                ..
            }) if embedded.is_some() || committed_by.is_some() => {
                let lease = match embedded {
                    Some(EmbeddedLease {
                        lock_id: Some(lock_id),
                        expires_at_ms: Some(until),
                        token,
                    }) => format!("L{lock_id} until {} ms, token {token:?}", until - EPOCH_MS),
                    Some(EmbeddedLease { token, .. }) => format!("unlocked, last token {token:?}"),
                    None => "unlocked".to_owned(),
                };
                format!("stored: {lease}, committed by {committed_by:?}")
            }
            Some(LockDocument {
                reader_writer: Some(rw),
                ..
            }) => {
                let readers: Vec<String> = rw
                    .readers
                    .iter()
                    .map(|(lock_id, until)| format!("L{lock_id} until {} ms", until - EPOCH_MS))
                    .collect();
                let writer = match rw.writer {
                    Some(EmbeddedLease {
                        lock_id: Some(lock_id),
                        expires_at_ms: Some(until),
                        token,
                    }) => format!("L{lock_id} until {} ms, token {token:?}", until - EPOCH_MS),
                    Some(EmbeddedLease { token, .. }) => format!("none, last token {token:?}"),
                    None => "none".to_owned(),
                };
                let waiting = match rw.waiting {
                    Some((client, until)) => {
                        format!(", client {client} waits until {} ms", until - EPOCH_MS)
                    }
                    None => String::new(),
                };
                format!(
                    "stored: readers [{}], writer {writer}{waiting}",
                    readers.join("; ")
                )
            }
            Some(LockDocument {
                max_count: Some(_),
                holders,
                token,
                ..
            }) => {
                let places: Vec<String> = holders
                    .iter()
                    .map(|member| {
                        format!(
                            "L{} until {} ms, token {}",
                            member.lock_id,
                            member.expires_at_ms - EPOCH_MS,
                            member.token
                        )
                    })
                    .collect();
                format!("stored: [{}], last token {token:?}", places.join("; "))
            }
            Some(LockDocument {
                lock_id: Some(lock_id),
                expires_at_ms: Some(expires_at),
                token,
                ..
            }) => format!(
                "stored: L{lock_id} until {} ms, token {token:?}{window}",
                expires_at - EPOCH_MS
            ),
            Some(LockDocument {
                lock_id: None,
                expires_at_ms: Some(expires_at),
                ..
            }) if !window.is_empty() => {
                format!(
                    "stored: no holder, taken until {} ms{window}",
                    expires_at - EPOCH_MS
                )
            }
            _ => "stored: free".to_owned(),
        };
        // A fair lock's line, where there is one.
        let line = after.lock.as_ref().map_or_else(String::new, |lock| {
            if lock.line.is_empty() {
                return String::new();
            }
            let places: Vec<String> = (lock.line.iter())
                .map(|(wait, until)| format!("M{wait} until {} ms", until - EPOCH_MS))
                .collect();
            format!(", line [{}]", places.join("; "))
        });
        let stored = format!("{stored}{line}");
        let believing: Vec<String> = (0..after.clients.len())
            .filter(|&client| after.believes_it_holds(client))
            .map(|client| match &after.clients[client].phase {
                Phase::Holding(hold) => match { hold.lease }.lost_at(after.at()) {
                    Some(At(until)) => format!("client {client} (until {until} ms)"),
                    None => format!("client {client}"),
                },
                _ => unreachable!("a holder"),
            })
            .collect();
        lines.push(format!(
            "t={:>4} ms  {what}; {stored}; holding: {}",
            before.now_ms(),
            if believing.is_empty() {
                "nobody".to_owned()
            } else {
                believing.join(", ")
            }
        ));
    }
    lines
}
