//! Lease renewal and loss detection for held locks.
//!
//! Guards do not each run a task. Every held lease is in the table of a *renewal loop*: one task
//! per (Tokio runtime, collection, layout, expiry, cadence, clock skew, write concern) within a
//! family (`family::Family`), which renews all its leases with a few commands per cadence, whatever their
//! number. A family is shared by the locks of one [`Provider`](crate::Provider) (and by clones of
//! one [`MongoDistributedLock`](crate::MongoDistributedLock)); a `mongodb::Client` has no public
//! identity, so sharing never crosses what the application itself tied together.
//!
//! # A round of renewals
//! Every cadence, one lease is renewed alone by a `findAndModify` whose reply also tells the
//! server's clock (its new `expiresAt` minus `expiry`), and the others by `update` commands of
//! at most 2 MiB of ids each, so no command nears MongoDB's size limit. When an `update` matches
//! fewer documents than it renews leases, an `aggregate` reads back which are still ours (the
//! readers of one reader-writer lock share a document, so counts alone cannot tell). A document
//! lock's collection may be sharded on a key other than `_id`, and before MongoDB 7.0 a
//! `findAndModify` there needs the shard key: when the server says so, the loop renews with
//! `update` commands only (they accept a filter on `_id`), without reading the server's clock.
//! The commands and how their replies are read are in `renewal_commands`.
//!
//! # Writes held back by transactions
//! On MongoDB a write to a document that an open transaction has written waits until that
//! transaction ends. A renewal must not wait behind someone else's transaction (an application's
//! transaction on a locked document, another reader's lease-checked transaction): every renewal
//! carries a server-side time limit (`maxTimeMS`), at most a third of what is left of the lease
//! budget after a cadence and never past the earliest local deadline of its leases. When a command
//! renewing many leases runs out of time, its leases are renewed at once in commands of at most
//! 32 leases, and the leases of such a command that runs out of time again are renewed alone; a
//! lease whose own command runs out of time stays alone until it is renewed. Three time limits in
//! a row thus fit in a lease budget, and the leases of the other documents go on being renewed. The time limit also means that a renewal whose `$$NOW` was
//! fixed before it waited cannot extend a lease that ended meanwhile: it is aborted before its
//! leases' local deadlines. A lease inside a lease-checked transaction of its own holder is
//! renewed by that transaction only, never by the loop (its document is the transaction's).
//!
//! # Loss detection
//! The decisions below (the deadlines, the extension rule, when rounds go out and when an
//! unanswered one is given up) are made by the state machines of `protocol`, which the model
//! checker drives too; this loop does the I/O.
//!
//! Each confirmed acquire or renew request was *sent* at some instant `t` on the client's
//! suspend-aware clock (see `clock`). The server computed `expiresAt` after receiving it, so the
//! lease lasts until at least `t + expiry` by a clock running at that server's rate; another
//! client's router may see it end up to `max_clock_skew` earlier. A lease counts as lost at
//! `t + expiry - margin - skew` (`protocol::Lease`, checked by whoever asks, see `lost`) unless a later renewal was confirmed first, and also as soon as a renewal finds it
//! gone (deleted, taken over, or already expired), when the loop ends, and when the server's
//! clock is seen to jump: if between two `findAndModify` replies the server's clock advanced by
//! more than the local time between the first one's send and the second one's reply plus
//! `max_clock_skew` and the safety margin, a lease written before the jump may have ended early
//! in real time, and every lease of the loop is reported lost. With [`LockOptions::max_hold`],
//! no deadline moves past the acquisition's send instant + `max_hold`.
//!
//! # Hung calls
//! The driver has no socket timeout: a command on a half-open connection can wait for many
//! minutes. A round of renewals waits for the previous one only until that one's commands are
//! three quarters of the way to the earliest deadline they serve; then it goes out on other
//! connections, so a hung command cannot make leases lapse. Each command is given up (aborted,
//! which closes its connection) at the earliest deadline it serves.
//!
//! # Release
//! A guard's release or drop sends a message to its loop (a plain channel send: it works from
//! `Drop`, off the runtime, without blocking). The loop takes the lease out of its table and
//! releases it in a task of its own (see `release`). Either way the releasing lock id is gone,
//! so a renewal still in flight can no longer match the lease: releases and renewals need no
//! ordering.
//!
//! [`LockOptions::max_hold`]: crate::LockOptions::max_hold

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Bson;
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::sleep_until;

