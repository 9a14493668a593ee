#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
// docs.rs marks the items that need a cargo feature (`blocking`).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

// Foundations.
mod clock;
mod details;
mod error;
mod fencing;
mod lock_status;
mod options;
mod sync;
mod token;

// The lock as an interface, implemented by the primitives below and by `memory`.
mod traits;

// The lease engine every primitive sits on.
mod lease;

// Primitives (none imports another), the guard they share, and the provider above them.
mod composite;
mod document_lock;
mod guard;
mod job;
mod leader;
mod lock;
mod provider;
mod rw_lock;
mod semaphore;
mod watch;

// The in-memory double of the exclusive lock, for unit tests without MongoDB.
pub mod memory;

// The blocking façade over the provider and the primitives.
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;

// The protocol's decision functions, for the repository's model checker (not part of the API).
#[doc(hidden)]
#[path = "model_hooks.rs"]
pub mod __model;
#[doc(hidden)]
#[path = "testing_hooks.rs"]
pub mod __testing;

/// How the lock works, what it guarantees under which assumptions, and how the code is laid out
/// (the repository's `DESIGN.md`).
#[doc = include_str!("../DESIGN.md")]
pub mod design {}

pub use composite::{CompositeGuard, CompositeMember};
pub use details::LockDetails;
pub use document_lock::{DEFAULT_LOCK_FIELD, DocumentGuard, DocumentLock};
pub use error::{Error, Operation, Result};
pub use fencing::{DEFAULT_FENCE_FIELD, Fence, FenceOutcome};
pub use guard::LockGuard;
pub use job::{Job, JobRun, Skipped};
pub use leader::LeaderElection;
pub use lease::lost::LostSignal;
pub use lock::{DEFAULT_LOCK_COLLECTION, MongoDistributedLock};
pub use lock_status::{LockFilter, LockKind, LockStatus, Purgeable};
pub use options::{LockOptions, LockOptionsBuilder};
pub use provider::Provider;
pub use rw_lock::{DEFAULT_RW_COLLECTION, MongoDistributedReaderWriterLock, ReadGuard};
pub use semaphore::{DEFAULT_SEMAPHORE_COLLECTION, MongoDistributedSemaphore};
pub use token::FencingToken;
pub use traits::{
    BoxedDocumentGuard, BoxedGuard, BoxedReadGuard, DistributedDocumentGuard,
    DistributedDocumentLock, DistributedLock, DistributedLockGuard, DistributedLockProvider,
    DistributedReadGuard, DistributedReaderWriterLock,
};
pub use watch::LockWatch;

