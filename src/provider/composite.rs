//! Acquiring several locks of any kinds together, all or nothing, in the global lock order.

use std::time::Duration;

use tokio::time::Instant;

use super::Provider;
use crate::composite::{CompositeGuard, CompositeMember, HeldMember};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::lease::{acquire, held};
use crate::lock_status::{LockKind, LockStatus};

impl Provider {
    /// Acquires `members` together (as [`acquire_all`](Self::acquire_all) does), runs `work`
    /// while all of them are held ([`CompositeGuard::run_while_held`]) and releases them:
    /// `work`'s output, or [`Error::LockLost`] if any member was lost first.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all); [`Error::LockLost`] if a member was lost before
    /// `work` completed (`work` is dropped then). A release that fails after `work` completed
    /// is logged, not returned.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work` and the guard, which releases every
    /// member in the background.
    pub async fn acquire_all_and_run<'a, M, T>(
        &self,
        members: &[M],
        timeout: Duration,
        work: impl AsyncFnOnce(&CompositeGuard) -> T,
    ) -> Result<T>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let guard = self.acquire_all(members, timeout).await?;
        let output = guard.run_while_held(work(&guard)).await;
        let names = guard.names().collect::<Vec<_>>().join(", ");
        held::after_release(&names, output, guard.release().await)
    }

    /// Acquires `members` together, any mix of exclusive locks, read locks, write locks and
    /// semaphore places (see [`CompositeMember`]; a plain name is an exclusive lock), and
    /// returns one guard for all of them.
    ///
    /// Members are acquired in one global order, by the name of the collection of their kind
    /// and then by name, so callers with overlapping sets cannot deadlock (with the same
    /// collection settings). It is all or nothing: on an error, or when `timeout` runs out, the
    /// members acquired so far are released at once. The guard's `lost` fires if any member is
    /// lost.
    ///
    /// ```no_run
    /// # async fn demo(provider: distributed_lock_mongodb::Provider) -> distributed_lock_mongodb::Result<()> {
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::CompositeMember::{Exclusive, Read, Semaphore};
    ///
    /// // Two accounts (plain names are exclusive locks):
    /// let accounts = provider.acquire_all(&["acct-7", "acct-3"], Duration::from_secs(5)).await?;
    /// accounts.release().await?;
    /// // A mix: the price list for reading, one of 4 export slots and the order itself.
    /// let members = [Read("prices"), Semaphore { name: "exports", max_count: 4 }, Exclusive("order-42")];
    /// let all = provider.acquire_all(&members, Duration::from_secs(5)).await?;
    /// all.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty set or a lock
    /// given twice (a read and a write lock of one name count as the same lock);
    /// [`Error::Timeout`](crate::Error::Timeout) naming the member that could not be acquired
    /// when `timeout` runs out; otherwise as the members' own `acquire` methods.
    ///
    /// # Cancel safety
    /// Cancel safe: members acquired before the future was dropped are released at once.
    pub async fn acquire_all<'a, M>(
        &self,
        members: &[M],
        timeout: Duration,
    ) -> Result<CompositeGuard>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let started = Instant::now();
        match self.acquire_all_within(members, timeout).await? {
            Ok(guard) => Ok(guard),
            Err(busy) => {
                // Explains the wait; must not prolong it much.
                let read_limit = acquire::holders_read_limit(timeout);
                let holders = tokio::time::timeout(read_limit, self.holders_of(busy))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                let waited = started.elapsed();
                Err(Error::Timeout {
                    name: busy.name().to_owned(),
                    waited,
                    holders,
                })
            }
        }
    }

    /// Who holds the composite member `member` now.
    async fn holders_of(&self, member: CompositeMember<'_>) -> Result<Vec<LockStatus>> {
        match member {
            CompositeMember::Exclusive(name) => self.create_lock(name).holders().await,
            CompositeMember::Read(name) | CompositeMember::Write(name) => {
                self.create_reader_writer_lock(name).holders().await
            }
            CompositeMember::Semaphore { name, max_count } => {
                self.create_semaphore(name, max_count).holders().await
            }
        }
    }

    /// Acquires `members` together if every one of them is free now, as
    /// [`acquire_all`](Self::acquire_all) does with no wait: `Ok(None)` (with nothing held) as
    /// soon as one is busy.
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without timeouts.
    ///
    /// # Cancel safety
    /// As [`acquire_all`](Self::acquire_all).
    pub async fn try_acquire_all<'a, M>(&self, members: &[M]) -> Result<Option<CompositeGuard>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        Ok(self.acquire_all_within(members, Duration::ZERO).await?.ok())
    }

    /// Acquires `members` in lock order within `timeout`: the guard, or the member that was
    /// still busy when the time ran out (the others released).
    async fn acquire_all_within<'a, M>(
        &self,
        members: &[M],
        timeout: Duration,
    ) -> Result<std::result::Result<CompositeGuard, CompositeMember<'a>>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let members = self.in_lock_order(members)?;
        let deadline = Instant::now().checked_add(timeout);
        let mut held = Partial(Vec::with_capacity(members.len()));
        for member in members {
            let remaining = deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            // On failure the members acquired so far are dropped: released at once.
            match self.acquire_member(member, remaining).await? {
                Some(acquired) => held.0.push(acquired),
                None => return Ok(Err(member)),
            }
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(Ok(CompositeGuard::new(
            std::mem::take(&mut held.0),
            runtime,
        )))
    }
}

