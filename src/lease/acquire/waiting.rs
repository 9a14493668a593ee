//! A caller between its attempts: [`Waiting`], its place in the lock's line of local waiters
//! (see `handoff`), its standing offer to take a lease over, its subscription to pushed
//! releases, and the events that end each wait.

use std::future::pending;
use std::sync::Arc;

use mongodb::Collection;
use mongodb::bson::Document;
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use crate::error::Result;
use crate::lease::claim::{Claim, Granted};
use crate::lease::handoff::{self, Offer, Taker, Ticket, Transfer, Wake};
use crate::lease::in_flight::InFlight;
use crate::lease::schema::new_lock_id;
use crate::lease::undo::Undo;
use crate::lease::waiting_marker::WaitingMarker;
use crate::lease::{backoff, protocol, push};
use crate::options::LockOptions;

/// Where a waiter queues for in-process handoff.
pub(super) struct WaitQueue<'a, K> {
    pub(super) key: &'a handoff::Key,
    pub(super) shared: bool,
    pub(super) renews_while_waiting: bool,
    /// A fair lock's wait: its place in the lock's line.
    pub(super) place: Option<&'a WaitingMarker>,
    /// What a takeover offer needs, for kinds that take leases over.
    pub(super) takeovers: Option<(&'a Arc<K>, &'a Handle, &'a Arc<InFlight>)>,
    /// The lock's collection and name, the runtime of the stream that pushes its releases, and
    /// a semaphore's places.
    pub(super) push: Option<(&'a Collection<Document>, &'a str, &'a Handle, Option<u32>)>,
}

/// The outcome of a waiter's standing offer to take a lease over.
type Offered<G> = oneshot::Receiver<Result<Option<G>>>;

/// What ended a wait between attempts.
enum Event<G> {
    /// The sleep ended, or a local release woke the waiter: attempt.
    Attempt,
    /// Told to poll (again) at the busy-wait pace: wait again, without an attempt.
    Poll,
    /// The outcome of this waiter's offer to take a lease over.
    Transferred(std::result::Result<Result<Option<G>>, oneshot::error::RecvError>),
}

/// A caller waiting for a lock, from its first attempt to its last: what it has learnt and
/// where it stands. [`retry`] drives it: [`attempted`](Waiting::attempted) after each attempt,
/// then [`join`](Waiting::join) and [`until_attempt`](Waiting::until_attempt).
pub(super) struct Waiting<'a, K: Claim> {
    options: &'a LockOptions,
    /// `None`: never.
    deadline: Option<Instant>,
    queue: Option<WaitQueue<'a, K>>,
    /// Attempts that found the lock busy (or failed), for the backoff.
    failed_attempts: u32,
    /// Since when every attempt has failed with a transient error.
    failing_since: Option<Instant>,
    // Dropped in this order (as fields are): the subscription, the offer, then the place in
    // the line.
    /// While it polls for its group: releases pushed to it by a change stream.
    subscription: Option<push::Subscription>,
    /// The outcome of its standing offer to take a lease over, if it made one.
    offered: Option<Offered<K::Won>>,
    /// Its place in the line of local waiters, after its first failure.
    ticket: Option<Ticket>,
    /// Whether it skipped its first attempt (a lease of the lock was held here, or a line
    /// waited here, when it came).
    skipped_first_attempt: bool,
}

/// Repeats `attempt` until it yields a guard, or `deadline` (`None`: never) has passed.
///
/// Between attempts it sleeps per `options`. With a `queue`, the caller joins the lock's queue of
/// local waiters after its first failure (see `handoff`): a local release wakes it at once, and
/// only the first local waiter polls the server; the others wait for local events and the
/// deadline only.
pub(super) async fn retry<K, F, Fut>(
    options: &LockOptions,
    deadline: Option<Instant>,
    queue: Option<WaitQueue<'_, K>>,
    mut attempt: F,
) -> Result<Option<K::Won>>
where
    K: Claim,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<K::Won>>>,
{
    let mut waiting = Waiting::new(options, deadline, queue);
    let mut attempt_now = !waiting.skipped_first_attempt;
    loop {
        if attempt_now {
            let started = Instant::now();
            let outcome = attempt().await;
            if let Some(end) = waiting.attempted(started, outcome).await {
                return end;
            }
        }
        attempt_now = true;
        if waiting.join() {
            continue;
        }
        if let Some(end) = waiting.until_attempt().await {
            return end;
        }
    }
}

