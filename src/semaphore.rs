//! A counting semaphore: at most `max_count` holders at once.

use std::sync::Arc;
use std::time::Duration;

use mongodb::Database;
use mongodb::bson::{Bson, Document, doc};
use tokio::runtime::Handle;

use crate::details::LockDetails;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::acquire::{self, Acquisition, ReadHolders, Wait};
use crate::lease::claim::{Claim, Granted, Request};
use crate::lease::family::Family;
use crate::lease::line;
use crate::lease::schema::{
    self, ACQUIRED_AT, DETAILS, EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, HOLDERS, ID, LINE, Layout,
    MAX_COUNT, PLACES, RESIZED_AT, SERVED_WAIT, WAITING,
};
use crate::lease::waiting_marker::{WaitingMarker, marker_lease_millis};
use crate::lease::{self, Problem, Target, admin, held};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use crate::token::FencingToken;
use crate::token::read_i64;
use crate::watch::{Changes, LockWatch};
use futures::future::BoxFuture;

/// The default collection of semaphores.
pub const DEFAULT_SEMAPHORE_COLLECTION: &str = "distributed_semaphores";

/// A field that lives only inside one update pipeline.
const ADMITTED: &str = "_admitted";

/// A named semaphore: at most `max_count` holders at once, each with its own lease and guard.
///
/// # Document
/// One document per name in `distributed_semaphores`:
///
/// ```text
/// { _id: <name>, maxCount: <n>, fencingToken: <last>,
///   holders: [ { id, expiresAt, acquiredAt, renewedAt, fencingToken, places, details }, ... ],
///   waiting: { id, places, expiresAt }, resizedAt, expiresAt }
/// ```
///
/// An attempt is one `findAndModify` (upsert) with a pipeline update that drops holders whose
/// lease ended (by server time) and appends ours if its places fit within the count beside
/// the others' (and a waiting mark's), all in one atomic step. Holders get a [`LockGuard`]: lease renewal, `lost`, `release` and release on drop
/// work exactly as for [`MongoDistributedLock`](crate::MongoDistributedLock); fencing tokens strictly increase across all
/// holders of the semaphore. `details` are the holder's [`LockDetails`] (by default this
/// process's host and id; see [`with_details`](Self::with_details)), shown by
/// [`holders`](Self::holders).
///
/// Waiters of one semaphore in one process queue: only the first polls the server, a release
/// wakes the first waiter at once, and a waiter that gets a place while more are free wakes the
/// next one, so places freed together are refilled together.
///
/// Every user of a name must agree on `max_count`: the first acquisition records it, and a
/// caller whose count differs gets [`Error::InvalidArgument`] naming both counts (the document
/// is left as it was). To change the count for every process, call
/// [`set_max_count`](Self::set_max_count): from then on the stored count rules.
///
/// A holder may take several places at once ([`acquire_many`](Self::acquire_many)): one lease,
/// all or none; a waiter for several is not starved by waiters for fewer. Its lease stores
/// `places: n` (absent for one place). [`available`](Self::available) reads how many are free.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::MongoDistributedSemaphore;
///
/// let downloads = MongoDistributedSemaphore::new("downloads", 3, &database);
/// let slot = downloads.acquire().await?; // at most 3 of these at a time, cluster-wide
/// slot.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MongoDistributedSemaphore {
    target: Arc<Target>,
    max_count: u32,
}

impl MongoDistributedSemaphore {
    /// A semaphore called `name` allowing `max_count` holders, in `database`'s
    /// `distributed_semaphores` collection, with default options, storing this process's
    /// [`LockDetails`] with each holder. A `max_count` of 0 is reported by the first `acquire*`
    /// call ([`Error::InvalidArgument`]).
    pub fn new(name: impl Into<String>, max_count: u32, database: &Database) -> Self {
        let mut target = Target::new(name.into(), database, DEFAULT_SEMAPHORE_COLLECTION);
        target.details = Some(LockDetails::new().to_document());
        MongoDistributedSemaphore {
            target: Arc::new(target),
            max_count,
        }
    }

