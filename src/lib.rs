// The crate docs are the README. Its links lead to docs.rs and to the repository's files, for
// GitHub; here they lead to the items themselves: these definitions come first, and the first
// definition of a link wins.
#![doc = "[DESIGN.md]: crate::design"]
#![doc = "[`MongoDistributedLock`]: crate::MongoDistributedLock"]
#![doc = "[`MongoDistributedSemaphore`]: crate::MongoDistributedSemaphore"]
#![doc = "[`MongoDistributedReaderWriterLock`]: crate::MongoDistributedReaderWriterLock"]
#![doc = "[`DocumentLock`]: crate::DocumentLock"]
#![doc = "[`Provider`]: crate::Provider"]
#![doc = "[`Fence`]: crate::Fence"]
#![doc = "[`LeaderElection`]: crate::LeaderElection"]
#![doc = "[`Job`]: crate::Job"]
#![doc = "[`LockWatch`]: crate::LockWatch"]
#![doc = "[`DistributedLockProvider`]: crate::DistributedLockProvider"]
#![doc = "[`memory`]: crate::memory"]
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
pub mod revocation;
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
pub use job::{DistributedJob, Job, JobRun, Skipped};
pub use leader::LeaderElection;
pub use lease::lost::LostSignal;
pub use lock::{DEFAULT_LOCK_COLLECTION, MongoDistributedLock};
pub use lock_status::{LockFilter, LockKind, LockStatus, Purgeable};
pub use options::{LockOptions, LockOptionsBuilder};
pub use provider::Provider;
pub use revocation::{Revocation, RevokeRequest};
pub use rw_lock::{
    DEFAULT_RW_COLLECTION, MongoDistributedReaderWriterLock, ReadGuard, UpgradeableReadGuard,
};
pub use semaphore::{DEFAULT_SEMAPHORE_COLLECTION, MongoDistributedSemaphore};
pub use token::FencingToken;
/// The token a guard's [`cancellation`](LockGuard::cancellation) returns (tokio-util's).
pub use tokio_util::sync::CancellationToken;
pub use traits::{
    BoxedCompositeGuard, BoxedDocumentGuard, BoxedGuard, BoxedReadGuard, BoxedUpgradeableReadGuard,
    DistributedCompositeGuard, DistributedDocumentGuard, DistributedDocumentLock, DistributedLock,
    DistributedLockGuard, DistributedLockProvider, DistributedReadGuard,
    DistributedReaderWriterLock, DistributedSemaphore, DistributedUpgradeableReadGuard,
};
pub use watch::LockWatch;