use super::in_flight::InFlight;
use super::lost::Loss;
use super::metrics;
use super::protocol::{Renewals, Sent, give_up_at, suspect_at};
use super::record::{Lease, LeaseTable, Place};
use super::release::{ReleaseContext, ReleaseReply, first_finished};
use super::renewal_commands::{Failure, MAX_TIME_LIMIT, Renewed, Reply, renew_many, renew_one};
use crate::clock;
use crate::error::{Error, Operation, shown_name};
use crate::lock_status::LockKind;

/// What a guard (or the family) tells a renewal loop.
#[derive(Debug)]
pub(crate) enum Command {
    /// A lease was added to the loop's table: renew it.
    Held { lock_id: String },
    /// Forget the lease with this lock id and release it; answer if asked.
    Release {
        lock_id: String,
        reply: Option<ReleaseReply>,
    },
    /// Forget the lease: its guard ended it itself (a document lock's commit).
    Forget { lock_id: String },
    /// The holder found the lease gone (its `extend` matched nothing): report the loss.
    Gone { lock_id: String },
    /// The family was shut down (it took the leases): stop renewing and end.
    ShutDown,
}

/// Starts the renewal loop of `leases` on `runtime`; returns its command channel.
pub(crate) fn start(
    runtime: &Handle,
    place: Place,
    kind: LockKind,
    leases: Arc<LeaseTable>,
    in_flight: Arc<InFlight>,
) -> mpsc::UnboundedSender<Command> {
    let (commands, receiver) = mpsc::unbounded_channel();
    // A cadence away: its first lease's `Held` brings it forward if need be, and an earlier
    // round would renew a lease just acquired.
    let schedule = Renewals::new(clock::now() + place.options.extension_cadence());
    let renewals = RenewalLoop {
        runtime: runtime.clone(),
        place,
        kind,
        leases,
        in_flight,
        schedule,
        releases: JoinSet::new(),
        limits: HashMap::new(),
        clock: None,
        reads_clock: true,
    };
    runtime.spawn(renewals.run(receiver));
    commands
}

/// The most a renewal command carries: leases beyond it go into further commands, so no command
/// nears MongoDB's 16 MiB limit whatever the number or size of the names.
const RENEWAL_COMMAND_BYTES: usize = 2 << 20;

/// The most leases in the command that retries those of a larger one that ran out of time.
const SPLIT_COMMAND_LEASES: usize = 32;

/// One renewal command in flight: the lock ids it covers, when it was sent, and its task.
struct Renewal {
    sent: Sent<clock::Instant>,
    lock_ids: Vec<String>,
    call: JoinHandle<std::result::Result<Reply, Failure>>,
}

/// A reading of the server's clock: its time in ms, and when the command that read it was sent.
#[derive(Clone, Copy, Debug)]
struct ServerClock {
    millis: i64,
    sent_at: clock::Instant,
}

