//! The provider's table of names: who holds each lock, semaphore and reader-writer lock, and
//! who waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::RevokeRequest;
use crate::error::{Error, Result};
use crate::lease::max_count_mismatch;
use crate::lease::state::LeaseState;
use crate::lock_status::{LockKind, LockStatus};
use crate::sync::Mutex;
use crate::token::FencingToken;
use mongodb::bson::Document;

#[derive(Debug, Default)]
pub(super) struct Locks {
    pub(super) names: Mutex<HashMap<Key, Name>>,
    /// The documents of the document locks, by collection.
    pub(super) collections: Mutex<HashMap<String, Vec<StoredDocument>>>,
    /// Tells a document's lock holders apart.
    pub(super) next_acquisition: AtomicU64,
    /// Woken whenever a lock becomes free, and at shutdown.
    pub(super) freed: Notify,
    /// Set (with `names` locked) by [`MemoryLockProvider::shutdown`](super::MemoryLockProvider::shutdown): nothing is taken any more.
    pub(super) shut_down: AtomicBool,
    /// Told of every acquisition and release, for lock watches.
    pub(super) changes: watch::Sender<()>,
}

/// A lock's, a semaphore's or a reader-writer lock's name: the three kinds of one name are
/// independent, as they are in their separate collections.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) kind: Kind,
    pub(super) name: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Lock,
    Semaphore,
    ReaderWriter,
}

/// What an acquisition asks of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Claim {
    /// One of this many places: 1 for a lock, `max_count` for a semaphore.
    Places(u32),
    /// A read lock: shared with other readers, while no writer holds the lock or waits for it.
    Read,
    /// The write lock: alone.
    Write,
    /// The upgradeable read lock: a read lock while no other reader holds it upgradeable.
    UpgradeableRead,
    /// The upgrade of the upgradeable reader of this acquisition: the write lock beside that
    /// reader, once it is the only holder.
    Upgrade(u64),
}

impl Claim {
    /// Whether its holder reads (and takes no fencing token of its own).
    fn reads(self) -> bool {
        matches!(self, Claim::Read | Claim::UpgradeableRead)
    }

    /// Whether its waiter holds new readers back, as a waiting writer's marker does.
    pub(super) fn writes(self) -> bool {
        matches!(self, Claim::Write | Claim::Upgrade(_))
    }
}

/// The state of one name: its last fencing token, its holders, for a semaphore the
/// `max_count` its first acquisition recorded, and for a reader-writer lock how many writers
/// wait (holding back new readers, as the waiting-writer marker does).
#[derive(Debug, Default)]
pub(super) struct Name {
    pub(super) last_token: i64,
    pub(super) last_acquisition: u64,
    pub(super) holders: Vec<Holder>,
    pub(super) max_count: Option<u32>,
    pub(super) waiting_writers: usize,
    /// A semaphore's count was set by `set_max_count`: it is the count, whatever the callers'.
    pub(super) resized: bool,
    /// A semaphore's waiter for several places: its wait and the places it holds back.
    pub(super) mark: Option<(u64, u32)>,
    /// A lock's last holder's `min_hold` window: nobody takes it before then.
    pub(super) kept_until: Option<Instant>,
    /// A fair lock's waits, in arrival order: only the first may take it.
    pub(super) line: Vec<u64>,
    /// A lock's revocation request (see `super::revocation`).
    pub(super) revoke: Option<super::revocation::Request>,
}

/// What one attempt asks besides its claim: how many places (of a semaphore), the wait that
/// marks them while it waits (a waiter for several places), its place in a fair lock's line,
/// and the `min_hold` window its lease keeps after it ends.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ask {
    pub(super) places: u32,
    pub(super) wait: Option<u64>,
    pub(super) line: Line,
    pub(super) min_hold: Option<Duration>,
    /// A revoking wait's: its wait and what it asks of the holder.
    pub(super) revoking: Option<(u64, RevokeRequest)>,
}

/// How an attempt stands to a fair lock's line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// Not a fair lock, or an attempt that passes the line (an upgrade).
    Ignored,
    /// A fair reader-writer lock's reader: no place of its own, kept out while anyone waits in
    /// line.
    Behind,
    /// A fair lock's single attempt: no place, and only when nobody waits in line.
    Alone,
    /// A fair lock's wait: it takes its place at the end with its first attempt that fails.
    Place(u64),
}

