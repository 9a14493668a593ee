//! The lease protocol's decisions, without I/O.
//!
//! What a holder may rely on and until when, when a renewal round goes out, when an unanswered
//! renewal is given up, and what becomes of an acquisition attempt's outcome are decided here, by
//! small state machines that are told the current instant and what happened, and answer with what
//! to do. They never read a clock, sleep, spawn or send (the shape of `quinn-proto` and `rustls`:
//! state and events in, decisions out).
//!
//! The engine runs them on its clocks: [`Lease`] inside every guard's lost signal
//! (`state::LeaseState`), [`Renewals`], [`give_up_at`] and [`suspect_at`] in the renewal loop
//! (`renewal`), [`renewed_every_lease`] in every renewal of several leases in one command
//! (`renewal_commands`), [`Transaction`] in every lease-checked transaction (`held`), [`Attempt`] in
//! every acquisition attempt (`acquire`), [`DocumentAttempt`] in every attempt to lock a
//! document (`document_lock`), [`hands_over`], [`handover`] and [`transfer_answered`]
//! in every release (`release`, `handoff`), [`keeps_window`] in how a lease ends (`record`), [`Work`] in what a
//! shutdown waits for and undoes (`in_flight`, `family`). The model checker (`model/`, through the
//! hidden `crate::__model`) runs the very same code on its ticks: a decision exists once, so a
//! mistake planted in it changes what the checker explores.
//!
//! The rules, and why they are safe, are in DESIGN.md ("How it works"):
//! - a lease is relied on until the *send* instant of the last request that confirmed it, plus
//!   [`LockOptions::lease_lifetime`](crate::LockOptions::lease_lifetime) (`expiry − safety margin − max_clock_skew`): the server may
//!   have applied the request at any instant after it was sent, and its `$$NOW` may run ahead of
//!   the client's clock by `max_clock_skew`;
//! - once that deadline has passed, nothing extends the lease (a confirmation that comes late
//!   may have been applied after the lease ended and another caller took the name);
//! - a caller that stops waiting for an attempt, or whose attempt's outcome is unknown, undoes
//!   it; a win nobody waits for any more is released, never handed out;
//! - a shutdown never undoes work whose outcome it has not waited for (an attempt or a transfer
//!   is waited for until its settle deadline), and nobody is handed a lease whose undo a
//!   shutdown took.

use std::fmt::Debug;
use std::ops::Add;
use std::time::Duration;

/// An instant on a clock that never steps back: the engine's suspend-aware clock and Tokio's
/// clock, or the model checker's ticks.
pub trait Moment: Copy + Ord + Debug + Add<Duration, Output = Self> {
    /// How long after `earlier` this is (zero if it is not after).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for boot_time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for tokio::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// A request that can confirm a lease (an acquisition attempt, a transfer, a renewal), stamped
/// with the instant it was sent. Made only by [`Sent::now`] just before sending, and by
/// [`Renewals::round_sent`], so that a deadline can only count from a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Sent<I>(I);

impl<I: Moment> Sent<I> {
    /// A request about to be sent `now`.
    pub fn now(now: I) -> Sent<I> {
        Sent(now)
    }

    /// When it was sent.
    pub fn at(self) -> I {
        self.0
    }
}

mod attempt;
mod handover;
mod lease;
mod renewals;
#[cfg(test)]
mod tests;
mod work;

pub use attempt::{Attempt, DocumentAttempt, DocumentStep, Reply, Step, Tell, settled};
pub(crate) use attempt::{MIN_ATTEMPT_WAIT, attempt_reply_limit};
pub use handover::{
    Handover, InLine, MAX_TRANSFERS_IN_A_ROW, TransferReply, TransferStep, handover, hands_over,
    keeps_window, transfer_answered,
};
pub use lease::{Lease, Phase, Refusal, Transaction};
pub use renewals::{Renewals, give_up_at, renewed_every_lease, retry_delay, suspect_at};
pub use work::{Due, Settling, Work};
