//! In-process handoff: the callers of `acquire*` waiting for the same lock in this process queue
//! up, so that a local release reaches them at once and only one of them polls the server.
//!
//! - **Queue.** A waiter joins in FIFO order after its first failed attempt (at once, without an
//!   attempt, while an exclusive lease of the lock is held here) and leaves when its `acquire*`
//!   call ends (with the lock, an error, a timeout or cancellation).
//! - **One poller.** Only the first waiter polls the server, at the busy-wait pace, to notice
//!   releases by other processes (at the slowest pace while an exclusive lease of the same lock
//!   is held in this process: its release will come as a local event). The others wait for local
//!   events only. When the first waiter leaves, the next one takes over polling at once.
//! - **Transfer.** A waiter for an exclusive lock leaves an [`Offer`]: the release of a local
//!   holder then hands the lease over in the release command itself (see `release`), at most
//!   [`MAX_TRANSFERS_IN_A_ROW`] times in a row; then a plain release lets waiters of other
//!   processes race the local one.
//! - **Waking.** Otherwise, once a release is over, it wakes the first waiter that is not
//!   already busy with an attempt, and, if that one shares the lock (a reader), every sharing
//!   waiter behind it up to the next exclusive one. A waiter that acquires a lock with room left
//!   (a semaphore with free places, a reader) wakes the next waiter at once.
//!
//! The queue is process-wide, keyed by database, collection and lock name, and shared by every
//! lock object of that name, whether they come from one provider or were built apart. Its
//! waiters belong to *families* (the locks of one [`RenewalHub`](super::hub::RenewalHub): one
//! provider's, or clones of one lock): a family talks to one deployment, but locks built apart
//! could talk to different ones, where a transfer, a wake or a single poller would be wrong, and
//! a `mongodb::Client` has no public identity to compare. So the queue serves each *group* of
//! families on its own: the poller is the first waiter of its group, and a release transfers to
//! and wakes waiters of its own group only. Families join a group on evidence that they reach
//! the same lock document: an attempt of one found stored, as the holder, the lock id of a lease
//! another holds in this process (lock ids are random UUIDs, so a document holding one is that
//! lease's document). A family keeps its group while it lives (a client never changes
//! deployment): one that leaves the queue and comes back waits in line at once, without an
//! attempt to prove it again. A family is forgotten when its hub is dropped, and the groups with
//! the queue once nobody uses the lock, so their memory is bounded by the live lock objects that
//! use the lock. A transfer also requires the releaser and the waiter to use the same write
//! concern.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use mongodb::bson::Document;
use mongodb::options::WriteConcern;
use tokio::sync::Notify;

use super::schema::{HOLDERS, Layout, READERS};
use super::undo::Undo;
use crate::clock;

/// Identifies one lock across the process (database, collection and name: its queue) and the
/// family of locks that uses it (its renewal hub's id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    lock: Arc<str>,
    family: u64,
}

impl Key {
    /// The family of locks (renewal hub) this key belongs to.
    pub(crate) fn family(&self) -> u64 {
        self.family
    }
}

pub(crate) fn key(family: u64, database: &str, collection: &str, name: &str) -> Key {
    // Database and collection names cannot contain NUL (names are validated before use).
    Key {
        lock: format!("{database}\0{collection}\0{name}").into(),
        family,
    }
}

/// After this many transfers in a row, a release of the lock is a plain one: the next local
/// waiter attempts as soon as it is over, and the waiters of other processes, woken by the same
/// release through their change stream, race it on equal terms (each is about one round trip
/// from the server) for the next acquisition.
pub(crate) const MAX_TRANSFERS_IN_A_ROW: u32 = 8;

/// What a waiter was woken for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The lock may be free now: attempt at once.
    Attempt,
    /// Become the poller (or poll at the busy-wait pace again): sleep first, then attempt.
    Poll,
}

/// Builds the pipeline that takes a lease over from the lease with the given lock id.
pub(crate) type TakeoverUpdate = Box<dyn Fn(&str) -> Vec<Document> + Send>;

/// A waiter's readiness to take a lease over in a release command: an exclusive lock's waiter
/// from its holder, a semaphore's from a holder of a place, a reader from the writer (see
/// [`takes_over`]).
pub(crate) struct Offer {
    /// The waiter's lock id.
    pub(crate) lock_id: String,
    /// Where the waiter's lease would be stored.
    pub(crate) layout: Layout,
    /// The attempt's pipeline, taking over from the lease with the given lock id.
    pub(crate) update: TakeoverUpdate,
    /// Ends the lease the waiter may have been given, should the outcome be unknown.
    pub(crate) cleanup: Undo,
    /// The waiter's write concern: only a releaser with the same one transfers to it.
    pub(crate) write_concern: WriteConcern,
    /// Receives the outcome (and builds the waiter's guard from it). Called exactly once: with
    /// [`Transfer::NotDone`] if the offer is replaced, withdrawn, or its waiter leaves without
    /// it.
    pub(crate) deliver: Box<dyn FnOnce(Transfer) + Send>,
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Offer")
            .field("lock_id", &self.lock_id)
            .finish_non_exhaustive()
    }
}

