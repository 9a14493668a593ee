//! The chaos run with a history checker: 4 worker processes × 8 tasks (`lock_worker chaos`)
//! contend for one lock for a minute while a seeded nemesis injects faults, and every
//! acquisition is recorded by its worker, on this machine's monotonic clock, as it happens. The
//! history is then checked:
//!
//! - no two holders' intervals overlap in real time (an interval runs from the first to the last
//!   instant at which its holder asked `is_lost()` and heard "no": at those instants the library
//!   told it that it held the lock);
//! - fencing tokens increase in acquisition order;
//! - the fenced writes the resource accepted carry strictly increasing tokens, each the token of
//!   a recorded acquisition, and every write a holder saw applied is among them.
//!
//! Two workers reach the server through router R0, two through router R1, whose clock is ahead
//! by 300 ms (the embedded server's second port); each worker talks through a fault proxy of
//! its own. The nemesis, every 200–600 ms: a wire fault on one worker's lock commands (lost
//! replies, half-open connections, applied-but-unanswered writes, delays, error replies,
//! write-concern errors, duplicate keys); a partition of the current holder's worker for 3–5 s,
//! during which its holders keep working until their lease is lost;
//! a stepdown (every connection cut, `NotWritablePrimary` for a second, then back with the
//! clock stepped); a step of the server's clock (launcher shim 7) kept within `max_clock_skew`
//! (600 ms) with R1's offset; SIGKILL of a worker (half the time the holder's), replaced by a
//! new one. It prints its seed and counts. `CHAOS_SEED=<n>` replays the nemesis's choices (each
//! round draws the same values whichever fault it picks), not the run: the workers' timing, and
//! so what each fault hits, differs from run to run.
//!
//! Against a real MongoDB (`MONGODB_URI`, and `MONGODB_URI_2` for a second router) the clock
//! steps are left out; `scripts/real-cluster` adds real failovers.

