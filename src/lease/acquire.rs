//! The one acquisition loop under every primitive: validation, the runtime, a tracing span,
//! attempts that run to completion in spawned tasks (cancel safety), backoff sleeps, in-process
//! handoff, deadlines, transient-failure retries, and cleanup after attempts whose outcome is
//! unknown. A primitive supplies only its attempt.

use std::future::Future;
use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::Document;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};
use tracing::Instrument;

use super::schema::new_lock_id;
use super::{backoff, handoff};
use crate::error::{Operation, is_duplicate_key, shown_name};
use crate::{Error, FencingToken, LockOptions, Result};

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

    /// The guard, or [`Error::Timeout`] when the lock stayed busy until the deadline.
    pub(crate) fn required<G>(&self, outcome: Result<Option<G>>, name: &str) -> Result<G> {
        match outcome? {
            Some(guard) => Ok(guard),
            None if self.deadline.is_none() => Err(Error::BackgroundTaskEnded {
                // Unreachable without a deadline, but never worth a panic.
                operation: Operation::Acquire,
            }),
            None => Err(Error::Timeout {
                operation: Operation::Acquire,
                name: name.to_owned(),
                waited: self.started.elapsed(),
            }),
        }
    }
}

/// What a caller is acquiring: for validation, the tracing span and in-process handoff.
#[derive(Debug)]
pub(crate) struct Acquisition<'a> {
    /// `exclusive`, `read`, `write`, `semaphore` or `document`.
    pub(crate) kind: &'static str,
    pub(crate) name: &'a str,
    pub(crate) collection: &'a str,
    pub(crate) options: &'a LockOptions,
    /// Whether the lock's name and collection are usable (checked when they were set).
    pub(crate) checked: Result<()>,
    /// The lock's queue of in-process waiters, if it has one.
    pub(crate) waiters: Option<&'a handoff::Key>,
}

/// One acquisition attempt, built by a primitive: the work to run to completion in its own
/// task, and what undoes it should its outcome be unknown.
#[derive(Debug)]
pub(crate) struct Attempt<W> {
    pub(crate) work: W,
    pub(crate) cleanup: Cleanup,
}

/// What an acquisition yields, as the tracing span shows it.
pub(crate) trait Granted {
    /// The fencing token, for kinds that have one.
    fn fencing_token(&self) -> Option<FencingToken>;
}

