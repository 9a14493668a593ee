//! Leader election on top of the exclusive lock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::{Error, Result, shown_name};
use crate::lease::bound::Bound;
use crate::lease::lost::LostSignal;
use crate::lock::MongoDistributedLock;
use crate::revocation::Revocation;
use crate::sync::Mutex;
use crate::token::FencingToken;
use crate::traits::{BoxedGuard, DistributedLock};
use crate::watch::LockWatch;

/// After a failed campaign (an error other than a busy lock), the next one waits this long.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// Campaigns for leadership of a name in the background: at most one instance at a time is the
/// leader, and a new one is elected when it resigns, is shut down, crashes or loses its lease.
///
/// Leadership is an exclusive lock ([`MongoDistributedLock`]) held for as long as possible: the
/// campaign waits for the lock, keeps it renewed while leading, and campaigns again after a
/// loss. Start one with [`Provider::create_leader_election`](crate::Provider::create_leader_election)
/// or [`LeaderElection::start`].
///
/// [`is_leader`](Self::is_leader) is exact: it turns false at the lease's lost deadline, before
/// another instance can be elected, under the same assumptions as [`LockGuard::lost`](crate::LockGuard::lost). The
/// [`watch`](Self::watch) channel reports the same changes as events, as soon as the background
/// task runs; it can lag behind `is_leader` by a scheduling delay, so check `is_leader` (or use
/// the term's [`fencing_token`](Self::fencing_token) with [`Fence`](crate::Fence)) right before
/// acting as the leader.
///
/// Dropping the election stops campaigning and releases leadership in the background;
/// [`resign`](Self::resign) does it and waits for the release.
///
/// ```no_run
/// # async fn demo(provider: distributed_lock_mongodb::Provider) -> distributed_lock_mongodb::Result<()> {
/// let election = provider.create_leader_election("nightly-report")?;
/// let mut leading = election.watch();
/// loop {
///     leading.wait_for(|leader| *leader).await.ok();
///     if let Some(term) = election.fencing_token() {
///         println!("leading term {term}: running the job");
///         // ... run the job, stopping if `election.is_leader()` turns false ...
///     }
///     leading.wait_for(|leader| !*leader).await.ok();
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct LeaderElection {
    name: String,
    term: Arc<Mutex<Option<Term>>>,
    leading: watch::Receiver<bool>,
    /// Revocation requests to this instance's terms, watched once someone asks for them.
    asked: Asked,
    resign: Option<oneshot::Sender<()>>,
    campaign: JoinHandle<Result<()>>,
}

/// Whether anyone waits for revocation requests (`wanted`: only then does a term watch its
/// lease for them), and the last request a term was sent, with the term's token (the campaign
/// holds the sender: a call waiting for a request ends with the campaign).
#[derive(Debug)]
struct Asked {
    wanted: Arc<watch::Sender<bool>>,
    requests: watch::Receiver<Option<(FencingToken, Revocation)>>,
}

/// [`Asked`], as the campaign sees it.
struct Asking {
    wanted: Arc<watch::Sender<bool>>,
    requests: watch::Sender<Option<(FencingToken, Revocation)>>,
}

/// The current term: its fencing token, whether its lease is lost, and the tasks bound to it.
#[derive(Debug)]
struct Term {
    fencing_token: FencingToken,
    lost: LostSignal,
    tasks: Arc<Bound>,
    /// Told of the leader's progress, which the term passes on to its guard.
    progressed: Arc<tokio::sync::Notify>,
}

impl LeaderElection {
    /// Starts campaigning for leadership of `lock`'s name, on the current Tokio runtime.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime; [`Error::InvalidOptions`] if the lock's
    /// options turn [`auto_renew`](crate::LockOptionsBuilder::auto_renew) off (a leader has no
    /// guard to extend: its term would end at the first expiry).
    pub fn start(lock: MongoDistributedLock) -> Result<LeaderElection> {
        if !lock.options().auto_renew() {
            return Err(Error::InvalidOptions(format!(
                "leader election {:?}: auto_renew(false) is not for leaders (nothing could \
                 extend the term's lease, so every term would end after one expiry)",
                shown_name(lock.name())
            )));
        }
        LeaderElection::over(Box::new(lock))
    }

