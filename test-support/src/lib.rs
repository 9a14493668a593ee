//! What the integration tests, the benches, the worker fixture and `dlock`'s tests share: the
//! embedded server ([`server`]), the fault proxy ([`proxy`]), worker processes ([`workers`]) and
//! small helpers. One crate of the workspace, compiled once, where each test binary used to
//! compile its own copy.
//!
//! Each test binary talks to its own embedded server (or to `MONGODB_URI`), and each test uses
//! its own lock names and collections.

pub mod proxy;
pub mod server;
pub mod workers;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distributed_lock_mongodb::{LockOptions, MongoDistributedLock, Provider};
use mongodb::bson::{Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};

pub const DATABASE: &str = "distributed_lock_tests";

/// A fresh client (clients belong to the runtime that created them; each test has its own).
pub async fn client() -> Client {
    Client::with_uri_str(server::uri())
        .await
        .expect("valid MongoDB URI")
}

pub async fn database() -> Database {
    database_on(&server::uri()).await
}

/// The test database on the server at `uri` (e.g. an isolated one, see `server::isolated`).
pub async fn database_on(uri: &str) -> Database {
    Client::with_uri_str(uri)
        .await
        .expect("valid MongoDB URI")
        .database(DATABASE)
}

/// A name no other test (or earlier run against a persistent server) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// The commands a client sent, from the driver's command events.
#[derive(Default)]
pub struct CommandLog {
    started: Mutex<Vec<String>>,
    /// Name and BSON size of each command started.
    sizes: Mutex<Vec<(String, usize)>>,
    /// The reads (`find`, `aggregate`) started, as sent.
    reads: Mutex<Vec<Document>>,
    /// The `findAndModify` commands started, as sent.
    find_and_modifies: Mutex<Vec<Document>>,
    /// The `update` commands started, as sent.
    updates: Mutex<Vec<Document>>,
    in_flight: AtomicI64,
}

impl CommandLog {
    /// Names of the commands started so far, in order.
    pub fn started(&self) -> Vec<String> {
        self.started.lock().unwrap().clone()
    }

    pub fn count(&self, name: &str) -> usize {
        self.started
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == name)
            .count()
    }

    pub fn clear(&self) {
        self.started.lock().unwrap().clear();
        self.sizes.lock().unwrap().clear();
        self.find_and_modifies.lock().unwrap().clear();
    }

    /// The `update` commands started so far, as sent.
    pub fn updates(&self) -> Vec<Document> {
        self.updates.lock().unwrap().clone()
    }

    /// The `find` and `aggregate` commands started so far, as sent.
    pub fn reads(&self) -> Vec<Document> {
        self.reads.lock().unwrap().clone()
    }

    /// The `findAndModify` commands started so far.
    pub fn find_and_modifies(&self) -> Vec<Document> {
        self.find_and_modifies.lock().unwrap().clone()
    }

    /// The commands started so far, leaving out the change streams' (`aggregate` opening one,
    /// `getMore`, `killCursors`).
    pub fn started_without_streams(&self) -> Vec<String> {
        self.started()
            .into_iter()
            .filter(|name| !["aggregate", "getMore", "killCursors"].contains(&name.as_str()))
            .collect()
    }

    /// The `findAndModify` commands of locks, semaphores and reader-writer locks that transferred
    /// a lease to local waiters on release: unlike an attempt's, no upsert; unlike a renewal's,
    /// their filter asks nothing of the lease's expiry.
    pub fn transfers(&self) -> usize {
        self.find_and_modifies
            .lock()
            .unwrap()
            .iter()
            .filter(|command| {
                !command.get_bool("upsert").unwrap_or(false)
                    && command
                        .get_document("query")
                        .is_ok_and(|query| !query.contains_key("$expr"))
            })
            .count()
    }

    /// The BSON sizes of the commands called `name` started so far.
    pub fn sizes(&self, name: &str) -> Vec<usize> {
        self.sizes
            .lock()
            .unwrap()
            .iter()
            .filter(|(command, _)| command == name)
            .map(|(_, size)| *size)
            .collect()
    }

    /// Commands started but not yet answered.
    pub fn in_flight(&self) -> i64 {
        self.in_flight.load(Ordering::SeqCst)
    }
}

