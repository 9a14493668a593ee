//! A family of locks (the locks of one [`Provider`](crate::Provider), or the clones of
//! one lock): its renewal loops, its work under way, and its shutdown.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mongodb::Namespace;
use tokio::runtime::{self, Handle};
use tokio::sync::{mpsc, watch};
use tokio::time::sleep_until;

use super::in_flight::InFlight;
use super::lost::Loss;
use super::record::{Deployment, Lease, LeaseTable, Place};
use super::release::ReleaseContext;
use super::renewal::{self, Command};
use super::schema::Layout;
use super::undo::Undo;
use crate::clock;
use crate::sync::Mutex;

/// What one renewal loop serves: a runtime, and a place (a collection of a deployment) with the
/// options renewal uses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LoopKey {
    runtime: runtime::Id,
    deployment: Deployment,
    namespace: Namespace,
    layout: Layout,
    expiry: Duration,
    cadence: Duration,
    skew: Duration,
    /// Leases with a `min_hold` record each renewal.
    min_hold: Option<Duration>,
    /// Whether it renews its leases at all (`auto_renew`).
    renews: bool,
    /// `WriteConcern` is not `Hash`; its debug form identifies it.
    write_concern: String,
}

impl LoopKey {
    fn new(runtime: &Handle, place: &Place) -> LoopKey {
        let options = &place.options;
        LoopKey {
            runtime: runtime.id(),
            deployment: place.deployment.clone(),
            namespace: place.namespace(),
            layout: place.layout.clone(),
            expiry: options.expiry(),
            cadence: options.extension_cadence(),
            skew: options.max_clock_skew(),
            min_hold: options.min_hold(),
            renews: options.auto_renew(),
            write_concern: format!("{:?}", options.write_concern()),
        }
    }
}

/// A running renewal loop, as the family sees it.
#[derive(Debug)]
struct LoopHandle {
    commands: mpsc::UnboundedSender<Command>,
    leases: Arc<LeaseTable>,
    place: Place,
}

/// The renewal loops of a family of locks (one per runtime and place), the family's work under
/// way, and whether it was shut down.
#[derive(Debug)]
pub(crate) struct Family {
    /// Unique in the process: the family's locks share in-process queues (see `handoff`).
    id: u64,
    loops: Mutex<HashMap<LoopKey, LoopHandle>>,
    /// True once the family was shut down (set while holding `loops`): no lease is held any more.
    shut_down: watch::Sender<bool>,
    in_flight: Arc<InFlight>,
    /// Held for the whole of a shutdown: a second caller returns only once the first is done.
    shutting_down: tokio::sync::Mutex<()>,
}

impl Default for Family {
    fn default() -> Family {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Family {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            loops: Mutex::default(),
            shut_down: watch::Sender::new(false),
            in_flight: Arc::default(),
            shutting_down: tokio::sync::Mutex::default(),
        }
    }
}

impl Drop for Family {
    fn drop(&mut self) {
        // Its family's lock objects are all gone: the queues forget it.
        super::handoff::forget_family(self.id);
        super::push::forget_family(self.id);
    }
}

impl Family {
    /// Identifies this family of locks in the process.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The family's work under way.
    pub(crate) fn in_flight(&self) -> &Arc<InFlight> {
        &self.in_flight
    }

    fn is_shut_down(&self) -> bool {
        *self.shut_down.borrow()
    }

    /// Turns true when [`shut_down`](Self::shut_down) is called.
    pub(crate) fn shut_down_signal(&self) -> watch::Receiver<bool> {
        self.shut_down.subscribe()
    }

