//! Revocation: a waiter (or an operator) asks the holder of an exclusive lock to let go.
//!
//! - The asker: [`MongoDistributedLock::acquire_revoking`](crate::MongoDistributedLock::acquire_revoking)
//!   with a [`RevokeRequest`] (a grace period and a priority).
//! - An operator: [`Provider::request_revocation`](crate::Provider::request_revocation), or
//!   `dlock revoke NAME --grace 30s`.
//! - The holder: [`LockGuard::revocation_requested`](crate::LockGuard::revocation_requested)
//!   resolves with a [`Revocation`] (also shown in [`LockStatus::revocation`](crate::LockStatus::revocation));
//!   behind the traits, [`DistributedLockGuard::revocation_requested`](crate::DistributedLockGuard::revocation_requested).
//!
//! A holder that lets go in time hands the lock to the asker (kept for it once free; in the same
//! process, in the release command itself). A holder that ignores the request past its grace can
//! no longer renew or extend its lease: it loses the lock at its lease's end at the latest (its
//! lost signal fires first, as for any loss), and the asker takes it with the next fencing token.
//! See `DESIGN.md`, "Revocation", for the stored form and what the model checker proves.

use std::time::Duration;

use mongodb::bson::DateTime;

use crate::error::{Error, Result, shown_name};
use crate::options::LockOptions;

/// The longest grace a request may give (as every duration option).
const MAX_GRACE: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// What a revoking waiter asks of the holder: how long it gives the holder to let go, and how its
/// request ranks against other waiters' (a standing request is replaced only by one of higher
/// priority).
///
/// ```
/// use std::time::Duration;
/// use distributed_lock_mongodb::RevokeRequest;
///
/// let urgent = RevokeRequest::new(Duration::from_secs(10)).priority(5);
/// assert_eq!(urgent.grace(), Duration::from_secs(10));
/// assert_eq!(urgent.priority_value(), 5);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RevokeRequest {
    grace: Duration,
    priority: i32,
}

impl RevokeRequest {
    /// A request that gives the holder `grace` to let go (zero: renewals stop at once, and the
    /// lease ends at its expiry), with priority 0.
    pub fn new(grace: Duration) -> Self {
        RevokeRequest { grace, priority: 0 }
    }

    /// Sets the priority: a standing request of another waiter is replaced only by one of
    /// higher priority (an operator's request has `i32::MAX`). Defaults to 0.
    #[must_use]
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The grace given to the holder.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// The request's priority.
    pub fn priority_value(&self) -> i32 {
        self.priority
    }

    /// What the lock's commands store, once the request is known to be valid for lock `name`
    /// with `options`.
    pub(crate) fn checked(&self, name: &str, options: &LockOptions) -> Result<Ask> {
        let shown = shown_name(name);
        if options.fair() {
            return Err(Error::InvalidArgument(format!(
                "acquire_revoking of {shown:?}: the lock is fair (`fair(true)`), and a revoking \
                 wait would pass its line"
            )));
        }
        Ok(Ask {
            grace_millis: grace_millis(&shown, self.grace)?,
            priority: self.priority,
        })
    }
}

/// `grace` in milliseconds, if it is at most 365 days.
pub(crate) fn grace_millis(shown: &str, grace: Duration) -> Result<i64> {
    if grace > MAX_GRACE {
        return Err(Error::InvalidArgument(format!(
            "revocation of {shown:?}: the grace must be at most 365 days, got {grace:?}"
        )));
    }
    Ok(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX))
}

/// What the engine stores of a revoking wait's request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ask {
    pub(crate) grace_millis: i64,
    pub(crate) priority: i32,
}

/// A request to let go, as the holder (and a status read) sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revocation {
    /// The request's priority (an operator's is `i32::MAX`).
    pub priority: i32,
    /// When the grace runs out, by server time: from then on the lease is not renewed.
    pub grace_until: DateTime,
    /// How much of the grace was left at the read (zero once it ran out).
    pub grace_left: Duration,
    /// Whether an operator asked ([`Provider::request_revocation`](crate::Provider::request_revocation)):
    /// the lock is then kept for nobody once free; a waiter's request keeps it for that waiter.
    pub by_operator: bool,
}
