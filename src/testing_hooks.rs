//! Observations of the crate's in-process state for the repository's tests, so that they wait on
//! state instead of sleeping. Not part of the API: hidden from the docs, and free to change in
//! any release.

use crate::lease::hooks;

/// How many local waiters for the lock `name` of `collection` in `database` have left an offer a
/// release would hand the lock to (they wait in line, with their offer standing).
pub fn offers_standing(database: &str, collection: &str, name: &str) -> usize {
    hooks::offers_standing(database, collection, name)
}

/// How many local waiters for the lock `name` of `collection` in `database` wait idle: no
/// attempt of theirs is under way or about to start, whatever woke them was taken.
pub fn waiters_idle(database: &str, collection: &str, name: &str) -> usize {
    hooks::waiters_idle(database, collection, name)
}
