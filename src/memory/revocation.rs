//! Revocation in the double, as the MongoDB lock plays it (see [`crate::revocation`]): a
//! revoking wait's request (or an operator's) targets the holder, a waiter's keeps the lock for
//! it once free, and a holder still there when the grace runs out loses the lock then (in the
//! double a lease has no end of its own to wait for).

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::DateTime;
use tokio::time::Instant;

use super::lock::{MemoryGuard, MemoryLock};
use super::names::{Key, Locks, Name};
use super::{Claim, MemoryLockProvider};
use crate::error::{Error, Result, shown_name};
use crate::lock_status::LockStatus;
use crate::{Revocation, RevokeRequest};

/// The target of a request placed while nobody holds the lock (acquisitions count from 1).
const NOBODY: u64 = 0;

/// A request stored with a lock's name.
#[derive(Clone, Debug)]
pub(super) struct Request {
    /// The asker's wait (`None`: an operator's, which keeps the lock for nobody).
    wait: Option<u64>,
    /// The acquisition it asks to end.
    target: u64,
    priority: i32,
    grace_until: Instant,
}

impl Request {
    /// Whether it keeps the lock from an attempt of `wait` (of a wait that revokes, or of none).
    pub(super) fn reserves_against(&self, wait: Option<u64>) -> bool {
        self.wait.is_some() && self.wait != wait
    }

    /// The request as the holder `acquisition` sees it, if it targets that holder.
    pub(super) fn seen_by(&self, acquisition: u64) -> Option<Revocation> {
        if self.target != acquisition {
            return None;
        }
        let left = self.grace_until.saturating_duration_since(Instant::now());
        let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
        Some(Revocation {
            priority: self.priority,
            grace_until: DateTime::from_millis(
                DateTime::now().timestamp_millis().saturating_add(millis),
            ),
            grace_left: left,
            by_operator: self.wait.is_none(),
        })
    }
}

/// An attempt of the revoking wait `wait` found `entry` (of `key`) taken: places its request, or
/// keeps it, unless a standing request of another wait ranks as high or higher. A request with
/// a new target starts its grace, and a timer that ends the target's hold when it runs out.
pub(super) fn ask(locks: &Locks, entry: &mut Name, wait: u64, asked: RevokeRequest) {
    // Kept by a `min_hold` window: nobody to ask, but the lock is kept for the asker after it.
    let target = entry
        .holders
        .first()
        .map_or(NOBODY, |holder| holder.acquisition);
    if let Some(stored) = &entry.revoke {
        let standing = stored.target == target || stored.wait.is_some();
        if stored.wait == Some(wait) && stored.target == target {
            return;
        }
        if stored.wait != Some(wait) && standing && stored.priority >= asked.priority_value() {
            return;
        }
    }
    let request = Request {
        wait: Some(wait),
        target,
        priority: asked.priority_value(),
        grace_until: Instant::now() + asked.grace(),
    };
    place(locks, entry, request);
}

/// Stores `request` in `entry` (its grace timer is started by whoever placed it: see
/// [`grace_timer`]).
fn place(locks: &Locks, entry: &mut Name, request: Request) {
    entry.revoke = Some(request);
    locks.changed();
}

/// After a failed attempt of the revoking wait `wait` on `key`: starts the grace timer of its
/// request if it targets another holder, or has another grace, than the timer started last
/// (`timed`). Returns the target and grace of the timer now running.
pub(super) fn time_grace(
    locks: &Arc<Locks>,
    key: &Key,
    wait: u64,
    timed: Option<(u64, Instant)>,
) -> Option<(u64, Instant)> {
    let ours = (locks.names.lock().get(key))
        .and_then(|entry| entry.revoke.clone())
        .filter(|request| request.wait == Some(wait))
        .map(|request| (request.target, request.grace_until));
    match ours {
        Some(now) if Some(now) != timed => {
            grace_timer(Arc::clone(locks), key.clone(), now.0, now.1);
            Some(now)
        }
        _ => timed,
    }
}

