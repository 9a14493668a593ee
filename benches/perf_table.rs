//! Measures the lock and prints the table of PERFORMANCE.md:
//! `cargo bench --bench perf_table` (against `MONGODB_URI`, or the embedded server);
//! `cargo bench --bench perf_table -- handoff commands` runs only the groups of rows named
//! (`uncontended`, `handoff`, `cross-process`, `commands`, `standalone`, `semaphore`, `reader`,
//! `renewal`, `memory`; the round trip is always measured). `standalone` repeats the
//! cross-process rows on an embedded server of their own without change streams, as on a
//! standalone `mongod`: waiters of other processes only poll there.
//!
//! Every figure is measured in this run, next to the raw driver calls it compares with; the
//! machine is shared and noisy, so compare ratios rather than absolute times. Commands are
//! counted with the driver's command event handler. Cross-process figures run copies of this
//! program as worker processes (`perf_table worker ...`).

#[path = "support/raw_commands.rs"]
mod raw_commands;

use raw_commands::{raw_acquire, raw_release, with_ttl_index};
use test_support::server;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distributed_lock_mongodb::{LockOptions, MongoDistributedLock, Provider};
use futures::{StreamExt, TryStreamExt};
use mongodb::bson::{DateTime, Document, doc};
use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;
use mongodb::options::ClientOptions;
use mongodb::{Client, Collection, Database};

/// Counts live heap bytes, for the memory-per-guard figure.
struct CountingAllocator;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const DATABASE: &str = "distributed_lock_perf";

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        return worker(&args[1..]).await;
    }
    // `cargo bench` passes `--bench`; any other argument names a group of rows to run.
    let groups: Vec<&String> = args.iter().filter(|arg| !arg.starts_with("--")).collect();
    let run = |group: &str| groups.is_empty() || groups.iter().any(|wanted| *wanted == group);
    let uri = server::uri();
    let (database, commands) = counting_database(&uri).await?;
    database.drop().await?;

    let mut clock = Laps::default();
    println!("| measurement | value |");
    println!("| --- | --- |");
    let rtt = round_trip(&database).await?;
    println!(
        "| one round trip of the acquisition command (raw `find_one_and_update`, same pipeline), median | {} |",
        ms(rtt)
    );
    if run("uncontended") {
        uncontended(&database).await?;
        clock.lap("uncontended");
    }
    if run("handoff") {
        for sharing in [Sharing::Clones, Sharing::BuiltApart] {
            same_process_handoff(&database, rtt, sharing).await?;
        }
        clock.lap("handoff");
    }
    if run("cross-process") {
        for adaptive in [false, true] {
            cross_process(&uri, adaptive, 1, 25, rtt, "").await?;
        }
        cross_process(&uri, false, 8, 5, rtt, "").await?;
        clock.lap("cross-process");
    }
    if run("commands") {
        for sharing in [Sharing::Clones, Sharing::BuiltApart] {
            let label = "1 holder × 50 ms, 8 local waiters";
            local_commands(&uri, label, sharing, 9, 5, 50).await?;
            local_commands(&uri, "16 local contenders (hold 2 ms)", sharing, 16, 10, 2).await?;
        }
        for mode in ["false", "true"] {
            commands_per_acquisition(&uri, mode, "").await?;
        }
        clock.lap("commands");
    }
    if run("standalone") {
        let standalone = server::start_dedicated_with(&["--no-change-streams".to_owned()]);
        let (database, _) = counting_database(&standalone.uri).await?;
        let rtt = round_trip(&database).await?;
        let label = ", no change streams (polling only)";
        println!(
            "| one round trip of the acquisition command, the server without change streams | {} |",
            ms(rtt)
        );
        for adaptive in [false, true] {
            cross_process(&standalone.uri, adaptive, 1, 25, rtt, label).await?;
        }
        cross_process(&standalone.uri, false, 8, 5, rtt, label).await?;
        commands_per_acquisition(&standalone.uri, "false", label).await?;
        clock.lap("standalone");
    }
    if run("semaphore") {
        semaphore_fill(&database, &commands, rtt).await?;
        clock.lap("semaphore");
    }
    if run("weighted") {
        weighted_semaphore(&database, &commands).await?;
        clock.lap("weighted");
    }
    if run("fair") {
        fair_uncontended(&database, &commands).await?;
        for mode in ["false", "fair"] {
            commands_per_acquisition(&uri, mode, "").await?;
        }
        clock.lap("fair");
    }
    if run("reader") {
        reader_wake_up(&database, &commands, rtt).await?;
        clock.lap("reader");
    }
    if run("renewal") {
        // The 1,000-lock row's lease is long: the embedded server's update over 1,000 names takes
        // seconds (quadratic in the names; see PERFORMANCE.md), a real server's `_id` index
        // milliseconds. With a 18 s lease its renewals outran their time limit and leases ended.
        for (locks, cadence, expiry) in [(1, 1, 6), (100, 1, 6), (1_000, 3, 60)] {
            renewals_per_cadence(&database, &commands, locks, cadence, expiry).await?;
        }
        clock.lap("renewal");
    }
    if run("memory") {
        memory_per_guard(&database).await?;
        clock.lap("memory");
    }
    clock.report();
    Ok(())
}

