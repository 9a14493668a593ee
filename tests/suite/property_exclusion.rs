//! Mutual exclusion across OS processes, checked on a protected resource document.

use test_support as common;

use std::time::Duration;

use mongodb::bson::{Document, doc};

const PROCESSES: usize = 4;
const TASKS: usize = 8;
const ROUNDS: usize = 63; // 4 × 8 × 63 = 2,016 acquisitions

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_of_eight_tasks_never_overlap() {
    let database = common::database().await;
    let collection = common::unique("locks");
    let resource_name = common::unique("resource");
    let name = common::unique("exclusion");
    let (tasks, rounds) = (TASKS.to_string(), ROUNDS.to_string());

    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            common::workers::spawn(&[
                "contend",
                &collection,
                &name,
                &resource_name,
                &tasks,
                &rounds,
            ])
        })
        .collect();
    // (sequence number, fencing token) of every acquisition, from every process.
    let mut held: Vec<(i64, i64)> = Vec::new();
    for child in &mut children {
        let output = common::workers::output(child, Duration::from_secs(540)).await;
        let mut lines: Vec<&str> = output.lines().collect();
        assert_eq!(
            lines.pop(),
            Some(format!("done acquisitions={} rejected=0", TASKS * ROUNDS).as_str()),
        );
        for line in lines {
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                ["held", sequence, token] => {
                    held.push((sequence.parse().unwrap(), token.parse().unwrap()));
                }
                _ => panic!("unexpected worker output: {line}"),
            }
        }
    }
    let acquisitions = PROCESSES * TASKS * ROUNDS;

    let resource = database
        .collection::<Document>(&resource_name)
        .find_one(doc! { "_id": "resource" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        resource.get_i32("maxHolders").unwrap(),
        1,
        "two holders at once: {resource}"
    );
    assert_eq!(resource.get_i32("holders").unwrap(), 0);
    held.sort_unstable();
    let sequences: Vec<i64> = held.iter().map(|(sequence, _)| *sequence).collect();
    assert_eq!(
        sequences,
        (1..=acquisitions as i64).collect::<Vec<_>>(),
        "every acquisition entered the resource once, under its own sequence number"
    );
    assert!(
        held.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "tokens increase in the order the holders entered"
    );
    println!(
        "exclusion: {PROCESSES} processes × {TASKS} tasks, {acquisitions} acquisitions, max holders 1, 0 rejected fenced writes"
    );
}
