//! Releasing a held lease: a plain release, or a transfer to a local waiter (see `handoff`),
//! sent until its outcome is known or `expiry` has passed.
//!
//! A release runs in a task of its own, tracked as work of its family (see `in_flight`): a
//! shutdown sends it again if it has not finished, so a release cut short by its runtime's end
//! leaves no lease behind once the family is shut down. A transfer whose task ends before its
//! outcome is known tells its waiter so, and the waiter ends both leases (the releasing one and
//! its own) on its own runtime.

use std::sync::Arc;
use std::time::Duration;

use mongodb::options::ReturnDocument;
use mongodb::results::UpdateResult;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::sleep_until;

use super::backoff::ATTEMPT_SERVER_TIME;
use super::handoff::{self, Handoff, Offer, Taker, Transfer};
use super::in_flight::{InFlight, Tracked};
use super::lost::Loss;
use super::protocol::{self, Sent, TransferReply, retry_delay};
use super::record::{Lease, Place};
use super::schema;
use super::undo::Undo;
use crate::clock;
use crate::error::{Error, Operation, Result, shown_name};
use crate::options::LockOptions;

/// Where the answer to a release request goes.
pub(crate) type ReleaseReply = oneshot::Sender<Result<()>>;

/// How long one release command is waited for before it is sent again: a quarter of the
/// expiry, at least a second.
fn release_call_limit(options: &LockOptions) -> Duration {
    (options.expiry() / 4).max(Duration::from_secs(1))
}

/// What a release needs besides the lease.
#[derive(Clone, Debug)]
pub(crate) struct ReleaseContext {
    pub(crate) runtime: Handle,
    pub(crate) place: Place,
    pub(crate) in_flight: Arc<InFlight>,
}

impl ReleaseContext {
    /// Starts releasing `lease` in a task of its own on the context's runtime, tracked as work
    /// of the family until it is over; answers on `reply` if given.
    pub(crate) fn spawn(self, lease: Lease, reply: Option<ReleaseReply>) -> JoinHandle<()> {
        let tracked = self
            .in_flight
            .track(vec![self.place.ending_undo(&lease)], None);
        let runtime = self.runtime.clone();
        runtime.spawn(release_lease(self, lease, reply, tracked))
    }
}

/// Expires `lease` (never anybody else's) and keeps the document; wakes an in-process waiter.
async fn release_lease(
    context: ReleaseContext,
    lease: Lease,
    reply: Option<ReleaseReply>,
    tracked: Tracked,
) {
    let result = send_release(&context, &lease, tracked).await;
    // Over here, whatever the outcome (it is over, or will be at its expiry): a later
    // acquisition in this process must not wait for this lease's end as a local event.
    lease.end_here();
    match reply {
        // The caller may have stopped waiting; the outcome is the same either way.
        Some(reply) => {
            let _ = reply.send(result);
        }
        None => match result {
            Ok(()) => tracing::debug!(lock = %shown_name(&lease.name), "released on drop"),
            Err(Error::LockLost { .. }) => {
                tracing::debug!(lock = %shown_name(&lease.name), "dropped guard's lock had been lost");
            }
            Err(error) => tracing::warn!(
                lock = %shown_name(&lease.name),
                %error,
                "background release after drop failed; the lease ends at its expiry"
            ),
        },
    }
}

