//! The one acquisition loop under every primitive: validation, the runtime, a tracing span,
//! attempts that run to completion in spawned tasks (cancel safety), backoff sleeps, in-process
//! handoff, deadlines, transient-failure retries, and cleanup after attempts whose outcome is
//! unknown. A primitive supplies only its attempt.

use std::future::{Future, pending};

use futures::future::BoxFuture;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::Document;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};
use tracing::Instrument;

use super::backoff;
use super::handoff::{self, Offer, TakeoverUpdate, Ticket, Transfer, Wake};
use super::hub::RenewalHub;
use super::in_flight::InFlight;
use super::metrics;
use super::protocol::{self, Reply, Sent, Tell};
use super::push;
use super::schema::{Layout, new_lock_id};
use super::undo::Undo;
use crate::LockKind;
use crate::clock;
use crate::error::{Operation, holders_text, is_duplicate_key, shown_name};
use crate::{Error, FencingToken, LockOptions, LockStatus, Result};

/// How long a caller waits for a lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wait {
    started: Instant,
    /// `None`: forever.
    deadline: Option<Instant>,
}

impl Wait {
    /// Until acquired.
    pub(crate) fn forever() -> Wait {
        Wait {
            started: Instant::now(),
            deadline: None,
        }
    }

    /// At most `timeout` (zero: exactly one attempt; too large to represent: forever).
    pub(crate) fn at_most(timeout: Duration) -> Wait {
        let started = Instant::now();
        Wait {
            started,
            deadline: backoff::deadline_after(started, timeout),
        }
    }

    /// Whether the deadline has passed.
    pub(crate) fn is_over(&self) -> bool {
        self.deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// The guard, or [`Error::Timeout`] when the lock stayed busy until the deadline, naming
    /// what held it then (read from `lock` only on that path, for at most a small share of the
    /// caller's timeout: it explains the wait and must not prolong it much). The error's
    /// `waited` is the whole wait, that read included.
    pub(crate) async fn required<G>(
        &self,
        outcome: Result<Option<G>>,
        name: &str,
        lock: &dyn ReadHolders,
    ) -> Result<G> {
        match outcome? {
            Some(guard) => Ok(guard),
            None if self.deadline.is_none() => Err(Error::BackgroundTaskEnded {
                // Unreachable without a deadline, but never worth a panic.
                operation: Operation::Acquire,
            }),
            None => {
                let timeout = self
                    .deadline
                    .map_or(Duration::ZERO, |deadline| deadline - self.started);
                let holders = holders_now(lock, holders_read_limit(timeout)).await;
                let waited = self.started.elapsed();
                tracing::debug!(
                    lock = %shown_name(name),
                    ?waited,
                    holders = %holders_text(&holders),
                    "gave up waiting for a lock"
                );
                Err(Error::Timeout {
                    name: name.to_owned(),
                    waited,
                    holders,
                })
            }
        }
    }
}

/// A lock that can tell who holds it now (every kind's `holders`), for the error of a wait that
/// ran out and the event of a slow wait.
pub(crate) trait ReadHolders: std::fmt::Debug + Sync {
    fn read_holders(&self) -> BoxFuture<'_, Result<Vec<LockStatus>>>;
}

/// Who holds `lock` now, if a read says so within `limit` (nobody otherwise: this only explains
/// a wait, and must not prolong it).
async fn holders_now(lock: &dyn ReadHolders, limit: Duration) -> Vec<LockStatus> {
    tokio::time::timeout(limit, lock.read_holders())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default()
}

/// How long a wait of `timeout` that ran out may spend reading what held the lock, for its
/// error: a quarter of it, at least 250 ms (a few round trips to a remote cluster) and at most
/// the attempts' server time.
pub(crate) fn holders_read_limit(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(250), backoff::ATTEMPT_SERVER_TIME)
}

