//! The randomized fault test: 4 processes × 8 tasks contend for one lock for about a minute
//! while a fault-injecting proxy between them and the server applies a random schedule of
//! wire-level faults to the lock's commands: lost replies, half-open connections, election
//! errors, write-concern errors after the write was applied, duplicate-key races and delays.
//! Afterwards no two holders may have overlapped (on the protected resource, and by the
//! server-side history of who entered and left when), every fenced write must have applied, and
//! tokens must increase in acquisition order.
//!
//! The seed is printed; `CHAOS_SEED=<n>` replays a schedule.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::proxy::{Action, FaultProxy, Rule, replies};
use futures::TryStreamExt;
use mongodb::Client;
use mongodb::bson::{DateTime, Document, doc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const SECONDS: u64 = 50;

/// The faults of the schedule, by name.
fn fault(kind: usize, collection: &str) -> (&'static str, Rule) {
    let on = |command: &str, action: Action| Rule::new(command, action).on(collection);
    match kind {
        0 => (
            "acquire: reply lost",
            on("findAndModify", Action::DropReplyAndClose),
        ),
        1 => (
            "acquire: half-open",
            on("findAndModify", Action::ApplyThenHang),
        ),
        2 => (
            "acquire: NotWritablePrimary",
            on(
                "findAndModify",
                Action::Reply(replies::command_error(10107, "NotWritablePrimary")),
            ),
        ),
        3 => (
            "acquire: duplicate key",
            on(
                "findAndModify",
                Action::Reply(replies::duplicate_key(
                    doc! { "_id": 1 },
                    doc! { "_id": "x" },
                )),
            ),
        ),
        4 => (
            "acquire: write concern error after applying",
            on(
                "findAndModify",
                Action::ApplyThenMerge(replies::write_concern_error()),
            ),
        ),
        5 => (
            "acquire: delayed 300 ms",
            on("findAndModify", Action::Delay(Duration::from_millis(300))),
        ),
        6 => (
            "renew/release: reply lost",
            on("update", Action::DropReplyAndClose),
        ),
        7 => (
            "renew/release: half-open",
            on("update", Action::ApplyThenHang),
        ),
        8 => (
            "renew/release: InterruptedDueToReplStateChange",
            on(
                "update",
                Action::Reply(replies::command_error(
                    11602,
                    "InterruptedDueToReplStateChange",
                )),
            ),
        ),
        9 => (
            "renew/release: write concern error after applying",
            on(
                "update",
                Action::ApplyThenMerge(replies::write_concern_error()),
            ),
        ),
        _ => (
            "renew/release: delayed 300 ms",
            on("update", Action::Delay(Duration::from_millis(300))),
        ),
    }
}
const FAULT_KINDS: usize = 11;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_contenders_under_random_wire_faults_never_overlap() {
    let server = common::server::isolated();
    let proxy = FaultProxy::start(common::proxy::address_of(&server.uri).await).await;
    let through_proxy = format!(
        "mongodb://{}/?directConnection=true&serverSelectionTimeoutMS=5000",
        proxy.address()
    );
    let collection = common::unique("locks");
    let resource_name = common::unique("resource");
    let name = common::unique("chaos");
    let (tasks, seconds) = (TASKS.to_string(), SECONDS.to_string());
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("chaos: seed {seed}");
    let mut schedule = StdRng::seed_from_u64(seed);

    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            common::workers::spawn_against(
                &through_proxy,
                &[
                    "chaos",
                    &collection,
                    &name,
                    &resource_name,
                    &tasks,
                    &seconds,
                ],
            )
        })
        .collect();

    // A fault every 200–600 ms on the lock's commands (never on the resource's: those are how
    // the test observes the holders).
    let mut injected: Vec<(&'static str, common::proxy::RuleId)> = Vec::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(SECONDS);
    while tokio::time::Instant::now() < end {
        let (label, rule) = fault(schedule.random_range(0..FAULT_KINDS), &collection);
        injected.push((label, proxy.add_rule(rule)));
        tokio::time::sleep(Duration::from_millis(schedule.random_range(200..600))).await;
    }
    let mut applied: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (label, rule) in &injected {
        *applied.entry(label).or_default() += proxy.hits(*rule);
    }
    proxy.clear_rules();

    let (mut acquisitions, mut busy, mut errors, mut lost) = (0, 0, 0, 0);
    for child in &mut children {
        let summary = common::workers::summary(child, Duration::from_secs(60)).await;
        let count = |key: &str| -> usize {
            summary
                .split_whitespace()
                .find_map(|field| field.strip_prefix(&format!("{key}=")))
                .and_then(|value| value.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {summary:?}"))
        };
        assert_eq!(
            count("rejected"),
            0,
            "a fenced write was rejected: {summary}"
        );
        acquisitions += count("acquisitions");
        busy += count("busy");
        errors += count("errors");
        lost += count("lost");
    }

    let database = Client::with_uri_str(&server.uri)
        .await
        .unwrap()
        .database(common::DATABASE);
    let resource = database
        .collection::<Document>(&resource_name)
        .find_one(doc! { "_id": "resource" })
        .await
        .unwrap()
        .expect("the resource was written");
    assert_eq!(
        resource.get_i32("maxHolders").unwrap(),
        1,
        "two holders at once: {resource}"
    );
    assert_eq!(resource.get_i32("holders").unwrap(), 0, "{resource}");
    let log: Vec<Document> = database
        .collection::<Document>(&format!("{resource_name}_log"))
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(log.len() >= PROCESSES * TASKS, "only {} holders", log.len());
    let at = |entry: &Document, field: &str| -> Option<DateTime> {
        entry.get_datetime(field).ok().copied()
    };
    let mut with_acquired_at = 0;
    for pair in log.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(
            before.get_i64("token").unwrap() < after.get_i64("token").unwrap(),
            "tokens must increase in acquisition order: {before} then {after}"
        );
        let left = at(before, "leftAt").expect("leftAt");
        assert!(
            at(after, "enteredAt").expect("enteredAt") >= left,
            "the next holder entered before the previous one left: {before} then {after}"
        );
        if let Some(acquired_at) = at(after, "acquiredAt") {
            with_acquired_at += 1;
            assert!(
                acquired_at >= left,
                "the lock was acquired (server time) before the previous holder left: {before} then {after}"
            );
        }
    }
    let applied_total: usize = applied.values().sum();
    println!(
        "chaos: {PROCESSES} processes × {TASKS} tasks for {SECONDS} s: {acquisitions} acquisitions \
         ({} in the log, {with_acquired_at} checked against the lock's acquiredAt), {busy} \
         waits of 5 s that found the lock busy, {errors} other errors returned to callers, \
         {lost} releases of lost locks, max holders 1, tokens increasing; {applied_total} \
         faults applied:",
        log.len()
    );
    for (label, count) in &applied {
        println!("chaos:   {count:>4}  {label}");
    }
    // The run must have exercised something (a schedule of ~125 faults; a half-open acquisition
    // holds the lock until its caller gives up on it, 3 s here).
    assert!(applied_total >= 50, "too few faults applied: {applied:?}");
    assert!(acquisitions >= 100, "too few acquisitions: {acquisitions}");
}
