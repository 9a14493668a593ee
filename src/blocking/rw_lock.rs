//! The blocking reader-writer lock.

use std::sync::Arc;
use std::time::Duration;

use super::{Background, LockGuard, LockWatch, ReadGuard, UpgradeableReadGuard, twins, wrapper};
use crate::lock_status::LockStatus;
use crate::options::LockOptions;

/// A reader-writer lock with blocking methods; see [`crate::MongoDistributedReaderWriterLock`].
/// Created by [`Provider::create_reader_writer_lock`](super::Provider::create_reader_writer_lock);
/// cheap to clone.
#[derive(Clone, Debug)]
pub struct MongoDistributedReaderWriterLock {
    inner: crate::MongoDistributedReaderWriterLock,
    background: Arc<Background>,
}

wrapper!(MongoDistributedReaderWriterLock wraps crate::MongoDistributedReaderWriterLock);

impl MongoDistributedReaderWriterLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    twins! { MongoDistributedReaderWriterLock:
        /// Blocks until a read lock is acquired (no writer holds the lock or waits for it).
        fn acquire_read(&self) -> ReadGuard;
        /// Blocks at most `timeout` for a read lock.
        fn acquire_read_timeout(&self, timeout: Duration) -> ReadGuard;
        /// Makes one attempt at a read lock; `Ok(None)` if a writer holds or waits for the lock.
        fn try_acquire_read(&self) -> Option<ReadGuard>;
        /// Blocks at most `timeout` for a read lock; `Ok(None)` if it stayed unavailable.
        fn try_acquire_read_timeout(&self, timeout: Duration) -> Option<ReadGuard>;
        /// Blocks until the upgradeable read lock is acquired (no writer holds the lock or
        /// waits for it, no other reader holds it upgradeable).
        fn acquire_upgradeable_read(&self) -> UpgradeableReadGuard;
        /// Blocks at most `timeout` for the upgradeable read lock.
        fn acquire_upgradeable_read_timeout(&self, timeout: Duration) -> UpgradeableReadGuard;
        /// Makes one attempt at the upgradeable read lock; `Ok(None)` if it is unavailable.
        fn try_acquire_upgradeable_read(&self) -> Option<UpgradeableReadGuard>;
        /// Blocks at most `timeout` for the upgradeable read lock; `Ok(None)` if it stayed
        /// unavailable.
        fn try_acquire_upgradeable_read_timeout(&self, timeout: Duration) -> Option<UpgradeableReadGuard>;
        /// Blocks until the write lock is acquired (no readers, no other writer).
        fn acquire_write(&self) -> LockGuard;
        /// Blocks at most `timeout` for the write lock.
        fn acquire_write_timeout(&self, timeout: Duration) -> LockGuard;
        /// Makes one attempt at the write lock; `Ok(None)` if it is held.
        fn try_acquire_write(&self) -> Option<LockGuard>;
        /// Blocks at most `timeout` for the write lock; `Ok(None)` if it stayed unavailable.
        fn try_acquire_write_timeout(&self, timeout: Duration) -> Option<LockGuard>;
        /// The current holders (the writer, or the readers).
        fn holders(&self) -> Vec<LockStatus>;
        /// A watch of the lock's holders, read every `every`.
        fn watch(&self, every: Duration) -> LockWatch;
        /// **Dangerous**: ends every holder's lease now.
        fn force_release_all(&self) -> bool;
    }
}
