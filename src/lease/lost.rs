//! Whether a held lease is still safe to rely on, and if not, why ([`Loss`]).
//!
//! A lease is lost when its renewal loop finds it gone, when the loop itself ends (its runtime
//! shut down, it panicked), or when its *lost deadline* (the send instant of the last confirmed
//! request plus the lease's lifetime, decided by `protocol::Lease`) has passed. The last
//! condition is checked by whoever asks, on the client's suspend-aware clock: `is_lost()` and
//! [`LostSignal::wait`] turn true by themselves at the deadline, even if no background task runs
//! any more.
//!
//! Loss is sticky: once any observer has seen the deadline pass, a renewal confirmed later does
//! not revive the lease (the state is behind one mutex, so "deadline passed" and "extended" are
//! ordered).

use std::sync::Arc;

use futures::future::select_all;

use super::state::LeaseState;

/// Tells whether a held lock is (known or presumed) lost; returned by every guard's `lost()`.
///
/// Cheap to clone and `'static`, so it can move into the task doing the protected work. It
/// turns true when the renewal finds the lease gone, when the renewal machinery stops (its
/// runtime shut down), when the server's clock is seen to jump forward beyond
/// `max_clock_skew`, and, checked on the client's own clock whenever it is asked, when no
/// renewal was confirmed before the lease's lost deadline — so it works even if no background
/// task gets to run. That clock counts time the host spent suspended: after a suspension
/// [`is_lost`](Self::is_lost) is right at once, and [`wait`](Self::wait) resolves within a
/// second. Always before the lease can end on the server, under the assumptions in
/// the crate docs. Once lost, it stays lost. After the guard was released successfully without
/// having been lost, it stays false and [`wait`](Self::wait) never resolves; after a release
/// that failed, it turns true at the lease's deadline like an unreleased one (the lease may
/// still be live until then).
///
/// ```no_run
/// # async fn demo(lock: distributed_lock_mongodb::MongoDistributedLock) -> distributed_lock_mongodb::Result<()> {
/// let guard = lock.acquire().await?;
/// let lost = guard.lost();
/// tokio::select! {
///     () = lost.wait() => eprintln!("lock lost: stop touching the resource"),
///     () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {} // the protected work
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct LostSignal {
    /// One lease, or a composite's members: lost when any of them is.
    leases: Vec<Arc<LeaseState>>,
}

impl LostSignal {
    pub(crate) fn new(leases: Vec<Arc<LeaseState>>) -> Self {
        LostSignal { leases }
    }

    /// Lost when this or `other` is (a guard that holds both leases).
    pub(crate) fn and(mut self, other: &LostSignal) -> Self {
        self.leases.extend(other.leases.iter().cloned());
        self
    }

    /// Whether the lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.leases.iter().any(|lease| lease.is_lost())
    }

    /// Runs `work` until it completes or the lock is lost, whichever comes first: `None` if the
    /// lock was lost (`work` is dropped then). A loss noticed in the same poll as the completion
    /// wins, so an output is returned only if the lock was not known lost when `work` finished.
    pub(crate) async fn unless_lost<F: Future>(&self, work: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.wait() => None,
            output = work => Some(output),
        }
    }

    /// Resolves once the lock is known or presumed lost (at once if it is already).
    ///
    /// # Panics
    /// Outside a Tokio runtime with its time driver enabled (it sleeps until the lease's local
    /// deadline). [`is_lost`](Self::is_lost) works anywhere.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    pub async fn wait(&self) {
        if self.leases.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.leases.iter().map(|lease| Box::pin(lease.wait()));
        select_all(waits).await;
    }
}

