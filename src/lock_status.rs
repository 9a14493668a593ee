//! The status of a lock's holder, as read by the administration calls, and filters on it.

use std::time::Duration;

use mongodb::bson::DateTime;

use crate::details::LockDetails;
use crate::token::FencingToken;

/// What kind of lock a [`LockStatus`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// A [`MongoDistributedLock`](crate::MongoDistributedLock) (also a member of a composite).
    Exclusive,
    /// The writer of a [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock).
    Write,
    /// A reader of a [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock).
    Read,
    /// A holder of a [`MongoDistributedSemaphore`](crate::MongoDistributedSemaphore).
    Semaphore,
    /// The holder of a document locked by a [`DocumentLock`](crate::DocumentLock); its name is
    /// `collection/_id`.
    Document,
}

impl LockKind {
    /// The kind as the tracing spans and the metrics' `kind` label show it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            LockKind::Exclusive => "exclusive",
            LockKind::Write => "write",
            LockKind::Read => "read",
            LockKind::Semaphore => "semaphore",
            LockKind::Document => "document",
        }
    }
}

/// The kind in lower case, as `dlock`, the tracing spans and the metrics' `kind` label show it:
/// `exclusive`, `write`, `read`, `semaphore` or `document`.
impl std::fmt::Display for LockKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.label())
    }
}

/// One holder of a lock (or, for an exclusive lock that is free, its last holder), read at one
/// server instant.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The lock's name.
    pub name: String,
    /// What kind of lock it is.
    pub kind: LockKind,
    /// The current holder's lock id (one per acquisition), while the lock is held.
    pub lock_id: Option<String>,
    /// When the current (or last) holder acquired it, by server time.
    pub acquired_at: Option<DateTime>,
    /// When the lease ends (or ended), by server time.
    pub expires_at: Option<DateTime>,
    /// When the holder last acquired or renewed its lease, by server time. Recorded by the
    /// acquisition and renewal commands themselves (no extra command); `None` for exclusive
    /// locks that keep DistributedLock.MongoDB's document layout, that is, unless they store
    /// details (see [`MongoDistributedLock::with_details`](crate::MongoDistributedLock::with_details)).
    pub renewed_at: Option<DateTime>,
    /// The fencing token of the current (or last) acquisition; `None` for readers, which have
    /// none.
    pub fencing_token: Option<FencingToken>,
    /// How much of the lease is left by server time; `None` when the lock is not held.
    pub remaining: Option<Duration>,
    /// For an exclusive lock that nobody holds: how much longer its last holder's
    /// [`min_hold`](crate::LockOptions::min_hold) window keeps it taken (until `expires_at`), by
    /// server time at the read. Nobody can acquire it meanwhile (a [`Job`](crate::Job) that ran
    /// less than a window ago). `None` otherwise.
    pub kept: Option<Duration>,
    /// The end of the current (or last) holder's [`min_hold`](crate::LockOptions::min_hold)
    /// window, `acquired_at + min_hold` by server time, for an exclusive lock whose holder has
    /// one: until then the lock stays taken whatever becomes of its holder, a forced release
    /// included.
    pub min_hold_until: Option<DateTime>,
    /// Who holds it (owner, host, process id), if the holder stored details (see
    /// [`LockDetails`]).
    pub details: Option<LockDetails>,
    /// How many places the holder takes: more than one for a semaphore's holder that acquired
    /// several at once ([`MongoDistributedSemaphore::acquire_many`](crate::MongoDistributedSemaphore::acquire_many)),
    /// 1 otherwise.
    pub places: u32,
    /// A request that the holder let go, for an exclusive lock's holder that has one (see
    /// [`revocation`](crate::revocation)): its priority, and how much of its grace is left.
    pub revocation: Option<crate::Revocation>,
    /// Whether the holder is a reader-writer lock's upgradeable reader
    /// ([`acquire_upgradeable_read`](crate::MongoDistributedReaderWriterLock::acquire_upgradeable_read)).
    pub upgradeable: bool,
}

impl LockStatus {
    /// Whether someone holds the lock (a holder with a live lease).
    pub fn is_held(&self) -> bool {
        self.remaining.is_some()
    }

    /// Whether nobody holds the lock but its last holder's `min_hold` window keeps it taken
    /// (see [`kept`](Self::kept)).
    pub fn is_kept(&self) -> bool {
        self.kept.is_some()
    }

    /// The holder's owner, from its details.
    pub fn owner(&self) -> Option<&str> {
        self.details.as_ref()?.owner.as_deref()
    }

