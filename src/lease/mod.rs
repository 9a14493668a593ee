//! The lease engine under every primitive (crate-private).
//!
//! Every kind of lock stores *leases*: a lock id, a server-side `expiresAt`, and (for most) a
//! fencing token, in a document of its own or embedded in one. The engine does everything that
//! is the same for all of them; a primitive only builds its attempt's update pipeline and reads
//! whether it won.
//!
//! - [`claim`]: what each kind tells the engine (its lease's place, its update, whether it
//!   won), as one trait each primitive implements.
//! - [`acquire`]: the one acquisition loop (validation, runtime, tracing span, spawned attempts,
//!   transient-error retries, backoff, in-process handoff, deadlines, cleanup of attempts whose
//!   outcome is unknown).
//! - [`held`]: the held-lease core every guard wraps (lock id, `lost`, release, `Drop`, and
//!   lease-checked transactions).
//! - [`family`]: a family's renewal loops, work under way (`in_flight`) and shutdown;
//!   `record`: a held lease and where it lives; `renewal`: the renewal loops; `release`:
//!   releases and transfers; `undo`: what ends a lease whose fate is unknown.
//! - [`lost`]: when a lease counts as lost, on the suspend-aware [`clock`](crate::clock), and
//!   why; [`state`]: a held lease's state, shared by its guard, renewal loop and lost signals;
//!   `protocol`: the decisions without I/O that `lost`, `renewal` and `acquire` run (deadlines,
//!   the extension rule, renewal rounds, an attempt's outcome), and that the model checker
//!   drives.
//! - [`schema`]: field names and update pipelines of every kind; `ttl_index`; [`admin`]:
//!   reading holders, forced release, purging.
//! - `backoff`, `handoff`: the pacing of waiting callers.
//!
//! The nouns of a held lease, from the lock to the guard: a [`Target`] is a named lock in a lock
//! collection; a `record::Place` is where its leases live (collection, layout, options); a
//! `record::Lease` is one held lease as its renewal loop tracks it (id, name, kind, lock id), in
//! that loop's `record::LeaseTable`; its [`state::LeaseState`] (deadline and phase) is shared with
//! the guard's [`held::HeldLease`] and every lost signal. `Target::hold` makes all of them.
//!
//! Dependencies point one way: primitives → this engine → error, options, fencing, details.
//! The rest of the crate uses the eight modules linked above and the items of this one; the
//! other modules are private to the engine (`scripts/check-architecture` checks the same).

// The engine's interface to the rest of the crate: these modules, and the items of this one.
pub(crate) mod acquire;
pub(crate) mod admin;
pub(crate) mod bound;
pub(crate) mod claim;
pub(crate) mod family;
pub(crate) mod held;
pub(crate) mod line;
pub(crate) mod lost;
pub(crate) mod revoke;
pub(crate) mod schema;
pub(crate) mod state;
pub(crate) mod waiting_marker;

// The engine's internals, reachable from outside only through what is re-exported below.
mod backoff;
mod handoff;
mod in_flight;
mod metrics;
mod protocol;
mod push;
mod record;
mod release;
mod renewal;
mod renewal_commands;
mod ttl_index;
mod undo;

pub(crate) use backoff::ATTEMPT_SERVER_TIME;
pub(crate) use protocol::{DocumentAttempt, DocumentStep, Sent};
pub(crate) use push::{Observation, PushFrom};
pub(crate) use ttl_index::create_now as create_ttl_index;

/// The pacing and handoff facts the model checker and the test controls read, and the protocol
/// decisions the model checker drives (hooks, not API).
pub(crate) mod hooks {
    pub(crate) use super::handoff::{offers_standing, takes_over, waiters_idle};
    pub use super::protocol::{
        Attempt, DocumentAttempt, DocumentStep, Due, Handover, InLine, Lease,
        MAX_TRANSFERS_IN_A_ROW, Moment, Phase, Refusal, Renewals, Reply, Sent, Settling, Step,
        Tell, Transaction, TransferReply, TransferStep, Work, give_up_at, handover, hands_over,
        keeps_window, renewed_every_lease, retry_delay, settled, suspect_at, transfer_answered,
    };
}

use std::sync::Arc;

use mongodb::bson::{Bson, Document};
use mongodb::options::ReturnDocument;
use mongodb::{Collection, Database};
use tokio::runtime::Handle;

use crate::error::{Error, Result, is_duplicate_key, shown_name};
use crate::lock_status::LockKind;
use crate::options::LockOptions;
use family::Family;
use held::HeldLease;
use record::{Deployment, Lease, Place};
use schema::Layout;
use undo::Undo;

