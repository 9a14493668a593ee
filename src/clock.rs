//! The local clock of lease deadlines.
//!
//! A lease's local deadline must pass in real time, whatever the host does meanwhile. Tokio's
//! `Instant` (like `std`'s) reads `CLOCK_MONOTONIC`, which stops while the host is suspended (a
//! laptop's lid closed, a virtual machine paused and resumed): after a suspension longer than the
//! lease, `is_lost()` would still say false until a renewal reply came. Deadlines are therefore
//! kept on a clock that counts suspended time: `CLOCK_BOOTTIME` on Linux and Android, the
//! continuous clock on Apple systems, `QueryPerformanceCounter` on Windows (the `boot-time`
//! crate; where no such clock exists it falls back to the monotonic one). It never steps back
//! and is not moved by NTP steps, like the monotonic clock.
//!
//! Timers still come from Tokio, whose clock does not count suspended time: a sleep until a
//! deadline is converted at the moment it starts ([`tokio_instant`]), and long sleeps are cut
//! into pieces of at most [`RECHECK`] so that a suspension is noticed soon after the host
//! resumes.

use std::time::Duration;

/// An instant on the suspend-aware clock.
pub(crate) type Instant = boot_time::Instant;

/// Sleeps that wait for a deadline on this clock end at least this often, so that time the host
/// spent suspended (which Tokio's timers do not count) is noticed within this long after resuming.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// Now, on the suspend-aware clock.
pub(crate) fn now() -> Instant {
    Instant::now() + suspended::simulated()
}

/// The Tokio instant at which `at` (on this clock) will be reached if the host is not suspended
/// meanwhile; now if `at` has passed.
pub(crate) fn tokio_instant(at: Instant) -> tokio::time::Instant {
    tokio::time::Instant::now() + at.saturating_duration_since(now())
}

/// When a sleep toward `at` should wake up to look again: at `at`, or after [`RECHECK`] if that
/// comes first.
pub(crate) fn wake_toward(at: Instant) -> tokio::time::Instant {
    tokio_instant(at).min(tokio::time::Instant::now() + RECHECK)
}

/// Tests can make the clock jump as a host suspension does: forward, without Tokio's clock
/// moving. Per thread, so that tests running side by side do not see each other's jumps (a
/// current-thread runtime runs a test's tasks on its own thread).
#[cfg(test)]
pub(crate) use suspended::simulate as simulate_suspension;

#[cfg(test)]
mod suspended {
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        static SIMULATED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    /// Adds `duration` of simulated suspension to every later reading of the clock on this
    /// thread.
    pub(crate) fn simulate(duration: Duration) {
        SIMULATED.with(|simulated| simulated.set(simulated.get() + duration));
    }

    pub(super) fn simulated() -> Duration {
        SIMULATED.with(Cell::get)
    }
}

#[cfg(not(test))]
mod suspended {
    use std::time::Duration;

    pub(super) fn simulated() -> Duration {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_counts_suspended_time_and_tokio_instants_follow_it() {
        let before = now();
        simulate_suspension(Duration::from_secs(3));
        let after = now();
        assert!(after.duration_since(before) >= Duration::from_secs(3));
        // A deadline passed during the suspension is due at once on Tokio's clock.
        let passed = before + Duration::from_secs(1);
        assert!(tokio_instant(passed) <= tokio::time::Instant::now());
        // A far deadline is rechecked within a second.
        let far = now() + Duration::from_secs(60);
        assert!(wake_toward(far) <= tokio::time::Instant::now() + RECHECK);
    }
}