    /// The holder's host, from its details.
    pub fn host(&self) -> Option<&str> {
        self.details.as_ref()?.host.as_deref()
    }

    /// The holder's process id, from its details.
    pub fn pid(&self) -> Option<u32> {
        self.details.as_ref()?.pid
    }

    /// How long the holder has held the lock, by server time, when it was read.
    pub fn held_for(&self) -> Option<Duration> {
        // `remaining` was computed from the server's time at the read: `expires_at - now`.
        let now = self.expires_at?.timestamp_millis() - millis(self.remaining?);
        let held = now - self.acquired_at?.timestamp_millis();
        Some(Duration::from_millis(u64::try_from(held).unwrap_or(0)))
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Which holders [`Provider::held_locks_matching`](crate::Provider::held_locks_matching)
/// returns: every condition set must hold. [`LockFilter::new`] matches every holder.
///
/// ```no_run
/// # async fn demo(provider: distributed_lock_mongodb::Provider) -> distributed_lock_mongodb::Result<()> {
/// use std::time::Duration;
/// use distributed_lock_mongodb::{LockFilter, LockKind};
///
/// // Writers and exclusive holders of the billing service, holding for over an hour.
/// let filter = LockFilter::new()
///     .with_kind(LockKind::Exclusive)
///     .with_kind(LockKind::Write)
///     .with_owner("billing")
///     .with_min_held_for(Duration::from_secs(60 * 60));
/// for stuck in provider.held_locks_matching(&filter).await? {
///     println!("{} held by {:?} for {:?}", stuck.name, stuck.host(), stuck.held_for());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockFilter {
    kinds: Vec<LockKind>,
    name: Option<String>,
    owner: Option<String>,
    min_held_for: Option<Duration>,
    kept: bool,
}

impl LockFilter {
    /// A filter that matches every holder.
    pub fn new() -> Self {
        LockFilter::default()
    }

    /// Only holders of this kind; called several times, of any of these kinds. Defaults to
    /// every kind.
    #[must_use]
    pub fn with_kind(mut self, kind: LockKind) -> Self {
        if !self.kinds.contains(&kind) {
            self.kinds.push(kind);
        }
        self
    }

    /// Only holders of locks called `name`. Defaults to any name.
    #[must_use]
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only holders whose stored [`LockDetails`] name this owner. Defaults to any owner (and
    /// holders without details).
    #[must_use]
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Only holders that acquired their lease at least this long before the read, by server
    /// time. Defaults to any age.
    #[must_use]
    pub fn with_min_held_for(mut self, held_for: Duration) -> Self {
        self.min_held_for = Some(held_for);
        self
    }

    /// Also lists the exclusive locks that nobody holds but a finished holder's
    /// [`min_hold`](crate::LockOptions::min_hold) window keeps taken: entries without a lock id,
    /// whose [`kept`](LockStatus::kept) says for how long (a [`Job`](crate::Job) that ran less
    /// than a window ago). Defaults to holders only.
    #[must_use]
    pub fn including_kept(mut self) -> Self {
        self.kept = true;
        self
    }

    /// Whether kept locks are asked for (see [`including_kept`](Self::including_kept)).
    pub(crate) fn wants_kept(&self) -> bool {
        self.kept
    }

    /// Whether holders of `kind` can match.
    pub(crate) fn wants(&self, kind: LockKind) -> bool {
        self.kinds.is_empty() || self.kinds.contains(&kind)
    }

    /// The lock name it requires, if any.
    pub(crate) fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether `status` passes every condition.
    pub fn matches(&self, status: &LockStatus) -> bool {
        (status.is_held() || self.kept && status.is_kept())
            && self.wants(status.kind)
            && self.name.as_ref().is_none_or(|name| *name == status.name)
            && self
                .owner
                .as_deref()
                .is_none_or(|owner| status.owner() == Some(owner))
            && self
                .min_held_for
                .is_none_or(|least| status.held_for().is_some_and(|held| held >= least))
    }
}

/// What [`Provider::purge_expired`](crate::Provider::purge_expired) would delete, as
/// [`Provider::purgeable`](crate::Provider::purgeable) read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Purgeable {
    /// How many lock documents, in all the provider's collections.
    pub count: u64,
    /// The names of the first few of each collection, by name.
    pub names: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_displays_as_its_label() {
        let kinds = [
            LockKind::Exclusive,
            LockKind::Write,
            LockKind::Read,
            LockKind::Semaphore,
            LockKind::Document,
        ];
        let shown: Vec<String> = kinds.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["exclusive", "write", "read", "semaphore", "document"]
        );
    }
}
