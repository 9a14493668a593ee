//! Push wake-ups across processes: while a family of locks has a waiter polling for a lock (the
//! first waiter of its group, see `handoff`), it watches the lock's collection with one change
//! stream, filtered to the names its pollers wait for, and a release of one of those names by
//! anyone (another process, an administrator, the TTL monitor) wakes the poller at once. The
//! poller then polls only at the slowest busy-wait pace, as a safety net.
//!
//! - **One stream per family and collection**, opened when its first poller subscribes and
//!   closed (its cursor killed by the driver) when the last one leaves; the next one, within
//!   10 s, resumes where it stood. Subscriptions are counted per name, so memory is bounded by the names
//!   waited for.
//! - **Which events wake**: those that may end a lease, for every kind of lock (see [`freed`]):
//!   a lock document deleted, an exclusive lock's `lockId` or a writer's id removed, an array of
//!   semaphore places or readers shrunk, a waiting writer's marker gone. Renewals and
//!   acquisitions wake nobody; a dropped collection wakes every subscriber.
//! - **Failures**: the driver resumes a stream after a resumable error by itself. Any other
//!   error, or the end of the stream (an `invalidate`), marks the stream unhealthy: pollers go
//!   back to their busy-wait pace at once, and the stream is opened again after a pause, resuming
//!   after the last event seen when it can (so no release in between is missed), afresh when
//!   the token is refused. A `getMore` with no reply after [`GET_MORE_PATIENCE`] (a half-open
//!   connection, which the driver never times out) counts the same: the stream is given up and
//!   opened again from where it stood, on another connection, with the names subscribed
//!   meanwhile. A server without change streams (a standalone `mongod`, error 40573) is asked
//!   again only after [`NO_STREAMS_PAUSE`].
//! - **Never relied upon for safety**: a wake only makes a waiter attempt, and a waiter that hears
//!   nothing still polls.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::Document;
use mongodb::change_stream::event::ResumeToken;
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::handoff::{self, Key};
use crate::sync::Mutex;

/// What a change stream told a poller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pushed {
    /// A lease of the lock ended (a release, a deletion, a dropped collection).
    Freed,
    /// Someone holds the lock (an acquisition, a renewal).
    Taken,
    /// The stream starts watching the lock: a release may have come since the last attempt.
    MaybeMissed,
}

impl Pushed {
    /// Tells `key`'s local waiters (see `handoff`).
    fn tell(self, key: &Key) {
        match self {
            Pushed::Taken => handoff::pushed_taken(key),
            Pushed::Freed => handoff::pushed_free(key, true),
            Pushed::MaybeMissed => handoff::pushed_free(key, false),
        }
    }
}

/// Pause before opening a stream again after it failed.
const REOPEN_PAUSE: Duration = Duration::from_secs(1);
/// Pause before asking again a server that has no change streams.
pub(crate) const NO_STREAMS_PAUSE: Duration = Duration::from_secs(60);
/// MongoDB's error for `$changeStream` on a standalone server.
const NOT_A_REPLICA_SET: i32 = 40573;

/// Where a lock's changes can be pushed from: its collection, its family (`Family`) and name.
pub(crate) type PushFrom = (Collection<Document>, u64, String);

/// Identifies a family's stream: family id, database and collection.
type WatcherKey = (u64, String, String);

