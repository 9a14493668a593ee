//! The randomized history test across providers and processes: three worker processes
//! (`lock_worker random`, `tests/fixtures/random_history.rs`), each with three providers built
//! apart (two on the test's server, one on a second deployment whose database, collection and
//! names are the same: its locks are `B:a` and `B:b` here) and lock objects built apart from any
//! provider, draw from a seeded generator what to do with four names (`a`; `b`, half of whose
//! objects have a `min_hold`; the job `job`; `handover`, a 30 s lease): acquire (try, timeout,
//! cancel), hold, write fenced, release or drop; exit while another family of the process waits
//! for `handover` (drop the guard, which hands the lock over, and shut the provider down soon
//! after); run the job; watch; read; force a release; purge; shut a provider down and build it
//! again. Each talks through a fault proxy of its own, two through router R0 and one through R1,
//! whose clock is 300 ms ahead; a seeded nemesis adds wire faults (lost replies, half-open
//! connections, writes applied without a reply, delays, error replies, a transfer of `handover`
//! answered after its settle deadline) and steps the server's clock (launcher shim 7).
//!
//! The history is then checked, name by name:
//! - no two holders in real time, and each holder told it lost its lease before the next one
//!   acquired: a holder's last "not lost" instant precedes the next holder's first (a pair
//!   between which a forced release may have ended the first lease is exempt: its holder learns
//!   at its next renewal, by design; fencing still orders their writes);
//! - fencing tokens unique and increasing in acquisition order;
//! - no acquisition inside a `min_hold` window, the job's window included (at most one run per
//!   window), by the server's `acquiredAt` as holders, watches and reads saw it;
//! - every status, watch and holder read shows the details of the holder its token names;
//! - the fenced writes the resource accepted carry increasing tokens of recorded acquisitions;
//! - once every process has exited, each name is free within its expiry;
//! - the application documents in the lock collection (one with an old `expiresAt`, one shaped
//!   almost like a lock, which forced releases name) are untouched, and the purge removed the
//!   old lock document put beside them.
//!
//! It prints its seed: `HISTORY_SEED=<n>` replays every process's draws (not the timing, which
//! decides what each draw meets); `HISTORY_SECONDS` sets the run's length (45 s).

use test_support as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use common::proxy::{Action, Fault, FaultProxy, Rule, RuleId};
use mongodb::Client;
use mongodb::bson::{DateTime, Document, doc, oid::ObjectId};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::chaos_history::{
    MAX_CLOCK_STEP_MS, R1_AHEAD_MS, WIRE_FAULTS, accepted_tokens, field, instant, routers, seed,
    step_clock, wire_fault,
};

const PROCESSES: usize = 3;
/// The workers' lease (their options' `expiry`), but `handover`'s.
const EXPIRY: Duration = Duration::from_secs(3);
/// The lease of `handover` (the workers' `HANDOVER_EXPIRY`).
const HANDOVER_EXPIRY: Duration = Duration::from_secs(30);
/// The names of the history: the first deployment's four, the second's two.
const NAMES: [&str; 6] = ["a", "b", "job", "handover", "B:a", "B:b"];

/// The lease of the history's name `label`.
fn expiry_of(label: &str) -> Duration {
    if label == "handover" {
        HANDOVER_EXPIRY
    } else {
        EXPIRY
    }
}

const LATE_HANDOVER: &str = "findAndModify (transfer of handover): reply 6.5 s late";

/// A transfer of `handover` (a release filtered by the releaser's and the waiters' lock ids),
/// applied at once and answered 6.5 s later: after its settle deadline (5 s after its send, when
/// a shutdown of the releasing provider stops waiting for its outcome and undoes it), before the
/// release's next try (a quarter of the 30 s lease after the first). The waiter must then not be
/// handed the lease the shutdown is ending.
fn late_handover(collection: &str) -> Rule {
    Rule::new(
        "findAndModify",
        Action::DelayReply(Duration::from_millis(6_500)),
    )
    .on(collection)
    .where_field("query._id", "handover")
    .where_present("query.lockId.$in")
}
/// The most the clocks that evaluated two acquisitions' `$$NOW` can differ by: R1's lead plus
/// the clock steps. A `min_hold` window is compared exactly (`minHoldUntil` against the next
/// attempt's `$$NOW`), but between two recorded acquisitions may lie one nobody was given (a
/// cancelled caller's win, ended at once), which took the lock after the window by its own
/// router's clock.
const CLOCKS_APART_MS: i64 = R1_AHEAD_MS + MAX_CLOCK_STEP_MS;
/// The fewest holds a run must check: each of the planted mistakes this test catches
/// (`scripts/plant-mistakes`) showed in runs of this size; below it a loaded machine's run would
/// check too little to catch them.
const HOLDS_FLOOR: usize = 100;

