//! The integration tests against a MongoDB server: one module per concern, in one test binary.
//!
//! One binary, not one per file: each test binary compiles the driver's generic code and links
//! again: the workspace's test targets took about 150 CPU seconds to build with forty such
//! binaries, 96 with this one (2026-11-27, `touch src/lib.rs` then `cargo test --no-run`).
//! `scripts/test` runs each module in a process of its own, several at a time
//! (`scripts/run-test-binaries`), so each module still gets its own embedded server;
//! `cargo test --test suite` runs them all in one process, on one server. The metrics test stays a
//! binary of its own (`tests/metrics.rs`): it installs the process's metrics recorder and tracing
//! subscriber.

mod administration;
mod bad_input;
#[cfg(feature = "blocking")]
mod blocking;
mod chaos_history;
mod chaos_random_history;
mod composite;
mod document_lock;
mod exclusive_lock;
mod extend;
mod fair;
mod fault_clock_skew;
mod fault_crash;
mod fault_partition;
mod fault_server_loss;
mod fault_unknown_outcomes;
mod fence;
mod handoff;
mod infra_architecture;
mod infra_change_streams;
mod infra_example_output;
mod infra_fault_proxy;
mod infra_fork_server;
mod infra_plant_mistakes;
mod infra_real_cluster;
mod infra_test_server;
mod infra_write_paths;
mod interop;
mod job;
mod leader_election;
mod lease;
mod lock_behaviour;
mod lost_signal;
mod lost_without_renewal;
mod min_hold;
mod property_cancellation;
mod property_contention;
mod property_exclusion;
mod push;
mod read_preference;
mod reader_writer;
mod revocation;
mod round_trips;
mod script_copy;
mod semaphore;
mod send_sync;
mod shared_renewal;
mod shutdown;
mod tracing_events;
mod transactions;
mod upgradeable_read;
mod watch;
mod weighted_semaphore;
mod who_blocks_me;
mod work_bound_to_lease;
