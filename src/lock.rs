//! The exclusive lock.

use std::sync::Arc;
use std::time::Duration;

use mongodb::Database;
use mongodb::bson::Document;
use tokio::runtime::Handle;

use crate::details::LockDetails;
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::acquire::{self, Acquisition, ReadHolders, Wait};
use crate::lease::claim::{Claim, Request};
use crate::lease::family::Family;
use crate::lease::revoke::{self, Ask};
use crate::lease::schema::{self, AttemptReply, LINE, Layout, REVOKE};
use crate::lease::waiting_marker::WaitingMarker;
use crate::lease::{Problem, Target, admin, held};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use crate::revocation::RevokeRequest;
use crate::token::FencingToken;
use crate::watch::{Changes, LockWatch};
use futures::future::BoxFuture;

/// The default collection of exclusive locks, shared with DistributedLock.MongoDB.
pub const DEFAULT_LOCK_COLLECTION: &str = "distributed_locks";

/// A named mutual-exclusion lock stored in a MongoDB collection.
///
/// Cheap to clone (the clones share one lock definition); `Send + Sync`. Creating one talks to
/// no server. Callers waiting for the lock in one process queue up (a release hands it to the
/// longest-waiting one, in the release command itself): clones of one lock and locks of one
/// [`Provider`](crate::Provider) at once, and locks built apart with `new` once one of their
/// attempts found the other's lease stored (proof that they reach the same cluster; locks of one
/// name on different clusters never hand over to each other). With
/// [`fair(true)`](crate::LockOptionsBuilder::fair), waiters of every process are served in the
/// order they came. See the [crate docs](crate) for what it guarantees and [`design`](crate::design) for how it works.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::MongoDistributedLock;
///
/// let lock = MongoDistributedLock::new("nightly-report", &database);
/// let guard = lock.acquire().await?;
/// // ... only one instance runs this at a time ...
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MongoDistributedLock {
    target: Arc<Target>,
}

/// What a lock and its guards share.
impl MongoDistributedLock {
    /// A lock called `name` in `database`'s `distributed_locks` collection, with default
    /// options. The name is the document's `_id`, verbatim and case-sensitive; any string of up
    /// to 1 MiB works (a longer one is reported by the first `acquire*` call).
    pub fn new(name: impl Into<String>, database: &Database) -> Self {
        let target = Target::new(name.into(), database, DEFAULT_LOCK_COLLECTION);
        MongoDistributedLock {
            target: Arc::new(target),
        }
    }

    /// Stores the lock in `collection` instead of `distributed_locks`. Defaults to
    /// `distributed_locks`. An invalid name is reported by the first `acquire*` call
    /// ([`Error::InvalidCollectionName`]).
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

    /// Stores `details` with each acquisition, in a sixth field `details` of the lock document,
    /// so [`Provider::status`](crate::Provider::status) and
    /// [`Provider::held_locks`](crate::Provider::held_locks) can show who holds the lock.
    /// Defaults to no details.
    ///
    /// **This breaks interoperability with DistributedLock.MongoDB (.NET)**: its document class
    /// rejects unknown fields, so .NET clients fail to read a lock document that carries
    /// details. Leave it off for locks shared with .NET services.
    #[must_use]
    pub fn with_details(mut self, details: LockDetails) -> Self {
        Arc::make_mut(&mut self.target).details = Some(details.to_document());
        self
    }

    /// Joins `family` (a provider's) and stores `details` (a provider's choice).
    pub(crate) fn with_provider_settings(
        mut self,
        family: &Arc<Family>,
        details: Option<Document>,
        refusal: Option<Problem>,
    ) -> Self {
        let target = Arc::make_mut(&mut self.target);
        target.join_family(family, refusal);
        target.details = details;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.target.name
    }

