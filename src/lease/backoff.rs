//! Waiting arithmetic: sleeps between acquisition attempts and deadlines. Pure functions, so the
//! edge cases (huge durations, zero ranges) are unit-tested without a server.

use std::time::Duration;

use tokio::time::Instant;

use crate::options::LockOptions;

/// Growth factor of adaptive backoff per consecutive failed attempt.
const GROWTH: f64 = 1.5;
/// Adaptive backoff jitter: the sleep is multiplied by a factor in `1 ± JITTER`.
const JITTER: f64 = 0.2;
/// Adaptive backoff starts from at least this, so a zero minimum does not spin.
const ADAPTIVE_FLOOR_MS: f64 = 1.0;

/// The deadline `timeout` after `now`, or `None` when it cannot be represented (for example
/// `Duration::MAX`), which means "no deadline".
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Option<Instant> {
    now.checked_add(timeout)
}

/// How long to sleep after the `failed_attempts`-th consecutive failure (0-based), given a
/// uniformly distributed `random` in `[0, 1)`.
///
/// Uniform mode: anywhere in the busy-wait range. Adaptive mode: `max(min, 1 ms) × 1.5^N`,
/// ±20 %, clamped to the range.
pub(crate) fn sleep_time(options: &LockOptions, failed_attempts: u32, random: f64) -> Duration {
    let (min, max) = options.busy_wait_sleep_time();
    let (min_ms, max_ms) = (min.as_secs_f64() * 1e3, max.as_secs_f64() * 1e3);
    let random = if random.is_finite() {
        random.clamp(0.0, 1.0)
    } else {
        0.5
    };
    let millis = if options.adaptive_backoff() {
        // 1.5^200 is finite (~1e35); beyond that the clamp to `max` decides anyway.
        let exponent = i32::try_from(failed_attempts.min(200)).unwrap_or(200);
        let grown = min_ms.max(ADAPTIVE_FLOOR_MS) * GROWTH.powi(exponent);
        let jittered = grown * (1.0 + JITTER * (2.0 * random - 1.0));
        jittered.clamp(min_ms, max_ms)
    } else {
        min_ms + (max_ms - min_ms) * random
    };
    // Finite and within [0, 365 days] by construction.
    Duration::try_from_secs_f64(millis / 1e3).unwrap_or(max)
}

/// The server-side time limit (`maxTimeMS`) of an acquisition attempt: an attempt held back on
/// the server longer (behind a transaction, say) is given up there, so it cannot be applied
/// after the cleanup that a caller gone (or a shutdown) sends. As long as an attempt is waited
/// for at least.
pub(crate) const ATTEMPT_SERVER_TIME: Duration = super::protocol::MIN_ATTEMPT_WAIT;

