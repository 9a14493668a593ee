//! The background task behind a [`LockGuard`](crate::LockGuard): renews the lease, signals its
//! loss, and finally releases it.
//!
//! One task per guard does all three, so a release can never overtake a renewal that is still in
//! flight. The guard talks to it through a oneshot channel: sending a reply sender asks for a
//! release and an answer; dropping the channel (the guard was dropped) asks for a release in the
//! background.
//!
//! # Loss detection
//! Each confirmed acquire or renew request was *sent* at some instant `t` on the client's
//! monotonic clock. The server computed `expiresAt` after receiving it, so the lease certainly
//! lasts until `t + expiry` by a clock running at the server's rate. The task treats the lease as
//! lost at `t + expiry - margin` unless a later renewal is confirmed first, and also as soon as a
//! renewal matches no document (deleted, taken over, or already expired). Either way `lost` turns
//! true before another client can take the lock, provided the two clocks run at about the same
//! rate and the process is not paused for longer than the margin.

use std::sync::Arc;
use std::time::Duration;

use mongodb::results::UpdateResult;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::error::shown_name;
use crate::lock::LockInner;
use crate::schema;
use crate::{Error, Result};

/// Where the answer to a release request goes.
pub(crate) type ReleaseReply = oneshot::Sender<Result<()>>;

type DriverCall = JoinHandle<mongodb::error::Result<UpdateResult>>;

pub(crate) struct Lease {
    pub(crate) runtime: Handle,
    pub(crate) lock: Arc<LockInner>,
    pub(crate) lock_id: String,
    /// When the last confirmed acquire or renew request was sent.
    pub(crate) confirmed_at: Instant,
    pub(crate) lost: watch::Sender<bool>,
    /// A renewal whose reply never came; a release waits for it so as not to be overtaken.
    pub(crate) unanswered: Option<DriverCall>,
}

impl Lease {
    pub(crate) async fn run(mut self, mut stop: oneshot::Receiver<ReleaseReply>) {
        let reply = self.keep_alive(&mut stop).await;
        let result = self.release().await;
        match reply {
            Some(reply) => {
                // The caller may have stopped waiting; the outcome is the same either way.
                let _ = reply.send(result);
            }
            None => match result {
                Ok(()) => tracing::debug!(lock = %shown_name(&self.lock.name), "released on drop"),
                Err(error) if error.is_lock_lost() => tracing::debug!(
                    lock = %shown_name(&self.lock.name),
                    "dropped guard's lock had been lost"
                ),
                Err(error) => tracing::warn!(
                    lock = %shown_name(&self.lock.name),
                    %error,
                    "background release after drop failed; the lease ends at its expiry"
                ),
            },
        }
    }

    /// Renews until a release is requested; returns the requester's reply channel, or `None`
    /// when the guard was dropped.
    async fn keep_alive(
        &mut self,
        stop: &mut oneshot::Receiver<ReleaseReply>,
    ) -> Option<ReleaseReply> {
        loop {
            if *self.lost.borrow() {
                return stop.await.ok();
            }
            let next_renewal = self.confirmed_at + self.lock.options.extension_cadence();
            tokio::select! {
                request = &mut *stop => return request.ok(),
                () = sleep_until(next_renewal) => {}
            }
            if let Some(request) = self.renew(stop).await {
                return request;
            }
        }
    }

    /// One renewal, retried on transient errors until the lease's local deadline. Returns
    /// `Some` if a release was requested meanwhile.
    async fn renew(
        &mut self,
        stop: &mut oneshot::Receiver<ReleaseReply>,
    ) -> Option<Option<ReleaseReply>> {
        let deadline = self.deadline();
        let retry_delay = (self.lock.options.extension_cadence() / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            let sent_at = Instant::now();
            if sent_at >= deadline {
                self.mark_lost("no renewal was confirmed before the lease's deadline");
                return None;
            }
            let mut call = self.spawn_renewal();
            let outcome = tokio::select! {
                request = &mut *stop => {
                    self.unanswered = Some(call);
                    return Some(request.ok());
                }
                outcome = timeout_at(deadline, &mut call) => outcome,
            };
            let failure = match outcome {
                Ok(Ok(Ok(result))) if result.matched_count > 0 => {
                    self.confirmed_at = sent_at;
                    return None;
                }
                Ok(Ok(Ok(_))) => {
                    self.mark_lost(
                        "the lease was no longer in the database (deleted, taken over or expired)",
                    );
                    return None;
                }
                Err(_elapsed) => {
                    self.unanswered = Some(call);
                    self.mark_lost("no renewal was confirmed before the lease's deadline");
                    return None;
                }
                Ok(Ok(Err(error))) => error.to_string(),
                Ok(Err(join_error)) => join_error.to_string(),
            };
            tracing::warn!(
                lock = %shown_name(&self.lock.name),
                error = %failure,
                remaining = ?deadline.saturating_duration_since(Instant::now()),
                "lease renewal failed; retrying until the lease's deadline"
            );
            tokio::select! {
                request = &mut *stop => return Some(request.ok()),
                () = sleep_until((Instant::now() + retry_delay).min(deadline)) => {}
            }
        }
    }

    /// When the lease must be presumed lost unless a renewal is confirmed.
    fn deadline(&self) -> Instant {
        let options = &self.lock.options;
        self.confirmed_at + options.expiry() - options.safety_margin()
    }

    fn spawn_renewal(&self) -> DriverCall {
        let lock = Arc::clone(&self.lock);
        let filter = schema::renew_filter(&lock.name, &self.lock_id);
        let update = schema::renew_update(lock.options.expiry_millis());
        self.runtime.spawn(async move {
            lock.collection
                .update_one(filter, update)
                .write_concern(lock.options.write_concern().clone())
                .await
        })
    }

    fn mark_lost(&self, reason: &str) {
        // send_replace: the value must change even when no receiver is left.
        if !self.lost.send_replace(true) {
            tracing::warn!(lock = %shown_name(&self.lock.name), reason, "lock lost");
        }
    }

    /// Expires our lease (never anybody else's) and keeps the document.
    async fn release(&mut self) -> Result<()> {
        let expiry = self.lock.options.expiry();
        if let Some(call) = self.unanswered.take() {
            // Past the lease's end a late renewal cannot match any more (its filter wants a live
            // lease), so waiting longer would gain nothing.
            let _ = timeout_at(self.confirmed_at + expiry, call).await;
        }
        let started = Instant::now();
        let lock = Arc::clone(&self.lock);
        let filter = schema::release_filter(&lock.name, &self.lock_id);
        let call = self.runtime.spawn(async move {
            lock.collection
                .update_one(filter, schema::release_update())
                .write_concern(lock.options.write_concern().clone())
                .await
        });
        let result = match timeout_at(started + expiry, call).await {
            Err(_elapsed) => {
                return Err(Error::Timeout {
                    operation: "release",
                    name: self.lock.name.clone(),
                    waited: started.elapsed(),
                });
            }
            Ok(Err(_join_error)) => return Err(Error::BackgroundTaskEnded("release")),
            Ok(Ok(result)) => result?,
        };
        if result.matched_count == 0 {
            self.mark_lost("the lease was no longer in the database at release");
        }
        if *self.lost.borrow() {
            return Err(Error::LockLost {
                name: self.lock.name.clone(),
            });
        }
        Ok(())
    }
}
