//! Lease renewal, loss detection and release for held locks.
//!
//! Guards do not each run a task. Every held lock is registered with a *renewal loop*: one task
//! per (Tokio runtime, collection, expiry, cadence, write concern) within a [`RenewalHub`], which
//! renews all its leases with a single `update_many` per cadence, whatever their number. The hub
//! is shared by the locks of one [`Provider`](crate::Provider) (and by clones of one
//! [`MongoDistributedLock`](crate::MongoDistributedLock)); a `mongodb::Client` has no public
//! identity, so sharing never crosses what the application itself tied together.
//!
//! The readers of a reader-writer lock are members of one array: a renewal's `update_many`
//! counts documents, not readers, so while a process holds several read leases of one lock a
//! second command (reading back which leases are live) follows each renewal.
//!
//! # Loss detection
//! Each confirmed acquire or renew request was *sent* at some instant `t` on the client's
//! monotonic clock. The server computed `expiresAt` after receiving it, so the lease certainly
//! lasts until `t + expiry` by a clock running at the server's rate. A lease counts as lost at
//! `t + expiry - margin` unless a later renewal was confirmed first, and also as soon as a renewal
//! finds it gone (deleted, taken over, or already expired). Either way `lost` turns true before
//! another client can take the lock, provided the two clocks run at about the same rate and the
//! process is not paused for longer than the margin.
//!
//! # Release
//! A guard's release or drop sends a message to its loop (a plain channel send: it works from
//! `Drop`, off the runtime, without blocking). The loop forgets the lease and sends the release
//! update in a spawned task. The release clears `lockId`, so a renewal still in flight can no
//! longer match the lease: releases and renewals need no ordering.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document};
use mongodb::{Collection, Namespace};
use tokio::runtime::{self, Handle};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::error::shown_name;
use crate::handoff;
use crate::schema::{LIVE_LOCK_IDS, Layout};
use crate::{Error, LockOptions, Result};

/// Where the answer to a release request goes.
pub(crate) type ReleaseReply = oneshot::Sender<Result<()>>;

/// What a guard tells its renewal loop.
#[derive(Debug)]
pub(crate) enum Command {
    /// Start renewing a freshly acquired lease.
    Hold(Lease),
    /// Forget the lease with this lock id and release it; answer if asked.
    Release {
        lock_id: String,
        reply: Option<ReleaseReply>,
    },
    /// Forget the lease: its guard ended it itself (a document lock's commit).
    Forget { lock_id: String },
}

/// Asks the renewal loop to release `lock_id` and waits for the outcome (a guard's `release`).
/// `None`: the guard already handed its lease back.
pub(crate) async fn release(
    renewals: &mpsc::UnboundedSender<Command>,
    lock_id: Option<String>,
) -> Result<()> {
    let Some(lock_id) = lock_id else {
        return Err(Error::BackgroundTaskEnded("release"));
    };
    let (reply, answer) = oneshot::channel();
    let request = Command::Release {
        lock_id,
        reply: Some(reply),
    };
    if renewals.send(request).is_err() {
        return Err(Error::BackgroundTaskEnded("lease"));
    }
    answer
        .await
        .unwrap_or(Err(Error::BackgroundTaskEnded("release")))
}

/// Asks the renewal loop to release `lock_id` in the background (a guard's drop): a plain
/// channel send, so it never blocks and works off the runtime. If the loop is gone (its runtime
/// shut down), the lease expires by itself.
pub(crate) fn release_in_background(
    renewals: &mpsc::UnboundedSender<Command>,
    lock_id: Option<String>,
) {
    if let Some(lock_id) = lock_id {
        let _ = renewals.send(Command::Release {
            lock_id,
            reply: None,
        });
    }
}

/// A held lease, as its renewal loop tracks it.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The `_id` of the document holding the lease.
    pub(crate) id: Bson,
    /// How the lock is named in messages.
    pub(crate) name: String,
    pub(crate) lock_id: String,
    /// When the last confirmed acquire or renew request was sent.
    pub(crate) confirmed_at: Instant,
    pub(crate) lost: watch::Sender<bool>,
    /// Identifies the lock's in-process waiters, to wake one on release.
    pub(crate) waiters: Option<handoff::Key>,
}

