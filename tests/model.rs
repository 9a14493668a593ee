//! The model checker's verdicts (`model/tests/check.rs`), compiled as a test of this crate: a
//! mutation of the crate's protocol core or pipelines is then checked by the model in the same
//! `cargo test` that cargo-mutants runs for it (`scripts/mutants`). `test = false` in
//! `Cargo.toml`: a plain `cargo test` leaves it to the model's own package.

#[path = "../model/tests/check.rs"]
mod check;
