//! Several exclusive locks held together.

use std::time::Duration;

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::lost::LostSignal;
use crate::{Error, FencingToken, LockGuard, Provider, Result, backoff};

/// Several exclusive locks acquired together by
/// [`Provider::acquire_all`](crate::Provider::acquire_all) and released together.
///
/// `lost` turns true as soon as any member is lost.
#[must_use = "dropping the guard releases every member at once"]
#[derive(Debug)]
pub struct CompositeGuard {
    /// In acquisition (sorted name) order.
    members: Vec<LockGuard>,
}

impl CompositeGuard {
    /// The members' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(LockGuard::name)
    }

    /// Each member's fencing token, by name (sorted).
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, FencingToken)> {
        self.members
            .iter()
            .map(|member| (member.name(), member.fencing_token()))
    }

    /// A signal that turns true when any member is known or presumed lost (see
    /// [`LostSignal`]).
    pub fn lost(&self) -> LostSignal {
        LostSignal::new(
            self.members
                .iter()
                .map(|member| Arc::clone(member.lease()))
                .collect(),
        )
    }

    /// Whether any member is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.members.iter().any(LockGuard::is_lost)
    }

    /// Releases every member (in reverse acquisition order).
    ///
    /// # Errors
    /// The first error of the members' releases (see [`LockGuard::release`]); the other members
    /// are released all the same.
    ///
    /// # Cancel safety
    /// Cancel safe: members not yet released are released in the background when dropped.
    pub async fn release(mut self) -> Result<()> {
        let mut first_error = None;
        while let Some(member) = self.members.pop() {
            if let Err(error) = member.release().await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Acquires every name in sorted order, so callers with overlapping sets cannot deadlock;
/// all or nothing.
pub(crate) async fn acquire_all(
    provider: &Provider,
    names: &[&str],
    timeout: Duration,
) -> Result<CompositeGuard> {
    let mut sorted: Vec<&str> = names.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Err(Error::InvalidArgument(
            "acquire_all needs at least one lock name".to_owned(),
        ));
    }
    if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(Error::InvalidArgument(format!(
            "acquire_all got the lock name {:?} twice",
            crate::error::shown_name(pair[0])
        )));
    }
    Handle::try_current().map_err(|_| Error::NoRuntime)?;
    let started = Instant::now();
    let deadline = backoff::deadline_after(started, timeout);
    let mut members = Vec::with_capacity(sorted.len());
    for name in sorted {
        let remaining = deadline.map_or(Duration::MAX, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        });
        // On failure the members acquired so far are dropped: released at once.
        let member = provider.create_lock(name).acquire_timeout(remaining).await;
        members.push(member.map_err(|error| match error {
            Error::Timeout {
                operation,
                waited: _,
                name,
            } => Error::Timeout {
                operation,
                name,
                waited: started.elapsed(),
            },
            other => other,
        })?);
    }
    Ok(CompositeGuard { members })
}