impl<'a, K: Claim> Waiting<'a, K> {
    /// A caller that has not attempted yet.
    ///
    /// While an exclusive lease of the lock is held in this process, a caller that may wait
    /// queues at once: an attempt could only fail, and the lease's end is a local event. So it
    /// does behind callers of this process already in line: an attempt would jump the line (and
    /// cost a command racing the waiter a release woke). A caller whose attempts keep something
    /// it holds while it waits attempts first all the same: a waiting writer's attempt places
    /// the marker that keeps new readers out, a fair lock's waiter's takes its place in line.
    fn new(
        options: &'a LockOptions,
        deadline: Option<Instant>,
        queue: Option<WaitQueue<'a, K>>,
    ) -> Waiting<'a, K> {
        let skipped_first_attempt = deadline.is_none_or(|deadline| Instant::now() < deadline)
            && queue.as_ref().is_some_and(|queue| {
                !queue.renews_while_waiting
                    && (handoff::held_here(queue.key) || handoff::waiting_here(queue.key))
            });
        Waiting {
            options,
            deadline,
            queue,
            failed_attempts: 0,
            failing_since: None,
            subscription: None,
            offered: None,
            ticket: None,
            skipped_first_attempt,
        }
    }

    /// What an attempt started at `started` with `outcome` means for the wait: its end (the
    /// guard, the error, or `Ok(None)` at the deadline), or `None` to wait and attempt again.
    async fn attempted(
        &mut self,
        started: Instant,
        outcome: Result<Option<K::Won>>,
    ) -> Option<Result<Option<K::Won>>> {
        let now = Instant::now();
        let out_of_time = self.deadline.is_some_and(|deadline| now >= deadline);
        match outcome {
            Ok(Some(guard)) => return Some(Ok(Some(self.won(guard)))),
            Ok(None) => self.failing_since = None,
            // An election or a busy primary: wait and try again like for a busy lock, within
            // the caller's deadline and for at most `expiry` in a row.
            Err(error)
                if error.is_transient()
                    && !out_of_time
                    && now - *self.failing_since.get_or_insert(started) < self.options.expiry() =>
            {
                tracing::debug!(%error, "transient failure of an acquisition attempt; retrying");
            }
            // The caller gets the error, unless a release is handing it the lock right now.
            Err(error) => {
                return Some(match self.last_transfer().await {
                    Some(guard) => Ok(Some(guard)),
                    None => Err(error),
                });
            }
        }
        if out_of_time {
            return Some(Ok(self.last_transfer().await));
        }
        None
    }

    /// Joins the line of local waiters, after the first failure. Whether to attempt at once:
    /// the lease held here (or the line) when this caller came may have ended before it
    /// joined, with nobody ahead, and then no local event is coming for it.
    fn join(&mut self) -> bool {
        if self.ticket.is_some() {
            return false;
        }
        self.ticket = self.queue.as_ref().map(|queue| {
            Ticket::join(queue.key, queue.shared, queue.place.and_then(|p| p.place()))
        });
        self.skipped_first_attempt
            && self
                .ticket
                .as_ref()
                .is_some_and(|ticket| ticket.is_first() && !ticket.held_here())
    }

    /// Waits until the next attempt is due: `None` then, or the wait's end when a transfer
    /// ends it. Each pass leaves an offer to take a lease over (if the kind does and none
    /// stands) and subscribes to pushed releases while this waiter polls for its group.
    async fn until_attempt(&mut self) -> Option<Result<Option<K::Won>>> {
        loop {
            if let (Some(ticket), Some((claim, runtime, in_flight)), None) = (
                &self.ticket,
                self.queue.as_ref().and_then(|queue| queue.takeovers),
                &self.offered,
            ) {
                self.offered = Some(offer(ticket, claim, runtime, in_flight, self.options));
            }
            self.follow_pushed_releases();
            match self.next_event().await {
                Event::Attempt => {
                    // A release that took the offer hands the lock over instead.
                    if let Some(guard) = self.take_offer_back().await {
                        return Some(Ok(Some(self.won(guard))));
                    }
                    break;
                }
                Event::Poll => {}
                Event::Transferred(Ok(Ok(Some(guard)))) => return Some(Ok(Some(self.won(guard)))),
                Event::Transferred(Ok(Err(error))) => return Some(Err(error)),
                // No transfer: the lease it was offered for may be gone, so the lock free.
                Event::Transferred(Ok(Ok(None)) | Err(_)) => {
                    self.offered = None;
                    break;
                }
            }
        }
        self.failed_attempts = self.failed_attempts.saturating_add(1);
        None
    }

    /// Before an attempt: takes the standing offer back, so that an attempt and a release's
    /// transfer cannot both win (the one that lost would be a lease nobody wanted, released
    /// only afterwards, as [`last_transfer`] does with a late one): the guard a release is
    /// handing over already, `None` otherwise (no offer stood, or it was taken back, or the
    /// transfer gave nothing).
    async fn take_offer_back(&mut self) -> Option<K::Won> {
        let offered = self.offered.take()?;
        last_transfer(self.ticket.as_ref(), Some(offered), self.options).await
    }

    /// Leaves the line with `guard`, passing the turn on (at once if it leaves room).
    fn won(&mut self, guard: K::Won) -> K::Won {
        if let Some(ticket) = self.ticket.take() {
            ticket.leave_with_lock(guard.leaves_room());
        }
        guard
    }

    /// The poller subscribes to pushed releases (not while the lock is held here: its release
    /// will be a local event); a waiter that stops polling leaves.
    fn follow_pushed_releases(&mut self) {
        let polls = self.ticket.as_ref().is_some_and(Ticket::is_first);
        match (&self.subscription, self.queue.as_ref()) {
            (None, Some(queue))
                if polls && !self.ticket.as_ref().is_some_and(Ticket::held_here) =>
            {
                if let Some((collection, name, runtime, places)) = queue.push {
                    self.subscription = Some(push::Subscription::new(
                        runtime, collection, queue.key, name, places,
                    ));
                }
            }
            (Some(_), _) if !polls => self.subscription = None,
            _ => {}
        }
    }

    /// Waits for what comes first: the end of this waiter's sleep (the first local waiter's,
    /// or the only waiter's, per the busy-wait pace; a waiter whose attempts renew something it
    /// keeps while waiting, at the slowest pace; the others' at the deadline), a local wake, or
    /// the outcome of its offer.
    async fn next_event(&mut self) -> Event<K::Won> {
        let options = self.options;
        let renews_while_waiting = self
            .queue
            .as_ref()
            .is_some_and(|queue| queue.renews_while_waiting);
        let pushed = self
            .subscription
            .as_ref()
            .is_some_and(push::Subscription::is_healthy);
        let now = Instant::now();
        let pace = match &self.ticket {
            None => Some(backoff::sleep_time(
                options,
                self.failed_attempts,
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
                self.failed_attempts,
                rand::random(),
            )),
            // Not the poller, but its attempts keep its marker alive.
            Some(_) if renews_while_waiting => Some(options.busy_wait_sleep_time().1),
            Some(_) => None,
        };
        let until = match pace {
            Some(pace) => Some(now + backoff::sleep_until_deadline(pace, now, self.deadline)),
            None => self.deadline,
        };
        let sleep = async {
            match until {
                Some(until) => sleep_until(until).await,
                None => pending().await,
            }
        };
        let woken = async {
            match &self.ticket {
                Some(ticket) => ticket.woken().await,
                None => pending().await,
            }
        };
        let transferred = async {
            match &mut self.offered {
                Some(outcome) => outcome.await,
                None => pending().await,
            }
        };
        // A transfer's outcome first: its guard must not wait behind an attempt that cannot
        // win.
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

    /// The outcome of the standing offer when the caller stops waiting (see [`last_transfer`]).
    async fn last_transfer(&mut self) -> Option<K::Won> {
        let offered = self.offered.take();
        last_transfer(self.ticket.as_ref(), offered, self.options).await
    }
}