/// `sleep`, shortened so it ends no later than `deadline`.
pub(crate) fn sleep_until_deadline(
    sleep: Duration,
    now: Instant,
    deadline: Option<Instant>,
) -> Duration {
    match deadline {
        Some(deadline) => sleep.min(deadline.saturating_duration_since(now)),
        None => sleep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    fn options(min: Duration, max: Duration, adaptive: bool) -> LockOptions {
        LockOptions::builder()
            .busy_wait_sleep_time(min, max)
            .adaptive_backoff(adaptive)
            .build()
            .unwrap()
    }

    #[test]
    fn uniform_sleep_spans_the_range() {
        let options = options(ms(10), ms(800), false);
        assert_eq!(sleep_time(&options, 0, 0.0), ms(10));
        assert_eq!(sleep_time(&options, 7, 0.5), ms(405));
        assert_eq!(sleep_time(&options, 0, 1.0), ms(800));
    }

    #[test]
    fn adaptive_sleep_grows_by_half_per_failure() {
        let options = options(ms(10), ms(800), true);
        // random 0.5 means no jitter
        assert_eq!(sleep_time(&options, 0, 0.5), ms(10));
        assert_eq!(sleep_time(&options, 1, 0.5), ms(15));
        assert_eq!(sleep_time(&options, 2, 0.5), Duration::from_micros(22_500));
        assert_eq!(sleep_time(&options, 20, 0.5), ms(800));
        assert_eq!(sleep_time(&options, u32::MAX, 0.5), ms(800));
    }

    #[test]
    fn adaptive_jitter_is_twenty_percent_within_the_range() {
        let options = options(ms(10), ms(800), true);
        assert_eq!(sleep_time(&options, 4, 0.0), Duration::from_micros(40_500));
        assert_eq!(sleep_time(&options, 4, 1.0), Duration::from_micros(60_750));
        // Jitter never goes below min.
        assert_eq!(sleep_time(&options, 0, 0.0), ms(10));
    }

    #[test]
    fn adaptive_with_zero_minimum_does_not_spin() {
        let options = options(Duration::ZERO, ms(100), true);
        assert_eq!(sleep_time(&options, 0, 0.5), ms(1));
        assert_eq!(sleep_time(&options, 3, 0.5), Duration::from_micros(3_375));
    }

    #[test]
    fn out_of_range_random_input_is_tamed() {
        let options = options(ms(10), ms(20), false);
        assert_eq!(sleep_time(&options, 0, f64::NAN), ms(15));
        assert_eq!(sleep_time(&options, 0, 5.0), ms(20));
        assert_eq!(sleep_time(&options, 0, -1.0), ms(10));
    }

    #[test]
    fn huge_timeouts_mean_no_deadline() {
        let now = Instant::now();
        assert_eq!(deadline_after(now, Duration::MAX), None);
        assert_eq!(deadline_after(now, ms(5)), Some(now + ms(5)));
        assert_eq!(deadline_after(now, Duration::ZERO), Some(now));
    }

    #[test]
    fn sleeps_never_pass_the_deadline() {
        let now = Instant::now();
        assert_eq!(
            sleep_until_deadline(ms(50), now, Some(now + ms(20))),
            ms(20)
        );
        assert_eq!(sleep_until_deadline(ms(5), now, Some(now + ms(20))), ms(5));
        assert_eq!(
            sleep_until_deadline(ms(5), now + ms(30), Some(now)),
            Duration::ZERO
        );
        assert_eq!(sleep_until_deadline(ms(50), now, None), ms(50));
    }

    mod properties {
        use super::*;
        use crate::lease::protocol::{MIN_ATTEMPT_WAIT, attempt_reply_limit};
        use proptest::prelude::*;

        const YEAR_MS: u64 = 365 * 24 * 60 * 60 * 1000;

        fn any_duration() -> impl Strategy<Value = Duration> {
            prop_oneof![
                (0..YEAR_MS).prop_map(Duration::from_millis),
                any::<u64>().prop_map(Duration::from_nanos),
                (any::<u64>(), 0..1_000_000_000_u32).prop_map(|(s, n)| Duration::new(s, n)),
                Just(Duration::MAX),
                Just(Duration::ZERO),
            ]
        }

        fn any_options() -> impl Strategy<Value = LockOptions> {
            (0..YEAR_MS, 0..YEAR_MS, any::<bool>()).prop_map(|(a, b, adaptive)| {
                let (min, max) = (a.min(b), a.max(b).max(1));
                LockOptions::builder()
                    .busy_wait_sleep_time(Duration::from_millis(min), Duration::from_millis(max))
                    .adaptive_backoff(adaptive)
                    .build()
                    .expect("a valid range")
            })
        }

        proptest! {
            #[test]
            fn sleeps_stay_within_the_busy_wait_range(
                options in any_options(),
                failed in any::<u32>(),
                random in any::<f64>(),
            ) {
                let sleep = sleep_time(&options, failed, random);
                let (min, max) = options.busy_wait_sleep_time();
                // Sub-microsecond float rounding is the only slack.
                prop_assert!(sleep + Duration::from_micros(1) >= min, "{sleep:?} < {min:?}");
                prop_assert!(sleep <= max + Duration::from_micros(1), "{sleep:?} > {max:?}");
            }

            #[test]
            fn waiting_never_passes_a_deadline_or_overflows(
                options in any_options(),
                failed in any::<u32>(),
                random in any::<f64>(),
                timeout in any_duration(),
                elapsed in any_duration(),
            ) {
                let start = Instant::now();
                let deadline = deadline_after(start, timeout);
                prop_assert_eq!(deadline.is_some(), start.checked_add(timeout).is_some());
                // Wherever "now" is relative to the deadline (if representable).
                if let Some(now) = start.checked_add(elapsed.min(Duration::from_secs(YEAR_MS / 1000))) {
                    let sleep = sleep_until_deadline(sleep_time(&options, failed, random), now, deadline);
                    if let Some(deadline) = deadline {
                        prop_assert!(now + sleep <= deadline.max(now));
                    }
                }
            }

            #[test]
            fn attempt_limits_are_bounded_by_expiry(
                expiry_ms in 100..YEAR_MS,
                timeout in any_duration(),
            ) {
                let expiry = Duration::from_millis(expiry_ms);
                let options = LockOptions::builder().expiry(expiry).build().unwrap();
                let started = Instant::now();
                let limit = attempt_reply_limit(&options, started, deadline_after(started, timeout));
                prop_assert!(limit <= started + expiry);
                prop_assert!(limit >= started + expiry.min(MIN_ATTEMPT_WAIT));
            }
        }
    }
}
