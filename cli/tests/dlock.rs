//! `dlock` end to end: the binary against the embedded server (or `MONGODB_URI`), with locks of
//! every kind held by the library, and bad input that must change nothing.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use distributed_lock_mongodb::{LockDetails, LockOptions, LockStatus, Provider};
use mongodb::bson::{DateTime, doc};
use mongodb::{Client, Database};
use serde_json::Value;
use test_support::server;
use tokio::io::AsyncWriteExt;

/// What a run of `dlock` printed, and its exit code.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `dlock args` with `stdin` as its standard input (and no `MONGODB_URI` in its
/// environment: tests pass `--uri`).
async fn dlock(args: &[&str], stdin: &str) -> Run {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env_remove("MONGODB_URI")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock starts");
    let mut input = child.stdin.take().expect("piped stdin");
    input.write_all(stdin.as_bytes()).await.expect("stdin");
    drop(input);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("dlock ends (a hang is a failure)")
        .expect("dlock's output");
    Run {
        code: output.status.code().expect("an exit code, not a signal"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8"),
    }
}

/// `dlock --uri … --database <database> args`.
async fn dlock_on(database: &Database, args: &[&str], stdin: &str) -> Run {
    let uri = server::uri();
    let mut all = vec!["--uri", uri.as_str(), "--database", database.name()];
    all.extend(args);
    dlock(&all, stdin).await
}

/// A database of the test's own, emptied first (a real server keeps the last run's).
async fn fresh_database(name: &str) -> Database {
    let database = Client::with_uri_str(server::uri())
        .await
        .expect("valid URI")
        .database(&format!("dlock_{name}"));
    database.drop().await.expect("drop the test database");
    database
}

fn provider(database: &Database) -> Provider {
    // Long enough that a loaded machine never loses a lease while the tool runs; the released
    // reader hears it at its next renewal (cadence 5 s).
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(15))
        .build()
        .expect("valid options");
    Provider::new(database)
        .with_options(options)
        .with_details(LockDetails::new().with_owner("billing"))
        // Exclusive locks keep DistributedLock.MongoDB's layout (no details) unless told.
        .with_details_in_exclusive_locks(true)
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|error| panic!("{error}: {run}"))
}

fn lock_ids(holders: &[LockStatus]) -> BTreeSet<String> {
    holders.iter().filter_map(|h| h.lock_id.clone()).collect()
}

