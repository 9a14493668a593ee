//! The configurations too large for CI, checked to completion: every property of
//! `tests/check.rs` must hold. Run by hand (minutes, gigabytes):
//!
//! ```sh
//! cargo run -p lease-model --release --example long_runs
//! ```
//!
//! Exits 1 and prints the counterexample when a property fails.

use lease_model::protocol::{Config, broken, explore};

fn main() {
    let runs = [
        (
            "a caller leaves, with one fault",
            Config::a_caller_leaves_with_a_fault(),
        ),
        (
            "a semaphore of two places, with slow replies",
            Config {
                slow_replies: true,
                ..Config::a_semaphore_of_two_places()
            },
        ),
        (
            "an operator ends a semaphore place, with one fault",
            Config {
                faults: 1,
                ..Config::an_operator_ends_a_semaphore_place()
            },
        ),
    ];
    let mut failed = false;
    for (name, config) in runs {
        if let Some((property, path)) = broken(&explore(name, config)) {
            failed = true;
            println!("{name}: counterexample to {property:?}:");
            for line in path {
                println!("  {line}");
            }
        }
    }
    std::process::exit(i32::from(failed));
}
