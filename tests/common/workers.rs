//! Child processes running `examples/lock_worker.rs` (built by `cargo test` with the examples).

use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, Command};

/// Starts the worker example with `args`, against the same server as this test.
pub fn spawn(args: &[&str]) -> Child {
    spawn_against(&super::server::uri(), args)
}

/// Starts the worker example with `args`, against the server at `uri`.
pub fn spawn_against(uri: &str, args: &[&str]) -> Child {
    // target/<profile>/deps/<test binary> -> target/<profile>/examples/lock_worker
    let exe = std::env::current_exe().expect("test binary path");
    let worker: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("lock_worker"))
        .expect("target directory layout");
    assert!(
        worker.exists(),
        "{} is missing: run the tests with `scripts/test` (cargo test builds the examples) or \
         `cargo build --example lock_worker` first",
        worker.display()
    );
    Command::new(worker)
        .args(args)
        .env("MONGODB_URI", uri)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start lock_worker")
}