/// Why a lease was lost, for the tracing message and the metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loss {
    /// A renewal matched nothing: deleted, taken over or expired on the server.
    Gone,
    /// The release matched nothing.
    GoneAtRelease,
    /// No renewal was confirmed before the local deadline.
    Deadline,
    /// A lease nothing renews (`auto_renew` off) reached its deadline without an extension.
    Expired,
    /// A renewal was confirmed only after the local deadline.
    LateConfirmation,
    /// `max_hold` has passed.
    MaxHold,
    /// The holder's work reported no progress for `max_idle`.
    MaxIdle,
    /// The provider was shut down.
    ShutDown,
    /// The renewal loop ended (its runtime shut down, or it panicked).
    LoopEnded,
    /// The server's clock jumped forward by more than `max_clock_skew` between two renewals.
    ClockJump,
}

impl Loss {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Loss::Gone => {
                "the lease was no longer in the database (deleted, taken over or expired)"
            }
            Loss::GoneAtRelease => "the lease was no longer in the database at release",
            Loss::Deadline => "no renewal was confirmed before the lease's deadline",
            Loss::Expired => {
                "the lease, which nothing renews (auto_renew is off), was not extended before \
                 its deadline"
            }
            Loss::LateConfirmation => "the renewal was confirmed after the lease's deadline",
            Loss::MaxHold => "max_hold has passed: the lease is no longer renewed",
            Loss::MaxIdle => {
                "the holder's work reported no progress for max_idle: the lease is no longer \
                 renewed"
            }
            Loss::ShutDown => "the provider was shut down",
            Loss::LoopEnded => "the renewal loop has ended",
            Loss::ClockJump => {
                "the server's clock jumped forward by more than max_clock_skew: the lease may \
                 have ended early"
            }
        }
    }

    /// The `reason` label: `gone`, `deadline`, `expired`, `max_hold`, `max_idle`, `shutdown`,
    /// `loop_ended` or `clock_jump`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Loss::Gone | Loss::GoneAtRelease => "gone",
            Loss::Deadline | Loss::LateConfirmation => "deadline",
            Loss::Expired => "expired",
            Loss::MaxHold => "max_hold",
            Loss::MaxIdle => "max_idle",
            Loss::ShutDown => "shutdown",
            Loss::LoopEnded => "loop_ended",
            Loss::ClockJump => "clock_jump",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock;
    use crate::lease::protocol::{Lease, Sent};
    use crate::options::LockOptions;
    use std::time::Duration;

    /// A renewal sent and confirmed just now, of a lease relied on for about a minute.
    fn confirm(state: &LeaseState) -> bool {
        let options = LockOptions::builder()
            .expiry(Duration::from_secs(61))
            .build()
            .unwrap();
        state.confirmed(&options, Sent::now(clock::now()))
    }

    #[tokio::test]
    async fn a_passed_deadline_is_lost_by_itself_and_stays_lost() {
        let state = LeaseState::new(Lease::until(clock::now() + Duration::from_millis(30), None));
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        assert!(!signal.is_lost());
        tokio::time::timeout(Duration::from_secs(5), signal.wait())
            .await
            .expect("wait resolves at the deadline without anyone marking it");
        assert!(signal.is_lost());
        // A renewal confirmed after the deadline does not revive it.
        assert!(!confirm(&state));
        assert!(signal.is_lost());
    }

    #[tokio::test]
    async fn extending_moves_the_deadline_and_marking_wakes_waiters() {
        let state = LeaseState::new(Lease::until(clock::now() + Duration::from_millis(50), None));
        assert!(confirm(&state));
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert!(!signal.is_lost(), "extended");
        let waiting = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(state.mark_lost());
        assert!(!state.mark_lost(), "only the first marking changes it");
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
    }

    /// The renewal loop leaves a lease alone while a transaction of its holder is open, and
    /// only then: each open transaction counts until dropped.
    #[tokio::test]
    async fn a_released_lease_is_never_lost() {
        let state = LeaseState::new(Lease::until(clock::now() + Duration::from_millis(20), None));
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        state.mark_released();
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(!signal.is_lost());
        assert!(!state.mark_lost());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), signal.wait())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_composite_is_lost_when_any_member_is() {
        let far = clock::now() + Duration::from_secs(60);
        let (a, b) = (
            LeaseState::new(Lease::until(far, None)),
            LeaseState::new(Lease::until(far, None)),
        );
        let signal = LostSignal::new(vec![Arc::clone(&a), Arc::clone(&b)]);
        assert!(!signal.is_lost());
        b.mark_lost();
        assert!(signal.is_lost());
        tokio::time::timeout(Duration::from_secs(5), signal.wait())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn no_renewal_extends_a_lease_past_the_end_of_its_hold() {
        let hold_until = clock::now() + Duration::from_millis(40);
        let state = LeaseState::new(Lease::until(
            clock::now() + Duration::from_secs(60),
            Some(hold_until),
        ));
        assert!(confirm(&state));
        assert_eq!(state.lost_at(), Some(hold_until));
        assert!(!state.hold_ended());
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        tokio::time::timeout(Duration::from_secs(5), signal.wait())
            .await
            .expect("lost at the end of the hold");
        assert!(state.hold_ended());
        assert!(!confirm(&state));
        assert!(signal.is_lost());
    }

    #[tokio::test]
    async fn a_lease_without_a_deadline_is_held_until_marked_lost() {
        let state = LeaseState::without_deadline();
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        let waiting = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        // No instant ends it: not a suspension, not a renewal that comes late.
        clock::simulate_suspension(Duration::from_secs(20 * 365 * 24 * 60 * 60));
        assert!(!signal.is_lost());
        assert!(confirm(&state));
        assert_eq!(state.lost_at(), None, "it still has no deadline");
        assert!(!waiting.is_finished());
        assert!(state.mark_lost());
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("marking it lost wakes its waiters")
            .unwrap();
        assert!(signal.is_lost());

        let released = LeaseState::without_deadline();
        released.mark_released();
        assert!(!released.mark_lost(), "released first: never lost");
    }

    #[tokio::test]
    async fn time_the_host_spent_suspended_counts_toward_the_deadline() {
        let state = LeaseState::new(Lease::until(clock::now() + Duration::from_secs(20), None));
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        let waiting = tokio::spawn({
            let signal = signal.clone();
            async move { signal.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!signal.is_lost());
        // Suspended for 30 s: Tokio's clock did not move, the lease's did.
        clock::simulate_suspension(Duration::from_secs(30));
        assert!(signal.is_lost(), "is_lost() counts the suspension at once");
        tokio::time::timeout(clock::RECHECK + Duration::from_secs(2), waiting)
            .await
            .expect("a waiter notices within the recheck interval")
            .unwrap();
        assert!(!confirm(&state));
    }

    #[tokio::test]
    async fn work_runs_to_its_output_unless_the_lease_is_lost_first() {
        let far = clock::now() + Duration::from_secs(60);
        let held = LostSignal::new(vec![LeaseState::new(Lease::until(far, None))]);
        assert_eq!(held.unless_lost(async { 7 }).await, Some(7));

        let state = LeaseState::new(Lease::until(far, None));
        let signal = LostSignal::new(vec![Arc::clone(&state)]);
        let (dropped, mut work_dropped) = tokio::sync::oneshot::channel::<()>();
        let work = async move {
            let _alive = dropped; // dropped with the work
            std::future::pending::<u32>().await
        };
        let running = tokio::spawn(async move { signal.unless_lost(work).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            work_dropped.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty),
            "the work is still running"
        );
        state.mark_lost();
        let outcome = tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(outcome, None);
        assert_eq!(
            work_dropped.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed),
            "the work was dropped"
        );

        // Lost before the work starts: it never runs.
        let lost = LostSignal::new(vec![LeaseState::new(Lease::until(far, None))]);
        lost.leases[0].mark_lost();
        let ran = std::sync::atomic::AtomicBool::new(false);
        let outcome = lost
            .unless_lost(async { ran.store(true, std::sync::atomic::Ordering::SeqCst) })
            .await;
        assert_eq!(outcome, None);
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
