//! Child processes running the `lock_worker` fixture (`tests/fixtures/lock_worker.rs`, an example
//! target: `cargo test` builds it).

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// Starts the worker example with `args`, against the same server as this test.
pub fn spawn(args: &[&str]) -> Child {
    spawn_against(&crate::server::uri(), args)
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
        "{} is missing: run the tests with `scripts/test` (it builds the worker) or \
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

/// Waits (at most 30 s) for a `hold` worker's first line, which says it acquired the lock, and
/// returns the rest of its output, to keep while the worker lives (its stdout stays open).
///
/// # Panics
/// If the worker prints nothing in time, or something else first.
pub async fn acquired(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker acquires")
        .expect("read the worker's output")
        .expect("a first line");
    assert!(first.starts_with("acquired "), "{first}");
    lines
}

/// Waits at most `limit` for a worker to exit successfully and returns the last line it printed
/// (its summary).
///
/// # Panics
/// If it does not exit in time or fails; the message shows what it printed.
pub async fn summary(child: &mut Child, limit: std::time::Duration) -> String {
    output(child, limit)
        .await
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// Waits at most `limit` for a worker to exit successfully and returns all it printed. Its output
/// is read while it runs, so a worker that prints more than a pipe holds does not stall.
///
/// # Panics
/// If it does not exit in time or fails; the message shows what it printed.
pub async fn output(child: &mut Child, limit: std::time::Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut output = String::new();
    let mut stdout = child.stdout.take();
    let read = async {
        if let Some(stdout) = stdout.as_mut() {
            stdout
                .read_to_string(&mut output)
                .await
                .expect("read the worker's output");
        }
    };
    let (status, ()) = tokio::time::timeout(limit, async { tokio::join!(child.wait(), read) })
        .await
        .unwrap_or_else(|_| panic!("the worker did not finish within {limit:?}"));
    let status = status.expect("wait for the worker");
    assert!(status.success(), "worker failed: {output}");
    output
}
