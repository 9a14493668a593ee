//! Lease renewal, loss detection and release for held locks.
//!
//! Guards do not each run a task. Every held lock is registered with a *renewal loop*: one task
//! per (Tokio runtime, collection, layout, expiry, cadence, clock skew, write concern) within a
//! [`RenewalHub`], which renews all its leases with one `update_many` per cadence and per 2 MiB
//! of ids, whatever their number. The hub
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
//! lasts until `t + expiry` by a clock running at that server's rate; another client's router
//! may see it end up to `max_clock_skew` earlier. A lease counts as lost at
//! `t + expiry - margin - skew` ([`LockOptions::lost_deadline`], checked by whoever asks, see
//! `lost`) unless a later renewal was confirmed first, and also as soon as a renewal finds it
//! gone (deleted, taken over, or already expired), and when the loop ends. With
//! [`LockOptions::max_hold`], no deadline moves past the acquisition's send instant + `max_hold`:
//! the lease is lost then, and no longer renewed, so it ends on the server at most `expiry`
//! after its last renewal. Either way `lost`
//! turns true before another client can take the lock, provided the clocks run at about the
//! same rate, the servers' clocks agree within the skew, and the process is not paused for
//! longer than the margin.
//!
//! # Hung calls
//! The driver has no socket timeout: a command on a half-open connection can wait for many
//! minutes. A round of renewals waits for the previous one only until that one's commands are
//! three quarters of the way to the earliest deadline they serve; then it goes out on other
//! connections, so a hung command cannot make leases lapse, while a merely slow server gets
//! little extra load. Each command
//! is given up (aborted, which closes its connection) at the earliest deadline it serves. Leases
//! are renewed in chunks of at most 2 MiB of ids, so no command nears MongoDB's size limit.
//!
//! # Release
//! A guard's release or drop sends a message to its loop (a plain channel send: it works from
//! `Drop`, off the runtime, without blocking). The loop forgets the lease and sends the release
//! in a spawned task: an update that clears `lockId`, or, for an exclusive lock with a local
//! waiter, a `findAndModify` that writes the waiter's lease instead (a *transfer*, see
//! `handoff`). Either way the releasing lock id is gone, so a renewal still in flight can no
//! longer match the lease: releases and renewals need no ordering.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{ReadConcern, ReturnDocument};
use mongodb::results::UpdateResult;
use mongodb::{Collection, Namespace};
use tokio::runtime::{self, Handle};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep_until};

use super::acquire::Cleanup;
use super::handoff::{self, Handoff, Offer, Transfer};
use super::lost::LeaseState;
use super::metrics::{self, Loss};
use super::schema::{self, LIVE_LOCK_IDS, Layout};
use crate::error::{Operation, error_code, shown_name};
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
    /// Mark every lease lost, release them all, wait for every release (also those of dropped
    /// guards), answer and end.
    ShutDown { done: oneshot::Sender<()> },
}

/// Asks the renewal loop to release `lock_id` and waits for the outcome (a guard's `release`).
/// `None`: the guard already handed its lease back.
pub(crate) async fn release(
    renewals: &mpsc::UnboundedSender<Command>,
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
    if renewals.send(request).is_err() {
        return Err(ended);
    }
    answer.await.unwrap_or(Err(ended))
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
    /// The kind of lock, for metrics: `exclusive`, `read`, `write`, `semaphore`, `document`.
    pub(crate) kind: &'static str,
    pub(crate) lock_id: String,
    /// Its deadline and lost state, shared with the guard.
    pub(crate) state: Arc<LeaseState>,
    /// Identifies the lock's in-process waiters, to wake one on release.
    pub(crate) waiters: Option<handoff::Key>,
    /// For an exclusive lease: counts it as held in this process until it ends here.
    pub(crate) holding: Option<handoff::Holding>,
}

