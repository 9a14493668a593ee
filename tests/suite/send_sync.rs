//! Public types are `Send + Sync` (guards also `'static`), and the futures of every async method
//! are `Send`, so they can be spawned. The check is the compiler's: this module does not compile
//! otherwise (as tokio's `tests/async_send_sync.rs`), so it has no test function.

use distributed_lock_mongodb::*;

// Never called: its body compiles only if the types are `Send + Sync + 'static` and the futures
// `Send`.
#[allow(dead_code)]
fn public_types_are_send_sync_and_static() {
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
