//! What the engine asks of each kind of lock: [`Claim`], implemented by each primitive on a type
//! of its own, and [`Granted`], what a claim yields.
//!
//! The engine decides when to send (`acquire`, with the protocol core) and carries the messages;
//! a kind says only what to send and whether it won. An attempt and a takeover in a local
//! holder's release command (see `handoff`) differ only in their update, so both end in the
//! same [`Claim::won`].

use std::future::Future;
use std::sync::Arc;

use mongodb::bson::Document;
use tokio::runtime::Handle;

use super::Target;
use super::protocol::Sent;
use super::schema::Layout;
use super::undo::Undo;
use super::waiting_marker::WaitingMarker;
use crate::clock;
use crate::error::Result;
use crate::token::FencingToken;

/// The stamp of a request that won a lease: when it was sent.
pub(crate) type Request = Sent<clock::Instant>;

/// A kind of lock, as the engine sees it when it acquires one: where its lease lives, the update
/// that claims it, and whether the reply shows it won.
pub(crate) trait Claim: Send + Sync + Sized + 'static {
    /// What a win yields: a guard, or a guard and whether room is left beside it.
    type Won: Granted + Send + 'static;

    /// Whether a waiter of this kind offers to take a lease over in the release command of a
    /// holder in the same process (see `handoff`); if so, [`update`](Claim::update) is also
    /// called with the releasing lease.
    const TAKES_OVER: bool;

    /// The lock whose collection and options the claim uses.
    fn target(&self) -> &Target;

    /// Where this kind's lease is stored.
    fn layout(&self) -> Layout;

    /// The update that gives the lease to `lock_id`: an attempt's, or with `replacing`, a
    /// takeover's, sent in the release command of that lease.
    fn update(&self, lock_id: &str, replacing: Option<&str>) -> Vec<Document>;

    /// The win, if `document` (returned by the command first sent as `request`) shows the lease
    /// `lock_id`; `Ok(None)` if the lock was busy. The lease is held from here on.
    ///
    /// # Errors
    /// A refusal the caller must see (a semaphore of another `max_count`), or a document no
    /// conforming server returns.
    fn won(
        &self,
        runtime: &Handle,
        document: Document,
        lock_id: String,
        request: Request,
    ) -> Result<Option<Self::Won>>;

    /// A fair lock's wait: its place in the lock's line (see `line`), which each reply shows.
    fn place_in_line(&self) -> Option<&WaitingMarker> {
        None
    }

    /// What ends the lease an attempt of `lock_id` may have taken, should its outcome be unknown.
    fn undo(&self, lock_id: &str) -> Undo {
        self.target().cleanup(&self.layout(), lock_id)
    }

    /// One attempt: its update, upserted on the lock's document, and whether it won (`Ok(None)`:
    /// the lock is busy). A kind whose attempt takes more than one command says so here.
    fn attempt(
        self: Arc<Self>,
        runtime: Handle,
        lock_id: String,
    ) -> impl Future<Output = Result<Option<Self::Won>>> + Send + 'static {
        async move {
            let request = Sent::now(clock::now());
            let document = self.target().upsert(self.update(&lock_id, None)).await?;
            if let Some(place) = self.place_in_line() {
                place.saw(&document);
            }
            self.won(&runtime, document, lock_id, request)
        }
    }
}

/// What an acquisition yields, as the engine and its tracing span see it.
pub(crate) trait Granted {
    /// The fencing token, for kinds that have one.
    fn fencing_token(&self) -> Option<FencingToken>;

    /// Whether the next local waiter may succeed too (a semaphore with places left, a reader).
    fn leaves_room(&self) -> bool;

    /// Won after its caller stopped waiting: released at once, and quietly, since its lease may
    /// already have been ended by the cleanup sent when the caller left (that is no loss).
    fn undelivered(self);
}
