//! The blocking exclusive lock.

use std::sync::Arc;
use std::time::Duration;

use super::{Background, LockGuard, LockWatch, twins, wrapper};
use crate::lock_status::LockStatus;
use crate::options::LockOptions;

/// A named mutual-exclusion lock with blocking methods; see
/// [`crate::MongoDistributedLock`]. Created by [`Provider::create_lock`](super::Provider::create_lock);
/// cheap to clone.
#[derive(Clone, Debug)]
pub struct MongoDistributedLock {
    inner: crate::MongoDistributedLock,
    background: Arc<Background>,
}

wrapper!(MongoDistributedLock wraps crate::MongoDistributedLock);

impl MongoDistributedLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The lock's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    twins! { MongoDistributedLock:
        /// Blocks until the lock is acquired.
        fn acquire(&self) -> LockGuard;
        /// Blocks at most `timeout` for the lock; [`Error::Timeout`](crate::Error::Timeout)
        /// when it stayed busy.
        fn acquire_timeout(&self, timeout: Duration) -> LockGuard;
        /// Blocks at most `timeout` for the lock, asking its holder to let go; see
        /// [`crate::MongoDistributedLock::acquire_revoking`].
        fn acquire_revoking(&self, request: crate::RevokeRequest, timeout: Duration) -> LockGuard;
        /// Makes one attempt; `Ok(None)` if the lock is held by someone else.
        fn try_acquire(&self) -> Option<LockGuard>;
        /// Blocks at most `timeout` for the lock; `Ok(None)` if it stayed busy until then.
        fn try_acquire_timeout(&self, timeout: Duration) -> Option<LockGuard>;
        /// The lock's holder and lease, or `None` if it has no document.
        fn status(&self) -> Option<LockStatus>;
        /// The current holder, if any, as a list.
        fn holders(&self) -> Vec<LockStatus>;
        /// A watch of the lock's holders, read every `every`.
        fn watch(&self, every: Duration) -> LockWatch;
    }
}