fn run_for() -> Duration {
    Duration::from_secs(
        std::env::var("HISTORY_SECONDS")
            .ok()
            .and_then(|seconds| seconds.parse().ok())
            .unwrap_or(45),
    )
}

/// One acquisition as its process recorded it.
#[derive(Clone, Debug)]
struct Hold {
    name: String,
    task: u64,
    token: i64,
    owner: String,
    min_hold_ms: i64,
    called: i128,
    /// The first and last instants its lease was seen held (none: lost before it looked).
    held: Option<(i128, i128)>,
    write: Option<String>,
}

/// A lock as a status read, a watch or its holder saw it.
struct Seen {
    name: String,
    token: i64,
    owner: String,
    acquired_ms: Option<i64>,
    source: String,
}

/// A forced release: when it was sent, when it returned, and what it said.
struct Forced {
    name: String,
    sent: i128,
    returned: i128,
    result: String,
}

#[derive(Default)]
struct History {
    holds: Vec<Hold>,
    seen: Vec<Seen>,
    forced: Vec<Forced>,
    purged: Vec<String>,
    shutdowns: usize,
}

fn read_history(path: &std::path::Path, history: &mut History) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut open: HashMap<(String, u64, i64), Hold> = HashMap::new();
    for line in text.lines() {
        let kind = line.split_whitespace().next().unwrap_or_default();
        match kind {
            "acquired" | "held" | "ended" => {
                let key = (
                    field(line, "name").to_owned(),
                    field(line, "task").parse().expect("a task"),
                    field(line, "token").parse().expect("a token"),
                );
                let at = instant(field(line, "held"));
                if kind == "acquired" {
                    open.insert(
                        key.clone(),
                        Hold {
                            name: key.0,
                            task: key.1,
                            token: key.2,
                            owner: field(line, "owner").to_owned(),
                            min_hold_ms: field(line, "min_hold_ms").parse().expect("a window"),
                            called: instant(field(line, "called")).expect("a call"),
                            held: at.map(|at| (at, at)),
                            write: None,
                        },
                    );
                    continue;
                }
                let hold = open
                    .get_mut(&key)
                    .unwrap_or_else(|| panic!("no acquisition before {line}"));
                if let (Some((first, _)), Some(at)) = (hold.held, at) {
                    hold.held = Some((first, at));
                }
                if kind == "ended" {
                    let mut hold = open.remove(&key).expect("just read");
                    hold.write = Some(field(line, "write").to_owned());
                    history.holds.push(hold);
                }
            }
            "status" => history.seen.push(Seen {
                name: field(line, "name").to_owned(),
                token: field(line, "token").parse().expect("a token"),
                owner: field(line, "owner").to_owned(),
                acquired_ms: (field(line, "acquired_ms") != "-")
                    .then(|| field(line, "acquired_ms").parse().expect("milliseconds")),
                source: field(line, "source").to_owned(),
            }),
            "forced" => history.forced.push(Forced {
                name: field(line, "name").to_owned(),
                sent: instant(field(line, "sent")).expect("an instant"),
                returned: instant(field(line, "returned")).expect("an instant"),
                result: field(line, "result").to_owned(),
            }),
            "purge" => history.purged.push(field(line, "result").to_owned()),
            "shutdown" => history.shutdowns += 1,
            _ => panic!("an unknown history line: {line}"),
        }
    }
    // Every process ends each hold before it exits (none is killed), but a job's work is dropped
    // at its current `.await` when the lease is lost: its last "held" line bounds its hold (it
    // was written before the 20 ms sleep at which the work stopped).
    for (key, hold) in open {
        assert!(key.0 == "job", "an acquisition without an end: {hold:?}");
        history.holds.push(hold);
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "{} task {} token {} (owner {}, min_hold {} ms, held {:?}, write {:?})",
            self.name, self.task, self.token, self.owner, self.min_hold_ms, self.held, self.write
        )
    }
}

/// The database of the history's `label` and the lock's name there.
fn deployment<'a>(
    label: &'a str,
    first: &'a mongodb::Database,
    second: &'a mongodb::Database,
) -> (&'a mongodb::Database, &'a str) {
    match label.strip_prefix("B:") {
        Some(name) => (second, name),
        None => (first, label),
    }
}