/// The longest lock name, in bytes: a name is stored as the `_id` of its document and sent in
/// every command about it, and must leave room within MongoDB's 16 MiB document limit.
pub(crate) const MAX_NAME_BYTES: usize = 1 << 20;

/// What is wrong with `name` as a lock name, if anything: only a length over
/// [`MAX_NAME_BYTES`]. Also used by the in-memory locks, which refuse the same names.
pub(crate) fn name_problem(name: &str) -> Option<String> {
    (name.len() > MAX_NAME_BYTES).then(|| {
        format!(
            "lock name {:?} is {} bytes long; names are limited to {MAX_NAME_BYTES} bytes \
             (1 MiB)",
            shown_name(name),
            name.len()
        )
    })
}

/// What is wrong with `max_count` for the semaphore `name`, if anything: only 0. Also used by
/// the in-memory semaphores.
pub(crate) fn max_count_problem(name: &str, max_count: u32) -> Option<String> {
    (max_count == 0).then(|| {
        format!(
            "semaphore {:?}: max_count must be at least 1",
            shown_name(name)
        )
    })
}

/// What is wrong with asking `places` places of semaphore `name` of `max_count` places (at
/// least 1, at most `max_count`), if anything. Also used by the in-memory semaphores.
pub(crate) fn places_problem(name: &str, places: u32, max_count: u32) -> Option<String> {
    (places == 0 || places > max_count).then(|| {
        format!(
            "semaphore {:?}: asks for {places} places of {max_count}; ask for 1 to {max_count}",
            shown_name(name)
        )
    })
}

/// The refusal of a semaphore `name` whose caller's `max_count` differs from the one its first
/// acquisition recorded (`stored`). Also used by the in-memory semaphores.
pub(crate) fn max_count_mismatch(name: &str, stored: &str, max_count: u32) -> Error {
    Error::InvalidArgument(format!(
        "semaphore {:?} was created with max_count {stored}; this caller uses {max_count}",
        shown_name(name)
    ))
}

/// A named lock in a lock collection: what the exclusive lock, the reader-writer lock and the
/// semaphore share with their guards. Each keeps its leases in the document `{_id: name}`.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) database: Database,
    pub(crate) collection: Collection<Document>,
    pub(crate) options: LockOptions,
    /// The renewal loops, shared with the locks of the same provider.
    pub(crate) family: Arc<Family>,
    /// This lock's queue of in-process waiters.
    pub(crate) waiters: handoff::Key,
    /// The deployment its commands reach (for its renewal loop).
    pub(crate) deployment: Deployment,
    /// The stored form of the holders' details, if they are stored.
    pub(crate) details: Option<Document>,
    /// Why the name or collection cannot be used, found when they were set and reported by the
    /// first call that would talk to the server.
    problem: Option<Problem>,
}

/// Why a lock cannot be used as configured: found when it is built, reported (as an [`Error`])
/// by the first call that would talk to the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Becomes [`Error::InvalidArgument`].
    Argument(String),
    /// Becomes [`Error::InvalidCollectionName`].
    Collection { name: String, reason: &'static str },
}

impl Problem {
    /// A collection name MongoDB would refuse.
    pub(crate) fn of_collection(collection: &str) -> Option<Problem> {
        collection_name_problem(collection).map(|reason| Problem::Collection {
            name: collection.to_owned(),
            reason,
        })
    }

    /// `Ok(())` without a problem, else the error it stands for.
    pub(crate) fn check(problem: Option<&Problem>) -> Result<()> {
        match problem {
            None => Ok(()),
            Some(Problem::Argument(message)) => Err(Error::InvalidArgument(message.clone())),
            Some(Problem::Collection { name, reason }) => Err(Error::InvalidCollectionName {
                collection: name.clone(),
                reason,
            }),
        }
    }
}

impl Target {
    pub(crate) fn new(name: String, database: &Database, collection: &str) -> Target {
        let mut target = Target {
            waiters: handoff::key(0, "", "", ""),
            deployment: Deployment::Database(database.clone()),
            database: database.clone(),
            collection: database.collection(collection),
            options: LockOptions::default(),
            family: Arc::default(),
            details: None,
            problem: None,
            name,
        };
        target.problem = target.find_problem();
        target.waiters = target.queue_key();
        target
    }

    /// Moves the lock to `collection` (of the same database).
    pub(crate) fn set_collection(&mut self, collection: &str) {
        self.collection = self.database.collection(collection);
        self.problem = self.find_problem();
        self.waiters = self.queue_key();
    }

