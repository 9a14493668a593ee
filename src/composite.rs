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
}

impl CompositeGuard {
    /// Members in acquisition order.
    pub(crate) fn new(members: Vec<HeldMember>) -> Self {
        CompositeGuard { members }
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
        let mut first_error = None;
        while let Some(member) = self.members.pop() {
            if let Err(error) = member.lease.release().await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
