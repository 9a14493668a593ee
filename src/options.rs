//! Lock options and their builder.

use std::time::Duration;

use mongodb::options::{Acknowledgment, WriteConcern};

use crate::{Error, Result};

const DEFAULT_EXPIRY: Duration = Duration::from_secs(30);
const MIN_EXPIRY: Duration = Duration::from_millis(100);
/// Upper bound for every duration option: keeps all deadline arithmetic far from overflow.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);
const DEFAULT_MIN_BUSY_WAIT: Duration = Duration::from_millis(10);
const DEFAULT_MAX_BUSY_WAIT: Duration = Duration::from_millis(800);

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
        }
    }
}

impl LockOptions {
    /// Starts building options from the defaults.
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder::default()
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

    /// How much earlier than the server-side expiry a holder considers its lease gone:
    /// `max(2 ms, 1 % of expiry)`. It absorbs clock-rate differences and scheduling delays.
    pub fn safety_margin(&self) -> Duration {
        (self.expiry / 100).max(Duration::from_millis(2))
    }

    /// The expiry in whole milliseconds, as stored arithmetic on the server uses it.
    pub(crate) fn expiry_millis(&self) -> i64 {
        // At most 365 days: always fits.
        i64::try_from(self.expiry.as_millis()).unwrap_or(i64::MAX)
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
}

impl LockOptionsBuilder {
    /// How long a lease lasts unless renewed: after a crash, the lock frees itself this long after
    /// the last renewal. Defaults to 30 s; must be between 100 ms and 365 days.
    pub fn expiry(mut self, expiry: Duration) -> Self {
        self.expiry = Some(expiry);
        self
    }

    /// How often a held lock renews its lease. Defaults to `expiry / 3`; must be at least 1 ms and
    /// less than `expiry` minus the [safety margin](LockOptions::safety_margin) (a slower cadence
    /// would let every lease lapse before its renewal).
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
            ..LockOptions::default()
        };

        if let Some(cadence) = self.extension_cadence {
            let latest = expiry - options.safety_margin();
            if whole_millis(cadence) < Duration::from_millis(1) || cadence >= latest {
                return Err(invalid(format!(
                    "extension_cadence must be at least 1 ms and less than expiry minus the safety \
                     margin ({latest:?} for an expiry of {expiry:?}), got {cadence:?}"
                )));
            }
            options.extension_cadence = whole_millis(cadence);
        }

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
    fn cadence_must_leave_room_for_the_safety_margin() {
        for cadence in [
            Duration::ZERO,
            Duration::from_micros(500),
            ms(990),
            ms(1_000),
            ms(5_000),
        ] {
            let message = error_of(
                LockOptions::builder()
                    .expiry(ms(1_000))
                    .extension_cadence(cadence),
            );
            assert!(message.starts_with("extension_cadence"), "{message}");
        }
        let ok = LockOptions::builder()
            .expiry(ms(1_000))
            .extension_cadence(ms(989))
            .build()
            .unwrap();
        assert_eq!(ok.extension_cadence(), ms(989));
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
}
