//! The in-memory reader-writer lock.

use std::time::Duration;

use super::lock::{MemoryGuard, MemoryLock};
use crate::error::Result;
use crate::lease::lost::LostSignal;

/// An in-memory reader-writer lock; see the [module docs](super) and
/// [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock), whose
/// behaviour it keeps: readers share the lock, a writer holds it alone, and while a writer
/// waits (not on a single `try_acquire_write`), new readers wait too.
#[derive(Clone, Debug)]
pub struct MemoryReaderWriterLock {
    pub(super) read: MemoryLock,
    pub(super) write: MemoryLock,
}

impl MemoryReaderWriterLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// Waits until a read lock is acquired: when no writer holds the lock and none waits.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_read(&self) -> Result<MemoryReadGuard> {
        self.read.acquire().await.map(MemoryReadGuard)
    }

    /// Waits up to `timeout` for a read lock.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_read_timeout(&self, timeout: Duration) -> Result<MemoryReadGuard> {
        self.read
            .acquire_timeout(timeout)
            .await
            .map(MemoryReadGuard)
    }

    /// One attempt at a read lock: `Ok(None)` if a writer holds the lock or waits for it.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_read(&self) -> Result<Option<MemoryReadGuard>> {
        Ok(self.read.try_acquire().await?.map(MemoryReadGuard))
    }

    /// Attempts at a read lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryReadGuard>> {
        let guard = self.read.try_acquire_timeout(timeout).await?;
        Ok(guard.map(MemoryReadGuard))
    }

    /// Waits until the write lock is acquired: when no reader and no other writer holds it.
    /// New readers wait meanwhile.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_write(&self) -> Result<MemoryGuard> {
        self.write.acquire().await
    }

    /// Waits up to `timeout` for the write lock.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_write_timeout(&self, timeout: Duration) -> Result<MemoryGuard> {
        self.write.acquire_timeout(timeout).await
    }

    /// One attempt at the write lock: `Ok(None)` if readers or a writer hold it. It holds back
    /// no reader.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_write(&self) -> Result<Option<MemoryGuard>> {
        self.write.try_acquire().await
    }

    /// Attempts at the write lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_write_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryGuard>> {
        self.write.try_acquire_timeout(timeout).await
    }
}

crate::traits::impl_distributed_reader_writer_lock!(MemoryReaderWriterLock);

/// Proof that a [`MemoryReaderWriterLock`](super::MemoryReaderWriterLock) is held to read; behaves as
/// [`ReadGuard`](crate::ReadGuard) does (no fencing token).
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MemoryReadGuard(MemoryGuard);

impl MemoryReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// A signal that turns true when the read lock is lost (only at the provider's shutdown).
    pub fn lost(&self) -> LostSignal {
        self.0.lost()
    }

    /// Whether the read lock is lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// Extends the lease to at least `by` from now; see [`MemoryGuard::extend`].
    ///
    /// # Errors
    /// As [`MemoryGuard::extend`].
    pub async fn extend(&self, by: Duration) -> Result<()> {
        self.0.extend(by).await
    }

    /// Releases the read lock and wakes its waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the read lock was lost before.
    pub async fn release(self) -> Result<()> {
        self.0.release().await
    }
}

crate::traits::impl_distributed_read_guard!(MemoryReadGuard);