    /// Starts campaigning for leadership of `lock`'s name, with any lock behind the trait: the
    /// in-memory double's in unit tests ([`DistributedLockProvider::create_leader_election`](crate::DistributedLockProvider::create_leader_election)),
    /// on the current Tokio runtime. Leadership is `lock`'s lease, as with
    /// [`start`](Self::start).
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    pub fn over(lock: Box<dyn DistributedLock>) -> Result<LeaderElection> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let name = lock.name().to_owned();
        let term = Arc::new(Mutex::new(None));
        let (leading_tx, leading) = watch::channel(false);
        let (resign, resigned) = oneshot::channel();
        let wanted = Arc::new(watch::channel(false).0);
        let (requests_tx, requests) = watch::channel(None);
        let asked = Asked {
            wanted: Arc::clone(&wanted),
            requests,
        };
        let asking = Asking {
            wanted,
            requests: requests_tx,
        };
        let campaign = runtime.spawn(campaign(
            lock,
            Arc::clone(&term),
            leading_tx,
            resigned,
            asking,
        ));
        Ok(LeaderElection {
            name,
            term,
            leading,
            asked,
            resign: Some(resign),
            campaign,
        })
    }

    /// Who leads `lock`'s name now, watched without campaigning (for a dashboard, or a
    /// follower that routes work to the leader): the leader's lock id, details, term's fencing
    /// token and lease, or nobody between terms; see [`LockWatch`] and
    /// [`MongoDistributedLock::watch`].
    ///
    /// # Errors
    /// As [`MongoDistributedLock::watch`].
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn watch_leader(lock: &MongoDistributedLock, every: Duration) -> Result<LockWatch> {
        lock.watch(every).await
    }

    /// The name campaigned for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether this instance is the leader now: it holds the lock and its lease is not lost
    /// (checked against the lease's deadline on every call).
    pub fn is_leader(&self) -> bool {
        self.current().is_some()
    }

    /// The fencing token of the current term while this instance is the leader: larger than
    /// that of every earlier term. Pass it to fenced writes ([`Fence`](crate::Fence)) so a leader
    /// that was replaced cannot overwrite its successor's work.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.current().map(|(fencing_token, _)| fencing_token)
    }

    /// Spawns `task` on the current Tokio runtime, bound to the current term, as a guard's
    /// [`spawn`](crate::LockGuard::spawn) binds it to a lease: aborted (and
    /// [`cancellation`](Self::cancellation) fired) when the term is lost; at
    /// [`resign`](Self::resign) the token fires and the release of leadership waits for the
    /// term's tasks to end first. `Ok(None)` while not the leader (nothing is spawned).
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    pub fn spawn<F>(&self, task: F) -> Result<Option<tokio::task::JoinHandle<F::Output>>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let Some(tasks) = self.term_tasks() else {
            return Ok(None);
        };
        tasks.spawn(task).map(Some)
    }

    /// The current term's token: it fires when the term is lost, when leadership is resigned,
    /// or when the election is dropped; `None` while not the leader.
    pub fn cancellation(&self) -> Option<crate::CancellationToken> {
        self.term_tasks().map(|tasks| tasks.cancellation())
    }

    /// Reports that the leader's work is making progress, as a guard's
    /// [`progress`](crate::LockGuard::progress): with
    /// [`max_idle`](crate::LockOptionsBuilder::max_idle), a term whose work reports none for
    /// `max_idle` is lost (and another instance elected). Returns whether this instance leads.
    pub fn progress(&self) -> bool {
        let term = self.term.lock();
        match term.as_ref().filter(|term| !term.lost.is_lost()) {
            Some(term) => {
                term.progressed.notify_one();
                true
            }
            None => false,
        }
    }

    /// The current term's bound tasks, while it is not lost.
    fn term_tasks(&self) -> Option<Arc<Bound>> {
        let term = self.term.lock();
        let term = term.as_ref().filter(|term| !term.lost.is_lost())?;
        Some(Arc::clone(&term.tasks))
    }

    /// A signal that turns true when the current term ends (see [`LostSignal`]); `None` while not
    /// the leader.
    pub fn lost(&self) -> Option<LostSignal> {
        self.current().map(|(_, lost)| lost)
    }

    /// Resolves when someone asks this instance to step down while it leads: a waiter's
    /// [`acquire_revoking`](crate::MongoDistributedLock::acquire_revoking) of the election's
    /// name, or an operator's [`request_revocation`](crate::Provider::request_revocation) (see
    /// [`crate::revocation`]). [`resign`](Self::resign) before the grace runs out, or the term
    /// is lost at its lease's end and the asker is elected. Waits through terms: a request to a
    /// term that ended before this was called is not reported; a request to the current term
    /// is, at once, for as long as that term lasts (a loop around this call should resign, or
    /// wait for the term to end, before calling again).
    ///
    /// Terms watch for requests only once this was called (one read per
    /// [`extension_cadence`](crate::LockOptions::extension_cadence), and at once on a change
    /// event); elections that never call it pay nothing.
    ///
    /// # Errors
    /// [`Error::BackgroundTaskEnded`] if the campaign ended (resigned, or its runtime shut down).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn revocation_requested(&self) -> Result<Revocation> {
        let mut requests = self.asked.requests.clone();
        self.asked.wanted.send_replace(true);
        let ended = || Error::BackgroundTaskEnded {
            operation: crate::error::Operation::Acquire,
        };
        loop {
            let current = self.fencing_token();
            let found = requests
                .borrow_and_update()
                .as_ref()
                .and_then(|(term, revocation)| {
                    (Some(*term) == current).then(|| revocation.clone())
                });
            if let Some(revocation) = found {
                return Ok(revocation);
            }
            requests.changed().await.map_err(|_| ended())?;
        }
    }

    /// "I am the leader", as a watch channel: `true` when a term starts, `false` as soon as the
    /// background task sees it end (lost, resigned, shut down). See the type's docs for why
    /// [`is_leader`](Self::is_leader) is the one to check before acting.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.leading.clone()
    }

    /// Steps down: stops campaigning and, if leading, releases leadership, so that another
    /// instance can be elected at once.
    ///
    /// # Errors
    /// While leading, the release's error (see [`LockGuard::release`](crate::LockGuard::release)). Between terms,
    /// [`Error::LockLost`] if the last term ended by a loss (its lease lapsed or was taken,
    /// rather than resigned) and no new term has started since; `Ok(())` if this instance was
    /// never elected.
    ///
    /// # Cancel safety
    /// Cancel safe: the campaign stops and the release goes on in the background.
    pub async fn resign(mut self) -> Result<()> {
        if let Some(resign) = self.resign.take() {
            let _ = resign.send(());
        }
        match (&mut self.campaign).await {
            Ok(result) => result,
            Err(_) => Err(Error::BackgroundTaskEnded {
                operation: crate::error::Operation::Release,
            }),
        }
    }

    /// The current term's token and signal, while it is not lost.
    fn current(&self) -> Option<(FencingToken, LostSignal)> {
        self.term
            .lock()
            .as_ref()
            .filter(|term| !term.lost.is_lost())
            .map(|term| (term.fencing_token, term.lost.clone()))
    }
}

