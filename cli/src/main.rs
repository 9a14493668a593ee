//! `dlock`: the operators' tool for the locks of `distributed-lock-mongodb`, on the library's own
//! administration API (`Provider::held_locks_matching`, `force_release_holder`, `purge_expired`).
//! Run `dlock --help` for the commands, their options and the exit codes.

mod output;

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use distributed_lock_mongodb::{
    DEFAULT_LOCK_COLLECTION, DEFAULT_RW_COLLECTION, DEFAULT_SEMAPHORE_COLLECTION, Error,
    LockFilter, LockKind, LockStatus, LockWatch, Provider,
};
use mongodb::bson::doc;
use mongodb::options::ClientOptions;
use mongodb::{Client, Database};

const EXIT_CODES: &str = "\
Exit codes:
  0  done (a list may be empty)
  1  not found: unknown collection, unknown lock or holder, nothing held to release
  2  bad usage or input: unknown option, no or invalid connection string, invalid name
  3  MongoDB failed: unreachable, or refused a command (the message says what was done before)
  4  not confirmed: the question was answered no (or stdin closed); nothing changed
  5  refused: a collection does not look like a lock collection (purge); nothing changed";

/// Inspect and free the locks that distributed-lock-mongodb keeps in MongoDB: exclusive locks,
/// reader-writer locks and semaphores (one collection per kind, the library's defaults unless
/// named).
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = EXIT_CODES)]
struct Cli {
    /// The MongoDB connection string (its password is never printed).
    #[arg(long, env = "MONGODB_URI", hide_env_values = true, global = true)]
    uri: Option<String>,

    /// The database of the lock collections [default: the connection string's database].
    #[arg(long, short, global = true)]
    database: Option<String>,

    /// The exclusive locks' collection [default: distributed_locks].
    #[arg(long, value_name = "NAME", global = true)]
    collection: Option<String>,

    /// The reader-writer locks' collection [default: distributed_rw_locks].
    #[arg(long, value_name = "NAME", global = true)]
    reader_writer_collection: Option<String>,

    /// The semaphores' collection [default: distributed_semaphores].
    #[arg(long, value_name = "NAME", global = true)]
    semaphore_collection: Option<String>,

    /// Print JSON (one document: an array of holders, or the outcome) instead of a table.
    #[arg(long, global = true)]
    json: bool,