/// Public types are `Send + Sync` (guards also `'static`), and the futures of every async method
/// are `Send`, so they can be spawned. Checked at compile time.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<MongoDistributedLock>();
    send_sync::<LockGuard>();
    send_sync::<Provider>();
    send_sync::<LeaderElection>();
    send_sync::<LockOptions>();
    send_sync::<Error>();
    send_sync::<FencingToken>();
    send_sync::<DocumentLock<mongodb::bson::Document>>();
    send_sync::<DocumentGuard<mongodb::bson::Document>>();
    send_sync::<Fence>();
    send_sync::<CompositeGuard>();
    send_sync::<CompositeMember<'static>>();
    send_sync::<MongoDistributedSemaphore>();
    send_sync::<LockStatus>();
    send_sync::<LockDetails>();
    send_sync::<MongoDistributedReaderWriterLock>();
    send_sync::<ReadGuard>();
    send_sync::<LostSignal>();
    send_sync::<LockKind>();
    send_sync::<LockFilter>();
    send_sync::<FenceOutcome>();
    send_sync::<Operation>();
    send_sync::<LockOptionsBuilder>();
    send_sync::<memory::MemoryLockProvider>();
    send_sync::<memory::MemoryLock>();
    send_sync::<memory::MemoryGuard>();
    send_sync::<memory::MemoryReaderWriterLock>();
    send_sync::<memory::MemoryReadGuard>();
    send_sync::<std::sync::Arc<dyn DistributedLockProvider>>();
    send_sync::<BoxedGuard>();
    send_sync::<BoxedReadGuard>();
    send_sync::<BoxedDocumentGuard>();
    send_sync::<memory::MemoryDocumentLock>();
    send_sync::<memory::MemoryDocumentGuard>();
    send_sync::<Box<dyn DistributedDocumentLock>>();
    send_sync::<Box<dyn DistributedReaderWriterLock>>();
    #[cfg(feature = "blocking")]
    {
        send_sync::<blocking::Provider>();
        send_sync::<blocking::MongoDistributedLock>();
        send_sync::<blocking::MongoDistributedReaderWriterLock>();
        send_sync::<blocking::MongoDistributedSemaphore>();
        send_sync::<blocking::LockGuard>();
        send_sync::<blocking::ReadGuard>();
        send_sync::<blocking::CompositeGuard>();
        send_sync::<blocking::DocumentLock<mongodb::bson::Document>>();
        send_sync::<blocking::DocumentGuard<mongodb::bson::Document>>();
        send_sync::<blocking::LeaderElection>();
        send_sync::<blocking::Fence>();
        send_sync::<blocking::LockWatch>();
    }

    fn futures(lock: &MongoDistributedLock, guard: LockGuard) {
        send(&lock.acquire());
        send(&lock.acquire_timeout(std::time::Duration::ZERO));
        send(&lock.try_acquire());
        send(&lock.try_acquire_timeout(std::time::Duration::ZERO));
        send(&guard.release());
    }
    fn provider_futures(provider: &Provider, composite: CompositeGuard) {
        let semaphore = provider.create_semaphore("s", 2);
        send(&semaphore.acquire());
        send(&semaphore.acquire_timeout(std::time::Duration::ZERO));
        send(&semaphore.try_acquire());
        send(&semaphore.try_acquire_timeout(std::time::Duration::ZERO));
        send(&provider.acquire_all(&["a"], std::time::Duration::ZERO));
        send(&provider.try_acquire_all(&[CompositeMember::Read("a")]));
        send(&provider.status("a"));
        send(&provider.held_locks());
        send(&provider.held_locks_matching(&LockFilter::new()));
        send(&provider.create_indexes());
        send(&provider.force_release("a"));
        send(&provider.purge_expired());
        send(&composite.release());
        let rw = provider.create_reader_writer_lock("rw");
        send(&rw.acquire_read());
        send(&rw.acquire_read_timeout(std::time::Duration::ZERO));
        send(&rw.try_acquire_read());
        send(&rw.try_acquire_read_timeout(std::time::Duration::ZERO));
        send(&rw.acquire_write());
        send(&rw.acquire_write_timeout(std::time::Duration::ZERO));
        send(&rw.try_acquire_write());
        send(&rw.try_acquire_write_timeout(std::time::Duration::ZERO));
        send(&rw.holders());
        send(&semaphore.holders());
        send(&semaphore.force_release_all());
        send(&rw.force_release_all());
    }
    fn read_guard_futures(guard: ReadGuard) {
        send(&guard.lost().wait());
        send(&guard.release());
    }
    let _ = read_guard_futures;
    let _ = provider_futures;
    let _ = futures;

    fn document_futures(
        lock: &DocumentLock<mongodb::bson::Document>,
        guard: DocumentGuard<mongodb::bson::Document>,
        fence: &Fence,
        collection: &mongodb::Collection<mongodb::bson::Document>,
    ) {
        let filter = mongodb::bson::Document::new;
        send(&lock.lock(filter()));
        send(&lock.try_lock(filter()));
        send(&lock.lock_timeout(filter(), std::time::Duration::ZERO));
        send(&lock.try_lock_timeout(filter(), std::time::Duration::ZERO));
        send(&lock.lock_or_insert(1, filter()));
        send(&fence.update_one(collection, filter(), filter(), guard.fencing_token()));
        send(&guard.commit(filter()));
    }
    let _ = document_futures;
}
