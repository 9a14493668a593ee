//! Handing a lease over in its release command: a waiter's offer, the outcome it receives,
//! and which leases can be handed to which waiters.

use mongodb::bson::Document;
use mongodb::options::WriteConcern;

use std::sync::Arc;

use crate::clock;
use crate::lease::Sent;
use crate::lease::in_flight::InFlight;
use crate::lease::schema::{HOLDERS, Layout, READERS};
use crate::lease::undo::Undo;

/// A waiter's readiness to take a lease over in a release command: an exclusive lock's waiter
/// from its holder, a semaphore's from a holder of a place, a reader from the writer (see
/// [`takes_over`]).
pub(crate) struct Offer {
    /// The waiter's lock id.
    pub(crate) lock_id: String,
    /// Where the waiter's lease would be stored.
    pub(crate) layout: Layout,
    /// Ends the lease the waiter may have been given, should the outcome be unknown.
    pub(crate) cleanup: Undo,
    /// The waiter's family's work under way: a transfer to it is tracked there too, so that
    /// that family's shutdown waits for it.
    pub(crate) receiver: Arc<InFlight>,
    /// The waiter's write concern: only a releaser with the same one transfers to it.
    pub(crate) write_concern: WriteConcern,
    /// Whether the waiter's lock is fair: only a releaser that agrees transfers to it (an
    /// unfair takeover would jump the line, and drop it).
    pub(crate) fair: bool,
    /// The waiting caller: builds the takeover's update, and receives the outcome.
    pub(crate) taker: Box<dyn Taker>,
}

/// A waiting caller that offered to take a lease over (`acquire`'s waiter, of any kind).
pub(crate) trait Taker: Send {
    /// The pipeline that takes the lease `replacing` over for this waiter (its kind's
    /// `Claim::update`).
    fn update(&self, replacing: &str) -> Vec<Document>;

    /// Receives the outcome, and builds the waiter's guard from it (its kind's `Claim::won`).
    /// Called exactly once per offer: with [`Transfer::NotDone`] if the offer is replaced,
    /// withdrawn, or its waiter leaves without it.
    fn deliver(self: Box<Self>, transfer: Transfer);
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Offer")
            .field("lock_id", &self.lock_id)
            .finish_non_exhaustive()
    }
}

/// The outcome of a transfer.
#[derive(Debug)]
pub(crate) enum Transfer {
    /// The lease is the waiter's: the document after the command, sent first as `request`.
    Done {
        document: Document,
        request: Sent<clock::Instant>,
    },
    /// No transfer (the releasing lease was gone, or the outcome is unknown and was undone):
    /// the waiter goes on waiting.
    NotDone,
    /// The releasing task ended (its runtime shut down) before it knew the outcome: the lease
    /// may be the waiter's, or still the releasing one's (which `releasing` ends). The waiter
    /// ends both and goes on waiting.
    Abandoned { releasing: Undo },
}

/// What a release does for the local waiters.
#[derive(Debug)]
pub(crate) enum Handoff {
    /// Hand the lease over to these waiters (one, or the readers behind a writer).
    Transfer(Vec<Offer>),
    /// Release, then wake waiters.
    Wake,
}

/// Whether a lease stored as `releasing` says can be handed over in its release command to a
/// waiter whose lease would be stored as `waiter` says: `Some(false)` to one such waiter (an
/// exclusive lock's, a semaphore place's), `Some(true)` to every such waiter in a row (the
/// readers behind a writer), `None` not at all (a reader's release, a document lock's).
pub(crate) fn takes_over(releasing: &Layout, waiter: &Layout) -> Option<bool> {
    match (releasing, waiter) {
        (Layout::LockDocument, Layout::LockDocument) => Some(false),
        (Layout::Members(from), Layout::Members(to)) if from == HOLDERS && to == HOLDERS => {
            Some(false)
        }
        (Layout::Writer, Layout::Members(to)) if to == READERS => Some(true),
        _ => None,
    }
}
