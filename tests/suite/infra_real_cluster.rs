//! The real-cluster tooling, checked without a container engine or a MongoDB server (neither can
//! run on our build machines, so `scripts/real-cluster` and the workflow have never run for real):
//!
//! - `scripts/real-cluster`: its help, its refusal of bad arguments (exit 2) and of a missing
//!   Docker engine (exit 3), its dry run (the commands, URIs, image version and failover steps it
//!   would run, without docker on PATH), and whole runs against stand-in `docker` and `cargo`
//!   commands that record what they are asked (order of the parts, the failover loop, the
//!   summary and exit status, the teardown);
//! - `docker-compose.yml`: the services, ports and replica-set names the script and the README
//!   use, every image tag driven by `MONGODB_VERSION`;
//! - `.github/workflows/real-cluster.yml`: a matrix equal to the MongoDB releases the README
//!   claims, the script run with each, a timeout.
//!
//! The YAML files are read with PyYAML from the embedded server's venv (`scripts/install-test-server`
//! installs both).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// MongoDB's release series with a `mongo` image, oldest first. The workflow's matrix must hold
/// every one from the README's claimed minimum on: add a new release here and to the matrix.
const MONGODB_RELEASES: &[&str] = &["3.6", "4.0", "4.2", "4.4", "5.0", "6.0", "7.0", "8.0"];

const RS0_URI: &str = "mongodb://127.0.0.1:27017/?directConnection=true";
const MONGOS_1_URI: &str = "mongodb://127.0.0.1:27030";
const MONGOS_2_URI: &str = "mongodb://127.0.0.1:27031";
const RS0_SERVICES: &[&str] = &["rs0-1", "rs0-2", "rs0-3", "rs0-init"];
const CLUSTER_SERVICES: &[&str] = &[
    "cfg-1",
    "shard1-1",
    "shard1-2",
    "shard1-3",
    "shard2-1",
    "mongos-1",
    "mongos-2",
    "cluster-init",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The first executable called `name` in the directories of `path`.
fn find_on(path: &OsString, name: &str) -> Option<PathBuf> {
    std::env::split_paths(path)
        .map(|directory| directory.join(name))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|meta| {
                meta.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0
            })
        })
}

fn path() -> OsString {
    std::env::var_os("PATH").unwrap_or_default()
}

fn bash() -> PathBuf {
    find_on(&path(), "bash").expect("bash on PATH")
}

/// Runs `scripts/real-cluster` with `args`; `configure` may change the environment. The script
/// runs in a process group of its own, with a time limit; anything of that group still running
/// once it has exited (a failover loop that outlived it) fails the test, and is killed.
fn real_cluster(args: &[&str], configure: impl FnOnce(&mut Command)) -> Output {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let capture = |stream: &str| {
        std::env::temp_dir().join(format!(
            "infra-real-cluster-{}-{run}.{stream}",
            std::process::id()
        ))
    };
    let (stdout_path, stderr_path) = (capture("out"), capture("err"));
    let mut command = Command::new(bash());
    command
        .arg(root().join("scripts/real-cluster"))
        .args(args)
        .env_remove("CHAOS_SECONDS")
        .env_remove("CHAOS_SEED")
        .env_remove("FAILOVER_PAUSE")
        .env_remove("MONGODB_VERSION")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .process_group(0);
    configure(&mut command);
    let mut child = command.spawn().expect("run scripts/real-cluster");
    let group = -i32::try_from(child.id()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            // SAFETY: kill(2) on the script's own process group.
            unsafe { libc::kill(group, libc::SIGKILL) };
            panic!("scripts/real-cluster {args:?} ran for over 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let left_behind = (0..100).all(|_| {
        // SAFETY: signal 0 only asks whether the group still has a process.
        let alive = unsafe { libc::kill(group, 0) } == 0;
        if alive {
            std::thread::sleep(Duration::from_millis(20));
        }
        alive
    });
    if left_behind {
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
    }
    let output = Output {
        status,
        stdout: std::fs::read(&stdout_path).unwrap(),
        stderr: std::fs::read(&stderr_path).unwrap(),
    };
    let _ = std::fs::remove_file(&stdout_path);
    let _ = std::fs::remove_file(&stderr_path);
    assert!(
        !left_behind,
        "scripts/real-cluster {args:?} left processes running after it exited:\n{}",
        text(&output.stdout)
    );
    output
}

