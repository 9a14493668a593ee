//! The one acquisition loop under every primitive: validation, the runtime, a tracing span,
//! attempts that run to completion in spawned tasks (cancel safety), backoff sleeps, in-process
//! handoff, deadlines, transient-failure retries, and cleanup after attempts whose outcome is
//! unknown. A primitive supplies only its attempt.

use std::future::pending;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::time::Instant;
use tracing::Instrument;

use super::backoff;
use super::claim::{Claim, Granted};
use super::family::Family;
use super::handoff;
use super::metrics;
use super::schema::new_lock_id;
use crate::error::{Error, Operation, Result, holders_text, shown_name};
use crate::lock_status::{LockKind, LockStatus};
use crate::options::LockOptions;
use mongodb::Collection;
use mongodb::bson::Document;

mod attempt;
mod waiting;

use attempt::spawned;
use waiting::{WaitQueue, retry};

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
    pub(crate) family: &'a Family,
    /// The lock's collection, if a release of the lock can be pushed to its poller by a change
    /// stream (see `push`).
    pub(crate) push: Option<&'a Collection<Document>>,
    /// A semaphore's places: a pushed change frees one only if it leaves fewer holders.
    pub(crate) places: Option<u32>,
}

/// Runs attempts of `claim` until one wins, or the wait runs out (`Ok(None)`).
///
/// Between attempts the caller sleeps per the options; with `waiters`, it queues for in-process
/// handoff after its first failure, and if its kind takes leases over ([`Claim::TAKES_OVER`]),
/// it offers to take the lease over from a local holder's release. See [`retry`] and
/// [`spawned`].
pub(crate) async fn acquire<K: Claim>(
    what: Acquisition<'_>,
    wait: Wait,
    claim: Arc<K>,
) -> Result<Option<K::Won>> {
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
        let queue = what.waiters.map(|key| WaitQueue {
            key,
            shared: what.shared,
            renews_while_waiting: what.renews_while_waiting,
            place: claim.place_in_line(),
            takeovers: K::TAKES_OVER.then_some((&claim, &runtime, in_flight)),
            push: what
                .push
                .map(|collection| (collection, what.name, &runtime, what.places)),
        });
        let attempts = retry(options, deadline, queue, || {
            metrics::attempt(kind);
            let lock_id = new_lock_id();
            let undo = claim.undo(&lock_id);
            let work = Arc::clone(&claim).attempt(runtime.clone(), lock_id);
            spawned(&runtime, deadline, options, work, undo, in_flight)
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
            pending::<Result<Option<K::Won>>>().await
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
