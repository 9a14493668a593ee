//! A lock-using worker process, used by the crash-recovery and cross-process exclusion tests and
//! handy for experiments with several processes:
//!
//! ```text
//! lock_worker hold <collection> <name> <expiry_ms> <cadence_ms>
//!     acquire, print "acquired <token>", then hold (renewing) until killed
//! lock_worker contend <collection> <name> <resource_collection> <tasks> <rounds>
//!     <tasks> tasks each acquire <rounds> times; every holder bumps a holder count on the
//!     resource document, makes a fenced write with its token, logs the token in
//!     <resource_collection>_log under a sequence number, and drops the count again;
//!     prints "done acquisitions=<n> rejected=<n>"
//! lock_worker chaos <collection> <name> <resource_collection> <tasks> <seconds>
//!     like contend, for <seconds>, tolerating errors (a fault-injecting proxy may sit between
//!     this process and the server): every holder also records the lock's server-side
//!     acquiredAt and the server time it entered and left the protected section in the log;
//!     prints "done acquisitions=<n> rejected=<n> busy=<n> errors=<n> lost=<n>"
//! ```
//!
//! Uses `MONGODB_URI` (the tests pass theirs), or starts the embedded test server.

#[path = "../tests/common/server.rs"]
mod server;

use std::time::Duration;

use distributed_lock_mongodb::{
    Error, FencingToken, LockOptions, LostSignal, MongoDistributedLock, Operation, Provider,
};
use mongodb::bson::{Document, doc};
use mongodb::options::ReturnDocument;
use mongodb::{Client, Collection, Database};

const DATABASE: &str = "distributed_lock_tests";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let database = Client::with_uri_str(server::uri())
        .await?
        .database(DATABASE);
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["hold", collection, name, expiry_ms, cadence_ms] => {
            hold(
                &database,
                collection,
                name,
                expiry_ms.parse()?,
                cadence_ms.parse()?,
            )
            .await
        }
        ["contend", collection, name, resource, tasks, rounds] => {
            contend(
                &database,
                collection,
                name,
                resource,
                tasks.parse()?,
                rounds.parse()?,
            )
            .await
        }
        ["chaos", collection, name, resource, tasks, seconds] => {
            chaos(
                &database,
                collection,
                name,
                resource,
                tasks.parse()?,
                Duration::from_secs(seconds.parse()?),
            )
            .await
        }
        _ => Err(format!("usage: see the header of examples/lock_worker.rs; got {args:?}").into()),
    }
}

async fn hold(
    database: &Database,
    collection: &str,
    name: &str,
    expiry_ms: u64,
    cadence_ms: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let options = LockOptions::builder()
        .expiry(Duration::from_millis(expiry_ms))
        .extension_cadence(Duration::from_millis(cadence_ms))
        .build()?;
    let lock = MongoDistributedLock::new(name, database)
        .with_collection(collection)
        .with_options(options);
    let guard = lock.acquire().await?;
    println!("acquired {}", guard.fencing_token());
    let lost = guard.lost();
    lost.wait().await;
    Err("the lock was lost while holding it".into())
}

async fn contend(
    database: &Database,
    collection: &str,
    name: &str,
    resource: &str,
    tasks: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(10))
        .busy_wait_sleep_time(Duration::from_millis(20), Duration::from_millis(400))
        .adaptive_backoff(true)
        .build()?;
    let lock = MongoDistributedLock::new(name, database)
        .with_collection(collection)
        .with_options(options);
    // The log is separate from the resource document: one growing array would make every
    // update slower on the embedded server.
    let log = database.collection::<Document>(&format!("{resource}_log"));
    let resource = database.collection::<Document>(resource);
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (lock, resource, log) = (lock.clone(), resource.clone(), log.clone());
            tokio::spawn(async move {
                let mut rejected = 0_usize;
                for _ in 0..rounds {
                    let guard = lock.acquire_timeout(Duration::from_secs(600)).await?;
                    if !protected_work(&resource, &log, guard.fencing_token()).await? {
                        rejected += 1;
                    }
                    guard.release().await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(rejected)
            })
        })
        .collect();
    let mut rejected = 0;
    for worker in workers {
        rejected += worker.await?.map_err(|e| e.to_string())?;
    }
    println!("done acquisitions={} rejected={rejected}", tasks * rounds);
    Ok(())
}

