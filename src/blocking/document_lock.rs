//! Blocking locks on documents of the application's collections.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Bson, Document};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Background, LockWatch, twins, wait_lost, wrapper};
use crate::error::Result;
use crate::lease::lost::LostSignal;
use crate::lock_status::LockStatus;
use crate::options::LockOptions;
use crate::token::FencingToken;

/// Locks on documents of one collection, with blocking methods; see [`crate::DocumentLock`].
/// Created by [`Provider::create_document_lock`](super::Provider::create_document_lock);
/// cheap to clone.
pub struct DocumentLock<T> {
    inner: crate::DocumentLock<T>,
    background: Arc<Background>,
}

wrapper!(DocumentLock<T> wraps crate::DocumentLock<T>);

impl<T> Clone for DocumentLock<T> {
    fn clone(&self) -> Self {
        DocumentLock {
            inner: self.inner.clone(),
            background: Arc::clone(&self.background),
        }
    }
}

impl<T> fmt::Debug for DocumentLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentLock")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<T> DocumentLock<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Keeps the lock in `field` of each document; see [`crate::DocumentLock::with_field`].
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.inner = self.inner.with_field(field);
        self
    }

    /// Uses `options` for the locks; see [`crate::DocumentLock::with_options`].
    #[must_use]
    pub fn with_options(mut self, options: LockOptions) -> Self {
        self.inner = self.inner.with_options(options);
        self
    }

    /// The collection's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The field that holds the lock in each document.
    pub fn field(&self) -> &str {
        self.inner.field()
    }

    /// The locks' options.
    pub fn options(&self) -> &LockOptions {
        self.inner.options()
    }

    twins! { DocumentLock:
        /// Blocks until a document matching `filter` is locked.
        fn lock(&self, filter: Document) -> DocumentGuard<T>;
        /// Blocks at most `timeout` for a document matching `filter`.
        fn lock_timeout(&self, filter: Document, timeout: Duration) -> DocumentGuard<T>;
        /// Makes one attempt; `Ok(None)` if every matching document is locked.
        fn try_lock(&self, filter: Document) -> Option<DocumentGuard<T>>;
        /// Blocks at most `timeout`; `Ok(None)` if every matching document stayed locked.
        fn try_lock_timeout(&self, filter: Document, timeout: Duration) -> Option<DocumentGuard<T>>;
        /// Locks the document with `_id` `id`, inserting `new_document` first if it is missing.
        fn lock_or_insert(&self, id: impl Into<Bson>, new_document: T) -> DocumentGuard<T>;
        /// The holders of the documents matching `filter`.
        fn holders(&self, filter: Document) -> Vec<LockStatus>;
        /// A watch of the holders of the documents matching `filter`, read every `every`.
        fn watch(&self, filter: Document, every: Duration) -> LockWatch;
    }
}

/// Proof that a document is locked, with blocking methods; see [`crate::DocumentGuard`].
/// Dropping it unlocks the document in the background.
#[must_use = "dropping the guard unlocks the document at once"]
#[clippy::has_significant_drop]
pub struct DocumentGuard<T> {
    // Dropped first: its release is queued on the runtime the handle below keeps alive.
    inner: crate::DocumentGuard<T>,
    background: Arc<Background>,
}

wrapper!(DocumentGuard<T> wraps crate::DocumentGuard<T>);

impl<T> fmt::Debug for DocumentGuard<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentGuard")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<T> DocumentGuard<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// The locked document, as it was when it was locked.
    pub fn document(&self) -> &T {
        self.inner.document()
    }

    /// The document's `_id`.
    pub fn id(&self) -> &Bson {
        self.inner.id()
    }

    /// This acquisition's fencing token.
    pub fn fencing_token(&self) -> FencingToken {
        self.inner.fencing_token()
    }

    /// This lock's lock id; see [`DocumentGuard::lock_id`](crate::DocumentGuard::lock_id).
    pub fn lock_id(&self) -> &str {
        self.inner.lock_id()
    }

    /// A signal that turns true when the lock is known or presumed lost.
    pub fn lost(&self) -> LostSignal {
        self.inner.lost()
    }

    /// Whether the lock is known or presumed lost.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// Reports that the holder's work is making progress, for
    /// [`max_idle`](crate::LockOptionsBuilder::max_idle); see [`crate::LockGuard::progress`].
    pub fn progress(&self) -> bool {
        self.inner.progress()
    }

    /// Blocks until the lock is known or presumed lost, for at most `timeout`: whether it was
    /// lost.
    ///
    /// # Errors
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio
    /// runtime.
    pub fn wait_lost(&self, timeout: Duration) -> Result<bool> {
        wait_lost(&self.background, &self.inner.lost(), timeout)
    }

    twins! { DocumentGuard:
        /// Extends the lease to at least `by` from now; see [`crate::LockGuard::extend`].
        fn extend(&self, by: Duration) -> ();
        /// Applies `update` to the document while the lock is still held, and keeps it.
        fn checkpoint(&self, update: Document) -> ();
        /// Applies `update` and unlocks the document in one write.
        fn commit(self, update: Document) -> ();
        /// Replaces the document with `new_document` and unlocks it in one write.
        fn replace(self, new_document: T) -> ();
        /// Unlocks the document without changing its data.
        fn release(self) -> ();
    }
}