    /// Give up on an unreachable server after this many seconds, and on the whole command (a
    /// server that accepts connections but stalls) after six times as long.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, global = true)]
    timeout: u64,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the held locks of every kind, one row per holder.
    ///
    /// Each row: the lock's name and kind, the holder's lock id, fencing token, time left and
    /// how long it has held the lock (by server time), and the details it stored.
    List {
        /// Only holders of this kind.
        #[arg(long)]
        kind: Option<Kind>,
        /// Only holders whose stored details name this owner.
        #[arg(long)]
        owner: Option<String>,
        /// Only holders that acquired their lease at least this long ago, by server time
        /// (`90s`, `15m`, `6h`, `2d`; a bare number is seconds).
        #[arg(long, value_name = "AGE", value_parser = parse_age)]
        held_for_at_least: Option<Duration>,
    },
    /// Show one lock's holders (or, if free, an exclusive lock's last holder).
    ///
    /// Every holder under that name, of every kind (or of `--kind`); for an exclusive lock
    /// nobody holds, its last holder and fencing token.
    Show {
        /// The lock's name.
        name: String,
        /// Only this kind of lock.
        #[arg(long)]
        kind: Option<Kind>,
    },
    /// Force-release one lock's holders (dangerous; asks first).
    ///
    /// Ends the leases of all its holders, or of the one `--holder` names, as their own
    /// release would. Dangerous: a holder finds out at its next renewal and may act as the
    /// holder until then (up to one extension cadence); fence what the lock protects. Asks for
    /// confirmation unless `--yes`. Holders that released or changed since the read are left
    /// alone (a lock id names one acquisition). A holder's `min_hold` window (a job's) stays:
    /// the lock is kept taken until the window ends, as after the holder's own release.
    Release {
        /// The lock's name.
        name: String,
        /// Only the holder with this lock id (as `list` and `show` print it).
        #[arg(long, value_name = "LOCK_ID")]
        holder: Option<String>,
        /// Only holders of this kind.
        #[arg(long)]
        kind: Option<Kind>,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
    },
    /// Ask the holder of an exclusive lock (or, with `--holder`, one semaphore place) to let go.
    ///
    /// The holder's guard is told (`revocation_requested`); once `--grace` is over its lease is
    /// not renewed any more, so the lock is free at the lease's end at the latest, and the
    /// holder's lost signal fires before anyone else can take it: unlike `release`, two holders
    /// never overlap. The request keeps the lock for nobody. Prints the holder with the request;
    /// exits 1 if nobody holds the lock (or the holder named).
    Revoke {
        /// The lock's name.
        name: String,
        /// Only the holder with this lock id (as `list` and `show` print it): an exclusive
        /// lock's, or a semaphore's place.
        #[arg(long, value_name = "LOCK_ID")]
        holder: Option<String>,
        /// How long the holder has to let go (`30s`, `5m`; a bare number is seconds).
        #[arg(long, value_name = "GRACE", value_parser = parse_age, default_value = "30")]
        grace: Duration,
    },
    /// Follow one lock's holders live (or, without a name, every held lock of the
    /// collections), until Ctrl-C or until the reader of the output goes away.
    ///
    /// Prints the holders now, then again at every change: at once through the collections'
    /// change streams where the server has them (a replica set or sharded cluster), otherwise
    /// read every `--every`. The waiters other processes can see are shown too: a
    /// reader-writer lock's waiting writer, a semaphore's waiter for several places. Each print
    /// is the time (this machine's clock), a table and the waiters, or with `--json` one line
    /// per change (a JSON document: `at`, `name` (null for every lock), `holders`, `waiters`).
    /// Exits 0.
    Watch {
        /// The lock's name [default: every lock].
        name: Option<String>,
        /// Only this kind of lock.
        #[arg(long)]
        kind: Option<Kind>,
        /// How often to read the holders where no change stream tells (`1s`, `30s`; a bare
        /// number is seconds).
        #[arg(long, value_name = "INTERVAL", value_parser = parse_age, default_value = "5")]
        every: Duration,
    },
    /// Delete lock documents whose last lease ended over a day ago (asks first).
    ///
    /// In each lock collection, what the TTL index would delete: never a held lock, nor a
    /// document whose fencing token may still matter, nor a document that is not shaped like
    /// a lock document of the collection's kind. A collection most of whose first documents
    /// are not lock documents (a wrong collection name) is refused with exit code 5, before
    /// anything is deleted. Asks for confirmation, showing the count and the first names,
    /// unless `--yes`.
    Purge {
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
        /// Only show what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// A kind of lock holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// A holder of an exclusive lock.
    Exclusive,
    /// The writer of a reader-writer lock.
    Write,
    /// A reader of a reader-writer lock.
    Read,
    /// A holder of a semaphore place.
    Semaphore,
}

impl From<Kind> for LockKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Exclusive => LockKind::Exclusive,
            Kind::Write => LockKind::Write,
            Kind::Read => LockKind::Read,
            Kind::Semaphore => LockKind::Semaphore,
        }
    }
}

