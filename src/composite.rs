//! Several locks of any kind held together.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::lease::held::HeldLease;
use crate::lease::lost::LostSignal;
use crate::lock_status::LockKind;
use crate::token::FencingToken;

/// One member of a composite lock (see
/// [`Provider::acquire_all`](crate::Provider::acquire_all)): which lock, of which kind, in the
/// provider's collection for that kind. A plain name (`&str` or `&String`) is an exclusive
/// lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CompositeMember<'a> {
    /// The exclusive lock of this name.
    Exclusive(&'a str),
    /// A read lock of the reader-writer lock of this name.
    Read(&'a str),
    /// The write lock of the reader-writer lock of this name.
    Write(&'a str),
    /// A place of the semaphore of this name, which allows `max_count` holders.
    Semaphore {
        /// The semaphore's name.
        name: &'a str,
        /// Its number of places (as every user of the semaphore must give it).
        max_count: u32,
    },
}

impl<'a> CompositeMember<'a> {
    /// The lock's name.
    pub fn name(&self) -> &'a str {
        match *self {
            CompositeMember::Exclusive(name)
            | CompositeMember::Read(name)
            | CompositeMember::Write(name)
            | CompositeMember::Semaphore { name, .. } => name,
        }
    }

    /// The kind of lock its holder gets.
    pub fn kind(&self) -> LockKind {
        match self {
            CompositeMember::Exclusive(_) => LockKind::Exclusive,
            CompositeMember::Read(_) => LockKind::Read,
            CompositeMember::Write(_) => LockKind::Write,
            CompositeMember::Semaphore { .. } => LockKind::Semaphore,
        }
    }
}

impl<'a> From<&'a str> for CompositeMember<'a> {
    fn from(name: &'a str) -> Self {
        CompositeMember::Exclusive(name)
    }
}

impl<'a> From<&'a String> for CompositeMember<'a> {
    fn from(name: &'a String) -> Self {
        CompositeMember::Exclusive(name)
    }
}

impl<'a, 'b> From<&'b &'a str> for CompositeMember<'a> {
    fn from(name: &'b &'a str) -> Self {
        CompositeMember::Exclusive(name)
    }
}

/// A held member of a composite: its lease, kind and fencing token (readers have none).
#[derive(Debug)]
pub(crate) struct HeldMember {
    pub(crate) lease: HeldLease,
    pub(crate) kind: LockKind,
    pub(crate) fencing_token: Option<FencingToken>,
}

/// Several locks of any kind (exclusive locks, read and write locks, semaphore places) acquired
/// together by [`Provider::acquire_all`](crate::Provider::acquire_all) and released together.
///
/// `lost` turns true as soon as any member is lost.
#[must_use = "dropping the guard releases every member at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct CompositeGuard {
    /// In acquisition order (by collection, then name).
    members: Vec<HeldMember>,
    /// The tasks bound to every member's lease (lost when any is).
    bound: crate::lease::bound::Bound,
}

impl CompositeGuard {
    /// Members in acquisition order, won on `runtime`.
    pub(crate) fn new(members: Vec<HeldMember>, runtime: tokio::runtime::Handle) -> Self {
        let lost = LostSignal::new(
            (members.iter())
                .map(|member| Arc::clone(member.lease.state()))
                .collect(),
        );
        CompositeGuard {
            members,
            bound: crate::lease::bound::Bound::new(runtime, lost),
        }
    }

    crate::lease::bound::bound_task_methods!();

    crate::lease::bound::progress_method!(guard => guard.members.iter().map(|member| &member.lease));

    /// The tasks bound to every member's lease.
    fn bound(&self) -> &crate::lease::bound::Bound {
        &self.bound
    }

