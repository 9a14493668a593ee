//! In-process handoff: the callers of `acquire*` waiting for the same lock in this process queue
//! up, so that a local release reaches them at once and only one of them polls the server.
//!
//! - **Queue.** A waiter joins in FIFO order after its first failed attempt (at once, without an
//!   attempt, while an exclusive lease of the lock is held here or callers of its group already
//!   wait: an attempt could only fail, or jump the line; but a waiter whose attempts keep
//!   something while it waits, a waiting writer's marker or a fair lock's place in line,
//!   attempts first all the same) and leaves when its `acquire*` call ends
//!   (with the lock, an error, a timeout or cancellation). A lease stops counting as held here
//!   when its release's outcome is known, before `release()` returns.
//! - **One poller.** Only the first waiter polls the server, at the busy-wait pace, to notice
//!   releases by other processes (at the slowest pace while an exclusive lease of the same lock
//!   is held in this process: its release will come as a local event). The others wait for local
//!   events only. When the first waiter leaves, the next one takes over polling at once.
//! - **Transfer.** A waiter for an exclusive lock leaves an [`Offer`]: the release of a local
//!   holder then hands the lease over in the release command itself (see `release`), at most
//!   [`protocol::MAX_TRANSFERS_IN_A_ROW`] times in a row; then a plain release lets waiters of other
//!   processes race the local one.
//! - **Waking.** Otherwise, once a release is over, it wakes the first waiter that is not
//!   already busy with an attempt, and, if that one shares the lock (a reader), every sharing
//!   waiter behind it up to the next exclusive one. A waiter that acquires a lock with room left
//!   (a semaphore with free places, a reader) wakes the next waiter at once.
//!
//! The queue is process-wide, keyed by database, collection and lock name, and shared by every
//! lock object of that name, whether they come from one provider or were built apart. Its
//! waiters belong to *families* (the locks of one [`Family`](super::family::Family): one
//! provider's, or clones of one lock): a family talks to one deployment, but locks built apart
//! could talk to different ones, where a transfer, a wake or a single poller would be wrong, and
//! a `mongodb::Client` has no public identity to compare. So the queue serves each *group* of
//! families on its own: the poller is the first waiter of its group, and a release transfers to
//! and wakes waiters of its own group only. Families join a group on evidence that they reach
//! the same lock document: an attempt of one found stored, as the holder, the lock id of a lease
//! another holds in this process (lock ids are random UUIDs, so a document holding one is that
//! lease's document). A family keeps its group while it lives (a client never changes
//! deployment): one that leaves the queue and comes back waits in line at once, without an
//! attempt to prove it again. A family is forgotten when its `Family` is dropped, and the groups with
//! the queue once nobody uses the lock, so their memory is bounded by the live lock objects that
//! use the lock. A transfer also requires the releaser and the waiter to use the same write
//! concern.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use mongodb::options::WriteConcern;
use tokio::sync::Notify;

use super::schema::Layout;
use crate::sync::{Mutex, MutexGuard};

mod queue;
mod transfer;

pub(crate) use queue::Wake;
use queue::{Queue, Waiter};
pub(crate) use transfer::{Handoff, Offer, Taker, Transfer, takes_over};

use super::protocol::{self, Handover, InLine};

/// Identifies one lock across the process (database, collection and name: its queue) and the
/// family of locks that uses it (its `Family`'s id).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    lock: Arc<str>,
    family: u64,
}