impl Lease {
    fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    fn mark_lost(&self, reason: &str) {
        // send_replace: the value must change even when no receiver is left.
        if !self.lost.send_replace(true) {
            tracing::warn!(lock = %shown_name(&self.name), reason, "lock lost");
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LoopKey {
    runtime: runtime::Id,
    namespace: Namespace,
    layout: Layout,
    expiry: Duration,
    cadence: Duration,
    /// `WriteConcern` is not `Hash`; its debug form identifies it.
    write_concern: String,
}

/// The renewal loops of a family of locks, one per runtime and configuration.
#[derive(Debug, Default)]
pub(crate) struct RenewalHub {
    loops: Mutex<HashMap<LoopKey, mpsc::UnboundedSender<Command>>>,
}

impl RenewalHub {
    fn loops(&self) -> MutexGuard<'_, HashMap<LoopKey, mpsc::UnboundedSender<Command>>> {
        self.loops
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `lease` with the loop for `runtime` and this configuration, starting the loop if
    /// there is none (or its runtime shut down). Returns the channel for later release requests.
    pub(crate) fn hold(
        &self,
        runtime: &Handle,
        collection: &Collection<Document>,
        layout: &Layout,
        options: &LockOptions,
        lease: Lease,
    ) -> mpsc::UnboundedSender<Command> {
        let key = LoopKey {
            runtime: runtime.id(),
            namespace: collection.namespace(),
            layout: layout.clone(),
            expiry: options.expiry(),
            cadence: options.extension_cadence(),
            write_concern: format!("{:?}", options.write_concern()),
        };
        let mut loops = self.loops();
        // A loop whose runtime shut down has dropped its receiver; a new runtime with a reused
        // id then gets a fresh loop.
        loops.retain(|_, commands| !commands.is_closed());
        let commands = loops.entry(key).or_insert_with(|| {
            let (commands, receiver) = mpsc::unbounded_channel();
            let renewals = RenewalLoop {
                runtime: runtime.clone(),
                collection: collection.clone(),
                layout: layout.clone(),
                options: options.clone(),
                leases: HashMap::new(),
                next_renewal: Instant::now(),
            };
            runtime.spawn(renewals.run(receiver));
            commands
        });
        // The loop cannot have gone away while we hold the map's lock and saw it open; if the
        // runtime shuts down right now the lease simply expires, as documented.
        let _ = commands.send(Command::Hold(lease));
        commands.clone()
    }
}

/// A renewal in flight: the lock ids it covers and when it was sent.
struct Renewal {
    sent_at: Instant,
    lock_ids: Vec<String>,
    call: JoinHandle<mongodb::error::Result<Renewed>>,
}

/// Which leases of a renewal are still ours.
enum Renewed {
    All,
    Only(HashSet<String>),
}

struct RenewalLoop {
    runtime: Handle,
    collection: Collection<Document>,
    layout: Layout,
    options: LockOptions,
    /// By lock id.
    leases: HashMap<String, Lease>,
    next_renewal: Instant,
}

/// The reply of the renewal in flight; never resolves when there is none.
async fn reply_of(
    in_flight: &mut Option<Renewal>,
) -> std::result::Result<mongodb::error::Result<Renewed>, tokio::task::JoinError> {
    match in_flight {
        Some(renewal) => (&mut renewal.call).await,
        None => std::future::pending().await,
    }
}

impl RenewalLoop {
    /// Runs until every sender is gone: the hub (its locks) and all guards.
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut in_flight: Option<Renewal> = None;
        loop {
            let overdue_at = self.earliest_deadline();
            let renew_due = in_flight.is_none() && self.leases.values().any(|l| !l.is_lost());
            tokio::select! {
                command = commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => break,
                },
                result = reply_of(&mut in_flight), if in_flight.is_some() => {
                    if let Some(renewal) = in_flight.take() {
                        self.renewed(renewal, result);
                    }
                }
                () = sleep_until(self.next_renewal), if renew_due => {
                    in_flight = Some(self.start_renewal());
                }
                () = sleep_until(overdue_at.unwrap_or_else(Instant::now)), if overdue_at.is_some() => {
                    self.expire_overdue();
                }
            }
        }
    }

    fn deadline(&self, lease: &Lease) -> Instant {
        lease.confirmed_at + self.options.expiry() - self.options.safety_margin()
    }

    fn earliest_deadline(&self) -> Option<Instant> {
        self.leases
            .values()
            .filter(|lease| !lease.is_lost())
            .map(|lease| self.deadline(lease))
            .min()
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Hold(lease) => {
                let others_live = self.leases.values().any(|l| !l.is_lost());
                if !others_live {
                    // Nothing to renew until this lease needs it: no extra round trip.
                    self.next_renewal = lease.confirmed_at + self.options.extension_cadence();
                }
                self.leases.insert(lease.lock_id.clone(), lease);
            }
            Command::Forget { lock_id } => {
                self.leases.remove(&lock_id);
            }
            Command::Release { lock_id, reply } => match self.leases.remove(&lock_id) {
                Some(lease) => {
                    let context = ReleaseContext {
                        runtime: self.runtime.clone(),
                        collection: self.collection.clone(),
                        layout: self.layout.clone(),
                        options: self.options.clone(),
                    };
                    self.runtime.spawn(release_lease(context, lease, reply));
                }
                None => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(Error::BackgroundTaskEnded("release")));
                    }
                }
            },
        }
    }

    fn start_renewal(&mut self) -> Renewal {
        let (ids, lock_ids): (Vec<Bson>, Vec<String>) = self
            .leases
            .values()
            .filter(|lease| !lease.is_lost())
            .map(|lease| (lease.id.clone(), lease.lock_id.clone()))
            .unzip();
        let sent_at = Instant::now();
        let (collection, layout) = (self.collection.clone(), self.layout.clone());
        let options = self.options.clone();
        let renewing = lock_ids.clone();
        let call = self
            .runtime
            .spawn(async move { renew(&collection, &layout, &options, &ids, &renewing).await });
        Renewal {
            sent_at,
            lock_ids,
            call,
        }
    }

    fn renewed(
        &mut self,
        renewal: Renewal,
        result: std::result::Result<mongodb::error::Result<Renewed>, tokio::task::JoinError>,
    ) {
        let failure = match result {
            Ok(Ok(renewed)) => {
                for lock_id in &renewal.lock_ids {
                    let Some(lease) = self.leases.get_mut(lock_id) else {
                        continue; // released meanwhile
                    };
                    let live = match &renewed {
                        Renewed::All => true,
                        Renewed::Only(live) => live.contains(lock_id),
                    };
                    if live {
                        lease.confirmed_at = lease.confirmed_at.max(renewal.sent_at);
                    } else {
                        lease.mark_lost(
                            "the lease was no longer in the database (deleted, taken over or expired)",
                        );
                    }
                }
                self.next_renewal = renewal.sent_at + self.options.extension_cadence();
                return;
            }
            Ok(Err(error)) => error.to_string(),
            Err(join_error) => join_error.to_string(),
        };
        let retry_delay = (self.options.extension_cadence() / 4)
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        tracing::warn!(
            collection = %self.collection.name(),
            leases = renewal.lock_ids.len(),
            error = %failure,
            "lease renewal failed; retrying until each lease's deadline"
        );
        self.next_renewal = Instant::now() + retry_delay;
    }

    fn expire_overdue(&mut self) {
        let now = Instant::now();
        for lease in self.leases.values() {
            if !lease.is_lost() && self.deadline(lease) <= now {
                lease.mark_lost("no renewal was confirmed before the lease's deadline");
            }
        }
    }
}

