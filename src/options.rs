//! Lock options and their builder.

use std::time::Duration;

use mongodb::options::{Acknowledgment, WriteConcern};

use crate::error::{Error, Result};

const DEFAULT_EXPIRY: Duration = Duration::from_secs(30);
const MIN_EXPIRY: Duration = Duration::from_millis(100);
/// Upper bound for every duration option: keeps all deadline arithmetic far from overflow.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);
const DEFAULT_MIN_BUSY_WAIT: Duration = Duration::from_millis(10);
const DEFAULT_MAX_BUSY_WAIT: Duration = Duration::from_millis(800);
/// The clock-skew tolerance for the default expiry; shorter expiries default to a tenth of it.
const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// How a lock behaves: lease length, renewal cadence, waiting and durability.
///
/// Build one with [`LockOptions::builder`]; [`LockOptions::default`] gives the documented
/// defaults. All durations are used at millisecond precision (sub-millisecond parts are dropped).
///
/// ```
/// use std::time::Duration;
/// use distributed_lock_mongodb::LockOptions;
///
/// let options = LockOptions::builder()
///     .expiry(Duration::from_secs(10))
///     .adaptive_backoff(true)
///     .build()?;
/// assert_eq!(options.extension_cadence(), Duration::from_millis(3_333));
/// # Ok::<(), distributed_lock_mongodb::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct LockOptions {
    expiry: Duration,
    extension_cadence: Duration,
    min_busy_wait: Duration,
    max_busy_wait: Duration,
    adaptive_backoff: bool,
    write_concern: WriteConcern,
    max_clock_skew: Duration,
    max_hold: Option<Duration>,
    max_idle: Option<Duration>,
    min_hold: Option<Duration>,
    /// Set by the builder; `None`: half of what a renewal normally leaves.
    renewal_warning: Option<f64>,
    automatic_ttl_index: bool,
    auto_renew: bool,
    fair: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            expiry: DEFAULT_EXPIRY,
            extension_cadence: DEFAULT_EXPIRY / 3,
            min_busy_wait: DEFAULT_MIN_BUSY_WAIT,
            max_busy_wait: DEFAULT_MAX_BUSY_WAIT,
            adaptive_backoff: false,
            write_concern: WriteConcern::majority(),
            max_clock_skew: default_clock_skew(DEFAULT_EXPIRY),
            max_hold: None,
            max_idle: None,
            min_hold: None,
            renewal_warning: None,
            automatic_ttl_index: true,
            auto_renew: true,
            fair: false,
        }
    }
}

/// `min(1 s, expiry / 10)`, in whole milliseconds.
fn default_clock_skew(expiry: Duration) -> Duration {
    whole_millis(DEFAULT_MAX_CLOCK_SKEW.min(expiry / 10))
}