/// A wait longer than this (or than the lock's expiry, if longer) is reported once, with what
/// holds the lock, as an `info` event.
const SLOW_WAIT: Duration = Duration::from_secs(10);

/// What a caller is acquiring: for validation, the tracing span and in-process handoff.
#[derive(Debug)]
pub(crate) struct Acquisition<'a> {
    /// `exclusive`, `read`, `write`, `semaphore` or `document`.
    pub(crate) kind: LockKind,
    pub(crate) name: &'a str,
    pub(crate) collection: &'a str,
    pub(crate) options: &'a LockOptions,
    /// Whether the lock's name and collection are usable (checked when they were set).
    pub(crate) checked: Result<()>,
    /// The lock's queue of in-process waiters, if it has one.
    pub(crate) waiters: Option<&'a handoff::Key>,
    /// Whether holders share the lock (readers): a release wakes all such waiters in a row.
    pub(crate) shared: bool,
    /// Whether each attempt renews something the waiter keeps while it waits (a writer's
    /// waiting-writer marker): then the waiter attempts at least at the slowest busy-wait pace
    /// even when it is not the first local waiter.
    pub(crate) renews_while_waiting: bool,
    /// Who holds the lock, for the event of a slow wait.
    pub(crate) holders: &'a dyn ReadHolders,
    /// The lock's family: when it is shut down acquisitions end with [`Error::ShutDown`], and
    /// its shutdown waits for (or undoes) the attempts under way.
    pub(crate) family: &'a RenewalHub,
    /// The lock's collection, if a release of the lock can be pushed to its poller by a change
    /// stream (see `push`).
    pub(crate) push: Option<&'a Collection<Document>>,
    /// A semaphore's places: a pushed change frees one only if it leaves fewer holders.
    pub(crate) places: Option<u32>,
}

/// The stamp of a request that won a lease: when it was sent.
pub(crate) type Request = Sent<clock::Instant>;

/// How a waiter takes a lease over in a local holder's release command (see `handoff`), built by
/// the primitive for a fresh lock id.
pub(crate) struct Takeover<G> {
    /// Where the waiter's lease would be stored.
    pub(crate) layout: Layout,
    /// The attempt's pipeline, taking over from the lease with the given lock id.
    pub(crate) update: TakeoverUpdate,
    /// The guard, from the document the command returned and the instant it was first sent;
    /// `None` if the command did not admit the waiter.
    pub(crate) finish: Box<dyn FnOnce(Document, Request) -> Result<Option<G>> + Send>,
    /// Ends the waiter's lease, should the transfer's outcome be unknown.
    pub(crate) cleanup: Undo,
}

/// Builds a [`Takeover`] from the runtime and a fresh lock id.
pub(crate) type Takeovers<'a, G> = &'a (dyn Fn(&Handle, String) -> Takeover<G> + Sync);

/// One acquisition attempt, built by a primitive: the work to run to completion in its own
/// task, and what undoes it should its outcome be unknown.
#[derive(Debug)]
pub(crate) struct Attempt<W> {
    pub(crate) work: W,
    pub(crate) cleanup: Undo,
}

/// What an acquisition yields, as the tracing span shows it.
pub(crate) trait Granted {
    /// The fencing token, for kinds that have one.
    fn fencing_token(&self) -> Option<FencingToken>;

    /// Whether the next local waiter may succeed too (a semaphore with places left, a reader).
    fn leaves_room(&self) -> bool;

    /// Won after its caller stopped waiting: released at once, and quietly, since its lease may
    /// already have been ended by the cleanup sent when the caller left (that is no loss).
    fn undelivered(self);
}

