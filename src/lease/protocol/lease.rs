//! A holder's view of its lease: until when it may rely on it, and when it wants renewing
//! ([`Lease`]); the deadline of a lease-checked transaction ([`Transaction`]).

use std::fmt::Debug;
use std::time::Duration;

use super::{Moment, Sent};
use crate::options::LockOptions;

/// Where a lease stands for its holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase<I> {
    /// Held.
    Held {
        /// Presumed lost then, unless a confirmation extends it first; `None` for a lease
        /// without a deadline, held until it is marked lost or released.
        lost_at: Option<I>,
    },
    /// Lost.
    Lost {
        /// Whether [`Lease::mark_lost`] reported it (a deadline passing is noticed by whoever
        /// asks first, and reported by the renewal loop).
        announced: bool,
    },
    /// Released by its holder without having been lost.
    Released,
}

/// A lease as its holder sees it: until when it may rely on it.
///
/// Loss is sticky: once the deadline has been seen to pass, or the lease was marked lost, no
/// confirmation revives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease<I> {
    phase: Phase<I>,
    /// The end of the hold allowed by [`LockOptions::max_hold`]: no confirmation extends the
    /// deadline past it.
    hold_until: Option<I>,
    /// With [`LockOptions::max_idle`]: `max_idle` after the holder last reported progress (or
    /// after the acquiring request's send): no deadline is past it.
    idle_until: Option<I>,
    /// The deadline the confirmations alone allow (within the hold); the deadline is the
    /// earlier of it and `idle_until`.
    confirmed_until: Option<I>,
    /// The request that confirmed the lease last (`None` for a lease without a deadline).
    confirmed: Option<Sent<I>>,
}

impl<I: Moment> Lease<I> {
    /// The lease won by `request`, whose reply arrived `now`: relied on until the request's send
    /// plus the lease's lifetime, never past `max_hold` after the send. A reply that came after
    /// that deadline yields a lease lost from the start.
    pub fn won(options: &LockOptions, request: Sent<I>, now: I) -> Lease<I> {
        let hold_until = options.max_hold().map(|max_hold| request.0 + max_hold);
        let idle_until = options.max_idle().map(|max_idle| request.0 + max_idle);
        let confirmed_until = capped(request.0 + options.lease_lifetime(), hold_until);
        let mut lease = Lease {
            phase: Phase::Held {
                lost_at: Some(capped(confirmed_until, idle_until)),
            },
            hold_until,
            idle_until,
            confirmed_until: Some(confirmed_until),
            confirmed: Some(request),
        };
        lease.settle(now);
        lease
    }

    /// A lease with no deadline of its own, lost only when marked so (the in-memory locks).
    pub fn unbounded() -> Lease<I> {
        Lease {
            phase: Phase::Held { lost_at: None },
            hold_until: None,
            idle_until: None,
            confirmed_until: None,
            confirmed: None,
        }
    }

    /// A lease held until `lost_at`, never past `hold_until` (for tests of what runs it).
    #[cfg(test)]
    pub(crate) fn until(lost_at: I, hold_until: Option<I>) -> Lease<I> {
        Lease {
            phase: Phase::Held {
                lost_at: Some(capped(lost_at, hold_until)),
            },
            hold_until,
            idle_until: None,
            confirmed_until: Some(capped(lost_at, hold_until)),
            confirmed: None,
        }
    }

    /// Where the lease stands `now`: `Held` turns into `Lost` once its deadline has passed.
    pub fn settle(&mut self, now: I) -> Phase<I> {
        if let Phase::Held {
            lost_at: Some(lost_at),
        } = self.phase
            && now >= lost_at
        {
            self.phase = Phase::Lost { announced: false };
        }
        self.phase
    }

    /// Whether the lease is lost `now`.
    pub fn is_lost(&mut self, now: I) -> bool {
        matches!(self.settle(now), Phase::Lost { .. })
    }

    /// The deadline while held `now` (`None` once lost or released, or without one).
    pub fn lost_at(&mut self, now: I) -> Option<I> {
        match self.settle(now) {
            Phase::Held { lost_at } => lost_at,
            Phase::Lost { .. } | Phase::Released => None,
        }
    }

    /// When its loss is due to be reported: its deadline while held, `now` once the deadline has
    /// passed unreported (`None` once the loss was reported, or the lease released, or without
    /// a deadline). What the renewal loop wakes up for: a loss whose deadline passed while it
    /// was busy with something else is still reported.
    pub fn report_loss_at(&mut self, now: I) -> Option<I> {
        match self.settle(now) {
            Phase::Held { lost_at } => lost_at,
            Phase::Lost { announced: false } => Some(now),
            Phase::Lost { announced: true } | Phase::Released => None,
        }
    }

    /// The server confirmed the lease in reply to `request`, and the reply arrived `now`: the
    /// deadline moves to the request's send plus the lease's lifetime (never back, never past
    /// the end of the hold), but only if it has not passed: a lease whose deadline passed is lost
    /// for good, however its confirmation turned out. Returns whether the lease is still held.
    pub fn confirmed(&mut self, options: &LockOptions, request: Sent<I>, now: I) -> bool {
        self.lengthened(request.0 + options.lease_lifetime(), request, now)
    }

    /// Whether the holder may extend the lease `by` when the extension is about to be sent
    /// `now` (see [`Lease::extended`]): not once it is lost or released, and not past the end
    /// of the hold allowed by `max_hold`.
    pub fn may_extend(&mut self, by: Duration, now: I) -> Result<(), Refusal<I>> {
        match self.settle(now) {
            Phase::Held { .. } => match self.hold_until {
                Some(hold_until) if now + by > hold_until => {
                    Err(Refusal::PastMaxHold { hold_until })
                }
                _ => Ok(()),
            },
            Phase::Lost { .. } | Phase::Released => Err(Refusal::Ended),
        }
    }