/// Why a command did not do its job; each has its exit code.
#[derive(Debug)]
enum Failure {
    NotFound(String),
    Usage(String),
    Server(String),
    NotConfirmed,
    Refused(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::NotFound(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Server(_) => 3,
            Failure::NotConfirmed => 4,
            Failure::Refused(_) => 5,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::NotFound(message)
            | Failure::Usage(message)
            | Failure::Server(message)
            | Failure::Refused(message) => message,
            Failure::NotConfirmed => "not confirmed: nothing changed",
        }
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidArgument(_)
            | Error::InvalidCollectionName { .. }
            | Error::InvalidOptions(_) => Failure::Usage(error.to_string()),
            Error::NotALockCollection { .. } => Failure::Refused(error.to_string()),
            other => Failure::Server(other.to_string()),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome =
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| Failure::Server(format!("could not start a runtime: {error}")))
            .and_then(|runtime| {
                // A watch runs until it is stopped: its reads have the driver's limits only.
                let limit = match cli.command {
                    Command::Watch { .. } => Duration::MAX,
                    _ => Duration::from_secs(cli.timeout.max(1).saturating_mul(6)),
                };
                runtime.block_on(async {
                    tokio::time::timeout(limit, run(cli)).await.unwrap_or_else(|_| {
                    Err(Failure::Server(format!(
                        "MongoDB did not finish the command within {} s; what it did before is \
                         unknown (run `dlock list` to see)",
                        limit.as_secs()
                    )))
                })
                })
            });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("dlock: {}", failure.message());
            ExitCode::from(failure.exit_code())
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let collections = Collections::of(&cli);
    let database = connect(&cli).await?;
    let provider = Provider::new(&database)
        .with_collection(collections.exclusive.as_str())
        .with_reader_writer_collection(collections.reader_writer.as_str())
        .with_semaphore_collection(collections.semaphore.as_str());
    // A name MongoDB would refuse is bad input, not a collection that is missing.
    provider.validate()?;
    collections.check(&database).await?;
    match cli.command {
        Command::List {
            kind,
            owner,
            held_for_at_least,
        } => {
            let mut filter = with_kind(LockFilter::new().including_kept(), kind);
            if let Some(owner) = owner {
                filter = filter.with_owner(owner);
            }
            if let Some(age) = held_for_at_least {
                filter = filter.with_min_held_for(age);
            }
            let holders = provider.held_locks_matching(&filter).await?;
            output::holders(&holders, cli.json, "no lock is held");
            Ok(())
        }
        Command::Show { name, kind } => {
            let found = show(&provider, &database, &collections, &name, kind).await?;
            output::holders(&found, cli.json, &format!("lock {name:?} is free"));
            Ok(())
        }
        Command::Release {
            name,
            holder,
            kind,
            yes,
        } => release(&provider, &name, holder.as_deref(), kind, yes, cli.json).await,
        Command::Revoke {
            name,
            holder,
            grace,
        } => {
            let asked = match holder {
                None => provider.request_revocation(&name, grace).await?,
                Some(wanted) => {
                    let holders = provider
                        .held_locks_matching(&LockFilter::new().with_name(&name))
                        .await?;
                    let found = holders
                        .iter()
                        .find(|held| held.lock_id.as_deref() == Some(wanted.as_str()));
                    match found {
                        Some(found) => provider.request_revocation_of(found, grace).await?,
                        None => None,
                    }
                }
            };
            match asked {
                Some(holder) => {
                    output::holders(&[holder], cli.json, "");
                    Ok(())
                }
                None => Err(Failure::NotFound(format!(
                    "lock {name:?} is not held (by that holder): nobody to ask"
                ))),
            }
        }
        Command::Watch { name, kind, every } => {
            if every.is_zero() {
                return Err(Failure::Usage("--every must be more than zero".to_owned()));
            }
            let marks = Marks::of(&database, &collections);
            match name {
                Some(name) => watch(&provider, &marks, &name, kind, every, cli.json).await,
                None => watch_all(&provider, &marks, &collections, kind, every, cli.json).await,
            }
        }
        Command::Purge { yes, dry_run } => {
            let due = provider.purgeable(PURGE_NAMES_SHOWN).await?;
            if dry_run {
                output::would_purge(&due, cli.json);
                return Ok(());
            }
            if !yes {
                if due.count == 0 {
                    // Nothing to ask about, and nothing deleted unasked.
                    output::purged(0, cli.json);
                    return Ok(());
                }
                let question = format!(
                    "Delete {} of {} whose last lease ended more than a day ago ({})?",
                    output::count_of(due.count, "expired lock document"),
                    collections.listed(),
                    output::some_names(&due)
                );
                confirm(false, &question)?;
            }
            let deleted = provider.purge_expired().await?;
            output::purged(deleted, cli.json);
            Ok(())
        }
    }
}