/// A client through a new fault proxy whose commands are recorded: the proxy (to add faults
/// to), its database and the log of what the client sent.
pub async fn proxied_counting_database() -> (proxy::FaultProxy, Database, Arc<CommandLog>) {
    let (proxy, client) = proxy::proxied_client().await;
    drop(client);
    let uri = format!("mongodb://{}/?directConnection=true", proxy.address());
    let (database, commands) = counting_database_on(&uri, |_| {}).await;
    (proxy, database, commands)
}

/// A client whose commands are recorded, for counting round trips.
pub async fn counting_database() -> (Database, Arc<CommandLog>) {
    counting_database_with(|_| {}).await
}

/// Like [`counting_database`], with client options changed by `configure`.
pub async fn counting_database_with(
    configure: impl FnOnce(&mut ClientOptions),
) -> (Database, Arc<CommandLog>) {
    counting_database_on(&server::uri(), configure).await
}

/// Like [`counting_database_with`], on the server at `uri`.
pub async fn counting_database_on(
    uri: &str,
    configure: impl FnOnce(&mut ClientOptions),
) -> (Database, Arc<CommandLog>) {
    let log = Arc::new(CommandLog::default());
    let mut options = ClientOptions::parse(uri).await.expect("valid MongoDB URI");
    configure(&mut options);
    let recorder = Arc::clone(&log);
    options.command_event_handler = Some(EventHandler::callback(move |event| match event {
        CommandEvent::Started(started) => {
            recorder.in_flight.fetch_add(1, Ordering::SeqCst);
            recorder
                .started
                .lock()
                .unwrap()
                .push(started.command_name.clone());
            match started.command_name.as_str() {
                "find" | "aggregate" => {
                    recorder.reads.lock().unwrap().push(started.command.clone())
                }
                "findAndModify" => recorder
                    .find_and_modifies
                    .lock()
                    .unwrap()
                    .push(started.command.clone()),
                "update" => recorder
                    .updates
                    .lock()
                    .unwrap()
                    .push(started.command.clone()),
                _ => {}
            }
            let size = mongodb::bson::to_vec(&started.command).map_or(0, |raw| raw.len());
            recorder
                .sizes
                .lock()
                .unwrap()
                .push((started.command_name.clone(), size));
        }
        CommandEvent::Succeeded(_) | CommandEvent::Failed(_) => {
            recorder.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        _ => {}
    }));
    let client = Client::with_options(options).expect("valid client options");
    (client.database(DATABASE), log)
}

pub fn options(expiry_ms: u64, cadence_ms: u64) -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_millis(expiry_ms))
        .extension_cadence(Duration::from_millis(cadence_ms))
        .busy_wait_sleep_time(Duration::from_millis(5), Duration::from_millis(20))
        .build()
        .expect("valid options")
}

/// A lock with a unique name in a unique collection.
pub async fn fresh_lock(
    prefix: &str,
    options: LockOptions,
) -> (MongoDistributedLock, Collection<Document>) {
    let database = database().await;
    let collection = unique("locks");
    let lock = MongoDistributedLock::new(unique(prefix), &database)
        .with_collection(collection.as_str())
        .with_options(options);
    (lock, database.collection(&collection))
}

/// Like [`fresh_lock`], in a collection where the lock's TTL index cannot be created (an index
/// of the same name on another key is in the way), so released and expired documents stay put
/// even on the embedded server, whose TTL deletion is otherwise instant.
pub async fn fresh_lock_without_ttl(
    prefix: &str,
    options: LockOptions,
) -> (MongoDistributedLock, Collection<Document>) {
    let (lock, collection) = fresh_lock(prefix, options).await;
    block_ttl_index(&collection).await;
    (lock, collection)
}

/// Puts an index named like the lock's TTL index, on another key, into `collection`: the lock's
/// own index creation then finds the name taken and gives up, so expired documents stay.
pub async fn block_ttl_index(collection: &Collection<Document>) {
    let placeholder = mongodb::IndexModel::builder()
        .keys(doc! { "placeholder": 1 })
        .options(
            mongodb::options::IndexOptions::builder()
                .name("expiresAt_ttl".to_owned())
                .build(),
        )
        .build();
    collection
        .create_index(placeholder)
        .await
        .expect("create placeholder index");
}

/// A provider on `database` whose exclusive, reader-writer and semaphore collections (returned
/// in that order) are fresh ones of its own.
pub fn provider_with_own_collections(database: &Database) -> (Provider, [Collection<Document>; 3]) {
    let names = [unique("locks"), unique("rw"), unique("semaphores")];
    let collections = names
        .clone()
        .map(|name| database.collection::<Document>(&name));
    let [locks, rw_locks, semaphores] = names;
    let provider = Provider::new(database)
        .with_collection(locks)
        .with_reader_writer_collection(rw_locks)
        .with_semaphore_collection(semaphores);
    (provider, collections)
}

