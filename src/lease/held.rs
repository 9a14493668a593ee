//! The held-lease core under every guard: one lease, its `lost` state, its release and its
//! `Drop`. The public guards wrap it and add what their kind has (a fencing token, a document).

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::lost::{LeaseState, LostSignal};
use super::renewal::{self, Command, Lease, Place, RenewalHub};
use crate::error::shown_name;
use crate::{Error, Result};

/// A lease won by an attempt, renewed by a renewal loop until it is released or lost.
#[derive(Debug)]
pub(crate) struct HeldLease {
    /// How the lock is named in messages.
    name: String,
    /// `None` once the lease was handed back to the renewal loop.
    lock_id: Option<String>,
    state: Arc<LeaseState>,
    renewals: mpsc::UnboundedSender<Command>,
}

impl HeldLease {
    /// Registers `lease` (just won) with the renewal loop of `renewals` for `place`.
    ///
    /// `None` when the reply came too late to trust the lease (its local deadline has passed:
    /// the lease may already have ended on the server and someone else taken over); the lease
    /// is then released at once, since whatever is left of it is of no use.
    pub(crate) fn hold(
        runtime: &Handle,
        renewals: &RenewalHub,
        place: Place<'_>,
        lease: Lease,
    ) -> Option<HeldLease> {
        let held = HeldLease {
            name: lease.name.clone(),
            lock_id: Some(lease.lock_id.clone()),
            state: Arc::clone(&lease.state),
            renewals: renewals.hold(runtime, place, lease),
        };
        (!held.is_lost()).then_some(held)
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The lock id, until the lease was handed back.
    pub(crate) fn lock_id(&self) -> Option<&str> {
        self.lock_id.as_deref()
    }

    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }

    pub(crate) fn lost(&self) -> LostSignal {
        LostSignal::new(vec![Arc::clone(&self.state)])
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Runs `work` until it completes or the lease is lost: the guards' `run_while_held`.
    pub(crate) async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lost()
            .unless_lost(work)
            .await
            .ok_or_else(|| Error::LockLost {
                name: self.name.clone(),
            })
    }

    /// Stops renewing and ends the lease (see [`renewal::release`]). A lease its loop no longer
    /// has because it was lost (its family shut down) reports that.
    pub(crate) async fn release(mut self) -> Result<()> {
        match renewal::release(&self.renewals, self.lock_id.take()).await {
            Err(Error::BackgroundTaskEnded { .. }) if self.state.is_lost() => {
                Err(Error::LockLost {
                    name: self.name.clone(),
                })
            }
            result => result,
        }
    }

    /// The lease was ended by a write of the holder's own (a document lock's commit): the
    /// renewal loop only has to forget it.
    pub(crate) fn ended_by_write(mut self) {
        if let Some(lock_id) = self.lock_id.take() {
            self.state.mark_released();
            let _ = self.renewals.send(Command::Forget { lock_id });
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        renewal::release_in_background(&self.renewals, self.lock_id.take());
    }
}

/// What the `*_and_run` methods return once the guard's release is over: the work's `output`,
/// which is `Ok` only if the work completed before the lock was known lost. A failed release
/// does not change that (the work ran while the lock was held; the lease ends by itself at its
/// expiry at the latest), so it is only logged.
pub(crate) fn after_release<T>(name: &str, output: Result<T>, released: Result<()>) -> Result<T> {
    if let (Ok(_), Err(error)) = (&output, released) {
        tracing::warn!(lock = %shown_name(name), %error, "release after the work failed");
    }
    output
}