/// Prints lock `name`'s holders (of `kind`, or of every kind) and waiters now and at every
/// change, until Ctrl-C or a closed output.
async fn watch(
    provider: &Provider,
    marks: &Marks,
    name: &str,
    kind: Option<Kind>,
    every: Duration,
    json: bool,
) -> Result<(), Failure> {
    let wants = |wanted: &[Kind]| kind.is_none_or(|kind| wanted.contains(&kind));
    let mut watches = Vec::new();
    if wants(&[Kind::Exclusive]) {
        watches.push(provider.create_lock(name).watch(every).await?);
    }
    if wants(&[Kind::Read, Kind::Write]) {
        watches.push(
            provider
                .create_reader_writer_lock(name)
                .watch(every)
                .await?,
        );
    }
    if wants(&[Kind::Semaphore]) {
        // The count only matters to acquisitions; a watch reads the holders.
        watches.push(provider.create_semaphore(name, 1).watch(every).await?);
    }
    let wanted = |holder: &LockStatus| kind.is_none_or(|kind| LockKind::from(kind) == holder.kind);
    let mut tick = tokio::time::interval(every);
    let mut shown = None;
    loop {
        let holders: Vec<LockStatus> = (watches.iter())
            .flat_map(|watch| watch.holders())
            .filter(|holder| wanted(holder))
            .collect();
        let now = (holders, marks.read(Some(name), kind).await?);
        if shown.as_ref() != Some(&now) {
            if !output::watched(Some(name), &now.0, &now.1, json) {
                return Ok(());
            }
            shown = Some(now);
        }
        // (A waiter's mark changes no holder: the tick reads it again.)
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            result = first_change(&mut watches) => result?,
            _ = tick.tick() => {}
        }
    }
}

/// Prints every held lock of the collections (of `kind`, or of every kind) and the waiters now
/// and at every change (told by the collections' change streams where the server has them,
/// read every `every` otherwise), until Ctrl-C or a closed output.
async fn watch_all(
    provider: &Provider,
    marks: &Marks,
    collections: &Collections,
    kind: Option<Kind>,
    every: Duration,
    json: bool,
) -> Result<(), Failure> {
    use futures::StreamExt;
    let filter = with_kind(LockFilter::new(), kind);
    let mut changes = marks.changes(collections).await;
    let mut tick = tokio::time::interval(every);
    let mut shown = None;
    loop {
        let now = (
            provider.held_locks_matching(&filter).await?,
            marks.read(None, kind).await?,
        );
        if shown.as_ref() != Some(&now) {
            if !output::watched(None, &now.0, &now.1, json) {
                return Ok(());
            }
            shown = Some(now);
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            Some(()) = changes.next(), if !changes.is_empty() => {}
            _ = tick.tick() => {}
        }
    }
}

/// Resolves when any of `watches` sees its holders change.
async fn first_change(watches: &mut [LockWatch]) -> Result<(), Failure> {
    let changes = watches.iter_mut().map(|watch| Box::pin(watch.changed()));
    let (result, _, _) = futures::future::select_all(changes).await;
    Ok(result?)
}

/// A waiter other processes can see: the mark a reader-writer lock's waiting writer, or a
/// semaphore's waiter for several places, keeps in the lock's document.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Waiter {
    pub(crate) name: String,
    pub(crate) kind: LockKind,
    /// The mark's id (one per wait).
    pub(crate) id: String,
    /// The places a semaphore's waiter waits for.
    pub(crate) places: Option<i64>,
    /// How long the mark lasts unless its waiter's next attempt renews it.
    pub(crate) remaining: Duration,
}

/// Where the waiters' marks are: the reader-writer and semaphore collections.
struct Marks {
    reader_writer: mongodb::Collection<mongodb::bson::Document>,
    semaphore: mongodb::Collection<mongodb::bson::Document>,
}

impl Marks {
    fn of(database: &Database, collections: &Collections) -> Marks {
        Marks {
            reader_writer: database.collection(&collections.reader_writer),
            semaphore: database.collection(&collections.semaphore),
        }
    }

    /// The live marks (of lock `name`, or of every lock; of `kind`, or of every kind), read
    /// from the primary at one server instant per collection.
    async fn read(&self, name: Option<&str>, kind: Option<Kind>) -> Result<Vec<Waiter>, Failure> {
        let mut waiters = Vec::new();
        if kind.is_none_or(|kind| kind == Kind::Write) {
            waiters.extend(
                read_marks(&self.reader_writer, "waitingWriter", LockKind::Write, name).await?,
            );
        }
        if kind.is_none_or(|kind| kind == Kind::Semaphore) {
            waiters
                .extend(read_marks(&self.semaphore, "waiting", LockKind::Semaphore, name).await?);
        }
        Ok(waiters)
    }

