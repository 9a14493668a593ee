//! The held-lease core under every guard: one lease, its `lost` state, its release and its
//! `Drop`. The public guards wrap it and add what their kind has (a fencing token, a document).

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Bson, Document};
use mongodb::error::{TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::ReadConcern;
use mongodb::results::UpdateResult;
use mongodb::{Client, ClientSession, Collection};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::bound::Bound;
use super::family::Family;
use super::lost::LostSignal;
use super::metrics;
use super::protocol::{Refusal, Sent, Transaction};
use super::record::{Lease, Place};
use super::renewal::Command;
use super::renewal_commands::{Extended, Failure, MAX_TIME_LIMIT, extend_one};
use super::schema;
use super::state::LeaseState;
use crate::clock;
use crate::error::{Error, Operation, Result, shown_name};
use crate::lock_status::LockKind;

/// A lease won by an attempt, renewed by a renewal loop until it is released or lost.
#[derive(Debug)]
pub(crate) struct HeldLease {
    /// How the lock is named in messages.
    name: String,
    /// `None` once the lease was handed back to the renewal loop.
    lock_id: Option<String>,
    state: Arc<LeaseState>,
    renewal_loop: mpsc::UnboundedSender<Command>,
    /// Where the lease is stored (its document's `_id` in `place`), for transactions that
    /// check it.
    place: Place,
    id: Bson,
    /// For the hold-time metric.
    kind: LockKind,
    held_since: Instant,
    /// The tasks bound to it (the guards' `spawn`).
    bound: Bound,
}

/// The longest a guard's `extend` may extend a lease by (as every duration option).
const MAX_EXTENSION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// How long [`HeldLease::transaction`] retries transient transaction errors, as the driver's
/// own `with_transaction` does.
const TRANSACTION_RETRY_LIMIT: Duration = Duration::from_secs(120);

impl HeldLease {
    /// Registers `lease` (just won) with the renewal loop of `family` for `place`.
    ///
    /// `None` when the reply came too late to trust the lease (its local deadline has passed:
    /// the lease may already have ended on the server and someone else taken over); the lease
    /// is then released at once, since whatever is left of it is of no use.
    pub(crate) fn hold(
        runtime: &Handle,
        family: &Family,
        place: &Place,
        lease: Lease,
    ) -> Option<HeldLease> {
        metrics::hold_started(lease.kind);
        if lease.is_lost() {
            // Too late to trust: nobody will be given it (no loss to report, nothing to keep).
            lease.state.set_undelivered();
        }
        let held = HeldLease {
            name: lease.name.clone(),
            lock_id: Some(lease.lock_id.clone()),
            state: Arc::clone(&lease.state),
            kind: lease.kind,
            held_since: Instant::now(),
            id: lease.id.clone(),
            place: place.clone(),
            bound: Bound::new(
                runtime.clone(),
                LostSignal::new(vec![Arc::clone(&lease.state)]),
            ),
            renewal_loop: family.hold(runtime, place, lease),
        };
        if held.is_lost() {
            // Nobody is given this lease: its release (by the drop) ends it at once.
            held.state.set_undelivered();
            return None;
        }
        Some(held)
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

    /// The holder's work reported progress ([`LockOptions::max_idle`](crate::LockOptions::max_idle)):
    /// the guards' `progress`. Whether the lease is still held.
    pub(crate) fn progress(&self) -> bool {
        self.state.progressed(&self.place.options)
    }

    /// The tasks bound to this lease (the guards' `spawn`).
    pub(crate) fn bound(&self) -> &Bound {
        &self.bound
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Runs `work` until it completes or the lease is lost: the guards' `run_while_held`.
    pub(crate) async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lost()
            .unless_lost(work)
            .await
            .ok_or_else(|| self.lost_error())
    }

    /// Extends the lease to at least `by` from now, on the server and for the lost signal: the
    /// guards' `extend`. It never shortens the lease, and refuses (writing nothing) a `by` of
    /// zero or over 365 days, and one that would run past `max_hold`.
    ///
    /// One `update` filtered on the lease being ours and live, with a server-side time limit
    /// of what is left of the lease (a write that waited beyond that must not extend it with a
    /// `$$NOW` fixed before the wait). The new deadline counts from the send, as a renewal's.
    /// A lease found gone is reported lost; a failure leaves the deadline as it was (the
    /// extension may have applied: the lease then lasts longer on the server than here, which
    /// is safe, and its release ends it).
    pub(crate) async fn extend(&self, by: Duration) -> Result<()> {
        let lock_id = self.check_extension(by)?;
        let options = &self.place.options;
        let shown = shown_name(&self.name);
        let now = clock::now();
        let Some(deadline) = self.state.lost_at() else {
            return Err(self.lost_error());
        };
        let time_limit = deadline
            .saturating_duration_since(now)
            .clamp(Duration::from_millis(1), MAX_TIME_LIMIT);
        let by_millis = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let sent = Sent::now(now);
        let lost = self.lost();
        let extension = extend_one(&self.place, &self.id, lock_id, by_millis, time_limit);
        let outcome = tokio::select! {
            biased;
            () = lost.wait() => return Err(self.lost_error()),
            outcome = extension => outcome,
        };
        match outcome {
            Ok(Extended::Yes) if self.state.extended(options, by, sent) => Ok(()),
            Ok(Extended::Yes) => Err(self.lost_error()),
            Ok(Extended::Refused) => Err(Error::RevocationRequested {
                name: self.name.clone(),
            }),
            Ok(Extended::Gone) => {
                let _ = self.renewal_loop.send(Command::Gone {
                    lock_id: lock_id.to_owned(),
                });
                Err(self.lost_error())
            }
            Err(Failure::TimeLimit) => Err(Error::NoReply {
                operation: Operation::Extend,
                name: self.name.clone(),
                waited: clock::now().saturating_duration_since(now),
            }),
            Err(Failure::ShardKeyRequired) => Err(Error::UnexpectedReply(format!(
                "the extension of {shown:?} was refused for want of the shard key"
            ))),
            Err(Failure::Other(error)) => Err(Error::UnexpectedReply(format!(
                "the extension of {shown:?} failed: {error}"
            ))),
        }
    }

    /// Waits until a revocation request targets this lease (see [`crate::revocation`]): the
    /// guards' `revocation_requested`. Reads the lock's document at once, then every
    /// `extension_cadence`, and at each change the lock's change stream (`push`) shows.
    pub(crate) async fn revocation_requested(
        &self,
        push: Option<&super::PushFrom>,
    ) -> Result<crate::Revocation> {
        let shown = shown_name(&self.name);
        let semaphore = match &self.place.layout {
            schema::Layout::LockDocument => false,
            schema::Layout::Members(field) if field == schema::HOLDERS => true,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "revocation_requested on {shown:?}: only an exclusive lock's holder (a \
                     leader's, a job's) and a semaphore's place can be asked to let go"
                )));
            }
        };
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let observation = push.map(|(collection, family, name)| {
            super::Observation::new(&runtime, collection, *family, name)
        });
        let lost = self.lost();
        loop {
            let lock_id = self.lock_id.as_deref().ok_or_else(|| self.lost_error())?;
            let collection = &self.place.collection;
            let read = async {
                let holders: Vec<crate::LockStatus> = match semaphore {
                    false => (super::admin::status(collection, &self.name).await?)
                        .into_iter()
                        .collect(),
                    true => {
                        let ours = mongodb::bson::doc! { schema::ID: &self.id };
                        super::admin::semaphore_holders(collection, ours).await?
                    }
                };
                Ok(holders
                    .into_iter()
                    .find(|holder| holder.lock_id.as_deref() == Some(lock_id)))
            };
            let read = super::admin::within(
                super::admin::patience(&self.place.options),
                &self.name,
                read,
            );
            let status = tokio::select! {
                biased;
                () = lost.wait() => return Err(self.lost_error()),
                status = read => status,
            };
            match status {
                Ok(Some(status)) => {
                    if let Some(revocation) = status.revocation {
                        return Ok(revocation);
                    }
                }
                // Gone from the server: the lost signal follows.
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(lock = %shown, %error, "could not read whether a revocation was requested; trying again");
                }
            }
            let pushed = async {
                match &observation {
                    Some(observation) => observation.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = lost.wait() => return Err(self.lost_error()),
                () = tokio::time::sleep(self.place.options.extension_cadence()) => {}
                () = pushed => {}
            }
        }
    }

    /// Whether the lease may be extended `by` now (see [`HeldLease::extend`]): its lock id if
    /// so, else the error that says why not.
    pub(crate) fn check_extension(&self, by: Duration) -> Result<&str> {
        let shown = shown_name(&self.name);
        check_extension_length(&self.name, by)?;
        let lock_id = self.lock_id.as_deref().ok_or_else(|| self.lost_error())?;
        self.state.may_extend(by).map_err(|refusal| match refusal {
            Refusal::Ended => self.lost_error(),
            Refusal::PastMaxHold { hold_until } => Error::InvalidArgument(format!(
                "extend of {shown:?} by {by:?} would run past max_hold ({:?}): the hold ends \
                 in {:?}",
                self.place.options.max_hold().unwrap_or_default(),
                hold_until.saturating_duration_since(clock::now()),
            )),
        })?;
        Ok(lock_id)
    }

    /// Gives the lock id up (once): the lease is released, ended or dropped now.
    fn hand_back(&mut self) -> Option<String> {
        let lock_id = self.lock_id.take();
        if lock_id.is_some() {
            metrics::hold_ended(self.kind, self.held_since.elapsed());
        }
        lock_id
    }

    fn lost_error(&self) -> Error {
        Error::LockLost {
            name: self.name.clone(),
        }
    }

    /// Runs `work` in a multi-document transaction on `client` that first renews the lease in
    /// the same transaction, filtered on our lock id and a live lease: the guards' `transaction`.
    ///
    /// While the transaction is open its write holds the lease's document (on MongoDB, other
    /// writes to it wait until the transaction ends), so the renewal loop leaves this lease to
    /// the transaction: the transaction's renewal counts once it is committed. Until then the
    /// lease keeps the deadline it had, which is the transaction's budget: `work` still running
    /// then is dropped, the transaction aborted, and the result is `LockLost`.
    pub(crate) async fn transaction<T>(
        &self,
        client: &Client,
        mut work: impl AsyncFnMut(&mut ClientSession) -> mongodb::error::Result<T>,
    ) -> Result<T> {
        let lock_id = self.lock_id.clone().ok_or_else(|| self.lost_error())?;
        let Place {
            collection,
            layout,
            options,
            ..
        } = &self.place;
        let namespace = collection.namespace();
        let lock_ids = [lock_id];
        let ids = [self.id.clone()];
        let ours = layout.renew_many_filter(&ids, &lock_ids);
        let renew = layout.renew_update(options, &lock_ids);
        let locks = client
            .database(&namespace.db)
            .collection::<Document>(&namespace.coll);
        // One session for every try: starting a transaction with a higher transaction number on
        // it makes the server abort the previous try's, if that is still open (its commit
        // failed, or never arrived), so it cannot hold its writes against the next try.
        let mut session = client.start_session().await?;
        let started = Instant::now();
        let retrying = |error: &mongodb::error::Error, label: &str| {
            error.contains_label(label) && started.elapsed() < TRANSACTION_RETRY_LIMIT
        };
        let lost = self.lost();
        'transaction: loop {
            if self.is_lost() {
                return Err(self.lost_error());
            }
            // The renewal loop keeps off the lease's document while the transaction holds it.
            let _in_transaction = self.state.in_transaction_until_dropped();
            session
                .start_transaction()
                .read_concern(ReadConcern::snapshot())
                .write_concern(options.write_concern().clone())
                .selection_criteria(schema::primary())
                .await?;
            let renewal = Transaction::renewal_sent(clock::now());
            // Ours and live, and written in this transaction: a takeover, which must write the
            // same document, now waits for (or conflicts with) the transaction until it ends.
            // The renewal runs as a task of its own, which owns the session until the renewal's
            // outcome is in. Should the lease's deadline pass first (or the caller stop
            // waiting), the task runs on, and the session it drops then aborts the transaction
            // (the driver's drop of a session whose transaction is open). Dropping the renewal
            // before its reply instead leaves the driver believing the transaction never
            // started, so it sends no abort at all, and any abort sent at once could overtake
            // the renewal on its way: the renewal would then open a transaction nobody ends,
            // holding the lock's document (every writer of it waits) until the server's
            // transaction lifetime limit, 60 s by default. Found by the model checker
            // (`a_lease_checked_transaction`).
            let mut update = tokio::spawn(renew_in_transaction(
                locks.clone(),
                ours.clone(),
                renew.clone(),
                session,
                TRANSACTION_RETRY_LIMIT,
            ));
            let checked = tokio::select! {
                biased;
                () = lost.wait() => return Err(self.lost_error()),
                joined = &mut update => joined,
            };
            let output = match checked {
                Ok((returned, Some(Ok(checked)))) if checked.matched_count == 1 => {
                    session = returned;
                    lost.unless_lost(work(&mut session)).await
                }
                Ok((mut returned, Some(Ok(_)))) => {
                    abort(&mut returned).await;
                    return Err(self.lost_error());
                }
                Ok((returned, Some(Err(error)))) => {
                    session = returned;
                    Some(Err(error))
                }
                // No reply for two minutes: the lease's deadline passed long before (the select
                // above returns then).
                Ok((_, None)) => return Err(self.lost_error()),
                Err(ended) if ended.is_panic() => std::panic::resume_unwind(ended.into_panic()),
                // The runtime is shutting down.
                Err(_) => {
                    return Err(Error::BackgroundTaskEnded {
                        operation: Operation::Commit,
                    });
                }
            };
            let output = match output {
                Some(Ok(output)) => output,
                Some(Err(error)) => {
                    abort(&mut session).await;
                    if retrying(&error, TRANSIENT_TRANSACTION_ERROR) {
                        continue 'transaction;
                    }
                    return Err(error.into());
                }
                // The lease's budget ran out (or it was found gone) before the work was done:
                // nothing is committed.
                None => {
                    abort(&mut session).await;
                    return Err(self.lost_error());
                }
            };
            // `lost` may have fired as the work finished: then nothing is committed.
            if self.is_lost() {
                abort(&mut session).await;
                return Err(self.lost_error());
            }
            return match self.commit(&mut session, started).await {
                Commit::Committed => {
                    // The transaction's renewal is in: the lease lasts from its send.
                    self.state.transaction_committed(options, renewal);
                    Ok(output)
                }
                Commit::RunAgain => continue 'transaction,
                Commit::Failed(error) => Err(error),
            };
        }
    }

    /// Commits the open transaction of `session`, retrying an unknown outcome as the driver
    /// recommends while the lease is held (or for the driver's 120 s), each try waiting at most
    /// `expiry` for a reply.
    async fn commit(&self, session: &mut ClientSession, started: Instant) -> Commit {
        let patience = self.place.options.expiry();
        // The first try whose outcome was unknown: later definite failures cannot tell whether
        // it committed.
        let mut uncertain: Option<String> = None;
        loop {
            let failure = match tokio::time::timeout(patience, session.commit_transaction()).await {
                Ok(Ok(())) => return Commit::Committed,
                Ok(Err(error)) => error,
                Err(_elapsed) => {
                    uncertain.get_or_insert(format!("no reply within {patience:?}"));
                    if self.is_lost() || started.elapsed() >= TRANSACTION_RETRY_LIMIT {
                        return Commit::Failed(self.outcome_unknown(uncertain));
                    }
                    continue;
                }
            };
            if failure.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT) {
                uncertain.get_or_insert(failure.to_string());
                if self.is_lost() || started.elapsed() >= TRANSACTION_RETRY_LIMIT {
                    return Commit::Failed(self.outcome_unknown(uncertain));
                }
                continue;
            }
            if uncertain.is_some() {
                return Commit::Failed(self.outcome_unknown(uncertain));
            }
            // Definitely not committed.
            if failure.contains_label(TRANSIENT_TRANSACTION_ERROR)
                && started.elapsed() < TRANSACTION_RETRY_LIMIT
            {
                return Commit::RunAgain;
            }
            return Commit::Failed(failure.into());
        }
    }

    fn outcome_unknown(&self, reason: Option<String>) -> Error {
        Error::CommitOutcomeUnknown {
            name: self.name.clone(),
            reason: reason.unwrap_or_default(),
        }
    }

    /// Stops renewing and ends the lease (see [`request_release`]). A lease its loop no longer
    /// has because it was lost (its family shut down) reports that.
    pub(crate) async fn release(mut self) -> Result<()> {
        // Its tasks end first, while the lease still holds.
        self.bound.settle().await;
        let lock_id = self.hand_back();
        match request_release(&self.renewal_loop, lock_id).await {
            Err(Error::BackgroundTaskEnded { .. }) if self.state.is_lost() => {
                Err(self.lost_error())
            }
            result => result,
        }
    }

    /// Releases the lease of a guard never delivered to its caller (won after the caller
    /// stopped waiting): quietly, since the cleanup sent when the caller left may have ended it
    /// already, which is no loss.
    pub(crate) fn undelivered(self) {
        self.state.set_undelivered();
    }

    /// The lease was ended by a write of the holder's own (a document lock's commit): the
    /// renewal loop only has to forget it.
    pub(crate) fn ended_by_write(mut self) {
        if let Some(lock_id) = self.hand_back() {
            self.state.mark_released();
            let _ = self.renewal_loop.send(Command::Forget { lock_id });
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        let lock_id = self.hand_back();
        request_release_in_background(&self.renewal_loop, lock_id);
    }
}