impl Drop for LeaderElection {
    /// Stops campaigning; a held term's guard is dropped, which releases it in the background.
    fn drop(&mut self) {
        self.campaign.abort();
    }
}

/// Campaigns until resigned or the lock's provider is shut down; returns the outcome of the
/// release on resigning: while leading, the release's; between terms, `LockLost` if the last
/// term ended by a loss (its holder learns that its leadership lapsed), `Ok` otherwise.
async fn campaign(
    lock: Box<dyn DistributedLock>,
    term: Arc<Mutex<Option<Term>>>,
    leading: watch::Sender<bool>,
    mut resigned: oneshot::Receiver<()>,
    asked: Asking,
) -> Result<()> {
    let lapsed = || Error::LockLost {
        name: lock.name().to_owned(),
    };
    let mut last_term_lost = false;
    loop {
        let guard = tokio::select! {
            biased;
            _ = &mut resigned => return if last_term_lost { Err(lapsed()) } else { Ok(()) },
            acquired = lock.acquire() => acquired,
        };
        let guard = match guard {
            Ok(guard) => guard,
            // The provider's shutdown released the term already.
            Err(Error::ShutDown) => return Ok(()),
            Err(error) => {
                tracing::warn!(lock = %shown_name(lock.name()), %error, "leader campaign failed; retrying");
                tokio::select! {
                    biased;
                    _ = &mut resigned => return if last_term_lost { Err(lapsed()) } else { Ok(()) },
                    () = tokio::time::sleep(RETRY_AFTER_ERROR) => continue,
                }
            }
        };
        match lead(lock.as_ref(), guard, &term, &leading, &mut resigned, &asked).await {
            Some(outcome) => return outcome,
            None => last_term_lost = true,
        }
    }
}