#[derive(Debug)]
pub(super) struct Holder {
    /// Tells this acquisition from later ones of the same name.
    pub(super) acquisition: u64,
    /// Whether it holds a reader-writer lock to read.
    pub(super) reader: bool,
    /// How many of a semaphore's places it takes.
    pub(super) places: u32,
    /// Whether it holds a reader-writer lock to read, upgradeable.
    pub(super) upgradeable: bool,
    /// Its fencing token (a reader has none).
    pub(super) token: Option<i64>,
    /// When it was taken, and the `min_hold` window its lock keeps from then.
    pub(super) acquired_at: Instant,
    pub(super) min_hold: Option<Duration>,
    pub(super) state: Arc<LeaseState>,
}

impl Locks {
    /// Takes `claim` of `key` if the name allows it: the new guard's acquisition number and
    /// token (a reader's is the last writer's: readers have none of their own), and its state.
    /// [`Error::ShutDown`](crate::Error::ShutDown) once the provider is shut down; for a semaphore whose first
    /// acquisition recorded another `max_count`, [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    pub(super) fn try_take(
        &self,
        key: &Key,
        claim: Claim,
        ask: Ask,
    ) -> Result<Option<(u64, FencingToken, Arc<LeaseState>)>> {
        let mut names = self.names.lock();
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(Error::ShutDown);
        }
        let entry = names.entry(key.clone()).or_default();
        let now = Instant::now();
        let kept = entry.kept_until.is_some_and(|until| until > now);
        let first_in_line = match ask.line {
            Line::Ignored => true,
            Line::Behind | Line::Alone => entry.line.is_empty(),
            Line::Place(wait) => entry.line.first().is_none_or(|&first| first == wait),
        };
        // (Only a lock's wait may revoke; a request reserves the lock for its wait.)
        let reserved = (entry.revoke.as_ref())
            .is_some_and(|request| request.reserves_against(ask.revoking.map(|(wait, _)| wait)));
        let free = !kept
            && first_in_line
            && !reserved
            && match claim {
                Claim::Places(max_count) => {
                    let recorded = match key.kind {
                        Kind::Semaphore => *entry.max_count.get_or_insert(max_count),
                        _ => max_count,
                    };
                    if recorded != max_count && !entry.resized {
                        return Err(max_count_mismatch(
                            &key.name,
                            &recorded.to_string(),
                            max_count,
                        ));
                    }
                    if ask.places > recorded {
                        return Err(Error::InvalidArgument(format!(
                            "semaphore {:?}: asks for {} places of {recorded}; it was set to \
                         {recorded} places",
                            crate::error::shown_name(&key.name),
                            ask.places
                        )));
                    }
                    let taken: u64 = (entry.holders.iter())
                        .map(|holder| u64::from(holder.places))
                        .sum();
                    let held_back = match entry.mark {
                        Some((wait, places)) if Some(wait) != ask.wait => u64::from(places),
                        _ => 0,
                    };
                    let fits = taken + u64::from(ask.places) + held_back <= u64::from(recorded);
                    if !fits && ask.wait.is_some() && entry.mark.is_none() {
                        entry.mark = ask.wait.map(|wait| (wait, ask.places));
                    }
                    fits
                }
                Claim::Read => {
                    entry.waiting_writers == 0 && entry.holders.iter().all(|holder| holder.reader)
                }
                Claim::UpgradeableRead => {
                    entry.waiting_writers == 0
                        && (entry.holders.iter()).all(|holder| holder.reader && !holder.upgradeable)
                }
                Claim::Write => entry.holders.is_empty(),
                // Whatever writer waits: it waits for this very reader.
                Claim::Upgrade(reader) => {
                    matches!(entry.holders.as_slice(), [only] if only.acquisition == reader)
                }
            };
        if !free {
            if let Some((wait, request)) = ask.revoking {
                super::revocation::ask(self, entry, wait, request);
            }
            if let Line::Place(wait) = ask.line
                && !entry.line.contains(&wait)
            {
                entry.line.push(wait);
            }
            return Ok(None);
        }
        if let Line::Place(wait) = ask.line {
            entry.line.retain(|&waiting| waiting != wait);
        }
        if !claim.reads() {
            entry.last_token += 1;
        }
        // (As the new holder's document replaces the old: the request goes. A semaphore's
        // request stays beside the other places.)
        if key.kind == Kind::Lock {
            entry.revoke = None;
        }
        if ask.wait.is_some() && entry.mark.map(|(wait, _)| wait) == ask.wait {
            entry.mark = None;
        }
        entry.last_acquisition += 1;
        let state = LeaseState::without_deadline();
        entry.holders.push(Holder {
            acquisition: entry.last_acquisition,
            reader: claim.reads(),
            places: ask.places,
            upgradeable: claim == Claim::UpgradeableRead,
            token: (!claim.reads()).then_some(entry.last_token),
            acquired_at: now,
            min_hold: ask.min_hold,
            state: Arc::clone(&state),
        });
        let taken = (entry.last_acquisition, FencingToken::new(entry.last_token));
        drop(names);
        self.changed();
        Ok(Some((taken.0, taken.1, state)))
    }

    /// Tells the lock watches that something changed.
    pub(super) fn changed(&self) {
        self.changes.send_replace(());
    }

    /// The holders of `key` now, as `holders()` shows them: each acquisition's number is its
    /// lock id (`memory-<n>`); the double's leases have no end (`remaining` is `Duration::MAX`).
    /// `with_kept`: where nobody holds it, a `min_hold` window that keeps it taken shows as one
    /// entry without a lock id (as a watch and a job's status show it).
    pub(super) fn holders(&self, key: &Key, with_kept: bool) -> Vec<LockStatus> {
        let names = self.names.lock();
        let Some(entry) = names.get(key) else {
            return Vec::new();
        };
        let now = Instant::now();
        if let Some(until) = entry
            .kept_until
            .filter(|&until| with_kept && entry.holders.is_empty() && until > now)
        {
            return vec![LockStatus {
                name: key.name.clone(),
                kind: LockKind::Exclusive,
                lock_id: None,
                acquired_at: None,
                expires_at: None,
                renewed_at: None,
                fencing_token: Some(FencingToken::new(entry.last_token)),
                remaining: None,
                kept: Some(until - now),
                min_hold_until: None,
                details: None,
                places: 1,
                upgradeable: false,
                revocation: None,
            }];
        }
        (entry.holders.iter())
            .map(|holder| LockStatus {
                name: key.name.clone(),
                kind: match key.kind {
                    Kind::Lock => LockKind::Exclusive,
                    Kind::Semaphore => LockKind::Semaphore,
                    Kind::ReaderWriter if holder.reader => LockKind::Read,
                    Kind::ReaderWriter => LockKind::Write,
                },
                lock_id: Some(format!("memory-{}", holder.acquisition)),
                acquired_at: None,
                expires_at: None,
                renewed_at: None,
                fencing_token: holder.token.map(FencingToken::new),
                remaining: Some(std::time::Duration::MAX),
                kept: None,
                min_hold_until: None,
                details: None,
                places: holder.places,
                upgradeable: holder.upgradeable,
                revocation: (entry.revoke.as_ref())
                    .and_then(|request| request.seen_by(holder.acquisition)),
            })
            .collect()
    }

    /// Ends the lease of `key`'s acquisition `acquisition` (`state`), if it still holds it, as a
    /// lease that ran out: lost first, then free (its `min_hold` window kept).
    pub(super) fn expire(&self, key: &Key, acquisition: u64, state: &LeaseState) {
        let names = self.names.lock();
        let holds = names.get(key).is_some_and(|entry| {
            (entry.holders.iter()).any(|holder| holder.acquisition == acquisition)
        });
        if holds {
            // (Under the lock: its release cannot come in between.)
            state.mark_lost();
        }
        drop(names);
        if holds {
            self.free(key, acquisition);
        }
    }

    /// Until when `key` is kept taken by its last holder's `min_hold` window, if it is now.
    pub(super) fn kept_until(&self, key: &Key) -> Option<Instant> {
        let names = self.names.lock();
        let until = names.get(key)?.kept_until?;
        (until > Instant::now()).then_some(until)
    }

    /// Takes the fair lock's wait `wait` out of `key`'s line (its wait ended).
    pub(super) fn leave_line(&self, key: &Key, wait: u64) {
        let left = self.names.lock().get_mut(key).is_some_and(|entry| {
            let before = entry.line.len();
            entry.line.retain(|&waiting| waiting != wait);
            entry.line.len() < before
        });
        if left {
            self.freed.notify_waiters();
        }
    }

    /// A new wait's number, for a semaphore's mark.
    pub(super) fn new_wait(&self) -> u64 {
        self.next_acquisition.fetch_add(1, Ordering::SeqCst)
    }

    /// Removes the mark of `wait` from `key`, if it is still there (its wait ended).
    pub(super) fn clear_mark(&self, key: &Key, wait: u64) {
        let cleared = self.names.lock().get_mut(key).is_some_and(|entry| {
            let ours = entry.mark.is_some_and(|(marked, _)| marked == wait);
            if ours {
                entry.mark = None;
            }
            ours
        });
        if cleared {
            self.freed.notify_waiters();
            self.changed();
        }
    }

    /// A semaphore's places free now: its count (recorded, or `max_count` before any
    /// acquisition) less the places its holders take.
    pub(super) fn available(&self, key: &Key, max_count: u32) -> u32 {
        let names = self.names.lock();
        let Some(entry) = names.get(key) else {
            return max_count;
        };
        let taken: u64 = (entry.holders.iter())
            .map(|holder| u64::from(holder.places))
            .sum();
        let count = u64::from(entry.max_count.unwrap_or(max_count));
        u32::try_from(count.saturating_sub(taken)).unwrap_or(u32::MAX)
    }

    /// Sets a semaphore's count for every caller (`set_max_count`).
    pub(super) fn set_count(&self, key: &Key, max_count: u32) {
        {
            let mut names = self.names.lock();
            let entry = names.entry(key.clone()).or_default();
            entry.max_count = Some(max_count);
            entry.resized = true;
        }
        self.freed.notify_waiters();
        self.changed();
    }

    /// Counts a writer of `key` as waiting until the returned value is dropped.
    pub(super) fn writer_waits(self: &Arc<Self>, key: &Key) -> WaitingWriter {
        self.names
            .lock()
            .entry(key.clone())
            .or_default()
            .waiting_writers += 1;
        WaitingWriter {
            locks: Arc::clone(self),
            key: key.clone(),
        }
    }

    /// Refuses every acquisition from now on, and ends every lease: each is lost, then freed.
    pub(super) fn shut_down(&self) {
        let ended: Vec<Arc<LeaseState>> = {
            let mut names = self.names.lock();
            self.shut_down.store(true, Ordering::SeqCst);
            let mut collections = self.collections.lock();
            let documents = collections
                .values_mut()
                .flatten()
                .filter_map(|stored| stored.holder.take());
            names
                .values_mut()
                .flat_map(|entry| entry.holders.drain(..))
                .chain(documents)
                .map(|holder| holder.state)
                .collect()
        };
        for state in ended {
            state.mark_lost();
        }
        self.freed.notify_waiters();
        self.changed();
    }

    /// Frees the place of `key` that acquisition `acquisition` holds, if it still does.
    pub(super) fn free(&self, key: &Key, acquisition: u64) -> bool {
        let freed = {
            let mut names = self.names.lock();
            names.get_mut(key).is_some_and(|entry| {
                let Some(position) =
                    (entry.holders.iter()).position(|holder| holder.acquisition == acquisition)
                else {
                    return false;
                };
                let holder = entry.holders.remove(position);
                // Its window outlives the lease (released, expired or lost alike).
                if let Some(window) = holder.min_hold {
                    let until = holder.acquired_at + window;
                    entry.kept_until = entry.kept_until.max(Some(until));
                }
                true
            })
        };
        if freed {
            self.freed.notify_waiters();
            self.changed();
        }
        freed
    }

    /// The lease state of the holder of the exclusive lock `name`.
    pub(super) fn holder_state(&self, name: &str) -> Option<(u64, Arc<LeaseState>)> {
        let names = self.names.lock();
        let holder = names.get(&Key::lock(name))?.holders.first()?;
        Some((holder.acquisition, Arc::clone(&holder.state)))
    }
}

/// A writer waiting for a reader-writer lock, holding back new readers until it is dropped.
#[derive(Debug)]
pub(super) struct WaitingWriter {
    pub(super) locks: Arc<Locks>,
    pub(super) key: Key,
}

impl Drop for WaitingWriter {
    fn drop(&mut self) {
        if let Some(entry) = self.locks.names.lock().get_mut(&self.key) {
            entry.waiting_writers -= 1;
        }
        // Readers held back by this writer may go in now.
        self.locks.freed.notify_waiters();
        self.locks.changed();
    }
}

impl Key {
    pub(super) fn new(kind: Kind, name: impl Into<String>) -> Key {
        Key {
            kind,
            name: name.into(),
        }
    }

    pub(super) fn lock(name: &str) -> Key {
        Key::new(Kind::Lock, name)
    }
}

/// A stored document of an in-memory collection, with its lock.
#[derive(Debug)]
pub(super) struct StoredDocument {
    pub(super) document: Document,
    /// The fencing token of its last lock (0: never locked).
    pub(super) last_token: i64,
    pub(super) holder: Option<Holder>,
}