/// Runs attempts until one yields a guard, or the wait runs out (`Ok(None)`).
///
/// `attempt` builds each attempt from the runtime and a fresh lock id. Between attempts the
/// caller sleeps per the options; with `waiters`, it queues for in-process handoff after its
/// first failure, and with `takeovers` it offers to take the lease over from a local holder's
/// release. See [`retry`] and [`spawned`].
pub(crate) async fn acquire<G, F, W>(
    what: Acquisition<'_>,
    wait: Wait,
    mut attempt: F,
    takeovers: Option<Takeovers<'_, G>>,
) -> Result<Option<G>>
where
    G: Granted + Send + 'static,
    F: FnMut(&Handle, String) -> Attempt<W>,
    W: Future<Output = Result<Option<G>>> + Send + 'static,
{
    let span = tracing::debug_span!(
        "acquire",
        kind = what.kind.label(),
        lock = %shown_name(what.name),
        collection = %what.collection,
        outcome = tracing::field::Empty,
        fencing_token = tracing::field::Empty,
    );
    let options = what.options;
    let deadline = wait.deadline;
    let kind = what.kind;
    let _waiting = metrics::Waiting::start(kind);
    let mut shut_down = what.family.shut_down_signal();
    let in_flight = what.family.in_flight();
    let result = async {
        what.checked?;
        if *shut_down.borrow_and_update() {
            return Err(Error::ShutDown);
        }
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let queue = what.waiters.map(|key| Queue {
            key,
            shared: what.shared,
            renews_while_waiting: what.renews_while_waiting,
            takeovers: takeovers.map(|takeovers| (takeovers, &runtime, in_flight)),
            push: what
                .push
                .map(|collection| (collection, what.name, &runtime, what.places)),
        });
        let attempts = retry(options, deadline, queue, || {
            metrics::attempt(kind);
            let attempt = attempt(&runtime, new_lock_id());
            spawned(&runtime, deadline, options, attempt, in_flight)
        });
        // A wait that goes on long says once what it waits for, and goes on.
        let slow_wait = async {
            let slow_after = SLOW_WAIT.max(options.expiry());
            tokio::time::sleep_until(wait.started + slow_after).await;
            let holders = holders_now(what.holders, backoff::ATTEMPT_SERVER_TIME).await;
            tracing::info!(
                waited = ?wait.started.elapsed(),
                holders = %holders_text(&holders),
                "still waiting for a lock"
            );
            pending::<Result<Option<G>>>().await
        };
        // Dropping `attempts` is a cancellation, which is safe (see `spawned`).
        tokio::select! {
            biased;
            Ok(_) = shut_down.wait_for(|shut_down| *shut_down) => Err(Error::ShutDown),
            result = attempts => result,
            result = slow_wait => result,
        }
    }
    .instrument(span.clone())
    .await;
    let outcome = match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "not_acquired",
        Err(_) => "error",
    };
    metrics::acquisition(kind, outcome, wait.started.elapsed());
    match &result {
        Ok(Some(guard)) => {
            span.record("outcome", "acquired");
            if let Some(token) = guard.fencing_token() {
                span.record("fencing_token", token.get());
            }
        }
        Ok(None) => {
            span.record("outcome", "not acquired");
        }
        Err(error) => {
            span.record("outcome", tracing::field::display(error));
        }
    }
    result
}