impl Lease {
    fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Why a lease whose deadline has passed is lost: `max_hold` if its hold is over, else
    /// `otherwise`.
    fn overdue(&self, otherwise: Loss) -> Loss {
        if self.state.hold_ended() {
            Loss::MaxHold
        } else {
            otherwise
        }
    }

    pub(crate) fn mark_lost(&self, loss: Loss) {
        if self.state.mark_lost() {
            tracing::warn!(lock = %shown_name(&self.name), reason = loss.describe(), "lock lost");
            metrics::lost(self.kind, loss);
        }
        // Local waiters may be able to take it: the first goes back to the busy-wait pace.
        if let Some(holding) = &self.holding {
            holding.end();
        }
    }

    /// Roughly how many bytes this lease adds to a renewal command (its `_id` and lock id appear
    /// in the filter, the lock id once more in an array-member update).
    fn command_bytes(&self) -> usize {
        let id = match &self.id {
            Bson::String(name) => name.len(),
            other => {
                mongodb::bson::to_vec(&doc! { "id": other.clone() }).map_or(64, |raw| raw.len())
            }
        };
        id + 2 * self.lock_id.len() + 32
    }
}

/// The most a renewal command carries: leases beyond it go into further commands, so no command
/// nears MongoDB's 16 MiB limit whatever the number or size of the names.
const RENEWAL_COMMAND_BYTES: usize = 2 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LoopKey {
    runtime: runtime::Id,
    namespace: Namespace,
    layout: Layout,
    /// The options, less what renewal does not use; `WriteConcern` is not `Hash`, so its debug
    /// form identifies it.
    expiry: Duration,
    cadence: Duration,
    skew: Duration,
    write_concern: String,
}

/// Where leases live and how they are renewed: what one renewal loop serves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub(crate) collection: &'a Collection<Document>,
    pub(crate) layout: &'a Layout,
    pub(crate) options: &'a LockOptions,
}

/// The renewal loops of a family of locks, one per runtime and configuration.
#[derive(Debug)]
pub(crate) struct RenewalHub {
    /// Unique in the process: the family's locks share in-process queues (see `handoff`).
    id: u64,
    loops: Mutex<HashMap<LoopKey, mpsc::UnboundedSender<Command>>>,
    /// True once the family was shut down (set while holding `loops`): no lease is held any more.
    shut_down: watch::Sender<bool>,
}

impl Default for RenewalHub {
    fn default() -> RenewalHub {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        RenewalHub {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            loops: Mutex::default(),
            shut_down: watch::Sender::new(false),
        }
    }
}

