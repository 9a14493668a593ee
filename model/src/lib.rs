//! A model of distributed-lock-mongodb's lease protocol for every kind of lock (exclusive,
//! semaphore, reader-writer, document: [`protocol::Kind`]),
//! checked exhaustively with [`stateright`]: acquire, renew, release, the in-process transfer, the
//! cleanup after an unknown outcome, a caller that stops waiting, a provider's shutdown; lost,
//! delayed and duplicated messages; two routers whose clocks differ by `max_clock_skew`, and a
//! router's clock that steps back or forward within what the lock assumes.
//!
//! The model runs the crate's own code (`distributed_lock_mongodb::__model`): its protocol core
//! (every client's deadlines, renewals and attempts) and every command's filter and update
//! pipeline, which [`eval`] applies to the model's lock document as MongoDB would. See
//! `model/README.md` and `tests/check.rs`.

pub mod eval;
pub mod protocol;

/// The checker, for `tests/check.rs` wherever it is compiled (also as the crate's `model` test,
/// which mutation testing runs: `scripts/mutants`).
pub use stateright;