    /// Every change of the lock collections, as a stream of wake-ups (empty where the server
    /// has no change streams: a standalone server).
    async fn changes(
        &self,
        collections: &Collections,
    ) -> futures::stream::SelectAll<futures::stream::BoxStream<'static, ()>> {
        use futures::StreamExt;
        let database = self
            .reader_writer
            .client()
            .database(&self.reader_writer.namespace().db);
        let mut all = futures::stream::SelectAll::new();
        for name in collections.all() {
            let collection = database.collection::<mongodb::bson::Document>(name);
            if let Ok(stream) = collection.watch().await {
                all.push(stream.map(|_| ()).boxed());
            }
        }
        all
    }
}

/// The live marks in `field` of the documents of `collection` (only lock `name`'s, if given).
async fn read_marks(
    collection: &mongodb::Collection<mongodb::bson::Document>,
    field: &str,
    kind: LockKind,
    name: Option<&str>,
) -> Result<Vec<Waiter>, Failure> {
    use futures::TryStreamExt;
    let expires_at = format!("${field}.expiresAt");
    let mut live = doc! { "$expr": { "$gt": [&expires_at, "$$NOW"] } };
    if let Some(name) = name {
        live.insert("_id", name);
    }
    let rows: Vec<mongodb::bson::Document> = collection
        .aggregate([
            doc! { "$match": live },
            doc! { "$project": { "mark": format!("${field}"), "now": "$$NOW" } },
            doc! { "$sort": { "_id": 1 } },
        ])
        .selection_criteria(mongodb::options::SelectionCriteria::ReadPreference(
            mongodb::options::ReadPreference::Primary,
        ))
        .await
        .map_err(|error| Failure::Server(error.to_string()))?
        .try_collect()
        .await
        .map_err(|error| Failure::Server(error.to_string()))?;
    Ok(rows
        .iter()
        .filter_map(|row| {
            let mark = row.get_document("mark").ok()?;
            let now = row.get_datetime("now").ok()?;
            let ends = mark.get_datetime("expiresAt").ok()?;
            let left = ends.timestamp_millis() - now.timestamp_millis();
            Some(Waiter {
                name: row.get("_id").map_or_else(String::new, |id| match id {
                    mongodb::bson::Bson::String(name) => name.clone(),
                    other => other.to_string(),
                }),
                kind,
                id: mark.get_str("id").unwrap_or_default().to_owned(),
                places: mark.get("places").and_then(mongodb::bson::Bson::as_i64),
                remaining: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
            })
        })
        .collect())
}

/// How many names of the documents to delete the purge's question and dry run show per
/// collection.
const PURGE_NAMES_SHOWN: usize = 5;

/// The lock collections, and which of them were named on the command line.
struct Collections {
    exclusive: String,
    reader_writer: String,
    semaphore: String,
    named: Vec<String>,
}