/// Creates a TTL index on `expiresAt` in `collection` that deletes documents `expire_after`
/// past their `expiresAt`.
pub async fn create_ttl_index(collection: &Collection<Document>, expire_after: Duration) {
    let index = mongodb::IndexModel::builder()
        .keys(doc! { "expiresAt": 1 })
        .options(
            mongodb::options::IndexOptions::builder()
                .expire_after(expire_after)
                .build(),
        )
        .build();
    collection
        .create_index(index)
        .await
        .expect("create the TTL index");
}

/// The stored lock document.
pub async fn lock_document(collection: &Collection<Document>, name: &str) -> Option<Document> {
    collection
        .find_one(doc! { "_id": name })
        .await
        .expect("find_one")
}

/// The server's clock and the lock's stored `expiresAt`, read in one command so both refer to
/// the same server instant. `expiresAt` is `None` when there is no lock document.
pub async fn server_now_and_expiry(
    collection: &Collection<Document>,
    name: &str,
) -> (mongodb::bson::DateTime, Option<mongodb::bson::DateTime>) {
    use futures::TryStreamExt;
    // $documents would be neater but needs MongoDB 5.1; a $facet over the collection works on 4.2.
    let rows: Vec<Document> = collection
        .aggregate([
            doc! { "$facet": { "lock": [{ "$match": { "_id": name } }, { "$project": { "expiresAt": 1 } }] } },
            doc! { "$project": { "now": "$$NOW", "lock": 1 } },
        ])
        .await
        .expect("aggregate")
        .try_collect()
        .await
        .expect("aggregate cursor");
    let row = rows.first().expect("one row");
    let now = *row.get_datetime("now").expect("server time");
    let expires_at = row
        .get_array("lock")
        .ok()
        .and_then(|lock| lock.first())
        .and_then(|lock| lock.as_document())
        .and_then(|lock| lock.get_datetime("expiresAt").ok())
        .copied();
    (now, expires_at)
}

/// Waits (up to 10 s) until `count` local waiters of lock `name` in `collection` of the test
/// database have an offer standing (they wait in line for a transfer): whether they do.
pub async fn offers_become(collection: &str, name: &str, count: usize) -> bool {
    eventually(Duration::from_secs(10), || async {
        distributed_lock_mongodb::__testing::offers_standing(DATABASE, collection, name) == count
    })
    .await
}

/// Waits (up to 20 s) until the change stream of `log`'s client is open (the driver asks for its
/// first batch of events) and the `waiters` for lock `name` of `collection` wait idle: their
/// first attempts, and those of the pollers woken as the stream starts to watch (a release may
/// have come before), have been answered. A release from now on reaches them by the stream or
/// the release itself; panics if that does not happen.
pub async fn stream_open(log: &CommandLog, collection: &str, name: &str, waiters: usize) {
    let open = eventually(Duration::from_secs(20), || async {
        log.count("getMore") >= 1
            && distributed_lock_mongodb::__testing::waiters_idle(DATABASE, collection, name)
                == waiters
            && log.in_flight() <= 1
    })
    .await;
    assert!(open, "no change stream: {:?}", log.started());
}

/// Polls `condition` every 10 ms until it holds or `limit` passes; returns whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Counts the holders inside a protected section and remembers the most there were at once.
/// Clones share the counts.
#[derive(Clone, Default)]
pub struct Occupancy {
    inside: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl Occupancy {
    /// One more holder inside, until the returned value is dropped.
    pub fn enter(&self) -> Inside {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        Inside(Arc::clone(&self.inside))
    }

    /// Holders inside right now.
    pub fn inside(&self) -> usize {
        self.inside.load(Ordering::SeqCst)
    }

    /// The most holders that were inside at once.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// A holder inside an [`Occupancy`]; leaves when dropped.
pub struct Inside(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a `tracing_subscriber::fmt` subscriber writes, kept in memory: give it a clone as its
/// writer (`.with_writer(move || logs.clone())`) and read the text back.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The lines written so far that contain every one of `parts`.
    pub fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| parts.iter().all(|part| line.contains(part)))
            .map(str::to_owned)
            .collect()
    }
}