    /// The lock as stored now, read at one server instant: its holder's lock id, lease and
    /// details while it is held, its last holder's otherwise; `None` if it was never acquired
    /// (or its document was deleted).
    ///
    /// # Errors
    /// [`Error::Mongo`] if the read fails; [`Error::InvalidCollectionName`],
    /// [`Error::InvalidArgument`] as for [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn status(&self) -> Result<Option<LockStatus>> {
        self.target.check()?;
        let read = admin::status(&self.target.collection, &self.target.name);
        admin::within(
            admin::patience(&self.target.options),
            &self.target.name,
            read,
        )
        .await
    }

    /// Who holds the lock now: its holder, read at one server instant, or nobody (free, or only
    /// kept taken by a finished holder's [`min_hold`](LockOptions::min_hold)). The same form
    /// as the other kinds' `holders`.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    ///
    /// # Cancel safety
    /// Cancel safe: a read only.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        Ok(self
            .status()
            .await?
            .into_iter()
            .filter(LockStatus::is_held)
            .collect())
    }

    /// Watches who holds the lock, without holding it: read now, then every `every`, and at
    /// once whenever its change stream (on a replica set or sharded cluster) shows a change; see
    /// [`LockWatch`].
    ///
    /// # Errors
    /// As [`status`](Self::status) for the first read; [`Error::InvalidArgument`] for a zero
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

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        &self.target.options
    }

    /// Waits until the lock is acquired.
    ///
    /// Attempts alternate with sleeps in the busy-wait range (see [`LockOptions`]). Each attempt
    /// is one `findAndModify`.
    ///
    /// Transient failures (no reply, a network error, no primary during an election) are
    /// retried at the busy-wait pace for up to `expiry` in a row before they are returned; an
    /// attempt whose outcome is unknown is cleaned up by its own lock id (see [`design`](crate::design)).
    ///
    /// # Errors
    /// - [`Error::InvalidCollectionName`] before anything is sent, for a collection name MongoDB
    ///   would reject; [`Error::InvalidArgument`] for a name over 1 MiB.
    /// - [`Error::Mongo`] if an attempt fails in the driver with an error that is not transient,
    ///   or transient errors persisted for `expiry`; the lock is not held then.
    /// - [`Error::NoReply`] ([`Operation::AttemptReply`](crate::Operation::AttemptReply)) if
    ///   attempts got no reply within `expiry` for `expiry` in a row (the lock is then not held:
    ///   a late win is released at once).
    /// - [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: every attempt runs to completion in a spawned task, which owns its reply
    /// limit and cleanup: an attempt still unanswered when this future is dropped is cleaned up
    /// at once by its own lock id, and if it wins the lock afterwards, it releases it at once.
    pub async fn acquire(&self) -> Result<LockGuard> {
        let wait = Wait::forever();
        wait.required(self.acquire_within(wait).await, self.name(), self)
            .await
    }

    /// Waits at most `timeout` for the lock. A zero timeout makes exactly one attempt; one too
    /// large to represent (such as `Duration::MAX`) waits forever. The sleep before the last
    /// attempt is shortened so that attempt starts at the deadline; an attempt in flight then
    /// still gets at least five seconds (at most `expiry`) to answer, and so does a release of
    /// this process that is handing the lock to this caller at the deadline: the call may
    /// return that much later than `timeout` (with the lock, if the handover succeeded).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the lock stayed busy until the deadline (naming what held it);
    /// [`Error::NoReply`] ([`Operation::AttemptReply`](crate::Operation::AttemptReply)) when an
    /// attempt got no reply in time and the deadline has passed; otherwise as
    /// [`acquire`](Self::acquire) (transient failures are retried only until the deadline).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        let wait = Wait::at_most(timeout);
        wait.required(self.acquire_within(wait).await, self.name(), self)
            .await
    }

    /// Makes one attempt; `Ok(None)` if the lock is held by someone else.
    ///
    /// # Errors
    /// As [`try_acquire_timeout`](Self::try_acquire_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.try_acquire_timeout(Duration::ZERO).await
    }

    /// Like [`acquire_timeout`](Self::acquire_timeout), but `Ok(None)` when the lock stays busy
    /// until the deadline.
    ///
    /// # Errors
    /// [`Error::NoReply`] only when an attempt got no reply in time (at least five seconds, at most
    /// `expiry`): an unreachable server is not reported as a busy lock. Otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_acquire_timeout(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.acquire_within(Wait::at_most(timeout)).await
    }

    /// Acquires the lock (waiting as [`acquire`](Self::acquire) does), runs `work` while it is
    /// held ([`LockGuard::run_while_held`]) and releases it: `work`'s output, or
    /// [`Error::LockLost`] if the lock was lost first.
    ///
    /// ```no_run
    /// # async fn demo(lock: distributed_lock_mongodb::MongoDistributedLock) -> distributed_lock_mongodb::Result<()> {
    /// let token = lock
    ///     .acquire_and_run(async |guard| {
    ///         // ... the work only one instance may do at a time ...
    ///         guard.fencing_token()
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
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
        let guard = self.acquire().await?;
        let output = guard.run_while_held(work(&guard)).await;
        held::after_release(self.name(), output, guard.release().await)
    }

    /// Waits at most `timeout` for the lock, asking its holder to let go: a revocation request
    /// with `request`'s grace and priority, which the holder sees through
    /// [`LockGuard::revocation_requested`].
    ///
    /// - While the lock is held, each attempt places (or renews) the request in the lock's
    ///   document, unless a standing request of another waiter ranks as high or higher (this
    ///   wait then waits as [`acquire_timeout`](Self::acquire_timeout) does, and asks as soon as
    ///   that request is gone). The grace counts from the first attempt that asked the current
    ///   holder.
    /// - Once the holder releases, the lock is kept for this wait: nobody else can take it while
    ///   the request lives (each attempt renews it; it lapses a few seconds after the wait ends).
    ///   A release in this process hands it over in its release command.
    /// - A holder that ignores the request past its grace cannot renew or extend its lease any
    ///   more: it loses the lock (its lost signal fires) at the lease's end at the latest, and
    ///   this wait takes it with the next fencing token, so the old holder's fenced writes are
    ///   refused.
    /// - A [`min_hold`](LockOptions::min_hold) window is a promise about the work: it is kept.
    /// - A zero `timeout` makes one attempt and asks nothing (a request lives only while a wait
    ///   renews it).
    ///
    /// Costs what a wait costs (one `findAndModify` per attempt, which carries the request),
    /// plus one `update` to take the request out if the wait ends without the lock. Callers that
    /// never ask pay nothing: their commands only check that no request keeps the lock for
    /// someone else. A lock with a request stored cannot be read by DistributedLock.MongoDB
    /// (.NET), as with details.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], before anything is sent, for a fair lock (a revoking wait
    /// would pass the line) or a grace over 365 days; otherwise as
    /// [`acquire_timeout`](Self::acquire_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire); the request lapses with its short lease if
    /// its removal cannot be sent.
    pub async fn acquire_revoking(
        &self,
        request: RevokeRequest,
        timeout: Duration,
    ) -> Result<LockGuard> {
        let ask = request.checked(self.name(), &self.target.options)?;
        let wait = Wait::at_most(timeout);
        let outcome = self.acquire_with(wait, Some(ask)).await;
        wait.required(outcome, self.name(), self).await
    }

    async fn acquire_within(&self, wait: Wait) -> Result<Option<LockGuard>> {
        self.acquire_with(wait, None).await
    }

    async fn acquire_with(&self, wait: Wait, revoking: Option<Ask>) -> Result<Option<LockGuard>> {
        let target = &self.target;
        // A fair lock's wait has a place in the lock's line, and a revoking wait a request in
        // its document, taken out when the wait ends without the lock (the winning attempt
        // takes it out itself).
        let line = match (target.options.fair(), revoking) {
            (_, Some(_)) => Some(WaitingMarker::new(target, REVOKE)?),
            (true, None) => Some(WaitingMarker::new(target, LINE)?),
            (false, None) => None,
        };
        let what = Acquisition {
            kind: LockKind::Exclusive,
            name: &target.name,
            collection: target.collection.name(),
            options: &target.options,
            checked: target.check(),
            waiters: Some(&target.waiters),
            shared: false,
            // Every waiter of a fair lock attempts, to keep its place in line.
            renews_while_waiting: line.is_some(),
            family: &target.family,
            push: Some(&target.collection),
            places: None,
            holders: self,
        };
        let exclusive = Exclusive {
            target: Arc::clone(target),
            line: line.clone().map(|place| (place, wait)),
            revoking,
        };
        let result = acquire::acquire(what, wait, Arc::new(exclusive)).await;
        if let Some(place) = line {
            place.end(&result).await;
        }
        result
    }
}

