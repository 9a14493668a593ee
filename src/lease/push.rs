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
use mongodb::bson::{Bson, Document, doc};
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType, ResumeToken};
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::handoff::{self, Key};
use super::schema;
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

/// The lock an event is about, and whether it may have ended a lease stored there rather than
/// renewed or taken one. For every kind of lock document:
///
/// - a deletion ends every lease;
/// - an exclusive lock's release (or cleanup, or forced release) removes `lockId`; a writer's
///   removes `writer.id`; a waiting writer that gives up removes `waitingWriter` (readers may
///   join again);
/// - a semaphore place's or a reader's release takes its lease out of the array, which then
///   shrinks (`truncatedArrays`; the elements after it move up, which shows as changed
///   elements); where a server reports a whole array rewritten instead, that may be a release
///   too;
/// - before MongoDB 5.0 a pipeline update is logged, and shown, as a replacement: an exclusive
///   lock's document without `lockId` is free; any other replacement may have freed something;
/// - from MongoDB 5.0 on, a changed subdocument whose difference would be larger than its new
///   value is logged, and shown, as a whole-field update (server: `document_diff_calculator`):
///   ending a writer by setting `writer: {fencingToken}` (a forced release, a writer handing
///   over to readers) then arrives as `updatedFields.writer` without `removedFields`. So a
///   field is judged by its new value: a `writer` without an `id` was freed, one with an `id`
///   taken; a whole `readers` array rewritten may be a release;
/// - a semaphore's `holders` array written whole (a replacement, or a whole-field update) has
///   a free place when it is shorter than the semaphore's places (`maxCount` in a replacement,
///   `places` for the name in an update, which does not show it; unknown: it may be a release).
///   A place handed over in a release command shifts the array by one, which a server may log
///   as the whole array rewritten: its echo, with every place taken, wakes nobody.
///
/// Renewals (new `expiresAt`s) and acquisitions (a new `lockId`, writer or element) free
/// nothing, also a writer's acquisition that removes its own waiting-writer marker.
fn freed(
    event: &ChangeStreamEvent<Document>,
    places: impl Fn(&str) -> Option<u32>,
) -> Option<(String, bool)> {
    let name = event.document_key.as_ref()?.get_str(schema::ID).ok()?;
    let has_room = |holders: &Bson, places: Option<i64>| {
        let held = holders.as_array().map_or(0, Vec::len);
        places.is_none_or(|places| i64::try_from(held).unwrap_or(i64::MAX) < places)
    };
    let writer_id = schema::Layout::Writer.lock_id_path();
    let ends_lease = |field: &String| {
        [schema::LOCK_ID, schema::WAITING_WRITER, &writer_id].contains(&field.as_str())
    };
    let writer_has_holder = |value: &Bson| {
        value
            .as_document()
            .is_some_and(|writer| writer.contains_key(schema::EMBEDDED_ID))
    };
    let frees = |(field, value): (&String, &Bson)| match field.as_str() {
        schema::WRITER => !writer_has_holder(value),
        schema::HOLDERS => has_room(value, places(name).map(i64::from)),
        schema::READERS => true,
        _ => false,
    };
    let takes = |(field, value): (&String, &Bson)| {
        *field == writer_id || field == schema::WRITER && writer_has_holder(value)
    };
    let ends =
        match event.operation_type {
            OperationType::Delete => true,
            OperationType::Replace => event.full_document.as_ref().is_none_or(|document| {
                match document.get(schema::HOLDERS) {
                    Some(holders) => has_room(
                        holders,
                        document
                            .get(schema::MAX_COUNT)
                            .and_then(crate::token::read_i64),
                    ),
                    None => !document.contains_key(schema::LOCK_ID),
                }
            }),
            OperationType::Update => event.update_description.as_ref().is_some_and(|update| {
                let updated = || update.updated_fields.iter();
                let freed = update.removed_fields.iter().any(ends_lease)
                    || update
                        .truncated_arrays
                        .as_ref()
                        .is_some_and(|truncated| !truncated.is_empty())
                    || updated().any(frees);
                freed && !updated().any(takes)
            }),
            _ => false,
        };
    Some((name.to_owned(), ends))
}

/// Marks a stream unhealthy when its task ends.
struct Ending {
    key: WatcherKey,
    healthy: Arc<AtomicBool>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        unhealthy(&self.key, &self.healthy);
    }
}

/// How long a `getMore` of the stream waits for events. The stream checks for a change of its
/// subscribers between two `getMore`s only (a `getMore` is never cut short: the driver cannot
/// resume a cursor whose request was dropped), so a new name waits this long at most for its
/// stream, and the stream outlives its last subscriber by as much.
const AWAIT_EVENTS: Duration = Duration::from_secs(1);

