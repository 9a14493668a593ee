//! The renewal loop's schedule: when a round goes out ([`Renewals`]), when an unanswered
//! renewal is suspect or given up, and whether a command of several leases renewed them all.

use std::fmt::Debug;
use std::time::Duration;

use super::{Moment, Sent};
use crate::options::LockOptions;

/// Whether the reply to a renewal of `leases` leases in one command, which matched `matched`
/// documents, shows every one of them renewed. Each document matches at most once and holds at
/// least one of the leases, so only as many matches as leases means one lease per document, each
/// renewed; otherwise (several leases in one document, a semaphore's places or a
/// reader-writer lock's readers held by one process, or some lease gone) a read must tell which
/// are still live.
pub fn renewed_every_lease(matched: Option<i64>, leases: usize) -> bool {
    matched.is_some_and(|matched| usize::try_from(matched).is_ok_and(|n| n == leases))
}

/// How long to wait before retrying a failed renewal or release: a quarter of the cadence,
/// between 10 ms and a second.
pub fn retry_delay(options: &LockOptions) -> Duration {
    (options.extension_cadence() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// When the leases of a renewal loop are renewed next.
///
/// A round goes out every cadence; while a round is unanswered the next one waits, but only
/// until the unanswered commands are three quarters of the way to giving up ([`suspect_at`]): a
/// command hung on a half-open connection then stays in flight while the next round reaches the
/// server on other connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Renewals<I> {
    next: I,
}

impl<I: Moment> Renewals<I> {
    /// A schedule with a round due `now`.
    pub fn new(now: I) -> Renewals<I> {
        Renewals { next: now }
    }

    /// When the next round is planned, ignoring what is in flight.
    pub fn planned(&self) -> I {
        self.next
    }

    /// A lease that wants its first renewal at `renew_by` joined: no later than the round
    /// planned for the others when some are live (`others_live`), else at `renew_by`.
    pub fn lease_added(&mut self, renew_by: I, others_live: bool) {
        self.next = if others_live {
            self.next.min(renew_by)
        } else {
            renew_by
        };
    }

    /// When the next round goes out, given when each renewal in flight stops being waited for
    /// by the next round ([`suspect_at`]).
    pub fn due_at(&self, suspects: impl IntoIterator<Item = I>) -> I {
        suspects
            .into_iter()
            .max()
            .map_or(self.next, |suspect| suspect.max(self.next))
    }

    /// A round is sent `now`: the next one a cadence later. Returns the stamp of its requests.
    pub fn round_sent(&mut self, options: &LockOptions, now: I) -> Sent<I> {
        self.next = now + options.extension_cadence();
        Sent(now)
    }

    /// A renewal failed `now`: the next round no later than [`retry_delay`] from now.
    pub fn retry_soon(&mut self, options: &LockOptions, now: I) {
        self.next = self.next.min(now + retry_delay(options));
    }

    /// The next round goes out at once (its leases must be renewed in other commands).
    pub fn renew_now(&mut self, now: I) {
        self.next = now;
    }
}

/// When an unanswered renewal `request` stops being waited for: at the earliest deadline of the
/// leases it serves (`earliest_lost_at`, `None` once none is held), and at the latest when even a
/// reply could no longer extend them (its send plus the lease's lifetime).
pub fn give_up_at<I: Moment>(
    options: &LockOptions,
    request: Sent<I>,
    earliest_lost_at: Option<I>,
) -> I {
    let latest = request.0 + options.lease_lifetime();
    earliest_lost_at.map_or(request.0, |deadline| deadline.min(latest))
}

/// Three quarters of the way from sending `request` to giving it up at `give_up_at`: if it is
/// still unanswered then, the next round need not wait for it.
pub fn suspect_at<I: Moment>(request: Sent<I>, give_up_at: I) -> I {
    request.0 + give_up_at.since(request.0) * 3 / 4
}