/// [`Error::InvalidArgument`] unless `by` is an extension a guard of lock `name` may ask for:
/// between 1 ms and 365 days (as every duration option).
pub(crate) fn check_extension_length(name: &str, by: Duration) -> Result<()> {
    if by < Duration::from_millis(1) || by > MAX_EXTENSION {
        return Err(Error::InvalidArgument(format!(
            "extend of {:?}: `by` must be between 1 ms and 365 days, got {by:?}",
            shown_name(name)
        )));
    }
    Ok(())
}

/// Asks the renewal loop to release `lock_id` and waits for the outcome (a guard's `release`).
/// `None`: the guard already handed its lease back.
async fn request_release(
    renewal_loop: &mpsc::UnboundedSender<Command>,
    lock_id: Option<String>,
) -> Result<()> {
    let ended = Error::BackgroundTaskEnded {
        operation: Operation::Release,
    };
    let Some(lock_id) = lock_id else {
        return Err(ended);
    };
    let (reply, answer) = oneshot::channel();
    let request = Command::Release {
        lock_id,
        reply: Some(reply),
    };
    if renewal_loop.send(request).is_err() {
        return Err(ended);
    }
    answer.await.unwrap_or(Err(ended))
}

/// Asks the renewal loop to release `lock_id` in the background (a guard's drop): a plain
/// channel send, so it never blocks and works off the runtime. If the loop is gone (its runtime
/// shut down), the lease expires by itself.
fn request_release_in_background(
    renewal_loop: &mpsc::UnboundedSender<Command>,
    lock_id: Option<String>,
) {
    if let Some(lock_id) = lock_id {
        let _ = renewal_loop.send(Command::Release {
            lock_id,
            reply: None,
        });
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

/// The renewal of a lease-checked transaction on `session` (filtered by `ours`, updated by
/// `renew`), waiting at most `patience` for its reply: the session back, and the outcome (`None`
/// without a reply in time). The bound only ends a wait on a dead connection: a renewal that
/// reached the server after it cannot be aborted (the driver sends no abort for a transaction
/// whose first command has no reply), and the server's lifetime limit ends what it opened.
async fn renew_in_transaction(
    locks: Collection<Document>,
    ours: Document,
    renew: Vec<Document>,
    mut session: ClientSession,
    patience: Duration,
) -> (ClientSession, Option<mongodb::error::Result<UpdateResult>>) {
    let renewal = locks
        .update_one(ours, renew)
        .session(&mut session)
        .into_future();
    let outcome = tokio::time::timeout(patience, renewal).await.ok();
    (session, outcome)
}

/// How a commit ended.
enum Commit {
    Committed,
    /// Definitely not committed, with a transient error: run the whole transaction again.
    RunAgain,
    Failed(Error),
}

/// Aborts the open transaction of `session`, waiting at most a few seconds (the server aborts it
/// by itself at its lifetime limit; dropping the session aborts it too).
async fn abort(session: &mut ClientSession) {
    let _ = tokio::time::timeout(Duration::from_secs(5), session.abort_transaction()).await;
}