/// Ends the hold of `target` on `key` when the grace of its request runs out at `grace_until`,
/// if that request still stands and `target` still holds the lock.
fn grace_timer(locks: Arc<Locks>, key: Key, target: u64, grace_until: Instant) {
    tokio::spawn(async move {
        tokio::time::sleep_until(grace_until).await;
        let state = {
            let names = locks.names.lock();
            let Some(entry) = names.get(&key) else { return };
            let asked = (entry.revoke.as_ref()).is_some_and(|request| {
                request.target == target && request.grace_until == grace_until
            });
            let holder = entry
                .holders
                .iter()
                .find(|holder| holder.acquisition == target);
            match holder {
                Some(holder) if asked => Arc::clone(&holder.state),
                _ => return,
            }
        };
        locks.expire(&key, target, &state);
    });
}

/// Takes the request of `wait` out of `key` (its wait ended).
pub(super) fn withdraw(locks: &Locks, key: &Key, wait: u64) {
    let withdrawn = locks.names.lock().get_mut(key).is_some_and(|entry| {
        let ours = entry
            .revoke
            .as_ref()
            .is_some_and(|request| request.wait == Some(wait));
        if ours {
            entry.revoke = None;
        }
        ours
    });
    if withdrawn {
        locks.freed.notify_waiters();
        locks.changed();
    }
}

/// A revoking wait's request, withdrawn when the wait ends (dropped).
pub(super) struct Asking {
    pub(super) locks: Arc<Locks>,
    pub(super) key: Key,
    pub(super) wait: u64,
}

impl Drop for Asking {
    fn drop(&mut self) {
        withdraw(&self.locks, &self.key, self.wait);
    }
}

impl MemoryLock {
    /// Waits at most `timeout` for the lock, asking its holder to let go, as
    /// [`MongoDistributedLock::acquire_revoking`](crate::MongoDistributedLock::acquire_revoking)
    /// does: the holder's [`revocation_requested`](MemoryGuard::revocation_requested) resolves,
    /// the lock is kept for this wait once free, and a holder still there when the grace runs
    /// out loses it then.
    ///
    /// # Errors
    /// As the MongoDB lock's: [`Error::InvalidArgument`] for a semaphore, a fair lock or a grace
    /// over 365 days; [`Error::Timeout`] when `timeout` runs out; the refusals of
    /// [`acquire`](Self::acquire).
    pub async fn acquire_revoking(
        &self,
        request: RevokeRequest,
        timeout: Duration,
    ) -> Result<MemoryGuard> {
        if !matches!(self.claim, Claim::Places(1)) || self.key.kind != super::Kind::Lock {
            return Err(Error::InvalidArgument(format!(
                "acquire_revoking of {:?}: only an exclusive lock's holder can be asked to let go",
                shown_name(&self.key.name)
            )));
        }
        request.checked(&self.key.name, &self.options)?;
        let asking = Asking {
            locks: Arc::clone(&self.locks),
            key: self.key.clone(),
            wait: self.locks.new_wait(),
        };
        let found = self
            .wait_revoking(Some(timeout), Some((asking.wait, request)))
            .await?;
        drop(asking);
        self.required(found, timeout)
    }
}

impl MemoryGuard {
    /// Resolves when someone asks this holder to let go, as
    /// [`LockGuard::revocation_requested`](crate::LockGuard::revocation_requested) does.
    ///
    /// # Errors
    /// [`Error::LockLost`] if the lock is lost first; [`Error::InvalidArgument`] for a
    /// reader-writer lock's guard.
    pub async fn revocation_requested(&self) -> Result<Revocation> {
        if self.key().kind == super::Kind::ReaderWriter {
            return Err(Error::InvalidArgument(format!(
                "revocation_requested on {:?}: only an exclusive lock's holder and a semaphore's \
                 place can be asked to let go",
                shown_name(self.name())
            )));
        }
        let mut changes = self.locks().changes.subscribe();
        let lost = self.lost();
        loop {
            changes.mark_unchanged();
            let seen = (self.locks().names.lock().get(self.key()))
                .and_then(|entry| entry.revoke.as_ref()?.seen_by(self.acquisition()));
            if let Some(revocation) = seen {
                return Ok(revocation);
            }
            tokio::select! {
                () = lost.wait() => return Err(Error::LockLost { name: self.name().to_owned() }),
                changed = changes.changed() => if changed.is_err() {
                    std::future::pending::<()>().await;
                },
            }
        }
    }
}