struct RenewalLoop {
    runtime: Handle,
    place: Place,
    /// The kind of lock of the lease that started the loop, for metrics.
    kind: LockKind,
    leases: Arc<LeaseTable>,
    in_flight: Arc<InFlight>,
    /// When the next round goes out (decided in `protocol`).
    schedule: Renewals<clock::Instant>,
    /// Releases under way.
    releases: JoinSet<()>,
    /// Leases renewed in small commands (of at most this many leases): their last command ran
    /// out of time (their document may be held back by a transaction), so they must not hold
    /// the others back. A lease leaves this map once a command renewing it succeeds.
    limits: HashMap<String, usize>,
    /// The last reading of the server's clock.
    clock: Option<ServerClock>,
    /// Whether a single lease is renewed with a `findAndModify`, which reads the server's clock.
    /// Turned off for good when the server refuses one because the collection is sharded on a
    /// key other than `_id`; the loop then renews with `update` commands only (which accept a
    /// filter on `_id` on every version) and cannot see the server's clock jump.
    reads_clock: bool,
}

impl Drop for RenewalLoop {
    /// However the loop ends (its runtime shut down, a panic), nobody renews its leases any
    /// more: their guards must know at once. The leases stay in the table, so that the family's
    /// shutdown (or its next lease, which finds the loop gone) can still release them.
    fn drop(&mut self) {
        for lease in self.leases.lock().values() {
            lease.mark_lost(Loss::LoopEnded);
        }
    }
}