    /// Joins `family` (a provider's), and with them the in-process queues of its locks; a
    /// `refusal` (a provider setting that forbids using the lock) is reported as the lock's
    /// problem.
    pub(crate) fn join_family(&mut self, family: &Arc<Family>, refusal: Option<Problem>) {
        self.family = Arc::clone(family);
        self.waiters = self.queue_key();
        if let Some(refusal) = refusal {
            self.problem.get_or_insert(refusal);
        }
    }

    /// Its collection was made from `database`: its deployment is that database's.
    pub(crate) fn reached_through(&mut self, database: &Database) {
        self.deployment = Deployment::Database(database.clone());
    }

    fn queue_key(&self) -> handoff::Key {
        handoff::key(
            self.family.id(),
            self.database.name(),
            self.collection.name(),
            &self.name,
        )
    }

    fn find_problem(&self) -> Option<Problem> {
        if let Some(problem) = name_problem(&self.name) {
            return Some(Problem::Argument(problem));
        }
        Problem::of_collection(self.collection.name())
    }

    /// [`Error::InvalidArgument`] for a name too long to store, [`Error::InvalidCollectionName`]
    /// for a collection MongoDB would refuse.
    pub(crate) fn check(&self) -> Result<()> {
        Problem::check(self.problem.as_ref())
    }

    /// Where this lock's changes can be pushed from (its change stream): its collection, family
    /// and name.
    pub(crate) fn push_from(&self) -> push::PushFrom {
        (
            self.collection.clone(),
            self.waiters.family(),
            self.name.clone(),
        )
    }

    /// Where this lock's leases live, stored as `layout` says.
    pub(crate) fn place(&self, layout: &Layout) -> Place {
        Place {
            collection: self.collection.clone(),
            deployment: self.deployment.clone(),
            layout: layout.clone(),
            options: self.options.clone(),
        }
    }

    /// What ends the lease that the attempt with `lock_id` may have taken (stored as `layout`
    /// says), should its outcome be unknown: in this lock's document, or for document locks in
    /// whichever document it locked (see [`embedded_cleanup`](Self::embedded_cleanup)).
    pub(crate) fn cleanup(&self, layout: &Layout, lock_id: &str) -> Undo {
        match layout {
            Layout::Embedded(_) => self.embedded_cleanup(layout, lock_id),
            _ => self
                .place(layout)
                .cleanup_undo(&self.name.as_str().into(), lock_id, &self.name),
        }
    }

    /// Runs an attempt's pipeline `update` on the lock's document (`{_id: name}`, created if
    /// missing) and returns the document after it. The server gives it at most
    /// [`backoff::ATTEMPT_SERVER_TIME`].
    ///
    /// Two concurrent upserts of a new name can make one fail with a duplicate key (E11000)
    /// when the server does not retry it itself. The document exists then, and the attempt is
    /// repeated at once: for an exclusive lock it will find the lock busy, but a reader or a
    /// semaphore holder may well join.
    pub(crate) async fn upsert(&self, update: Vec<Document>) -> Result<Document> {
        let send = || {
            self.collection
                .find_one_and_update(schema::attempt_filter(self.name.as_str()), update.clone())
                .upsert(true)
                .return_document(ReturnDocument::After)
                .write_concern(self.options.write_concern().clone())
                .max_time(backoff::ATTEMPT_SERVER_TIME)
        };
        let result = match send().await {
            Err(error) if is_duplicate_key(&error) => send().await,
            other => other,
        };
        match result {
            Ok(Some(document)) => {
                // Evidence that a family of locks holding it here reaches this same document.
                if let Ok(holder) = document.get_str(schema::LOCK_ID) {
                    handoff::saw_stored(&self.waiters, holder);
                }
                Ok(document)
            }
            Ok(None) => Err(Error::UnexpectedReply(
                "findAndModify with upsert returned no document".to_owned(),
            )),
            Err(error) => Err(Error::Mongo(error)),
        }
    }

    /// Holds the lease `lock_id` of a lock of `kind` won by the attempt `request` in
    /// this lock's document (stored as `layout` says): see [`HeldLease::hold`]. The first won
    /// lease in the collection starts creating its TTL index, unless the options turn that off.
    pub(crate) fn hold(
        &self,
        runtime: &Handle,
        kind: LockKind,
        layout: &Layout,
        lock_id: String,
        request: Sent<crate::clock::Instant>,
    ) -> Option<HeldLease> {
        let lease = Lease {
            id: self.name.as_str().into(),
            name: self.name.clone(),
            kind,
            state: state::LeaseState::starting(&self.options, request),
            waiters: Some(self.waiters.clone()),
            // The whole lock, or its writer: nobody else can take it while this lease lasts.
            holding: (!matches!(layout, Layout::Members(_)))
                .then(|| handoff::Holding::new(&self.waiters, &lock_id)),
            lock_id,
        };
        if self.options.automatic_ttl_index() {
            ttl_index::ensure(runtime, &self.collection);
        }
        HeldLease::hold(runtime, &self.family, &self.place(layout), lease)
    }
}