    /// The members' names, in acquisition order: sorted by the name of their collection, then
    /// by name (for exclusive locks alone, sorted by name).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|member| member.lease.name())
    }

    /// Each member's kind and name, in acquisition order.
    pub fn members(&self) -> impl Iterator<Item = (LockKind, &str)> {
        self.members
            .iter()
            .map(|member| (member.kind, member.lease.name()))
    }

    /// Each member's fencing token, by name, in acquisition order; read locks have none and
    /// are left out.
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.members.iter().filter_map(|member| {
            let token = member.fencing_token?;
            Some((member.lease.name(), token))
        })
    }

    /// Each member's lock id (see [`LockGuard::lock_id`](crate::LockGuard::lock_id)), by name,
    /// in acquisition order.
    pub fn lock_ids(&self) -> impl Iterator<Item = (&str, &str)> {
        self.members.iter().map(|member| {
            (
                member.lease.name(),
                member.lease.lock_id().unwrap_or_default(),
            )
        })
    }

    /// A signal that turns true when any member is known or presumed lost (see
    /// [`LostSignal`]).
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(
            self.members
                .iter()
                .map(|member| Arc::clone(member.lease.state()))
                .collect(),
        )
    }

    /// Whether any member is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.members.iter().any(|member| member.lease.is_lost())
    }

    /// Extends every member's lease to at least `by` from now (all at once); see
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    ///
    /// # Errors
    /// The first member's error, as [`LockGuard::extend`](crate::LockGuard::extend). Bad
    /// input, a member already lost and a member's `max_hold` are refused before anything is
    /// written; when a command fails, others may have been extended, which only lengthens what
    /// is held.
    pub async fn extend(&self, by: std::time::Duration) -> Result<()> {
        for member in &self.members {
            member.lease.check_extension(by)?;
        }
        futures::future::try_join_all(self.members.iter().map(|member| member.lease.extend(by)))
            .await
            .map(drop)
    }

    /// Runs `work` until it completes or any member is lost, whichever comes first; see
    /// [`LockGuard::run_while_held`](crate::LockGuard::run_while_held). On loss the error names
    /// the first member found lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lost().unless_lost(work).await.ok_or_else(|| {
            let lost = self.members.iter().find(|member| member.lease.is_lost());
            Error::LockLost {
                name: lost.map_or_else(
                    || self.names().collect::<Vec<_>>().join(", "),
                    |member| member.lease.name().to_owned(),
                ),
            }
        })
    }

    /// Releases every member (in reverse acquisition order).
    ///
    /// # Errors
    /// The first error of the members' releases (see
    /// [`LockGuard::release`](crate::LockGuard::release)); the other members are released all
    /// the same.
    ///
    /// # Cancel safety
    /// Cancel safe: members not yet released are released in the background when dropped.
    pub async fn release(mut self) -> Result<()> {
        // Its bound tasks end first, while every member is still held.
        self.bound.settle().await;
        let mut first_error = None;
        while let Some(member) = self.members.pop() {
            if let Err(error) = member.lease.release().await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A member held by a composite of any implementation: a guard behind the traits.
#[derive(Debug)]
enum HeldBehindTraits {
    Guard(crate::traits::BoxedGuard),
    Read(crate::traits::BoxedReadGuard),
}

/// The composite guard of [`DistributedLockProvider::acquire_all`](crate::DistributedLockProvider::acquire_all)'s
/// default: its members' guards behind the traits, in acquisition order.
#[derive(Debug)]
struct CompositeOfGuards {
    members: Vec<(String, HeldBehindTraits)>,
}

impl CompositeOfGuards {
    fn lost_signals(&self) -> impl Iterator<Item = LostSignal> + '_ {
        self.members.iter().map(|(_, held)| match held {
            HeldBehindTraits::Guard(guard) => guard.lost(),
            HeldBehindTraits::Read(guard) => guard.lost(),
        })
    }
}

impl crate::traits::DistributedCompositeGuard for CompositeGuard {
    fn names(&self) -> Vec<String> {
        CompositeGuard::names(self).map(str::to_owned).collect()
    }

    fn fencing_tokens(&self) -> Vec<(String, FencingToken)> {
        (CompositeGuard::fencing_tokens(self))
            .map(|(name, token)| (name.to_owned(), token))
            .collect()
    }

    fn lost(&self) -> LostSignal {
        CompositeGuard::lost(self)
    }

    fn is_lost(&self) -> bool {
        CompositeGuard::is_lost(self)
    }

    fn extend(&self, by: std::time::Duration) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(CompositeGuard::extend(self, by))
    }

    fn release(self: Box<Self>) -> futures::future::BoxFuture<'static, Result<()>> {
        Box::pin(CompositeGuard::release(*self))
    }
}

impl crate::traits::DistributedCompositeGuard for CompositeOfGuards {
    fn names(&self) -> Vec<String> {
        self.members.iter().map(|(name, _)| name.clone()).collect()
    }

    fn fencing_tokens(&self) -> Vec<(String, FencingToken)> {
        (self.members.iter())
            .filter_map(|(name, held)| match held {
                HeldBehindTraits::Guard(guard) => Some((name.clone(), guard.fencing_token())),
                HeldBehindTraits::Read(_) => None,
            })
            .collect()
    }

    fn lost(&self) -> LostSignal {
        let mut signals = self.lost_signals();
        let first = signals
            .next()
            .unwrap_or_else(|| LostSignal::new(Vec::new()));
        signals.fold(first, |all, next| all.and(&next))
    }

    fn is_lost(&self) -> bool {
        self.lost_signals().any(|signal| signal.is_lost())
    }

    fn extend(&self, by: std::time::Duration) -> futures::future::BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let extensions = self.members.iter().map(|(_, held)| match held {
                HeldBehindTraits::Guard(guard) => guard.extend(by),
                HeldBehindTraits::Read(guard) => guard.extend(by),
            });
            futures::future::try_join_all(extensions).await.map(drop)
        })
    }

    fn release(self: Box<Self>) -> futures::future::BoxFuture<'static, Result<()>> {
        Box::pin(async move {
            let mut first_error = None;
            for (_, held) in self.members.into_iter().rev() {
                let released = match held {
                    HeldBehindTraits::Guard(guard) => guard.release().await,
                    HeldBehindTraits::Read(guard) => guard.release().await,
                };
                if let Err(error) = released {
                    first_error.get_or_insert(error);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }
}

/// The members in one global order, for composites behind the traits: by kind (exclusive
/// locks, then reader-writer locks, then semaphores), then by name; refused if empty or if a
/// lock comes twice (a read and a write lock of one name are the same lock).
pub(crate) fn in_trait_order<'a>(
    members: &[CompositeMember<'a>],
) -> Result<Vec<CompositeMember<'a>>> {
    let key = |member: &CompositeMember<'a>| {
        let rank = match member.kind() {
            LockKind::Read | LockKind::Write => 1,
            LockKind::Semaphore => 2,
            LockKind::Exclusive | LockKind::Document => 0,
        };
        (rank, member.name())
    };
    in_order(members.to_vec(), key)
}

