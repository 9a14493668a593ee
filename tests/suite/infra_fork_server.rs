//! The fork server that scripts/test starts (`scripts/mongoeco_server.py --fork-server`) and the
//! starter through which the tests start embedded servers (`scripts/mongoeco_start.py`): a server
//! forked for a caller is the server `python mongoeco_server.py ARGS` starts (same output, same
//! exit status, ends when its standard input does), without Python's start-up; and without a fork
//! server the starter becomes that very command.

use test_support as common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use mongodb::Client;
use mongodb::bson::{Document, doc};

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    repository().join(".venv/bin/python")
}

/// A fork server on a socket of its own, ended (its standard input closed) when dropped.
struct ForkServer {
    socket: PathBuf,
    child: Child,
}

impl ForkServer {
    fn start() -> ForkServer {
        let directory = std::env::temp_dir().join(common::unique("fork-server"));
        std::fs::create_dir_all(&directory).unwrap();
        let socket = directory.join("socket");
        let child = Command::new(python())
            .arg(repository().join("scripts/mongoeco_server.py"))
            .arg("--fork-server")
            .arg(&socket)
            .env("OPENBLAS_NUM_THREADS", "1")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !socket.exists() {
            assert!(started.elapsed() < Duration::from_secs(60), "no socket");
            std::thread::sleep(Duration::from_millis(50));
        }
        ForkServer { socket, child }
    }
}

impl Drop for ForkServer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.socket.parent().unwrap());
    }
}

/// Runs the starter with `args`, through the fork server at `socket`.
fn starter(socket: &Path, args: &[&str]) -> Child {
    Command::new(python())
        .args(["-I", "-S"])
        .arg(repository().join("scripts/mongoeco_start.py"))
        .args(args)
        .env("MONGOECO_FORK_SERVER", socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The first line the server printed: its connection string.
fn uri_of(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("mongodb://"), "printed {line:?}");
    line.trim().to_owned()
}

/// What runs in the starter's process now: the starter, or the server it became.
fn command_line(child: &Child) -> String {
    std::fs::read_to_string(format!("/proc/{}/cmdline", child.id()))
        .unwrap()
        .replace('\0', " ")
}

fn wait_at_most(child: &mut Child, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(started.elapsed() < limit, "still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Closes the server's standard input: it must end, and its starter with status 0.
fn ends_with_its_input(mut child: Child) {
    drop(child.stdin.take());
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
}

async fn answers(uri: &str) -> bool {
    let client = Client::with_uri_str(format!("{uri}&serverSelectionTimeoutMS=1000"))
        .await
        .unwrap();
    let answered = client
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .is_ok();
    client.shutdown().await;
    answered
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_forked_for_two_callers_serve_apart_and_end_with_their_input() {
    let fork_server = ForkServer::start();
    let mut first = starter(&fork_server.socket, &["--port", "0"]);
    let mut second = starter(&fork_server.socket, &["--port", "0"]);
    let (first_uri, second_uri) = (uri_of(&mut first), uri_of(&mut second));
    assert_ne!(first_uri, second_uri);
    for child in [&first, &second] {
        // Served by a fork: the starter did not become the server.
        assert!(command_line(child).contains("mongoeco_start.py"));
    }
    // Two servers, two sets of data.
    let client = Client::with_uri_str(&first_uri).await.unwrap();
    let collection = client.database("d").collection::<Document>("c");
    collection.insert_one(doc! { "_id": 1 }).await.unwrap();
    assert_eq!(collection.count_documents(doc! {}).await.unwrap(), 1);
    client.shutdown().await;
    let client = Client::with_uri_str(&second_uri).await.unwrap();
    let elsewhere = client.database("d").collection::<Document>("c");
    assert_eq!(elsewhere.count_documents(doc! {}).await.unwrap(), 0);
    client.shutdown().await;

    // Closing a server's input ends it, and its starter with its status.
    tokio::task::spawn_blocking(move || ends_with_its_input(first))
        .await
        .unwrap();
    assert!(!answers(&first_uri).await, "the first server still answers");
    assert!(
        answers(&second_uri).await,
        "the second server went with the first"
    );
    tokio::task::spawn_blocking(move || ends_with_its_input(second))
        .await
        .unwrap();
}

#[test]
fn a_forked_server_refuses_bad_arguments_as_a_fresh_one_does() {
    let fork_server = ForkServer::start();
    let mut child = starter(&fork_server.socket, &["--no-such-option"]);
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unrecognized arguments: --no-such-option"),
        "{stderr}"
    );
}

#[test]
fn without_a_fork_server_the_starter_becomes_the_server() {
    let nowhere = std::env::temp_dir().join(common::unique("no-fork-server"));
    let mut child = starter(&nowhere, &["--port", "0"]);
    uri_of(&mut child);
    assert!(
        command_line(&child).contains("mongoeco_server.py"),
        "{}",
        command_line(&child)
    );
    ends_with_its_input(child);
}
