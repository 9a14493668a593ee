//! Mutual exclusion across OS processes, checked on a protected resource document.

mod common;

use std::time::Duration;

use futures::TryStreamExt;
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
    let mut acquisitions = 0;
    for child in &mut children {
        let summary = common::workers::summary(child, Duration::from_secs(540)).await;
        assert_eq!(
            summary,
            format!("done acquisitions={} rejected=0", TASKS * ROUNDS),
        );
        acquisitions += TASKS * ROUNDS;
    }

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
    let log: Vec<Document> = database
        .collection::<Document>(&format!("{resource_name}_log"))
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let tokens: Vec<i64> = log
        .iter()
        .map(|entry| entry.get_i64("token").unwrap())
        .collect();
    assert_eq!(
        tokens.len(),
        acquisitions,
        "every holder's fenced write was applied"
    );
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens increase in acquisition order"
    );
    println!(
        "exclusion: {PROCESSES} processes × {TASKS} tasks, {acquisitions} acquisitions, max holders 1, 0 rejected fenced writes"
    );
}