/// The outcome of a transfer.
#[derive(Debug)]
pub(crate) enum Transfer {
    /// The lease is the waiter's: the document after the command, sent first at `sent_at`.
    Done {
        document: Document,
        sent_at: clock::Instant,
    },
    /// No transfer (the releasing lease was gone, or the outcome is unknown and was undone):
    /// the waiter goes on waiting.
    NotDone,
    /// The releasing task ended (its runtime shut down) before it knew the outcome: the lease
    /// may be the waiter's, or still the releasing one's (which `releasing` ends). The waiter
    /// ends both and goes on waiting.
    Abandoned { releasing: Undo },
}

/// What a release does for the local waiters.
#[derive(Debug)]
pub(crate) enum Handoff {
    /// Hand the lease over to these waiters (one, or the readers behind a writer).
    Transfer(Vec<Offer>),
    /// Release, then wake waiters.
    Wake,
}

struct Waiter {
    id: u64,
    family: u64,
    wake: Arc<Notify>,
    /// What it was woken for, until it takes it.
    signal: Option<Wake>,
    /// Woken to attempt and not yet back to waiting: further releases wake the next waiter.
    busy: bool,
    /// A release took its offer and is handing it the lock: nothing wakes it to attempt until
    /// it leaves or offers again (the transfer's outcome decides; an attempt meanwhile would only
    /// cost a command, or win a second lease).
    receiving: bool,
    /// A reader: others like it can hold the lock at the same time.
    shared: bool,
    offer: Option<Offer>,
}