fn json_lock_ids(rows: &Value) -> BTreeSet<String> {
    rows.as_array()
        .expect("an array of holders")
        .iter()
        .map(|row| row["lock_id"].as_str().expect("a lock id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_every_kind_with_holders_tokens_time_left_and_details() {
    let database = fresh_database("list").await;
    let provider = provider(&database);
    let exclusive = provider
        .create_lock("nightly-report")
        .acquire()
        .await
        .unwrap();
    let orders = provider.create_reader_writer_lock("orders");
    let _readers = (
        orders.acquire_read().await.unwrap(),
        orders.acquire_read().await.unwrap(),
    );
    let uploads = provider.create_semaphore("uploads", 3);
    let _places = (
        uploads.acquire().await.unwrap(),
        uploads.acquire().await.unwrap(),
    );
    let held = provider.held_locks().await.unwrap();
    assert_eq!(held.len(), 5);

    let table = dlock_on(&database, &["list"], "").await;
    assert_eq!(table.code, 0, "{table}");
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    assert!(
        lines[0].contains("TOKEN") && lines[0].contains("LEFT"),
        "{table}"
    );
    assert_eq!(lines.len(), 1 + 5, "{table}");
    let row = |name: &str, kind: &str| {
        lines
            .iter()
            .filter(|line| line.starts_with(name) && line.contains(kind))
            .count()
    };
    assert_eq!(row("nightly-report", "exclusive"), 1, "{table}");
    assert_eq!(row("orders", "read"), 2, "{table}");
    assert_eq!(row("uploads", "semaphore"), 2, "{table}");
    let report = lines
        .iter()
        .find(|line| line.starts_with("nightly-report"))
        .unwrap();
    let token = exclusive.fencing_token().to_string();
    assert!(
        report.split_whitespace().any(|cell| cell == token),
        "{report}"
    );
    assert!(report.contains("billing"), "{report}");

    let listed = dlock_on(&database, &["--json", "list"], "").await;
    assert_eq!(listed.code, 0, "{listed}");
    let rows = json(&listed);
    assert_eq!(json_lock_ids(&rows), lock_ids(&held));
    for row in rows.as_array().unwrap() {
        assert_eq!(row["held"], true, "{row}");
        assert_eq!(row["owner"], "billing", "{row}");
        let left = row["remaining_ms"].as_u64().expect("time left");
        assert!(left > 0 && left <= 15_000, "{row}");
    }
    let nightly = &rows.as_array().unwrap()[0];
    assert_eq!(nightly["name"], "nightly-report", "{rows}");
    assert_eq!(nightly["fencing_token"], exclusive.fencing_token().get());

    let readers = dlock_on(&database, &["--json", "list", "--kind", "read"], "").await;
    assert_eq!(readers.code, 0, "{readers}");
    assert_eq!(json(&readers).as_array().unwrap().len(), 2, "{readers}");
    let by_owner = dlock_on(&database, &["--json", "list", "--owner", "nobody"], "").await;
    assert_eq!(json(&by_owner), Value::Array(Vec::new()), "{by_owner}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_names_the_holder_and_a_free_lock_its_last_holder() {
    let database = fresh_database("show").await;
    let provider = provider(&database);
    let guard = provider.create_lock("deploy").acquire().await.unwrap();
    let token = guard.fencing_token().get();
    let held = provider.held_locks().await.unwrap();

    let shown = dlock_on(&database, &["show", "deploy"], "").await;
    assert_eq!(shown.code, 0, "{shown}");
    let lock_id = held[0].lock_id.as_deref().unwrap();
    assert!(shown.stdout.contains(lock_id), "{shown}");

    guard.release().await.unwrap();
    let free = dlock_on(&database, &["--json", "show", "deploy"], "").await;
    assert_eq!(free.code, 0, "{free}");
    let rows = json(&free);
    assert_eq!(rows[0]["held"], false, "{free}");
    assert_eq!(rows[0]["fencing_token"], token, "{free}");
    let table = dlock_on(&database, &["show", "deploy"], "").await;
    assert!(table.stdout.contains("free"), "{table}");

    // A reader-writer lock nobody holds now exists, and is free.
    let lock = provider.create_reader_writer_lock("orders");
    lock.acquire_write().await.unwrap().release().await.unwrap();
    let free_rw = dlock_on(&database, &["show", "orders"], "").await;
    assert_eq!(free_rw.code, 0, "{free_rw}");
    assert_eq!(
        free_rw.stdout.trim(),
        "lock \"orders\" is free",
        "{free_rw}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_asks_first_and_frees_only_the_holders_named() {
    let database = fresh_database("release").await;
    let provider = provider(&database);
    let orders = provider.create_reader_writer_lock("orders");
    let first = orders.acquire_read().await.unwrap();
    let second = orders.acquire_read().await.unwrap();
    let readers = provider.held_locks().await.unwrap();
    let target = readers[0].lock_id.clone().unwrap();

    // Declined: nothing changes.
    let args = ["release", "orders", "--holder", target.as_str()];
    let declined = dlock_on(&database, &args, "n\n").await;
    assert_eq!(declined.code, 4, "{declined}");
    assert!(declined.stderr.contains("[y/N]"), "{declined}");
    assert_eq!(
        lock_ids(&provider.held_locks().await.unwrap()),
        lock_ids(&readers)
    );
    let no_answer = dlock_on(&database, &args, "").await;
    assert_eq!(no_answer.code, 4, "{no_answer}");
    assert_eq!(provider.held_locks().await.unwrap().len(), 2);

    // Confirmed: that reader only; its holder finds out at its next renewal.
    let confirmed = dlock_on(&database, &args, "y\n").await;
    assert_eq!(confirmed.code, 0, "{confirmed}");
    assert!(
        confirmed.stdout.contains("released 1 holder of \"orders\""),
        "{confirmed}"
    );
    let left = provider.held_locks().await.unwrap();
    assert_eq!(left.len(), 1);
    assert_ne!(left[0].lock_id.as_deref(), Some(target.as_str()));
    // The released reader's guard hears it at its next renewal (cadence 5 s); the other not.
    tokio::time::timeout(Duration::from_secs(30), async {
        while !first.is_lost() && !second.is_lost() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the released reader hears it was lost at its next renewal");
    let released = [first.is_lost(), second.is_lost()];
    assert_eq!(released.iter().filter(|lost| **lost).count(), 1);

    // A lock id that is not a holder's: not found, nothing released.
    let bogus = dlock_on(
        &database,
        &["release", "orders", "--holder", "bogus", "--yes"],
        "",
    )
    .await;
    assert_eq!(bogus.code, 1, "{bogus}");
    assert!(bogus.stderr.contains("\"bogus\""), "{bogus}");
    assert_eq!(provider.held_locks().await.unwrap().len(), 1);

    // Every holder; the lock is free for others at once. The question and the holders it
    // shows go to stderr: stdout is the JSON outcome alone.
    let exclusive = provider.create_lock("deploy");
    let _guard = exclusive.acquire().await.unwrap();
    let all = dlock_on(&database, &["--json", "release", "deploy"], "y\n").await;
    assert_eq!(all.code, 0, "{all}");
    assert!(
        all.stderr.contains("deploy") && all.stderr.contains("[y/N]"),
        "{all}"
    );
    assert_eq!(json(&all)["released"].as_array().unwrap().len(), 1, "{all}");
    let other = Provider::new(&database).create_lock("deploy");
    assert!(other.try_acquire().await.unwrap().is_some());
    let again = dlock_on(&database, &["release", "nobody-holds-this", "--yes"], "").await;
    assert_eq!(again.code, 1, "{again}");
    assert!(again.stderr.contains("not held"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_only_documents_whose_lease_ended_over_a_day_ago() {
    let database = fresh_database("purge").await;
    // No acquisition in the exclusive collection of this database: no TTL index there, so the
    // old document stays until the purge (on any server).
    let day_and_more = DateTime::from_millis(DateTime::now().timestamp_millis() - 26 * 3_600_000);
    let locks = database.collection::<mongodb::bson::Document>("distributed_locks");
    locks
        .insert_many([
            doc! { "_id": "old", "expiresAt": day_and_more, "fencingToken": 3_i64 },
            doc! { "_id": "recent", "expiresAt": DateTime::now(), "fencingToken": 4_i64 },
        ])
        .await
        .unwrap();
    let provider = provider(&database);
    let _place = provider
        .create_semaphore("uploads", 2)
        .acquire()
        .await
        .unwrap();

    let declined = dlock_on(&database, &["purge"], "no\n").await;
    assert_eq!(declined.code, 4, "{declined}");
    assert!(
        declined
            .stderr
            .contains("Delete 1 expired lock document of distributed_locks")
            && declined.stderr.contains("(old)?"),
        "the question shows the count and the names: {declined}"
    );
    assert_eq!(locks.count_documents(doc! {}).await.unwrap(), 2);

    let dry_run = dlock_on(&database, &["purge", "--dry-run"], "").await;
    assert_eq!(dry_run.code, 0, "{dry_run}");
    assert!(
        dry_run
            .stdout
            .contains("would delete 1 expired lock document (old)"),
        "{dry_run}"
    );
    let dry_json = dlock_on(&database, &["--json", "purge", "--dry-run"], "").await;
    assert_eq!(json(&dry_json)["would_delete"], 1, "{dry_json}");
    assert_eq!(json(&dry_json)["names"][0], "old", "{dry_json}");
    assert_eq!(locks.count_documents(doc! {}).await.unwrap(), 2);

    let purged = dlock_on(&database, &["purge"], "yes\n").await;
    assert_eq!(purged.code, 0, "{purged}");
    assert!(
        purged.stdout.contains("deleted 1 expired lock document"),
        "{purged}"
    );
    let ids: Vec<_> = locks.distinct("_id", doc! {}).await.unwrap();
    assert_eq!(ids, vec![mongodb::bson::Bson::String("recent".into())]);
    assert_eq!(provider.held_locks().await.unwrap().len(), 1);
    let again = dlock_on(&database, &["--json", "purge", "--yes"], "").await;
    assert_eq!(json(&again)["deleted"], 0, "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_named_exits_non_zero_and_changes_nothing() {
    let database = fresh_database("bad_input").await;
    let provider = provider(&database);
    let _guard = provider.create_lock("deploy").acquire().await.unwrap();
    let held = lock_ids(&provider.held_locks().await.unwrap());

    let no_uri = dlock(&["list", "--database", "x"], "").await;
    assert_eq!(no_uri.code, 2, "{no_uri}");
    assert!(
        no_uri.stderr.contains("--uri or set MONGODB_URI"),
        "{no_uri}"
    );

    let bad_uri = dlock(&["--uri", "not-a-uri", "list"], "").await;
    assert_eq!(bad_uri.code, 2, "{bad_uri}");
    assert!(
        bad_uri.stderr.contains("invalid connection string"),
        "{bad_uri}"
    );

    let never = dlock_on(&database, &["watch", "deploy", "--every", "0"], "").await;
    assert_eq!(never.code, 2, "{never}");
    assert!(
        never.stderr.contains("--every must be more than zero"),
        "{never}"
    );

    let started = Instant::now();
    let unreachable = dlock(
        &[
            "--uri",
            "mongodb://127.0.0.1:1/?directConnection=true",
            "--database",
            "x",
            "--timeout",
            "1",
            "list",
        ],
        "",
    )
    .await;
    assert_eq!(unreachable.code, 3, "{unreachable}");
    assert!(unreachable.stderr.contains("127.0.0.1:1"), "{unreachable}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    let no_database = dlock(&["--uri", "mongodb://127.0.0.1:1", "list"], "").await;
    assert_eq!(no_database.code, 2, "{no_database}");
    assert!(no_database.stderr.contains("--database"), "{no_database}");

    for invalid in ["a$b", "system.locks", ""] {
        let run = dlock_on(&database, &["--collection", invalid, "list"], "").await;
        assert_eq!(run.code, 2, "an invalid name is bad input: {run}");
        assert!(run.stderr.contains("invalid collection name"), "{run}");
    }

    let unknown_collection = dlock_on(
        &database,
        &[
            "--collection",
            "no_such_locks",
            "release",
            "deploy",
            "--yes",
        ],
        "",
    )
    .await;
    assert_eq!(unknown_collection.code, 1, "{unknown_collection}");
    assert!(
        unknown_collection
            .stderr
            .contains("collection \"no_such_locks\" does not exist"),
        "{unknown_collection}"
    );

    let wrong_database = dlock_on(&fresh_database("empty").await, &["list"], "").await;
    assert_eq!(wrong_database.code, 1, "{wrong_database}");
    assert!(
        wrong_database
            .stderr
            .contains("none of the lock collections"),
        "{wrong_database}"
    );

    let unknown_lock = dlock_on(&database, &["show", "no-such-lock"], "").await;
    assert_eq!(unknown_lock.code, 1, "{unknown_lock}");
    assert!(
        unknown_lock
            .stderr
            .contains("no lock named \"no-such-lock\""),
        "{unknown_lock}"
    );
    assert!(unknown_lock.stdout.is_empty(), "{unknown_lock}");

    let bad_kind = dlock_on(&database, &["list", "--kind", "mutex"], "").await;
    assert_eq!(bad_kind.code, 2, "{bad_kind}");
    assert!(bad_kind.stderr.contains("mutex"), "{bad_kind}");

    let bad_age = dlock_on(&database, &["list", "--held-for-at-least", "6 hours"], "").await;
    assert_eq!(bad_age.code, 2, "{bad_age}");

    // The same collection for two kinds: the library refuses it, nothing is read or written.
    let shared = dlock_on(
        &database,
        &[
            "--reader-writer-collection",
            "distributed_locks",
            "release",
            "deploy",
            "--yes",
        ],
        "",
    )
    .await;
    assert_eq!(shared.code, 2, "{shared}");
    assert!(shared.stderr.contains("distributed_locks"), "{shared}");

    assert_eq!(lock_ids(&provider.held_locks().await.unwrap()), held);
}

#[tokio::test]
async fn help_describes_every_command_option_and_exit_code() {
    let help = dlock(&["--help"], "").await;
    assert_eq!(help.code, 0, "{help}");
    for needed in [
        "list",
        "show",
        "watch",
        "release",
        "purge",
        "--uri",
        "MONGODB_URI",
        "--database",
        "--json",
        "--collection",
        "--reader-writer-collection",
        "--semaphore-collection",
        "--timeout",
        "Exit codes",
        "0  done",
        "1  not found",
        "2  bad usage",
        "3  MongoDB failed",
        "4  not confirmed",
    ] {
        assert!(
            help.stdout.contains(needed),
            "{needed:?} missing from\n{help}"
        );
    }
    let watch = dlock(&["watch", "--help"], "").await;
    for needed in ["--every", "--kind", "Ctrl-C", "change stream"] {
        assert!(
            watch.stdout.contains(needed),
            "{needed:?} missing from\n{watch}"
        );
    }
    let release = dlock(&["release", "--help"], "").await;
    for needed in ["--holder", "--yes", "--kind", "Dangerous", "confirmation"] {
        assert!(
            release.stdout.contains(needed),
            "{needed:?} missing from\n{release}"
        );
    }
    let list = dlock(&["list", "--help"], "").await;
    for needed in [
        "--kind",
        "--owner",
        "--held-for-at-least",
        "exclusive",
        "semaphore",
    ] {
        assert!(
            list.stdout.contains(needed),
            "{needed:?} missing from\n{list}"
        );
    }
}

/// `dlock --collection sessions purge --yes` on an application's collection (documents with an
/// `expiresAt`, but not lock documents) is refused with exit code 5 and deletes nothing; a lock
/// collection that also holds a document that is not a lock keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_never_deletes_documents_that_are_not_locks() {
    let database = fresh_database("purge_app").await;
    let two_days_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 48 * 3_600_000);
    let sessions = database.collection::<mongodb::bson::Document>("sessions");
    sessions
        .insert_many([
            doc! { "_id": "s1", "user": "ann", "expiresAt": two_days_ago },
            doc! { "_id": "s2", "user": "bob", "expiresAt": two_days_ago },
            doc! { "_id": "s3", "user": "cy" },
        ])
        .await
        .unwrap();
    for args in [
        &["--collection", "sessions", "purge", "--yes"][..],
        &["--collection", "sessions", "purge", "--dry-run"],
        &["--collection", "sessions", "purge"],
    ] {
        let refused = dlock_on(&database, args, "yes\n").await;
        assert_eq!(refused.code, 5, "{args:?}: {refused}");
        assert!(
            refused
                .stderr
                .contains("\"sessions\" does not look like a lock collection"),
            "{refused}"
        );
        assert!(refused.stderr.contains("\"s1\""), "an example: {refused}");
        assert_eq!(sessions.count_documents(doc! {}).await.unwrap(), 3);
    }

    // A lock collection with one document that is not a lock: the lock is purged, the other
    // document stays, whatever its `expiresAt`.
    let locks = database.collection::<mongodb::bson::Document>("distributed_locks");
    locks
        .insert_many([
            doc! { "_id": "old-lock", "expiresAt": two_days_ago, "fencingToken": 3_i64 },
            doc! { "_id": "live-lock", "lockId": "x", "expiresAt": DateTime::now(), "fencingToken": 4_i64 },
            doc! { "_id": "note", "text": "not a lock", "expiresAt": two_days_ago },
            doc! { "_id": 42, "expiresAt": two_days_ago, "fencingToken": 1_i64 },
        ])
        .await
        .unwrap();
    let purged = dlock_on(&database, &["--json", "purge", "--yes"], "").await;
    assert_eq!(json(&purged)["deleted"], 1, "{purged}");
    let mut left: Vec<String> = locks
        .distinct("_id", doc! {})
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    left.sort();
    assert_eq!(left, ["\"live-lock\"", "\"note\"", "42"]);
}

/// A job's lock kept taken by its `min_hold` window after the run (no holder, `expiresAt`
/// ahead) shows as kept, not free, in `show` and `list`; `release` says so and changes nothing.
/// A forced release of a running job says that its window stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_kept_by_a_min_hold_window_shows_as_kept() {
    let database = fresh_database("kept").await;
    let provider = provider(&database);
    let job = provider.create_job("hourly", Duration::from_secs(3_600));
    assert!(job.run(async |_| ()).await.unwrap().ran());

    let shown = dlock_on(&database, &["show", "hourly"], "").await;
    assert_eq!(shown.code, 0, "{shown}");
    assert!(shown.stdout.contains("kept 59 min"), "{shown}");
    let listed = dlock_on(&database, &["--json", "list"], "").await;
    let rows = json(&listed);
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(rows[0]["name"], "hourly", "{listed}");
    assert_eq!(rows[0]["held"], false, "{listed}");
    assert!(rows[0]["kept_ms"].as_u64().unwrap() > 3_000_000, "{listed}");
    let released = dlock_on(&database, &["release", "hourly", "--yes"], "").await;
    assert_eq!(released.code, 1, "{released}");
    assert!(
        released
            .stderr
            .contains("min_hold window keeps it taken until"),
        "{released}"
    );
    assert!(!job.run(async |_| ()).await.unwrap().ran(), "still kept");

    // A running job: the question says the window stays.
    let running = provider.create_job("nightly", Duration::from_secs(3_600));
    let (started, is_running) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(async move {
        running
            .run(async |guard| {
                let _ = started.send(());
                guard.lost().wait().await;
            })
            .await
    });
    is_running.await.unwrap();
    let asked = dlock_on(&database, &["release", "nightly"], "no\n").await;
    assert_eq!(asked.code, 4, "{asked}");
    assert!(
        asked
            .stderr
            .contains("The running holder loses its lease, but its min_hold window stays"),
        "{asked}"
    );
    let forced = dlock_on(&database, &["release", "nightly", "--yes"], "").await;
    assert_eq!(forced.code, 0, "{forced}");
    assert!(
        forced
            .stdout
            .contains("its min_hold window keeps it taken until"),
        "{forced}"
    );
    let lost = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the holder hears it lost its lease")
        .unwrap();
    assert!(lost.is_err(), "{lost:?}");
    let listed = dlock_on(&database, &["list"], "").await;
    assert!(listed.stdout.contains("nightly"), "{listed}");
}

/// `dlock watch [NAME]`, started with `--json`: its output, a line at a time.
struct Watching {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Watching {
    async fn start(database: &Database, name: &str) -> Watching {
        Watching::start_with(database, &[name]).await
    }

    /// `dlock watch ARGS --every 1`.
    async fn start_with(database: &Database, args: &[&str]) -> Watching {
        let uri = server::uri();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args([
                "--uri",
                uri.as_str(),
                "--database",
                database.name(),
                "--json",
            ])
            .arg("watch")
            .args(args)
            .args(["--every", "1"])
            .env_remove("MONGODB_URI")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("dlock starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
        Watching { child, lines }
    }

    /// The holders' lock ids on the next line (within 20 s: a change stream tells at once, the
    /// polling within the 1 s `--every`).
    async fn next(&mut self) -> BTreeSet<String> {
        json_lock_ids(&self.next_line().await["holders"])
    }

    /// The next line, read as JSON (within 20 s).
    async fn next_line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("a line in time")
            .expect("readable output")
            .expect("a line, not the end of the output");
        let printed: Value =
            serde_json::from_str(&line).unwrap_or_else(|error| panic!("{error}: {line}"));
        assert!(printed["at"].is_string(), "{line}");
        printed
    }

    /// The lines until one shows what `wanted` wants (each within 20 s), and that one.
    async fn until(&mut self, wanted: impl Fn(&Value) -> bool) -> Value {
        loop {
            let line = self.next_line().await;
            if wanted(&line) {
                return line;
            }
        }
    }
}

/// The exit code of `dlock watch`, once it ended (within 10 s).
async fn exit_code(child: &mut tokio::process::Child) -> i32 {
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("dlock watch ends")
        .expect("its status");
    status.code().expect("an exit code, not a signal")
}

/// `dlock watch job` on a fresh database of its own (`name`), with a provider of its locks; its
/// first line, checked: the lock is free.
async fn watching_a_free_lock(name: &str) -> (Provider, Watching) {
    let database = fresh_database(name).await;
    database
        .create_collection("distributed_locks")
        .await
        .unwrap();
    let mut watching = Watching::start(&database, "job").await;
    assert_eq!(watching.next().await, BTreeSet::new(), "free at first");
    (provider(&database), watching)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_the_holders_at_each_change_and_stops_cleanly_at_ctrl_c() {
    let (provider, mut watching) = watching_a_free_lock("watch").await;

    let guard = provider.create_lock("job").acquire().await.unwrap();
    assert_eq!(
        watching.next().await,
        BTreeSet::from([guard.lock_id().to_owned()])
    );
    let reader = provider
        .create_reader_writer_lock("job")
        .acquire_read()
        .await
        .unwrap();
    assert_eq!(
        watching.next().await,
        BTreeSet::from([guard.lock_id().to_owned(), reader.lock_id().to_owned()]),
        "every kind of the name"
    );
    guard.release().await.unwrap();
    reader.release().await.unwrap();
    let mut now = watching.next().await;
    if !now.is_empty() {
        // The two releases may come as two changes.
        now = watching.next().await;
    }
    assert_eq!(now, BTreeSet::new(), "free again");

    let pid = watching.child.id().expect("running").to_string();
    let interrupted = tokio::process::Command::new("kill")
        .args(["-INT", pid.as_str()])
        .status()
        .await
        .expect("kill runs");
    assert!(interrupted.success());
    assert_eq!(
        exit_code(&mut watching.child).await,
        0,
        "Ctrl-C ends the watch cleanly"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_without_a_name_follows_every_lock_and_shows_the_waiters_others_can_see() {
    let database = fresh_database("watch-all").await;
    for collection in [
        "distributed_locks",
        "distributed_rw_locks",
        "distributed_semaphores",
    ] {
        database.create_collection(collection).await.unwrap();
    }
    let provider = provider(&database);
    let mut watching = Watching::start_with(&database, &[]).await;
    let first = watching.next_line().await;
    assert!(first["name"].is_null(), "every lock: {first}");
    assert_eq!(json_lock_ids(&first["holders"]), BTreeSet::new());

    let job = provider.create_lock("job").acquire().await.unwrap();
    let pool = provider.create_semaphore("pool", 2);
    let place = pool.acquire().await.unwrap();
    let both = BTreeSet::from([job.lock_id().to_owned(), place.lock_id().to_owned()]);
    watching
        .until(|line| json_lock_ids(&line["holders"]) == both)
        .await;

    // Another process's waiter for both places marks them: the watch shows it.
    let other = Provider::new(&database).create_semaphore("pool", 2);
    let waiter =
        tokio::spawn(async move { other.acquire_many_timeout(2, Duration::from_secs(60)).await });
    let marked = watching
        .until(|line| !line["waiters"].as_array().expect("waiters").is_empty())
        .await;
    let waiters = marked["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{marked}");
    assert_eq!(waiters[0]["name"], "pool");
    assert_eq!(waiters[0]["kind"], "semaphore");
    assert_eq!(waiters[0]["places"], 2);
    place.release().await.unwrap();
    let served = waiter.await.unwrap().unwrap();
    let served_line = watching
        .until(|line| json_lock_ids(&line["holders"]).contains(served.lock_id()))
        .await;
    assert!(
        served_line["waiters"].as_array().unwrap().is_empty(),
        "its win removed the mark: {served_line}"
    );
    served.release().await.unwrap();
    job.release().await.unwrap();
    watching
        .until(|line| json_lock_ids(&line["holders"]).is_empty())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_exits_cleanly_when_its_reader_goes_away() {
    let (provider, watching) = watching_a_free_lock("watch-closed").await;
    // `dlock watch job | head -1`: the reader leaves; the next print finds the pipe closed.
    let Watching { mut child, lines } = watching;
    drop(lines);
    let guard = provider.create_lock("job").acquire().await.unwrap();
    assert_eq!(
        exit_code(&mut child).await,
        0,
        "a closed output ends the watch cleanly"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_asks_the_holder_to_let_go_and_a_semaphore_place_by_its_lock_id() {
    let database = fresh_database("revoke").await;
    let provider = provider(&database);
    let guard = provider.create_lock("nightly").acquire().await.unwrap();
    let asked = dlock_on(
        &database,
        &["--json", "revoke", "nightly", "--grace", "60"],
        "",
    )
    .await;
    assert_eq!(asked.code, 0, "{asked}");
    let rows = json(&asked);
    assert_eq!(rows[0]["lock_id"].as_str(), Some(guard.lock_id()));
    assert_eq!(rows[0]["revocation"]["by_operator"], true, "{asked}");
    let revocation = tokio::time::timeout(Duration::from_secs(30), guard.revocation_requested())
        .await
        .expect("the holder is told")
        .unwrap();
    assert!(revocation.by_operator);
    guard.release().await.unwrap();
    let nobody = dlock_on(&database, &["revoke", "nightly"], "").await;
    assert_eq!(nobody.code, 1, "{nobody}");

    // One place of a semaphore, named by its lock id; the other is not asked.
    let pool = provider.create_semaphore("pool", 2);
    let first = pool.acquire().await.unwrap();
    let second = pool.acquire().await.unwrap();
    let target = first.lock_id().to_owned();
    let asked = dlock_on(&database, &["revoke", "pool", "--holder", &target], "").await;
    assert_eq!(asked.code, 0, "{asked}");
    assert!(first.revocation_requested().await.unwrap().by_operator);
    let holders = provider.held_locks().await.unwrap();
    let untouched = holders
        .iter()
        .find(|h| h.lock_id.as_deref() == Some(second.lock_id()));
    assert!(
        untouched.is_some_and(|h| h.revocation.is_none()),
        "{holders:?}"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
}
