//! Scheduled jobs: work that runs at most once per window across every instance of a service.

use std::time::Duration;

use mongodb::Database;

use crate::details::LockDetails;
use crate::error::Result;
use crate::guard::LockGuard;
use crate::lease::acquire::ReadHolders;
use crate::lease::held;
use crate::lock::MongoDistributedLock;
use crate::lock_status::LockStatus;
use crate::traits::{DistributedLock, DistributedLockGuard};

/// A job that runs at most once per window across every instance of a service, whatever
/// scheduler fires it and however far apart the instances' timers are.
///
/// [`run`](Self::run) tries the job's lock once: if another instance holds it, or ran the job
/// less than a window ago, the work is skipped and [`JobRun::Skipped`] tells who holds it and
/// until when; otherwise the work runs bound to the lease (dropped at its current `.await` if
/// the lock is lost: make the writes that matter fenced, see [`Fence`](crate::Fence)), and the
/// lock is released when it completes. The lock has a [`min_hold`](crate::LockOptions::min_hold) of
/// the window, so an instance whose timer fires seconds later finds it taken until
/// `acquired_at + window` by the server's clock, and a [`max_hold`](crate::LockOptions::max_hold) of
/// the job's longest run when one is set.
///
/// Set the window a little shorter than the schedule's period (55 minutes for an hourly job):
/// the next period's run must find it over.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use std::time::Duration;
/// use distributed_lock_mongodb::{Job, JobRun};
///
/// let report = Job::new("nightly-report", Duration::from_secs(23 * 60 * 60), &database)
///     .max_runtime(Duration::from_secs(60 * 60));
/// // Called by every instance's scheduler at about 02:00.
/// match report.run(async |_guard| { /* build the report */ }).await? {
///     JobRun::Ran(()) => println!("this instance ran the report"),
///     JobRun::Skipped(skipped) => println!("skipped: {skipped}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Job {
    lock: MongoDistributedLock,
    window: Duration,
    max_runtime: Option<Duration>,
}

/// What [`Job::run`] did.
#[derive(Debug)]
#[must_use = "the work may have been skipped"]
pub enum JobRun<T> {
    /// This instance ran the work, with this output.
    Ran(T),
    /// Another instance holds the job's lock, or ran it less than a window ago: the work did
    /// not run here. (Boxed: a status is large next to most outputs.)
    Skipped(Box<Skipped>),
}

impl<T> JobRun<T> {
    /// Whether the work ran here.
    pub fn ran(&self) -> bool {
        matches!(self, JobRun::Ran(_))
    }
}

/// Why [`Job::run`] skipped the work: the job's lock as it stood just after the attempt.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Skipped {
    /// The job's lock: with a `lock_id` while an instance runs it (its details say which), without
    /// one when the last run is over and the window keeps the lock taken until `expires_at`.
    /// `None` if the lock was freed between the attempt and the read (the next call runs it).
    pub status: Option<LockStatus>,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(status) = &self.status else {
            return formatter.write_str("the job's lock was taken, and free again when read");
        };
        let who = match (status.owner(), status.host(), status.pid()) {
            (Some(owner), _, _) => format!(" by {owner}"),
            (None, Some(host), Some(pid)) => format!(" by {host} (pid {pid})"),
            (None, Some(host), None) => format!(" by {host}"),
            _ => String::new(),
        };
        let until = status
            .expires_at
            .and_then(|at| at.try_to_rfc3339_string().ok())
            .unwrap_or_else(|| "its expiry".to_owned());
        if status.lock_id.is_some() {
            write!(
                formatter,
                "running{who}, its lease ends at {until} (server time)"
            )
        } else {
            write!(
                formatter,
                "ran{who} less than a window ago; due again after {until} (server time)"
            )
        }
    }
}

impl Job {
    /// A job called `name` that runs at most once per `window`, whose lock lives in
    /// `database`'s `distributed_locks` collection (it is an exclusive lock of that name, with
    /// this process's [`LockDetails`]). A `window` outside 1 ms–365 days is reported by
    /// [`run`](Self::run) ([`Error::InvalidOptions`](crate::Error::InvalidOptions)).
    pub fn new(name: impl Into<String>, window: Duration, database: &Database) -> Job {
        Job::from_lock(
            MongoDistributedLock::new(name, database).with_details(LockDetails::new()),
            window,
        )
    }

    /// A job that runs under `lock` (its name, collection, options and details: a
    /// [`Provider`](crate::Provider)'s lock shares its renewals) at most once per `window`.
    pub fn from_lock(lock: MongoDistributedLock, window: Duration) -> Job {
        Job {
            lock,
            window,
            max_runtime: None,
        }
    }

