//! The configurations too large for CI, checked to completion: every property of
//! `tests/check.rs` must hold. Run by hand (minutes, gigabytes):
//!
//! ```sh
//! cargo run -p lease-model --release --example long_runs
//! ```
//!
//! Exits 1 and prints the counterexample when a property fails.

use std::time::Instant;

use lease_model::protocol::{Config, LeaseProtocol, narrate};
use lease_model::stateright::{Checker, Model};

const PROPERTIES: [&str; 5] = [
    "mutual exclusion",
    "fencing tokens increase in acquisition order",
    "no stale fenced write is accepted",
    "a caller is handed a lease only while it asks for one",
    "every caller is served",
];

fn main() {
    let runs = [(
        "a caller leaves, with one fault",
        Config::a_caller_leaves_with_a_fault(),
    )];
    let mut failed = false;
    for (name, config) in runs {
        let started = Instant::now();
        let checker = LeaseProtocol::new(config).checker().spawn_bfs().join();
        println!(
            "{name}: {} states ({} unique), depth {}, in {:.1?}",
            checker.state_count(),
            checker.unique_state_count(),
            checker.max_depth(),
            started.elapsed()
        );
        for property in PROPERTIES {
            if let Some(path) = checker.discovery(property) {
                failed = true;
                println!("{name}: counterexample to {property:?}:");
                for line in narrate(&path.into_vec()) {
                    println!("  {line}");
                }
            }
        }
    }
    std::process::exit(i32::from(failed));
}