/// Where a waiter queues for in-process handoff.
struct Queue<'a, G> {
    key: &'a handoff::Key,
    shared: bool,
    renews_while_waiting: bool,
    takeovers: Option<(Takeovers<'a, G>, &'a Handle, &'a Arc<InFlight>)>,
    /// The lock's collection and name, the runtime of the stream that pushes its releases, and
    /// a semaphore's places.
    push: Option<(&'a Collection<Document>, &'a str, &'a Handle, Option<u32>)>,
}

/// What ended a wait between attempts.
enum Event<G> {
    /// The sleep ended, or a local release woke the waiter: attempt.
    Attempt,
    /// Told to poll (again) at the busy-wait pace: wait again, without an attempt.
    Poll,
    /// The outcome of this waiter's offer to take a lease over.
    Transferred(std::result::Result<Result<Option<G>>, oneshot::error::RecvError>),
}

/// Repeats `attempt` until it yields a guard, or `deadline` (`None`: never) has passed.
///
/// Between attempts it sleeps per `options`. With a `queue`, the caller joins the lock's queue of
/// local waiters after its first failure (see `handoff`): a local release wakes it at once, and
/// only the first local waiter polls the server; the others wait for local events and the
/// deadline only.
async fn retry<G, F, Fut>(
    options: &LockOptions,
    deadline: Option<Instant>,
    queue: Option<Queue<'_, G>>,
    mut attempt: F,
) -> Result<Option<G>>
where
    G: Granted + Send + 'static,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<G>>>,
{
    let mut failed_attempts = 0_u32;
    let mut ticket: Option<Ticket> = None;
    // The outcome of this waiter's standing offer to take a lease over, if it made one.
    let mut offered: Option<oneshot::Receiver<Result<Option<G>>>> = None;
    // Since when every attempt has failed with a transient error.
    let mut failing_since: Option<Instant> = None;
    // While this waiter polls for its group: releases pushed to it by a change stream.
    let mut subscription: Option<push::Subscription> = None;
    // While an exclusive lease of the lock is held in this process, a caller that may wait
    // queues at once: an attempt could only fail, and the lease's end is a local event. So it
    // does behind callers of this process already in line: an attempt would jump the line (and
    // cost a command racing the waiter a release woke). A waiting writer attempts first all the
    // same: its attempt places the marker that keeps new readers out.
    let mut attempt_now = !(deadline.is_none_or(|deadline| Instant::now() < deadline)
        && queue.as_ref().is_some_and(|queue| {
            handoff::held_here(queue.key)
                || !queue.renews_while_waiting && handoff::waiting_here(queue.key)
        }));
    let skipped_first_attempt = !attempt_now;
    loop {
        if attempt_now {
            let attempt_started = Instant::now();
            let outcome = attempt().await;
            let now = Instant::now();
            let out_of_time = deadline.is_some_and(|deadline| now >= deadline);
            match outcome {
                Ok(Some(guard)) => {
                    if let Some(ticket) = ticket {
                        ticket.leave_with_lock(guard.leaves_room());
                    }
                    return Ok(Some(guard));
                }
                Ok(None) => failing_since = None,
                // An election or a busy primary: wait and try again like for a busy lock,
                // within the caller's deadline and for at most `expiry` in a row.
                Err(error)
                    if error.is_transient()
                        && !out_of_time
                        && now - *failing_since.get_or_insert(attempt_started)
                            < options.expiry() =>
                {
                    tracing::debug!(%error, "transient failure of an acquisition attempt; retrying");
                }
                // The caller gets the error, unless a release is handing it the lock right now.
                Err(error) => {
                    return match last_transfer(ticket.as_ref(), offered, options).await {
                        Some(guard) => Ok(Some(guard)),
                        None => Err(error),
                    };
                }
            }
            if out_of_time {
                return Ok(last_transfer(ticket.as_ref(), offered, options).await);
            }
        }
        attempt_now = true;
        if ticket.is_none() {
            ticket = queue
                .as_ref()
                .map(|queue| Ticket::join(queue.key, queue.shared));
            // The lease held here (or the line) when this caller came may have ended before it
            // joined, with nobody ahead: then no local event is coming for it.
            if skipped_first_attempt
                && ticket
                    .as_ref()
                    .is_some_and(|ticket| ticket.is_first() && !ticket.held_here())
            {
                continue;
            }
        }
        loop {
            if let (Some(ticket), Some((takeovers, runtime, in_flight)), None) = (
                &ticket,
                queue.as_ref().and_then(|queue| queue.takeovers),
                &offered,
            ) {
                offered = Some(offer(ticket, takeovers, runtime, in_flight, options));
            }
            let renews = queue
                .as_ref()
                .is_some_and(|queue| queue.renews_while_waiting);
            // The poller subscribes to pushed releases (not while the lock is held here: its
            // release will be a local event); a waiter that stops polling leaves.
            let polls = ticket.as_ref().is_some_and(Ticket::is_first);
            match (&subscription, queue.as_ref().and_then(|queue| queue.push)) {
                (None, Some((collection, name, runtime, places)))
                    if polls && !ticket.as_ref().is_some_and(Ticket::held_here) =>
                {
                    let key = queue.as_ref().map(|queue| queue.key);
                    subscription = key
                        .map(|key| push::Subscription::new(runtime, collection, key, name, places));
                }
                (Some(_), _) if !polls => subscription = None,
                _ => {}
            }
            let pushed = subscription
                .as_ref()
                .is_some_and(push::Subscription::is_healthy);
            let event = wait(
                options,
                failed_attempts,
                deadline,
                ticket.as_ref(),
                renews,
                pushed,
                &mut offered,
            );
            match event.await {
                Event::Attempt => break,
                Event::Poll => {}
                Event::Transferred(Ok(Ok(Some(guard)))) => {
                    if let Some(ticket) = ticket {
                        ticket.leave_with_lock(guard.leaves_room());
                    }
                    return Ok(Some(guard));
                }
                Event::Transferred(Ok(Err(error))) => return Err(error),
                // No transfer: the lease it was offered for may be gone, so the lock free.
                Event::Transferred(Ok(Ok(None)) | Err(_)) => {
                    offered = None;
                    break;
                }
            }
        }
        failed_attempts = failed_attempts.saturating_add(1);
    }
}

/// Waits for what comes first: the end of this waiter's sleep (the first local waiter's, or the
/// only waiter's, per the busy-wait pace; a waiter whose attempts renew something it keeps while
/// waiting, at the slowest pace; the others' at the deadline), a local wake, or the outcome of its
/// offer.
async fn wait<G>(
    options: &LockOptions,
    failed_attempts: u32,
    deadline: Option<Instant>,
    ticket: Option<&Ticket>,
    renews_while_waiting: bool,
    pushed: bool,
    offered: &mut Option<oneshot::Receiver<Result<Option<G>>>>,
) -> Event<G> {
    let now = Instant::now();
    let pace = match ticket {
        None => Some(backoff::sleep_time(
            options,
            failed_attempts,
            rand::random(),
        )),
        // While a lease of the lock is held here, its end comes as a local event, and while
        // a change stream pushes releases to this poller, so do other processes' releases:
        // polling slowly is only a safety net.
        Some(ticket) if ticket.is_first() && (pushed || ticket.held_here()) => {
            Some(options.busy_wait_sleep_time().1)
        }
        Some(ticket) if ticket.is_first() => Some(backoff::sleep_time(
            options,
            failed_attempts,
            rand::random(),
        )),
        // Not the poller, but its attempts keep its marker alive.
        Some(_) if renews_while_waiting => Some(options.busy_wait_sleep_time().1),
        Some(_) => None,
    };
    let until = match pace {
        Some(pace) => Some(now + backoff::sleep_until_deadline(pace, now, deadline)),
        None => deadline,
    };
    let sleep = async {
        match until {
            Some(until) => sleep_until(until).await,
            None => pending().await,
        }
    };
    let woken = async {
        match ticket {
            Some(ticket) => ticket.woken().await,
            None => pending().await,
        }
    };
    let transferred = async {
        match offered {
            Some(outcome) => outcome.await,
            None => pending().await,
        }
    };
    // A transfer's outcome first: its guard must not wait behind an attempt that cannot win.
    tokio::select! {
        biased;
        outcome = transferred => Event::Transferred(outcome),
        () = sleep => Event::Attempt,
        wake = woken => match wake {
            Wake::Attempt => Event::Attempt,
            Wake::Poll => Event::Poll,
        },
    }
}

/// Leaves an offer to take a lease over in `ticket`'s queue; returns where its outcome arrives.
fn offer<G>(
    ticket: &Ticket,
    takeovers: Takeovers<'_, G>,
    runtime: &Handle,
    in_flight: &Arc<InFlight>,
    options: &LockOptions,
) -> oneshot::Receiver<Result<Option<G>>>
where
    G: Granted + Send + 'static,
{
    let lock_id = new_lock_id();
    let Takeover {
        layout,
        update,
        finish,
        cleanup,
    } = takeovers(runtime, lock_id.clone());
    let (outcome, received) = oneshot::channel();
    let (runtime, in_flight) = (runtime.clone(), Arc::clone(in_flight));
    ticket.offer(Offer {
        lock_id,
        layout,
        update,
        cleanup: cleanup.clone(),
        receiver: Arc::clone(&in_flight),
        write_concern: options.write_concern().clone(),
        deliver: Box::new(move |transfer| {
            let result = match transfer {
                Transfer::Done { document, request } => finish(document, request),
                Transfer::NotDone => Ok(None),
                // The releasing task ended (its runtime shut down) before it knew whether the
                // lease is the waiter's now: end both leases from the waiter's runtime.
                Transfer::Abandoned { releasing } => {
                    in_flight.spawn_undo(&runtime, releasing);
                    in_flight.spawn_undo(&runtime, cleanup);
                    Ok(None)
                }
            };
            // A waiter that has gone: the lease nobody was given ends at once.
            if let Err(Ok(Some(guard))) = outcome.send(result) {
                guard.undelivered();
            }
        }),
    });
    received
}

/// The outcome of a waiter's standing offer when it stops waiting (its deadline passed, or its
/// attempt failed for good): a guard if the lock was handed over to it (a transfer taken before
/// is waited for, at most as long as an attempt is), `None` otherwise (the offer is withdrawn).
async fn last_transfer<G>(
    ticket: Option<&Ticket>,
    offered: Option<oneshot::Receiver<Result<Option<G>>>>,
    options: &LockOptions,
) -> Option<G> {
    let mut offered = offered?;
    match offered.try_recv() {
        // Delivered already (an error delivered is no lock: the offer is spent either way).
        Ok(transferred) => return transferred.ok().flatten(),
        Err(oneshot::error::TryRecvError::Closed) => return None,
        Err(oneshot::error::TryRecvError::Empty) => {}
    }
    if ticket.is_none_or(Ticket::withdraw_offer) {
        return None; // still in the queue: nobody was handing the lock over
    }
    // A release is handing the lock over to this waiter right now.
    let now = Instant::now();
    let limit = protocol::attempt_reply_limit(options, now, Some(now));
    match tokio::time::timeout_at(limit, offered).await {
        Ok(Ok(Ok(guard))) => guard,
        // No answer in time: a late guard is dropped, which releases it.
        _ => None,
    }
}

/// Runs one attempt in its own task and waits for its outcome.
///
/// The task, not the caller, owns the attempt's time limit and its cleanup, so they happen
/// whatever becomes of the caller: an attempt gets at least five seconds (at most `expiry`) to
/// answer; no answer is [`Error::NoReply`] (never "busy"), and its cleanup is sent. A caller
/// that stops waiting (a timeout of its own, a losing `select!` branch, an aborted task, a
/// shutdown, a resigned leader) gets its attempt cleaned up at once.
/// When the attempt fails with an error after which its write may have been applied (a lost
/// reply, a cut connection, a write-concern error), the cleanup is sent too: it ends whatever
/// lease the attempt's own lock id may hold, so the name is free again at once instead of after
/// `expiry`.
///
/// The task always runs the attempt to completion: if it wins after the caller stopped waiting
/// (or after its time limit), the guard is dropped undelivered, and its drop releases the lock
/// at once. The attempt is work of the family under way until then (see `in_flight`).
async fn spawned<G, W>(
    runtime: &Handle,
    deadline: Option<Instant>,
    options: &LockOptions,
    attempt: Attempt<W>,
    in_flight: &Arc<InFlight>,
) -> Result<Option<G>>
where
    G: Granted + Send + 'static,
    W: Future<Output = Result<Option<G>>> + Send + 'static,
{
    let Attempt { work, cleanup } = attempt;
    let started = Instant::now();
    // What to make of each event is decided by `protocol::Attempt`; this task does it.
    let mut decide = protocol::Attempt::sent(options, started, deadline);
    let limit = decide.reply_limit();
    // The server gives up on an attempt after `ATTEMPT_SERVER_TIME`: a shutdown waits that long
    // for it before cleaning up after it, so that the attempt cannot be applied afterwards.
    let settle_by = clock::now() + backoff::ATTEMPT_SERVER_TIME;
    let tracked = in_flight.track(vec![cleanup.clone()], Some(settle_by));
    let (reply, outcome) = oneshot::channel();
    let (task_runtime, in_flight) = (runtime.clone(), Arc::clone(in_flight));
    let options_expiry = options.expiry();
    runtime.spawn(async move {
        let mut work = pin!(work);
        let mut reply = reply;
        let answered = tokio::select! {
            biased;
            result = &mut work => Some(result),
            () = sleep_until(limit) => None,
            () = reply.closed() => {
                // The caller is gone: nobody will use what the attempt wins. End whatever it
                // took now, and still wait for its reply (a late win is dropped and released).
                if decide.caller_left().undo {
                    in_flight.spawn_undo(&task_runtime, cleanup.clone());
                }
                tokio::select! {
                    biased;
                    result = &mut work => Some(result),
                    () = sleep_until(limit) => None,
                }
            }
        };
        match answered {
            Some(result) => {
                let outcome = match &result {
                    Ok(Some(_)) => Reply::Won,
                    Ok(None) => Reply::Busy,
                    // A duplicate key wrote nothing; other driver errors may come after the
                    // write was applied.
                    Err(Error::Mongo(error)) if !is_duplicate_key(error) => Reply::Unknown,
                    Err(_) => Reply::Refused,
                };
                // A shutdown that took this attempt's cleanup is ending what it won.
                let settled = protocol::settled(outcome, || tracked.settle());
                let step = decide.answered(outcome, settled);
                if step.undo {
                    in_flight.spawn_undo(&task_runtime, cleanup);
                }
                let result = match result {
                    Ok(Some(guard)) if step.release => {
                        guard.undelivered();
                        Ok(None)
                    }
                    other => other,
                };
                if step.tell != Tell::Nothing
                    && let Err(Ok(Some(guard))) = reply.send(result)
                {
                    guard.undelivered(); // the caller left just now
                }
            }
            None => {
                let step = decide.waited(Instant::now());
                if step.undo {
                    in_flight.spawn_undo(&task_runtime, cleanup.clone());
                }
                if step.tell == Tell::NoReply {
                    let _ = reply.send(Err(Error::NoReply {
                        operation: Operation::AttemptReply,
                        name: cleanup.name.clone(),
                        waited: started.elapsed(),
                    }));
                }
                // If it wins after all, its guard is released. A reply later than `expiry`
                // could not have held the lock anyway: stop waiting then.
                if let Ok(Ok(Some(guard))) = tokio::time::timeout(options_expiry, work).await
                    && decide.answered(Reply::Won, true).release
                {
                    guard.undelivered();
                }
            }
        }
        tracked.finish();
    });
    outcome.await.unwrap_or(Err(Error::BackgroundTaskEnded {
        operation: Operation::AttemptReply,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_of_the_holders_gets_a_quarter_of_the_timeout_within_bounds() {
        let limit = |millis| holders_read_limit(Duration::from_millis(millis));
        assert_eq!(limit(2_000), Duration::from_millis(500));
        // At least a few round trips to a remote cluster, at most an attempt's server time.
        assert_eq!(limit(200), Duration::from_millis(250));
        assert_eq!(limit(3_600_000), backoff::ATTEMPT_SERVER_TIME);
    }
}
