//! Finds the MongoDB server for tests and examples: `MONGODB_URI` if set, otherwise the embedded
//! mongoeco server (scripts/mongoeco_server.py), started once per process and stopped when the
//! process exits (the server ends when its standard input closes).
//!
//! Tests that need isolation or a special server start their own with [`start_dedicated`].

use std::io::{BufRead, BufReader};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

const HOW_TO_GET_EMBEDDED: &str =
    "install the embedded test server with `scripts/install-test-server` (needs Python 3.13)";

const HOW_TO_GET_ONE: &str = "set MONGODB_URI to a MongoDB 4.2+ server (e.g. `docker compose up -d` and \
MONGODB_URI=mongodb://127.0.0.1:27017/?directConnection=true), or install the embedded test server with \
`scripts/install-test-server` (needs Python 3.13)";

struct Embedded {
    /// One connection string per port the server printed.
    uris: Vec<String>,
    // Its stdin pipe closing is the server's signal to stop.
    child: Child,
}

/// An embedded server of one test's own, stopped when this is dropped.
pub struct Dedicated {
    pub uri: String,
    /// The second port's connection string, when started with a clock skew: the same data,
    /// with `$$NOW` shifted (see scripts/mongoeco_server.py).
    pub skewed_uri: Option<String>,
    child: Child,
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        // Closing stdin stops the server; give it a moment to exit, then make sure.
        drop(self.child.stdin.take());
        for _ in 0..50 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an embedded server for one test (even when `MONGODB_URI` is set: a dedicated server is
/// always the embedded one). With `skew_ms`, it also serves the same data on a second port whose
/// clock is `skew_ms` milliseconds ahead (behind, if negative), like a second `mongos` whose clock
/// is off; TTL deletion there follows the unshifted clock, like a cluster's data-bearing nodes.
///
/// Blocks while the server starts (about a second).
///
/// # Panics
/// If the embedded server cannot be started; the message says how to get one.
pub fn start_dedicated(skew_ms: Option<i64>) -> Dedicated {
    let args = match skew_ms {
        Some(skew) => vec!["--skewed-port-offset-ms".to_owned(), skew.to_string()],
        None => Vec::new(),
    };
    start_dedicated_with(&args)
}

/// Like [`start_dedicated`], with the launcher's command-line `args` (see
/// scripts/mongoeco_server.py).
pub fn start_dedicated_with(args: &[String]) -> Dedicated {
    let python = embedded_python();
    assert!(
        python.exists(),
        "no dedicated test server: it is always the embedded one (whatever MONGODB_URI says), and \
         the embedded server's Python ({}) is missing; {HOW_TO_GET_EMBEDDED}",
        python.display()
    );
    let ports = if args.iter().any(|arg| arg == "--skewed-port-offset-ms") {
        2
    } else {
        1
    };
    let Embedded { mut uris, child } = start_embedded(args, ports)
        .unwrap_or_else(|problem| panic!("{problem}; {HOW_TO_GET_EMBEDDED}"));
    let skewed_uri = (uris.len() > 1).then(|| uris.remove(1));
    Dedicated {
        uri: uris.remove(0),
        skewed_uri,
        child,
    }
}

/// The connection string of the server to use.
///
/// # Panics
/// If `MONGODB_URI` is unset and the embedded server cannot be started; the message says how to
/// get a server. Tests must never skip silently for lack of one.
pub fn uri() -> String {
    if let Some(uri) = env_uri() {
        return uri;
    }
    static EMBEDDED: OnceLock<Embedded> = OnceLock::new();
    EMBEDDED
        .get_or_init(|| {
            start_embedded(&[], 1).unwrap_or_else(|problem| panic!("{problem}; {HOW_TO_GET_ONE}"))
        })
        .uris[0]
        .clone()
}

/// A server for one heavy test alone, so its load cannot slow the other tests of its binary:
/// `MONGODB_URI` when set (a real server runs commands concurrently), otherwise a dedicated
/// embedded server, stopped when this is dropped.
pub struct Isolated {
    pub uri: String,
    _dedicated: Option<Dedicated>,
}

pub fn isolated() -> Isolated {
    match env_uri() {
        Some(uri) => Isolated {
            uri,
            _dedicated: None,
        },
        None => {
            let dedicated = start_dedicated(None);
            Isolated {
                uri: dedicated.uri.clone(),
                _dedicated: Some(dedicated),
            }
        }
    }
}

/// `MONGODB_URI`, if set, once something was found to answer at one of its hosts.
///
/// # Panics
/// If nothing does (a stopped `scripts/test-server`, say): every test would otherwise wait out
/// the driver's server selection and fail with an error that does not say why.
fn env_uri() -> Option<String> {
    static ANSWERS: OnceLock<Result<(), String>> = OnceLock::new();
    let uri = std::env::var("MONGODB_URI").ok()?;
    let checked = ANSWERS.get_or_init(|| match hosts(&uri) {
        Some(hosts) if !answers(&hosts, Duration::from_secs(5)) => Err(format!(
            "nothing answers at the hosts of MONGODB_URI ({}): is its server still running? \
             `scripts/test-server` starts one and prints a new MONGODB_URI; unset MONGODB_URI \
             to let the tests start embedded servers",
            hosts.join(", ")
        )),
        _ => Ok(()),
    });
    if let Err(problem) = checked {
        panic!("{problem}");
    }
    Some(uri)
}

/// The hosts (`host:port`) of a `mongodb://` connection string; `None` for a string this cannot
/// read (`mongodb+srv://` names no host itself).
pub fn hosts(uri: &str) -> Option<Vec<String>> {
    let rest = uri.strip_prefix("mongodb://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let list = &rest[..end];
    let list = list.rsplit_once('@').map_or(list, |(_, hosts)| hosts);
    let hosts: Vec<String> = list
        .split(',')
        .filter(|host| !host.is_empty())
        .map(|host| {
            let bracketed = host.starts_with('[');
            let has_port = match host.rfind(':') {
                Some(colon) => !bracketed || host[..colon].ends_with(']'),
                None => false,
            };
            if has_port {
                host.to_owned()
            } else {
                format!("{host}:27017")
            }
        })
        .collect();
    (!hosts.is_empty()).then_some(hosts)
}

/// Whether something accepts a TCP connection at one of `hosts` (as [`hosts`] gives them) within
/// `patience` each.
pub fn answers(hosts: &[String], patience: Duration) -> bool {
    hosts.iter().any(|host| {
        let Some((name, port)) = host.rsplit_once(':') else {
            return false;
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        let Ok(port) = port.parse::<u16>() else {
            return false;
        };
        (name, port).to_socket_addrs().is_ok_and(|mut addresses| {
            addresses.any(|address| TcpStream::connect_timeout(&address, patience).is_ok())
        })
    })
}

/// Whether tests run against the embedded server (and may rely on its instant TTL deletion).
pub fn is_embedded() -> bool {
    std::env::var_os("MONGODB_URI").is_none()
}

fn embedded_python() -> PathBuf {
    std::env::var_os("MONGOECO_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repository_root().join(".venv/bin/python"))
}

/// The repository's root: the nearest folder at or above this crate's manifest that holds the
/// launcher.
fn repository_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|folder| folder.join("scripts/mongoeco_server.py").exists())
        .unwrap_or(manifest)
        .to_path_buf()
}

/// Starts scripts/mongoeco_server.py with `args` (through scripts/mongoeco_start.py) and waits for the `ports` connection strings it
/// prints, one a line.
fn start_embedded(args: &[String], ports: usize) -> Result<Embedded, String> {
    let root = repository_root();
    let python = embedded_python();
    if !python.exists() {
        return Err(format!(
            "no MongoDB server: MONGODB_URI is unset and the embedded server's Python ({}) is missing",
            python.display()
        ));
    }
    // Through the starter: a fork of scripts/test's fork server when there is one (no second of
    // Python's start-up per server), else the launcher itself, in this very process.
    let mut child = Command::new(&python)
        .args(["-I", "-S"])
        .arg(root.join("scripts/mongoeco_start.py"))
        .args(args)
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
        let mut stdout = BufReader::new(stdout);
        let mut lines = Vec::new();
        for _ in 0..ports {
            let mut line = String::new();
            let _ = stdout.read_line(&mut line);
            lines.push(line);
        }
        let _ = sender.send(lines);
    });
    match receiver.recv_timeout(Duration::from_secs(60)) {
        Ok(lines) if lines.iter().all(|line| line.starts_with("mongodb://")) => Ok(Embedded {
            uris: lines.iter().map(|line| line.trim().to_owned()).collect(),
            child,
        }),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "the embedded server did not start (it printed {other:?})"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_of_a_connection_string_get_the_default_port_and_lose_the_credentials() {
        let hosts = |uri: &str| hosts(uri).unwrap_or_default();
        assert_eq!(hosts("mongodb://127.0.0.1:38067/app"), ["127.0.0.1:38067"]);
        assert_eq!(
            hosts("mongodb://user:secret@a,b:27018/?replicaSet=rs0"),
            ["a:27017", "b:27018"]
        );
        assert_eq!(hosts("mongodb://[::1]:5/"), ["[::1]:5"]);
        assert_eq!(hosts("mongodb://[::1]"), ["[::1]:27017"]);
        assert_eq!(
            hosts("mongodb+srv://cluster.example.net/"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_host_answers_while_something_listens_there_and_not_after() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host = vec![listener.local_addr().unwrap().to_string()];
        let patience = Duration::from_secs(2);
        assert!(answers(&host, patience));
        drop(listener);
        assert!(!answers(&host, patience), "nothing listens at {host:?}");
        let two = vec![host[0].clone(), "localhost:1".to_owned()];
        assert!(!answers(&two, patience));
    }
}