impl RenewalLoop {
    /// Runs until told to shut down or every sender is gone (the family and all guards).
    ///
    /// Every cadence, a round of renewals goes out. While a round is unanswered the next one
    /// waits, so a slow server gets no extra load, but only until the unanswered commands are
    /// three quarters of the way to the earliest deadline they serve: a command hung on a
    /// half-open connection then stays in flight (until that deadline) while the next round
    /// reaches the server on other connections. Whichever confirms a lease first extends it.
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut in_flight: Vec<Renewal> = Vec::new();
        loop {
            let (overdue_at, renew_due) = {
                let leases = self.leases.lock();
                // (A deadline that passed while the loop was busy elsewhere counts as due now.)
                let overdue_at = leases
                    .values()
                    .filter_map(|lease| lease.state.report_loss_at())
                    .min();
                let renews = self.place.options.auto_renew();
                (overdue_at, renews && leases.values().any(renewable))
            };
            if !renew_due {
                // Nothing to renew: the next reading of the server's clock starts afresh.
                self.clock = None;
            }
            let renew_at = self.schedule.due_at(
                in_flight
                    .iter()
                    .map(|renewal| suspect_at(renewal.sent, self.give_up_at(renewal))),
            );
            let give_up_at = in_flight
                .iter()
                .map(|renewal| self.give_up_at(renewal))
                .min();
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::ShutDown) => {
                        for renewal in in_flight {
                            renewal.call.abort();
                        }
                        break;
                    }
                    Some(command) => self.handle(command),
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
                () = sleep_until(clock::wake_toward(renew_at)), if renew_due => {
                    if clock::now() >= renew_at {
                        in_flight.extend(self.start_round());
                    }
                }
                () = sleep_until(clock::wake_toward(give_up_at.unwrap_or_else(clock::now))), if give_up_at.is_some() => {
                    self.give_up(&mut in_flight);
                }
                () = sleep_until(clock::wake_toward(overdue_at.unwrap_or_else(clock::now))), if overdue_at.is_some() => {
                    self.expire_overdue();
                }
            }
        }
        // Releases already under way finish on their own (they are tracked work of the family).
        self.releases.detach_all();
    }

    /// When an unanswered renewal stops being waited for ([`give_up_at`]), given the current
    /// deadlines of the leases it serves (other rounds may have moved them).
    fn give_up_at(&self, renewal: &Renewal) -> clock::Instant {
        let leases = self.leases.lock();
        let earliest = renewal
            .lock_ids
            .iter()
            .filter_map(|lock_id| leases.get(lock_id)?.state.lost_at())
            .min();
        give_up_at(&self.place.options, renewal.sent, earliest)
    }

    fn handle(&mut self, command: Command) {
        let options = &self.place.options;
        match command {
            Command::ShutDown => {}
            // Nothing renews the leases of a loop without auto_renew.
            Command::Held { .. } if !options.auto_renew() => {}
            Command::Held { lock_id } => {
                let leases = self.leases.lock();
                let Some(lease) = leases.get(&lock_id) else {
                    return;
                };
                // A cadence after the acquisition was sent (a slow reply may have eaten into
                // the lease), and no later than the round already planned for the others.
                let renew_by = lease.state.renew_by(options).unwrap_or_else(clock::now);
                let others_live = leases
                    .values()
                    .any(|other| other.lock_id != lock_id && renewable(other));
                self.schedule.lease_added(renew_by, others_live);
            }
            Command::Gone { lock_id } => {
                if let Some(lease) = self.leases.lock().get(&lock_id) {
                    lease.mark_lost(Loss::Gone);
                }
            }
            Command::Forget { lock_id } => {
                self.limits.remove(&lock_id);
                if let Some(lease) = self.leases.lock().remove(&lock_id) {
                    lease.state.mark_released();
                }
            }
            Command::Release { lock_id, reply } => {
                self.limits.remove(&lock_id);
                let lease = self.leases.lock().remove(&lock_id);
                match lease {
                    Some(lease) => {
                        // Its deadline may have passed before this loop got to report it.
                        if lease.is_lost() {
                            lease.mark_lost(lease.overdue(self.deadline_loss()));
                        }
                        let context = ReleaseContext {
                            runtime: self.runtime.clone(),
                            place: self.place.clone(),
                            in_flight: Arc::clone(&self.in_flight),
                        };
                        let release = context.spawn(lease, reply);
                        self.releases.spawn_on(
                            async move {
                                let _ = release.await;
                            },
                            &self.runtime,
                        );
                    }
                    None => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(Error::BackgroundTaskEnded {
                                operation: Operation::Release,
                            }));
                        }
                    }
                }
            }
        }
    }

    /// Sends one round of renewal commands: a `findAndModify` for one lease (it reads the
    /// server's clock) and for each lease renewed alone, `update` commands for the others (the
    /// leases with a limit in commands of that many at most).
    fn start_round(&mut self) -> Vec<Renewal> {
        let sent = self.schedule.round_sent(&self.place.options, clock::now());
        let mut chunks: Vec<Vec<(Bson, String, clock::Instant)>> = Vec::new();
        {
            let leases = self.leases.lock();
            let mut batch: Vec<(Bson, String, clock::Instant)> = Vec::new();
            let mut batch_bytes = 0;
            let mut batched: Vec<&Lease> = Vec::new();
            let mut limited: HashMap<usize, Vec<(Bson, String, clock::Instant)>> = HashMap::new();
            for lease in leases.values().filter(|lease| renewable(lease)) {
                match self.limits.get(&lease.lock_id) {
                    Some(&limit) => limited.entry(limit).or_default().push(entry(lease)),
                    None => batched.push(lease),
                }
            }
            for (limit, entries) in limited {
                let mut entries = entries.into_iter().peekable();
                while entries.peek().is_some() {
                    chunks.push(entries.by_ref().take(limit.max(1)).collect());
                }
            }
            // The first lease of the batch goes alone: its reply reads the server's clock.
            let mut batched = batched.into_iter();
            if let Some(probe) = batched.next() {
                chunks.push(vec![entry(probe)]);
            }
            for lease in batched {
                let bytes = lease.command_bytes();
                if !batch.is_empty() && batch_bytes + bytes > RENEWAL_COMMAND_BYTES {
                    chunks.push(std::mem::take(&mut batch));
                    batch_bytes = 0;
                }
                batch.push(entry(lease));
                batch_bytes += bytes;
            }
            if !batch.is_empty() {
                chunks.push(batch);
            }
        }
        chunks
            .into_iter()
            .map(|chunk| self.send_renewal(sent, chunk))
            .collect()
    }

    /// Renews `chunk` (`_id`, lock id and current deadline of each lease) in a spawned task,
    /// with a server-side time limit: at most a third of what the lease budget leaves after a
    /// cadence (so a command, its split into smaller ones and their split into single leases
    /// fit), and never past the earliest deadline it serves (a renewal that waited on the server
    /// beyond that could not save that lease, and must not extend it with a `$$NOW` fixed
    /// before the wait). With a cadence close to the lease's lifetime, that leaves little time:
    /// a renewal that waits on the server is given up soon.
    fn send_renewal(
        &self,
        sent: Sent<clock::Instant>,
        chunk: Vec<(Bson, String, clock::Instant)>,
    ) -> Renewal {
        let sent_at = sent.at();
        let options = &self.place.options;
        let earliest = chunk.iter().map(|(_, _, deadline)| *deadline).min();
        let budget = options
            .lease_lifetime()
            .saturating_sub(options.extension_cadence())
            / 3;
        let time_limit = earliest
            .map_or(budget, |deadline| {
                budget.min(deadline.saturating_duration_since(sent_at))
            })
            .clamp(Duration::from_millis(1), MAX_TIME_LIMIT);
        let (ids, lock_ids): (Vec<Bson>, Vec<String>) = chunk
            .into_iter()
            .map(|(id, lock_id, _)| (id, lock_id))
            .unzip();
        let place = self.place.clone();
        let renewing = lock_ids.clone();
        let reads_clock = self.reads_clock;
        let call = self.runtime.spawn(async move {
            match (ids.as_slice(), renewing.as_slice()) {
                ([id], [lock_id]) if reads_clock => {
                    renew_one(&place, id, lock_id, time_limit).await
                }
                _ => renew_many(&place, &ids, &renewing, time_limit).await,
            }
        });
        Renewal {
            sent,
            lock_ids,
            call,
        }
    }

    fn renewed(
        &mut self,
        renewal: &Renewal,
        result: std::result::Result<std::result::Result<Reply, Failure>, tokio::task::JoinError>,
    ) {
        let succeeded = matches!(result, Ok(Ok(_)));
        metrics::renewal(
            self.kind,
            clock::now().saturating_duration_since(renewal.sent.at()),
            succeeded,
        );
        let failure = match result {
            Ok(Ok(reply)) => {
                for lock_id in &renewal.lock_ids {
                    self.limits.remove(lock_id);
                }
                if let Some(millis) = reply.server_millis
                    && self.server_clock_jumped(renewal.sent.at(), millis, reply.received_at)
                {
                    return;
                }
                let options = &self.place.options;
                let warn_below = self.place.options.renewal_warning();
                let leases = self.leases.lock();
                for lock_id in &renewal.lock_ids {
                    let Some(lease) = leases.get(lock_id) else {
                        continue; // released meanwhile
                    };
                    let live = match &reply.renewed {
                        Renewed::All => true,
                        Renewed::Only(live) => live.contains(lock_id),
                    };
                    if live && let Some(deadline) = lease.state.lost_at() {
                        // What was left of the lease when its renewal came back: an early warning.
                        let left = deadline.saturating_duration_since(reply.received_at);
                        metrics::lease_left(self.kind, left);
                        if left < warn_below {
                            tracing::warn!(
                                lock = %shown_name(&lease.name),
                                ?left,
                                ?warn_below,
                                "a renewal confirmed a lease with little of it left: renewals \
                                 are late (a slow server or network, a starved process?)"
                            );
                        }
                    }
                    if !live {
                        lease.mark_lost(Loss::Gone);
                    } else if !lease.state.confirmed(options, renewal.sent) {
                        lease.mark_lost(lease.overdue(Loss::LateConfirmation));
                    }
                }
                return;
            }
            Ok(Err(Failure::TimeLimit)) => {
                // Held back on the server: its leases go again at once in smaller commands (of
                // 32 leases, then alone), so that one held-back document cannot hold the
                // others back.
                let count = renewal.lock_ids.len();
                let limit = if count > SPLIT_COMMAND_LEASES {
                    SPLIT_COMMAND_LEASES
                } else {
                    1
                };
                let leases = self.leases.lock();
                for lock_id in &renewal.lock_ids {
                    if leases.contains_key(lock_id) {
                        self.limits.insert(lock_id.clone(), limit);
                    }
                }
                drop(leases);
                if count > 1 {
                    tracing::debug!(
                        collection = %self.place.collection.name(),
                        leases = count,
                        at_most = limit,
                        "a renewal ran out of its time limit; renewing its leases in smaller commands"
                    );
                    self.schedule.renew_now(clock::now());
                    return;
                }
                "it ran out of its time limit on the server (is its document held back by a \
                 transaction?)"
                    .to_owned()
            }
            Ok(Err(Failure::ShardKeyRequired)) => {
                if self.reads_clock {
                    self.reads_clock = false;
                    tracing::info!(
                        collection = %self.place.collection.name(),
                        "the collection is sharded on a key other than _id: leases are renewed \
                         with update commands only, without reading the server's clock"
                    );
                    self.schedule.renew_now(clock::now());
                    return;
                }
                "the server asks for the shard key".to_owned()
            }
            Ok(Err(Failure::Other(error))) => error,
            Err(join_error) => join_error.to_string(),
        };
        self.retry_soon(renewal, &failure);
    }

    /// Whether the server's clock, read at `millis` by a command sent at `sent_at` and answered
    /// at `received_at`, advanced since the last reading by more than the local time between the
    /// two (plus `max_clock_skew` and the safety margin). If so, every lease of the loop is
    /// reported lost: a lease written before the jump may have ended early in real time.
    fn server_clock_jumped(
        &mut self,
        sent_at: clock::Instant,
        millis: i64,
        received_at: clock::Instant,
    ) -> bool {
        let reading = ServerClock { millis, sent_at };
        let Some(last) = self.clock else {
            self.clock = Some(reading);
            return false;
        };
        if sent_at < last.sent_at {
            return false; // an older command answered late
        }
        self.clock = Some(reading);
        let options = &self.place.options;
        if sent_at.saturating_duration_since(last.sent_at) > options.lease_lifetime() {
            // Readings further apart than a lease lasts (the rounds between failed) cannot tell
            // whether a jump came before or after the leases held now were written, and slow
            // drift adds up: start afresh.
            return false;
        }
        let local = received_at.saturating_duration_since(last.sent_at)
            + options.max_clock_skew()
            + options.safety_margin();
        let local_millis = i64::try_from(local.as_millis()).unwrap_or(i64::MAX);
        let advanced = millis.saturating_sub(last.millis);
        if advanced <= local_millis {
            return false;
        }
        tracing::warn!(
            collection = %self.place.collection.name(),
            server_advanced_ms = advanced,
            allowed_ms = local_millis,
            "the server's clock jumped forward by more than max_clock_skew: leases may have ended early"
        );
        for lease in self.leases.lock().values() {
            if !lease.is_lost() {
                lease.mark_lost(Loss::ClockJump);
            }
        }
        true
    }

    /// Stops waiting for the renewals that outlived their time (their tasks are aborted, which
    /// closes their connections) and renews their other leases at once, on other connections.
    fn give_up(&mut self, in_flight: &mut Vec<Renewal>) {
        let now = clock::now();
        let (late, on_time): (Vec<Renewal>, Vec<Renewal>) = in_flight
            .drain(..)
            .partition(|renewal| self.give_up_at(renewal) <= now);
        *in_flight = on_time;
        for renewal in late {
            renewal.call.abort();
            metrics::renewal(
                self.kind,
                now.saturating_duration_since(renewal.sent.at()),
                false,
            );
            let still_held = {
                let leases = self.leases.lock();
                renewal
                    .lock_ids
                    .iter()
                    .any(|lock_id| leases.get(lock_id).is_some_and(|lease| !lease.is_lost()))
            };
            if still_held {
                let waited = now.saturating_duration_since(renewal.sent.at());
                self.retry_soon(&renewal, &format!("no reply within {waited:?}"));
                self.schedule.renew_now(now);
            }
        }
    }

    fn retry_soon(&mut self, renewal: &Renewal, failure: &str) {
        tracing::warn!(
            collection = %self.place.collection.name(),
            leases = renewal.lock_ids.len(),
            error = %failure,
            "lease renewal failed; retrying until each lease's deadline"
        );
        self.schedule.retry_soon(&self.place.options, clock::now());
    }

    fn expire_overdue(&mut self) {
        let loss = self.deadline_loss();
        for lease in self.leases.lock().values() {
            if lease.state.is_lost() {
                lease.mark_lost(lease.overdue(loss));
            }
        }
    }

    /// Why a lease whose deadline passed is lost: no renewal came in time, or, where nothing
    /// renews leases ([`auto_renew`](crate::LockOptionsBuilder::auto_renew) off), it expired.
    fn deadline_loss(&self) -> Loss {
        if self.place.options.auto_renew() {
            Loss::Deadline
        } else {
            Loss::Expired
        }
    }
}