impl LockOptions {
    /// Starts building options from the defaults.
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder::default()
    }

    /// A builder that starts from these options (every value set, the clock-skew tolerance
    /// included), to change some of them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// let base = LockOptions::builder().expiry(Duration::from_secs(10)).build()?;
    /// let job = base.to_builder().min_hold(Duration::from_secs(60)).build()?;
    /// assert_eq!((job.expiry(), job.min_hold()), (base.expiry(), Some(Duration::from_secs(60))));
    /// # Ok::<(), distributed_lock_mongodb::Error>(())
    /// ```
    pub fn to_builder(&self) -> LockOptionsBuilder {
        LockOptionsBuilder {
            expiry: Some(self.expiry),
            extension_cadence: Some(self.extension_cadence),
            busy_wait: Some((self.min_busy_wait, self.max_busy_wait)),
            adaptive_backoff: self.adaptive_backoff,
            write_concern: Some(self.write_concern.clone()),
            max_clock_skew: Some(self.max_clock_skew),
            max_hold: self.max_hold,
            max_idle: self.max_idle,
            min_hold: self.min_hold,
            renewal_warning: self.renewal_warning,
            manual_ttl_index: !self.automatic_ttl_index,
            manual_renewal: !self.auto_renew,
            fair: self.fair,
        }
    }

    /// How long a lease lasts without renewal.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// How often a held lock renews its lease.
    pub fn extension_cadence(&self) -> Duration {
        self.extension_cadence
    }

    /// The range `(min, max)` of the sleep between two acquisition attempts.
    pub fn busy_wait_sleep_time(&self) -> (Duration, Duration) {
        (self.min_busy_wait, self.max_busy_wait)
    }

    /// Whether sleeps between attempts grow exponentially instead of being uniformly random.
    pub fn adaptive_backoff(&self) -> bool {
        self.adaptive_backoff
    }

    /// The write concern of acquire, renew and release.
    pub fn write_concern(&self) -> &WriteConcern {
        &self.write_concern
    }

    /// How much earlier than the server-side expiry a holder considers its lease gone, besides
    /// [`max_clock_skew`](Self::max_clock_skew): `max(2 ms, 1 % of expiry)`. It absorbs
    /// clock-rate differences and scheduling delays.
    pub fn safety_margin(&self) -> Duration {
        (self.expiry / 100).max(Duration::from_millis(2))
    }

    /// The largest disagreement assumed between the clocks of any two servers that evaluate
    /// `$$NOW` for this lock: every `mongos` router clients use and every member that may become
    /// primary, and the largest forward step any of those clocks may take (an NTP step, a
    /// resumed virtual machine). Lease ends are computed by whichever router or primary runs the
    /// command, and another client's router may see the lease end this much earlier, so a holder
    /// presumes its lease lost this much sooner. A forward step beyond it is detected at the next
    /// renewal and reported as a loss, but another client may hold the lock before then: see the
    /// crate docs on clocks.
    pub fn max_clock_skew(&self) -> Duration {
        self.max_clock_skew
    }

    /// The longest a lock may be held: counted from when the acquiring request was sent, after
    /// this long renewal stops and `lost` fires. `None` (the default): no limit.
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// How long the holder's work may go without reporting progress (see
    /// [`LockOptionsBuilder::max_idle`]). `None` (the default): no limit.
    pub fn max_idle(&self) -> Option<Duration> {
        self.max_idle
    }

    /// The shortest a lock stays taken on the server once acquired, by the server's clock (see
    /// [`LockOptionsBuilder::min_hold`]). `None` (the default): a release frees it at once.
    pub fn min_hold(&self) -> Option<Duration> {
        self.min_hold
    }

    /// Whether held leases are renewed in the background (see
    /// [`LockOptionsBuilder::auto_renew`]). `true` by default.
    pub fn auto_renew(&self) -> bool {
        self.auto_renew
    }

    /// Whether waiters of every process are served in arrival order (see
    /// [`LockOptionsBuilder::fair`]). `false` by default.
    pub fn fair(&self) -> bool {
        self.fair
    }

    /// Whether the first acquisition in a collection creates its TTL index (see
    /// [`LockOptionsBuilder::automatic_ttl_index`]).
    pub fn automatic_ttl_index(&self) -> bool {
        self.automatic_ttl_index
    }

    /// How long after sending a confirmed request the holder may rely on its lease:
    /// `expiry − safety margin − max clock skew`. The only place this formula exists; every
    /// deadline comes from it (`lease::protocol::Lease`).
    pub(crate) fn lease_lifetime(&self) -> Duration {
        self.expiry - self.safety_margin() - self.max_clock_skew
    }

    /// The expiry in whole milliseconds, as stored arithmetic on the server uses it.
    pub(crate) fn expiry_millis(&self) -> i64 {
        // At most 365 days: always fits.
        i64::try_from(self.expiry.as_millis()).unwrap_or(i64::MAX)
    }

    /// A renewal confirmed with less than this left before the lease's local deadline logs a
    /// `warn` event ("a renewal confirmed a lease with little of it left"): renewals are late
    /// (a slow server or network, a starved process), and a loss may follow. By default half of
    /// what a renewal normally leaves, `(lifetime − cadence) / 2` where the lifetime is
    /// `expiry − margin − max_clock_skew`; see [`LockOptionsBuilder::renewal_warning`].
    pub fn renewal_warning(&self) -> Duration {
        match self.renewal_warning {
            Some(fraction) => self.expiry.mul_f64(fraction),
            None => self.lease_lifetime().saturating_sub(self.extension_cadence) / 2,
        }
    }

    /// [`min_hold`](Self::min_hold) in milliseconds.
    pub(crate) fn min_hold_millis(&self) -> Option<i64> {
        // At most 365 days: always fits.
        self.min_hold
            .map(|min_hold| i64::try_from(min_hold.as_millis()).unwrap_or(i64::MAX))
    }

    /// How long the lease an acquisition writes lasts on the server: `expiry`, or `min_hold` if
    /// that is longer (a holder that dies early keeps the lock taken until then).
    pub(crate) fn acquired_lease_millis(&self) -> i64 {
        self.expiry_millis()
            .max(self.min_hold_millis().unwrap_or(0))
    }

    /// [`Error::InvalidOptions`] if `min_hold` is set for a kind of lock that does not support
    /// it (`kind` names it in the message).
    pub(crate) fn check_min_hold_unsupported(&self, kind: &str) -> Result<()> {
        match self.min_hold {
            None => Ok(()),
            Some(min_hold) => Err(invalid(format!(
                "min_hold ({min_hold:?}) applies to exclusive locks and leader elections only, \
                 not to a {kind}"
            ))),
        }
    }

    /// As [`check_min_hold_unsupported`](Self::check_min_hold_unsupported), and the same for
    /// `fair`, which exclusive locks, semaphores and reader-writer locks support.
    pub(crate) fn check_neither_min_hold_nor_fair(&self, kind: &str) -> Result<()> {
        self.check_min_hold_unsupported(kind)?;
        if self.fair {
            return Err(invalid(format!(
                "fair(true) applies to exclusive locks, semaphores and reader-writer locks, not \
                 to a {kind}"
            )));
        }
        Ok(())
    }
}