impl RenewalHub {
    /// Identifies this hub (this family of locks) in the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    fn is_shut_down(&self) -> bool {
        *self.shut_down.borrow()
    }

    /// Turns true when [`shut_down`](Self::shut_down) is called.
    pub(crate) fn shut_down_signal(&self) -> watch::Receiver<bool> {
        self.shut_down.subscribe()
    }

    /// Holds no more leases: every later [`hold`](Self::hold) releases its lease at once, and
    /// every loop marks its leases lost, releases them and waits for all its releases (also
    /// those of guards dropped earlier) before this returns.
    pub(crate) async fn shut_down(&self) {
        let loops: Vec<_> = {
            let mut loops = self.loops();
            self.shut_down.send_replace(true);
            loops.drain().map(|(_, commands)| commands).collect()
        };
        let done = loops.into_iter().filter_map(|commands| {
            let (done, finished) = oneshot::channel();
            commands.send(Command::ShutDown { done }).ok()?;
            Some(finished)
        });
        // A loop whose runtime is gone answers nothing; its leases expire by themselves.
        futures::future::join_all(done).await;
    }

    fn loops(&self) -> MutexGuard<'_, HashMap<LoopKey, mpsc::UnboundedSender<Command>>> {
        self.loops
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `lease` with the loop for `runtime` and `place`, starting the loop if there is
    /// none (or its runtime shut down). Returns the channel for later release requests. If the
    /// loop cannot take the lease, the lease is marked lost at once.
    pub(crate) fn hold(
        &self,
        runtime: &Handle,
        place: Place<'_>,
        lease: Lease,
    ) -> mpsc::UnboundedSender<Command> {
        let Place {
            collection,
            layout,
            options,
        } = place;
        let key = LoopKey {
            runtime: runtime.id(),
            namespace: collection.namespace(),
            layout: layout.clone(),
            expiry: options.expiry(),
            cadence: options.extension_cadence(),
            skew: options.max_clock_skew(),
            write_concern: format!("{:?}", options.write_concern()),
        };
        let mut loops = self.loops();
        if self.is_shut_down() {
            // Won by an attempt still in flight when the family was shut down.
            lease.mark_lost(Loss::ShutDown);
            let context = ReleaseContext {
                runtime: runtime.clone(),
                collection: collection.clone(),
                layout: layout.clone(),
                options: options.clone(),
            };
            runtime.spawn(release_lease(context, lease, None));
            return mpsc::unbounded_channel().0;
        }
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
                kind: lease.kind,
                leases: HashMap::new(),
                next_renewal: Instant::now(),
                releases: JoinSet::new(),
            };
            runtime.spawn(renewals.run(receiver));
            commands
        });
        if let Err(mpsc::error::SendError(Command::Hold(lease))) =
            commands.send(Command::Hold(lease))
        {
            // The runtime is shutting down: nobody will renew this lease.
            lease.mark_lost(Loss::LoopEnded);
        }
        commands.clone()
    }
}

/// One renewal command in flight: the lock ids it covers, when it was sent, and when to stop
/// waiting for it.
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
    /// The kind of lock of the lease that started the loop, for metrics.
    kind: &'static str,
    /// By lock id.
    leases: HashMap<String, Lease>,
    next_renewal: Instant,
    /// Releases under way.
    releases: JoinSet<()>,
}

/// The first of `tasks` to finish, with its index; never resolves when there is none (a
/// `select!` builds the futures of its disabled branches too).
async fn first_finished<'a, T: 'a>(
    tasks: impl IntoIterator<Item = &'a mut JoinHandle<T>>,
) -> (std::result::Result<T, tokio::task::JoinError>, usize) {
    let tasks: Vec<_> = tasks.into_iter().collect();
    if tasks.is_empty() {
        return std::future::pending().await;
    }
    let (result, index, _) = futures::future::select_all(tasks).await;
    (result, index)
}

impl Drop for RenewalLoop {
    /// However the loop ends (its runtime shut down, a panic), nobody renews its leases any
    /// more: their guards must know at once.
    fn drop(&mut self) {
        for lease in self.leases.values() {
            lease.mark_lost(Loss::LoopEnded);
        }
    }
}