/// Runs attempts until one yields a guard, or the wait runs out (`Ok(None)`).
///
/// `attempt` builds each attempt from the runtime and a fresh lock id. Between attempts the
/// caller sleeps per the options; with `waiters`, it queues for in-process handoff after its
/// first failure. See [`retry`] and [`spawned`].
pub(crate) async fn acquire<G, F, W>(
    what: Acquisition<'_>,
    wait: Wait,
    mut attempt: F,
) -> Result<Option<G>>
where
    G: Granted + Send + 'static,
    F: FnMut(&Handle, String) -> Attempt<W>,
    W: Future<Output = Result<Option<G>>> + Send + 'static,
{
    let span = tracing::debug_span!(
        "acquire",
        kind = what.kind,
        lock = %shown_name(what.name),
        collection = %what.collection,
        outcome = tracing::field::Empty,
        fencing_token = tracing::field::Empty,
    );
    let options = what.options;
    let deadline = wait.deadline;
    let result = async {
        what.checked?;
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        retry(options, deadline, what.waiters, || {
            let attempt = attempt(&runtime, new_lock_id());
            spawned(&runtime, deadline, options, attempt)
        })
        .await
    }
    .instrument(span.clone())
    .await;
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

/// Repeats `attempt` until it yields a guard, or `deadline` (`None`: never) has passed.
///
/// Between attempts it sleeps per `options`. With `waiters`, the caller queues for in-process
/// handoff after its first failure: a local release wakes it at once, and only the first local
/// waiter polls at the busy-wait pace (see `handoff`).
async fn retry<G, F, Fut>(
    options: &LockOptions,
    deadline: Option<Instant>,
    waiters: Option<&handoff::Key>,
    mut attempt: F,
) -> Result<Option<G>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<G>>>,
{
    let mut failed_attempts = 0_u32;
    let mut ticket: Option<handoff::Ticket> = None;
    // Since when every attempt has failed with a transient error.
    let mut failing_since: Option<Instant> = None;
    loop {
        let attempt_started = Instant::now();
        let outcome = attempt().await;
        let now = Instant::now();
        let out_of_time = deadline.is_some_and(|deadline| now >= deadline);
        match outcome {
            Ok(Some(guard)) => {
                if let Some(ticket) = ticket {
                    ticket.leave_with_lock();
                }
                return Ok(Some(guard));
            }
            Ok(None) => failing_since = None,
            // An election or a busy primary: wait and try again like for a busy lock, within
            // the caller's deadline and for at most `expiry` in a row.
            Err(error) if error.is_transient() => {
                let since = *failing_since.get_or_insert(attempt_started);
                if out_of_time || now - since >= options.expiry() {
                    return Err(error);
                }
                tracing::debug!(%error, "transient failure of an acquisition attempt; retrying");
            }
            Err(error) => return Err(error),
        }
        if out_of_time {
            return Ok(None);
        }
        if ticket.is_none() {
            ticket = waiters.map(handoff::Ticket::join);
        }
        // Only the first local waiter polls at the busy-wait pace; the others are woken by
        // local releases in turn and poll at the slowest pace as a safety net.
        let sleep = match &ticket {
            Some(ticket) if !ticket.is_first() => options.busy_wait_sleep_time().1,
            _ => backoff::sleep_time(options, failed_attempts, rand::random()),
        };
        let sleep = tokio::time::sleep(backoff::sleep_until_deadline(sleep, now, deadline));
        match &ticket {
            Some(ticket) => {
                tokio::select! {
                    () = sleep => {}
                    () = ticket.woken() => {}
                }
            }
            None => sleep.await,
        }
        failed_attempts = failed_attempts.saturating_add(1);
    }
}

/// Runs one attempt in its own task and waits for its outcome.
///
/// The task always runs to completion. If the caller stops waiting (it was cancelled, or the
/// reply came too late), a guard the attempt won is dropped with the undelivered outcome, and
/// the guard's drop releases the lock at once: nothing stays held until expiry.
///
/// An attempt gets at least five seconds (at most `expiry`) to answer; no answer is
/// [`Error::Timeout`], never "busy".
///
/// When the attempt fails with an error after which its write may have been applied (a lost
/// reply, a cut connection, a write-concern error) or gets no reply in time, `cleanup` is sent:
/// it ends whatever lease the attempt's own lock id may hold, so the name is free again at once
/// instead of after `expiry`.
async fn spawned<G, W>(
    runtime: &Handle,
    deadline: Option<Instant>,
    options: &LockOptions,
    attempt: Attempt<W>,
) -> Result<Option<G>>
where
    G: Send + 'static,
    W: Future<Output = Result<Option<G>>> + Send + 'static,
{
    let Attempt { work, cleanup } = attempt;
    let started = Instant::now();
    let (reply, outcome) = oneshot::channel();
    {
        let cleanup = cleanup.clone();
        let runtime = runtime.clone();
        runtime.clone().spawn(async move {
            let result = work.await;
            if let Err(Error::Mongo(error)) = &result
                && !is_duplicate_key(error)
            {
                cleanup.spawn(&runtime);
            }
            let _ = reply.send(result);
        });
    }
    let limit = backoff::attempt_wait_limit(started, deadline, options.expiry());
    match timeout_at(limit, outcome).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(Error::BackgroundTaskEnded {
            operation: Operation::AttemptReply,
        }),
        Err(_elapsed) => {
            // The attempt goes on in its task: if it wins after all, its guard is dropped
            // unclaimed and released. If its reply is lost for good, this ends the lease.
            cleanup.spawn(runtime);
            Err(Error::Timeout {
                operation: Operation::AttemptReply,
                name: cleanup.name,
                waited: started.elapsed(),
            })
        }
    }
}

/// Undoes an acquisition attempt whose outcome is unknown: one update, filtered by the attempt's
/// own lock id (so it can never touch anyone else's lease), that ends what it may have taken.
#[derive(Clone, Debug)]
pub(crate) struct Cleanup {
    pub(crate) collection: Collection<Document>,
    pub(crate) filter: Document,
    pub(crate) update: Vec<Document>,
    pub(crate) options: LockOptions,
    /// The lock's name, for messages.
    pub(crate) name: String,
}

impl Cleanup {
    /// Sends the cleanup in the background, waiting at most `expiry` for it (by then any lease
    /// the attempt took has ended anyway).
    fn spawn(&self, runtime: &Handle) {
        let Cleanup {
            collection,
            filter,
            update,
            options,
            name,
        } = self.clone();
        runtime.spawn(async move {
            let sent = collection
                .update_one(filter, update)
                .write_concern(options.write_concern().clone());
            match tokio::time::timeout(options.expiry(), sent).await {
                Ok(Ok(result)) if result.modified_count > 0 => tracing::debug!(
                    lock = %shown_name(&name),
                    "ended the lease of an attempt whose reply was lost"
                ),
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(
                    lock = %shown_name(&name),
                    %error,
                    "could not clean up after a failed attempt; its lease, if any, ends at expiry"
                ),
                Err(_elapsed) => tracing::debug!(
                    lock = %shown_name(&name),
                    "no reply to the cleanup of a failed attempt; its lease, if any, ends at expiry"
                ),
            }
        });
    }
}