/// Builder for [`LockOptions`]; every setter is optional and [`build`](Self::build) validates.
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LockOptionsBuilder {
    expiry: Option<Duration>,
    extension_cadence: Option<Duration>,
    busy_wait: Option<(Duration, Duration)>,
    adaptive_backoff: bool,
    write_concern: Option<WriteConcern>,
    max_clock_skew: Option<Duration>,
    max_hold: Option<Duration>,
    max_idle: Option<Duration>,
    min_hold: Option<Duration>,
    renewal_warning: Option<f64>,
    manual_ttl_index: bool,
    manual_renewal: bool,
    fair: bool,
}

impl LockOptionsBuilder {
    /// How long a lease lasts unless renewed: after a crash, the lock frees itself this long after
    /// the last renewal. Defaults to 30 s; must be between 100 ms and 365 days.
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.expiry = Some(expiry);
        self
    }

    /// How often a held lock renews its lease. Defaults to `expiry / 3`; must be at least 1 ms and
    /// less than `expiry` minus the [safety margin](LockOptions::safety_margin) and the
    /// [clock skew](Self::max_clock_skew) (a slower cadence would let every lease be presumed
    /// lost before its renewal).
    pub fn extension_cadence(mut self, cadence: Duration) -> Self {
        self.extension_cadence = Some(cadence);
        self
    }

    /// The range of the sleep between two acquisition attempts while the lock is busy. Defaults
    /// to 10 ms ..= 800 ms; needs `min <= max`, `max > 0` and `max <= 365 days`.
    pub fn busy_wait_sleep_time(mut self, min: Duration, max: Duration) -> Self {
        self.busy_wait = Some((min, max));
        self
    }

    /// When true, the N-th consecutive failed attempt sleeps `max(min, 1 ms) × 1.5^N` (±20 %
    /// jitter, clamped to the busy-wait range) instead of a uniformly random time in the range,
    /// which cuts the commands sent under heavy contention. Defaults to false.
    pub fn adaptive_backoff(mut self, adaptive: bool) -> Self {
        self.adaptive_backoff = adaptive;
        self
    }

    /// Write concern for acquire, renew and release. Defaults to `w: "majority"`: an
    /// acknowledged write that a replica-set failover rolls back could otherwise create a second
    /// holder. Lower it only where majority writes are impossible or too slow (for example a
    /// primary–secondary–arbiter set with a member down) and you accept that risk. Unacknowledged
    /// writes (`w: 0`) are rejected: a lock cannot be confirmed without a reply.
    pub fn write_concern(mut self, write_concern: WriteConcern) -> Self {
        self.write_concern = Some(write_concern);
        self
    }

    /// The largest disagreement between the clocks of the servers that evaluate `$$NOW` for
    /// these locks (every `mongos` any client routes through, every member that can become
    /// primary). A holder presumes its lease lost `max_clock_skew` earlier than it otherwise
    /// would, so that a client whose router's clock runs ahead cannot take the lock while the
    /// holder still believes it holds it. Defaults to 1 s, or `expiry / 10` when that is
    /// shorter; `expiry` must exceed skew + safety margin + cadence. Set it to your cluster's
    /// real bound (NTP keeps servers within milliseconds; one without time sync can drift by
    /// seconds a day). Zero is allowed for a single server whose clock is the only one.
    pub fn max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_clock_skew = Some(skew);
        self
    }

    /// The longest a lock may be held, renewals included: once this long has passed since the
    /// acquiring request was sent, the lease is no longer renewed and `lost` fires, so a holder
    /// that is stuck (a hung task, a deadlock) while its process keeps renewing cannot keep the
    /// lock forever. Others can take the lock once the last renewal's lease ends on the server,
    /// at most `expiry` later (at once if the guard is released or dropped). Defaults to no
    /// limit; must be at least `expiry` (for a shorter limit, shorten the expiry) and at most
    /// 365 days.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// // A nightly job that never legitimately runs for more than an hour.
    /// let options = LockOptions::builder()
    ///     .max_hold(Duration::from_secs(60 * 60))
    ///     .build()?;
    /// assert_eq!(options.max_hold(), Some(Duration::from_secs(3_600)));
    /// # Ok::<(), distributed_lock_mongodb::Error>(())
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Progress-based liveness: the lease is renewed only while the holder's work reports
    /// progress (`progress()` on its guard) at least every `max_idle`, counted from the
    /// acquiring request's send. A holder whose work stalls (a hung task, a deadlock, a loop
    /// that no longer advances) while its process keeps renewing loses the lock `max_idle` after
    /// its last progress: `lost` fires (loss reason `max_idle`, also the metric's label), the
    /// lease is no longer renewed, and others can take the lock once the last renewal's lease
    /// ends on the server, at most `expiry` later. Defaults to no limit; between 1 ms and 365
    /// days.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// // A worker that finishes a batch every few seconds when healthy.
    /// let options = LockOptions::builder().max_idle(Duration::from_secs(60)).build()?;
    /// assert_eq!(options.max_idle(), Some(Duration::from_secs(60)));
    /// # Ok::<(), distributed_lock_mongodb::Error>(())
    /// ```
    pub fn max_idle(mut self, max_idle: Duration) -> Self {
        self.max_idle = Some(max_idle);
        self
    }

    /// The shortest a lock stays taken once acquired, by the server's clock: released (or
    /// dropped, or lost by its holder's process dying) before `acquired_at + min_hold`, the lock
    /// stays taken on the server until then, so instances whose timers disagree run a job at
    /// most once per window (ShedLock's `lockAtLeastFor`). `release()` still returns at once.
    /// Measured from the acquisition's `acquiredAt`, the time of the server that ran it.
    ///
    /// Applies to exclusive locks, and to what is built on them (leader elections, composites of
    /// exclusive locks, [`Job`](crate::Job)); other kinds refuse options that set it
    /// ([`Error::InvalidOptions`] from their first call). A lock with a `min_hold` is never
    /// handed over to a local waiter in its release command. Defaults to none; must be between
    /// 1 ms and 365 days, and at most [`max_hold`](Self::max_hold) when both are set (a job
    /// stopped at `max_hold` still keeps others out until `min_hold`: keep them in that order).
    ///
    /// ```
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// // An hourly job: whichever instance's timer fires first runs it, the others skip it
    /// // for the rest of the hour even if it finished in seconds.
    /// let options = LockOptions::builder()
    ///     .min_hold(Duration::from_secs(55 * 60))
    ///     .build()?;
    /// assert_eq!(options.min_hold(), Some(Duration::from_secs(3_300)));
    /// # Ok::<(), distributed_lock_mongodb::Error>(())
    /// ```
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Warns (a `warn` event) when a renewal is confirmed with less than `fraction` of the
    /// expiry left before the lease's local deadline, so late renewals are visible before a
    /// loss; 0 turns the warning off. Defaults to half of what a renewal normally leaves (see
    /// [`LockOptions::renewal_warning`]); must be between 0 and 1. With the `metrics` feature,
    /// what is left at each renewal is also the histogram `distributed_lock_lease_left_seconds`.
    pub fn renewal_warning(mut self, fraction: f64) -> Self {
        self.renewal_warning = Some(fraction);
        self
    }

    /// Whether the first successful acquisition in a lock collection (exclusive locks,
    /// reader-writer locks, semaphores) creates the collection's TTL index on `expiresAt` in
    /// the background, once per process. Defaults to true. Turn it off where the application's
    /// database user may not create indexes, or indexes are managed by deployment scripts: create
    /// them once with [`Provider::create_indexes`](crate::Provider::create_indexes) (or by hand:
    /// `{expiresAt: 1}`, `expireAfterSeconds: 86400`, name `expiresAt_ttl`), or call
    /// [`Provider::purge_expired`](crate::Provider::purge_expired) periodically. Without either,
    /// lock documents are never deleted; locks stay correct.
    pub fn automatic_ttl_index(mut self, enabled: bool) -> Self {
        self.manual_ttl_index = !enabled;
        self
    }

    /// Whether a held lease is renewed in the background. Defaults to true: the lease lasts
    /// while the guard lives (and its process can reach the server), up to
    /// [`max_hold`](Self::max_hold).
    ///
    /// With `false` nothing renews it: the lease ends `expiry` after the acquisition was sent
    /// unless the holder extends it with the guard's `extend(by)` (which never shortens it,
    /// and never past `max_hold`), and at its end the guard's `lost` signal fires (loss reason
    /// `expired`), as for a renewed lease that ran out. Fencing tokens, handoff to local
    /// waiters, `min_hold`, releases and shutdowns are the same. Use it where the work must
    /// prove it is making progress (extend after each step: a stuck step lets the lock go),
    /// or for a lease that must end by itself at a known time (ShedLock's `lockAtMostFor`,
    /// Redisson's `leaseTime`). A [`LeaderElection`](crate::LeaderElection) refuses it: a
    /// leader has no guard to extend.
    ///
    /// ```
    /// use std::time::Duration;
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// let options = LockOptions::builder()
    ///     .expiry(Duration::from_secs(60))
    ///     .auto_renew(false)
    ///     .build()?;
    /// assert!(!options.auto_renew());
    /// # Ok::<(), distributed_lock_mongodb::Error>(())
    /// ```
    pub fn auto_renew(mut self, enabled: bool) -> Self {
        self.manual_renewal = !enabled;
        self
    }

    /// Whether waiters of every process are served in the order they came (a fair lock, like
    /// Redisson's `RFairLock` or Curator's sequential nodes). Defaults to `false`: waiters
    /// compete, and order holds only among the waiters of one process.
    ///
    /// With `true`, the lock's document keeps a line of the waits under way (`line: [{id,
    /// expiresAt}]`): each wait's first attempt that finds the lock busy puts it at the end,
    /// each later one renews its place (a short lease of its own, as a waiting writer's marker
    /// has: a waiter that vanishes loses its place within seconds), and only the first live wait
    /// in line may take the lock (or be handed it by a release in this process). The attempt
    /// that wins, and a wait that ends without the lock, take the place out. It costs nothing in
    /// commands while the lock is free; a waiter attempts at least at the slowest busy-wait pace
    /// even behind other waiters of its process, to keep its place. Every caller of the lock must
    /// set it. Exclusive locks, semaphores (strictly in line: a waiter for one place does not
    /// pass a waiter for several ahead of it, which makes a semaphore's waiting mark needless)
    /// and reader-writer locks (writers wait in line, and a live place holds new readers back
    /// as a waiting writer's marker does; readers are not in line, and an upgrade passes the
    /// line, whose writers wait for its reader); a document lock with it is refused with
    /// [`Error::InvalidOptions`] at its first acquisition. Like stored details, the extra fields
    /// break interoperability with DistributedLock.MongoDB (.NET).
    ///
    /// ```
    /// use distributed_lock_mongodb::LockOptions;
    ///
    /// let options = LockOptions::builder().fair(true).build()?;
    /// assert!(options.fair());
    /// # Ok::<(), distributed_lock_mongodb::Error>(())
    /// ```
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Validates the options.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] naming the first option that is out of range.
    pub fn build(self) -> Result<LockOptions> {
        let expiry = whole_millis(self.expiry.unwrap_or(DEFAULT_EXPIRY));
        if expiry < MIN_EXPIRY || expiry > MAX_DURATION {
            return Err(invalid(format!(
                "expiry must be between 100 ms and 365 days, got {:?}",
                self.expiry.unwrap_or(DEFAULT_EXPIRY)
            )));
        }
        let mut options = LockOptions {
            expiry,
            extension_cadence: whole_millis(expiry / 3),
            max_clock_skew: default_clock_skew(expiry),
            ..LockOptions::default()
        };

        if let Some(skew) = self.max_clock_skew {
            let largest = expiry / 2;
            if skew > largest {
                return Err(invalid(format!(
                    "max_clock_skew must be at most half the expiry ({largest:?} for an expiry \
                     of {expiry:?}), got {skew:?}"
                )));
            }
            options.max_clock_skew = whole_millis(skew);
        }

        let latest = options.lease_lifetime();
        let cadence = self.extension_cadence.unwrap_or(options.extension_cadence);
        if whole_millis(cadence) < Duration::from_millis(1) || cadence >= latest {
            let what = if self.extension_cadence.is_some() {
                "extension_cadence"
            } else {
                "max_clock_skew"
            };
            return Err(invalid(format!(
                "{what}: extension_cadence ({cadence:?}) must be at least 1 ms and less than \
                 expiry minus the safety margin and max_clock_skew ({latest:?} for an expiry of \
                 {expiry:?} and a skew of {:?})",
                options.max_clock_skew
            )));
        }
        options.extension_cadence = whole_millis(cadence);

        if let Some((min, max)) = self.busy_wait {
            if min > max || max.is_zero() || max > MAX_DURATION {
                return Err(invalid(format!(
                    "busy_wait_sleep_time needs min <= max, max > 0 and max <= 365 days, got \
                     min {min:?}, max {max:?}"
                )));
            }
            options.min_busy_wait = whole_millis(min);
            options.max_busy_wait = whole_millis(max).max(Duration::from_millis(1));
        }

        options.adaptive_backoff = self.adaptive_backoff;
        options.automatic_ttl_index = !self.manual_ttl_index;
        options.auto_renew = !self.manual_renewal;
        options.fair = self.fair;

        if let Some(max_hold) = self.max_hold {
            if max_hold < expiry || max_hold > MAX_DURATION {
                return Err(invalid(format!(
                    "max_hold must be at least the expiry ({expiry:?}) and at most 365 days, got \
                     {max_hold:?}"
                )));
            }
            options.max_hold = Some(whole_millis(max_hold));
        }

        if let Some(max_idle) = self.max_idle {
            if max_idle < Duration::from_millis(1) || max_idle > MAX_DURATION {
                return Err(invalid(format!(
                    "max_idle must be between 1 ms and 365 days, got {max_idle:?}"
                )));
            }
            options.max_idle = Some(whole_millis(max_idle).max(Duration::from_millis(1)));
        }

        if let Some(fraction) = self.renewal_warning {
            if !(0.0..=1.0).contains(&fraction) {
                return Err(invalid(format!(
                    "renewal_warning must be a fraction of the expiry between 0 and 1, got \
                     {fraction}"
                )));
            }
            options.renewal_warning = Some(fraction);
        }

        if let Some(min_hold) = self.min_hold {
            if min_hold < Duration::from_millis(1) || min_hold > MAX_DURATION {
                return Err(invalid(format!(
                    "min_hold must be between 1 ms and 365 days, got {min_hold:?}"
                )));
            }
            if let Some(max_hold) = options.max_hold
                && min_hold > max_hold
            {
                return Err(invalid(format!(
                    "min_hold ({min_hold:?}) must not exceed max_hold ({max_hold:?})"
                )));
            }
            options.min_hold = Some(whole_millis(min_hold));
        }

        if let Some(write_concern) = self.write_concern {
            if matches!(write_concern.w, Some(Acknowledgment::Nodes(0))) {
                return Err(invalid(
                    "write_concern must acknowledge writes; w: 0 cannot confirm a lock".to_owned(),
                ));
            }
            options.write_concern = write_concern;
        }
        Ok(options)
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidOptions(message)
}

