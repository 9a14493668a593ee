//! The blocking watch of a lock's holders.

use std::sync::Arc;
use std::time::Duration;

use super::{Background, wrapper};
use crate::error::Result;
use crate::lock_status::LockStatus;

/// The holders of a lock, kept up to date on the provider's runtime; see
/// [`crate::LockWatch`]. Returned by the `watch` methods of the blocking locks; the reads stop
/// when it is dropped.
#[derive(Debug)]
pub struct LockWatch {
    inner: crate::LockWatch,
    background: Arc<Background>,
}

wrapper!(LockWatch wraps crate::LockWatch);

impl LockWatch {
    /// The holders as last read (empty: free).
    pub fn holders(&self) -> Vec<LockStatus> {
        self.inner.holders()
    }

    /// Whether the lock was held at the last read.
    pub fn is_held(&self) -> bool {
        self.inner.is_held()
    }

    /// Blocks until the holders change, for at most `timeout`: whether they changed; see
    /// [`crate::LockWatch::changed`].
    ///
    /// # Errors
    /// As [`crate::LockWatch::changed`];
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio
    /// runtime.
    pub fn changed(&mut self, timeout: Duration) -> Result<bool> {
        // The timer is made inside the runtime: Tokio's timers need its context.
        let changed = async { tokio::time::timeout(timeout, self.inner.changed()).await };
        match self.background.block_on(changed)? {
            Ok(changed) => changed.map(|()| true),
            Err(_elapsed) => Ok(false),
        }
    }
}
