//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, with the `metrics` feature;
//! without it every function here is a no-op. Names and labels are listed in the README.

use super::lost::Loss;
use crate::lock_status::LockKind;
use std::time::Duration;

/// One acquisition call ended: `outcome` is `acquired`, `not_acquired` or `error`.
pub(crate) fn acquisition(kind: LockKind, outcome: &'static str, waited: Duration) {
    #[cfg(feature = "metrics")]
    {
        let labels = [("kind", kind.label()), ("outcome", outcome)];
        metrics::counter!("distributed_lock_acquisitions_total", &labels).increment(1);
        metrics::histogram!("distributed_lock_wait_seconds", &labels).record(waited);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, outcome, waited);
}

/// One acquisition attempt was sent.
pub(crate) fn attempt(kind: LockKind) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_attempts_total", "kind" => kind.label()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// A guard began holding a lease here.
pub(crate) fn hold_started(kind: LockKind) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("distributed_lock_held", "kind" => kind.label()).increment(1.0);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// A guard ended (released, dropped or ended by its own write) after holding for `held`.
pub(crate) fn hold_ended(kind: LockKind, held: Duration) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!("distributed_lock_hold_seconds", "kind" => kind.label()).record(held);
        metrics::gauge!("distributed_lock_held", "kind" => kind.label()).decrement(1.0);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, held);
}

/// A caller waiting to acquire a lock of `kind`, counted in the `distributed_lock_waiting` gauge
/// until this is dropped (its call returned, or was cancelled).
#[derive(Debug)]
pub(crate) struct Waiting(LockKind);

impl Waiting {
    pub(crate) fn start(kind: LockKind) -> Waiting {
        #[cfg(feature = "metrics")]
        metrics::gauge!("distributed_lock_waiting", "kind" => kind.label()).increment(1.0);
        Waiting(kind)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        metrics::gauge!("distributed_lock_waiting", "kind" => self.0.label()).decrement(1.0);
        #[cfg(not(feature = "metrics"))]
        let _ = self.0;
    }
}

/// A renewal was confirmed with `left` of its lease left (until the holder's deadline).
pub(crate) fn lease_left(kind: LockKind, left: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distributed_lock_lease_left_seconds", "kind" => kind.label()).record(left);
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, left);
}

/// A lease was lost (reported once per lease).
pub(crate) fn lost(kind: LockKind, loss: Loss) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_losses_total", "kind" => kind.label(), "reason" => loss.label())
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, loss.label());
}

/// A renewal command was answered (or failed) after `latency`.
pub(crate) fn renewal(kind: LockKind, latency: Duration, succeeded: bool) {
    #[cfg(feature = "metrics")]
    {
        let outcome = if succeeded { "ok" } else { "error" };
        let labels = [("kind", kind.label()), ("outcome", outcome)];
        metrics::counter!("distributed_lock_renewal_commands_total", &labels).increment(1);
        metrics::histogram!("distributed_lock_renewal_seconds", &labels).record(latency);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, latency, succeeded);
}