    /// The server extended the lease to at least `by` after its `$$NOW`, in reply to `request`,
    /// and the reply arrived `now`: the deadline moves to the request's send plus `by` less the
    /// margins a lifetime leaves out ([`LockOptions::lease_lifetime`] is `expiry` less them), if
    /// that is later, never past the end of the hold, and only if it has not passed (as
    /// [`Lease::confirmed`]). Returns whether the lease is still held.
    pub fn extended(
        &mut self,
        options: &LockOptions,
        by: Duration,
        request: Sent<I>,
        now: I,
    ) -> bool {
        let margins = options.expiry() - options.lease_lifetime();
        self.lengthened(request.0 + by.saturating_sub(margins), request, now)
    }

    /// A confirmation by `request` (its reply arrived `now`) moves the deadline to `until` if
    /// that is later, never past the end of the hold, unless the deadline has passed.
    fn lengthened(&mut self, until: I, request: Sent<I>, now: I) -> bool {
        match self.settle(now) {
            Phase::Held { lost_at: None } => true,
            Phase::Held {
                lost_at: Some(current),
            } => {
                let extended = capped(until, self.hold_until);
                let confirmed_until = self.confirmed_until.map_or(extended, |c| c.max(extended));
                self.confirmed_until = Some(confirmed_until);
                self.phase = Phase::Held {
                    lost_at: Some(current.max(capped(confirmed_until, self.idle_until))),
                };
                self.confirmed = self.confirmed.max(Some(request));
                true
            }
            Phase::Lost { .. } | Phase::Released => false,
        }
    }

    /// The holder's work reported progress `now` ([`LockOptions::max_idle`]): the deadline may
    /// run to `now + max_idle`, as far as the confirmations allow, unless it has passed (a lease
    /// whose work stalled past `max_idle` is lost for good). Returns whether the lease is still
    /// held.
    pub fn progressed(&mut self, options: &LockOptions, now: I) -> bool {
        let phase = self.settle(now);
        let (Some(max_idle), Phase::Held { lost_at }) = (options.max_idle(), phase) else {
            return matches!(phase, Phase::Held { .. });
        };
        let idle_until = (self.idle_until).map_or(now + max_idle, |i| i.max(now + max_idle));
        self.idle_until = Some(idle_until);
        if let (Some(current), Some(confirmed_until)) = (lost_at, self.confirmed_until) {
            self.phase = Phase::Held {
                lost_at: Some(current.max(confirmed_until.min(idle_until))),
            };
        }
        true
    }

    /// Whether the work went `max_idle` without reporting progress, `now`.
    pub fn idle_ended(&self, now: I) -> bool {
        self.idle_until.is_some_and(|idle_until| now >= idle_until)
    }

    /// Marks the lease lost (unless released); returns whether this is the first report of the
    /// loss (also when its deadline had already passed unreported).
    pub fn mark_lost(&mut self) -> bool {
        let first = matches!(
            self.phase,
            Phase::Held { .. } | Phase::Lost { announced: false }
        );
        if first {
            self.phase = Phase::Lost { announced: true };
        }
        first
    }

    /// Marks the lease released `now`, unless it is lost by then; returns whether it was.
    pub fn mark_released(&mut self, now: I) -> bool {
        let held = matches!(self.settle(now), Phase::Held { .. });
        if held {
            self.phase = Phase::Released;
        }
        held
    }

    /// Whether the hold allowed by `max_hold` is over `now`.
    pub fn hold_ended(&self, now: I) -> bool {
        self.hold_until.is_some_and(|hold_until| now >= hold_until)
    }

    /// When the lease wants its next renewal: a cadence after the request that confirmed it last
    /// was sent (not after its reply: a slow reply has eaten into the lease). `None` for a lease
    /// without a deadline.
    pub fn renew_by(&self, options: &LockOptions) -> Option<I> {
        self.confirmed
            .map(|request| request.0 + options.extension_cadence())
    }
}

/// Why a holder may not extend its lease ([`Lease::may_extend`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal<I> {
    /// It is lost or released.
    Ended,
    /// The extension would run past the end of the hold `max_hold` allows.
    PastMaxHold {
        /// When the hold ends.
        hold_until: I,
    },
}

/// The renewal inside a lease-checked transaction (`HeldLease::transaction`): the transaction's
/// first write renews the lease, filtered on it being ours and live, but the write counts only
/// once the transaction commits (until then nobody else can write the lease's document, and
/// nobody sees the renewal). Once committed, the lease is confirmed from the renewal's *send*,
/// like any renewal: the server evaluated its `$$NOW` at some instant after the send, not at the
/// commit, which may come much later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transaction<I> {
    renewal: Sent<I>,
}

impl<I: Moment> Transaction<I> {
    /// The transaction's renewal is sent `now`.
    pub fn renewal_sent(now: I) -> Transaction<I> {
        Transaction { renewal: Sent(now) }
    }

    /// The transaction committed, and the reply came `now`: see [`Lease::confirmed`], from the
    /// renewal's send. Returns whether the lease is still held.
    pub fn committed(self, lease: &mut Lease<I>, options: &LockOptions, now: I) -> bool {
        lease.confirmed(options, self.renewal, now)
    }
}

/// `deadline`, no later than `hold_until`.
fn capped<I: Moment>(deadline: I, hold_until: Option<I>) -> I {
    hold_until.map_or(deadline, |hold_until| deadline.min(hold_until))
}