/// How long each group of rows took, printed to stderr at the end (the benchmark's own budget).
struct Laps {
    last: Instant,
    laps: Vec<(&'static str, Duration)>,
}

impl Default for Laps {
    fn default() -> Self {
        Laps {
            last: Instant::now(),
            laps: Vec::new(),
        }
    }
}

impl Laps {
    fn lap(&mut self, group: &'static str) {
        let now = Instant::now();
        self.laps.push((group, now - self.last));
        self.last = now;
    }

    fn report(&self) {
        let total: Duration = self.laps.iter().map(|(_, took)| *took).sum();
        let each: Vec<String> = self
            .laps
            .iter()
            .map(|(group, took)| format!("{group} {:.0} s", took.as_secs_f64()))
            .collect();
        eprintln!(
            "groups run in {:.0} s: {}",
            total.as_secs_f64(),
            each.join(", ")
        );
    }
}

/// How the tasks of a same-process row get their lock.
#[derive(Clone, Copy, Debug)]
enum Sharing {
    /// Clones of one lock (one family).
    Clones,
    /// `MongoDistributedLock::new` in each task, as the README's first example does.
    BuiltApart,
}

impl Sharing {
    fn lock(self, lock: &MongoDistributedLock, database: &Database) -> MongoDistributedLock {
        match self {
            Sharing::Clones => lock.clone(),
            Sharing::BuiltApart => MongoDistributedLock::new(lock.name(), database),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Sharing::Clones => "clones of one lock",
            Sharing::BuiltApart => "one lock object per task",
        }
    }
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1e3)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[derive(Default)]
struct CommandCounter {
    started: Mutex<Vec<String>>,
}

impl CommandCounter {
    fn reset(&self) {
        self.started.lock().unwrap().clear();
    }
    fn count(&self, name: &str) -> usize {
        self.started
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == name)
            .count()
    }
    /// The commands a lock sends: attempts and transfers (`findAndModify`), releases and
    /// renewals (`update`), renewal read-backs (`aggregate`).
    fn lock_commands(&self) -> usize {
        ["findAndModify", "update", "aggregate"]
            .iter()
            .map(|name| self.count(name))
            .sum()
    }
}

async fn counting_database(uri: &str) -> Result<(Database, Arc<CommandCounter>)> {
    let counter = Arc::new(CommandCounter::default());
    let recorder = Arc::clone(&counter);
    let mut options = ClientOptions::parse(uri).await?;
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        if let CommandEvent::Started(started) = event {
            recorder
                .started
                .lock()
                .unwrap()
                .push(started.command_name.clone());
        }
    }));
    Ok((Client::with_options(options)?.database(DATABASE), counter))
}

/// The round trip of the command an acquisition sends (the same pipeline, raw), server
/// processing included: on the embedded server that dominates the network's share.
async fn round_trip(database: &Database) -> Result<Duration> {
    let raw: Collection<Document> = database.collection("raw_rtt");
    with_ttl_index(&raw).await?;
    let mut samples = Vec::new();
    for _ in 0..200 {
        let lock_id = uuid::Uuid::new_v4().simple().to_string();
        let started = Instant::now();
        raw_acquire(&raw, &lock_id).await?;
        samples.push(started.elapsed());
        raw_release(&raw, &lock_id).await?;
    }
    samples.sort();
    Ok(percentile(&samples, 0.5))
}