    /// Starts renewing `lease` (just won) with the loop for `runtime` and `place`, starting the
    /// loop if there is none (or its runtime shut down). Returns the channel for later release
    /// requests. If no loop can take the lease, it is marked lost at once; after a shutdown it is
    /// also released at once. Leases and work that a dropped runtime left behind in the family
    /// are released or undone from `runtime`.
    pub(crate) fn hold(
        &self,
        runtime: &Handle,
        place: &Place,
        lease: Lease,
    ) -> mpsc::UnboundedSender<Command> {
        let mut loops = self.loops.lock();
        if self.is_shut_down() {
            // Won by an attempt still in flight when the family was shut down; the shutdown
            // waits for this release (it is work under way). Nobody is given the lease: it
            // ends at once, keeping no `min_hold` window.
            lease.state.set_undelivered();
            lease.mark_lost(Loss::ShutDown);
            self.release_context(runtime, place).spawn(lease, None);
            return mpsc::unbounded_channel().0;
        }
        // A loop whose runtime shut down has dropped its receiver; a new runtime with a reused
        // id then gets a fresh loop. Leases it still had are renewed by nobody: they were marked
        // lost by the loop's end; release them from here.
        loops.retain(|_, running| {
            if !running.commands.is_closed() {
                return true;
            }
            let context = self.release_context(runtime, &running.place);
            for (_, orphan) in running.leases.lock().drain() {
                orphan.mark_lost(Loss::LoopEnded);
                context.clone().spawn(orphan, None);
            }
            false
        });
        // Work whose runtime was dropped before it finished (a release, a transfer, a cleanup)
        // may have left leases behind: undo it from this live runtime.
        for undo in self.in_flight.take_abandoned() {
            self.in_flight.spawn_undo(runtime, undo);
        }
        // Loops of other places with nothing to renew retire (each ends once its last guard is
        // gone), so that locks built on handles made per request keep no loop each.
        let key = LoopKey::new(runtime, place);
        loops.retain(|other, running| *other == key || !running.leases.lock().is_empty());
        let running = loops.entry(key).or_insert_with(|| {
            let leases = Arc::new(LeaseTable::default());
            let commands = renewal::start(
                runtime,
                place.clone(),
                lease.kind,
                Arc::clone(&leases),
                Arc::clone(&self.in_flight),
            );
            LoopHandle {
                commands,
                leases,
                place: place.clone(),
            }
        });
        let lock_id = lease.lock_id.clone();
        running.leases.lock().insert(lock_id.clone(), lease);
        if running
            .commands
            .send(Command::Held {
                lock_id: lock_id.clone(),
            })
            .is_err()
        {
            // The runtime is shutting down: nobody will renew this lease. It stays in the table
            // of the loop that is gone, so that the family's shutdown, or its next lease (which
            // finds the loop gone), releases it.
            if let Some(lease) = running.leases.lock().get(&lock_id) {
                lease.mark_lost(Loss::LoopEnded);
            }
        }
        running.commands.clone()
    }

    fn release_context(&self, runtime: &Handle, place: &Place) -> ReleaseContext {
        ReleaseContext {
            runtime: runtime.clone(),
            place: place.clone(),
            in_flight: Arc::clone(&self.in_flight),
        }
    }

    /// Holds no more leases, and finishes the job before returning: every later
    /// [`hold`](Self::hold) releases its lease at once; every held lease is marked lost and
    /// released, and all work under way that may leave a lease behind (releases, transfers,
    /// cleanups, acquisition attempts) is waited for or undone.
    ///
    /// Everything is sent from the caller's task, never by the renewal loops, so it returns in
    /// bounded time even when a loop's runtime is not being driven: an attempt or a transfer
    /// under way is waited for at most its server-side time limit (`ATTEMPT_SERVER_TIME`, 5 s,
    /// after its last command), then undone;
    /// each update is given at most `expiry`. Concurrent callers all return once the job is done.
    pub(crate) async fn shut_down(&self) {
        let _one_at_a_time = self.shutting_down.lock().await;
        let held: Vec<(Lease, Place)> = {
            let mut loops = self.loops.lock();
            self.shut_down.send_replace(true);
            loops
                .drain()
                .flat_map(|(_, running)| {
                    // Taken before the loop hears of the shutdown: a loop that ends first would
                    // report its leases lost with the wrong reason (its end, not the shutdown).
                    let leases: Vec<Lease> = running
                        .leases
                        .lock()
                        .drain()
                        .map(|(_, lease)| lease)
                        .collect();
                    let _ = running.commands.send(Command::ShutDown);
                    let place = running.place;
                    leases.into_iter().map(move |lease| (lease, place.clone()))
                })
                .collect()
        };
        let mut pending = Pending {
            in_flight: &self.in_flight,
            undo: held
                .iter()
                .map(|(lease, place)| {
                    lease.mark_lost(Loss::ShutDown);
                    place.ending_undo(lease)
                })
                .collect(),
        };
        drop(held);
        let mut changes = self.in_flight.subscribe();
        loop {
            changes.borrow_and_update();
            let due = self.in_flight.take_due(clock::now());
            pending.undo.extend(due.undo);
            if !pending.undo.is_empty() {
                futures::future::join_all(pending.undo.iter().map(Undo::send)).await;
                pending.undo.clear();
                continue;
            }
            let Some(next) = due.next else {
                break;
            };
            tokio::select! {
                _ = changes.changed() => {}
                () = sleep_until(clock::wake_toward(next)) => {}
            }
        }
    }
}

