//! The waiting machinery shared by every kind of lock: attempts run to completion in spawned
//! tasks (cancel safety), alternate with backoff sleeps, and respect deadlines.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};

use crate::backoff;
use crate::handoff;
use crate::{Error, LockOptions, Result};

/// The `operation` of an [`Error::Timeout`] when an acquisition attempt got no reply in time.
pub(crate) const NO_REPLY: &str = "acquisition attempt (no reply from MongoDB)";

/// Repeats `attempt` until it yields a guard, or `deadline` (`None`: never) has passed.
///
/// Between attempts it sleeps per `options`. With `waiters`, the caller queues for in-process
/// handoff after its first failure: a local release wakes it at once, and only the first local
/// waiter polls at the busy-wait pace (see `handoff`).
pub(crate) async fn retry<G, F, Fut>(
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
    loop {
        if let Some(guard) = attempt().await? {
            if let Some(ticket) = ticket {
                ticket.leave_with_lock();
            }
            return Ok(Some(guard));
        }
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
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
/// An attempt gets at least a second (at most `expiry`) to answer; no answer is
/// [`Error::Timeout`], never "busy".
pub(crate) async fn spawned_attempt<G, W>(
    runtime: &Handle,
    deadline: Option<Instant>,
    options: &LockOptions,
    name: &str,
    work: W,
) -> Result<Option<G>>
where
    G: Send + 'static,
    W: Future<Output = Result<Option<G>>> + Send + 'static,
{
    let started = Instant::now();
    let (reply, outcome) = oneshot::channel();
    runtime.spawn(async move {
        let _ = reply.send(work.await);
    });
    let limit = backoff::attempt_wait_limit(started, deadline, options.expiry());
    match timeout_at(limit, outcome).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(Error::BackgroundTaskEnded("acquire attempt")),
        Err(_elapsed) => Err(Error::Timeout {
            operation: NO_REPLY,
            name: name.to_owned(),
            waited: started.elapsed(),
        }),
    }
}