impl Collections {
    fn of(cli: &Cli) -> Self {
        let named: Vec<String> = [
            &cli.collection,
            &cli.reader_writer_collection,
            &cli.semaphore_collection,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        let or = |name: &Option<String>, default: &str| name.clone().unwrap_or(default.to_owned());
        Collections {
            exclusive: or(&cli.collection, DEFAULT_LOCK_COLLECTION),
            reader_writer: or(&cli.reader_writer_collection, DEFAULT_RW_COLLECTION),
            semaphore: or(&cli.semaphore_collection, DEFAULT_SEMAPHORE_COLLECTION),
            named,
        }
    }

    fn all(&self) -> [&str; 3] {
        [&self.exclusive, &self.reader_writer, &self.semaphore]
    }

    fn listed(&self) -> String {
        self.all().join(", ")
    }

    /// A collection named on the command line must exist (a typo must not read as "nothing
    /// held"); and at least one of the three must, or the database is likely the wrong one.
    async fn check(&self, database: &Database) -> Result<(), Failure> {
        let existing = database
            .list_collection_names()
            // Only what this user may read: enough, and no listCollections privilege needed.
            .authorized_collections(true)
            .await
            .map_err(|error| server_failure(database, &error))?;
        if let Some(missing) = self.named.iter().find(|name| !existing.contains(name)) {
            return Err(Failure::NotFound(format!(
                "collection {missing:?} does not exist in database {:?}",
                database.name()
            )));
        }
        if !self
            .all()
            .iter()
            .any(|name| existing.iter().any(|e| e == name))
        {
            return Err(Failure::NotFound(format!(
                "database {:?} has none of the lock collections ({}): check --database and the \
                 collection options",
                database.name(),
                self.listed()
            )));
        }
        Ok(())
    }
}

async fn connect(cli: &Cli) -> Result<Database, Failure> {
    let Some(uri) = cli.uri.as_deref() else {
        return Err(Failure::Usage(
            "no connection string: pass --uri or set MONGODB_URI".to_owned(),
        ));
    };
    let mut options = ClientOptions::parse(uri)
        .await
        .map_err(|error| Failure::Usage(format!("invalid connection string: {error}")))?;
    let timeout = Duration::from_secs(cli.timeout.max(1));
    options.server_selection_timeout = Some(timeout);
    options.connect_timeout = Some(timeout);
    options.app_name = Some("dlock".to_owned());
    let hosts: Vec<String> = options.hosts.iter().map(ToString::to_string).collect();
    let _ = HOSTS.set(hosts.join(","));
    let name = cli
        .database
        .clone()
        .or_else(|| options.default_database.clone())
        .ok_or_else(|| {
            Failure::Usage(
                "no database: pass --database or name one in the connection string".to_owned(),
            )
        })?;
    let client = Client::with_options(options)
        .map_err(|error| Failure::Usage(format!("invalid connection options: {error}")))?;
    Ok(client.database(&name))
}

/// A failed read or write, named by the server's hosts (never the connection string, which may
/// hold a password).
fn server_failure(database: &Database, error: &mongodb::error::Error) -> Failure {
    let hosts = HOSTS.get().map_or("", String::as_str);
    Failure::Server(format!(
        "MongoDB at {hosts} (database {:?}) failed: {error}",
        database.name()
    ))
}

/// The hosts of the connection string, for messages.
static HOSTS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn with_kind(filter: LockFilter, kind: Option<Kind>) -> LockFilter {
    match kind {
        Some(kind) => filter.with_kind(kind.into()),
        None => filter,
    }
}

/// The holders of lock `name`; for a free exclusive lock, its last holder; for a free lock of
/// another kind, nothing (it exists). Not found when no collection has a lock of that name.
async fn show(
    provider: &Provider,
    database: &Database,
    collections: &Collections,
    name: &str,
    kind: Option<Kind>,
) -> Result<Vec<LockStatus>, Failure> {
    let holders = provider
        .held_locks_matching(&with_kind(
            LockFilter::new().with_name(name).including_kept(),
            kind,
        ))
        .await?;
    if !holders.is_empty() {
        return Ok(holders);
    }
    let wants = |wanted: Kind| kind.is_none_or(|kind| kind == wanted);
    if wants(Kind::Exclusive)
        && let Some(last) = provider.status(name).await?
    {
        return Ok(vec![last]);
    }
    let others = [
        (
            &collections.reader_writer,
            wants(Kind::Read) || wants(Kind::Write),
        ),
        (&collections.semaphore, wants(Kind::Semaphore)),
    ];
    for (collection, wanted) in others {
        let documents = database.collection::<mongodb::bson::Document>(collection);
        if wanted
            && documents
                .count_documents(doc! { "_id": name })
                .await
                .map_err(|error| server_failure(database, &error))?
                > 0
        {
            return Ok(Vec::new());
        }
    }
    Err(Failure::NotFound(format!(
        "no lock named {name:?} in {}",
        collections.listed()
    )))
}

async fn release(
    provider: &Provider,
    name: &str,
    holder: Option<&str>,
    kind: Option<Kind>,
    yes: bool,
    json: bool,
) -> Result<(), Failure> {
    let (mut holders, kept): (Vec<LockStatus>, Vec<LockStatus>) = provider
        .held_locks_matching(&with_kind(
            LockFilter::new().with_name(name).including_kept(),
            kind,
        ))
        .await?
        .into_iter()
        .partition(LockStatus::is_held);
    if holders.is_empty() {
        let kept_until = kept.iter().find_map(|kept| kept.expires_at);
        return Err(Failure::NotFound(match kept_until {
            Some(until) => format!(
                "lock {name:?} is not held, but its last holder's min_hold window keeps it taken \
                 until {} (server time): nothing to release (the window is a promise about the \
                 work, not a lease)",
                output::time(until)
            ),
            None => format!("lock {name:?} is not held: nothing to release"),
        }));
    }
    if let Some(wanted) = holder {
        let ids: Vec<&str> = holders
            .iter()
            .filter_map(|h| h.lock_id.as_deref())
            .collect();
        if !ids.contains(&wanted) {
            return Err(Failure::NotFound(format!(
                "lock {name:?} has no holder with lock id {wanted:?} (its holders: {})",
                ids.join(", ")
            )));
        }
        holders.retain(|h| h.lock_id.as_deref() == Some(wanted));
    }
    if !yes {
        // On stderr with the question: stdout keeps only the outcome (`--json` stays parseable).
        eprint!("{}", output::table(&holders));
        let mut question = format!(
            "Force-release {} of {name:?}? Each finds out at its next renewal and may act as the \
             holder until then.",
            output::count(holders.len(), "holder")
        );
        if let Some(until) = window(&holders) {
            question.push_str(&format!(
                " The running holder loses its lease, but its min_hold window stays: nobody \
                 can take the lock until {} (server time).",
                output::time(until)
            ));
        }
        confirm(false, &question)?;
    }
    let (mut released, mut gone) = (Vec::new(), Vec::new());
    for (done, holder) in holders.iter().enumerate() {
        let id = holder.lock_id.clone().unwrap_or_default();
        match provider.force_release_holder(holder).await {
            Ok(true) => released.push(id),
            Ok(false) => gone.push(id),
            // Say what was done before the failure: some holders may be released already.
            Err(error) => {
                let left: Vec<&str> = holders[done..]
                    .iter()
                    .filter_map(|holder| holder.lock_id.as_deref())
                    .collect();
                return Err(Failure::Server(format!(
                    "{error}; released before it: {}; not released (or unknown): {}",
                    listed(&released),
                    left.join(", ")
                )));
            }
        }
    }
    output::released(name, &released, &gone, window(&holders), json);
    if released.is_empty() {
        return Err(Failure::NotFound(format!(
            "nothing released: every holder of {name:?} had already released or changed (or \
             its document is not shaped like a lock document, which is never touched)"
        )));
    }
    Ok(())
}

/// The latest end of a `min_hold` window among `holders`, if one is still ahead of its lease.
fn window(holders: &[LockStatus]) -> Option<mongodb::bson::DateTime> {
    holders
        .iter()
        .filter_map(|holder| holder.min_hold_until)
        .filter(|until| *until > mongodb::bson::DateTime::now())
        .max()
}

fn listed(ids: &[String]) -> String {
    if ids.is_empty() {
        "none".to_owned()
    } else {
        ids.join(", ")
    }
}

/// Asks `question` on the terminal (stderr) unless `yes`; anything but `y` or `yes` on stdin
/// (or a closed stdin) is a no.
fn confirm(yes: bool, question: &str) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(Failure::NotConfirmed),
    }
}

/// `90`, `90s`, `15m`, `6h`, `2d`.
fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let seconds_per = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 60 * 60,
        "d" => 24 * 60 * 60,
        _ => {
            return Err(format!(
                "{text:?}: use a number of seconds, or 90s, 15m, 6h, 2d"
            ));
        }
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: use a number of seconds, or 90s, 15m, 6h, 2d"))?;
    number
        .checked_mul(seconds_per)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_with_or_without_a_unit() {
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_age("6h"), Ok(Duration::from_secs(6 * 3600)));
        assert_eq!(parse_age("2d"), Ok(Duration::from_secs(2 * 86400)));
        assert!(parse_age("6 hours").unwrap_err().contains("6 hours"));
        assert!(parse_age("h").is_err());
        assert!(parse_age("99999999999999999999d").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
