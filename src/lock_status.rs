//! The status of a lock's holder, as read by the administration calls.

use std::time::Duration;

use mongodb::bson::DateTime;

use crate::{FencingToken, LockDetails};

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
    /// The fencing token of the current (or last) acquisition; `None` for readers, which have
    /// none.
    pub fencing_token: Option<FencingToken>,
    /// How much of the lease is left by server time; `None` when the lock is not held.
    pub remaining: Option<Duration>,
    /// Who holds it (owner, host, process id), if the holder stored details (see
    /// [`LockDetails`]).
    pub details: Option<LockDetails>,
}

impl LockStatus {
    /// Whether someone holds the lock (a holder with a live lease).
    pub fn is_held(&self) -> bool {
        self.remaining.is_some()
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
}