/// The lock's acquire + release next to the same two commands sent raw, interleaved.
async fn uncontended(database: &Database) -> Result<()> {
    const CYCLES: usize = 300;
    let lock = MongoDistributedLock::new("perf-uncontended", database);
    let raw: Collection<Document> = database.collection("raw");
    with_ttl_index(&raw).await?;
    let (mut with_lock, mut with_driver) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        let started = Instant::now();
        lock.acquire().await?.release().await?;
        with_lock.push(started.elapsed());

        let started = Instant::now();
        raw_cycle(&raw).await?;
        with_driver.push(started.elapsed());
    }
    with_lock.sort();
    with_driver.sort();
    let (lock_p50, raw_p50) = (percentile(&with_lock, 0.5), percentile(&with_driver, 0.5));
    println!(
        "| uncontended acquire + release, median ({CYCLES} cycles) | {} vs raw `find_one_and_update` + `update_one` {}: **{:.2}×** |",
        ms(lock_p50),
        ms(raw_p50),
        lock_p50.as_secs_f64() / raw_p50.as_secs_f64()
    );
    // The plainest loop, back to back (nothing between a release and the next acquisition):
    // its whole time and its slowest cycles show a cycle that waits, which the median above
    // does not (and the raw commands interleaved there hide).
    let (mut with_lock, mut with_driver) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for _ in 0..CYCLES {
        let cycle = Instant::now();
        lock.acquire().await?.release().await?;
        with_lock.push(cycle.elapsed());
    }
    let lock_total = started.elapsed();
    let started = Instant::now();
    for _ in 0..CYCLES {
        let cycle = Instant::now();
        raw_cycle(&raw).await?;
        with_driver.push(cycle.elapsed());
    }
    let raw_total = started.elapsed();
    with_lock.sort();
    with_driver.sort();
    println!(
        "| `loop {{ lock.acquire().await?.release().await? }}` on one lock object, back to back, total ({CYCLES} cycles; p99 {} vs {}) | {} vs raw {}: **{:.2}×** |",
        ms(percentile(&with_lock, 0.99)),
        ms(percentile(&with_driver, 0.99)),
        ms(lock_total),
        ms(raw_total),
        lock_total.as_secs_f64() / raw_total.as_secs_f64()
    );
    Ok(())
}

async fn raw_cycle(raw: &Collection<Document>) -> mongodb::error::Result<()> {
    let lock_id = uuid::Uuid::new_v4().simple().to_string();
    raw_acquire(raw, &lock_id).await?;
    raw_release(raw, &lock_id).await
}

/// Time from `release()` being called to the next holder's `acquire` returning, with 8 waiters
/// in this process.
async fn same_process_handoff(database: &Database, rtt: Duration, sharing: Sharing) -> Result<()> {
    const WAITERS: usize = 8;
    const ROUNDS: usize = 40;
    let lock = MongoDistributedLock::new(format!("perf-handoff-{}", wall_micros()), database);
    let events = Arc::new(Mutex::new(Vec::<(Instant, bool)>::new())); // (when, is_release)
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (lock, events) = (sharing.lock(&lock, database), Arc::clone(&events));
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = lock.acquire().await?;
                    events.lock().unwrap().push((Instant::now(), false));
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    events.lock().unwrap().push((Instant::now(), true));
                    guard.release().await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let events = events.lock().unwrap().clone();
    let latencies = handoff_latencies(events.into_iter());
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "| same-process handoff, 8 waiters, {} ({} handoffs): `release()` called → next `acquire` returns | p50 {} = **{:.2} round trips**, p99 {} = {:.2} round trips (round trip {}) |",
        sharing.label(),
        latencies.len(),
        ms(p50),
        p50.as_secs_f64() / rtt.as_secs_f64(),
        ms(p99),
        p99.as_secs_f64() / rtt.as_secs_f64(),
        ms(rtt)
    );
    Ok(())
}

/// Lock commands per acquisition with `tasks` tasks of this process that each acquire, hold
/// `hold_ms` and release, `rounds` times (default options).
async fn local_commands(
    uri: &str,
    label: &str,
    sharing: Sharing,
    tasks: usize,
    rounds: usize,
    hold_ms: u64,
) -> Result<()> {
    let (database, commands) = counting_database(uri).await?;
    let lock =
        MongoDistributedLock::new(format!("perf-local-{tasks}-{}", wall_micros()), &database);
    // The TTL index is created after the first acquisition: not part of the figure.
    lock.acquire().await?.release().await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    commands.reset();
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let lock = sharing.lock(&lock, &database);
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let guard = lock.acquire().await?;
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    guard.release().await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    let sent = commands.lock_commands();
    println!(
        "| commands per acquisition, {label}, {} | **{:.2}** ({sent} commands / {} acquisitions) |",
        sharing.label(),
        sent as f64 / (tasks * rounds) as f64,
        tasks * rounds
    );
    Ok(())
}