/// Enter (count a holder, remember the most seen at once, take the next sequence number), write
/// fenced, log the token under the sequence number, leave. Returns whether the fenced write was
/// applied.
async fn protected_work(
    resource: &Collection<Document>,
    log: &Collection<Document>,
    token: FencingToken,
) -> mongodb::error::Result<bool> {
    let id = doc! { "_id": "resource" };
    let entered = resource
        .find_one_and_update(
            id.clone(),
            vec![
                doc! { "$set": {
                    "holders": { "$add": [{ "$ifNull": ["$holders", 0] }, 1] },
                    "sequence": { "$add": [{ "$ifNull": ["$sequence", 0] }, 1] },
                } },
                doc! { "$set": { "maxHolders": { "$max": [{ "$ifNull": ["$maxHolders", 0] }, "$holders"] } } },
            ],
        )
        .upsert(true)
        .return_document(ReturnDocument::After)
        .await?;
    let sequence = entered
        .and_then(|d| d.get("sequence").cloned())
        .unwrap_or_default();
    let fenced = resource
        .update_one(
            doc! { "_id": "resource", "$or": [
                { "token": { "$lt": token.get() } },
                { "token": { "$exists": false } },
            ] },
            doc! { "$set": { "token": token.get() } },
        )
        .await?;
    log.insert_one(doc! { "_id": sequence, "token": token.get() })
        .await?;
    resource
        .update_one(id, doc! { "$inc": { "holders": -1 } })
        .await?;
    Ok(fenced.matched_count == 1)
}

/// Outcome counts of the chaos mode.
#[derive(Default)]
struct Tally {
    acquisitions: usize,
    rejected: usize,
    /// Waits that ran out while the lock stayed busy.
    busy: usize,
    /// Every other error returned to the caller.
    errors: usize,
    lost: usize,
}

