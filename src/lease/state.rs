//! The state of one held lease, shared by its guard, its renewal loop and every lost signal:
//! the protocol's `Lease` (its deadline and phase) on the suspend-aware clock, its open
//! lease-checked transactions, and whether it was handed out. When it counts as lost is
//! described in `lost`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;
use tokio::time::sleep_until;

use std::time::Duration;

use super::protocol::{Lease, Phase, Refusal, Sent, Transaction};
use crate::clock::{self, Instant};
use crate::options::LockOptions;
use crate::sync::{Mutex, MutexGuard};

/// The state of one lease, shared by its guard, its renewal loop and every `LostSignal`: the
/// protocol's [`Lease`] (its deadline and phase, decided in `protocol`) on the suspend-aware clock.
#[derive(Debug)]
pub(crate) struct LeaseState {
    inner: Mutex<Lease<Instant>>,
    /// Bumped on every change that can end a wait (lost, released).
    changes: watch::Sender<()>,
    /// How many lease-checked transactions of its holder are open: while one is, the renewal
    /// loop leaves the lease alone (the transaction has written its document).
    transactions: AtomicUsize,
    /// Won after its caller stopped waiting and never handed out: its loss is not reported.
    undelivered: AtomicBool,
}

impl LeaseState {
    /// The state of a lease won by `request`, whose reply arrived just now.
    pub(crate) fn starting(options: &LockOptions, request: Sent<Instant>) -> Arc<LeaseState> {
        LeaseState::new(Lease::won(options, request, clock::now()))
    }

    /// The state of a lease with no deadline of its own, lost only when marked so (the
    /// in-memory locks of [`crate::memory`]).
    pub(crate) fn without_deadline() -> Arc<LeaseState> {
        LeaseState::new(Lease::unbounded())
    }

    pub(super) fn new(lease: Lease<Instant>) -> Arc<LeaseState> {
        Arc::new(LeaseState {
            inner: Mutex::new(lease),
            changes: watch::Sender::new(()),
            transactions: AtomicUsize::new(0),
            undelivered: AtomicBool::new(false),
        })
    }

    /// Marks the lease as never handed out to its caller: its loss is no news to anyone.
    pub(crate) fn set_undelivered(&self) {
        self.undelivered.store(true, Ordering::SeqCst);
    }

    /// Whether the lease was never handed out to its caller.
    pub(crate) fn is_undelivered(&self) -> bool {
        self.undelivered.load(Ordering::SeqCst)
    }

    /// Counts a lease-checked transaction as open until the returned value is dropped.
    pub(crate) fn in_transaction_until_dropped(self: &Arc<Self>) -> InTransaction {
        self.transactions.fetch_add(1, Ordering::SeqCst);
        InTransaction(Arc::clone(self))
    }

    /// Whether a lease-checked transaction of the holder is open.
    pub(crate) fn in_transaction(&self) -> bool {
        self.transactions.load(Ordering::SeqCst) > 0
    }

    /// Whether the hold allowed by `max_hold` is over.
    pub(crate) fn hold_ended(&self) -> bool {
        self.lease().hold_ended(clock::now())
    }

    /// Whether the holder's work went `max_idle` without reporting progress.
    pub(crate) fn idle_ended(&self) -> bool {
        self.lease().idle_ended(clock::now())
    }

    /// The holder's work reported progress just now: see [`Lease::progressed`].
    pub(crate) fn progressed(&self, options: &LockOptions) -> bool {
        self.lease().progressed(options, clock::now())
    }

