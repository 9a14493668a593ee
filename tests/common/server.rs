//! Finds the MongoDB server for tests and examples: `MONGODB_URI` if set, otherwise the embedded
//! mongoeco server (scripts/mongoeco_server.py), started once per process and stopped when the
//! process exits (the server ends when its standard input closes).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

const HOW_TO_GET_ONE: &str = "set MONGODB_URI to a MongoDB 4.2+ server (e.g. `docker compose up -d` and \
MONGODB_URI=mongodb://localhost:27017/?directConnection=true), or install the embedded test server with \
`scripts/install-test-server` (needs Python 3.13)";

struct Embedded {
    uri: String,
    // Kept for the life of the process: its stdin pipe closing is the server's signal to stop.
    _child: Child,
}

/// The connection string of the server to use.
///
/// # Panics
/// If `MONGODB_URI` is unset and the embedded server cannot be started; the message says how to
/// get a server. Tests must never skip silently for lack of one.
pub fn uri() -> String {
    if let Ok(uri) = std::env::var("MONGODB_URI") {
        return uri;
    }
    static EMBEDDED: OnceLock<Embedded> = OnceLock::new();
    EMBEDDED
        .get_or_init(|| {
            start_embedded().unwrap_or_else(|problem| panic!("{problem}; {HOW_TO_GET_ONE}"))
        })
        .uri
        .clone()
}

/// Whether tests run against the embedded server (and may rely on its instant TTL deletion).
#[allow(dead_code)]
pub fn is_embedded() -> bool {
    std::env::var_os("MONGODB_URI").is_none()
}

fn start_embedded() -> Result<Embedded, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("MONGOECO_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    if !python.exists() {
        return Err(format!(
            "no MongoDB server: MONGODB_URI is unset and the embedded server's Python ({}) is missing",
            python.display()
        ));
    }
    let mut child = Command::new(&python)
        .arg(root.join("scripts/mongoeco_server.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|error| format!("could not start {}: {error}", python.display()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or("the embedded server has no stdout")?;
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = sender.send(line);
    });
    match receiver.recv_timeout(Duration::from_secs(60)) {
        Ok(line) if line.starts_with("mongodb://") => Ok(Embedded {
            uri: line.trim().to_owned(),
            _child: child,
        }),
        other => {
            let _ = child.kill();
            Err(format!(
                "the embedded server did not start (it printed {other:?})"
            ))
        }
    }
}
