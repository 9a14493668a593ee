//! The model checker's verdicts: under every interleaving, delay and fault the model allows, the
//! lease protocol keeps mutual exclusion, ordered fencing tokens and fenced writes, and serves
//! every caller within the horizon; and each planted mistake yields a counterexample.
//!
//! `cargo test -p lease-model -- --nocapture` prints the state counts and each counterexample.

use std::collections::BTreeSet;
use std::time::Instant;

use lease_model::protocol::{
    BOOKKEEPING, Config, Kind, LeaseProtocol, Mistake, broken, explore, narrate,
};
use lease_model::stateright::{Checker, HasDiscoveries, Model};

/// Explores every state of `config` and asserts that no property has a counterexample, and that
/// the run reached each of `examples` (so the model explores what it claims to).
fn verify(name: &str, config: Config, examples: &[&'static str]) {
    let checker = explore(name, config);
    if let Some((property, path)) = broken(&checker) {
        panic!(
            "{name}: counterexample to {property:?}:\n{}",
            path.join("\n")
        );
    }
    for example in examples {
        assert!(
            checker.discovery(example).is_some(),
            "{name}: the model never reached {example:?}: it does not explore what it claims to"
        );
    }
}

#[test]
fn routers_whose_clocks_differ_slow_replies_and_a_fault() {
    verify(
        "clocks and delays",
        Config::clocks_and_delays(),
        &[
            "a lease is taken over after it ended",
            "a renewal reaches the server after another took the lock",
            "an acquisition replaces another holder's details",
        ],
    );
}

#[test]
fn releases_handing_the_lock_over_and_a_fault() {
    verify(
        "handoff and faults",
        Config::handoff_and_faults(),
        &[
            "a release hands the lock to a local waiter",
            "a lease is taken over after it ended",
            "a stale fenced write is refused",
            "an acquisition replaces another holder's details",
        ],
    );
}

#[test]
fn a_caller_that_stops_waiting() {
    verify(
        "a caller leaves",
        Config::a_caller_leaves(),
        &["a lease won after its caller left is released"],
    );
}

#[test]
fn a_provider_that_shuts_down() {
    verify(
        "a provider shuts down",
        Config::a_provider_shuts_down(),
        &["a lease won after its caller left is released"],
    );
}

#[test]
fn two_families_of_one_process_and_a_shutdown_of_either() {
    verify(
        "two families and a shutdown",
        Config::two_families_and_a_shutdown(),
        &[
            "a release hands the lock to a local waiter",
            "a shutdown undoes a transfer whose reply comes after it",
            "a lease won after its caller left is released",
        ],
    );
}

#[test]
fn min_hold_windows_that_outlast_released_forced_and_crashed_leases() {
    verify(
        "min_hold windows",
        Config::min_hold_windows(),
        &[
            "a window keeps an attempt out after its holder's lease ended",
            "an operator ends a held lease",
        ],
    );
}

#[test]
fn a_waiter_whose_lock_has_a_min_hold_unlike_the_releasers() {
    verify(
        "a waiter with a min_hold",
        Config::a_waiter_with_a_min_hold(),
        &[
            "a release hands the lock to a local waiter",
            "a transfer gives its waiter a lease with a min_hold window",
            "a window keeps an attempt out after its holder's lease ended",
        ],
    );
}

#[test]
fn a_caller_that_stops_waiting_for_a_min_hold_lock() {
    verify(
        "a caller leaves a min_hold lock",
        Config::a_caller_leaves_a_min_hold_lock(),
        &[
            "a cleanup ends a lease nobody was given, window and all",
            "a lease won after its caller left is released",
        ],
    );
}

#[test]
fn an_operator_that_ends_a_lease() {
    verify(
        "an operator ends a lease",
        Config::an_operator_ends_a_lease(),
        &["an operator ends a held lease"],
    );
}

#[test]
fn an_operator_that_deletes_the_lock_by_hand() {
    verify(
        "an operator deletes the lock",
        Config::an_operator_deletes_the_lock(),
        &[
            "an operator ends a held lease",
            "a token after a deletion by hand is below an earlier one",
        ],
    );
}

#[test]
fn a_process_that_stands_still() {
    verify(
        "a process stands still",
        Config::a_process_pauses(),
        &[
            "a lease is taken over after it ended",
            "a renewal reaches the server after another took the lock",
        ],
    );
}

#[test]
fn a_router_clock_that_steps_back() {
    verify(
        "a router's clock steps back",
        Config::a_router_clock_steps_back(),
        &["a release hands the lock to a local waiter"],
    );
}

#[test]
fn a_router_clock_that_steps_forward() {
    verify(
        "a router's clock steps forward",
        Config::a_router_clock_steps_forward(),
        &[
            "a release hands the lock to a local waiter",
            "a purge deletes a lock whose lease ended over a day ago",
        ],
    );
}

#[test]
fn a_semaphore_of_two_places_among_three_callers() {
    verify(
        "a semaphore of two places",
        Config::a_semaphore_of_two_places(),
        &[
            "a release hands the lock to a local waiter",
            "a lease is taken over after it ended",
            "a renewal reaches the server after another took the lock",
            "a stale fenced write is refused",
        ],
    );
}

#[test]
fn a_reader_writer_lock_with_a_writer_and_a_reader_in_one_process_and_a_writer_in_another() {
    verify(
        "a reader-writer lock",
        Config::a_reader_writer_lock(),
        &[
            "a release hands the lock to a local waiter",
            "a renewal reaches the server after another took the lock",
            "a stale fenced write is refused",
        ],
    );
}

#[test]
fn a_document_lock_whose_holders_commit_their_work() {
    verify(
        "a document lock",
        Config::a_document_lock(),
        &[
            "a lease is taken over after it ended",
            "a renewal reaches the server after another took the lock",
            "a commit is refused after its lease ended",
        ],
    );
}

#[test]
fn a_document_lock_whose_commits_are_slow() {
    verify(
        "a document lock with slow commits",
        Config::a_document_lock_with_slow_commits(),
        &["a commit is refused after its lease ended"],
    );
}

#[test]
fn a_document_lock_that_callers_insert() {
    verify(
        "a document lock or insert",
        Config::a_document_lock_or_insert(),
        &[
            "a caller inserts the document",
            "an insert finds the document there",
            "a lease is taken over after it ended",
            "a commit is refused after its lease ended",
        ],
    );
}

#[test]
fn a_holder_that_runs_a_lease_checked_transaction() {
    verify(
        "a lease-checked transaction",
        Config::a_lease_checked_transaction(),
        &[
            "a lease-checked transaction commits",
            "a write of the lock waits for a transaction",
            "a transaction is given up at its lease's deadline",
            "a renewal its holder gave up on the way opens the transaction",
            "a lease is taken over after it ended",
        ],
    );
}

#[test]
fn a_document_lock_whose_holders_checkpoint_and_replace() {
    verify(
        "a document lock with checkpoints and replaces",
        Config::a_document_lock_that_checkpoints_and_replaces(),
        &[
            "a lease is taken over after it ended",
            "a holder replaces the document",
            "a holder's checkpoint applies",
            "a checkpoint is refused after its lease ended",
            "a commit is refused after its lease ended",
        ],
    );
}

#[test]
fn a_writer_that_stops_waiting_removes_its_marker() {
    verify(
        "a writer stops waiting",
        Config::a_writer_stops_waiting(),
        &["a lease won after its caller left is released"],
    );
}

#[test]
fn an_operator_that_ends_every_lease_of_a_reader_writer_lock() {
    verify(
        "an operator ends a reader-writer lock",
        Config::an_operator_ends_a_reader_writer_lock(),
        &["an operator ends a held lease"],
    );
}

#[test]
fn an_operator_that_ends_one_lease_of_a_reader_writer_lock() {
    verify(
        "an operator ends one reader-writer lease",
        Config::an_operator_ends_one_reader_writer_lease(),
        &[
            "an operator ends a held lease",
            "an operator ends a reader's lease",
        ],
    );
}

#[test]
fn an_operator_that_ends_every_semaphore_place() {
    verify(
        "an operator ends every semaphore place",
        Config::an_operator_ends_every_semaphore_place(),
        &["an operator ends a held lease"],
    );
}

#[test]
fn an_operator_that_ends_a_semaphore_place() {
    verify(
        "an operator ends a semaphore place",
        Config::an_operator_ends_a_semaphore_place(),
        &[
            "an operator ends a held lease",
            "a release hands the lock to a local waiter",
            "the places of one family are renewed in one command",
            "the read after a renewal of several places finds one gone",
        ],
    );
}

#[test]
fn a_lease_its_holder_extends_by_hand() {
    verify(
        "a lease extended by hand",
        Config::a_lease_extended_by_hand(),
        &[
            "an extension leaves a later end it does not reach as it is",
            "a lease is taken over after it ended",
        ],
    );
}

#[test]
fn a_semaphore_whose_count_an_operator_sets_lower() {
    verify(
        "a semaphore whose count is set lower",
        Config::a_semaphore_whose_count_is_set_lower(),
        &["a count set lower keeps out an attempt the old one admitted"],
    );
}

#[test]
fn a_semaphore_whose_caller_asks_for_both_places_at_once() {
    verify(
        "a semaphore with weighted places",
        Config::a_semaphore_with_weighted_places(),
        &[
            "a waiting mark holds free places back from a waiter for fewer",
            "a semaphore's caller holds several places at once",
        ],
    );
}

#[test]
fn a_semaphore_place_its_holder_extends_by_hand() {
    verify(
        "a semaphore place extended by hand",
        Config::a_lease_extended_by_hand_in(Kind::Semaphore(1)),
        &["an extension leaves a later end it does not reach as it is"],
    );
}

#[test]
fn a_writer_lease_its_holder_extends_by_hand() {
    verify(
        "a writer's lease extended by hand",
        Config::a_lease_extended_by_hand_in(Kind::ReaderWriter),
        &["an extension leaves a later end it does not reach as it is"],
    );
}

#[test]
fn a_document_lock_its_holder_extends_by_hand() {
    verify(
        "a document lock extended by hand",
        Config::a_lease_extended_by_hand_in(Kind::Document),
        &["an extension leaves a later end it does not reach as it is"],
    );
}

#[test]
fn an_upgradeable_reader_beside_a_plain_reader_of_another_process() {
    verify(
        "an upgradeable reader beside a reader",
        Config::an_upgradeable_reader_beside(true),
        &[
            "an upgrade takes the write lease beside its own read lease",
            "an upgrade waits while a plain reader holds",
        ],
    );
}

#[test]
fn an_upgradeable_reader_beside_a_writer_of_another_process() {
    verify(
        "an upgradeable reader beside a writer",
        Config::an_upgradeable_reader_beside(false),
        &[
            "an upgrade takes the write lease beside its own read lease",
            "an upgrade leaves another writer's marker in place",
        ],
    );
}

#[test]
fn two_upgradeable_readers_of_two_processes() {
    verify(
        "two upgradeable readers",
        Config::two_upgradeable_readers(),
        &[
            "an upgradeable reader waits while another's lease is live",
            "an upgrade takes the write lease beside its own read lease",
        ],
    );
}

#[test]
fn a_fair_lock_among_three_callers_of_two_processes() {
    verify(
        "a fair lock",
        Config::a_fair_lock(),
        &[
            "a place ahead in line keeps a waiter out of a free fair lock",
            "a release hands the lock to a local waiter",
        ],
    );
}

#[test]
fn a_revoking_waiter_and_a_holder_that_ignores_it() {
    verify(
        "a revoking waiter",
        Config::a_revoking_waiter(),
        &[
            "a revocation's grace stops the holder's renewals",
            "a lock kept for a revoking waiter keeps another out",
            "a revoking waiter takes the lock",
        ],
    );
}

#[test]
fn an_operator_asks_the_holder_to_let_go() {
    verify(
        "an operator revokes",
        Config::an_operator_revokes(),
        &[
            "an operator asks a holder to let go",
            "a revocation's grace stops the holder's renewals",
        ],
    );
}

#[test]
fn an_operator_asks_a_semaphore_place_to_let_go() {
    verify(
        "an operator revokes a place",
        Config::an_operator_revokes_a_place(),
        &[
            "an operator asks a holder to let go",
            "a revocation's grace stops the holder's renewals",
        ],
    );
}

#[test]
fn a_holder_whose_work_stalls_and_one_whose_work_progresses() {
    verify(
        "a holder whose work stalls",
        Config::a_holder_whose_work_stalls(),
        &[
            "a holder whose work reports progress holds past max_idle",
            "a holder whose work stalls loses its lease to max_idle",
        ],
    );
}

#[test]
fn a_fair_lock_whose_waiter_stops_waiting() {
    verify(
        "a fair waiter leaves",
        Config::a_fair_waiter_leaves(),
        &[
            "a place ahead in line keeps a waiter out of a free fair lock",
            "a wait that ends gives its place in line up",
        ],
    );
}

#[test]
fn a_fair_semaphore_whose_caller_asks_for_both_places() {
    verify(
        "a fair semaphore",
        Config::a_fair_semaphore(),
        &[
            "a place ahead in line keeps a waiter out of a free fair lock",
            "a semaphore's caller holds several places at once",
        ],
    );
}

#[test]
fn a_fair_reader_writer_lock_with_a_writer_and_a_reader_in_one_process_and_a_writer_in_another() {
    verify(
        "a fair reader-writer lock",
        Config::a_fair_reader_writer_lock(),
        &[
            "a place ahead in line keeps a waiter out of a free fair lock",
            "a release hands the lock to a local waiter",
        ],
    );
}

#[test]
fn a_fair_reader_writer_lock_whose_writer_stops_waiting() {
    verify(
        "a fair writer leaves",
        Config::a_fair_writer_leaves(),
        &[
            "a place ahead in line keeps a waiter out of a free fair lock",
            "a wait that ends gives its place in line up",
        ],
    );
}

#[test]
fn each_planted_mistake_yields_a_counterexample() {
    let expected = [
        (
            Mistake::TransferOfALostLease,
            Config::handoff_and_faults(),
            "mutual exclusion",
        ),
        (
            Mistake::CleanupByName,
            Config::handoff_and_faults(),
            "mutual exclusion",
        ),
        (
            Mistake::TokenNotIncremented,
            Config::clocks_and_delays(),
            "fencing tokens increase in acquisition order",
        ),
        // A waiter whose own attempt won after an operator ended the lease a release was
        // handing it, handed that lease too: the model's bookkeeping of what callers want (a
        // property, where it was an arithmetic that underflowed and crashed the checker) yields
        // a path.
        (
            Mistake::TransferToALeaver,
            Config::an_operator_ends_a_lease(),
            BOOKKEEPING,
        ),
        // The crate's rule before the model found the hole: the abort overtakes the renewal,
        // which opens a transaction nobody ends.
        (
            Mistake::AbortAtOnce,
            Config::a_lease_checked_transaction(),
            "an open transaction is one its holder still ends",
        ),
        // The second extension, by less than is left, cuts the lease short on the server: the
        // caller of the other process takes the lock while the extender still holds it.
        (
            Mistake::ExtensionShortens,
            Config::a_lease_extended_by_hand(),
            "mutual exclusion",
        ),
    ];
    assert_eq!(
        expected.len(),
        Mistake::ALL.len(),
        "every planted mistake is checked"
    );
    for (mistake, config, property) in expected {
        counterexample(&format!("{mistake:?}"), mistake, config, property);
    }
}

/// Explores `config` with `mistake` planted until it finds a counterexample to `property`,
/// and prints it; panics, naming `name`, if there is none.
fn counterexample(name: &str, mistake: Mistake, config: Config, property: &'static str) {
    let started = Instant::now();
    let checker = LeaseProtocol::new(Config {
        mistake: Some(mistake),
        ..config
    })
    .checker()
    .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
    .spawn_bfs()
    .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{name}: no counterexample to {property:?}"));
    println!(
        "\n{name}: counterexample to {property:?} after {} states, in {:.1?}:",
        checker.unique_state_count(),
        started.elapsed()
    );
    for line in narrate(&path.into_vec()) {
        println!("  {line}");
    }
}