/// An exclusive lock, as the engine claims it: the lease in the lock's document, taken over in a
/// local holder's release with the same pipeline as an attempt. A fair lock's wait has its
/// place in the lock's `line`, which its attempts renew while it has time left to wait.
struct Exclusive {
    target: Arc<Target>,
    /// A fair lock's place in line, or a revoking wait's request.
    line: Option<(Arc<WaitingMarker>, Wait)>,
    /// What a revoking wait asks for.
    revoking: Option<Ask>,
}

impl Claim for Exclusive {
    type Won = LockGuard;
    const TAKES_OVER: bool = true;

    fn target(&self) -> &Target {
        &self.target
    }

    fn layout(&self) -> Layout {
        Layout::LockDocument
    }

    fn place_in_line(&self) -> Option<&WaitingMarker> {
        self.line.as_ref().map(|(place, _)| &**place)
    }

    fn update(&self, lock_id: &str, replacing: Option<&str>) -> Vec<Document> {
        let (options, details) = (&self.target.options, self.target.details.as_ref());
        let Some((place, wait)) = &self.line else {
            return match replacing {
                None => schema::acquire_update(lock_id, options, details, None),
                Some(replacing) => takeover_update(lock_id, options, details, replacing),
            };
        };
        let waits = !wait.is_over();
        if waits {
            place.may_be_placed();
        }
        if let Some(ask) = self.revoking {
            return revoke::revoking_acquire_update(
                lock_id, options, details, &place.id, ask, waits, replacing,
            );
        }
        crate::lease::line::fair_acquire_update(
            lock_id, options, details, &place.id, waits, replacing,
        )
    }