struct Watcher {
    /// Subscribed names: who polls for each.
    names: HashMap<String, Subscribed>,
    /// Names a release was seen of while nobody polled for them (between a poller leaving and
    /// the next one subscribing, or before the stream learns that its filter changed): the next
    /// poller of such a name is woken to attempt as it subscribes. Only names of the stream's
    /// filter are kept (see `run`).
    unheard: HashSet<String>,
    /// The places of the semaphores among the names, as their pollers said (`None`: not a
    /// semaphore, or pollers that disagree), kept while the name is in the filter: an echo
    /// that comes after a poller left is judged as one that comes before (see [`freed`]).
    places: HashMap<String, Option<u32>>,
    /// Observed names (lock watches, see `watch`): notified of every event of their name.
    observers: HashMap<String, Vec<Arc<Notify>>>,
    /// The names, for the stream's filter (changed when a name comes or goes).
    filter: watch::Sender<Vec<String>>,
    healthy: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

/// The pollers of one subscribed name.
struct Subscribed {
    /// How many poll for it.
    pollers: usize,
    /// Wakes them.
    key: Key,
}

static WATCHERS: LazyLock<Mutex<HashMap<WatcherKey, Watcher>>> = LazyLock::new(Mutex::default);

/// Where a family's stream of a collection stood when it ended for lack of subscribers, the
/// names it watched, and when. The next stream of that family and collection, if it opens within
/// [`POSITION_KEPT`], resumes there: a poller that subscribes right after another left (the
/// lock changed hands in this process) misses nothing, and needs no attempt for names the last
/// stream watched (releases after the position are replayed, those it saw while nobody polled
/// are kept with it). Later, it starts afresh (replaying a long history would wake its pollers
/// for every release in it). Forgotten with the family, or when older than that.
static POSITIONS: LazyLock<Mutex<HashMap<WatcherKey, Position>>> = LazyLock::new(Mutex::default);

/// See [`POSITIONS`].
struct Position {
    token: ResumeToken,
    names: Vec<String>,
    /// Its watcher's unheard names (see [`Watcher`]).
    unheard: HashSet<String>,
    ended: std::time::Instant,
}

/// How long a stream's position is kept for the next stream of its family and collection.
const POSITION_KEPT: Duration = Duration::from_secs(10);

/// The family `family` is gone (its `Family` was dropped): so are its streams' positions.
pub(crate) fn forget_family(family: u64) {
    POSITIONS.lock().retain(|(of, _, _), _| *of != family);
}

/// A poller's subscription to releases of its lock; ends when dropped.
#[derive(Debug)]
pub(crate) struct Subscription {
    watcher: WatcherKey,
    name: String,
    healthy: Arc<AtomicBool>,
}

impl Subscription {
    /// Subscribes the poller of `key`'s lock `name` in `collection` (whose family `key` names)
    /// to releases of that name, opening the family's stream for the collection on `runtime` if
    /// it has none. `places`: the lock is a semaphore with that many.
    pub(crate) fn new(
        runtime: &Handle,
        collection: &Collection<Document>,
        key: &Key,
        name: &str,
        places: Option<u32>,
    ) -> Subscription {
        let watcher_key = (
            key.family(),
            collection.namespace().db,
            collection.name().to_owned(),
        );
        let mut watchers = WATCHERS.lock();
        let watcher = watcher_for(&mut watchers, runtime, collection, &watcher_key);
        let entry = watcher
            .names
            .entry(name.to_owned())
            .or_insert_with(|| Subscribed {
                pollers: 0,
                key: key.clone(),
            });
        entry.pollers += 1;
        let first = entry.pollers == 1;
        let unheard = first && watcher.unheard.remove(name);
        watcher
            .places
            .entry(name.to_owned())
            .and_modify(|known| {
                if *known != places {
                    *known = None;
                }
            })
            .or_insert(places);
        if first {
            watcher.names_changed();
        }
        let subscription = Subscription {
            watcher: watcher_key,
            name: name.to_owned(),
            healthy: Arc::clone(&watcher.healthy),
        };
        drop(watchers);
        // As a stream starting to watch: it also ends the "skip the echo" exception, since
        // what was kept may be any number of releases.
        if unheard {
            handoff::pushed_free(key, false);
        }
        subscription
    }