/// Leads until the term ends: `None` if it was lost (campaign again), the release's outcome if
/// resigned.
async fn lead(
    lock: &dyn DistributedLock,
    guard: BoxedGuard,
    term: &Mutex<Option<Term>>,
    leading: &watch::Sender<bool>,
    resigned: &mut oneshot::Receiver<()>,
    asked: &Asking,
) -> Option<Result<()>> {
    let lost = guard.lost();
    let runtime = tokio::runtime::Handle::current();
    let tasks = Arc::new(Bound::new(runtime, lost.clone()));
    let progressed = Arc::new(tokio::sync::Notify::new());
    *term.lock() = Some(Term {
        fencing_token: guard.fencing_token(),
        lost: lost.clone(),
        tasks: Arc::clone(&tasks),
        progressed: Arc::clone(&progressed),
    });
    leading.send_replace(true);
    tracing::info!(lock = %shown_name(lock.name()), term = guard.fencing_token().get(), "elected leader");
    let resigning = {
        // Once someone waits for requests, the term watches its lease for one (once).
        let mut wanted = asked.wanted.subscribe();
        let mut watching = None;
        let mut told = false;
        loop {
            let arm = watching.is_none() && !told;
            let request = async {
                match watching.as_mut() {
                    Some(watching) => watching.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = lost.wait() => break false,
                _ = &mut *resigned => break true,
                () = progressed.notified() => {
                    guard.progress();
                }
                _ = wanted.wait_for(|wanted| *wanted), if arm => {
                    watching = Some(guard.revocation_requested());
                }
                revocation = request, if !told => {
                    told = true;
                    watching = None;
                    if let Ok(revocation) = revocation {
                        let term = guard.fencing_token();
                        asked.requests.send_replace(Some((term, revocation)));
                    }
                }
            }
        }
    };
    // Not the leader any more before anything else happens.
    *term.lock() = None;
    leading.send_replace(false);
    if resigning {
        tracing::info!(lock = %shown_name(lock.name()), "resigned leadership");
        // The term's tasks end first, while leadership still holds.
        tasks.settle().await;
        Some(guard.release().await)
    } else {
        tasks.abort_tasks();
        tracing::warn!(lock = %shown_name(lock.name()), "leadership lost; campaigning again");
        drop(guard);
        None
    }
}
