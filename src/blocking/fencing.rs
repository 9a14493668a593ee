//! Blocking fenced writes.

use std::sync::Arc;

use mongodb::Database;
use mongodb::bson::Document;

use super::Background;
use crate::error::Result;
use crate::fencing::FenceOutcome;
use crate::token::FencingToken;

/// Fenced writes to the collections of the provider's database, with blocking methods; see
/// [`crate::Fence`]. Created by [`Provider::create_fence`](super::Provider::create_fence).
#[derive(Clone, Debug)]
pub struct Fence {
    inner: crate::Fence,
    database: Database,
    background: Arc<Background>,
}

impl Fence {
    pub(super) fn new(
        inner: crate::Fence,
        database: Database,
        background: &Arc<Background>,
    ) -> Fence {
        Fence {
            inner,
            database,
            background: Arc::clone(background),
        }
    }

    /// Stores the token in `field`; see [`crate::Fence::with_field`].
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.inner = self.inner.with_field(field);
        self
    }

    /// Whether a write with the token already stored is applied; see
    /// [`crate::Fence::with_allow_equal`].
    #[must_use]
    pub fn with_allow_equal(mut self, allow: bool) -> Self {
        self.inner = self.inner.with_allow_equal(allow);
        self
    }

    /// Applies `update` to the one document of collection `collection` matching `filter` if
    /// `token` is newer than the one it stores; see [`crate::Fence::update_one`].
    ///
    /// # Errors
    /// As [`crate::Fence::update_one`];
    /// [`Error::BlockingInAsyncContext`](crate::Error::BlockingInAsyncContext) inside a Tokio
    /// runtime.
    pub fn update_one(
        &self,
        collection: &str,
        filter: Document,
        update: Document,
        token: FencingToken,
    ) -> Result<FenceOutcome> {
        let collection = self.database.collection::<Document>(collection);
        let update = self.inner.update_one(&collection, filter, update, token);
        self.background.block_on(update)?
    }
}
