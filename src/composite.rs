//! Several exclusive locks held together.

use std::sync::Arc;

use crate::{Error, FencingToken, LockGuard, LostSignal, Result};

/// Several exclusive locks acquired together by
/// [`Provider::acquire_all`](crate::Provider::acquire_all) and released together.
///
/// `lost` turns true as soon as any member is lost.
#[must_use = "dropping the guard releases every member at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct CompositeGuard {
    /// In acquisition (sorted name) order.
    members: Vec<LockGuard>,
}

impl CompositeGuard {
    /// Members acquired in sorted name order.
    pub(crate) fn new(members: Vec<LockGuard>) -> Self {
        CompositeGuard { members }
    }

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
                .map(|member| Arc::clone(member.lease_state()))
                .collect(),
        )
    }

    /// Whether any member is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.members.iter().any(LockGuard::is_lost)
    }

    /// Runs `work` until it completes or any member is lost, whichever comes first; see
    /// [`LockGuard::run_while_held`]. On loss the error names the first member found lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping this future drops `work`; the guard stays held.
    pub async fn run_while_held<F: Future>(&self, work: F) -> Result<F::Output> {
        self.lost().unless_lost(work).await.ok_or_else(|| {
            let lost = self.members.iter().find(|member| member.is_lost());
            Error::LockLost {
                name: lost.map_or_else(
                    || self.names().collect::<Vec<_>>().join(", "),
                    |member| member.name().to_owned(),
                ),
            }
        })
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