/// Renews every listed lease that is still ours and live, in one command; only when some did not
/// match does a second command find out which.
async fn renew(
    collection: &Collection<Document>,
    layout: &Layout,
    options: &LockOptions,
    ids: &[Bson],
    lock_ids: &[String],
) -> mongodb::error::Result<Renewed> {
    let filter = layout.renew_many_filter(ids, lock_ids);
    let result = collection
        .update_many(
            filter,
            layout.renew_update(options.expiry_millis(), lock_ids),
        )
        .write_concern(options.write_concern().clone())
        .await?;
    // Each document matches at most once and holds at least one of our leases; as many matches
    // as leases means one lease per document, each renewed.
    if usize::try_from(result.matched_count).is_ok_and(|matched| matched == lock_ids.len()) {
        return Ok(Renewed::All);
    }
    // Leases just renewed are live now; the others are gone for good.
    let rows: Vec<Document> = collection
        .aggregate(layout.live_lock_ids(ids, lock_ids))
        .await?
        .try_collect()
        .await?;
    let live = rows
        .iter()
        .filter_map(|row| row.get_array(LIVE_LOCK_IDS).ok())
        .flatten()
        .filter_map(|lock_id| lock_id.as_str().map(str::to_owned))
        .collect();
    Ok(Renewed::Only(live))
}

/// What a release needs besides the lease.
struct ReleaseContext {
    runtime: Handle,
    collection: Collection<Document>,
    layout: Layout,
    options: LockOptions,
}

/// Expires `lease` (never anybody else's) and keeps the document; wakes an in-process waiter.
async fn release_lease(context: ReleaseContext, lease: Lease, reply: Option<ReleaseReply>) {
    let result = send_release(&context, &lease).await;
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

async fn send_release(context: &ReleaseContext, lease: &Lease) -> Result<()> {
    let ReleaseContext {
        runtime,
        collection,
        layout,
        options,
    } = context;
    let started = Instant::now();
    // Wake the longest-waiting local waiter now: its attempt reaches the server right behind this
    // release. If it arrives first after all, it is woken again once the release is confirmed.
    let woken = lease.waiters.as_ref().and_then(handoff::wake_first);
    let filter = layout.release_filter(&lease.id, &lease.lock_id);
    let update = layout.release_update(&lease.lock_id);
    let call = {
        let collection = collection.clone();
        let write_concern = options.write_concern().clone();
        runtime.spawn(async move {
            collection
                .update_one(filter, update)
                .write_concern(write_concern)
                .await
        })
    };
    let result = match timeout_at(started + options.expiry(), call).await {
        Err(_elapsed) => {
            return Err(Error::Timeout {
                operation: "release",
                name: lease.name.clone(),
                waited: started.elapsed(),
            });
        }
        Ok(Err(_join_error)) => return Err(Error::BackgroundTaskEnded("release")),
        Ok(Ok(result)) => result?,
    };
    if result.matched_count == 0 {
        lease.mark_lost("the lease was no longer in the database at release");
    }
    if lease.is_lost() {
        return Err(Error::LockLost {
            name: lease.name.clone(),
        });
    }
    if let (Some(waiters), Some(woken)) = (&lease.waiters, woken) {
        handoff::wake_again(waiters, woken);
    }
    Ok(())
}