/// A lock of the run's collection that creates no TTL index: the embedded server's would
/// delete the documents with old `expiresAt` dates at once, which the purge must deal with.
fn lock_without_ttl_index(
    name: &str,
    database: &mongodb::Database,
    collection: &str,
) -> distributed_lock_mongodb::MongoDistributedLock {
    distributed_lock_mongodb::MongoDistributedLock::new(name, database)
        .with_collection(collection)
        .with_options(
            distributed_lock_mongodb::LockOptions::builder()
                .automatic_ttl_index(false)
                .build()
                .expect("valid options"),
        )
}

/// The documents of the application that share the lock collection: never touched.
fn application_documents() -> Vec<Document> {
    let two_days_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 2 * 86_400_000);
    let in_an_hour = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
    vec![
        // Old enough for a purge by age alone.
        doc! { "_id": "app-order", "expiresAt": two_days_ago, "status": "open" },
        // A lock's fields and one more; the workers force its release by name.
        doc! {
            "_id": "app-lockish",
            "lockId": "not-a-lock",
            "expiresAt": in_an_hour,
            "acquiredAt": DateTime::now(),
            "fencingToken": 1_i64,
            "payload": "the application's",
        },
        doc! { "_id": ObjectId::new(), "expiresAt": two_days_ago },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_work_across_providers_and_processes_leaves_a_history_that_holds() {
    let real = std::env::var("MONGODB_URI").ok();
    // The second deployment: a server of its own, or against a real MongoDB another database
    // of it (a separate namespace, which a handoff keeps apart as well).
    let second_server = real
        .is_none()
        .then(|| common::server::start_dedicated(None));
    let (second_uri, second_database) = match &second_server {
        Some(server) => (server.uri.clone(), common::DATABASE.to_owned()),
        None => (
            real.clone().expect("a real MongoDB"),
            format!("{}_second", common::DATABASE),
        ),
    };
    let (dedicated, r0, r1) = routers(real.as_deref());
    let seed = seed("HISTORY_SEED", "history");
    let mut nemesis = StdRng::seed_from_u64(seed);

    let direct = Client::with_uri_str(&r0).await.unwrap();
    let database = direct.database(common::DATABASE);
    let second = Client::with_uri_str(&second_uri)
        .await
        .unwrap()
        .database(&second_database);
    let collection_name = common::unique("locks");
    let resource_name = common::unique("resource");
    let locks = database.collection::<Document>(&collection_name);
    // Each name's lock document exists before the run (a purge refuses a collection most of
    // whose documents are not locks), and an old one that the purge must remove.
    for label in NAMES {
        let (database, name) = deployment(label, &database, &second);
        lock_without_ttl_index(name, database, &collection_name)
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        database
            .collection::<Document>(&resource_name)
            .insert_one(doc! { "_id": name, "applied": [] })
            .await
            .unwrap();
    }
    let two_days_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 2 * 86_400_000);
    locks
        .insert_one(doc! {
            "_id": "old", "expiresAt": two_days_ago, "acquiredAt": two_days_ago,
            "fencingToken": 5_i64,
        })
        .await
        .unwrap();
    let application = application_documents();
    locks.insert_many(&application).await.unwrap();

    let mut proxies = Vec::new();
    for index in 0..PROCESSES {
        let upstream = if index == 1 { &r1 } else { &r0 };
        proxies.push(FaultProxy::start(common::proxy::address_of(upstream).await).await);
    }
    let directory = std::env::temp_dir().join(common::unique("history"));
    std::fs::create_dir_all(&directory).unwrap();
    let seconds = run_for().as_secs().to_string();
    let mut workers: Vec<(tokio::process::Child, PathBuf)> = (0..PROCESSES)
        .map(|index| {
            let history = directory.join(format!("process-{index}.history"));
            let uri = format!(
                "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=5000",
                proxies[index].address()
            );
            let child = common::workers::spawn_against(
                &uri,
                &[
                    "random",
                    &collection_name,
                    &resource_name,
                    &seconds,
                    history.to_str().expect("a UTF-8 path"),
                    &seed.to_string(),
                    &index.to_string(),
                    &second_uri,
                    &second_database,
                ],
            );
            (child, history)
        })
        .collect();

    // The nemesis.
    let mut faults: BTreeMap<&'static str, Vec<(usize, RuleId)>> = BTreeMap::new();
    let mut clock_steps = 0;
    let mut clock_offset_ms = 0_i64;
    let end = tokio::time::Instant::now() + run_for();
    while tokio::time::Instant::now() < end {
        // Every round draws the same values, whichever it picks.
        let draw = nemesis.random_range(0..100);
        let proxy = nemesis.random_range(0..PROCESSES);
        let wire_kind = nemesis.random_range(0..WIRE_FAULTS);
        let clock_target = nemesis.random_range(0..=MAX_CLOCK_STEP_MS);
        let pause = Duration::from_millis(nemesis.random_range(300..900));
        if draw < 70 {
            let (label, rule) = wire_fault(wire_kind, &collection_name);
            faults
                .entry(label)
                .or_default()
                .push((proxy, proxies[proxy].add_rule(rule)));
        } else if draw < 80 {
            faults.entry(LATE_HANDOVER).or_default().push((
                proxy,
                proxies[proxy].add_rule(late_handover(&collection_name)),
            ));
        } else if dedicated.is_some() {
            step_clock(&database, clock_target - clock_offset_ms).await;
            clock_offset_ms = clock_target;
            clock_steps += 1;
        }
        tokio::time::sleep(pause).await;
    }
    for proxy in &proxies {
        proxy.set(Fault::Pass);
        proxy.clear_rules();
    }
    let mut summaries = Vec::new();
    let by = tokio::time::Instant::now() + Duration::from_secs(60);
    for (child, _) in &mut workers {
        let left = by.saturating_duration_since(tokio::time::Instant::now());
        summaries.push(common::workers::summary(child, left).await);
    }
    let stopped = tokio::time::Instant::now();

    // Once every process has exited, each name is free within its expiry (plus how far R1's
    // clock and the steps may put a lease's end ahead of R0's, and a second for this loop's
    // own commands on a loaded machine).
    for label in NAMES {
        let free_by = stopped
            + expiry_of(label)
            + Duration::from_millis((R1_AHEAD_MS + MAX_CLOCK_STEP_MS) as u64)
            + Duration::from_secs(1);
        let (database, name) = deployment(label, &database, &second);
        let lock = lock_without_ttl_index(name, database, &collection_name);
        let freed = loop {
            if let Some(guard) = lock.try_acquire().await.unwrap() {
                guard.release().await.unwrap();
                break true;
            }
            if tokio::time::Instant::now() > free_by {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            freed,
            "{label} still taken {:?} after every process exited (seed {seed}): {:?}",
            stopped.elapsed(),
            lock.status().await
        );
    }
    let freed_after = stopped.elapsed();
    if dedicated.is_some() {
        step_clock(&database, -clock_offset_ms).await;
    }

    let mut history = History::default();
    for (_, path) in &workers {
        read_history(path, &mut history);
    }
    let checked = check(&history, [&database, &second], &resource_name, seed).await;
    let late_handovers: usize = faults
        .get(LATE_HANDOVER)
        .into_iter()
        .flatten()
        .map(|&(proxy, rule)| proxies[proxy].hits(rule))
        .sum();
    let handovers = history
        .holds
        .iter()
        .filter(|hold| hold.name == "handover")
        .count();

    // The application's documents are as they were; the purge removed the old lock.
    for document in &application {
        let stored = locks
            .find_one(doc! { "_id": document.get("_id").unwrap() })
            .await
            .unwrap();
        assert_eq!(
            stored.as_ref(),
            Some(document),
            "an application document was changed (seed {seed})"
        );
    }
    let purges_done = history
        .purged
        .iter()
        .filter(|result| result.parse::<u64>().is_ok())
        .count();
    assert!(
        purges_done > 0,
        "no purge ran to its end (seed {seed}): {:?}",
        history.purged
    );
    assert_eq!(
        locks.find_one(doc! { "_id": "old" }).await.unwrap(),
        None,
        "the purges left the old lock document (seed {seed}): {:?}",
        history.purged
    );
    let applied: usize = faults
        .values()
        .flatten()
        .map(|&(proxy, rule)| proxies[proxy].hits(rule))
        .sum();
    println!(
        "history: {PROCESSES} processes for {:?}: {} holds recorded, {} seen held and checked, \
         {} statuses matched to their holders, {} acquisitions after a min_hold window checked, {} forced releases, {} shutdowns, {} purges \
         ({purges_done} done), {applied} wire faults applied ({late_handovers} late transfers of \
         handover, which had {handovers} holds), {clock_steps} clock steps; the workers exited \
         {:?} after the run, the names were free {:?} after that",
        run_for(),
        history.holds.len(),
        checked.holds,
        checked.statuses,
        checked.windows,
        history.forced.len(),
        history.shutdowns,
        history.purged.len(),
        stopped.saturating_duration_since(end),
        freed_after,
    );
    for summary in &summaries {
        println!("history:   {summary}");
    }
    assert!(
        checked.holds >= HOLDS_FLOOR,
        "too few holds to check: {} (seed {seed})",
        checked.holds
    );
    assert!(
        checked.windows > 0,
        "no acquisition followed a min_hold window with both seen (seed {seed})"
    );
    let _ = std::fs::remove_dir_all(&directory);
}

/// What [`check`] checked.
struct Checked {
    holds: usize,
    statuses: usize,
    windows: usize,
}

async fn check(
    history: &History,
    [first, second]: [&mongodb::Database; 2],
    resource: &str,
    seed: u64,
) -> Checked {
    let mut checked = Checked {
        holds: 0,
        statuses: 0,
        windows: 0,
    };
    for forced in &history.forced {
        assert!(
            forced.name != "app-lockish" || forced.result == "false" || forced.result == "error",
            "a forced release touched an application document (seed {seed})"
        );
    }
    for name in NAMES {
        let mut holds: Vec<&Hold> = history
            .holds
            .iter()
            .filter(|hold| hold.name == name)
            .collect();
        let mut tokens = HashSet::new();
        for hold in &holds {
            assert!(
                tokens.insert(hold.token),
                "two acquisitions with one token (seed {seed}): {hold}"
            );
        }
        let by_token: HashMap<i64, &Hold> = holds.iter().map(|hold| (hold.token, *hold)).collect();

        // Holders in real time, and their tokens.
        holds.retain(|hold| hold.held.is_some());
        holds.sort_by_key(|hold| hold.held.map(|(first, _)| first));
        checked.holds += holds.len();
        for pair in holds.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let ((_, before_last), (after_first, _)) =
                (before.held.expect("kept"), after.held.expect("kept"));
            let forced_between = history.forced.iter().any(|forced| {
                forced.name == name
                    && forced.result != "false"
                    && forced.returned >= before.called
                    && forced.sent <= after_first
            });
            if forced_between {
                continue;
            }
            assert!(
                before_last < after_first,
                "two holders at once ({} µs of overlap; seed {seed}): {before} then {after}",
                (before_last - after_first) / 1_000
            );
            assert!(
                before.token < after.token,
                "fencing tokens out of acquisition order (seed {seed}): {before} then {after}"
            );
        }

        // What reads showed: the holder's details, and when it acquired (server time).
        let mut acquired_ms: BTreeMap<i64, i64> = BTreeMap::new();
        for seen in history.seen.iter().filter(|seen| seen.name == name) {
            let Some(hold) = by_token.get(&seen.token) else {
                continue;
            };
            checked.statuses += 1;
            assert_eq!(
                seen.owner, hold.owner,
                "a {} read shows the details of another holder than the one its token names \
                 (seed {seed}): {hold}",
                seen.source
            );
            if let Some(at) = seen.acquired_ms {
                let known = *acquired_ms.entry(seen.token).or_insert(at);
                assert_eq!(
                    known, at,
                    "two reads of one lease show two acquisition times (seed {seed}): {hold}"
                );
            }
        }
        // No acquisition inside a window: between two acquisitions seen, in token order.
        let seen: Vec<(i64, i64)> = acquired_ms.into_iter().collect();
        for pair in seen.windows(2) {
            let ((first, first_at), (next, next_at)) = (pair[0], pair[1]);
            let window = by_token[&first].min_hold_ms;
            if window == 0 {
                continue;
            }
            checked.windows += 1;
            assert!(
                next_at >= first_at + window - CLOCKS_APART_MS,
                "an acquisition {} ms into a min_hold window of {window} ms (seed {seed}): {} \
                 then {}",
                next_at - first_at,
                by_token[&first],
                by_token[&next]
            );
        }

        // The fenced writes the resource accepted.
        let (database, id) = deployment(name, first, second);
        let applied = accepted_tokens(&database.collection(resource), id, seed).await;
        for token in &applied {
            assert!(
                by_token.contains_key(token),
                "{name}'s resource accepted token {token}, which no recorded acquisition had \
                 (seed {seed})"
            );
        }
        for hold in by_token.values() {
            if hold.write.as_deref() == Some("applied") {
                assert!(
                    applied.contains(&hold.token),
                    "a holder saw its fenced write applied, but the resource lacks it (seed \
                     {seed}): {hold}"
                );
            }
        }
    }
    checked
}
