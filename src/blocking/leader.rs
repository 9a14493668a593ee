//! The blocking leader election.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Background, LockWatch, MongoDistributedLock, twins, wrapper};
use crate::error::Result;
use crate::lease::lost::LostSignal;
use crate::token::FencingToken;

/// Campaigns for leadership of a name on the provider's runtime; see
/// [`crate::LeaderElection`], whose guarantees hold here too. Created by
/// [`Provider::create_leader_election`](super::Provider::create_leader_election); campaigning
/// stops when it is dropped (a held term is released in the background) or resigned.
#[derive(Debug)]
pub struct LeaderElection {
    // Dropped first: it stops the campaign on the runtime the handle below keeps alive.
    inner: crate::LeaderElection,
    background: Arc<Background>,
}

wrapper!(LeaderElection wraps crate::LeaderElection);

impl LeaderElection {
    /// Who leads `lock`'s name now, watched without campaigning; see
    /// [`crate::LeaderElection::watch_leader`].
    ///
    /// # Errors
    /// As [`MongoDistributedLock::watch`].
    pub fn watch_leader(lock: &MongoDistributedLock, every: Duration) -> Result<LockWatch> {
        lock.watch(every)
    }

    /// The name campaigned for.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Whether this instance is the leader now; see [`crate::LeaderElection::is_leader`].
    pub fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }

    /// The fencing token of the current term while this instance is the leader.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.inner.fencing_token()
    }

    /// A signal that turns true when the current term ends; `None` while not the leader.
    pub fn lost(&self) -> Option<LostSignal> {
        self.inner.lost()
    }

    /// "I am the leader", as a watch channel; see [`crate::LeaderElection::watch`]. Its
    /// `borrow()` works on any thread; [`wait_leader`](Self::wait_leader) blocks on it.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.inner.watch()
    }

    /// Blocks until this instance is the leader, for at most `timeout`: whether it is the
    /// leader then.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio
    /// runtime.
    pub fn wait_leader(&self, timeout: Duration) -> Result<bool> {
        let mut leading = self.inner.watch();
        let elected = async move {
            // Made inside the runtime: Tokio's timers need its context.
            let elected = leading.wait_for(|leading| *leading);
            matches!(tokio::time::timeout(timeout, elected).await, Ok(Ok(_)))
        };
        Ok(self.background.block_on(elected)? && self.inner.is_leader())
    }

    twins! { LeaderElection:
        /// Blocks until someone asks this instance to step down while it leads; see
        /// [`crate::LeaderElection::revocation_requested`].
        fn revocation_requested(&self) -> crate::Revocation;
        /// Steps down, releasing leadership if leading.
        fn resign(self) -> ();
    }
}