    /// Whether the stream is open: a release will wake the poller, which may poll slowly. (A
    /// name just subscribed joins the stream's filter at its next `getMore`, when the stream is
    /// opened again from where it stood, or afresh with a wake of that name: nothing is missed.)
    pub(crate) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut watchers = WATCHERS.lock();
        let Some(watcher) = watchers.get_mut(&self.watcher) else {
            return;
        };
        if let Some(entry) = watcher.names.get_mut(&self.name) {
            entry.pollers -= 1;
            if entry.pollers == 0 {
                watcher.names.remove(&self.name);
                watcher.names_changed();
            }
        }
        // With no name left, its task ends once its `getMore` is answered (dropping the stream
        // kills its cursor on the server), unless a subscriber came back meanwhile: the next
        // poller of a lock that changed hands goes on with the same stream, missing nothing.
    }
}

impl Watcher {
    /// The names its stream must watch: those of its pollers and of its observers.
    fn names_changed(&self) {
        let mut names: Vec<String> = self.names.keys().cloned().collect();
        names.extend(
            self.observers
                .keys()
                .filter(|name| !self.names.contains_key(*name))
                .cloned(),
        );
        self.filter.send_replace(names);
    }

    fn is_unused(&self) -> bool {
        self.names.is_empty() && self.observers.is_empty()
    }
}

/// The watcher of `key` (a family's stream of `collection`), started on `runtime` if there is
/// none, or again if its task ended with its runtime.
fn watcher_for<'a>(
    watchers: &'a mut HashMap<WatcherKey, Watcher>,
    runtime: &Handle,
    collection: &Collection<Document>,
    key: &WatcherKey,
) -> &'a mut Watcher {
    let start =
        |names, healthy| runtime.spawn(run(collection.clone(), key.clone(), names, healthy));
    let watcher = watchers.entry(key.clone()).or_insert_with(|| {
        let (filter, names) = watch::channel(Vec::new());
        let healthy = Arc::new(AtomicBool::new(false));
        let task = start(names, Arc::clone(&healthy));
        Watcher {
            names: HashMap::new(),
            unheard: HashSet::new(),
            places: HashMap::new(),
            observers: HashMap::new(),
            filter,
            healthy,
            task,
        }
    });
    if watcher.task.is_finished() {
        watcher.healthy.store(false, Ordering::Relaxed);
        watcher.task = start(watcher.filter.subscribe(), Arc::clone(&watcher.healthy));
    }
    watcher
}

/// An observer of one lock's changes (a lock watch); ends when dropped.
#[derive(Debug)]
pub(crate) struct Observation {
    watcher: WatcherKey,
    name: String,
    notify: Arc<Notify>,
}

impl Observation {
    /// Observes lock `name` of `collection` through family `family`'s stream (opened on
    /// `runtime` if need be).
    pub(crate) fn new(
        runtime: &Handle,
        collection: &Collection<Document>,
        family: u64,
        name: &str,
    ) -> Observation {
        let watcher_key = (
            family,
            collection.namespace().db,
            collection.name().to_owned(),
        );
        let notify = Arc::new(Notify::new());
        let mut watchers = WATCHERS.lock();
        let watcher = watcher_for(&mut watchers, runtime, collection, &watcher_key);
        let observers = watcher.observers.entry(name.to_owned()).or_default();
        observers.push(Arc::clone(&notify));
        if observers.len() == 1 {
            watcher.names_changed();
        }
        Observation {
            watcher: watcher_key,
            name: name.to_owned(),
            notify,
        }
    }