    /// Stores the semaphore in `collection` instead of `distributed_semaphores`. Defaults to
    /// `distributed_semaphores`. An invalid name is reported by the first call that talks to
    /// the server ([`Error::InvalidCollectionName`]).
    #[must_use]
    pub fn with_collection(mut self, collection: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.target).set_collection(&collection.into());
        self
    }

    /// Replaces the options. Defaults to [`LockOptions::default`].
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        Arc::make_mut(&mut self.target).options = options;
        self
    }

    /// Stores `details` with each holder. Defaults to [`LockDetails::new()`] (this process's
    /// host and id).
    #[must_use]
    pub fn with_details(mut self, details: LockDetails) -> Self {
        Arc::make_mut(&mut self.target).details = Some(details.to_document());
        self
    }

    /// Joins `family` (a provider's).
    pub(crate) fn in_family(mut self, family: &Arc<Family>, refusal: Option<Problem>) -> Self {
        Arc::make_mut(&mut self.target).join_family(family, refusal);
        self
    }

    /// The current holders at one server instant; each shows its lease, fencing token and
    /// details.
    ///
    /// # Errors
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidCollectionName`].
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        let target = &self.target;
        target.check()?;
        admin::semaphore_holders(&target.collection, doc! { ID: &target.name }).await
    }

    /// Watches who holds it, without holding it: read now, then every `every`, and at once
    /// whenever its change stream (on a replica set or sharded cluster) shows a change; see
    /// [`LockWatch`].
    ///
    /// # Errors
    /// As [`holders`](Self::holders) for the first read; [`Error::InvalidArgument`] for a zero
    /// `every`; [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: a read, then a task of the returned watch.
    pub async fn watch(&self, every: Duration) -> Result<LockWatch> {
        LockWatch::start(
            self.clone(),
            every,
            Some(Changes::Stream(self.target.push_from())),
        )
        .await
    }

    /// **Dangerous**: ends every holder's lease now, so a semaphore whose places are stuck
    /// with hung holders can be used again. The holders are not asked: each learns it at its
    /// next renewal and signals `lost`, so for up to one extension cadence more than
    /// `max_count` may believe they hold a place. The document and its fencing token stay, so
    /// tokens keep increasing. Returns whether any lease was live. To end one holder's lease
    /// only, use [`Provider::force_release_holder`](crate::Provider::force_release_holder) with
    /// an entry of [`holders`](Self::holders).
    ///
    /// # Errors
    /// As [`holders`](Self::holders).
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the leases ended.
    pub async fn force_release_all(&self) -> Result<bool> {
        let target = &self.target;
        target.check()?;
        admin::force_release_semaphore(&target.collection, &target.name).await
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// The semaphore's options.
    pub fn options(&self) -> &LockOptions {
        &self.target.options
    }

    /// How many holders it allows at once.
    pub fn max_count(&self) -> u32 {
        self.max_count
    }

    /// Waits until one of the `max_count` places is acquired.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `max_count` of 0 or one that differs from the count the
    /// semaphore was created with (unless [`set_max_count`](Self::set_max_count) set it);
    /// otherwise as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_many(1).await
    }

    /// Waits at most `timeout` for a place; [`Error::Timeout`] when it runs out.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.acquire_many_timeout(1, timeout).await
    }

    /// One attempt: `Ok(None)` if `max_count` holders hold it.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_many_timeout(1, Duration::ZERO).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if the semaphore stayed full.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.try_acquire_many_timeout(1, timeout).await
    }

    /// Waits until `places` places are acquired at once, as one lease (one guard, one fencing
    /// token): all or none, in one command per attempt.
    ///
    /// A waiter for several places is not starved by waiters for fewer: while it waits (and
    /// has time left), it marks the semaphore's document with the places it needs, and others
    /// are admitted only into the places it does not need; the first such waiter holds that
    /// mark, a later one waits for it to be served first. The mark has a lease of its own (a
    /// few seconds, renewed by the waiter's attempts) and goes when the waiter wins, stops
    /// waiting, or dies.
    ///
    /// ```no_run
    /// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
    /// use distributed_lock_mongodb::MongoDistributedSemaphore;
    ///
    /// // A pool of 8 workers' worth of memory: a large import takes 5 of them at once.
    /// let memory = MongoDistributedSemaphore::new("memory", 8, &database);
    /// let import = memory.acquire_many(5).await?;
    /// import.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `places` of 0 or more than the semaphore's count (the
    /// constructor's, or the stored one once known: nothing is written then); otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire); dropping the future also removes its mark
    /// (in the background).
    pub async fn acquire_many(&self, places: u32) -> Result<LockGuard> {
        let wait = Wait::forever();
        wait.required(self.acquire_within(places, wait).await, self.name(), self)
            .await
    }

    /// Waits at most `timeout` for `places` places at once; [`Error::Timeout`] when it runs
    /// out. See [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many), plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_many`](Self::acquire_many).
    pub async fn acquire_many_timeout(&self, places: u32, timeout: Duration) -> Result<LockGuard> {
        let wait = Wait::at_most(timeout);
        wait.required(self.acquire_within(places, wait).await, self.name(), self)
            .await
    }

    /// One attempt for `places` places at once: `Ok(None)` if fewer are free. See
    /// [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many(&self, places: u32) -> Result<Option<LockGuard>> {
        self.try_acquire_many_timeout(places, Duration::ZERO).await
    }

    /// Attempts for up to `timeout` for `places` places at once: `Ok(None)` if fewer stayed
    /// free. See [`acquire_many`](Self::acquire_many).
    ///
    /// # Errors
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many_timeout(
        &self,
        places: u32,
        timeout: Duration,
    ) -> Result<Option<LockGuard>> {
        self.acquire_within(places, Wait::at_most(timeout)).await
    }

    /// How many places are free now, read from the server: the stored count (or this
    /// semaphore's `max_count`, before any acquisition) less the places live leases take. Places
    /// a waiting mark holds back (see [`acquire_many`](Self::acquire_many)) count as free.
    ///
    /// # Errors
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidCollectionName`].
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn available(&self) -> Result<u32> {
        let target = &self.target;
        target.check()?;
        let (max_count, taken) = admin::semaphore_places(&target.collection, &target.name).await?;
        let max_count = max_count.unwrap_or(i64::from(self.max_count));
        Ok(u32::try_from((max_count - taken).max(0)).unwrap_or(u32::MAX))
    }

    /// Sets the semaphore's number of places to `max_count`, for every process: from then on
    /// the stored count is the count, whatever the callers' own `max_count` (they are no longer
    /// refused for a count that differs). One command, which creates the document if need be.
    ///
    /// Shrinking never evicts a holder: holders keep their places, and new acquisitions wait
    /// until the places taken leave room within the new count. Growing admits waiters at their
    /// next attempt. The setting lasts as long as the document: a day after its last lease ended
    /// the TTL index deletes it, and the next acquisition records its caller's count again.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `max_count` of 0, or when the collection holds a
    /// document of that name that is not a semaphore's (nothing is written);
    /// [`Error::Mongo`] if the write fails; [`Error::InvalidCollectionName`].
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the count set.
    pub async fn set_max_count(&self, max_count: u32) -> Result<()> {
        let target = &self.target;
        target.check()?;
        if let Some(problem) = lease::max_count_problem(&target.name, max_count) {
            return Err(Error::InvalidArgument(problem));
        }
        admin::set_semaphore_count(
            &target.collection,
            &target.name,
            max_count,
            target.options.write_concern(),
        )
        .await
    }

    /// Acquires a place (waiting as [`acquire`](Self::acquire) does), runs `work` while it is
    /// held ([`LockGuard::run_while_held`]) and releases it: `work`'s output, or
    /// [`Error::LockLost`] if the place was lost first.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); [`Error::LockLost`] if the lock was lost before `work`
    /// completed (`work` is dropped then). A release that fails after `work` completed is
    /// logged, not returned: the work ran while the lock was held, and the lease ends by itself
    /// at its expiry at the latest.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases the lock in
    /// the background.
    pub async fn acquire_and_run<T>(&self, work: impl AsyncFnOnce(&LockGuard) -> T) -> Result<T> {
        let place = self.acquire().await?;
        let output = place.run_while_held(work(&place)).await;
        held::after_release(self.name(), output, place.release().await)
    }

    async fn acquire_within(&self, places: u32, wait: Wait) -> Result<Option<LockGuard>> {
        let target = &self.target;
        let checked = target.check().and_then(|()| {
            match lease::max_count_problem(&target.name, self.max_count) {
                Some(problem) => Err(Error::InvalidArgument(problem)),
                None => target.options.check_min_hold_unsupported("semaphore"),
            }
        });
        let checked = checked.and_then(|()| {
            match lease::places_problem(&target.name, places, self.max_count) {
                Some(problem) => Err(Error::InvalidArgument(problem)),
                None => Ok(()),
            }
        });
        // A waiter for several places marks what it needs while it waits; a fair semaphore's
        // waiter has a place in line instead, whatever it asks.
        let marker = match places {
            _ if target.options.fair() => Some(WaitingMarker::new(target, LINE)?),
            0 | 1 => None,
            _ => Some(WaitingMarker::new(target, WAITING)?),
        };
        let what = Acquisition {
            kind: LockKind::Semaphore,
            name: &target.name,
            collection: target.collection.name(),
            options: &target.options,
            checked,
            waiters: Some(&target.waiters),
            shared: false,
            // Every waiter of a fair semaphore attempts, to keep its place in line.
            renews_while_waiting: target.options.fair(),
            family: &target.family,
            push: Some(&target.collection),
            places: Some(self.max_count),
            holders: self,
        };
        let claim = Places {
            target: Arc::clone(target),
            places,
            max_count: self.max_count,
            marker: marker.clone(),
            wait,
        };
        let joined = acquire::acquire(what, wait, Arc::new(claim)).await;
        if let Some(marker) = &marker {
            marker.end(&joined).await;
        }
        Ok(joined?.map(|joined| joined.guard))
    }
}

/// A place just taken, and whether others are left.
struct Joined {
    guard: LockGuard,
    places_left: bool,
}

impl Granted for Joined {
    fn fencing_token(&self) -> Option<FencingToken> {
        Some(self.guard.fencing_token())
    }

    /// Several places can free up at once (holders that expired or were released by another
    /// process): the next local waiter tries at once instead of after its sleep.
    fn leaves_room(&self) -> bool {
        self.places_left
    }

    fn undelivered(self) {
        Granted::undelivered(self.guard);
    }
}

/// Where the holders' leases are stored.
fn places() -> Layout {
    Layout::Members(HOLDERS.to_owned())
}

/// A semaphore, as the engine claims it: join the holders with `places` places if they fit
/// within the count beside the live leases (and a waiting mark of another waiter), in one
/// `findAndModify` (upsert) whose pipeline drops ended leases first; or take places over in the
/// release command of a local holder, whose lease leaves the holders. A waiter for several
/// places places its `marker` while it has time left to wait.
struct Places {
    target: Arc<Target>,
    places: u32,
    max_count: u32,
    marker: Option<Arc<WaitingMarker>>,
    wait: Wait,
}

impl Places {
    /// What an attempt (or a takeover) with `lock_id` asks.
    fn ask<'a>(&'a self, lock_id: &'a str) -> Ask<'a> {
        // Only a waiter with time left to wait holds the others back; its last attempt still
        // names its mark, which holds nothing back from it.
        let waits = self.marker.is_some() && !self.wait.is_over();
        if let (Some(marker), true) = (&self.marker, waits) {
            marker.may_be_placed();
        }
        Ask {
            lock_id,
            places: self.places,
            max_count: self.max_count,
            marker: self.marker.as_ref().map(|marker| marker.id.as_str()),
            waits,
        }
    }
}

impl Claim for Places {
    type Won = Joined;
    const TAKES_OVER: bool = true;

    fn target(&self) -> &Target {
        &self.target
    }

    fn layout(&self) -> Layout {
        places()
    }

    fn place_in_line(&self) -> Option<&WaitingMarker> {
        self.marker.as_deref().filter(|marker| marker.in_line())
    }

    fn update(&self, lock_id: &str, replacing: Option<&str>) -> Vec<Document> {
        let (options, details) = (&self.target.options, self.target.details.as_ref());
        let ask = self.ask(lock_id);
        match replacing {
            None => join_update(ask, options, details),
            Some(releasing) => takeover_update(ask, options, details, releasing),
        }
    }

    /// The place, if `document` shows the lease `lock_id` among its holders.
    fn won(
        &self,
        runtime: &Handle,
        document: Document,
        lock_id: String,
        request: Request,
    ) -> Result<Option<Joined>> {
        let (target, max_count) = (&self.target, self.max_count);
        let place = match read_join_reply(&document, &lock_id, self.places, max_count) {
            JoinReply::OtherCount(stored) => {
                return Err(lease::max_count_mismatch(&target.name, &stored, max_count));
            }
            JoinReply::TooMany(stored) => {
                return Err(Error::InvalidArgument(format!(
                    "semaphore {:?}: asks for {} places of {stored}; it was set to {stored} places",
                    crate::error::shown_name(&target.name),
                    self.places,
                )));
            }
            JoinReply::Full => return Ok(None),
            JoinReply::Joined(place) => place,
        };
        let Some(lease) = target.hold(runtime, LockKind::Semaphore, &places(), lock_id, request)
        else {
            return Ok(None);
        };
        let Some(token) = place.token else {
            // Cannot happen on a conforming server; dropping the lease releases it.
            return Err(Error::UnexpectedReply(
                "the acquired semaphore place has no numeric fencingToken".to_owned(),
            ));
        };
        Ok(Some(Joined {
            guard: LockGuard::new(lease, FencingToken::new(token)).pushed_from(target.push_from()),
            places_left: place.places_left,
        }))
    }
}

/// What an attempt (or a transfer) learns from the semaphore document it returned.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum JoinReply {
    /// The document records another `maxCount` (shown as stored, or "none"), and it was never
    /// set by [`MongoDistributedSemaphore::set_max_count`].
    OtherCount(String),
    /// The attempt asks for more places than the semaphore has (`maxCount` as stored): it can
    /// never succeed.
    TooMany(i64),
    /// Our lease is not among the holders: not enough places are free.
    Full,
    /// Our lease is among the holders.
    Joined(Place),
}

/// A place our lease holds: its fencing token (`None` if unreadable), and whether places are
/// left beside it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) token: Option<i64>,
    pub(crate) places_left: bool,
}

/// Reads the reply to an attempt of `lock_id` for `places` places on a semaphore of `max_count`
/// places.
pub(crate) fn read_join_reply(
    document: &Document,
    lock_id: &str,
    places: u32,
    max_count: u32,
) -> JoinReply {
    let stored = document.get(MAX_COUNT).and_then(read_i64);
    let resized = document.get_datetime(RESIZED_AT).is_ok();
    if !resized && stored != Some(i64::from(max_count)) {
        let shown = document
            .get(MAX_COUNT)
            .map_or_else(|| "none".to_owned(), ToString::to_string);
        return JoinReply::OtherCount(shown);
    }
    let stored = stored.unwrap_or(i64::from(max_count));
    let holders: Vec<&Document> = document
        .get_array(HOLDERS)
        .map(|holders| holders.iter().filter_map(Bson::as_document).collect())
        .unwrap_or_default();
    let taken: i64 = holders.iter().map(|holder| schema::places_of(holder)).sum();
    match holders
        .iter()
        .find(|holder| holder.get_str(EMBEDDED_ID) == Ok(lock_id))
    {
        None if i64::from(places) > stored => JoinReply::TooMany(stored),
        None => JoinReply::Full,
        Some(ours) => JoinReply::Joined(Place {
            token: ours.get(FENCING_TOKEN).and_then(read_i64),
            places_left: taken < stored,
        }),
    }
}

/// What one attempt asks of a semaphore: a lease `lock_id` of `places` places, by a caller
/// whose semaphore has `max_count` places; a waiter for several places names its wait's mark
/// `marker` (which holds nothing back from it), and places or renews it while it `waits` (has
/// time left; see [`join_update`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ask<'a> {
    pub(crate) lock_id: &'a str,
    pub(crate) places: u32,
    pub(crate) max_count: u32,
    pub(crate) marker: Option<&'a str>,
    pub(crate) waits: bool,
}

/// The pipeline of a release of the place `releasing` that hands it to the local waiter of
/// `ask` (see `lease::handoff`): that holder's lease leaves the holders, and the same pipeline
/// as an attempt admits this one if its places fit.
pub(crate) fn takeover_update(
    ask: Ask<'_>,
    options: &LockOptions,
    details: Option<&Document>,
    releasing: &str,
) -> Vec<Document> {
    let mut update = places().release_update(releasing, schema::Ending::Release);
    update.extend(join_update(ask, options, details));
    update
}

/// The places the holders' live leases take: the sum of their `places` (1 where absent).
fn places_taken() -> Document {
    doc! { "$sum": { "$map": {
        "input": format!("${HOLDERS}"),
        "as": "m",
        "in": { "$ifNull": [format!("$$m.{PLACES}"), 1] },
    } } }
}

/// The pipeline of an attempt: drop ended leases and an ended waiting marker; record
/// `max_count` on first use; admit the lease if the stored count is the caller's (or was set by
/// [`MongoDistributedSemaphore::set_max_count`]), its places fit beside the places taken and
/// those another waiter's live marker holds back, and it is not there yet (a transfer sent again
/// after it applied): then take the next fencing token, append the lease (with its `places` when
/// more than one), and remove our marker. Not admitted, a waiter with a `marker` places (or
/// renews) it, unless another waiter's live marker is there or its places could never fit.
///
/// The marker is what keeps a waiter for several places from being starved by waiters for
/// fewer, who would otherwise take every place as it frees up: while it is live, others are
/// admitted only into the places it does not need.
pub(crate) fn join_update(
    ask: Ask<'_>,
    options: &LockOptions,
    details: Option<&Document>,
) -> Vec<Document> {
    let Ask {
        lock_id,
        places,
        max_count,
        marker,
        waits,
    } = ask;
    let (places, max_count) = (i64::from(places), i64::from(max_count));
    let admitted = format!("${ADMITTED}");
    let mut lease = doc! {
        EMBEDDED_ID: lock_id,
        EXPIRES_AT: schema::lease_end(options.expiry_millis()),
        ACQUIRED_AT: "$$NOW",
        schema::RENEWED_AT: "$$NOW",
        FENCING_TOKEN: format!("${FENCING_TOKEN}"),
    };
    if places > 1 {
        lease.insert(PLACES, places);
    }
    if let Some(details) = details {
        lease.insert(DETAILS, schema::literal(details));
    }
    // A fair semaphore's wait has a place in line instead of a mark: `marker` names it.
    let fair = options.fair();
    let line_wait = marker.filter(|_| fair);
    let marker = marker.filter(|_| !fair);
    if let Some(wait) = line_wait {
        lease.insert(SERVED_WAIT, wait);
    }
    let ours = marker.unwrap_or_default();
    let marker_id = format!("${WAITING}.{EMBEDDED_ID}");
    let ours_or_none = doc! { "$eq": [{ "$ifNull": [&marker_id, ours] }, ours] };
    let held_back = doc! { "$cond": [
        &ours_or_none,
        0_i64,
        { "$ifNull": [format!("${WAITING}.{PLACES}"), 0_i64] },
    ] };
    let fits = doc! { "$lte": [
        { "$add": [places_taken(), places, held_back] },
        format!("${MAX_COUNT}"),
    ] };
    let not_there = doc! { "$eq": [{ "$in": [lock_id, schema::member_ids(HOLDERS)] }, false] };
    // The stored count is the caller's, or was set by `set_max_count`.
    let agreed = doc! { "$or": [
        { "$eq": [format!("${MAX_COUNT}"), max_count] },
        { "$eq": [{ "$type": format!("${RESIZED_AT}") }, "date"] },
    ] };
    let keep: Bson = format!("${WAITING}").into();
    let when_not_admitted: Bson = match marker.filter(|_| waits) {
        Some(id) => {
            // (Not by a caller whose count is refused: it must leave the document as it was.)
            let placed = doc! { "$and": [
                &ours_or_none,
                not_there.clone(),
                { "$lte": [places, format!("${MAX_COUNT}")] },
                &agreed,
            ] };
            let ours = doc! {
                EMBEDDED_ID: id,
                PLACES: places,
                EXPIRES_AT: schema::lease_end(marker_lease_millis(options)),
            };
            doc! { "$cond": [placed, ours, keep.clone()] }.into()
        }
        None => keep.clone(),
    };
    let when_admitted: Bson = doc! { "$cond": [&ours_or_none, "$$REMOVE", keep] }.into();
    let mut admitted_when = vec![Bson::from(agreed.clone()), fits.into(), not_there.into()];
    let mut stages = Vec::new();
    let mut line_stage = None;
    if let Some(wait) = line_wait {
        stages.push(line::drop_ended());
        admitted_when.push(line::first_in_line(wait).into());
        let line_when_waiting: Bson = if waits {
            // Not once the wait was served (a holder came from it: this attempt is late, or
            // applied again).
            let served = doc! { "$in": [wait, { "$map": {
                "input": format!("${HOLDERS}"),
                "as": "m",
                "in": format!("$$m.{SERVED_WAIT}"),
            } }] };
            let joined = line::joined(wait, marker_lease_millis(options));
            doc! { "$cond": [served, format!("${LINE}"), joined] }.into()
        } else {
            format!("${LINE}").into()
        };
        line_stage = Some(doc! { "$set": { LINE: { "$cond": [
            &admitted,
            line::left(wait),
            line_when_waiting,
        ] } } });
    }
    stages.extend([
        doc! { "$set": {
            HOLDERS: schema::live_members(HOLDERS, None),
            MAX_COUNT: { "$ifNull": [format!("${MAX_COUNT}"), max_count] },
            WAITING: { "$cond": [
                { "$gt": [format!("${WAITING}.{EXPIRES_AT}"), "$$NOW"] },
                format!("${WAITING}"),
                "$$REMOVE",
            ] },
        } },
        doc! { "$set": { ADMITTED: { "$and": admitted_when } } },
        doc! { "$set": {
            FENCING_TOKEN: { "$cond": [
                &admitted,
                schema::next_fencing_token(FENCING_TOKEN),
                format!("${FENCING_TOKEN}"),
            ] },
            WAITING: { "$cond": [&admitted, when_admitted, when_not_admitted] },
        } },
        doc! { "$set": { HOLDERS: { "$cond": [
            &admitted,
            { "$concatArrays": [format!("${HOLDERS}"), [lease]] },
            format!("${HOLDERS}"),
        ] } } },
    ]);
    stages.extend(line_stage);
    stages.extend([
        doc! { "$unset": ADMITTED },
        schema::retain(options.expiry_millis().max(marker_lease_millis(options))),
    ]);
    if line_wait.is_some() {
        stages.push(line::tidy());
    }
    stages
}

impl ReadHolders for MongoDistributedSemaphore {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(self.holders())
    }
}

crate::traits::impl_distributed_lock!(MongoDistributedSemaphore);
crate::traits::impl_distributed_semaphore!(MongoDistributedSemaphore);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_reply_reads_the_count_the_place_and_the_room_left() {
        let holder = |id: &str, token: i64| doc! { EMBEDDED_ID: id, FENCING_TOKEN: token };
        let document = doc! {
            MAX_COUNT: 2_i64,
            HOLDERS: [holder("a", 7), holder("b", 8)],
        };
        assert_eq!(
            read_join_reply(&document, "b", 1, 2),
            JoinReply::Joined(Place {
                token: Some(8),
                places_left: false,
            })
        );
        assert_eq!(read_join_reply(&document, "c", 1, 2), JoinReply::Full);
        assert_eq!(
            read_join_reply(&document, "a", 1, 3),
            JoinReply::OtherCount("2".to_owned())
        );
        let first = doc! { MAX_COUNT: 3_i64, HOLDERS: [holder("a", 1)] };
        assert_eq!(
            read_join_reply(&first, "a", 1, 3),
            JoinReply::Joined(Place {
                token: Some(1),
                places_left: true,
            })
        );
        assert_eq!(
            read_join_reply(&doc! {}, "a", 1, 3),
            JoinReply::OtherCount("none".to_owned())
        );
    }

    #[test]
    fn a_join_reply_counts_places_and_follows_a_set_count() {
        let weighted = doc! {
            MAX_COUNT: 4_i64,
            HOLDERS: [
                { EMBEDDED_ID: "a", FENCING_TOKEN: 1_i64, PLACES: 3_i64 },
                { EMBEDDED_ID: "b", FENCING_TOKEN: 2_i64 },
            ],
        };
        assert_eq!(
            read_join_reply(&weighted, "a", 3, 4),
            JoinReply::Joined(Place {
                token: Some(1),
                places_left: false,
            }),
            "3 + 1 of 4 places taken"
        );
        assert_eq!(read_join_reply(&weighted, "c", 2, 4), JoinReply::Full);
        // Once set by `set_max_count`, the stored count rules, whatever the caller's.
        let resized = doc! {
            MAX_COUNT: 2_i64,
            RESIZED_AT: mongodb::bson::DateTime::now(),
            HOLDERS: [{ EMBEDDED_ID: "a", FENCING_TOKEN: 1_i64 }],
        };
        assert_eq!(read_join_reply(&resized, "b", 1, 5), JoinReply::Full);
        assert_eq!(read_join_reply(&resized, "b", 3, 5), JoinReply::TooMany(2));
        assert!(matches!(
            read_join_reply(&resized, "a", 1, 5),
            JoinReply::Joined(_)
        ));
    }
}