impl Waiter {
    fn signal(&mut self, wake: Wake) {
        if wake == Wake::Attempt {
            self.busy = true;
        }
        // An attempt covers a poll.
        if self.signal != Some(Wake::Attempt) {
            self.signal = Some(wake);
        }
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct Queue {
    waiters: VecDeque<Waiter>,
    /// Exclusive leases of this lock held in this process: lock id and family.
    held: Vec<(String, u64)>,
    /// The groups of families known to reach the same deployment, as family → group (the
    /// smallest family id of the group); a family not listed is a group of its own.
    groups: HashMap<u64, u64>,
    /// Families whose hub is gone but that still have a waiter or a lease here.
    departed: HashSet<u64>,
    transfers_in_a_row: u32,
    /// Set by a release that ended a run of transfers (they reached their bound): its waiter
    /// was woken by the release itself, so the next pushed release, most likely that one
    /// coming back through the change stream, wakes nobody here (it would only cost an
    /// attempt). Cleared once someone holds the lock again.
    others_turn: bool,
}

/// The group of `family` in `groups`.
fn group_of(groups: &HashMap<u64, u64>, family: u64) -> u64 {
    groups.get(&family).copied().unwrap_or(family)
}

impl Queue {
    fn is_unused(&self) -> bool {
        self.waiters.is_empty() && self.held.is_empty()
    }

    /// Whether `family` has a waiter or a lease here.
    fn has(&self, family: u64) -> bool {
        self.waiters.iter().any(|waiter| waiter.family == family)
            || self.held.iter().any(|&(_, holder)| holder == family)
    }

    /// Forgets `family`, whose hub is gone, once it has neither a waiter nor a lease here (a
    /// guard outlives its lock object): the others of its group stay together.
    fn forget(&mut self, family: u64) {
        if self.has(family) {
            self.departed.insert(family);
        } else {
            self.groups.remove(&family);
        }
    }

    /// Forgets `family` if its hub is gone and it has left.
    fn forget_if_departed(&mut self, family: u64) {
        if self.departed.contains(&family) && !self.has(family) {
            self.departed.remove(&family);
            self.groups.remove(&family);
        }
    }

    /// Puts the groups of families `a` and `b` together.
    fn link(&mut self, a: u64, b: u64) {
        let (group_a, group_b) = (group_of(&self.groups, a), group_of(&self.groups, b));
        if group_a == group_b {
            return;
        }
        let (kept, merged) = (group_a.min(group_b), group_a.max(group_b));
        for group in self.groups.values_mut() {
            if *group == merged {
                *group = kept;
            }
        }
        self.groups.insert(a, kept);
        self.groups.insert(b, kept);
        LINKED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend([a, b]);
    }

    /// Whether an exclusive lease of the lock is held in this process by `family`'s group.
    fn held_by_group_of(&self, family: u64) -> bool {
        let group = group_of(&self.groups, family);
        self.held
            .iter()
            .any(|&(_, holder)| group_of(&self.groups, holder) == group)
    }

    /// The waiters of `family`'s group, in order.
    fn group_mut(&mut self, family: u64) -> impl Iterator<Item = &mut Waiter> {
        let groups = &self.groups;
        let group = group_of(groups, family);
        self.waiters
            .iter_mut()
            .filter(move |waiter| group_of(groups, waiter.family) == group)
    }

    /// The id of the first waiter of `family`'s group (its poller).
    fn first_of(&self, family: u64) -> Option<u64> {
        let group = group_of(&self.groups, family);
        self.waiters
            .iter()
            .find(|waiter| group_of(&self.groups, waiter.family) == group)
            .map(|waiter| waiter.id)
    }

    /// Tells the first waiter of `family`'s group to poll (again) at the busy-wait pace.
    fn poll_first(&mut self, family: u64) {
        if let Some(first) = self.group_mut(family).next() {
            first.signal(Wake::Poll);
        }
    }

    /// Wakes the first waiter of `family`'s group not busy with an attempt and, if it shares
    /// the lock, the sharing waiters behind it up to the next exclusive one; returns their ids.
    /// If every waiter is busy, the first one attempts once more when it is back (its attempt
    /// may have been sent before the release).
    fn wake_first(&mut self, family: u64) -> Vec<u64> {
        let mut woken = Vec::new();
        for waiter in self
            .group_mut(family)
            .filter(|waiter| !waiter.busy && !waiter.receiving)
        {
            if !woken.is_empty() && !waiter.shared {
                break;
            }
            waiter.signal(Wake::Attempt);
            woken.push(waiter.id);
            if !waiter.shared {
                break;
            }
        }
        if woken.is_empty()
            && let Some(first) = self.group_mut(family).find(|waiter| !waiter.receiving)
        {
            first.signal(Wake::Attempt);
            woken.push(first.id);
        }
        woken
    }
}

static QUEUES: LazyLock<Mutex<HashMap<Arc<str>, Queue>>> = LazyLock::new(Mutex::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Families linked to another in some queue, until their hub is gone. Locked after `QUEUES` (by
/// `link`), before `GONE` (by `forget_family`).
static LINKED: LazyLock<Mutex<HashSet<u64>>> = LazyLock::new(Mutex::default);
/// Linked families whose hub is gone, not yet forgotten by the queues (see `forget_family`).
static GONE: Mutex<Vec<u64>> = Mutex::new(Vec::new());

fn queues() -> MutexGuard<'static, HashMap<Arc<str>, Queue>> {
    let mut queues = QUEUES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let gone = std::mem::take(&mut *GONE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    for family in gone {
        for queue in queues.values_mut() {
            queue.forget(family);
        }
    }
    queues
}

/// Forgets `family`, whose hub is gone (its guards may outlive it), in every queue it was
/// linked in. Noted here, done by the next use of the queues: a hub may be dropped while they
/// are locked (with an offer it made, say), and their lock is not reentrant. Families never
/// linked (most: every lock object of a provider starts with a hub of its own that it drops)
/// cost nothing.
pub(crate) fn forget_family(family: u64) {
    let linked = LINKED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(&family);
    if linked {
        GONE.lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(family);
    }
}

/// Runs `change` on `key`'s queue, if it exists, and removes the queue once unused.
fn with_queue<R>(key: &Key, change: impl FnOnce(&mut Queue) -> R) -> Option<R> {
    let mut queues = queues();
    let queue = queues.get_mut(&key.lock)?;
    let result = change(queue);
    if queue.is_unused() {
        queues.remove(&key.lock);
    }
    Some(result)
}

/// A place in a lock's queue of local waiters; leaves the queue when dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    key: Key,
    id: u64,
    wake: Arc<Notify>,
    /// Set when leaving with the lock: whether there is room for the next waiter.
    acquired: Option<bool>,
}

impl Ticket {
    /// Joins the back of `key`'s queue; `shared` for a reader.
    pub(crate) fn join(key: &Key, shared: bool) -> Ticket {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        queues()
            .entry(Arc::clone(&key.lock))
            .or_default()
            .waiters
            .push_back(Waiter {
                id,
                family: key.family,
                wake: Arc::clone(&wake),
                signal: None,
                busy: false,
                receiving: false,
                shared,
                offer: None,
            });
        Ticket {
            key: key.clone(),
            id,
            wake,
            acquired: None,
        }
    }

    /// Whether this waiter is the first one of its group (the one that polls the server).
    pub(crate) fn is_first(&self) -> bool {
        queues()
            .get(&self.key.lock)
            .and_then(|queue| queue.first_of(self.key.family))
            == Some(self.id)
    }

    /// Whether an exclusive lease of this lock is held in this process.
    pub(crate) fn held_here(&self) -> bool {
        held_here(&self.key)
    }

    /// Leaves `offer` for the next release of a local holder (an earlier one it replaces is
    /// told "no transfer").
    pub(crate) fn offer(&self, offer: Offer) {
        let replaced = {
            let mut queues = queues();
            let me = queues
                .get_mut(&self.key.lock)
                .and_then(|queue| queue.waiters.iter_mut().find(|w| w.id == self.id));
            match me {
                Some(me) => {
                    me.receiving = false;
                    me.offer.replace(offer)
                }
                None => Some(offer),
            }
        };
        if let Some(replaced) = replaced {
            (replaced.deliver)(Transfer::NotDone);
        }
    }

    /// Takes this waiter's offer back, if no release has taken it yet (it is then told
    /// [`Transfer::NotDone`]); `false` when a release took it and is handing the lock over.
    pub(crate) fn withdraw_offer(&self) -> bool {
        let withdrawn = with_queue(&self.key, |queue| {
            let me = queue.waiters.iter_mut().find(|w| w.id == self.id)?;
            Some(me.offer.take())
        });
        match withdrawn {
            Some(Some(Some(offer))) => {
                (offer.deliver)(Transfer::NotDone);
                true
            }
            // Taken by a release.
            Some(Some(None)) => false,
            // Not in the queue (cannot happen while the ticket lives): nothing to hand over.
            _ => true,
        }
    }

    /// Leaves the queue holding the lock; with `room`, the next waiter is woken to attempt too.
    pub(crate) fn leave_with_lock(mut self, room: bool) {
        self.acquired = Some(room);
    }

    /// Resolves when this waiter is woken (at once if it was woken since the last call), with
    /// what for.
    pub(crate) async fn woken(&self) -> Wake {
        loop {
            // Waiting again: releases may wake this waiter again.
            let signal = with_queue(&self.key, |queue| {
                let me = queue.waiters.iter_mut().find(|w| w.id == self.id)?;
                let signal = me.signal.take();
                // Woken to attempt: busy until it waits again.
                me.busy = signal == Some(Wake::Attempt);
                signal
            });
            if let Some(Some(wake)) = signal {
                return wake;
            }
            // A signal set from now on comes with a notification (kept as a permit if it comes
            // before this waits); a permit left by a signal already taken only costs a loop.
            self.wake.notified().await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let acquired = self.acquired;
        let (id, family) = (self.id, self.key.family);
        let deliver = with_queue(&self.key, |queue| {
            let was_first = queue.first_of(family) == Some(id);
            let position = queue.waiters.iter().position(|waiter| waiter.id == id)?;
            let me = queue.waiters.remove(position)?;
            if was_first {
                match acquired {
                    // With room, the next may succeed too; without, it becomes the poller.
                    Some(true) => {
                        queue.wake_first(family);
                    }
                    Some(false) => queue.poll_first(family),
                    // Someone must go on polling for releases by other processes.
                    None => {
                        if let Some(next) = queue.group_mut(family).find(|waiter| !waiter.receiving)
                        {
                            next.signal(Wake::Attempt);
                        }
                    }
                }
            } else if acquired == Some(true) {
                queue.wake_first(family);
            } else if acquired.is_none() && (me.busy || me.signal == Some(Wake::Attempt)) {
                // Woken for a release it will not attempt for: the wake goes to the next.
                queue.wake_first(family);
            }
            // Last: the wakes above go to this family's group.
            queue.forget_if_departed(family);
            me.offer.map(|offer| offer.deliver)
        });
        // An offer nobody took: nothing to deliver to a waiter that is gone, but the contract
        // is exactly one call.
        if let Some(Some(deliver)) = deliver {
            deliver(Transfer::NotDone);
        }
    }
}

/// Whether an exclusive lease of `key`'s lock is held in this process by its family's group.
pub(crate) fn held_here(key: &Key) -> bool {
    queues()
        .get(&key.lock)
        .is_some_and(|queue| queue.held_by_group_of(key.family))
}

/// Wakes the first waiter of `key`'s lock in its family's group not busy with an attempt (and
/// the sharing ones behind it, for readers); returns their ids.
pub(crate) fn wake_first(key: &Key) -> Vec<u64> {
    with_queue(key, |queue| queue.wake_first(key.family)).unwrap_or_default()
}

/// What a change stream told a poller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// A lease of the lock ended (a release, a deletion, a dropped collection).
    Freed,
    /// Someone holds the lock (an acquisition, a renewal).
    Taken,
    /// The stream starts watching the lock: a release may have come since the last attempt.
    MaybeMissed,
}

/// A change stream told `key`'s poller `what`. A lock that may be free wakes the first waiter of
/// the group to attempt, as a local release does (if every waiter is attempting already, the
/// first attempts once more: its attempt may have reached the server before the release);
/// except the first release pushed after one that ended a run of transfers (most likely that
/// one, whose waiter it woke already), and a stream starting to watch meanwhile. Someone
/// holding the lock ends that exception.
pub(crate) fn pushed(key: &Key, what: Pushed) {
    with_queue(key, |queue| match what {
        Pushed::Taken => queue.others_turn = false,
        Pushed::Freed if queue.others_turn => queue.others_turn = false,
        // Whatever was missed, the waiter woken by that release is attempting.
        Pushed::MaybeMissed if queue.others_turn => {}
        Pushed::Freed | Pushed::MaybeMissed => {
            queue.wake_first(key.family);
        }
    });
}

/// How many waiters of the lock `name` of `collection` in `database` have an offer standing (a
/// release would hand the lock to them): for tests that must wait until a waiter is in line.
pub(crate) fn offers_standing(database: &str, collection: &str, name: &str) -> usize {
    count_waiters(database, collection, name, |waiter| waiter.offer.is_some())
}

/// How many waiters of the lock `name` of `collection` in `database` wait idle (neither woken
/// nor attempting nor receiving a transfer): for tests that must wait until nothing is under way.
pub(crate) fn waiters_idle(database: &str, collection: &str, name: &str) -> usize {
    count_waiters(database, collection, name, |waiter| {
        !waiter.busy && !waiter.receiving && waiter.signal.is_none()
    })
}

/// How many waiters of the lock `name` of `collection` in `database` are `like` that.
fn count_waiters(
    database: &str,
    collection: &str,
    name: &str,
    like: impl Fn(&Waiter) -> bool,
) -> usize {
    queues()
        .get(&key(0, database, collection, name).lock)
        .map_or(0, |queue| {
            queue.waiters.iter().filter(|waiter| like(waiter)).count()
        })
}

/// Tells the first waiter of `key`'s lock in its family's group to poll at the busy-wait pace
/// again (its wake-ups by push stopped).
pub(crate) fn poll_first(key: &Key) {
    with_queue(key, |queue| queue.poll_first(key.family));
}

/// An attempt of `key`'s family found `lock_id` stored as the holder of `key`'s lock: if that
/// is a lease another family holds in this process, the two reach the same deployment, and
/// their waiters join one group from now on.
pub(crate) fn saw_stored(key: &Key, lock_id: &str) {
    with_queue(key, |queue| {
        let holder = queue
            .held
            .iter()
            .find(|(held, _)| held == lock_id)
            .map(|&(_, family)| family);
        if let Some(holder) = holder.filter(|&holder| holder != key.family) {
            queue.link(holder, key.family);
        }
    });
}

/// Whether a lease stored as `releasing` says can be handed over in its release command to a
/// waiter whose lease would be stored as `waiter` says: `Some(false)` to one such waiter (an
/// exclusive lock's, a semaphore place's), `Some(true)` to every such waiter in a row (the
/// readers behind a writer), `None` not at all (a reader's release, a document lock's).
pub(crate) fn takes_over(releasing: &Layout, waiter: &Layout) -> Option<bool> {
    match (releasing, waiter) {
        (Layout::LockDocument, Layout::LockDocument) => Some(false),
        (Layout::Members(from), Layout::Members(to)) if from == HOLDERS && to == HOLDERS => {
            Some(false)
        }
        (Layout::Writer, Layout::Members(to)) if to == READERS => Some(true),
        _ => None,
    }
}

/// What the release of a local holder of `key`'s lease, stored as `releasing` says, with
/// `write_concern` does: hand over to the first waiter that is not busy, if it has an offer
/// it [`takes_over`] with the same write concern and the bound allows (and to the readers right
/// behind it, for a writer's release); else a plain release that wakes waiters.
pub(crate) fn handoff(key: &Key, write_concern: &WriteConcern, releasing: &Layout) -> Handoff {
    with_queue(key, |queue| {
        let takes = |waiter: &Waiter| {
            waiter.offer.as_ref().and_then(|offer| {
                (offer.write_concern == *write_concern)
                    .then(|| takes_over(releasing, &offer.layout))
                    .flatten()
            })
        };
        let mut chosen = Vec::new();
        for waiter in queue
            .group_mut(key.family)
            .filter(|waiter| !waiter.busy && !waiter.receiving)
        {
            let Some(many) = takes(waiter) else { break };
            chosen.push(waiter.id);
            if !many {
                break;
            }
        }
        if chosen.is_empty() {
            queue.transfers_in_a_row = 0;
            return Handoff::Wake;
        }
        if queue.transfers_in_a_row >= MAX_TRANSFERS_IN_A_ROW {
            queue.transfers_in_a_row = 0;
            queue.others_turn = true;
            return Handoff::Wake;
        }
        queue.transfers_in_a_row += 1;
        let offers = queue
            .group_mut(key.family)
            .filter(|waiter| chosen.contains(&waiter.id))
            .filter_map(|waiter| {
                // Busy receiving: not woken for anything else until it offers again.
                waiter.busy = true;
                waiter.receiving = true;
                waiter.offer.take()
            })
            .collect();
        Handoff::Transfer(offers)
    })
    .unwrap_or(Handoff::Wake)
}

/// Counts an exclusive lease of a lock as held in this process while it lives: the first
/// waiter then polls at the slowest pace, and is told to poll at the busy-wait pace again when
/// the lease ends here (released, transferred or lost).
#[derive(Debug)]
pub(crate) struct Holding {
    /// The lock and the lease's lock id, until the lease ends here.
    lease: Mutex<Option<(Key, String)>>,
}

impl Holding {
    pub(crate) fn new(key: &Key, lock_id: &str) -> Holding {
        {
            let mut queues = queues();
            let queue = queues.entry(Arc::clone(&key.lock)).or_default();
            queue.held.push((lock_id.to_owned(), key.family));
            queue.others_turn = false;
        }
        Holding {
            lease: Mutex::new(Some((key.clone(), lock_id.to_owned()))),
        }
    }

    /// The lease ended here (idempotent).
    pub(crate) fn end(&self) {
        let lease = self
            .lease
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some((key, lock_id)) = lease {
            with_queue(&key, |queue| {
                if let Some(position) = queue
                    .held
                    .iter()
                    .position(|(held, family)| *held == lock_id && *family == key.family)
                {
                    queue.held.swap_remove(position);
                }
                if !queue.held_by_group_of(key.family) {
                    queue.poll_first(key.family);
                }
                // Last: the poll above goes to this family's group.
                queue.forget_if_departed(key.family);
            });
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn woken_within(ticket: &Ticket, millis: u64) -> Option<Wake> {
        tokio::time::timeout(Duration::from_millis(millis), ticket.woken())
            .await
            .ok()
    }

    #[tokio::test]
    async fn the_first_waiter_is_woken_and_leaving_passes_the_turn_on() {
        let key = key(0, "db", "coll", "fifo");
        let first = Ticket::join(&key, false);
        let second = Ticket::join(&key, false);
        assert_eq!(wake_first(&key), vec![first.id]);
        assert_eq!(woken_within(&first, 1_000).await, Some(Wake::Attempt));
        // Only the first was woken.
        assert_eq!(woken_within(&second, 20).await, None);
        drop(first);
        // Leaving without the lock: the next takes over polling with an attempt.
        assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Attempt));
        assert_eq!(wake_first(&key), vec![second.id]);
        drop(second);
        assert_eq!(wake_first(&key), Vec::<u64>::new());
        assert!(
            !queues().contains_key(&key.lock),
            "empty queues are removed"
        );
    }

    #[tokio::test]
    async fn a_second_release_wakes_the_next_waiter_while_the_first_is_still_busy() {
        let key = key(0, "db", "coll", "slots");
        let first = Ticket::join(&key, false);
        let second = Ticket::join(&key, false);
        assert_eq!(wake_first(&key), vec![first.id]);
        // The first has not retried yet; a second freed slot goes to the second waiter.
        assert_eq!(wake_first(&key), vec![second.id]);
        assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Attempt));
        assert_eq!(woken_within(&first, 1_000).await, Some(Wake::Attempt));
        // Both retried and failed; waiting again, the next release goes to the first again.
        let first_id = first.id;
        let waiting = tokio::spawn(async move { (first.woken().await, first) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(wake_first(&key), vec![first_id]);
        let (wake, _first) = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(wake, Wake::Attempt);
    }

    #[tokio::test]
    async fn leaving_with_the_lock_makes_the_next_the_poller_or_wakes_it_when_there_is_room() {
        let key = key(0, "db", "coll", "leave");
        let first = Ticket::join(&key, false);
        let second = Ticket::join(&key, false);
        first.leave_with_lock(false);
        assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Poll));
        assert!(second.is_first());
        let third = Ticket::join(&key, false);
        second.leave_with_lock(true);
        assert_eq!(woken_within(&third, 1_000).await, Some(Wake::Attempt));
    }

    #[tokio::test]
    async fn a_release_wakes_every_reader_up_to_the_next_writer() {
        let key = key(0, "db", "coll", "readers");
        let readers = [Ticket::join(&key, true), Ticket::join(&key, true)];
        let writer = Ticket::join(&key, false);
        let late_reader = Ticket::join(&key, true);
        assert_eq!(wake_first(&key), vec![readers[0].id, readers[1].id]);
        for reader in &readers {
            assert_eq!(woken_within(reader, 1_000).await, Some(Wake::Attempt));
        }
        assert_eq!(woken_within(&writer, 20).await, None);
        assert_eq!(woken_within(&late_reader, 20).await, None);
    }

    #[tokio::test]
    async fn a_wake_before_waiting_is_not_lost_and_is_taken_once() {
        let key = key(0, "db", "coll", "permit");
        let waiter = Ticket::join(&key, false);
        wake_first(&key);
        // Woken while busy with an attempt: the next wait returns at once.
        assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
        assert_eq!(woken_within(&waiter, 20).await, None);
        drop(waiter);
        assert!(!queues().contains_key(&key.lock));
    }

    /// An exclusive lock's offer.
    fn offer(lock_id: &str, outcome: Arc<Mutex<Option<Transfer>>>) -> Offer {
        offer_of(Layout::LockDocument, lock_id, outcome)
    }

    fn offer_of(layout: Layout, lock_id: &str, outcome: Arc<Mutex<Option<Transfer>>>) -> Offer {
        // Never sent: a client of no server.
        let client = mongodb::Client::with_options(mongodb::options::ClientOptions::default())
            .expect("a client");
        Offer {
            lock_id: lock_id.to_owned(),
            layout,
            update: Box::new(|_| Vec::new()),
            cleanup: Undo {
                collection: client.database("db").collection("coll"),
                filter: Document::new(),
                update: Vec::new(),
                write_concern: WriteConcern::default(),
                patience: Duration::from_secs(1),
                many: false,
                name: lock_id.to_owned(),
            },
            write_concern: WriteConcern::default(),
            deliver: Box::new(move |transfer| *outcome.lock().unwrap() = Some(transfer)),
        }
    }

    fn lock_ids(handoff: Handoff) -> Vec<String> {
        match handoff {
            Handoff::Transfer(offers) => offers.into_iter().map(|offer| offer.lock_id).collect(),
            Handoff::Wake => Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_writer_hands_over_to_the_readers_in_a_row_and_a_place_to_one_waiter() {
        let unheard = || Arc::new(Mutex::new(None));
        let readers = Layout::Members(READERS.to_owned());
        let key = key(0, "db", "coll", "readers-in-a-row");
        let waiters = [
            Ticket::join(&key, true),
            Ticket::join(&key, true),
            Ticket::join(&key, false),
            Ticket::join(&key, true),
        ];
        for (waiter, id) in waiters.iter().zip(["r1", "r2", "w", "r3"]) {
            let layout = if id == "w" {
                Layout::Writer
            } else {
                readers.clone()
            };
            waiter.offer(offer_of(layout, id, unheard()));
        }
        let default = WriteConcern::default();
        // A reader's release hands nothing over; nor does an exclusive lock's, to readers.
        assert!(lock_ids(handoff(&key, &default, &readers)).is_empty());
        assert!(lock_ids(handoff(&key, &default, &Layout::LockDocument)).is_empty());
        // A writer's: every reader up to the next writer, in one command.
        assert_eq!(
            lock_ids(handoff(&key, &default, &Layout::Writer)),
            ["r1", "r2"]
        );
        // Busy receiving it, they are passed over; a writer makes no transfer.
        assert!(lock_ids(handoff(&key, &default, &Layout::Writer)).is_empty());
        // Nor does anything wake them to attempt meanwhile (the others leaving with the lock
        // wake the next waiter): the transfer's outcome decides.
        assert_eq!(wake_first(&key), vec![waiters[2].id]);
        assert_eq!(wake_first(&key), vec![waiters[3].id]);
        assert_eq!(
            wake_first(&key),
            vec![waiters[2].id],
            "the first not receiving"
        );
        drop(waiters);

        let places = Layout::Members(HOLDERS.to_owned());
        let key = super::key(0, "db", "coll", "one-place");
        let waiters = [Ticket::join(&key, false), Ticket::join(&key, false)];
        for (waiter, id) in waiters.iter().zip(["s1", "s2"]) {
            waiter.offer(offer_of(places.clone(), id, unheard()));
        }
        assert_eq!(lock_ids(handoff(&key, &default, &places)), ["s1"]);
        assert_eq!(lock_ids(handoff(&key, &default, &places)), ["s2"]);
    }

    #[tokio::test]
    async fn transfers_go_to_the_first_waiting_offer_and_stop_after_the_bound() {
        let key = key(0, "db", "coll", "transfer");
        let outcome = Arc::new(Mutex::new(None));
        let waiter = Ticket::join(&key, false);
        assert!(
            matches!(
                handoff(&key, &WriteConcern::default(), &Layout::LockDocument),
                Handoff::Wake
            ),
            "no offer yet"
        );
        assert_eq!(wake_first(&key), vec![waiter.id]);
        assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
        let mut transfers = 0;
        loop {
            waiter.offer(offer(&format!("w{transfers}"), Arc::clone(&outcome)));
            let _ = woken_within(&waiter, 1).await; // waiting again
            match handoff(&key, &WriteConcern::default(), &Layout::LockDocument) {
                Handoff::Transfer(offers) => {
                    assert_eq!(offers[0].lock_id, format!("w{transfers}"));
                    transfers += 1;
                }
                // With an offer waiting: only at the bound, a plain release that wakes the
                // waiter at once (and hears of its own echo through a stream no more).
                Handoff::Wake => break,
            }
        }
        assert_eq!(transfers, MAX_TRANSFERS_IN_A_ROW);
        assert!(queues()[&key.lock].others_turn);
        // The bound starts over.
        waiter.offer(offer("next", Arc::clone(&outcome)));
        let _ = woken_within(&waiter, 1).await;
        assert!(matches!(
            handoff(&key, &WriteConcern::default(), &Layout::LockDocument),
            Handoff::Transfer(_)
        ));
        // A waiter busy receiving a transfer gets nothing else until it waits again.
        waiter.offer(offer("busy", Arc::clone(&outcome)));
        assert!(matches!(
            handoff(&key, &WriteConcern::default(), &Layout::LockDocument),
            Handoff::Wake
        ));
        // The offer left behind is told "no transfer" when its waiter leaves.
        drop(waiter);
        assert!(matches!(*outcome.lock().unwrap(), Some(Transfer::NotDone)));
    }

    #[tokio::test]
    async fn no_transfer_between_different_write_concerns_and_a_replaced_offer_hears_no() {
        let key = key(0, "db", "coll", "concerns");
        let first = Arc::new(Mutex::new(None));
        let second = Arc::new(Mutex::new(None));
        let waiter = Ticket::join(&key, false);
        waiter.offer(offer("first", Arc::clone(&first)));
        waiter.offer(offer("second", Arc::clone(&second)));
        assert!(matches!(*first.lock().unwrap(), Some(Transfer::NotDone)));
        let majority = WriteConcern::majority();
        assert!(matches!(
            handoff(&key, &majority, &Layout::LockDocument),
            Handoff::Wake
        ));
        assert!(second.lock().unwrap().is_none(), "the offer stands");
        match handoff(&key, &WriteConcern::default(), &Layout::LockDocument) {
            Handoff::Transfer(offers) => assert_eq!(offers[0].lock_id, "second"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_waiter_attempting_after_a_wake_is_busy_until_it_waits_again() {
        let key = key(0, "db", "coll", "allbusy");
        let first = Ticket::join(&key, false);
        let second = Ticket::join(&key, false);
        assert_eq!(wake_first(&key), vec![first.id]);
        assert_eq!(woken_within(&first, 100).await, Some(Wake::Attempt));
        // The first is attempting: a second release goes to the second waiter.
        assert_eq!(wake_first(&key), vec![second.id]);
        assert_eq!(woken_within(&second, 100).await, Some(Wake::Attempt));
        // Both are attempting; a release now may have come after the first's attempt was
        // sent: it attempts once more when back.
        assert_eq!(wake_first(&key), vec![first.id]);
        assert_eq!(woken_within(&first, 100).await, Some(Wake::Attempt));
    }

    #[tokio::test]
    async fn a_waiter_leaving_after_a_wake_passes_it_to_the_next() {
        let key = key(0, "db", "coll", "passon");
        let first = Ticket::join(&key, false);
        let second = Ticket::join(&key, false);
        let third = Ticket::join(&key, false);
        assert_eq!(wake_first(&key), vec![first.id]);
        assert_eq!(wake_first(&key), vec![second.id]);
        // The second leaves (a timeout, say) without attempting: the third gets the wake.
        drop(second);
        assert_eq!(woken_within(&third, 1_000).await, Some(Wake::Attempt));
        drop(first);
    }

    #[tokio::test]
    async fn a_lease_held_here_slows_the_poller_and_its_end_tells_it_to_poll() {
        let key = key(0, "db", "coll", "holding");
        let waiter = Ticket::join(&key, false);
        let holding = Holding::new(&key, "lease");
        assert!(waiter.held_here());
        holding.end();
        holding.end(); // idempotent
        assert!(!waiter.held_here());
        assert_eq!(woken_within(&waiter, 1_000).await, Some(Wake::Poll));
        drop(holding);
        drop(waiter);
        assert!(!queues().contains_key(&key.lock));
    }

    #[tokio::test]
    async fn a_pushed_release_wakes_the_poller_unless_it_echoes_the_one_that_ended_the_transfers() {
        let key = key(0, "db", "coll", "pushed");
        let waiter = Ticket::join(&key, false);
        pushed(&key, Pushed::Taken); // taken or renewed by someone: nothing to do
        assert_eq!(woken_within(&waiter, 20).await, None);
        pushed(&key, Pushed::Freed);
        assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
        // Attempting already: its attempt may have come before the release, so it attempts
        // once more.
        pushed(&key, Pushed::Freed);
        assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
        // The echo of the release that ended a run of transfers (it woke its waiter itself) is
        // skipped, once; a stream starting to watch meanwhile wakes nobody either.
        queues().get_mut(&key.lock).unwrap().others_turn = true;
        pushed(&key, Pushed::MaybeMissed);
        assert_eq!(woken_within(&waiter, 20).await, None);
        pushed(&key, Pushed::Freed);
        assert_eq!(woken_within(&waiter, 20).await, None);
        pushed(&key, Pushed::Freed);
        assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
        // Someone holding the lock ends the exception, here or elsewhere.
        queues().get_mut(&key.lock).unwrap().others_turn = true;
        pushed(&key, Pushed::Taken);
        assert!(!queues()[&key.lock].others_turn);
        queues().get_mut(&key.lock).unwrap().others_turn = true;
        let holding = Holding::new(&key, "local");
        assert!(!queues()[&key.lock].others_turn);
        drop(holding);
    }

    fn has_offer(ticket: &Ticket) -> bool {
        queues()[&ticket.key.lock]
            .waiters
            .iter()
            .any(|waiter| waiter.id == ticket.id && waiter.offer.is_some())
    }

    #[tokio::test]
    async fn a_family_keeps_its_group_while_it_lives() {
        // Ids far from the hubs' (counted from 0 in this process): no real hub forgets them. The
        // group keeps the smaller id as its label; a forgotten id never comes back in real use
        // (hub ids are never reused), so the test forgets the other one.
        let (eleven, twelve) = (u64::MAX - 12, u64::MAX - 11);
        let (one, two) = (
            key(eleven, "db", "coll", "kept"),
            key(twelve, "db", "coll", "kept"),
        );
        let holding = Holding::new(&one, "lease-of-eleven");
        let ticket = Ticket::join(&two, false);
        saw_stored(&two, "lease-of-eleven");
        assert!(ticket.held_here());
        // Family 12 leaves the queue (it got the lock elsewhere, or gave up) and comes back.
        drop(ticket);
        let back = Ticket::join(&two, false);
        assert!(
            back.held_here(),
            "known to share the deployment without a new proof"
        );
        drop(back);
        // Its hub is dropped while it waits: forgotten once it leaves, though family 11 still
        // uses the queue.
        let last = Ticket::join(&two, false);
        forget_family(twelve);
        assert!(last.held_here(), "still here");
        drop(last);
        let new_user = Ticket::join(&two, false);
        assert!(!new_user.held_here());
        drop((new_user, holding));
    }

    #[tokio::test]
    async fn families_share_a_queue_only_once_one_saw_the_others_lease_stored() {
        // Families 1 and 2 (locks built apart) wait for one name; family 1 holds a lease.
        let (one, two) = (key(1, "db", "coll", "apart"), key(2, "db", "coll", "apart"));
        let holding = Holding::new(&one, "lease-of-one");
        let first = Ticket::join(&two, false);
        let second = Ticket::join(&two, false);
        let outcome = Arc::new(Mutex::new(None));
        second.offer(offer("second", Arc::clone(&outcome)));
        // Not known to reach the same deployment: family 2 polls on its own and a release of
        // family 1 neither hands over nor wakes it.
        assert!(first.is_first());
        assert!(!first.held_here());
        assert!(matches!(
            handoff(&one, &WriteConcern::default(), &Layout::LockDocument),
            Handoff::Wake
        ));
        assert_eq!(wake_first(&one), Vec::<u64>::new());
        // Any other lock id stored proves nothing.
        saw_stored(&two, "someone-else");
        assert!(!first.held_here());
        // Family 2 saw family 1's lease stored: one group from now on.
        saw_stored(&two, "lease-of-one");
        assert!(first.held_here(), "the lease held by family 1 counts");
        let waiter_of_one = Ticket::join(&one, false);
        assert!(first.is_first() && !waiter_of_one.is_first(), "one poller");
        assert_eq!(wake_first(&one), vec![first.id]);
        assert_eq!(woken_within(&first, 100).await, Some(Wake::Attempt));
        // The first is busy attempting: the release of family 1 hands over to the second.
        match handoff(&one, &WriteConcern::default(), &Layout::LockDocument) {
            Handoff::Transfer(offers) => assert_eq!(offers[0].lock_id, "second"),
            other => panic!("{other:?}"),
        }
        assert!(!has_offer(&second));
        drop((holding, first, second, waiter_of_one));
        assert!(
            !queues().contains_key(&one.lock),
            "the queue and its groups are gone with its last user"
        );
        // A new queue starts without groups.
        let _holding = Holding::new(&one, "lease-of-one");
        let ticket = Ticket::join(&two, false);
        assert!(!ticket.held_here());
    }
}