impl MemoryLockProvider {
    /// Asks the holder of `name` to let go within `grace`, as
    /// [`Provider::request_revocation`](crate::Provider::request_revocation): its status with
    /// the request, or `None` if nobody holds it. A holder still there when the grace runs out
    /// loses the lock then.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a grace over 365 days.
    pub async fn request_revocation(
        &self,
        name: &str,
        grace: Duration,
    ) -> Result<Option<LockStatus>> {
        self.ask_to_let_go(Key::lock(name), None, grace)
    }

    /// Asks the one holder `holder` describes (an exclusive lock's, or a semaphore's place) to
    /// let go within `grace`, as
    /// [`Provider::request_revocation_of`](crate::Provider::request_revocation_of): its status
    /// with the request, or `None` if that lease is gone.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an entry without a lock id of the double, a
    /// reader-writer lock's or a document lock's holder, or a grace over 365 days.
    pub async fn request_revocation_of(
        &self,
        holder: &LockStatus,
        grace: Duration,
    ) -> Result<Option<LockStatus>> {
        let shown = shown_name(&holder.name);
        let acquisition = (holder.lock_id.as_deref())
            .and_then(|lock_id| lock_id.strip_prefix("memory-")?.parse::<u64>().ok());
        let kind = match holder.kind {
            crate::LockKind::Exclusive => super::Kind::Lock,
            crate::LockKind::Semaphore => super::Kind::Semaphore,
            kind => {
                return Err(Error::InvalidArgument(format!(
                    "request_revocation_of: {shown:?} is held as {kind}; only an exclusive \
                     lock's holder and a semaphore's place can be asked to let go"
                )));
            }
        };
        let Some(acquisition) = acquisition else {
            return Err(Error::InvalidArgument(format!(
                "request_revocation_of: the entry for lock {shown:?} has no lock id of this double"
            )));
        };
        self.ask_to_let_go(
            Key::new(kind, holder.name.as_str()),
            Some(acquisition),
            grace,
        )
    }

    /// An operator's request to the holder `acquisition` of `key` (any holder with `None`).
    fn ask_to_let_go(
        &self,
        key: Key,
        acquisition: Option<u64>,
        grace: Duration,
    ) -> Result<Option<LockStatus>> {
        crate::revocation::grace_millis(&shown_name(&key.name), grace)?;
        {
            let mut names = self.locks.names.lock();
            let Some(entry) = names.get_mut(&key) else {
                return Ok(None);
            };
            let held = (entry.holders.iter()).map(|holder| holder.acquisition);
            let Some(target) = held
                .into_iter()
                .find(|held| acquisition.is_none_or(|a| a == *held))
            else {
                return Ok(None);
            };
            // One request per semaphore at a time, as on MongoDB.
            let other_asked = (entry.revoke.as_ref()).is_some_and(|request| {
                request.target != target
                    && (entry.holders.iter()).any(|holder| holder.acquisition == request.target)
            });
            if key.kind == super::Kind::Semaphore && other_asked {
                return Err(Error::InvalidArgument(format!(
                    "request_revocation_of: another place of semaphore {:?} is being asked to let \
                     go (one request per semaphore at a time); ask again once that one is over",
                    shown_name(&key.name)
                )));
            }
            let request = Request {
                wait: None,
                target,
                priority: i32::MAX,
                grace_until: Instant::now() + grace,
            };
            let grace_until = request.grace_until;
            place(&self.locks, entry, request);
            grace_timer(Arc::clone(&self.locks), key.clone(), target, grace_until);
        }
        let shown = format!("memory-{}", acquisition.unwrap_or_default());
        Ok(self
            .locks
            .holders(&key, false)
            .into_iter()
            .find(|holder| acquisition.is_none() || holder.lock_id.as_deref() == Some(&shown)))
    }
}