    fn won(
        &self,
        runtime: &Handle,
        document: Document,
        lock_id: String,
        request: Request,
    ) -> Result<Option<LockGuard>> {
        let AttemptReply::Acquired(token) = schema::read_attempt_reply(&document, &lock_id) else {
            return Ok(None);
        };
        let Some(lease) = self.target.hold(
            runtime,
            LockKind::Exclusive,
            &Layout::LockDocument,
            lock_id,
            request,
        ) else {
            return Ok(None);
        };
        match token {
            Some(token) => Ok(Some(
                LockGuard::new(lease, FencingToken::new(token))
                    .pushed_from(self.target.push_from()),
            )),
            // Cannot happen on a conforming server (we wrote the token ourselves); dropping
            // the lease releases it.
            None => Err(Error::UnexpectedReply(
                "the acquired lock document has no numeric fencingToken".to_owned(),
            )),
        }
    }
}

/// The update of a takeover of the lease `replacing` by `lock_id`: the lease its own attempt
/// would write, with the waiter's `options` (`min_hold` included) and `details`, not the
/// releaser's. (The model checker builds its transfers with this function too.)
pub(crate) fn takeover_update(
    lock_id: &str,
    options: &LockOptions,
    details: Option<&Document>,
    replacing: &str,
) -> Vec<Document> {
    schema::acquire_update(lock_id, options, details, Some(replacing))
}

/// What keeps the lock from being taken (for a watch, and a timeout's message): its holder, or
/// its last holder's `min_hold` window.
impl ReadHolders for MongoDistributedLock {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>> {
        Box::pin(async {
            Ok(self
                .status()
                .await?
                .into_iter()
                .filter(|status| status.is_held() || status.is_kept())
                .collect())
        })
    }
}

crate::traits::impl_distributed_lock!(MongoDistributedLock);