/// Releases `lease`, as tracked work `tracked` (finished here, or left to undo itself once it
/// has settled when a transfer's outcome stays unknown).
async fn send_release(context: &ReleaseContext, lease: &Lease, tracked: Tracked) -> Result<()> {
    let ReleaseContext { runtime, place, .. } = context;
    let Place {
        collection,
        layout,
        options,
        ..
    } = place;
    let started = clock::now();
    // Lost before the release was sent: the release still goes out (it never touches another
    // holder's lease), but the caller must hear that the lock was not held throughout.
    let lost_before = lease.is_lost();
    let handoff = match &lease.waiters {
        Some(waiters) if protocol::hands_over(options, lost_before, true) => {
            handoff::handoff(waiters, options.write_concern(), options.fair(), layout)
        }
        _ => Handoff::Wake,
    };
    if let Handoff::Transfer(offers) = handoff {
        // Should this task end early, a shutdown must end the waiters' leases too. If a
        // shutdown already took this release's undo, it would miss them: no transfer.
        if offers
            .iter()
            .all(|offer| tracked.add_undo(offer.cleanup.clone()))
        {
            return transfer(context, lease, offers, started, tracked).await;
        }
        for offer in offers {
            offer.taker.deliver(Transfer::NotDone);
        }
    }
    let wake = lease.waiters.as_ref();
    let filter = layout.release_filter(&lease.id, &lease.lock_id);
    let update = layout.release_update(&lease.lock_id, lease.ending());
    let send = || {
        let (collection, filter, update) = (collection.clone(), filter.clone(), update.clone());
        let write_concern = options.write_concern().clone();
        Some(runtime.spawn(async move {
            collection
                .update_one(filter, update)
                .write_concern(write_concern)
                .await
        }))
    };
    let matched = |result: &UpdateResult| result.matched_count > 0;
    let outcome = release_outcome(options, started, send, matched).await;
    tracked.finish();
    // Local waiters attempt once the lease is over (whatever the outcome: it is over or will
    // be), not before: an attempt that overtook the release would fail and cost a command.
    if let Some(waiters) = wake {
        handoff::wake_first(waiters);
    }
    released(lease, started, outcome)?;
    if lost_before {
        return Err(Error::LockLost {
            name: lease.name.clone(),
        });
    }
    lease.state.mark_released();
    Ok(())
}

/// How a release ended.
#[derive(Debug)]
enum Released<T> {
    /// An update matched our lease: we ended it (with this reply).
    Ours(T),
    /// The updates that answered matched nothing, and none had failed before: the lease was
    /// gone (expired and taken, deleted, or ended by someone else).
    NotOurs,
    /// Every try failed, or an earlier try's outcome is unknown and the later ones matched
    /// nothing (it may have ended the lease itself): the lease is over, whether lost before or
    /// not cannot be told.
    Unknown(Error),
    /// No try answered within `expiry`: the lease ends by itself.
    NoReply,
    /// Nothing was sent: a shutdown took the work's undo first, and ends the lease itself.
    Declined,
}

/// The first of `tasks` to finish, with its index; never resolves when there is none (a
/// `select!` builds the futures of its disabled branches too).
pub(crate) async fn first_finished<'a, T: 'a>(
    tasks: impl IntoIterator<Item = &'a mut JoinHandle<T>>,
) -> (std::result::Result<T, tokio::task::JoinError>, usize) {
    let tasks: Vec<_> = tasks.into_iter().collect();
    if tasks.is_empty() {
        return std::future::pending().await;
    }
    let (result, index, _) = futures::future::select_all(tasks).await;
    (result, index)
}