async fn chaos(
    database: &Database,
    collection: &str,
    name: &str,
    resource: &str,
    tasks: usize,
    run_for: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(3))
        .extension_cadence(Duration::from_millis(500))
        .busy_wait_sleep_time(Duration::from_millis(10), Duration::from_millis(200))
        .adaptive_backoff(true)
        .build()?;
    let provider = Provider::new(database)
        .with_collection(collection)
        .with_options(options);
    let log = database.collection::<Document>(&format!("{resource}_log"));
    let resource = database.collection::<Document>(resource);
    let end = tokio::time::Instant::now() + run_for;
    // Short waits: the run must end soon after `run_for` even when a fault stalls an attempt.
    let patience = Duration::from_secs(5);
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (provider, resource, log) = (provider.clone(), resource.clone(), log.clone());
            let name = name.to_owned();
            tokio::spawn(async move {
                let lock = provider.create_lock(name.as_str());
                let mut tally = Tally::default();
                while tokio::time::Instant::now() < end {
                    let guard = match lock.acquire_timeout(patience).await {
                        Ok(guard) => guard,
                        // Busy all along: 32 contenders for one lock.
                        Err(Error::Timeout {
                            operation: Operation::Acquire,
                            ..
                        }) => {
                            tally.busy += 1;
                            continue;
                        }
                        Err(_) => {
                            tally.errors += 1;
                            continue;
                        }
                    };
                    tally.acquisitions += 1;
                    // The lock's own record of this acquisition, read on the server.
                    let acquired_at = match provider.status(&name).await {
                        Ok(Some(status)) if status.fencing_token == Some(guard.fencing_token()) => {
                            status.acquired_at
                        }
                        _ => None,
                    };
                    // One holder in eight stays a while (past a few renewals); the others leave
                    // at once.
                    let stay = if rand::random::<f64>() < 0.125 {
                        Duration::from_millis(rand::random_range(0..1_500))
                    } else {
                        Duration::ZERO
                    };
                    if !guard.is_lost() {
                        let holder = Holder {
                            token: guard.fencing_token(),
                            acquired_at,
                            stay,
                            lost: guard.lost(),
                        };
                        match timed_work(&resource, &log, holder).await {
                            Ok(true) => {}
                            Ok(false) => tally.rejected += 1,
                            Err(_) => tally.errors += 1,
                        }
                    }
                    match guard.release().await {
                        Ok(()) => {}
                        Err(error) if error.is_lock_lost() => tally.lost += 1,
                        Err(_) => tally.errors += 1,
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for worker in workers {
        let tally = worker.await?;
        total.acquisitions += tally.acquisitions;
        total.rejected += tally.rejected;
        total.busy += tally.busy;
        total.errors += tally.errors;
        total.lost += tally.lost;
    }
    println!(
        "done acquisitions={} rejected={} busy={} errors={} lost={}",
        total.acquisitions, total.rejected, total.busy, total.errors, total.lost
    );
    Ok(())
}

/// A holder in the chaos mode.
struct Holder {
    token: FencingToken,
    /// The lock's `acquiredAt` as stored on the server, when it could be read.
    acquired_at: Option<mongodb::bson::DateTime>,
    /// How long to stay in the protected section, unless the lock is lost first.
    stay: Duration,
    lost: LostSignal,
}

/// Like `protected_work`, staying in the protected section for `holder.stay` (leaving at once if
/// the lock is lost) and recording server times: the lock's `acquiredAt`, and when the holder
/// entered and left the protected section.
async fn timed_work(
    resource: &Collection<Document>,
    log: &Collection<Document>,
    holder: Holder,
) -> mongodb::error::Result<bool> {
    let Holder {
        token,
        acquired_at,
        stay,
        lost,
    } = holder;
    let id = doc! { "_id": "resource" };
    let entered = resource
        .find_one_and_update(
            id.clone(),
            vec![
                doc! { "$set": {
                    "holders": { "$add": [{ "$ifNull": ["$holders", 0] }, 1] },
                    "sequence": { "$add": [{ "$ifNull": ["$sequence", 0] }, 1] },
                    "at": "$$NOW",
                } },
                doc! { "$set": { "maxHolders": { "$max": [{ "$ifNull": ["$maxHolders", 0] }, "$holders"] } } },
            ],
        )
        .upsert(true)
        .return_document(ReturnDocument::After)
        .await?
        .unwrap_or_default();
    let fenced = resource
        .update_one(
            doc! { "_id": "resource", "$or": [
                { "token": { "$lt": token.get() } },
                { "token": { "$exists": false } },
            ] },
            doc! { "$set": { "token": token.get() } },
        )
        .await?;
    tokio::select! {
        () = tokio::time::sleep(stay) => {}
        () = lost.wait() => {}
    }
    let left = resource
        .find_one_and_update(
            id,
            vec![doc! { "$set": { "holders": { "$add": ["$holders", -1] }, "at": "$$NOW" } }],
        )
        .return_document(ReturnDocument::After)
        .await?
        .unwrap_or_default();
    let mut entry = doc! {
        "_id": entered.get("sequence").cloned().unwrap_or_default(),
        "token": token.get(),
        "enteredAt": entered.get("at").cloned().unwrap_or_default(),
        "leftAt": left.get("at").cloned().unwrap_or_default(),
    };
    if let Some(acquired_at) = acquired_at {
        entry.insert("acquiredAt", acquired_at);
    }
    log.insert_one(entry).await?;
    Ok(fenced.matched_count == 1)
}
