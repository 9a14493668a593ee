//! One attempt, run to completion in a task of its own: [`spawned`].

use std::pin::pin;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use crate::clock;
use crate::error::{Error, Operation, Result, is_duplicate_key};
use crate::lease::backoff;
use crate::lease::claim::Granted;
use crate::lease::in_flight::InFlight;
use crate::lease::protocol::{self, Reply, Tell};
use crate::lease::undo::Undo;
use crate::options::LockOptions;

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
pub(super) async fn spawned<G, W>(
    runtime: &Handle,
    deadline: Option<Instant>,
    options: &LockOptions,
    work: W,
    cleanup: Undo,
    in_flight: &Arc<InFlight>,
) -> Result<Option<G>>
where
    G: Granted + Send + 'static,
    W: Future<Output = Result<Option<G>>> + Send + 'static,
{
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