    /// Stops a run that takes longer than `max_runtime` (its lock's
    /// [`max_hold`](crate::LockOptions::max_hold)): the work is dropped and [`run`](Self::run) returns
    /// [`Error::LockLost`](crate::Error::LockLost). Defaults to none. Must be at least the
    /// lock's expiry and the window.
    #[must_use]
    pub fn max_runtime(mut self, max_runtime: Duration) -> Self {
        self.max_runtime = Some(max_runtime);
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// The lock the job runs under, with the job's window and longest run in its options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) for a window or longest run out of
    /// range, or in the wrong order.
    pub fn lock(&self) -> Result<MongoDistributedLock> {
        let mut options = self.lock.options().to_builder().min_hold(self.window);
        if let Some(max_runtime) = self.max_runtime {
            options = options.max_hold(max_runtime);
        }
        Ok(self.lock.clone().with_options(options.build()?))
    }

    /// Runs `work` if no instance holds the job's lock and none ran it less than a window ago,
    /// bound to the lease; otherwise skips it. One attempt, no waiting.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the lock was lost while `work` ran (it was
    /// dropped); [`Error::InvalidOptions`](crate::Error::InvalidOptions) as [`lock`](Self::lock);
    /// otherwise as [`MongoDistributedLock::try_acquire`]. A release that fails after `work`
    /// completed is logged, not returned (the lease ends by itself).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops `work` and the guard, which releases the lock in
    /// the background (it stays taken until the window is over).
    pub async fn run<T>(&self, work: impl AsyncFnOnce(&LockGuard) -> T) -> Result<JobRun<T>> {
        let lock = self.lock()?;
        let Some(guard) = lock.try_acquire().await? else {
            return Ok(JobRun::Skipped(Box::new(Skipped {
                status: lock.status().await?,
            })));
        };
        let output = guard.run_while_held(work(&guard)).await;
        held::after_release(self.name(), output, guard.release().await).map(JobRun::Ran)
    }
}

/// A [`Job`] over a lock of any implementation (the in-memory double's in unit tests), made by
/// [`DistributedLockProvider::create_job`](crate::DistributedLockProvider::create_job): it runs
/// at most once per window across every instance as a `Job` does, and its work gets the guard
/// behind the trait.
#[derive(Debug)]
pub struct DistributedJob {
    /// The job's lock, with its window as `min_hold` (and its longest run as `max_hold`).
    lock: Box<dyn JobLock>,
}

/// A job's lock: acquired behind the trait, and read with the window that keeps it taken.
pub(crate) trait JobLock: DistributedLock + ReadHolders {}

impl<L: DistributedLock + ReadHolders> JobLock for L {}

impl DistributedJob {
    /// The job over `lock`, whose options already hold the window.
    pub(crate) fn over(lock: Box<dyn JobLock>) -> DistributedJob {
        DistributedJob { lock }
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Runs `work` if no instance holds the job's lock and none ran it less than a window ago,
    /// bound to the lease; otherwise skips it, saying who holds the lock ([`Job::run`]).
    ///
    /// # Errors
    /// As [`Job::run`].
    ///
    /// # Cancel safety
    /// As [`Job::run`].
    pub async fn run<T>(
        &self,
        work: impl AsyncFnOnce(&dyn DistributedLockGuard) -> T,
    ) -> Result<JobRun<T>> {
        let Some(guard) = self.lock.try_acquire().await? else {
            // Its holder, or the window that keeps it taken.
            let status = self.lock.read_holders().await?.into_iter().next();
            return Ok(JobRun::Skipped(Box::new(Skipped { status })));
        };
        let output = guard.run_while_held(work(guard.as_ref())).await;
        held::after_release(self.name(), output, guard.release().await).map(JobRun::Ran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_says_who_holds_the_job_and_until_when() {
        let at = mongodb::bson::DateTime::from_millis(1_800_000_000_000);
        let mut status = LockStatus {
            name: "report".to_owned(),
            kind: crate::lock_status::LockKind::Exclusive,
            lock_id: Some("abc".to_owned()),
            acquired_at: None,
            expires_at: Some(at),
            renewed_at: None,
            fencing_token: None,
            remaining: Some(Duration::from_secs(5)),
            kept: None,
            min_hold_until: None,
            details: Some(LockDetails::new().with_owner("worker-7")),
            places: 1,
            upgradeable: false,
            revocation: None,
        };
        let running = Skipped {
            status: Some(status.clone()),
        };
        assert_eq!(
            running.to_string(),
            "running by worker-7, its lease ends at 2027-01-15T08:00:00Z (server time)"
        );
        status.lock_id = None;
        assert_eq!(
            Skipped {
                status: Some(status)
            }
            .to_string(),
            "ran by worker-7 less than a window ago; due again after 2027-01-15T08:00:00Z (server time)"
        );
    }
}