/// Sends the release update with `send` (which declines, with `None`, once the work's undo was
/// taken) and waits for the outcome until `started + expiry`.
///
/// A try that fails transiently (an election, a lost reply) is sent again after a short delay.
/// A try without a reply after a quarter of the expiry (at least 1 s) is not given up, but a
/// second one goes out beside it, on another connection: a half-open connection must not keep
/// the lease alive until it expires, and whichever try matches tells that the lease was ours.
async fn release_outcome<T, S>(
    options: &LockOptions,
    started: clock::Instant,
    send: S,
    matched: impl Fn(&T) -> bool,
) -> Released<T>
where
    S: Fn() -> Option<JoinHandle<mongodb::error::Result<T>>>,
{
    let deadline = started + options.expiry();
    let Some(first) = send() else {
        return Released::Declined;
    };
    let mut calls = vec![first];
    let mut resend_at = Some(clock::now() + release_call_limit(options));
    let mut matched_nothing = false;
    // The first failure whose outcome is unknown, and the last failure.
    let (mut uncertain, mut failure): (Option<Error>, Option<Error>) = (None, None);
    let outcome = loop {
        if calls.is_empty() && resend_at.is_none() {
            break match (uncertain, failure, matched_nothing) {
                (Some(error), _, _) => Released::Unknown(error),
                (None, _, true) => Released::NotOurs,
                (None, Some(error), false) => Released::Unknown(error),
                (None, None, false) => Released::NoReply,
            };
        }
        let resend = resend_at.filter(|at| *at < deadline);
        tokio::select! {
            (result, index) = first_finished(&mut calls), if !calls.is_empty() => {
                calls.swap_remove(index);
                match result {
                    Ok(Ok(result)) if matched(&result) => break Released::Ours(result),
                    // Definite answers: no more tries (one still in flight may yet match).
                    Ok(Ok(_)) => {
                        matched_nothing = true;
                        resend_at = None;
                    }
                    Ok(Err(error)) => {
                        let error = Error::Mongo(error);
                        let retry_at = clock::now() + retry_delay(options);
                        if error.is_transient() && retry_at < deadline {
                            uncertain.get_or_insert(error);
                            if calls.is_empty() {
                                resend_at = Some(retry_at);
                            }
                        } else {
                            failure = Some(error);
                            resend_at = None;
                        }
                    }
                    Err(_join_error) => {
                        failure = Some(Error::BackgroundTaskEnded {
                            operation: Operation::Release,
                        });
                        resend_at = None;
                    }
                }
            }
            () = sleep_until(clock::wake_toward(resend.unwrap_or(deadline))), if resend.is_some() => {
                if resend.is_some_and(|at| clock::now() >= at) {
                    match send() {
                        Some(call) => {
                            calls.push(call);
                            resend_at = Some(clock::now() + release_call_limit(options));
                        }
                        None => resend_at = None,
                    }
                }
            }
            () = sleep_until(clock::wake_toward(deadline)) => {
                if clock::now() >= deadline {
                    break uncertain.map_or(Released::NoReply, Released::Unknown);
                }
            }
        }
        if resend_at.is_some_and(|at| at >= deadline) {
            resend_at = None;
        }
    };
    for call in calls {
        call.abort();
    }
    outcome
}

/// What a release's outcome means for its caller: `Ok` when it ended our lease.
fn released<T>(lease: &Lease, started: clock::Instant, outcome: Released<T>) -> Result<T> {
    match outcome {
        Released::Ours(reply) => Ok(reply),
        Released::NotOurs => {
            lease.mark_lost(Loss::GoneAtRelease);
            Err(Error::LockLost {
                name: lease.name.clone(),
            })
        }
        Released::Unknown(error) => Err(error),
        Released::NoReply => Err(Error::NoReply {
            operation: Operation::Release,
            name: lease.name.clone(),
            waited: clock::now().saturating_duration_since(started),
        }),
        // As for a lease its family's shutdown took from its renewal loop.
        Released::Declined => {
            lease.mark_lost(Loss::ShutDown);
            Err(Error::LockLost {
                name: lease.name.clone(),
            })
        }
    }
}

/// Delivers a transfer's outcome to its waiters exactly once: if the releasing task ends before
/// it knows the outcome (its runtime shut down), dropping this tells the waiters so.
struct Delivery {
    takers: Vec<Box<dyn Taker>>,
    /// Ends the releasing lease.
    releasing: Undo,
}