/// `members` sorted by `key` (a lock's place in the global order: two members with one key
/// are the same lock); refused if empty or if a lock comes twice.
pub(crate) fn in_order<'a, K: Ord>(
    mut members: Vec<CompositeMember<'a>>,
    key: impl Fn(&CompositeMember<'a>) -> K,
) -> Result<Vec<CompositeMember<'a>>> {
    members.sort_by_cached_key(&key);
    if members.is_empty() {
        return Err(Error::InvalidArgument(
            "acquire_all needs at least one lock".to_owned(),
        ));
    }
    if let Some(pair) = members
        .windows(2)
        .find(|pair| key(&pair[0]) == key(&pair[1]))
    {
        return Err(Error::InvalidArgument(format!(
            "acquire_all got the lock name {:?} twice (as {:?} and {:?})",
            crate::error::shown_name(pair[0].name()),
            pair[0].kind(),
            pair[1].kind(),
        )));
    }
    Ok(members)
}

/// Acquires `members` of `locks` together within `wait`, in [`in_trait_order`], all or
/// nothing: the guard, or the member still busy when `wait` ran out (nothing held then). The
/// default of [`DistributedLockProvider::acquire_all`](crate::DistributedLockProvider::acquire_all).
pub(crate) async fn acquire_behind_traits<'a, P>(
    locks: &P,
    members: &[CompositeMember<'a>],
    wait: std::time::Duration,
) -> Result<std::result::Result<crate::traits::BoxedCompositeGuard, CompositeMember<'a>>>
where
    P: crate::traits::DistributedLockProvider + ?Sized,
{
    let members = in_trait_order(members)?;
    let started = tokio::time::Instant::now();
    // On failure, the members acquired so far are dropped: released.
    let mut held = Vec::with_capacity(members.len());
    for member in members {
        let left = wait.saturating_sub(started.elapsed());
        let acquired = match member {
            CompositeMember::Exclusive(name) => {
                let lock = locks.create_lock(name);
                lock.try_acquire_timeout(left)
                    .await?
                    .map(HeldBehindTraits::Guard)
            }
            CompositeMember::Write(name) => {
                let rw = locks.create_reader_writer_lock(name);
                rw.try_acquire_write_timeout(left)
                    .await?
                    .map(HeldBehindTraits::Guard)
            }
            CompositeMember::Read(name) => {
                let rw = locks.create_reader_writer_lock(name);
                rw.try_acquire_read_timeout(left)
                    .await?
                    .map(HeldBehindTraits::Read)
            }
            CompositeMember::Semaphore { name, max_count } => {
                let semaphore = locks.create_semaphore(name, max_count);
                semaphore
                    .try_acquire_timeout(left)
                    .await?
                    .map(HeldBehindTraits::Guard)
            }
        };
        match acquired {
            Some(acquired) => held.push((member.name().to_owned(), acquired)),
            None => return Ok(Err(member)),
        }
    }
    Ok(Ok(Box::new(CompositeOfGuards { members: held })))
}

/// The error of a composite whose member `busy` stayed busy for `timeout`, since `started`:
/// [`Error::Timeout`] with who holds it, as read within a bound.
pub(crate) async fn busy_behind_traits<P>(
    locks: &P,
    busy: CompositeMember<'_>,
    timeout: std::time::Duration,
    started: tokio::time::Instant,
) -> Error
where
    P: crate::traits::DistributedLockProvider + ?Sized,
{
    let read_limit = crate::lease::acquire::holders_read_limit(timeout);
    let holders = tokio::time::timeout(read_limit, holders_behind_traits(locks, busy)).await;
    Error::Timeout {
        name: busy.name().to_owned(),
        waited: started.elapsed(),
        holders: holders.ok().and_then(Result::ok).unwrap_or_default(),
    }
}

/// Who holds the composite member `member` of `locks` now.
async fn holders_behind_traits<P: crate::traits::DistributedLockProvider + ?Sized>(
    locks: &P,
    member: CompositeMember<'_>,
) -> Result<Vec<crate::LockStatus>> {
    match member {
        CompositeMember::Exclusive(name) => locks.create_lock(name).holders().await,
        CompositeMember::Read(name) | CompositeMember::Write(name) => {
            locks.create_reader_writer_lock(name).holders().await
        }
        CompositeMember::Semaphore { name, max_count } => {
            locks.create_semaphore(name, max_count).holders().await
        }
    }
}