    fn lease(&self) -> MutexGuard<'_, Lease<Instant>> {
        self.inner.lock()
    }

    /// The current phase, turning `Held` into `Lost` once its deadline has passed.
    fn current(&self) -> Phase<Instant> {
        self.lease().settle(clock::now())
    }

    pub(crate) fn is_lost(&self) -> bool {
        matches!(self.current(), Phase::Lost { .. })
    }

    /// The server confirmed the lease in reply to `request`, and the reply arrived just now:
    /// see [`Lease::confirmed`]. Returns whether the lease is still held.
    pub(crate) fn confirmed(&self, options: &LockOptions, request: Sent<Instant>) -> bool {
        self.lease().confirmed(options, request, clock::now())
    }

    /// Whether the holder may extend the lease `by` now: see [`Lease::may_extend`].
    pub(crate) fn may_extend(&self, by: Duration) -> Result<(), Refusal<Instant>> {
        self.lease().may_extend(by, clock::now())
    }

    /// The server extended the lease `by` in reply to `request`, and the reply arrived just
    /// now: see [`Lease::extended`]. Returns whether the lease is still held.
    pub(crate) fn extended(
        &self,
        options: &LockOptions,
        by: Duration,
        request: Sent<Instant>,
    ) -> bool {
        self.lease().extended(options, by, request, clock::now())
    }

    /// The lease-checked `transaction` committed, and its reply arrived just now: see
    /// [`Transaction::committed`]. Returns whether the lease is still held.
    pub(crate) fn transaction_committed(
        &self,
        options: &LockOptions,
        transaction: Transaction<Instant>,
    ) -> bool {
        transaction.committed(&mut self.lease(), options, clock::now())
    }

    /// The deadline, while held (`None` once lost or released, or for a lease without one).
    pub(crate) fn lost_at(&self) -> Option<Instant> {
        self.lease().lost_at(clock::now())
    }

    /// When its loss is due to be reported (see [`Lease::report_loss_at`]).
    pub(crate) fn report_loss_at(&self) -> Option<Instant> {
        self.lease().report_loss_at(clock::now())
    }

    /// When the lease wants its next renewal (see [`Lease::renew_by`]).
    pub(crate) fn renew_by(&self, options: &LockOptions) -> Option<Instant> {
        self.lease().renew_by(options)
    }

    /// Marks the lease lost (unless released); returns whether this is the first report of the
    /// loss (also when its deadline had already passed unreported).
    pub(crate) fn mark_lost(&self) -> bool {
        let changed = self.lease().mark_lost();
        if changed {
            self.changes.send_replace(());
        }
        changed
    }

    /// Marks the lease released, unless it was lost already.
    pub(crate) fn mark_released(&self) {
        let changed = self.lease().mark_released(clock::now());
        if changed {
            self.changes.send_replace(());
        }
    }

    /// Resolves once the lease is lost; never, if it is released first.
    pub(super) async fn wait(&self) {
        let mut changes = self.changes.subscribe();
        loop {
            match self.current() {
                Phase::Lost { .. } => return,
                Phase::Released => std::future::pending::<()>().await,
                Phase::Held { lost_at: None } => {
                    // The sender lives in `self`: it cannot close while we borrow it.
                    let _ = changes.changed().await;
                }
                Phase::Held {
                    lost_at: Some(lost_at),
                } => {
                    tokio::select! {
                        // The sender lives in `self`: it cannot close while we borrow it.
                        _ = changes.changed() => {}
                        // Rechecked at least every second: Tokio's timers do not count time
                        // the host spent suspended, the lease's clock does.
                        () = sleep_until(clock::wake_toward(lost_at)) => {}
                    }
                }
            }
        }
    }
}

/// An open lease-checked transaction of a lease's holder; see
/// [`LeaseState::in_transaction_until_dropped`].
#[derive(Debug)]
pub(crate) struct InTransaction(Arc<LeaseState>);

impl Drop for InTransaction {
    fn drop(&mut self) {
        self.0.transactions.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_in_a_transaction_while_one_is_open() {
        let state = LeaseState::without_deadline();
        assert!(!state.in_transaction());
        let first = state.in_transaction_until_dropped();
        let second = state.in_transaction_until_dropped();
        assert!(state.in_transaction());
        drop(first);
        assert!(state.in_transaction(), "one is still open");
        drop(second);
        assert!(!state.in_transaction(), "both ended");
    }
}