impl Delivery {
    /// Delivers what `transfer` makes to the waiters not delivered to yet.
    fn deliver(&mut self, transfer: impl Fn() -> Transfer) {
        for taker in self.takers.drain(..) {
            taker.deliver(transfer());
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        for taker in self.takers.drain(..) {
            taker.deliver(Transfer::Abandoned {
                releasing: self.releasing.clone(),
            });
        }
    }
}

/// Releases `lease` by handing it over to local waiters' `offers` (one, or the readers behind a
/// writer), in one `findAndModify`: filtered by our lock id (or the waiters', should an earlier
/// try have applied), it ends our lease and runs each waiter's takeover pipeline, which writes
/// its lock id, a fresh lease and (but for readers) the next fencing token, exactly as its own
/// attempt would with our lease gone. When that command returns, the waiters it admitted hold
/// the lock.
///
/// If the outcome stays unknown, the waiters' leases (if the command took effect) are ended at
/// once with cleanups filtered by their lock ids, and the waiters go on waiting.
///
/// Each try carries the attempts' server time limit, and its settle deadline (see `in_flight`),
/// in the releasing family's work and in each waiter's family's, tells a shutdown of either to
/// wait for its outcome rather than undo it. Should a shutdown of the releasing family have
/// undone the transfer all the same (its outcome came later than that), the waiters are not
/// handed the leases it is ending: they go on waiting. An outcome that stays unknown is undone
/// once the last try has settled (and the waiters' leases at once, in case it applied).
async fn transfer(
    context: &ReleaseContext,
    lease: &Lease,
    offers: Vec<Offer>,
    started: clock::Instant,
    tracked: Tracked,
) -> Result<()> {
    let ReleaseContext {
        runtime,
        place,
        in_flight,
    } = context;
    let waiter_layout = offers
        .first()
        .map_or_else(|| place.layout.clone(), |offer| offer.layout.clone());
    let waiters: Vec<&str> = offers.iter().map(|offer| offer.lock_id.as_str()).collect();
    // In each waiter's family too: its shutdown waits for the lease this may hand it (and for
    // that lease's release, which its family starts on delivery) before returning.
    let receiving: Vec<Tracked> = offers
        .iter()
        .map(|offer| {
            let settle_by = clock::now() + ATTEMPT_SERVER_TIME;
            offer
                .receiver
                .track(vec![offer.cleanup.clone()], Some(settle_by))
        })
        .collect();
    let filter = schema::transfer_filter(
        &lease.id,
        &place.layout,
        &lease.lock_id,
        &waiter_layout,
        &waiters,
    );
    let update: Vec<_> = offers
        .iter()
        .flat_map(|offer| offer.taker.update(&lease.lock_id))
        .collect();
    let mut cleanups = Vec::with_capacity(offers.len());
    let mut delivery = Delivery {
        takers: offers
            .into_iter()
            .map(|offer| {
                cleanups.push(offer.cleanup);
                offer.taker
            })
            .collect(),
        releasing: place.ending_undo(lease),
    };
    let send = || {
        // The server gives the try up after this: a shutdown waits until then for its outcome.
        let settle_by = clock::now() + ATTEMPT_SERVER_TIME;
        if !tracked.settle_by(settle_by) {
            return None;
        }
        for receiving in &receiving {
            // Taken by the waiter's family's shutdown: it has sent the waiter's cleanup, and
            // a lease delivered to it now is released by its family.
            let _ = receiving.settle_by(settle_by);
        }
        let (collection, filter, update) =
            (place.collection.clone(), filter.clone(), update.clone());
        let write_concern = place.options.write_concern().clone();
        Some(runtime.spawn(async move {
            collection
                .find_one_and_update(filter, update)
                .return_document(ReturnDocument::After)
                .write_concern(write_concern)
                .max_time(ATTEMPT_SERVER_TIME)
                .await
        }))
    };
    let outcome = release_outcome(&place.options, started, send, Option::is_some).await;
    let reply = match outcome {
        Released::Ours(_) => TransferReply::Applied,
        Released::Unknown(_) | Released::NoReply => TransferReply::Unknown,
        Released::NotOurs | Released::Declined => TransferReply::NotApplied,
    };
    // A shutdown that took this transfer's undo is ending the waiters' leases.
    let settled = reply != TransferReply::Applied || tracked.settle();
    let step = protocol::transfer_answered(reply, settled);
    let result = released(lease, started, outcome);
    if let Ok(document) = &result {
        lease.state.mark_released();
        if step.hand_over {
            tracing::debug!(lock = %shown_name(&lease.name), "released to local waiters");
            let document = document.clone().unwrap_or_default();
            // Every try was sent at or after `started`: the leases last at least from then.
            delivery.deliver(|| Transfer::Done {
                document: document.clone(),
                request: Sent::now(started),
            });
        } else {
            tracing::debug!(lock = %shown_name(&lease.name), "released; the transfer to local waiters was undone by a shutdown");
        }
    }
    if step.undo_waiters {
        // In case a try applied.
        for cleanup in cleanups {
            in_flight.spawn_undo(runtime, cleanup);
        }
    }
    if step.undo_when_settled {
        // Everything again once a try still on its way has landed or been given up (the
        // releasing lease included).
        tracked.undo_when_settled(runtime);
    } else {
        tracked.finish();
    }
    // Unless handed over above: the waiters go on waiting.
    delivery.deliver(|| Transfer::NotDone);
    // Delivered (a lease handed to a waiter of a family shut down is being released, tracked by
    // its family): nothing of the transfer is left for the waiters' families to wait for.
    for receiving in receiving {
        receiving.finish();
    }
    result.map(drop)
}