// The document locks of one collection: a `Target` named after the collection, whose leases
// are embedded in the documents themselves (stored as a `Layout::Embedded` says) rather than in
// a document per name. Their waiters do not queue in the process (each may wait for other
// documents), so there is no handoff.
impl Target {
    /// The document locks of `collection` (the application's collection object, with its own
    /// settings).
    pub(crate) fn of_documents(collection: &Collection<Document>) -> Target {
        let database = collection.client().database(&collection.namespace().db);
        let mut target = Target::new(collection.name().to_owned(), &database, collection.name());
        target.collection = collection.clone();
        target.deployment = Deployment::Collection(collection.clone());
        target
    }

    /// Locks one document matching `filter` with the pipeline `update` (which writes the lease
    /// only where the document's lease has ended) and returns it after the update, or `None` if
    /// no matching document was unlocked. The server gives it at most
    /// [`backoff::ATTEMPT_SERVER_TIME`].
    pub(crate) async fn lock_one(
        &self,
        filter: Document,
        update: Vec<Document>,
    ) -> Result<Option<Document>> {
        let locked = self
            .collection
            .find_one_and_update(filter, update)
            .return_document(ReturnDocument::After)
            .write_concern(self.options.write_concern().clone())
            .max_time(backoff::ATTEMPT_SERVER_TIME)
            .await?;
        Ok(locked)
    }

    /// Holds the lease `lock_id` embedded in the document `id` (stored as `layout` says), won
    /// by the attempt `request`: see [`HeldLease::hold`]. Its name, in logs and
    /// statuses, is `collection/_id`.
    pub(crate) fn hold_embedded(
        &self,
        runtime: &Handle,
        layout: &Layout,
        id: Bson,
        lock_id: String,
        request: Sent<crate::clock::Instant>,
    ) -> Option<HeldLease> {
        let lease = Lease {
            name: format!("{}/{id}", self.collection.name()),
            id,
            kind: LockKind::Document,
            state: state::LeaseState::starting(&self.options, request),
            waiters: None,
            holding: None,
            lock_id,
        };
        HeldLease::hold(runtime, &self.family, &self.place(layout), lease)
    }

    /// What unlocks whichever document the attempt with `lock_id` may have locked (its lease
    /// stored as `layout` says), should its outcome be unknown. The filter has no `_id` and no
    /// shard key (the attempt's filter may match many documents, and which one it locked is
    /// unknown), so it is sent as a multi-document update, which a sharded collection accepts
    /// without the shard key on every MongoDB version; the lock id is in one document at most.
    fn embedded_cleanup(&self, layout: &Layout, lock_id: &str) -> Undo {
        Undo {
            collection: self.collection.clone(),
            filter: layout.anywhere_filter(lock_id),
            update: layout.release_update(lock_id, schema::Ending::Cleanup),
            write_concern: self.options.write_concern().clone(),
            patience: self.options.expiry(),
            many: true,
            name: self.collection.name().to_owned(),
        }
    }
}

/// Why MongoDB would refuse `collection` as a collection name, if it would.
fn collection_name_problem(collection: &str) -> Option<&'static str> {
    if collection.is_empty() {
        Some("it is empty")
    } else if collection.contains('\0') {
        Some("it contains a NUL character")
    } else if collection.contains('$') {
        Some("it contains '$'")
    } else if collection.starts_with('.') {
        Some("it starts with '.'")
    } else if collection.starts_with("system.") {
        Some("the 'system.' prefix is reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_collection_name(collection: &str) -> Result<()> {
        Problem::check(Problem::of_collection(collection).as_ref())
    }

    #[test]
    fn collection_names_mongodb_rejects_are_refused() {
        for bad in ["", "a\0b", "$x", "a$b", ".x", "system.locks"] {
            let error = check_collection_name(bad).unwrap_err();
            assert!(
                matches!(&error, Error::InvalidCollectionName { collection, .. } if collection == bad),
                "{error}"
            );
        }
        for good in ["distributed_locks", "locks.v2", "ünïcode", "a b"] {
            check_collection_name(good).unwrap();
        }
    }
}