/// Whether the loop renews `lease`: it is live and not inside a lease-checked transaction of its
/// holder (which renews it itself, in the transaction).
fn renewable(lease: &Lease) -> bool {
    !lease.is_lost() && !lease.state.in_transaction()
}

/// What a renewal command needs of a lease: its document, lock id and current deadline.
fn entry(lease: &Lease) -> (Bson, String, clock::Instant) {
    let deadline = lease.state.lost_at().unwrap_or_else(clock::now);
    (lease.id.clone(), lease.lock_id.clone(), deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop that never runs (its client never connects), to call its decisions directly.
    async fn idle_loop(options: crate::options::LockOptions) -> RenewalLoop {
        let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:9")
            .await
            .unwrap();
        RenewalLoop {
            runtime: Handle::current(),
            place: Place {
                collection: client.database("d").collection("c"),
                deployment: super::super::record::Deployment::Database(client.database("d")),
                layout: super::super::schema::Layout::LockDocument,
                options,
            },
            kind: LockKind::Exclusive,
            leases: Arc::default(),
            in_flight: Arc::default(),
            schedule: Renewals::new(clock::now()),
            releases: JoinSet::new(),
            limits: HashMap::new(),
            clock: None,
            reads_clock: true,
        }
    }

    #[tokio::test]
    async fn a_server_clock_jump_is_judged_only_between_readings_a_lease_apart() {
        let options = crate::options::LockOptions::builder()
            .expiry(Duration::from_secs(30))
            .extension_cadence(Duration::from_secs(10))
            .build()
            .unwrap();
        let allowed = options.max_clock_skew() + options.safety_margin();
        let lifetime = options.lease_lifetime();
        let mut renewals = idle_loop(options).await;
        let millis = |duration: Duration| i64::try_from(duration.as_millis()).unwrap();
        let t0 = clock::now();
        assert!(!renewals.server_clock_jumped(t0, 0, t0), "a first reading");
        // A cadence later, the server advanced a cadence plus what is allowed: no jump.
        let t1 = t0 + Duration::from_secs(10);
        let server1 = millis(Duration::from_secs(10) + allowed);
        assert!(!renewals.server_clock_jumped(t1, server1, t1));
        // Readings further apart than a lease lasts tell nothing: not a jump, a new start.
        let t2 = t1 + lifetime + Duration::from_secs(1);
        let server2 = server1 + millis(lifetime + Duration::from_secs(60));
        assert!(!renewals.server_clock_jumped(t2, server2, t2));
        // A cadence later again, the server jumped by a minute: a jump.
        let t3 = t2 + Duration::from_secs(10);
        let server3 = server2 + millis(Duration::from_secs(70));
        assert!(renewals.server_clock_jumped(t3, server3, t3));
    }
}
