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
use crate::lease::schema::{
    self, ACQUIRED_AT, DETAILS, EMBEDDED_ID, EXPIRES_AT, FENCING_TOKEN, HOLDERS, ID, Layout,
    MAX_COUNT,
};
use crate::lease::{self, Problem, Target, admin, held};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use crate::token::FencingToken;
use crate::token::read_i64;
use crate::watch::LockWatch;
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
///   holders: [ { id, expiresAt, acquiredAt, renewedAt, fencingToken, details }, ... ],
///   expiresAt }
/// ```
///
/// An attempt is one `findAndModify` (upsert) with a pipeline update that drops holders whose
/// lease ended (by server time) and appends ours if fewer than `max_count` remain, all in one
/// atomic step. Holders get a [`LockGuard`]: lease renewal, `lost`, `release` and release on drop
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
/// is left as it was). To change the count, let every holder go and delete the document.
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
        LockWatch::start(self.clone(), every, Some(self.target.push_from())).await
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
    /// semaphore was created with; otherwise as
    /// [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`MongoDistributedLock::acquire`](crate::MongoDistributedLock::acquire).
    pub async fn acquire(&self) -> Result<LockGuard> {
        let wait = Wait::forever();
        wait.required(self.acquire_within(wait).await, self.name(), self)
            .await
    }

    /// Waits at most `timeout` for a place; [`Error::Timeout`] when it runs out.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), plus [`Error::Timeout`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let wait = Wait::at_most(timeout);
        wait.required(self.acquire_within(wait).await, self.name(), self)
            .await
    }

    /// One attempt: `Ok(None)` if `max_count` holders hold it.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_timeout(Duration::ZERO).await
    }

    /// Attempts for up to `timeout`: `Ok(None)` if the semaphore stayed full.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_within(Wait::at_most(timeout)).await
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

    async fn acquire_within(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let target = &self.target;
        let checked = target.check().and_then(|()| {
            match lease::max_count_problem(&target.name, self.max_count) {
                Some(problem) => Err(Error::InvalidArgument(problem)),
                None => target.options.check_min_hold_unsupported("semaphore"),
            }
        });
        let what = Acquisition {
            kind: LockKind::Semaphore,
            name: &target.name,
            collection: target.collection.name(),
            options: &target.options,
            checked,
            waiters: Some(&target.waiters),
            shared: false,
            renews_while_waiting: false,
            family: &target.family,
            push: Some(&target.collection),
            places: Some(self.max_count),
            holders: self,
        };
        let places = Places {
            target: Arc::clone(target),
            max_count: self.max_count,
        };
        let joined = acquire::acquire(what, wait, Arc::new(places)).await?;
        Ok(joined.map(|joined| joined.guard))
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

/// A semaphore, as the engine claims it: join the holders if fewer than `max_count` hold a live
/// lease, in one `findAndModify` (upsert) whose pipeline drops ended leases first; or take a
/// place over in the release command of a local holder, whose lease leaves the holders.
struct Places {
    target: Arc<Target>,
    max_count: u32,
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

    fn update(&self, lock_id: &str, replacing: Option<&str>) -> Vec<Document> {
        let (options, details) = (&self.target.options, self.target.details.as_ref());
        match replacing {
            None => join_update(lock_id, self.max_count, options, details),
            Some(releasing) => {
                takeover_update(lock_id, self.max_count, options, details, releasing)
            }
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
        let place = match read_join_reply(&document, &lock_id, max_count) {
            JoinReply::OtherCount(stored) => {
                return Err(lease::max_count_mismatch(&target.name, &stored, max_count));
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
            guard: LockGuard::new(lease, FencingToken::new(token)),
            places_left: place.places_left,
        }))
    }
}

/// What an attempt (or a transfer) learns from the semaphore document it returned.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum JoinReply {
    /// The document records another `maxCount` (shown as stored, or "none").
    OtherCount(String),
    /// Our lease is not among the holders: every place is taken.
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

/// Reads the reply to an attempt of `lock_id` on a semaphore of `max_count` places.
pub(crate) fn read_join_reply(document: &Document, lock_id: &str, max_count: u32) -> JoinReply {
    if document.get(MAX_COUNT).and_then(read_i64) != Some(i64::from(max_count)) {
        let stored = document
            .get(MAX_COUNT)
            .map_or_else(|| "none".to_owned(), ToString::to_string);
        return JoinReply::OtherCount(stored);
    }
    let holders: Vec<&Document> = document
        .get_array(HOLDERS)
        .map(|holders| holders.iter().filter_map(Bson::as_document).collect())
        .unwrap_or_default();
    match holders
        .iter()
        .find(|holder| holder.get_str(EMBEDDED_ID) == Ok(lock_id))
    {
        None => JoinReply::Full,
        Some(ours) => JoinReply::Joined(Place {
            token: ours.get(FENCING_TOKEN).and_then(read_i64),
            places_left: holders.len() < usize::try_from(max_count).unwrap_or(usize::MAX),
        }),
    }
}

/// The pipeline of a release of the place `releasing` that hands it to the local waiter
/// `lock_id` (see `lease::handoff`): that holder's lease leaves the holders, and the same
/// pipeline as an attempt admits this one.
pub(crate) fn takeover_update(
    lock_id: &str,
    max_count: u32,
    options: &LockOptions,
    details: Option<&Document>,
    releasing: &str,
) -> Vec<Document> {
    let mut update = places().release_update(releasing, schema::Ending::Release);
    update.extend(join_update(lock_id, max_count, options, details));
    update
}

/// The pipeline of an attempt: drop ended leases; record `max_count` on first use; if the stored
/// count is ours, a place is free and our lease is not there yet (a transfer sent again after
/// it applied), take the next fencing token and append our lease.
pub(crate) fn join_update(
    lock_id: &str,
    max_count: u32,
    options: &LockOptions,
    details: Option<&Document>,
) -> Vec<Document> {
    let max_count = i64::from(max_count);
    let admitted = format!("${ADMITTED}");
    let mut lease = doc! {
        EMBEDDED_ID: lock_id,
        EXPIRES_AT: schema::lease_end(options.expiry_millis()),
        ACQUIRED_AT: "$$NOW",
        schema::RENEWED_AT: "$$NOW",
        FENCING_TOKEN: format!("${FENCING_TOKEN}"),
    };
    if let Some(details) = details {
        lease.insert(DETAILS, schema::literal(details));
    }
    vec![
        doc! { "$set": {
            HOLDERS: schema::live_members(HOLDERS, None),
            MAX_COUNT: { "$ifNull": [format!("${MAX_COUNT}"), max_count] },
        } },
        doc! { "$set": { ADMITTED: { "$and": [
            { "$eq": [format!("${MAX_COUNT}"), max_count] },
            { "$lt": [{ "$size": format!("${HOLDERS}") }, max_count] },
            { "$eq": [{ "$in": [lock_id, schema::member_ids(HOLDERS)] }, false] },
        ] } } },
        doc! { "$set": { FENCING_TOKEN: { "$cond": [
            &admitted,
            schema::next_fencing_token(FENCING_TOKEN),
            format!("${FENCING_TOKEN}"),
        ] } } },
        doc! { "$set": { HOLDERS: { "$cond": [
            &admitted,
            { "$concatArrays": [format!("${HOLDERS}"), [lease]] },
            format!("${HOLDERS}"),
        ] } } },
        doc! { "$unset": ADMITTED },
        schema::retain(options.expiry_millis()),
    ]
}

impl ReadHolders for MongoDistributedSemaphore {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(self.holders())
    }
}

crate::traits::impl_distributed_lock!(MongoDistributedSemaphore);

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
            read_join_reply(&document, "b", 2),
            JoinReply::Joined(Place {
                token: Some(8),
                places_left: false,
            })
        );
        assert_eq!(read_join_reply(&document, "c", 2), JoinReply::Full);
        assert_eq!(
            read_join_reply(&document, "a", 3),
            JoinReply::OtherCount("2".to_owned())
        );
        let first = doc! { MAX_COUNT: 3_i64, HOLDERS: [holder("a", 1)] };
        assert_eq!(
            read_join_reply(&first, "a", 3),
            JoinReply::Joined(Place {
                token: Some(1),
                places_left: true,
            })
        );
        assert_eq!(
            read_join_reply(&doc! {}, "a", 3),
            JoinReply::OtherCount("none".to_owned())
        );
    }
}