/// How long a `getMore` of the stream is waited for (it returns after [`AWAIT_EVENTS`] when
/// nothing happens) before the stream counts as hung: then it is given up and opened again
/// from where it stood.
const GET_MORE_PATIENCE: Duration = Duration::from_secs(10);

/// The stream of one family and collection, for as long as it has subscribers.
async fn run(
    collection: Collection<Document>,
    key: WatcherKey,
    mut names: watch::Receiver<Vec<String>>,
    healthy: Arc<AtomicBool>,
) {
    // However the task ends (its runtime dropped included), its pollers stop counting on it.
    let _ending = Ending {
        key: key.clone(),
        healthy: Arc::clone(&healthy),
    };
    // Where the family's last stream of the collection stood, if it ended for lack of
    // subscribers, and the names it was filtered to (which `resume` continues).
    let kept = POSITIONS
        .lock()
        .remove(&key)
        .filter(|position| position.ended.elapsed() < POSITION_KEPT);
    let (mut resume, mut watched, mut unheard) = match &kept {
        Some(position) => (
            Some(position.token.clone()),
            position.names.clone(),
            position.unheard.clone(),
        ),
        None => (None, Vec::new(), HashSet::new()),
    };
    // Until this task opens a stream, the position it took is as old as it was.
    let mut since = kept.map(|position| position.ended);
    loop {
        // The watcher is gone (its last subscriber left): so is its stream.
        if names.has_changed().is_err() {
            return;
        }
        let filter = names.borrow_and_update().clone();
        if filter.is_empty() {
            // The last subscriber left: so does the stream, unless one came back meanwhile.
            let mut all = WATCHERS.lock();
            if all.get(&key).is_some_and(Watcher::is_unused) {
                if let Some(watcher) = all.remove(&key) {
                    unheard.extend(watcher.unheard);
                }
                // Before a new watcher can start (it needs `all`).
                if let Some(token) = resume {
                    let mut positions = POSITIONS.lock();
                    positions.retain(|_, position| position.ended.elapsed() < POSITION_KEPT);
                    let ended = since.unwrap_or_else(std::time::Instant::now);
                    positions.insert(
                        key,
                        Position {
                            token,
                            names: watched,
                            unheard,
                            ended,
                        },
                    );
                }
                return;
            }
            continue;
        }
        let pipeline = [doc! { "$match": {
            "$or": [
                { "documentKey._id": { "$in": &filter } },
                { "operationType": { "$in": ["drop", "invalidate"] } },
            ],
        } }];
        let watch = || {
            collection
                .watch()
                .pipeline(pipeline.clone())
                .max_await_time(AWAIT_EVENTS)
        };
        let opened = match &resume {
            Some(token) => match watch().start_after(token.clone()).await {
                Ok(stream) => Ok(stream),
                // The token is gone from the oplog (or refused): afresh.
                Err(_) => {
                    resume = None;
                    watch().await
                }
            },
            None => watch().await,
        };
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(error) => {
                unhealthy(&key, &healthy);
                // A server's refusal (no replica set, no `changeStream` privilege, no support
                // for an option) will not change soon: ask again much later. Anything else (the
                // network, an election) is retried soon.
                let pause = match &*error.kind {
                    mongodb::error::ErrorKind::Command(command)
                        if command.code == NOT_A_REPLICA_SET =>
                    {
                        NO_STREAMS_PAUSE
                    }
                    mongodb::error::ErrorKind::Command(_) => {
                        tracing::warn!(
                            %error,
                            collection = %collection.name(),
                            "cannot watch a lock collection: waiters poll instead"
                        );
                        NO_STREAMS_PAUSE
                    }
                    _ => {
                        tracing::debug!(%error, "cannot open the change stream of a lock collection");
                        REOPEN_PAUSE
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    changed = names.changed() => if changed.is_err() { return },
                }
                continue;
            }
        };
        healthy.store(true, Ordering::Relaxed);
        // A release of a name this stream did not watch until now may have come between its
        // poller's last attempt and now: that poller attempts at once. (Resumed, the names
        // watched before miss nothing; but a release of one the last stream saw while nobody
        // polled for it is told now.)
        if resume.is_none() {
            watched.clear();
        }
        let new: Vec<String> = filter
            .iter()
            .filter(|name| !watched.contains(name) || unheard.contains(*name))
            .cloned()
            .collect();
        unheard.clear();
        since = None;
        // A name that left the filter starts afresh when it comes back (it is new to the stream
        // then): nothing to keep for it, and what is kept stays bounded by the names watched.
        if let Some(watcher) = WATCHERS.lock().get_mut(&key) {
            watcher.unheard.retain(|name| filter.contains(name));
            watcher.places.retain(|name, _| filter.contains(name));
        }
        wake(&key, Some(&new), Pushed::MaybeMissed);
        watched = filter;
        loop {
            let Ok(next) = tokio::time::timeout(GET_MORE_PATIENCE, stream.next_if_any()).await
            else {
                tracing::debug!(
                    collection = %collection.name(),
                    "the change stream of a lock collection got no reply; opening it again"
                );
                unhealthy(&key, &healthy);
                resume = stream.resume_token().or(resume);
                break;
            };
            match next {
                Ok(Some(event)) => {
                    resume = Some(event.id.clone());
                    if matches!(
                        event.operation_type,
                        OperationType::Drop | OperationType::Invalidate
                    ) {
                        // Every lock of the collection is gone: all are free.
                        unhealthy(&key, &healthy);
                        resume = None;
                        wake(&key, None, Pushed::Freed);
                        break;
                    }
                    if let Some((name, ends)) = freed(&event, |name| places(&key, name)) {
                        let pushed = if ends { Pushed::Freed } else { Pushed::Taken };
                        wake(&key, Some(std::slice::from_ref(&name)), pushed);
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(%error, "the change stream of a lock collection failed");
                    unhealthy(&key, &healthy);
                    resume = stream.resume_token().or(resume);
                    tokio::time::sleep(REOPEN_PAUSE).await;
                    break;
                }
            }
            if !stream.is_alive() {
                unhealthy(&key, &healthy);
                resume = None;
                break;
            }
            // Between two `getMore`s: the position is safe to read.
            resume = stream.resume_token().or(resume);
            match names.has_changed() {
                Err(_) => return,
                Ok(true) => {
                    // Other names: open again from here. The same ones (a lock whose poller
                    // changed): go on.
                    let mut now = names.borrow_and_update().clone();
                    now.sort_unstable();
                    let mut before = watched.clone();
                    before.sort_unstable();
                    if now != before {
                        break;
                    }
                }
                Ok(false) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{Bson, Timestamp};

    fn event(operation: &str, more: Document) -> ChangeStreamEvent<Document> {
        let mut event = doc! {
            "_id": { "_data": "82" },
            "operationType": operation,
            "clusterTime": Bson::Timestamp(Timestamp { time: 1, increment: 1 }),
            "ns": { "db": "db", "coll": "locks" },
            "documentKey": { "_id": "job" },
        };
        event.extend(more);
        mongodb::bson::from_document(event).expect("a change event")
    }

    #[test]
    fn releases_deletions_and_replacements_without_a_holder_free_the_lock() {
        let freed_by = |operation: &str, more: Document| freed(&event(operation, more), |_| None);
        let released = doc! { "updateDescription": {
            "updatedFields": { "expiresAt": mongodb::bson::DateTime::now() },
            "removedFields": ["lockId"],
        } };
        assert_eq!(freed_by("update", released), Some(("job".to_owned(), true)));
        let renewed = doc! { "updateDescription": {
            "updatedFields": { "expiresAt": mongodb::bson::DateTime::now() },
            "removedFields": [],
        } };
        assert_eq!(freed_by("update", renewed), Some(("job".to_owned(), false)));
        assert_eq!(freed_by("delete", doc! {}), Some(("job".to_owned(), true)));
        // Before MongoDB 5.0 pipeline updates come as replacements: the document tells.
        let held = doc! { "fullDocument": { "_id": "job", "lockId": "a", "fencingToken": 1_i64 } };
        assert_eq!(freed_by("replace", held), Some(("job".to_owned(), false)));
        let ended = doc! { "fullDocument": { "_id": "job", "fencingToken": 1_i64 } };
        assert_eq!(freed_by("replace", ended), Some(("job".to_owned(), true)));
    }

    #[test]
    fn places_readers_and_writers_are_freed_by_what_their_releases_change() {
        let freed_by = |updated: Document, removed: Vec<&str>, truncated: Vec<Document>| {
            freed(
                &event(
                    "update",
                    doc! { "updateDescription": {
                        "updatedFields": updated,
                        "removedFields": removed,
                        "truncatedArrays": truncated,
                    } },
                ),
                |_| None,
            )
            .map(|(_, ends)| ends)
        };
        let now = mongodb::bson::DateTime::now();
        // A place released: the array shrinks (the element after it moves up).
        let moved = doc! { "holders.0": { "id": "b", "expiresAt": now } };
        let shrunk = vec![doc! { "field": "holders", "newSize": 1 }];
        assert_eq!(freed_by(moved, vec![], shrunk), Some(true));
        // A place renewed or taken: an element changes or comes; nothing shrinks.
        let renewed = doc! { "holders.1.expiresAt": now, "expiresAt": now };
        assert_eq!(freed_by(renewed, vec![], vec![]), Some(false));
        let joined = doc! { "readers.2": { "id": "c", "expiresAt": now } };
        assert_eq!(freed_by(joined, vec![], vec![]), Some(false));
        // A server that rewrote the whole array: it may have been a release.
        let rewritten = doc! { "readers": [] };
        assert_eq!(freed_by(rewritten, vec![], vec![]), Some(true));
        // A writer released, or a waiting writer gone: readers may join.
        assert_eq!(
            freed_by(doc! {}, vec!["writer.id", "writer.expiresAt"], vec![]),
            Some(true)
        );
        assert_eq!(freed_by(doc! {}, vec!["waitingWriter"], vec![]), Some(true));
        // A waiting writer that takes the lock removes its marker: nothing freed.
        let writer_taken = doc! { "writer.id": "w", "writer.expiresAt": now };
        assert_eq!(
            freed_by(writer_taken, vec!["waitingWriter"], vec![]),
            Some(false)
        );
        // A writer renewed, or a waiting writer's marker renewed: nothing freed.
        let writer_renewed = doc! { "writer.expiresAt": now, "waitingWriter.expiresAt": now };
        assert_eq!(freed_by(writer_renewed, vec![], vec![]), Some(false));
    }

    /// MongoDB 5.0 and later log a changed subdocument whose difference is larger than its new
    /// value as a whole-field update (server source, `document_diff_calculator.cpp`): the new
    /// value tells whether the writer was freed or taken. Fails when any whole `writer` counts
    /// as taken: waiters in other processes are then not woken by a writer's end.
    #[test]
    fn a_whole_writer_field_is_judged_by_its_new_value() {
        let freed_by = |updated: Document| {
            freed(
                &event(
                    "update",
                    doc! { "updateDescription": {
                        "updatedFields": updated,
                        "removedFields": [],
                        "truncatedArrays": [],
                    } },
                ),
                |_| None,
            )
            .map(|(_, ends)| ends)
        };
        let now = mongodb::bson::DateTime::now();
        // A forced release, or a writer handing over to readers: no id left.
        assert_eq!(
            freed_by(doc! { "writer": { "fencingToken": 7_i64 } }),
            Some(true)
        );
        let handed_to_readers = doc! {
            "writer": { "fencingToken": 7_i64 },
            "readers": [{ "id": "r", "expiresAt": now }],
        };
        assert_eq!(freed_by(handed_to_readers), Some(true));
        // A new writer, written whole.
        let taken = doc! { "writer": { "id": "w2", "expiresAt": now, "fencingToken": 8_i64 } };
        assert_eq!(freed_by(taken), Some(false));
    }

    /// A place handed over in a release command (the releaser's lease filtered out, the new one
    /// appended) shifts the array, which MongoDB 5.0 and later log as the whole array rewritten;
    /// before 5.0, as a replacement. With every place taken it frees nothing: the semaphore's
    /// next local waiter must not attempt (it failed 9 runs in 10 of
    /// `semaphore::each_release_hands_its_place_to_a_local_waiter_in_the_release_command`
    /// beside two busy loops, with an attempt after the first of three transfers).
    #[test]
    fn a_whole_holders_array_frees_a_place_only_when_shorter_than_the_places() {
        let now = mongodb::bson::DateTime::now();
        let holders = |count: usize| {
            (0..count)
                .map(|id| Bson::Document(doc! { "id": id.to_string(), "expiresAt": now }))
                .collect::<Vec<Bson>>()
        };
        let rewritten = |count: usize| {
            event(
                "update",
                doc! { "updateDescription": {
                    "updatedFields": { "holders": holders(count), "fencingToken": 9_i64 },
                    "removedFields": [],
                    "truncatedArrays": [],
                } },
            )
        };
        let three_places = |name: &str| (name == "job").then_some(3);
        let ends = |event: &ChangeStreamEvent<Document>, places: &dyn Fn(&str) -> Option<u32>| {
            freed(event, places).map(|(_, ends)| ends)
        };
        assert_eq!(ends(&rewritten(3), &three_places), Some(false));
        assert_eq!(ends(&rewritten(2), &three_places), Some(true));
        // Places unknown: it may have been a release.
        assert_eq!(ends(&rewritten(3), &|_| None), Some(true));
        // A replacement shows the stored places.
        let replaced = |count: usize| {
            event(
                "replace",
                doc! { "fullDocument": {
                    "_id": "job", "holders": holders(count), "maxCount": 3_i64,
                } },
            )
        };
        assert_eq!(ends(&replaced(3), &|_| None), Some(false));
        assert_eq!(ends(&replaced(2), &|_| None), Some(true));
    }

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
        let next = handoff::Ticket::join(&key, false);
        let _subscribed = Subscription::new(&runtime, &collection, &key, "job", None);
        let woken = tokio::time::timeout(Duration::from_secs(1), next.woken()).await;
        assert_eq!(woken.ok(), Some(handoff::Wake::Attempt));
    }
}