impl Key {
    /// The family of locks (`Family`) this key belongs to.
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

static QUEUES: LazyLock<Mutex<HashMap<Arc<str>, Queue>>> = LazyLock::new(Mutex::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Families linked to another in some queue, until they are gone. Locked after `QUEUES` (by
/// `saw_stored`), before `GONE` (by `forget_family`).
static LINKED: LazyLock<Mutex<HashSet<u64>>> = LazyLock::new(Mutex::default);
/// Linked families that is gone, not yet forgotten by the queues (see `forget_family`).
static GONE: Mutex<Vec<u64>> = Mutex::new(Vec::new());

fn queues() -> MutexGuard<'static, HashMap<Arc<str>, Queue>> {
    let mut queues = QUEUES.lock();
    let gone = std::mem::take(&mut *GONE.lock());
    for family in gone {
        for queue in queues.values_mut() {
            queue.forget(family);
        }
    }
    queues
}

/// Forgets `family`, that is gone (its guards may outlive it), in every queue it was
/// linked in. Noted here, done by the next use of the queues: a family may be dropped while they
/// are locked (with an offer it made, say), and their lock is not reentrant. Families never
/// linked (most: every lock object of a provider starts with a family of its own that it drops)
/// cost nothing.
pub(crate) fn forget_family(family: u64) {
    let linked = LINKED.lock().remove(&family);
    if linked {
        GONE.lock().push(family);
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
    /// Joins the back of `key`'s queue; `shared` for a reader. A fair lock's waiter brings its
    /// `place` in line: its id, and the first place as its last reply showed it.
    pub(crate) fn join(key: &Key, shared: bool, place: Option<(&str, Option<String>)>) -> Ticket {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        let mut queues = queues();
        let queue = queues.entry(Arc::clone(&key.lock)).or_default();
        let place = place.map(|(place, head)| {
            queue.line_head = head;
            place.to_owned()
        });
        queue.waiters.push_back(Waiter {
            id,
            family: key.family,
            wake: Arc::clone(&wake),
            signal: None,
            busy: false,
            receiving: false,
            shared,
            place,
            offer: None,
        });
        drop(queues);
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
            replaced.taker.deliver(Transfer::NotDone);
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
                offer.taker.deliver(Transfer::NotDone);
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
            // A place that leaves the line without the lock: which place is first is not known.
            if acquired.is_none() && me.place.is_some() && me.place == queue.line_head {
                queue.line_head = None;
            }
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
            me.offer.map(|offer| offer.taker)
        });
        // An offer nobody took: nothing to deliver to a waiter that is gone, but the contract
        // is exactly one call.
        if let Some(Some(taker)) = deliver {
            taker.deliver(Transfer::NotDone);
        }
    }
}

/// Whether an exclusive lease of `key`'s lock is held in this process by its family's group.
pub(crate) fn held_here(key: &Key) -> bool {
    queues()
        .get(&key.lock)
        .is_some_and(|queue| queue.held_by_group_of(key.family))
}

/// Whether callers of `key`'s family's group already wait in line for its lock.
pub(crate) fn waiting_here(key: &Key) -> bool {
    queues()
        .get(&key.lock)
        .is_some_and(|queue| queue.first_of(key.family).is_some())
}

/// Wakes the first waiter of `key`'s lock in its family's group not busy with an attempt (and
/// the sharing ones behind it, for readers); returns their ids.
pub(crate) fn wake_first(key: &Key) -> Vec<u64> {
    with_queue(key, |queue| queue.wake_first(key.family)).unwrap_or_default()
}

/// A reply or a change event showed `head` as the first place of `key`'s lock's line (`None`:
/// nobody waits in line): a release wakes and hands over to its waiter only.
pub(crate) fn saw_line(key: &Key, head: Option<String>) {
    with_queue(key, |queue| queue.line_head = head);
}

/// A change stream saw someone hold `key`'s lock (an acquisition, a renewal): the next release
/// it pushes is not the echo of one that ended a run of transfers.
pub(crate) fn pushed_taken(key: &Key) {
    with_queue(key, |queue| queue.others_turn = false);
}

/// A change stream told `key`'s poller that the lock may be free: a lease ended (`may_echo`), or
/// the stream starts watching the lock (it may have missed any release before it). The first
/// waiter of the group is woken to attempt, as by a local release (if every waiter is attempting
/// already, the first attempts once more: its attempt may have reached the server before the
/// release); except the first release pushed after one that ended a run of transfers (most
/// likely that one, whose waiter it woke already). Someone holding the lock ends that
/// exception, and so does a stream starting to watch: the echo it skipped came before it.
pub(crate) fn pushed_free(key: &Key, may_echo: bool) {
    with_queue(key, |queue| {
        let echo = may_echo && queue.others_turn;
        queue.others_turn = false;
        if !echo {
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
            LINKED.lock().extend([holder, key.family]);
        }
    });
}

/// What the release of a local holder of `key`'s lease, stored as `releasing` says, with
/// `write_concern` (of a lock that is `fair` or not) does, as the protocol core decides
/// ([`protocol::handover`]): hand over to the
/// first waiter that is not busy, if it has an offer it [`takes_over`] with the same write concern
/// and the bound allows (and to the readers right behind it, for a writer's release); else a
/// plain release that wakes waiters.
pub(crate) fn handoff(
    key: &Key,
    write_concern: &WriteConcern,
    fair: bool,
    releasing: &Layout,
) -> Handoff {
    with_queue(key, |queue| {
        let head = queue.line_head.clone();
        let takes = |waiter: &Waiter| {
            waiter.offer.as_ref().and_then(|offer| {
                (offer.write_concern == *write_concern && offer.fair == fair)
                    .then(|| takes_over(releasing, &offer.layout))
                    .flatten()
            })
        };
        // (While a fair lock's first place is known, only its waiter could take the lock.)
        let line: Vec<(u64, InLine)> = queue
            .group_mut(key.family)
            .filter(|waiter| head.is_none() || waiter.place == head)
            .map(|waiter| {
                let busy = waiter.busy || waiter.receiving;
                let takes_over = takes(waiter);
                (waiter.id, InLine { busy, takes_over })
            })
            .collect();
        let places = match protocol::handover(
            line.iter().map(|&(_, waiter)| waiter),
            &mut queue.transfers_in_a_row,
        ) {
            Handover::To(places) => places,
            Handover::Release { run_ended } => {
                queue.others_turn |= run_ended;
                return Handoff::Wake;
            }
        };
        let chosen: Vec<u64> = places.into_iter().map(|place| line[place].0).collect();
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
        let lease = self.lease.lock().take();
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
mod tests;