fn dry_run(args: &[&str]) -> String {
    let mut all = vec!["--dry-run"];
    all.extend_from_slice(args);
    let output = real_cluster(&all, |_| {});
    assert!(
        output.status.success(),
        "--dry-run {args:?} failed: {}\n{}",
        output.status,
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// The commands a dry run prints (lines `+ ...`, also `failover: + ...`), without the `+ `.
fn commands(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|line| {
            line.strip_prefix("+ ")
                .or_else(|| line.strip_prefix("failover: + "))
        })
        .map(str::to_owned)
        .collect()
}

fn position(lines: &[String], needle: &str) -> usize {
    lines
        .iter()
        .position(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no command contains {needle:?} in {lines:#?}"))
}

/// The services a `docker compose ... up -d --wait` command brings up.
fn services_brought_up(lines: &[String]) -> Vec<String> {
    let up = &lines[position(lines, " up -d --wait ")];
    let after = up.split(" up -d --wait ").nth(1).unwrap();
    after.split_whitespace().map(str::to_owned).collect()
}

// ---------------------------------------------------------------------------------------------
// YAML, through PyYAML: the document flattened to `path<TAB>JSON scalar` lines.

const FLATTEN: &str = r#"
import json, sys, yaml
def walk(node, path):
    if isinstance(node, dict):
        for key, value in node.items():
            key = "on" if key is True else str(key)  # YAML 1.1 reads a bare `on` as true
            walk(value, path + "." + key if path else key)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            walk(value, path + "." + str(index))
    else:
        print(path + "\t" + json.dumps(node))
with open(sys.argv[1]) as f:
    walk(yaml.safe_load(f), "")
"#;

struct Yaml(BTreeMap<String, String>);

fn python() -> PathBuf {
    std::env::var_os("MONGOECO_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".venv/bin/python"))
}

fn yaml(path: &str) -> Yaml {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run scripts/install-test-server (it installs PyYAML too)",
        python.display()
    );
    let output = Command::new(&python)
        .args(["-c", FLATTEN])
        .arg(root().join(path))
        .output()
        .expect("run the venv's Python");
    assert!(
        output.status.success(),
        "{path} does not parse as YAML (or PyYAML is missing: run scripts/install-test-server): {}",
        text(&output.stderr)
    );
    Yaml(
        text(&output.stdout)
            .lines()
            .map(|line| {
                let (key, value) = line.split_once('\t').expect("path<TAB>value");
                (key.to_owned(), value.to_owned())
            })
            .collect(),
    )
}

impl Yaml {
    /// The scalar at `key` as JSON (`"7.0"` for a string, `7.0` for a number).
    fn raw(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// The scalar at `key` as text (a string unquoted).
    fn text(&self, key: &str) -> Option<String> {
        self.raw(key).map(json_text)
    }

    /// The list at `key`, each item as text.
    fn list(&self, key: &str) -> Vec<String> {
        (0..)
            .map_while(|index| self.text(&format!("{key}.{index}")))
            .collect()
    }

    /// The names of the mapping at `key`.
    fn children(&self, key: &str) -> BTreeSet<String> {
        let prefix = format!("{key}.");
        self.0
            .keys()
            .filter_map(|path| path.strip_prefix(&prefix))
            .map(|rest| rest.split('.').next().unwrap().to_owned())
            .collect()
    }

    fn has(&self, key: &str) -> bool {
        let prefix = format!("{key}.");
        self.0
            .keys()
            .any(|path| path == key || path.starts_with(&prefix))
    }
}

/// A JSON scalar as text: a string unescaped, anything else as written.
fn json_text(raw: &str) -> String {
    let Some(inner) = raw
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return raw.to_owned();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let code = u32::from_str_radix(&hex, 16).expect("a \\u escape");
                out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The README's claim.

fn version_key(version: &str) -> (u32, u32) {
    let (major, minor) = version.split_once('.').expect("major.minor");
    (major.parse().unwrap(), minor.parse().unwrap())
}

/// The minimum of a README's "MongoDB X.Y or later" (its first such claim).
fn claimed_minimum_in(readme: &str) -> Option<String> {
    readme.split("MongoDB ").skip(1).find_map(|rest| {
        let version: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        (!version.is_empty() && rest[version.len()..].starts_with(" or later")).then_some(version)
    })
}

fn claimed_minimum() -> String {
    claimed_minimum_in(&read("README.md")).expect("README.md claims \"MongoDB X.Y or later\"")
}

/// The release series from `minimum` on.
fn releases_from(minimum: &str) -> Vec<String> {
    assert!(
        MONGODB_RELEASES.contains(&minimum),
        "the README claims MongoDB {minimum} or later, which is not a release series listed here"
    );
    MONGODB_RELEASES
        .iter()
        .filter(|release| version_key(release) >= version_key(minimum))
        .map(|release| (*release).to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The script's arguments.

#[test]
fn help_describes_every_option_and_exits_0() {
    for flag in ["--help", "-h"] {
        let output = real_cluster(&[flag], |_| {});
        assert_eq!(output.status.code(), Some(0), "{flag}");
        let help = text(&output.stdout);
        for word in [
            "Usage: scripts/real-cluster",
            "--mongodb-version",
            "--only",
            "suite",
            "chaos",
            "bench",
            "--keep",
            "--dry-run",
            "--help",
        ] {
            assert!(
                help.contains(word),
                "{flag} does not mention {word}: {help}"
            );
        }
        assert!(
            !help.contains("+ "),
            "{flag} printed commands as if it ran: {help}"
        );
    }
    // The workflow and the README run it directly.
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(root().join("scripts/real-cluster"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(
        mode & 0o111,
        0o111,
        "scripts/real-cluster is not executable"
    );
}

#[test]
fn bad_arguments_exit_2_naming_the_argument() {
    for (args, named) in [
        (&["--bogus"][..], "--bogus"),
        (&["--only", "everything"][..], "everything"),
        (&["--only=nope"][..], "nope"),
        (&["--only"][..], "--only"),
        (&["--mongodb-version"][..], "--mongodb-version"),
        (&["--mongodb-version", "latest"][..], "latest"),
        (&["--mongodb-version=7"][..], "'7'"),
        (&["--dry-run", "extra"][..], "extra"),
    ] {
        let output = real_cluster(args, |_| {});
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(named),
            "{args:?}: the message does not name {named}: {stderr}"
        );
        assert!(
            output.stdout.is_empty(),
            "{args:?} printed: {}",
            text(&output.stdout)
        );
    }
    // A bad setting in the environment too.
    let output = real_cluster(&["--dry-run"], |command| {
        command.env("CHAOS_SECONDS", "five");
    });
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("five"));
}

// ---------------------------------------------------------------------------------------------
// The dry run.

#[test]
fn the_default_dry_run_runs_every_part_in_order_against_the_right_clusters() {
    let output = dry_run(&[]);
    let lines = commands(&output);

    // Every compose command is given the default image version.
    let compose: Vec<&String> = lines
        .iter()
        .filter(|line| line.contains("docker compose"))
        .collect();
    assert!(compose.len() >= 6, "{lines:#?}");
    for line in &compose {
        assert!(
            line.starts_with("env MONGODB_VERSION=7.0 docker compose -f docker-compose.yml "),
            "{line}"
        );
    }
    // A clean start with both clusters, the teardown at the end.
    let up = position(&lines, " up -d --wait ");
    assert!(position(&lines, " down -v ") < up);
    let mut expected: Vec<&str> = RS0_SERVICES.to_vec();
    expected.extend_from_slice(CLUSTER_SERVICES);
    assert_eq!(services_brought_up(&lines), expected);
    assert!(
        lines.last().unwrap().ends_with(" down -v --remove-orphans"),
        "no teardown last: {lines:#?}"
    );

    // The suite, then the chaos run, then the bench, with their URIs.
    let suite = position(
        &lines,
        &format!("env 'MONGODB_URI={RS0_URI}' scripts/test --no-fail-fast"),
    );
    let chaos = position(
        &lines,
        &format!(
            "env MONGODB_URI={MONGOS_1_URI} MONGODB_URI_2={MONGOS_2_URI} CHAOS_SECONDS=300 \
             cargo test --all-features --test suite chaos_history:: -- --nocapture"
        ),
    );
    let bench = position(
        &lines,
        &format!("env 'MONGODB_URI={RS0_URI}' cargo bench --bench perf_table"),
    );
    assert!(up < suite && suite < chaos && chaos < bench, "{lines:#?}");

    // The failover loop on shard1: a stepdown, then a stop and a start of the primary.
    let failover: Vec<&str> = output
        .lines()
        .filter_map(|line| line.strip_prefix("failover: + "))
        .collect();
    assert!(
        failover
            .iter()
            .any(|line| line.contains(" exec -T shard1-1 ") && line.contains("primary")),
        "{failover:#?}"
    );
    let stepdown = failover
        .iter()
        .position(|line| line.contains("replSetStepDown"))
        .expect("a stepdown");
    let stop = failover
        .iter()
        .position(|line| line.ends_with(" stop '<primary>'"))
        .expect("a stop of the primary");
    let start = failover
        .iter()
        .position(|line| line.ends_with(" start '<primary>'"))
        .expect("a start of the primary");
    assert!(stepdown < stop && stop < start, "{failover:#?}");
    // The shell that exists in the image, whichever it is.
    assert!(
        failover[stepdown].contains("command -v mongosh")
            && failover[stepdown].contains("exec mongo ")
    );
    // It comes before the chaos run (it runs in the background during it), after the build.
    let build = position(&lines, "cargo test --all-features --test suite --no-run");
    let first_failover = position(&lines, "replSetStepDown");
    assert!(build < first_failover && first_failover < chaos);
    // Every member of shard1 is started again afterwards.
    let restart = position(&lines, " start shard1-1 shard1-2 shard1-3");
    assert!(chaos < restart && restart < bench);

    assert!(output.contains("dry run, nothing was run"));
}

#[test]
fn a_dry_run_of_the_chaos_part_on_4_4_runs_nothing_else() {
    let output = dry_run(&["--only", "chaos", "--mongodb-version", "4.4"]);
    let lines = commands(&output);
    assert!(output.contains("MongoDB 4.4"), "{output}");
    for line in lines.iter().filter(|line| line.contains("docker compose")) {
        assert!(
            line.starts_with("env MONGODB_VERSION=4.4 docker compose "),
            "{line}"
        );
    }
    assert!(!output.contains("MONGODB_VERSION=7.0"), "{output}");
    assert_eq!(services_brought_up(&lines), CLUSTER_SERVICES);
    position(
        &lines,
        &format!("env MONGODB_URI={MONGOS_1_URI} MONGODB_URI_2={MONGOS_2_URI}"),
    );
    position(&lines, "--test suite chaos_history:: -- --nocapture");
    position(&lines, "replSetStepDown");
    position(&lines, " stop '<primary>'");
    position(&lines, " start '<primary>'");
    for excluded in [
        "scripts/test",
        "perf_table",
        "rs0-",
        "27017/?directConnection",
        "cargo bench",
    ] {
        assert!(
            !output.contains(excluded),
            "--only chaos printed {excluded:?}: {output}"
        );
    }
}

#[test]
fn parts_run_in_their_order_whatever_the_order_of_only() {
    let output = dry_run(&["--only", "bench", "--only=suite"]);
    let lines = commands(&output);
    assert_eq!(services_brought_up(&lines), RS0_SERVICES);
    assert!(position(&lines, "scripts/test") < position(&lines, "perf_table"));
    assert!(!output.contains("chaos_history") && !output.contains("shard1"));
}

#[test]
fn keep_leaves_the_clusters_up() {
    let output = dry_run(&["--keep", "--only", "suite"]);
    let lines = commands(&output);
    let up = position(&lines, " up -d --wait ");
    assert!(
        !lines[up..].iter().any(|line| line.contains(" down ")),
        "--keep tore down: {lines:#?}"
    );
    assert!(output.contains("kept the clusters up"), "{output}");
}

#[test]
fn a_dry_run_needs_no_docker() {
    // An empty PATH: no docker, and no other command either (bash is started by its path).
    let empty =
        std::env::temp_dir().join(format!("infra-real-cluster-{}-empty", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let no_docker = empty.clone().into_os_string();
    assert!(find_on(&no_docker, "docker").is_none());
    let output = real_cluster(&["--dry-run"], |command| {
        command.env("PATH", &no_docker);
    });
    assert!(
        output.status.success(),
        "{}: {}",
        output.status,
        text(&output.stderr)
    );
    let lines = commands(&text(&output.stdout));
    position(&lines, "docker compose -f docker-compose.yml up -d --wait");
    position(&lines, "cargo bench --bench perf_table");

    // Without --dry-run, the same PATH is refused as no Docker: exit 3, before running anything.
    let output = real_cluster(&[], |command| {
        command.env("PATH", &no_docker);
    });
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("no docker command"));
    assert!(commands(&text(&output.stdout)).is_empty());
    let _ = std::fs::remove_dir(&empty);
}

// ---------------------------------------------------------------------------------------------
// Whole runs against stand-in `docker` and `cargo` (`tests/fixtures/real-cluster/`).

struct Fakes {
    directory: PathBuf,
}

impl Fakes {
    fn new(name: &str) -> Fakes {
        let directory =
            std::env::temp_dir().join(format!("infra-real-cluster-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        // Links to the checked-in scripts, not copies: a script this process had just written
        // could fail to start with "Text file busy" while a child forked by another test thread
        // still held the inherited write descriptor (rust-lang/rust#114554).
        for file in ["docker", "cargo"] {
            let script = root().join("tests/fixtures/real-cluster").join(file);
            std::os::unix::fs::symlink(script, directory.join(file)).unwrap();
        }
        Fakes { directory }
    }

    fn log_path(&self) -> PathBuf {
        self.directory.join("log")
    }

    /// Runs the script with the stand-ins first on PATH, `env` set.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (Output, Vec<String>) {
        let mut paths = vec![self.directory.clone()];
        paths.extend(std::env::split_paths(&path()));
        let fake_path = std::env::join_paths(paths).unwrap();
        assert_eq!(
            find_on(&fake_path, "cargo"),
            Some(self.directory.join("cargo")),
            "the stand-in cargo must come first: a real one would run the suite inside this test"
        );
        let output = real_cluster(args, |command| {
            command
                .env("PATH", &fake_path)
                .env("FAKE_LOG", self.log_path());
            for (key, value) in env {
                command.env(key, value);
            }
        });
        let log = std::fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        (output, log)
    }
}

impl Drop for Fakes {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

#[test]
fn a_run_goes_on_after_a_failed_part_fails_over_shard1_and_tears_down() {
    let fakes = Fakes::new("full");
    let started = Instant::now();
    let (output, log) = fakes.run(
        &[],
        &[
            ("FAKE_CHAOS_EXIT", "7"),
            ("FAKE_CHAOS_SLEEP", "6"),
            ("FAILOVER_PAUSE", "1"),
            ("CHAOS_SECONDS", "42"),
        ],
    );
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    for result in ["suite: passed", "chaos: FAILED (exit 7)", "bench: passed"] {
        assert!(stdout.contains(result), "no {result:?} in: {stdout}");
    }

    for line in log.iter().filter(|line| line.starts_with("docker compose")) {
        assert!(line.contains("MONGODB_VERSION=7.0"), "{line}");
    }
    let up = position(&log, " up -d --wait ");
    let suite = position(
        &log,
        &format!("cargo test --workspace --all-features --no-fail-fast MONGODB_URI={RS0_URI} "),
    );
    let chaos = position(
        &log,
        &format!(
            "cargo test --all-features --test suite chaos_history:: -- --nocapture \
             MONGODB_URI={MONGOS_1_URI} MONGODB_URI_2={MONGOS_2_URI} CHAOS_SECONDS=42"
        ),
    );
    let bench = position(
        &log,
        &format!("cargo bench --bench perf_table MONGODB_URI={RS0_URI} "),
    );
    assert!(up < suite && suite < chaos && chaos < bench, "{log:#?}");
    // The failover loop found shard1's primary (shard1-2, says the stand-in), stepped it down,
    // stopped it and started it again, during the chaos run.
    let stepdown = position(&log, "exec -T shard1-2 sh -c");
    assert!(log[stepdown].contains("replSetStepDown"), "{log:#?}");
    let stop = position(&log, " stop shard1-2");
    let start = position(&log, " start shard1-2");
    assert!(
        chaos < stepdown && stepdown < stop && stop < start,
        "{log:#?}"
    );
    // Afterwards every member is started again, and the loop is over before the bench.
    let restart = position(&log, " start shard1-1 shard1-2 shard1-3");
    assert!(restart < bench);
    assert!(
        !log[bench..].iter().any(|line| line.contains("exec -T")),
        "the failover loop outlived the chaos run: {log:#?}"
    );
    // Torn down last.
    assert!(
        log.last().unwrap().ends_with(" down -v --remove-orphans"),
        "{log:#?}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[test]
fn keep_on_a_real_run_tears_nothing_down() {
    let fakes = Fakes::new("keep");
    let (output, log) = fakes.run(
        &["--keep", "--only", "bench", "--mongodb-version", "6.0"],
        &[],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let up = position(&log, " up -d --wait rs0-1 rs0-2 rs0-3 rs0-init");
    assert!(log[up].contains("MONGODB_VERSION=6.0"));
    assert!(
        !log[up..].iter().any(|line| line.contains(" down ")),
        "{log:#?}"
    );
    position(&log, "cargo bench --bench perf_table");
    assert!(
        !log.iter()
            .any(|line| line.contains("chaos_history") || line.contains("--workspace"))
    );
    assert!(text(&output.stdout).contains("bench: passed"));
}

#[test]
fn a_cluster_that_does_not_come_up_fails_the_run_and_is_torn_down() {
    let fakes = Fakes::new("up-fails");
    let (output, log) = fakes.run(&[], &[("FAKE_UP_EXIT", "1")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        !log.iter().any(|line| line.starts_with("cargo")),
        "a part ran without a cluster: {log:#?}"
    );
    let up = position(&log, " up -d --wait ");
    position(&log, " logs ");
    assert!(log.last().unwrap().ends_with(" down -v --remove-orphans") && log.len() > up + 1);
    assert!(text(&output.stdout).contains("did not come up"));
}

#[test]
fn an_engine_that_does_not_answer_exits_3_before_anything_runs() {
    let fakes = Fakes::new("no-engine");
    let (output, log) = fakes.run(&[], &[("FAKE_INFO_EXIT", "1")]);
    assert_eq!(output.status.code(), Some(3));
    assert!(
        text(&output.stderr).contains("Docker engine"),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(log, ["docker MONGODB_VERSION= info"]);
}

// ---------------------------------------------------------------------------------------------
// The compose file.

#[test]
fn the_compose_file_has_what_the_script_and_the_readme_use() {
    let compose = yaml("docker-compose.yml");
    let services = compose.children("services");
    let expected: BTreeSet<String> = RS0_SERVICES
        .iter()
        .chain(CLUSTER_SERVICES)
        .map(|service| (*service).to_owned())
        .collect();
    assert_eq!(services, expected);

    // Every image is the `mongo` image of MONGODB_VERSION, by default the script's.
    let default = dry_run(&["--only", "suite"]);
    assert!(default.contains("MONGODB_VERSION=7.0 "));
    for service in &services {
        assert_eq!(
            compose
                .text(&format!("services.{service}.image"))
                .as_deref(),
            Some("mongo:${MONGODB_VERSION:-7.0}"),
            "{service}"
        );
    }

    let command = |service: &str| {
        compose
            .list(&format!("services.{service}.command"))
            .join(" ")
    };
    let ports = |service: &str| compose.list(&format!("services.{service}.ports"));
    // rs0 on 27017-27019, mongos on 27030 and 27031, on 127.0.0.1; nothing else published.
    for (service, port) in [
        ("rs0-1", 27017),
        ("rs0-2", 27018),
        ("rs0-3", 27019),
        ("mongos-1", 27030),
        ("mongos-2", 27031),
    ] {
        assert_eq!(
            ports(service),
            [format!("127.0.0.1:{port}:27017")],
            "{service}"
        );
    }
    for service in &services {
        let published = !ports(service).is_empty();
        assert_eq!(
            published,
            service.starts_with("rs0-") && service != "rs0-init" || service.starts_with("mongos-"),
            "{service} publishes {:?}",
            ports(service)
        );
    }
    // The replica sets.
    for service in ["rs0-1", "rs0-2", "rs0-3"] {
        assert!(
            command(service).starts_with("mongod --replSet rs0 "),
            "{service}"
        );
    }
    assert!(command("cfg-1").starts_with("mongod --configsvr --replSet cfg "));
    for service in ["shard1-1", "shard1-2", "shard1-3"] {
        assert!(
            command(service).starts_with("mongod --shardsvr --replSet shard1 "),
            "{service}"
        );
    }
    assert!(command("shard2-1").starts_with("mongod --shardsvr --replSet shard2 "));
    for service in ["mongos-1", "mongos-2"] {
        assert!(
            command(service).starts_with("mongos --configdb cfg/cfg-1:27017 "),
            "{service}"
        );
    }
    for service in services
        .iter()
        .filter(|service| !service.ends_with("-init"))
    {
        assert!(command(service).contains("--port 27017"), "{service}");
    }

    // The init services: one script, initiating rs0 (rs0-1 first in priority, so that 27017 is
    // the primary the script's URI reaches), the cluster's sets and shards.
    let rs0_init = compose.list("services.rs0-init.command");
    let cluster_init = compose.list("services.cluster-init.command");
    assert_eq!(rs0_init[..2], ["bash", "-c"]);
    assert_eq!(rs0_init.last().map(String::as_str), Some("rs0"));
    assert_eq!(cluster_init.last().map(String::as_str), Some("cluster"));
    assert_eq!(rs0_init[2], cluster_init[2]);
    let script = &rs0_init[2];
    for needle in [
        r#"_id: "rs0""#,
        r#"{ _id: 0, host: "rs0-1:27017", priority: 2 }"#,
        r#"host: "rs0-2:27017""#,
        r#"host: "rs0-3:27017""#,
        r#"_id: "cfg", configsvr: true"#,
        r#"_id: "shard1""#,
        r#"host: "shard1-3:27017""#,
        r#"_id: "shard2""#,
        r#"addShard("shard1", "shard1-1:27017,shard1-2:27017,shard1-3:27017")"#,
        r#"addShard("shard2", "shard2-1:27017")"#,
        "waitForShards(2)",
        "touch /tmp/initialized",
    ] {
        assert!(script.contains(needle), "the init script lacks {needle}");
    }
    // The tests' database (where the chaos run's collections live) is on the shard that fails over.
    let tests_database = test_support::DATABASE;
    assert!(script.contains(&format!(r#"primaryShard("{tests_database}", "shard1")"#)));
    // mongosh where the image has it, else the legacy shell.
    assert!(script.contains(
        "if command -v mongosh >/dev/null 2>&1; then shell=mongosh; else shell=mongo; fi"
    ));
    // Compose interpolates `$`: the script's own must be written `$$`.
    let lone_dollar = script.replace("$$", "").contains('$');
    assert!(
        !lone_dollar,
        "a `$` compose would interpolate in the init script"
    );
    for service in ["rs0-init", "cluster-init"] {
        assert_eq!(
            compose.list(&format!("services.{service}.healthcheck.test")),
            ["CMD", "test", "-f", "/tmp/initialized"]
        );
    }
    for service in ["rs0-1", "rs0-2", "rs0-3"] {
        assert!(compose.has(&format!("services.rs0-init.depends_on.{service}")));
    }
    for service in CLUSTER_SERVICES
        .iter()
        .filter(|service| **service != "cluster-init")
    {
        assert!(
            compose.has(&format!("services.cluster-init.depends_on.{service}")),
            "{service}"
        );
    }

    // The README's and DESIGN's commands use these URIs and this file.
    for document in ["README.md", "DESIGN.md"] {
        let text = read(document);
        assert!(text.contains(RS0_URI), "{document} lacks {RS0_URI}");
        assert!(text.contains("docker compose up -d --wait"), "{document}");
    }
    assert!(read("README.md").contains("scripts/real-cluster"));
}

// ---------------------------------------------------------------------------------------------
// The workflow.

#[test]
fn the_workflow_runs_the_script_for_every_release_the_readme_claims() {
    let workflow = yaml(".github/workflows/real-cluster.yml");
    for event in ["push", "pull_request", "workflow_dispatch"] {
        assert!(workflow.has(&format!("on.{event}")), "not run on {event}");
    }
    let jobs = workflow.children("jobs");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job = format!("jobs.{}", jobs.first().unwrap());

    // The matrix: exactly the releases from the README's minimum on, written as strings (an
    // unquoted 8.0 would be the number 8).
    let releases = releases_from(&claimed_minimum());
    assert_eq!(
        workflow.list(&format!("{job}.strategy.matrix.mongodb")),
        releases
    );
    for index in 0..releases.len() {
        let raw = workflow
            .raw(&format!("{job}.strategy.matrix.mongodb.{index}"))
            .unwrap();
        assert!(raw.starts_with('"'), "unquoted version {raw}");
    }
    assert!(releases.contains(&"7.0".to_owned()), "the script's default");
    assert_eq!(
        workflow.raw(&format!("{job}.strategy.fail-fast")),
        Some("false")
    );
    assert_eq!(
        workflow.text(&format!("{job}.runs-on")).as_deref(),
        Some("ubuntu-latest")
    );
    let timeout: u32 = workflow
        .raw(&format!("{job}.timeout-minutes"))
        .expect("a timeout")
        .parse()
        .expect("a timeout in minutes");
    assert!((1..=360).contains(&timeout), "{timeout}");

    let steps = workflow.children(&format!("{job}.steps")).len();
    let step = |index: usize, key: &str| workflow.text(&format!("{job}.steps.{index}.{key}"));
    let uses: Vec<String> = (0..steps).filter_map(|index| step(index, "uses")).collect();
    assert!(
        uses.iter()
            .any(|action| action.starts_with("actions/checkout@"))
    );
    assert!(
        uses.iter()
            .any(|action| action.starts_with("dtolnay/rust-toolchain@"))
    );
    let python = (0..steps)
        .find(|index| {
            step(*index, "uses").is_some_and(|action| action.starts_with("actions/setup-python@"))
        })
        .expect("a Python set up");
    assert_eq!(step(python, "with.python-version").as_deref(), Some("3.13"));
    let runs: Vec<String> = (0..steps).filter_map(|index| step(index, "run")).collect();
    assert_eq!(
        runs,
        ["scripts/real-cluster --mongodb-version ${{ matrix.mongodb }}"],
        "the job runs the script, with the matrix's version"
    );
}

#[test]
fn the_matrix_check_follows_the_readme_claim() {
    // The claim is read from the README's wording, and another minimum gives another list, so
    // the workflow test fails when the README's minimum changes without the matrix.
    let readme = read("README.md");
    let minimum = claimed_minimum();
    assert_eq!(
        claimed_minimum_in("Needs MongoDB 5.0 or later; before MongoDB 7.0, ..."),
        Some("5.0".to_owned())
    );
    assert_eq!(claimed_minimum_in("MongoDB 7.0, MongoDB 8.0"), None);
    let next = MONGODB_RELEASES
        .iter()
        .position(|release| *release == minimum)
        .and_then(|index| MONGODB_RELEASES.get(index + 1))
        .expect("a release after the claimed minimum");
    let raised = readme.replacen(
        &format!("MongoDB {minimum} or later"),
        &format!("MongoDB {next} or later"),
        1,
    );
    assert_ne!(
        raised, readme,
        "the claim is not worded \"MongoDB {minimum} or later\""
    );
    let raised_releases = releases_from(&claimed_minimum_in(&raised).unwrap());
    assert_eq!(raised_releases.first().map(String::as_str), Some(*next));
    let workflow = yaml(".github/workflows/real-cluster.yml");
    let job = format!("jobs.{}", workflow.children("jobs").first().unwrap());
    let matrix = workflow.list(&format!("{job}.strategy.matrix.mongodb"));
    assert_eq!(matrix, releases_from(&minimum));
    assert_ne!(matrix, raised_releases);
}