fn whole_millis(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn error_of(builder: LockOptionsBuilder) -> String {
        match builder.build() {
            Err(Error::InvalidOptions(message)) => message,
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
    }

    #[test]
    fn defaults_match_the_documentation() {
        let options = LockOptions::builder().build().unwrap();
        assert_eq!(options.expiry(), Duration::from_secs(30));
        assert_eq!(options.extension_cadence(), Duration::from_secs(10));
        assert_eq!(options.busy_wait_sleep_time(), (ms(10), ms(800)));
        assert!(!options.adaptive_backoff());
        assert_eq!(options.write_concern().w, Some(Acknowledgment::Majority));
        assert_eq!(options.safety_margin(), ms(300));
        assert_eq!(options.max_clock_skew(), Duration::from_secs(1));
        let default = LockOptions::default();
        assert_eq!(default.expiry(), options.expiry());
        assert_eq!(default.extension_cadence(), options.extension_cadence());
    }

    #[test]
    fn cadence_defaults_to_a_third_of_expiry() {
        let options = LockOptions::builder().expiry(ms(1_000)).build().unwrap();
        assert_eq!(options.extension_cadence(), ms(333));
        assert_eq!(options.safety_margin(), ms(10));
        let short = LockOptions::builder().expiry(ms(100)).build().unwrap();
        assert_eq!(short.safety_margin(), ms(2));
        assert_eq!(short.max_clock_skew(), ms(10));
    }

    #[test]
    fn expiry_out_of_range_is_rejected_by_name() {
        for expiry in [Duration::ZERO, ms(99), Duration::MAX, MAX_DURATION + ms(1)] {
            let message = error_of(LockOptions::builder().expiry(expiry));
            assert!(message.starts_with("expiry"), "{message}");
        }
        assert!(LockOptions::builder().expiry(MAX_DURATION).build().is_ok());
    }

    #[test]
    fn sub_millisecond_parts_are_dropped() {
        let options = LockOptions::builder()
            .expiry(Duration::from_micros(150_999))
            .build()
            .unwrap();
        assert_eq!(options.expiry(), ms(150));
        assert_eq!(options.expiry_millis(), 150);
        // 99.9 ms truncates below the minimum.
        assert!(
            LockOptions::builder()
                .expiry(Duration::from_micros(99_900))
                .build()
                .is_err()
        );
    }

    #[test]
    fn cadence_must_leave_room_for_the_safety_margin_and_the_skew() {
        let no_skew = || {
            LockOptions::builder()
                .expiry(ms(1_000))
                .max_clock_skew(Duration::ZERO)
        };
        for cadence in [
            Duration::ZERO,
            Duration::from_micros(500),
            ms(990),
            ms(1_000),
            ms(5_000),
        ] {
            let message = error_of(no_skew().extension_cadence(cadence));
            assert!(message.starts_with("extension_cadence"), "{message}");
        }
        let ok = no_skew().extension_cadence(ms(989)).build().unwrap();
        assert_eq!(ok.extension_cadence(), ms(989));
        // The default skew for a 1 s expiry is 100 ms: the cadence must stay below 890 ms.
        let with_skew = || LockOptions::builder().expiry(ms(1_000));
        assert_eq!(with_skew().build().unwrap().max_clock_skew(), ms(100));
        let message = error_of(with_skew().extension_cadence(ms(890)));
        assert!(message.starts_with("extension_cadence"), "{message}");
        assert!(message.contains("max_clock_skew"), "{message}");
        with_skew().extension_cadence(ms(889)).build().unwrap();
    }

    #[test]
    fn min_hold_is_off_by_default_and_validated_against_max_hold() {
        assert_eq!(LockOptions::default().min_hold(), None);
        let year = ms(366 * 24 * 60 * 60 * 1000);
        for min_hold in [Duration::ZERO, Duration::from_micros(999), year] {
            let message = error_of(LockOptions::builder().min_hold(min_hold));
            assert!(message.starts_with("min_hold must be between"), "{message}");
        }
        let message = error_of(
            LockOptions::builder()
                .max_hold(ms(60_000))
                .min_hold(ms(60_001)),
        );
        assert!(message.contains("must not exceed max_hold"), "{message}");
        let options = LockOptions::builder()
            .max_hold(ms(60_000))
            .min_hold(ms(60_000))
            .build()
            .unwrap();
        assert_eq!(options.min_hold(), Some(ms(60_000)));
        // An acquisition's lease lasts the longer of expiry and min_hold.
        assert_eq!(options.acquired_lease_millis(), 60_000);
        let short = LockOptions::builder().min_hold(ms(10)).build().unwrap();
        assert_eq!(short.acquired_lease_millis(), short.expiry_millis());
        // Kept by `to_builder`, as every other setting.
        assert_eq!(
            format!("{:?}", options.to_builder().build().unwrap()),
            format!("{options:?}")
        );
        // A kind without min_hold refuses it in one plain sentence.
        let refused = options
            .check_min_hold_unsupported("semaphore")
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "invalid lock options: min_hold (60s) applies to exclusive locks and leader \
             elections only, not to a semaphore"
        );
    }

    #[test]
    fn the_renewal_warning_is_half_the_usual_margin_by_default_and_a_fraction_when_set() {
        // Expiry 30 s: lifetime 30 − 0.3 − 1 = 28.7 s, cadence 10 s: 18.7 s left as a rule.
        let default = LockOptions::default();
        assert_eq!(default.renewal_warning(), ms(9_350));
        let set = LockOptions::builder().renewal_warning(0.1).build().unwrap();
        assert_eq!(set.renewal_warning(), ms(3_000));
        let off = LockOptions::builder().renewal_warning(0.0).build().unwrap();
        assert_eq!(off.renewal_warning(), Duration::ZERO);
        for bad in [-0.1, 1.5, f64::NAN] {
            let message = error_of(LockOptions::builder().renewal_warning(bad));
            assert!(message.starts_with("renewal_warning"), "{message}");
        }
    }

    #[test]
    fn clock_skew_is_validated_against_expiry_and_cadence() {
        let message = error_of(LockOptions::builder().max_clock_skew(ms(15_001)));
        assert!(message.starts_with("max_clock_skew"), "{message}");
        // Cadence 20 s + margin 300 ms + skew 10 s does not fit in 30 s.
        let message = error_of(
            LockOptions::builder()
                .extension_cadence(ms(20_000))
                .max_clock_skew(ms(10_000)),
        );
        assert!(message.starts_with("extension_cadence"), "{message}");
        let ok = LockOptions::builder()
            .max_clock_skew(ms(5_000))
            .build()
            .unwrap();
        assert_eq!(ok.max_clock_skew(), ms(5_000));
        assert_eq!(
            ok.lease_lifetime(),
            ms(30_000 - 300 - 5_000),
            "expiry - margin - skew"
        );
    }

    #[test]
    fn busy_wait_range_is_validated() {
        for (min, max) in [
            (ms(20), ms(10)),
            (Duration::ZERO, Duration::ZERO),
            (ms(1), Duration::MAX),
        ] {
            let message = error_of(LockOptions::builder().busy_wait_sleep_time(min, max));
            assert!(message.starts_with("busy_wait_sleep_time"), "{message}");
        }
        let options = LockOptions::builder()
            .busy_wait_sleep_time(Duration::ZERO, ms(5))
            .build()
            .unwrap();
        assert_eq!(options.busy_wait_sleep_time(), (Duration::ZERO, ms(5)));
    }

    #[test]
    fn unacknowledged_write_concern_is_rejected() {
        let message = error_of(LockOptions::builder().write_concern(WriteConcern::nodes(0)));
        assert!(message.starts_with("write_concern"), "{message}");
        let one = LockOptions::builder()
            .write_concern(WriteConcern::nodes(1))
            .build()
            .unwrap();
        assert_eq!(one.write_concern().w, Some(Acknowledgment::Nodes(1)));
    }

    #[test]
    fn max_hold_is_off_by_default_and_validated_against_expiry() {
        assert_eq!(LockOptions::default().max_hold(), None);
        assert_eq!(LockOptions::builder().build().unwrap().max_hold(), None);
        for max_hold in [
            Duration::ZERO,
            ms(29_999),
            MAX_DURATION + ms(1),
            Duration::MAX,
        ] {
            let message = error_of(LockOptions::builder().max_hold(max_hold));
            assert!(message.starts_with("max_hold"), "{message}");
        }
        let short = LockOptions::builder()
            .expiry(ms(1_000))
            .max_hold(Duration::from_micros(1_000_900))
            .build()
            .unwrap();
        assert_eq!(short.max_hold(), Some(ms(1_000)));
    }
}