impl RenewalLoop {
    /// Runs until every sender is gone: the hub (its locks) and all guards.
    ///
    /// Every cadence, a round of renewals goes out: one command per chunk of leases. While a
    /// round is unanswered the next one waits, so a slow server gets no extra load, but only
    /// until the unanswered commands are three quarters of the way to the earliest deadline they
    /// serve: a command hung on a half-open connection then stays in flight (until that
    /// deadline) while the next round reaches the server on other connections. Whichever
    /// confirms a lease first extends it.
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut in_flight: Vec<Renewal> = Vec::new();
        loop {
            let overdue_at = self.earliest_deadline();
            let renew_due = self.leases.values().any(|l| !l.is_lost());
            let renew_at = in_flight
                .iter()
                .map(|renewal| self.suspect_at(renewal))
                .max()
                .map_or(self.next_renewal, |suspect| suspect.max(self.next_renewal));
            let give_up_at = in_flight
                .iter()
                .map(|renewal| self.give_up_at(renewal))
                .min();
            tokio::select! {
                command = commands.recv() => match command.map(|command| self.handle(command)) {
                    Some(None) => {}
                    Some(Some(done)) => {
                        self.shut_down(std::mem::take(&mut in_flight)).await;
                        let _ = done.send(());
                        break;
                    }
                    // Every lock and guard is gone; the releases they asked for are not (a
                    // `JoinSet` would abort them when dropped).
                    None => {
                        while self.releases.join_next().await.is_some() {}
                        break;
                    }
                },
                Some(_) = self.releases.join_next(), if !self.releases.is_empty() => {}
                (result, index) = first_finished(in_flight.iter_mut().map(|renewal| &mut renewal.call)) => {
                    let renewal = in_flight.swap_remove(index);
                    self.renewed(&renewal, result);
                }
                () = sleep_until(renew_at), if renew_due => {
                    in_flight.extend(self.start_round());
                }
                () = sleep_until(give_up_at.unwrap_or_else(Instant::now)), if give_up_at.is_some() => {
                    self.give_up(&mut in_flight);
                }
                () = sleep_until(overdue_at.unwrap_or_else(Instant::now)), if overdue_at.is_some() => {
                    self.expire_overdue();
                }
            }
        }
    }

    /// When an unanswered renewal stops being waited for: at the earliest current deadline of
    /// the leases it serves (other rounds may have moved them), and at the latest when even a
    /// reply could no longer extend them (`sent_at` + the lease's lifetime).
    fn give_up_at(&self, renewal: &Renewal) -> Instant {
        let latest = renewal.sent_at + self.options.lease_lifetime();
        renewal
            .lock_ids
            .iter()
            .filter_map(|lock_id| self.leases.get(lock_id)?.state.lost_at())
            .min()
            .map_or(renewal.sent_at, |deadline| deadline.min(latest))
    }

    /// Three quarters of the way from sending `renewal` to giving it up: if it is still
    /// unanswered then, the next round need not wait for it.
    fn suspect_at(&self, renewal: &Renewal) -> Instant {
        let patience = self
            .give_up_at(renewal)
            .saturating_duration_since(renewal.sent_at);
        renewal.sent_at + patience * 3 / 4
    }

    fn earliest_deadline(&self) -> Option<Instant> {
        self.leases
            .values()
            .filter_map(|lease| lease.state.lost_at())
            .min()
    }

    /// Carries out `command`; a shutdown is left to the caller: the channel to answer it on.
    fn handle(&mut self, command: Command) -> Option<oneshot::Sender<()>> {
        match command {
            Command::ShutDown { done } => return Some(done),
            Command::Hold(lease) => {
                // A cadence after the acquisition was sent (a slow reply may have eaten into
                // the lease), and no later than the round already planned for the others.
                let renew_by = lease.state.lost_at().map_or_else(Instant::now, |lost_at| {
                    lost_at - self.options.lease_lifetime() + self.options.extension_cadence()
                });
                let others_live = self.leases.values().any(|l| !l.is_lost());
                self.next_renewal = if others_live {
                    self.next_renewal.min(renew_by)
                } else {
                    renew_by
                };
                self.leases.insert(lease.lock_id.clone(), lease);
            }
            Command::Forget { lock_id } => {
                if let Some(lease) = self.leases.remove(&lock_id) {
                    lease.state.mark_released();
                }
            }
            Command::Release { lock_id, reply } => match self.leases.remove(&lock_id) {
                Some(lease) => {
                    // Its deadline may have passed before this loop got to report it.
                    if lease.is_lost() {
                        lease.mark_lost(lease.overdue(Loss::Deadline));
                    }
                    self.release(lease, reply);
                }
                None => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(Error::BackgroundTaskEnded {
                            operation: Operation::Release,
                        }));
                    }
                }
            },
        }
        None
    }

    fn release(&mut self, lease: Lease, reply: Option<ReleaseReply>) {
        let context = ReleaseContext {
            runtime: self.runtime.clone(),
            collection: self.collection.clone(),
            layout: self.layout.clone(),
            options: self.options.clone(),
        };
        self.releases
            .spawn_on(release_lease(context, lease, reply), &self.runtime);
    }

    /// Marks every lease lost (so none is transferred), releases them all and waits for every
    /// release under way.
    async fn shut_down(&mut self, in_flight: Vec<Renewal>) {
        for renewal in in_flight {
            renewal.call.abort();
        }
        for (_, lease) in std::mem::take(&mut self.leases) {
            lease.mark_lost(Loss::ShutDown);
            self.release(lease, None);
        }
        while self.releases.join_next().await.is_some() {}
    }

    /// Sends one renewal command per chunk of live leases.
    fn start_round(&mut self) -> Vec<Renewal> {
        let sent_at = Instant::now();
        self.next_renewal = sent_at + self.options.extension_cadence();
        let mut chunks: Vec<Vec<&Lease>> = Vec::new();
        let mut chunk_bytes = 0;
        for lease in self.leases.values().filter(|lease| !lease.is_lost()) {
            let bytes = lease.command_bytes();
            match chunks.last_mut() {
                Some(chunk) if chunk_bytes + bytes <= RENEWAL_COMMAND_BYTES => {
                    chunk.push(lease);
                    chunk_bytes += bytes;
                }
                _ => {
                    chunks.push(vec![lease]);
                    chunk_bytes = bytes;
                }
            }
        }
        chunks
            .into_iter()
            .map(|chunk| self.send_renewal(sent_at, &chunk))
            .collect()
    }

    /// Renews `chunk` in a spawned task, waited for until the earliest deadline it serves (see
    /// `give_up_at`): after that its answer could not save that lease, and a call hung on a
    /// half-open connection (the driver has no socket timeout) must not live on.
    fn send_renewal(&self, sent_at: Instant, chunk: &[&Lease]) -> Renewal {
        let (ids, lock_ids): (Vec<Bson>, Vec<String>) = chunk
            .iter()
            .map(|lease| (lease.id.clone(), lease.lock_id.clone()))
            .unzip();
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
        renewal: &Renewal,
        result: std::result::Result<mongodb::error::Result<Renewed>, tokio::task::JoinError>,
    ) {
        let succeeded = matches!(result, Ok(Ok(_)));
        metrics::renewal(self.kind, renewal.sent_at.elapsed(), succeeded);
        let failure = match result {
            Ok(Ok(renewed)) => {
                let lost_at = self.options.lost_deadline(renewal.sent_at);
                for lock_id in &renewal.lock_ids {
                    let Some(lease) = self.leases.get(lock_id) else {
                        continue; // released meanwhile
                    };
                    let live = match &renewed {
                        Renewed::All => true,
                        Renewed::Only(live) => live.contains(lock_id),
                    };
                    if !live {
                        lease.mark_lost(Loss::Gone);
                    } else if !lease.state.extend(lost_at) {
                        lease.mark_lost(lease.overdue(Loss::LateConfirmation));
                    }
                }
                return;
            }
            Ok(Err(error)) => error.to_string(),
            Err(join_error) => join_error.to_string(),
        };
        self.retry_soon(renewal, &failure);
    }

    /// Stops waiting for the renewals that outlived their time (their tasks are aborted, which
    /// closes their connections) and renews their other leases at once, on other connections.
    fn give_up(&mut self, in_flight: &mut Vec<Renewal>) {
        let now = Instant::now();
        let (late, on_time): (Vec<Renewal>, Vec<Renewal>) = in_flight
            .drain(..)
            .partition(|renewal| self.give_up_at(renewal) <= now);
        *in_flight = on_time;
        for renewal in late {
            renewal.call.abort();
            metrics::renewal(self.kind, now - renewal.sent_at, false);
            let still_held = renewal.lock_ids.iter().any(|lock_id| {
                self.leases
                    .get(lock_id)
                    .is_some_and(|lease| !lease.is_lost())
            });
            if still_held {
                let waited = now - renewal.sent_at;
                self.retry_soon(&renewal, &format!("no reply within {waited:?}"));
                self.next_renewal = now;
            }
        }
    }

    fn retry_soon(&mut self, renewal: &Renewal, failure: &str) {
        let retry_delay = retry_delay(&self.options);
        tracing::warn!(
            collection = %self.collection.name(),
            leases = renewal.lock_ids.len(),
            error = %failure,
            "lease renewal failed; retrying until each lease's deadline"
        );
        self.next_renewal = self.next_renewal.min(Instant::now() + retry_delay);
    }

    fn expire_overdue(&mut self) {
        for lease in self.leases.values() {
            if lease.state.lost_at().is_none() {
                lease.mark_lost(lease.overdue(Loss::Deadline));
            }
        }
    }
}