    /// Resolves at the next change of the lock the stream saw (at once if one came since the
    /// last call).
    pub(crate) async fn changed(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Observation {
    fn drop(&mut self) {
        let mut watchers = WATCHERS.lock();
        let Some(watcher) = watchers.get_mut(&self.watcher) else {
            return;
        };
        if let Some(observers) = watcher.observers.get_mut(&self.name) {
            observers.retain(|notify| !Arc::ptr_eq(notify, &self.notify));
            if observers.is_empty() {
                watcher.observers.remove(&self.name);
                watcher.names_changed();
            }
        }
    }
}

/// Tells the pollers of `names` (all subscribed names when `None`) what the stream saw (see
/// [`Pushed::tell`]), and their observers that something changed. A release of a name
/// nobody polls for right now is kept for its next poller (`Watcher::unheard`).
fn wake(watcher: &WatcherKey, names: Option<&[String]>, event: Pushed) {
    let wanted = |name: &String| names.is_none_or(|names| names.contains(name));
    let keys: Vec<Key> = match WATCHERS.lock().get_mut(watcher) {
        Some(watcher) => {
            if event != Pushed::Taken {
                let unheard = names.unwrap_or_default();
                for name in unheard
                    .iter()
                    .filter(|name| !watcher.names.contains_key(*name))
                {
                    watcher.unheard.insert(name.clone());
                }
            }
            for (_, observers) in watcher.observers.iter().filter(|(name, _)| wanted(name)) {
                for notify in observers {
                    notify.notify_one();
                }
            }
            watcher
                .names
                .iter()
                .filter(|(name, _)| wanted(name))
                .map(|(_, subscribed)| subscribed.key.clone())
                .collect()
        }
        None => return,
    };
    for key in keys {
        event.tell(&key);
    }
}

/// The stream showed `head` as the first place of the line of `name` (see `line`): its local
/// waiters learn it before the event's wake.
fn saw_line(watcher: &WatcherKey, name: &str, head: Option<String>) {
    let key = WATCHERS
        .lock()
        .get(watcher)
        .and_then(|watcher| watcher.names.get(name))
        .map(|subscribed| subscribed.key.clone());
    if let Some(key) = key {
        handoff::saw_line(&key, head);
    }
}

/// The places of the semaphore `name` whose pollers subscribed to `watcher`'s stream.
fn places(watcher: &WatcherKey, name: &str) -> Option<u32> {
    WATCHERS
        .lock()
        .get(watcher)?
        .places
        .get(name)
        .copied()
        .flatten()
}

/// The stream stopped being healthy: its pollers go back to their busy-wait pace at once.
fn unhealthy(watcher: &WatcherKey, healthy: &AtomicBool) {
    if !healthy.swap(false, Ordering::Relaxed) {
        return;
    }
    let keys: Vec<Key> = match WATCHERS.lock().get(watcher) {
        Some(watcher) => watcher
            .names
            .values()
            .map(|subscribed| subscribed.key.clone())
            .collect(),
        None => return,
    };
    for key in keys {
        handoff::poll_first(&key);
    }
}

mod events;
mod stream;

use stream::run;

#[cfg(test)]
mod tests {
    use super::*;

    /// A release the stream sees while nobody polls for its lock (a poller just left with the
    /// lock, the next has not subscribed yet) is told to the next poller as it subscribes: it
    /// would otherwise wait at the slowest pace for a release it missed.
    #[tokio::test]
    async fn a_release_seen_between_two_pollers_wakes_the_next_one_as_it_subscribes() {
        // Never reached: the stream's task only tries to open it.
        let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:9")
            .await
            .unwrap();
        let collection = client.database("db").collection::<Document>("unheard");
        let family = u64::MAX - 7;
        let key = handoff::key(family, "db", "unheard", "job");
        let runtime = Handle::current();
        // Nothing here yields to the stream's task: it cannot end the watcher meanwhile.
        drop(Subscription::new(&runtime, &collection, &key, "job", None));
        let watcher = (family, "db".to_owned(), "unheard".to_owned());
        wake(&watcher, Some(&["job".to_owned()]), Pushed::Freed);
        let next = handoff::Ticket::join(&key, false, None);
        let _subscribed = Subscription::new(&runtime, &collection, &key, "job", None);
        let woken = tokio::time::timeout(Duration::from_secs(1), next.woken()).await;
        assert_eq!(woken.ok(), Some(handoff::Wake::Attempt));
    }
}
