//! The blocking semaphore.

use std::sync::Arc;
use std::time::Duration;

use super::{Background, LockGuard, LockWatch, twins, wrapper};
use crate::lock_status::LockStatus;
use crate::options::LockOptions;

/// A semaphore with blocking methods; see [`crate::MongoDistributedSemaphore`]. Created by
/// [`Provider::create_semaphore`](super::Provider::create_semaphore); cheap to clone.
#[derive(Clone, Debug)]
pub struct MongoDistributedSemaphore {
    inner: crate::MongoDistributedSemaphore,
    background: Arc<Background>,
}

wrapper!(MongoDistributedSemaphore wraps crate::MongoDistributedSemaphore);

impl MongoDistributedSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The semaphore's options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    /// How many holders the semaphore allows.
    pub fn max_count(&self) -> u32 {
        self.inner.max_count()
    }

    twins! { MongoDistributedSemaphore:
        /// Blocks until a place is acquired.
        fn acquire(&self) -> LockGuard;
        /// Blocks at most `timeout` for a place; [`Error::Timeout`](crate::Error::Timeout)
        /// when every place stayed taken.
        fn acquire_timeout(&self, timeout: Duration) -> LockGuard;
        /// Makes one attempt; `Ok(None)` if every place is taken.
        fn try_acquire(&self) -> Option<LockGuard>;
        /// Blocks at most `timeout` for a place; `Ok(None)` if every place stayed taken.
        fn try_acquire_timeout(&self, timeout: Duration) -> Option<LockGuard>;
        /// Blocks until `places` places are acquired at once; see
        /// [`crate::MongoDistributedSemaphore::acquire_many`].
        fn acquire_many(&self, places: u32) -> LockGuard;
        /// Blocks at most `timeout` for `places` places at once.
        fn acquire_many_timeout(&self, places: u32, timeout: Duration) -> LockGuard;
        /// Makes one attempt for `places` places at once; `Ok(None)` if fewer are free.
        fn try_acquire_many(&self, places: u32) -> Option<LockGuard>;
        /// Blocks at most `timeout` for `places` places at once; `Ok(None)` if fewer stayed
        /// free.
        fn try_acquire_many_timeout(&self, places: u32, timeout: Duration) -> Option<LockGuard>;
        /// How many places are free now, read from the server.
        fn available(&self) -> u32;
        /// Sets the number of places for every process; see
        /// [`crate::MongoDistributedSemaphore::set_max_count`].
        fn set_max_count(&self, max_count: u32) -> ();
        /// The current holders.
        fn holders(&self) -> Vec<LockStatus>;
        /// A watch of the semaphore's holders, read every `every`.
        fn watch(&self, every: Duration) -> LockWatch;
        /// **Dangerous**: ends every holder's lease now.
        fn force_release_all(&self) -> bool;
    }
}