/// Undos a shutdown took and has not finished sending. Should its caller stop waiting, they go
/// back to the family's work under way, due at once: the next shutdown sends them.
struct Pending<'a> {
    in_flight: &'a Arc<InFlight>,
    undo: Vec<Undo>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.undo.is_empty() {
            drop(self.in_flight.track(std::mem::take(&mut self.undo), None));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_undos_of_a_cancelled_shutdown_are_left_for_the_next() {
        let family = Family::default();
        drop(family.in_flight().track(
            vec![Undo::unanswered(Duration::from_millis(800)).await],
            None,
        ));
        let cancelled = tokio::time::timeout(Duration::from_millis(100), family.shut_down()).await;
        assert!(cancelled.is_err(), "its undo takes 800 ms: cut short");
        let due = family.in_flight().take_due(clock::now());
        assert_eq!(
            due.undo.len(),
            1,
            "the undo it had not finished sending is due again"
        );
    }

    /// A lease won while its runtime shuts down has no loop to renew it: it is lost at once, and
    /// left where the family's shutdown (or its next lease) finds and releases it. Fails when the
    /// lease is dropped from the table: it stays stored until its expiry.
    #[test]
    fn a_lease_won_as_its_runtime_shuts_down_is_left_for_the_shutdown_to_release() {
        let runtime = runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dead = runtime.handle().clone();
        let options = crate::options::LockOptions::default();
        let place = runtime.block_on(async {
            let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:9")
                .await
                .unwrap();
            Place {
                collection: client.database("d").collection("c"),
                deployment: super::super::record::Deployment::Database(client.database("d")),
                layout: Layout::LockDocument,
                options: options.clone(),
            }
        });
        drop(runtime);
        let family = Family::default();
        let lease = Lease {
            id: "n".into(),
            name: "n".into(),
            kind: crate::lock_status::LockKind::Exclusive,
            lock_id: "won".into(),
            state: super::super::state::LeaseState::starting(
                &options,
                super::super::Sent::now(clock::now()),
            ),
            waiters: None,
            holding: None,
        };
        let state = Arc::clone(&lease.state);
        let _commands = family.hold(&dead, &place, lease);
        assert!(state.is_lost(), "nobody renews it");
        assert!(
            family
                .loops
                .lock()
                .values()
                .any(|running| running.leases.lock().contains_key("won")),
            "left for the shutdown or the next lease to release"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_shutdown_returns_only_after_the_first_is_done() {
        let undo = Undo::unanswered(Duration::from_millis(800)).await;
        let family = Arc::new(Family::default());
        let work = family.in_flight().track(vec![undo], None);
        let started = std::time::Instant::now();
        let first = tokio::spawn({
            let family = Arc::clone(&family);
            async move { family.shut_down().await }
        });
        while !family.is_shut_down() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The first is sending the undo now, which takes its whole patience.
        tokio::time::sleep(Duration::from_millis(100)).await;
        family.shut_down().await;
        let returned_after = started.elapsed();
        assert!(
            returned_after >= Duration::from_millis(800),
            "the second shutdown returned after {returned_after:?}, while the first was still \
             sending an undo"
        );
        first.await.unwrap();
        drop(work);
    }
}