/// Leaves an offer to take a lease over in `ticket`'s queue; returns where its outcome arrives.
fn offer<K: Claim>(
    ticket: &Ticket,
    claim: &Arc<K>,
    runtime: &Handle,
    in_flight: &Arc<InFlight>,
    options: &LockOptions,
) -> oneshot::Receiver<Result<Option<K::Won>>> {
    let lock_id = new_lock_id();
    let undo = claim.undo(&lock_id);
    let (outcome, received) = oneshot::channel();
    ticket.offer(Offer {
        layout: claim.layout(),
        cleanup: undo.clone(),
        receiver: Arc::clone(in_flight),
        write_concern: options.write_concern().clone(),
        fair: options.fair(),
        taker: Box::new(Waiter {
            claim: Arc::clone(claim),
            lock_id: lock_id.clone(),
            runtime: runtime.clone(),
            in_flight: Arc::clone(in_flight),
            undo,
            outcome,
        }),
        lock_id,
    });
    received
}

/// A waiting caller's standing offer to take a lease over, as the releasing task holds it.
struct Waiter<K: Claim> {
    claim: Arc<K>,
    lock_id: String,
    /// The waiter's runtime and family's work under way.
    runtime: Handle,
    in_flight: Arc<InFlight>,
    /// Ends the lease the waiter may have been given, should the outcome be unknown.
    undo: Undo,
    outcome: oneshot::Sender<Result<Option<K::Won>>>,
}

impl<K: Claim> Taker for Waiter<K> {
    fn update(&self, replacing: &str) -> Vec<Document> {
        self.claim.update(&self.lock_id, Some(replacing))
    }

    fn deliver(self: Box<Self>, transfer: Transfer) {
        let Waiter {
            claim,
            lock_id,
            runtime,
            in_flight,
            undo,
            outcome,
        } = *self;
        let result = match transfer {
            Transfer::Done { document, request } => {
                if let Some(place) = claim.place_in_line() {
                    place.saw(&document);
                }
                claim.won(&runtime, document, lock_id, request)
            }
            Transfer::NotDone => Ok(None),
            // The releasing task ended (its runtime shut down) before it knew whether the
            // lease is the waiter's now: end both leases from the waiter's runtime.
            Transfer::Abandoned { releasing } => {
                in_flight.spawn_undo(&runtime, releasing);
                in_flight.spawn_undo(&runtime, undo);
                Ok(None)
            }
        };
        // A waiter that has gone: the lease nobody was given ends at once.
        if let Err(Ok(Some(guard))) = outcome.send(result) {
            guard.undelivered();
        }
    }
}

/// The outcome of a waiter's standing offer when it stops waiting (its deadline passed, or its
/// attempt failed for good): a guard if the lock was handed over to it (a transfer taken before
/// is waited for, at most as long as an attempt is), `None` otherwise (the offer is withdrawn).
async fn last_transfer<G>(
    ticket: Option<&Ticket>,
    offered: Option<Offered<G>>,
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