/// NotAReplicaSet: the server is a standalone.
const NOT_A_REPLICA_SET: i32 = 123;

/// How long to wait before retrying a failed renewal or release.
fn retry_delay(options: &LockOptions) -> Duration {
    (options.extension_cadence() / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// How long one release command is waited for before it is sent again: a quarter of the
/// expiry, at least a second.
fn release_call_limit(options: &LockOptions) -> Duration {
    (options.expiry() / 4).max(Duration::from_secs(1))
}

/// Renews every listed lease that is still ours and live, in one command; only when some did not
/// match does a second command find out which. That read goes to the primary with read concern
/// `linearizable`: a secondary, or a primary deposed without knowing it yet, could show a lease
/// as ours and live after the real primary gave it away.
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
    let read = |concern: ReadConcern| {
        collection
            .aggregate(layout.live_lock_ids(ids, lock_ids))
            .selection_criteria(schema::primary())
            .read_concern(concern)
    };
    let cursor = match read(ReadConcern::linearizable()).await {
        // A standalone server refuses `linearizable`; with no secondary and no other primary,
        // `local` is exact there.
        Err(error) if error_code(&error) == Some(NOT_A_REPLICA_SET) => {
            read(ReadConcern::local()).await?
        }
        other => other?,
    };
    let rows: Vec<Document> = cursor.try_collect().await?;
    let live = rows
        .iter()
        .filter_map(|row| row.get_array(LIVE_LOCK_IDS).ok())
        .flatten()
        .filter_map(|lock_id| lock_id.as_str().map(str::to_owned))
        .collect();
    Ok(Renewed::Only(live))
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
}

/// Sends the release update with `send` and waits for the outcome until `started + expiry`.
///
/// A try that fails transiently (an election, a lost reply) is sent again after a short delay.
/// A try without a reply after a quarter of the expiry (at least 1 s) is not given up, but a
/// second one goes out beside it, on another connection: a half-open connection must not keep
/// the lease alive until it expires, and whichever try matches tells that the lease was ours.
async fn release_outcome<T, S>(
    options: &LockOptions,
    started: Instant,
    send: S,
    matched: impl Fn(&T) -> bool,
) -> Released<T>
where
    S: Fn() -> JoinHandle<mongodb::error::Result<T>>,
{
    let deadline = started + options.expiry();
    let mut calls = vec![send()];
    let mut resend_at = Some(Instant::now() + release_call_limit(options));
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
                        let retry_at = Instant::now() + retry_delay(options);
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
            () = sleep_until(resend.unwrap_or(deadline)), if resend.is_some() => {
                calls.push(send());
                resend_at = Some(Instant::now() + release_call_limit(options));
            }
            () = sleep_until(deadline) => break uncertain.map_or(Released::NoReply, Released::Unknown),
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
    // Lost before the release was sent: the release still goes out (it never touches another
    // holder's lease), but the caller must hear that the lock was not held throughout.
    let lost_before = lease.is_lost();
    let handoff = match (&lease.waiters, layout) {
        (Some(waiters), Layout::LockDocument) if !lost_before => {
            handoff::handoff(waiters, options.write_concern())
        }
        _ => Handoff::Wake,
    };
    let wake = match handoff {
        Handoff::Transfer(offer) => return transfer(context, lease, offer, started).await,
        Handoff::Wake => lease.waiters.as_ref(),
        Handoff::LetOthersIn => None,
    };
    let filter = layout.release_filter(&lease.id, &lease.lock_id);
    let update = layout.release_update(&lease.lock_id);
    let send = || {
        let (collection, filter, update) = (collection.clone(), filter.clone(), update.clone());
        let write_concern = options.write_concern().clone();
        runtime.spawn(async move {
            collection
                .update_one(filter, update)
                .write_concern(write_concern)
                .await
        })
    };
    let matched = |result: &UpdateResult| result.matched_count > 0;
    let outcome = release_outcome(options, started, send, matched).await;
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

/// What a release's outcome means for its caller: `Ok` when it ended our lease.
fn released<T>(lease: &Lease, started: Instant, outcome: Released<T>) -> Result<T> {
    match outcome {
        Released::Ours(reply) => Ok(reply),
        Released::NotOurs => {
            lease.mark_lost(Loss::GoneAtRelease);
            Err(Error::LockLost {
                name: lease.name.clone(),
            })
        }
        Released::Unknown(error) => Err(error),
        Released::NoReply => Err(Error::Timeout {
            operation: Operation::Release,
            name: lease.name.clone(),
            waited: started.elapsed(),
        }),
    }
}

/// Releases an exclusive `lease` by handing it over to a local waiter's `offer`, in one
/// `findAndModify`: filtered by our lock id (or the waiter's, should an earlier try have
/// applied), it writes the waiter's lock id, a fresh lease and the next fencing token, exactly
/// as the waiter's own attempt would on a free lock. When that command returns, the waiter
/// holds the lock.
///
/// If the outcome stays unknown, the waiter's lease (if the command took effect) is ended at
/// once with a cleanup filtered by its lock id, and the waiter goes on waiting.
async fn transfer(
    context: &ReleaseContext,
    lease: &Lease,
    offer: Offer,
    started: Instant,
) -> Result<()> {
    let ReleaseContext {
        runtime,
        collection,
        layout,
        options,
    } = context;
    let Offer {
        lock_id,
        update,
        deliver,
        ..
    } = offer;
    let filter = doc! {
        schema::ID: lease.id.clone(),
        schema::LOCK_ID: { "$in": [&lease.lock_id, &lock_id] },
    };
    let update = update(&lease.lock_id);
    let send = || {
        let (collection, filter, update) = (collection.clone(), filter.clone(), update.clone());
        let write_concern = options.write_concern().clone();
        runtime.spawn(async move {
            collection
                .find_one_and_update(filter, update)
                .return_document(ReturnDocument::After)
                .write_concern(write_concern)
                .await
        })
    };
    let outcome = release_outcome(options, started, send, Option::is_some).await;
    let unknown = matches!(outcome, Released::Unknown(_) | Released::NoReply);
    match released(lease, started, outcome) {
        Ok(document) => {
            lease.state.mark_released();
            tracing::debug!(lock = %shown_name(&lease.name), "released to a local waiter");
            let document = document.unwrap_or_default();
            // Every try was sent at or after `started`: the lease lasts at least from then.
            deliver(Transfer::Done {
                document,
                sent_at: started,
            });
            Ok(())
        }
        Err(error) => {
            if unknown {
                Cleanup {
                    collection: collection.clone(),
                    filter: layout.release_filter(&lease.id, &lock_id),
                    update: layout.release_update(&lock_id),
                    options: options.clone(),
                    name: lease.name.clone(),
                }
                .spawn(runtime);
            }
            deliver(Transfer::NotDone);
            Err(error)
        }
    }
}