/// A semaphore of 3 places and 16 local contenders: the most holders at once while they cycle,
/// and how long after all 3 holders release together the places are all taken again.
async fn semaphore_fill(
    database: &Database,
    commands: &CommandCounter,
    rtt: Duration,
) -> Result<()> {
    const PLACES: u32 = 3;
    const CONTENDERS: usize = 16;
    let semaphore = Provider::new(database)
        .create_semaphore(format!("perf-semaphore-{}", wall_micros()), PLACES);
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let cycling: Vec<_> = (0..CONTENDERS)
        .map(|_| {
            let (semaphore, inside, most) =
                (semaphore.clone(), Arc::clone(&inside), Arc::clone(&most));
            tokio::spawn(async move {
                for _ in 0..5 {
                    let place = semaphore.acquire().await?;
                    most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    place.release().await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(())
            })
        })
        .collect();
    for task in cycling {
        task.await??;
    }

    // Refill: 3 holders and 13 waiters in line; the holders release together (4 rounds).
    let (mut fills, mut refill_commands, mut release_calls) = (Vec::new(), 0, Vec::new());
    for round in 0..4 {
        let semaphore = Provider::new(database)
            .create_semaphore(format!("perf-refill-{round}-{}", wall_micros()), PLACES);
        let mut holders = Vec::new();
        for _ in 0..PLACES {
            holders.push(semaphore.acquire().await?);
        }
        let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
        let waiters: Vec<_> = (0..CONTENDERS - PLACES as usize)
            .map(|_| {
                let (semaphore, acquired) = (semaphore.clone(), acquired.clone());
                tokio::spawn(async move {
                    let place = semaphore.acquire().await?;
                    let _ = acquired.send(Instant::now());
                    std::future::pending::<()>().await;
                    drop(place);
                    Ok::<_, distributed_lock_mongodb::Error>(())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        commands.reset();
        let released_at = Instant::now();
        futures::future::join_all(holders.into_iter().map(|holder| holder.release())).await;
        release_calls.push(released_at.elapsed());
        let mut last = released_at;
        for _ in 0..PLACES {
            last = acquisitions.recv().await.ok_or("a waiter ended")?;
        }
        fills.push(last - released_at);
        refill_commands += commands.lock_commands();
        for waiter in waiters {
            waiter.abort();
        }
    }
    fills.sort();
    release_calls.sort();
    println!(
        "| semaphore, 3 places, 16 local contenders: most holders at once; all places retaken after the 3 holders release together (4 times) | **{} of {PLACES}**; median {} = {:.2} round trips, slowest {}; {:.1} commands per refill (at least {PLACES}: each release hands its place over); the 3 release calls alone: median {} |",
        most.load(Ordering::SeqCst),
        ms(percentile(&fills, 0.5)),
        percentile(&fills, 0.5).as_secs_f64() / rtt.as_secs_f64(),
        ms(fills[fills.len() - 1]),
        refill_commands as f64 / fills.len() as f64,
        ms(percentile(&release_calls, 0.5)),
    );
    Ok(())
}

/// Weighted semaphores: taking several places at once costs what taking one costs (one command
/// each way), against raw driver calls in the same run; and a waiter for 3 places of 4, among 8
/// tasks that keep taking one place each, is served rather than starved (its mark holds back
/// what it needs).
async fn weighted_semaphore(database: &Database, commands: &CommandCounter) -> Result<()> {
    const CYCLES: usize = 200;
    let pool =
        Provider::new(database).create_semaphore(format!("perf-weighted-{}", wall_micros()), 8);
    let raw: Collection<Document> = database.collection("raw");
    with_ttl_index(&raw).await?;
    let (mut many, mut one, mut driver) = (Vec::new(), Vec::new(), Vec::new());
    commands.reset();
    for _ in 0..CYCLES {
        let started = Instant::now();
        let places = pool.try_acquire_many(3).await?.ok_or("3 of 8 free")?;
        places.release().await?;
        many.push(started.elapsed());
    }
    let many_commands = commands.lock_commands() as f64 / CYCLES as f64;
    for _ in 0..CYCLES {
        let started = Instant::now();
        pool.try_acquire()
            .await?
            .ok_or("a free place")?
            .release()
            .await?;
        one.push(started.elapsed());
        let started = Instant::now();
        raw_cycle(&raw).await?;
        driver.push(started.elapsed());
    }
    for samples in [&mut many, &mut one, &mut driver] {
        samples.sort();
    }
    let (many, one, driver) = (
        percentile(&many, 0.5),
        percentile(&one, 0.5),
        percentile(&driver, 0.5),
    );
    println!(
        "| semaphore of 8: `try_acquire_many(3)` + release, median ({CYCLES} cycles) | {} ({many_commands:.1} commands) vs one place {} vs raw `find_one_and_update` + `update_one` {}: **{:.2}×** raw, {:.2}× one place |",
        ms(many),
        ms(one),
        ms(driver),
        many.as_secs_f64() / driver.as_secs_f64(),
        many.as_secs_f64() / one.as_secs_f64(),
    );

    // Not starved: 8 tasks keep taking 1 place of 4 for 20 ms; a waiter for 3 joins after 300 ms.
    let pool =
        Provider::new(database).create_semaphore(format!("perf-starve-{}", wall_micros()), 4);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let singles = Arc::new(AtomicUsize::new(0));
    let small: Vec<_> = (0..8)
        .map(|_| {
            let (pool, stop, singles) = (pool.clone(), Arc::clone(&stop), Arc::clone(&singles));
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let place = pool.acquire_timeout(Duration::from_secs(30)).await?;
                    singles.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    place.release().await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = singles.load(Ordering::SeqCst);
    let started = Instant::now();
    let big = pool
        .acquire_many_timeout(3, Duration::from_secs(60))
        .await?;
    let waited = started.elapsed();
    let meanwhile = singles.load(Ordering::SeqCst) - before;
    big.release().await?;
    stop.store(true, Ordering::SeqCst);
    for task in small {
        task.await??;
    }
    println!(
        "| semaphore of 4, 8 tasks taking 1 place for 20 ms each in a loop: a waiter for 3 places is served after | {} ({meanwhile} single places taken meanwhile, {before} in the 300 ms before it came) |",
        ms(waited),
    );
    Ok(())
}

/// 8 local readers waiting behind a writer: how long after the writer's release all of them hold
/// the lock (default options: without a local wake-up, each would sleep 10–800 ms).
async fn reader_wake_up(
    database: &Database,
    commands: &CommandCounter,
    rtt: Duration,
) -> Result<()> {
    const READERS: usize = 8;
    let (mut wake_ups, mut wake_commands, mut release_calls) = (Vec::new(), 0, Vec::new());
    for round in 0..5 {
        let lock = Provider::new(database)
            .create_reader_writer_lock(format!("perf-readers-{round}-{}", wall_micros()));
        let writer = lock.acquire_write().await?;
        let (acquired, mut acquisitions) = tokio::sync::mpsc::unbounded_channel();
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (lock, acquired) = (lock.clone(), acquired.clone());
                tokio::spawn(async move {
                    let read = lock.acquire_read().await?;
                    let _ = acquired.send(Instant::now());
                    std::future::pending::<()>().await;
                    drop(read);
                    Ok::<_, distributed_lock_mongodb::Error>(())
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        commands.reset();
        let released_at = Instant::now();
        writer.release().await?;
        release_calls.push(released_at.elapsed());
        let mut last = released_at;
        for _ in 0..READERS {
            last = acquisitions.recv().await.ok_or("a reader ended")?;
        }
        wake_ups.push(last - released_at);
        wake_commands += commands.lock_commands();
        for reader in readers {
            reader.abort();
        }
    }
    wake_ups.sort();
    release_calls.sort();
    println!(
        "| reader-writer lock: 8 local readers waiting behind a writer, all holding after its release (5 times) | median {} = {:.2} round trips, slowest {}; {:.1} commands per wake-up (at least 1: the release admits them all); the release call alone: median {} |",
        ms(percentile(&wake_ups, 0.5)),
        percentile(&wake_ups, 0.5).as_secs_f64() / rtt.as_secs_f64(),
        ms(wake_ups[wake_ups.len() - 1]),
        wake_commands as f64 / wake_ups.len() as f64,
        ms(percentile(&release_calls, 0.5)),
    );
    Ok(())
}

/// Pairs each release with the next acquisition after it.
fn handoff_latencies<T: Ord + Copy + std::ops::Sub<Output = Duration>>(
    events: impl Iterator<Item = (T, bool)>,
) -> Vec<Duration> {
    let mut events: Vec<(T, bool)> = events.collect();
    events.sort_by_key(|(at, _)| *at);
    let mut latencies = Vec::new();
    let mut released_at = None;
    for (at, is_release) in events {
        match (is_release, released_at) {
            (true, _) => released_at = Some(at),
            (false, Some(released)) => {
                latencies.push(at - released);
                released_at = None;
            }
            (false, None) => {}
        }
    }
    latencies.sort();
    latencies
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Micros(u128);

impl std::ops::Sub for Micros {
    type Output = Duration;
    fn sub(self, earlier: Micros) -> Duration {
        Duration::from_micros(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(u64::MAX))
    }
}

fn wall_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn lock_options(adaptive: bool) -> LockOptions {
    // The default busy-wait range (10..=800 ms).
    LockOptions::builder()
        .adaptive_backoff(adaptive)
        .build()
        .expect("valid options")
}

/// A worker's options by its mode argument: `true` adaptive backoff, `fair` a fair lock, else the
/// defaults.
fn worker_options(mode: &str) -> LockOptions {
    let options = lock_options(mode == "true");
    if mode == "fair" {
        return options
            .to_builder()
            .fair(true)
            .build()
            .expect("valid options");
    }
    options
}

/// Workers in separate processes, `tasks` tasks each: handoff latency across processes. `label`
/// ends the row's description.
async fn cross_process(
    uri: &str,
    adaptive: bool,
    tasks: usize,
    rounds: usize,
    rtt: Duration,
    label: &str,
) -> Result<()> {
    const PROCESSES: usize = 4;
    let name = format!("perf-cross-{adaptive}-{tasks}-{}", wall_micros());
    let (tasks_arg, rounds_arg) = (tasks.to_string(), rounds.to_string());
    let outputs = run_workers(
        uri,
        PROCESSES,
        &[
            "handoff",
            &name,
            &adaptive.to_string(),
            &tasks_arg,
            &rounds_arg,
        ],
    )
    .await?;
    let events = outputs.iter().flat_map(|output| {
        output.lines().filter_map(|line| {
            let (kind, at) = line.split_once(' ')?;
            let kind = ["acquired", "released"].contains(&kind).then_some(kind)?;
            Some((Micros(at.parse().ok()?), kind == "released"))
        })
    });
    let latencies = handoff_latencies(events);
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "| cross-process handoff, {PROCESSES} processes × {tasks} tasks, {} backoff{label} ({} handoffs) | p50 {} = {:.2} round trips, p99 {} = {:.2} round trips |",
        if adaptive { "adaptive" } else { "random" },
        latencies.len(),
        ms(p50),
        p50.as_secs_f64() / rtt.as_secs_f64(),
        ms(p99),
        p99.as_secs_f64() / rtt.as_secs_f64(),
    );
    Ok(())
}

/// 32 contenders (4 processes × 8 tasks): attempts sent per successful acquisition. `label` ends
/// the row's description.
async fn commands_per_acquisition(uri: &str, mode: &str, label: &str) -> Result<()> {
    let name = format!("perf-contended-{mode}-{}", wall_micros());
    let outputs = run_workers(uri, 4, &["handoff", &name, mode, "8", "5"]).await?;
    let (mut sent, mut acquisitions) = (0_usize, 0_usize);
    // Each acquisition's request and grant times, across the processes.
    let mut waits: Vec<(u64, u64)> = Vec::new();
    for output in &outputs {
        for line in output.lines().filter(|line| line.starts_with("waited ")) {
            let mut times = line
                .split(' ')
                .skip(1)
                .filter_map(|n| n.parse::<u64>().ok());
            if let (Some(requested), Some(acquired)) = (times.next(), times.next()) {
                waits.push((requested, acquired));
            }
        }
    }
    // Served before a waiter that had asked earlier and was still waiting.
    let overtakes = waits
        .iter()
        .filter(|&&(requested, acquired)| {
            waits
                .iter()
                .any(|&(earlier, served)| earlier < requested && served > acquired)
        })
        .count();
    for output in &outputs {
        if let Some(line) = output.lines().find(|line| line.starts_with("commands ")) {
            let mut numbers = line
                .split(' ')
                .skip(1)
                .map(|n| n.parse::<usize>().unwrap_or(0));
            sent += numbers.next().unwrap_or(0);
            acquisitions += numbers.next().unwrap_or(0);
        }
    }
    println!(
        "| commands per acquisition, 32 contenders (4 processes × 8 tasks, hold 2 ms), {}{label} | **{:.2}** ({sent} commands / {acquisitions} acquisitions); {overtakes} of {} served before a waiter that asked earlier |",
        match mode {
            "true" => "adaptive backoff",
            "fair" => "a fair lock",
            _ => "default options",
        },
        sent as f64 / acquisitions.max(1) as f64,
        waits.len(),
    );
    Ok(())
}

/// A fair lock costs nothing while it is free: `try_acquire` + release of a fair lock against an
/// unfair one and raw driver calls, in the same run.
async fn fair_uncontended(database: &Database, commands: &CommandCounter) -> Result<()> {
    const CYCLES: usize = 200;
    let unfair = Provider::new(database).create_lock(format!("perf-unfair-{}", wall_micros()));
    let fair = Provider::new(database)
        .with_options(LockOptions::builder().fair(true).build()?)
        .create_lock(format!("perf-fair-{}", wall_micros()));
    let raw: Collection<Document> = database.collection("raw");
    with_ttl_index(&raw).await?;
    let (mut fair_times, mut unfair_times, mut driver) = (Vec::new(), Vec::new(), Vec::new());
    commands.reset();
    for _ in 0..CYCLES {
        let started = Instant::now();
        fair.try_acquire().await?.ok_or("free")?.release().await?;
        fair_times.push(started.elapsed());
    }
    let fair_commands = commands.lock_commands() as f64 / CYCLES as f64;
    for _ in 0..CYCLES {
        let started = Instant::now();
        unfair.try_acquire().await?.ok_or("free")?.release().await?;
        unfair_times.push(started.elapsed());
        let started = Instant::now();
        raw_cycle(&raw).await?;
        driver.push(started.elapsed());
    }
    for samples in [&mut fair_times, &mut unfair_times, &mut driver] {
        samples.sort();
    }
    let (fair_time, unfair_time, driver) = (
        percentile(&fair_times, 0.5),
        percentile(&unfair_times, 0.5),
        percentile(&driver, 0.5),
    );
    println!(
        "| fair lock, uncontended: `try_acquire` + release, median ({CYCLES} cycles) | {} ({fair_commands:.1} commands) vs unfair {} vs raw `find_one_and_update` + `update_one` {}: **{:.2}×** raw, {:.2}× unfair |",
        ms(fair_time),
        ms(unfair_time),
        ms(driver),
        fair_time.as_secs_f64() / driver.as_secs_f64(),
        fair_time.as_secs_f64() / unfair_time.as_secs_f64(),
    );
    Ok(())
}

async fn run_workers(uri: &str, processes: usize, args: &[&str]) -> Result<Vec<String>> {
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..processes)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .arg("worker")
                .args(args)
                .env("MONGODB_URI", uri)
                .output()
        })
        .collect();
    let mut outputs = Vec::new();
    for child in children {
        let output = child.await?;
        if !output.status.success() {
            return Err(
                format!("worker failed: {}", String::from_utf8_lossy(&output.stderr)).into(),
            );
        }
        outputs.push(String::from_utf8(output.stdout)?);
    }
    Ok(outputs)
}

/// `worker handoff <name> <mode> <tasks> <rounds>` (mode `true`: adaptive backoff, `fair`: a fair
/// lock): acquire, hold 2 ms, release; prints `acquired <µs>` / `released <µs>` events, `waited
/// <requested µs> <acquired µs>` per acquisition, and `commands <lock commands> <acquisitions>`.
async fn worker(args: &[String]) -> Result<()> {
    let [kind, name, adaptive, tasks, rounds] = args else {
        return Err(format!("bad worker arguments {args:?}").into());
    };
    if kind != "handoff" {
        return Err(format!("unknown worker {kind}").into());
    }
    let (tasks, rounds): (usize, usize) = (tasks.parse()?, rounds.parse()?);
    let (database, commands) = counting_database(&server::uri()).await?;
    let lock =
        MongoDistributedLock::new(name.as_str(), &database).with_options(worker_options(adaptive));
    let events = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let (lock, events) = (lock.clone(), Arc::clone(&events));
            tokio::spawn(async move {
                for _ in 0..rounds {
                    let requested = wall_micros();
                    let guard = lock.acquire().await?;
                    let acquired = wall_micros();
                    {
                        let mut events = events.lock().unwrap();
                        events.push(format!("acquired {acquired}"));
                        events.push(format!("waited {requested} {acquired}"));
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    events
                        .lock()
                        .unwrap()
                        .push(format!("released {}", wall_micros()));
                    guard.release().await?;
                }
                Ok::<_, distributed_lock_mongodb::Error>(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    for event in events.lock().unwrap().iter() {
        println!("{event}");
    }
    println!("commands {} {}", commands.lock_commands(), tasks * rounds);
    Ok(())
}

/// Renewal commands sent per cadence while holding `locks` locks from one provider.
async fn renewals_per_cadence(
    database: &Database,
    commands: &CommandCounter,
    locks: usize,
    cadence_s: u64,
    expiry_s: u64,
) -> Result<()> {
    let collection = format!("renewals_{locks}");
    let (cadence, expiry) = (
        Duration::from_secs(cadence_s),
        Duration::from_secs(expiry_s),
    );
    let options = LockOptions::builder()
        .expiry(expiry)
        .extension_cadence(cadence)
        .build()?;
    let provider = Provider::new(database)
        .with_collection(collection.as_str())
        .with_options(options);
    let started = Instant::now();
    // Sixteen acquisitions in flight at a time: a service taking its locks at start.
    let guards: Vec<_> = futures::stream::iter(0..locks)
        .map(|i| {
            let lock = provider.create_lock(format!("entity-{i}"));
            async move { lock.acquire().await }
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    let acquired = started.elapsed();
    commands.reset();
    // A window of whole cadences holds that many ticks, or one more at its boundary.
    let cadences = 6;
    tokio::time::sleep(cadence * cadences).await;
    // One lease per round is renewed by a `findAndModify` (it reads the server's clock), the
    // others by `update`s.
    let (single, batched) = (commands.count("findAndModify"), commands.count("update"));
    let renewals = single + batched;
    let lost = guards.iter().filter(|guard| guard.is_lost()).count();
    let releasing = Instant::now();
    futures::stream::iter(guards)
        .map(|guard| guard.release())
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    let released = releasing.elapsed();
    let raw = raw_update_naming(database, locks).await?;
    println!(
        "| renewal commands per cadence, holding {locks} lock{} (cadence {cadence_s} s, expiry {expiry_s} s) | **{:.1}** ({single} findAndModify + {batched} update in {cadences} cadences; {lost} lost; acquired in {:.1} s and released in {:.1} s, 16 at a time; a raw `update_many` naming {locks} documents by `$in`: {}) |",
        if locks == 1 { "" } else { "s" },
        renewals as f64 / f64::from(cadences),
        acquired.as_secs_f64(),
        released.as_secs_f64(),
        ms(raw),
    );
    Ok(())
}

/// One raw `update_many` whose filter names `count` documents by `$in` (as a renewal round
/// does), over a collection of that many: the server's own cost of such a round.
async fn raw_update_naming(database: &Database, count: usize) -> Result<Duration> {
    let raw: Collection<Document> = database.collection(&format!("raw_in_{count}"));
    raw.drop().await?;
    let names: Vec<String> = (0..count).map(|i| format!("entity-{i}")).collect();
    raw.insert_many(
        names
            .iter()
            .map(|name| doc! { "_id": name, "expiresAt": DateTime::now() }),
    )
    .await?;
    let started = Instant::now();
    raw.update_many(
        doc! { "_id": { "$in": &names } },
        vec![doc! { "$set": { "expiresAt": "$$NOW" } }],
    )
    .await?;
    Ok(started.elapsed())
}

/// Heap bytes per held guard, including its share of the renewal loop's state.
async fn memory_per_guard(database: &Database) -> Result<()> {
    const GUARDS: usize = 1_000;
    static SINK: AtomicUsize = AtomicUsize::new(0);
    let provider = Provider::new(database)
        .with_collection("memory")
        .with_options(
            LockOptions::builder()
                .expiry(Duration::from_secs(600))
                .build()?,
        );
    let names: Vec<String> = (0..GUARDS).map(|i| format!("m-{i:04}")).collect();
    let locks: Vec<MongoDistributedLock> = names
        .iter()
        .map(|name| provider.create_lock(name.as_str()))
        .collect();
    // Warm up the client's connection pool and buffers, then measure holding vs not holding.
    for lock in locks.iter().take(10) {
        lock.acquire().await?.release().await?;
    }
    let mut guards = Vec::with_capacity(GUARDS);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = LIVE_BYTES.load(Ordering::SeqCst);
    for lock in &locks {
        guards.push(lock.acquire().await?);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let holding = LIVE_BYTES.load(Ordering::SeqCst);
    SINK.fetch_add(guards.len(), Ordering::Relaxed);
    for guard in guards {
        guard.release().await?;
    }
    let per_guard = (holding - before) as f64 / GUARDS as f64;
    println!(
        "| memory per held guard (heap, {GUARDS} guards with 6-character names, incl. renewal state) | **{per_guard:.0} B** |"
    );
    Ok(())
}