/// The members of a composite acquired so far. Dropped before the composite is complete (a
/// member stayed busy, an error, the caller stopped waiting), nobody is given them: each is
/// released at once, keeping no `min_hold` window, as an acquisition nobody waited for is.
struct Partial(Vec<HeldMember>);

impl Drop for Partial {
    fn drop(&mut self) {
        for member in self.0.drain(..) {
            member.lease.undelivered();
        }
    }
}

impl Provider {
    /// `members` sorted into the global lock order: by the collection of their kind, then by
    /// name; refused if empty or if a lock comes twice.
    fn in_lock_order<'a, M>(&self, members: &[M]) -> Result<Vec<CompositeMember<'a>>>
    where
        M: Clone + Into<CompositeMember<'a>>,
    {
        let members: Vec<CompositeMember<'a>> = members.iter().cloned().map(Into::into).collect();
        let key = |member: &CompositeMember<'a>| {
            let collection = match member.kind() {
                // (A composite member is never a document lock.)
                LockKind::Exclusive | LockKind::Document => &self.collection,
                LockKind::Read | LockKind::Write => &self.reader_writer_collection,
                LockKind::Semaphore => &self.semaphore_collection,
            };
            (collection.name.clone(), member.name())
        };
        crate::composite::in_order(members, key)
    }

    /// Acquires one member within `wait`: `None` if it stayed busy.
    async fn acquire_member(
        &self,
        member: CompositeMember<'_>,
        wait: Duration,
    ) -> Result<Option<HeldMember>> {
        let kind = member.kind();
        let with_token = |guard: Option<LockGuard>| {
            guard.map(|guard| {
                let (lease, token) = guard.into_parts();
                HeldMember {
                    lease,
                    kind,
                    fencing_token: Some(token),
                }
            })
        };
        Ok(match member {
            CompositeMember::Exclusive(name) => {
                with_token(self.create_lock(name).try_acquire_timeout(wait).await?)
            }
            CompositeMember::Write(name) => {
                let rw = self.create_reader_writer_lock(name);
                with_token(rw.try_acquire_write_timeout(wait).await?)
            }
            CompositeMember::Semaphore { name, max_count } => {
                let semaphore = self.create_semaphore(name, max_count);
                with_token(semaphore.try_acquire_timeout(wait).await?)
            }
            CompositeMember::Read(name) => {
                let rw = self.create_reader_writer_lock(name);
                let read = rw.try_acquire_read_timeout(wait).await?;
                read.map(|guard| HeldMember {
                    lease: guard.into_lease(),
                    kind,
                    fencing_token: None,
                })
            }
        })
    }
}