use test_support as common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::proxy::{Action, Fault, FaultProxy, Rule, RuleId, replies};
use mongodb::Client;
use mongodb::bson::{Document, doc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::process::Child;

const WORKERS: usize = 4;
const TASKS: usize = 8;
/// R1's clock is this far ahead of R0's; with the clock steps below (at most 250 ms forward in
/// all) that stays within the workers' `max_clock_skew` of 600 ms.
pub(crate) const R1_AHEAD_MS: i64 = 300;
pub(crate) const MAX_CLOCK_STEP_MS: i64 = 250;

fn run_for() -> Duration {
    let seconds = std::env::var("CHAOS_SECONDS")
        .ok()
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(seconds)
}

/// A wire fault on one worker's commands to the lock's collection.
pub(crate) fn wire_fault(kind: usize, collection: &str) -> (&'static str, Rule) {
    let on = |command: &str, action: Action| Rule::new(command, action).on(collection);
    match kind {
        0 => (
            "findAndModify (acquire, renew): reply lost",
            on("findAndModify", Action::DropReplyAndClose),
        ),
        1 => (
            "findAndModify (acquire, renew): half-open",
            on("findAndModify", Action::ApplyThenHang),
        ),
        2 => (
            "findAndModify (acquire, renew): NotWritablePrimary",
            on(
                "findAndModify",
                Action::Reply(replies::command_error(10107, "NotWritablePrimary")),
            ),
        ),
        3 => (
            "findAndModify (acquire, renew): duplicate key",
            on(
                "findAndModify",
                Action::Reply(replies::duplicate_key(
                    doc! { "_id": 1 },
                    doc! { "_id": "x" },
                )),
            ),
        ),
        4 => (
            "findAndModify (acquire, renew): write concern error after applying",
            on(
                "findAndModify",
                Action::ApplyThenMerge(replies::write_concern_error()),
            ),
        ),
        5 => (
            "findAndModify (acquire, renew): delayed 300 ms",
            on("findAndModify", Action::Delay(Duration::from_millis(300))),
        ),
        6 => (
            "update (release, cleanup): reply lost",
            on("update", Action::DropReplyAndClose),
        ),
        7 => (
            "update (release, cleanup): half-open",
            on("update", Action::ApplyThenHang),
        ),
        8 => (
            "update (release, cleanup): InterruptedDueToReplStateChange",
            on(
                "update",
                Action::Reply(replies::command_error(
                    11602,
                    "InterruptedDueToReplStateChange",
                )),
            ),
        ),
        9 => (
            "update (release, cleanup): write concern error after applying",
            on(
                "update",
                Action::ApplyThenMerge(replies::write_concern_error()),
            ),
        ),
        _ => (
            "update (release, cleanup): delayed 300 ms",
            on("update", Action::Delay(Duration::from_millis(300))),
        ),
    }
}
pub(crate) const WIRE_FAULTS: usize = 11;

/// A worker process and what the checker needs to know of it.
struct Worker {
    child: Child,
    history: PathBuf,
    proxy: usize,
    /// When it was killed, on the monotonic clock the workers use.
    killed_at: Option<i128>,
}

/// The run's shared setup.
struct Run {
    collection: String,
    name: String,
    resource: String,
    proxies: Vec<FaultProxy>,
    directory: PathBuf,
}

impl Run {
    /// While this file exists, the workers behind `proxy` are cut off, and their holders keep
    /// working until their lease is lost (as a process in the middle of a long job does).
    fn stay_file(&self, proxy: usize) -> PathBuf {
        self.directory.join(format!("cut-off-{proxy}"))
    }

    /// Starts worker `index` through `proxy`, to contend for `seconds`.
    fn spawn(&self, index: usize, proxy: usize, seconds: u64) -> Worker {
        let history = self.directory.join(format!("worker-{index}.history"));
        let uri = format!(
            "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=5000",
            self.proxies[proxy].address()
        );
        let (tasks, seconds) = (TASKS.to_string(), seconds.max(1).to_string());
        let child = common::workers::spawn_against(
            &uri,
            &[
                "chaos",
                &self.collection,
                &self.name,
                &self.resource,
                &tasks,
                &seconds,
                history.to_str().expect("a UTF-8 path"),
                self.stay_file(proxy).to_str().expect("a UTF-8 path"),
            ],
        );
        Worker {
            child,
            history,
            proxy,
            killed_at: None,
        }
    }
}

pub(crate) fn monotonic_nanos() -> i128 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` writes one `timespec` through a valid pointer.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(result, 0, "clock_gettime(CLOCK_MONOTONIC)");
    i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec)
}

/// One acquisition as its worker recorded it.
#[derive(Clone, Debug)]
struct Hold {
    worker: usize,
    task: usize,
    token: i64,
    /// The first and last instants its lease was seen held (none: lost before it looked).
    held: Option<(i128, i128)>,
    write: Option<String>,
}

pub(crate) fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|part| {
            part.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix('='))
        })
        .unwrap_or_else(|| panic!("no {key} in history line {line:?}"))
}

pub(crate) fn instant(value: &str) -> Option<i128> {
    (value != "-").then(|| value.parse().expect("an instant"))
}

/// Reads a worker's history. An acquisition without an end was cut short by SIGKILL: its
/// holder was last seen holding at its last recorded instant (it was killed before its next
/// look, at most 20 ms later, and acted on nothing in between).
fn holds_of(worker: usize, history: &Path, killed_at: Option<i128>) -> Vec<Hold> {
    let text = std::fs::read_to_string(history).unwrap_or_default();
    let mut open: HashMap<(usize, i64), Hold> = HashMap::new();
    let mut holds = Vec::new();
    for line in text.lines() {
        let task: usize = field(line, "task").parse().expect("a task");
        let token: i64 = field(line, "token").parse().expect("a token");
        if line.starts_with("acquired ") {
            let first = instant(field(line, "held"));
            open.insert(
                (task, token),
                Hold {
                    worker,
                    task,
                    token,
                    held: first.map(|at| (at, at)),
                    write: None,
                },
            );
        } else if line.starts_with("held ") {
            if let (Some(hold), Some(at)) =
                (open.get_mut(&(task, token)), instant(field(line, "held")))
                && let Some((first, _)) = hold.held
            {
                hold.held = Some((first, at));
            }
        } else if line.starts_with("ended ") {
            let mut hold = open
                .remove(&(task, token))
                .unwrap_or_else(|| panic!("an end without its acquisition: {line}"));
            if let (Some((first, _)), Some(last)) = (hold.held, instant(field(line, "held"))) {
                hold.held = Some((first, last));
            }
            hold.write = Some(field(line, "write").to_owned());
            holds.push(hold);
        }
    }
    for (_, hold) in open {
        assert!(
            killed_at.is_some(),
            "an acquisition without an end, by a worker that was not killed: {hold:?}"
        );
        holds.push(hold);
    }
    holds
}

impl std::fmt::Display for Hold {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            formatter,
            "worker {} task {} (token {}, held {:?}, write {:?})",
            self.worker, self.task, self.token, self.held, self.write
        )
    }
}

/// The worker whose history recorded the acquisition with `token`, if any.
fn worker_with_token(workers: &[Worker], token: i64) -> Option<usize> {
    let needle = format!(" token={token} ");
    workers.iter().position(|worker| {
        worker.killed_at.is_none()
            && std::fs::read_to_string(&worker.history).is_ok_and(|text| {
                text.lines()
                    .any(|line| line.starts_with("acquired ") && line.contains(&needle))
            })
    })
}

/// The holds a run must check, and the faults it must inject, to have exercised the lock: an
/// idle machine checks 100 to 250 holds in one round; a loaded one, or an unlucky schedule of
/// kills and partitions (each keeps the lock taken until its lease ends), fewer.
const MIN_HOLDS: usize = 40;
const MIN_FAULTS: usize = 50;
/// At most this many rounds, each with a seed of its own and its whole history checked, until
/// the run has checked `MIN_HOLDS` holds and injected `MIN_FAULTS` faults.
const MAX_ROUNDS: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_contenders_under_a_nemesis_leave_a_history_without_overlap() {
    let first = seed("CHAOS_SEED", "chaos");
    let (mut holds, mut injected) = (0, 0);
    for round in 0..MAX_ROUNDS {
        let (checked, faults) = chaos_round(first.wrapping_add(round)).await;
        holds += checked;
        injected += faults;
        if holds >= MIN_HOLDS && injected >= MIN_FAULTS || round + 1 == MAX_ROUNDS {
            break;
        }
        println!("chaos: {holds} holds checked and {injected} faults so far: another round");
    }
    assert!(
        holds >= MIN_HOLDS,
        "too few holds to check in {MAX_ROUNDS} rounds: {holds}"
    );
    assert!(
        injected >= MIN_FAULTS,
        "too few faults in {MAX_ROUNDS} rounds: {injected}"
    );
}

/// One round of the chaos run with `seed`, its history checked: how many holds it checked and
/// how many faults it injected.
async fn chaos_round(seed: u64) -> (usize, usize) {
    println!("chaos: round seed {seed}");
    let real = std::env::var("MONGODB_URI").ok();
    let (dedicated, r0, r1) = routers(real.as_deref());
    let mut nemesis = StdRng::seed_from_u64(seed);

    let mut proxies = Vec::new();
    for index in 0..WORKERS {
        let upstream = if index % 2 == 0 { &r0 } else { &r1 };
        proxies.push(FaultProxy::start(common::proxy::address_of(upstream).await).await);
    }
    let directory = std::env::temp_dir().join(common::unique("chaos"));
    std::fs::create_dir_all(&directory).unwrap();
    let run = Run {
        collection: common::unique("locks"),
        name: common::unique("chaos"),
        resource: common::unique("resource"),
        proxies,
        directory,
    };
    let direct = Client::with_uri_str(&r0).await.unwrap();
    let database = direct.database(common::DATABASE);
    database
        .collection::<Document>(&run.resource)
        .insert_one(doc! { "_id": "resource", "applied": [] })
        .await
        .unwrap();
    let seconds = run_for().as_secs();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|index| run.spawn(index, index, seconds))
        .collect();

    // The nemesis.
    let mut faults: BTreeMap<&'static str, Vec<(usize, RuleId)>> = BTreeMap::new();
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut clock_offset_ms = 0_i64;
    let mut partitioned: Vec<(usize, tokio::time::Instant)> = Vec::new();
    let end = tokio::time::Instant::now() + run_for();
    while tokio::time::Instant::now() < end {
        let now = tokio::time::Instant::now();
        partitioned.retain(|&(proxy, until)| {
            let over = now >= until;
            if over {
                run.proxies[proxy].set(Fault::Pass);
                let _ = std::fs::remove_file(run.stay_file(proxy));
            }
            !over
        });
        let holder = async {
            let stored = database
                .collection::<Document>(&run.collection)
                .find_one(doc! { "_id": &run.name, "lockId": { "$exists": true } })
                .await
                .ok()
                .flatten()?;
            let token = stored.get_i64("fencingToken").ok()?;
            worker_with_token(&workers, token)
        }
        .await;
        // Every round draws the same values, whichever fault it picks, so that a seed replays
        // the nemesis's choices whatever the workers did.
        let draw = nemesis.random_range(0..100);
        let proxy = nemesis.random_range(0..WORKERS);
        let wire_kind = nemesis.random_range(0..WIRE_FAULTS);
        let lasting = Duration::from_millis(nemesis.random_range(3_000..5_000));
        let clock_target = nemesis.random_range(0..=MAX_CLOCK_STEP_MS);
        let kill_the_holder = nemesis.random_bool(0.5);
        let victim_draw = nemesis.random_range(0..usize::MAX);
        let pause = Duration::from_millis(nemesis.random_range(200..600));
        match draw {
            0..58 => {
                let (label, rule) = wire_fault(wire_kind, &run.collection);
                faults
                    .entry(label)
                    .or_default()
                    .push((proxy, run.proxies[proxy].add_rule(rule)));
            }
            58..68 => {
                if let Some(worker) = holder.filter(|&worker| {
                    partitioned
                        .iter()
                        .all(|&(proxy, _)| proxy != workers[worker].proxy)
                }) {
                    // Long enough for the holder's lease to run out while it keeps working.
                    let proxy = workers[worker].proxy;
                    std::fs::write(run.stay_file(proxy), b"").unwrap();
                    run.proxies[proxy].set(Fault::Blackhole);
                    partitioned.push((proxy, now + lasting));
                    *counts
                        .entry("partition of the holder's worker")
                        .or_default() += 1;
                }
            }
            68..74 => {
                // A stepdown: every connection cut, NotWritablePrimary for a second, then the
                // new primary's clock.
                let rules: Vec<(usize, RuleId)> = (0..WORKERS)
                    .flat_map(|proxy| {
                        run.proxies[proxy].cut_connections();
                        ["findAndModify", "update"].map(|command| {
                            (
                                proxy,
                                run.proxies[proxy].add_rule(
                                    Rule::new(
                                        command,
                                        Action::Reply(replies::command_error(
                                            10107,
                                            "NotWritablePrimary",
                                        )),
                                    )
                                    .times(usize::MAX),
                                ),
                            )
                        })
                    })
                    .collect();
                tokio::time::sleep(Duration::from_secs(1)).await;
                for (proxy, rule) in rules {
                    run.proxies[proxy].remove_rule(rule);
                }
                if dedicated.is_some() {
                    step_clock(&database, clock_target - clock_offset_ms).await;
                    clock_offset_ms = clock_target;
                }
                *counts.entry("stepdown").or_default() += 1;
            }
            74..96 => {
                if dedicated.is_some() {
                    step_clock(&database, clock_target - clock_offset_ms).await;
                    let label = if clock_target > clock_offset_ms {
                        "clock step forward"
                    } else {
                        "clock step back"
                    };
                    clock_offset_ms = clock_target;
                    *counts.entry(label).or_default() += 1;
                }
            }
            _ => {
                let victim = match holder {
                    Some(worker) if kill_the_holder => worker,
                    _ => {
                        let alive: Vec<usize> = (0..workers.len())
                            .filter(|&worker| workers[worker].killed_at.is_none())
                            .collect();
                        alive[victim_draw % alive.len()]
                    }
                };
                workers[victim]
                    .child
                    .start_kill()
                    .expect("SIGKILL a worker");
                let _ = workers[victim].child.wait().await;
                workers[victim].killed_at = Some(monotonic_nanos());
                let proxy = workers[victim].proxy;
                // The replacement contends until the end of the run.
                let left = end.saturating_duration_since(tokio::time::Instant::now());
                let replacement = run.spawn(workers.len(), proxy, left.as_secs());
                workers.push(replacement);
                *counts.entry("SIGKILL of a worker (replaced)").or_default() += 1;
            }
        }
        tokio::time::sleep(pause).await;
    }
    for (index, proxy) in run.proxies.iter().enumerate() {
        proxy.set(Fault::Pass);
        proxy.clear_rules();
        let _ = std::fs::remove_file(run.stay_file(index));
    }
    for (label, rules) in &faults {
        let applied: usize = rules
            .iter()
            .map(|&(proxy, rule)| run.proxies[proxy].hits(rule))
            .sum();
        counts.insert(label, applied);
    }

    // The workers stop on their own at the end of the run: one bound for all of them together.
    let (mut acquisitions, mut busy, mut errors) = (0, 0, 0);
    let summaries_by = tokio::time::Instant::now() + Duration::from_secs(90);
    for worker in workers
        .iter_mut()
        .filter(|worker| worker.killed_at.is_none())
    {
        let left = summaries_by.saturating_duration_since(tokio::time::Instant::now());
        let summary = common::workers::summary(&mut worker.child, left).await;
        let count = |key: &str| -> usize {
            field(&summary, key)
                .parse()
                .unwrap_or_else(|_| panic!("{key} in {summary:?}"))
        };
        acquisitions += count("acquisitions");
        busy += count("busy");
        errors += count("errors");
    }

    // The checks.
    let mut holds: Vec<Hold> = workers
        .iter()
        .enumerate()
        .flat_map(|(index, worker)| holds_of(index, &worker.history, worker.killed_at))
        .collect();
    let recorded = holds.len();
    holds.retain(|hold| hold.held.is_some());
    holds.sort_by_key(|hold| hold.held.map(|(first, _)| first));
    // Sorted by their first instants, intervals that overlap include two neighbours that do.
    for pair in holds.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        let ((_, before_last), (after_first, _)) =
            (before.held.expect("kept"), after.held.expect("kept"));
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
    let applied = accepted_tokens(&database.collection(&run.resource), "resource", seed).await;
    let tokens: std::collections::HashSet<i64> = holds.iter().map(|hold| hold.token).collect();
    let all_tokens: std::collections::HashSet<i64> = workers
        .iter()
        .enumerate()
        .flat_map(|(index, worker)| holds_of(index, &worker.history, worker.killed_at))
        .map(|hold| hold.token)
        .collect();
    for token in &applied {
        assert!(
            all_tokens.contains(token),
            "the resource accepted a write with token {token}, which no recorded acquisition had \
             (seed {seed})"
        );
    }
    let seen_applied: Vec<&Hold> = holds
        .iter()
        .filter(|hold| hold.write.as_deref() == Some("applied"))
        .collect();
    for hold in &seen_applied {
        assert!(
            applied.contains(&hold.token),
            "a holder saw its fenced write applied, but the resource does not have it: {hold:?}"
        );
    }
    let stale = holds
        .iter()
        .filter(|hold| hold.write.as_deref() == Some("stale"))
        .count();
    let killed = workers
        .iter()
        .filter(|worker| worker.killed_at.is_some())
        .count();
    let injected: usize = counts.values().sum();
    println!(
        "chaos: {WORKERS} workers ({killed} killed and replaced) × {TASKS} tasks for {:?}: \
         {recorded} acquisitions recorded ({acquisitions} reported by the workers that were not \
         killed; {} seen held and checked, {} tokens), {busy} waits of 5 s that found the lock busy, {errors} \
         other errors; no two holders overlapped; tokens increase in acquisition order; {} \
         fenced writes accepted in token order ({} seen applied by their holders, {stale} \
         refused as stale); {injected} faults:",
        run_for(),
        holds.len(),
        tokens.len(),
        applied.len(),
        seen_applied.len(),
    );
    for (label, count) in &counts {
        println!("chaos:   {count:>4}  {label}");
    }
    let _ = std::fs::remove_dir_all(&run.directory);
    (holds.len(), injected)
}

/// The two routers of a run: a dedicated embedded server whose second port's clock is
/// [`R1_AHEAD_MS`] ahead, or, against the real MongoDB at `real`, that one and `MONGODB_URI_2`
/// (the same router if unset). Returns the dedicated server (kept while the run lasts), R0, R1.
pub(crate) fn routers(real: Option<&str>) -> (Option<common::server::Dedicated>, String, String) {
    match real {
        Some(uri) => (
            None,
            uri.to_owned(),
            std::env::var("MONGODB_URI_2").unwrap_or_else(|_| uri.to_owned()),
        ),
        None => {
            let dedicated = common::server::start_dedicated(Some(R1_AHEAD_MS));
            let (r0, r1) = (
                dedicated.uri.clone(),
                dedicated.skewed_uri.clone().expect("a skewed port"),
            );
            (Some(dedicated), r0, r1)
        }
    }
}

/// The tokens of the fenced writes resource document `id` of `collection` accepted, in the order
/// it accepted them; asserts that they strictly increase.
pub(crate) async fn accepted_tokens(
    collection: &mongodb::Collection<Document>,
    id: &str,
    seed: u64,
) -> Vec<i64> {
    let stored = collection
        .find_one(doc! { "_id": id })
        .await
        .unwrap()
        .expect("the resource document");
    let applied: Vec<i64> = stored
        .get_array("applied")
        .unwrap()
        .iter()
        .map(|token| token.as_i64().expect("a token"))
        .collect();
    assert!(
        applied.windows(2).all(|pair| pair[0] < pair[1]),
        "resource {id} accepted fenced writes out of token order: {applied:?} (seed {seed})"
    );
    applied
}

/// A run's seed: `variable`'s value, or a random one; printed as "`label`: seed <n>".
pub(crate) fn seed(variable: &str, label: &str) -> u64 {
    let seed = std::env::var(variable)
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("{label}: seed {seed}");
    seed
}

/// Steps the embedded server's clock by `millis` (launcher shim 7).
pub(crate) async fn step_clock(database: &mongodb::Database, millis: i64) {
    if millis != 0 {
        database
            .run_command(doc! { "mongoecoStepClock": millis })
            .await
            .expect("the embedded server steps its clock");
    }
}
