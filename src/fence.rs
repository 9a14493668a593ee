//! Fenced writes: the other half of fencing tokens.

use mongodb::Collection;
use mongodb::bson::{Document, doc};

use crate::document_lock::check_operators;
use crate::{Error, FencingToken, Result};

/// The default field that remembers the last fencing token written to a document.
pub const DEFAULT_FENCE_FIELD: &str = "fencingToken";

/// Applies updates to a protected resource only for holders with a current fencing token.
///
/// The target document remembers the largest token that wrote to it (in `fencingToken` by
/// default). A write carrying a token that is not greater (or, with
/// [`allow_equal`](Self::allow_equal), not at least as great) is refused, and the check and the
/// write are one atomic update that also stores the new token. A holder that lost its lock
/// without noticing — paused past its lease, partitioned — is therefore refused once the next
/// holder has written. Works with the tokens of every guard in this crate.
///
/// A stored token that is missing or not a number counts as older than any token.
///
/// ```no_run
/// # async fn demo(accounts: mongodb::Collection<mongodb::bson::Document>, guard: distributed_lock_mongodb::LockGuard) -> distributed_lock_mongodb::Result<()> {
/// use distributed_lock_mongodb::{Fence, FenceOutcome};
/// use mongodb::bson::doc;
///
/// let outcome = Fence::new()
///     .update_one(&accounts, doc! { "_id": "acct-1" }, doc! { "$inc": { "balance": 10 } }, guard.fencing_token())
///     .await?;
/// if outcome == FenceOutcome::Stale {
///     // A newer holder has written: our lock is gone. Stop.
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Fence {
    field: String,
    allow_equal: bool,
}

/// What a fenced write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceOutcome {
    /// The update was applied and the token stored.
    Applied,
    /// Refused: the document has seen a newer token (or an equal one, unless allowed).
    Stale,
    /// No document matches the filter; nothing was written.
    NotFound,
}

impl FenceOutcome {
    /// Whether the update was applied.
    pub fn is_applied(self) -> bool {
        self == FenceOutcome::Applied
    }
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            field: DEFAULT_FENCE_FIELD.to_owned(),
            allow_equal: false,
        }
    }
}

impl Fence {
    /// A fence on the field `fencingToken`, accepting only strictly greater tokens.
    pub fn new() -> Self {
        Fence::default()
    }

    /// Remembers tokens in `field` instead of `fencingToken`. Defaults to `fencingToken`.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }

    /// Also accept a token equal to the stored one (several writes by one holder). Defaults to
    /// false: every write needs a newer token, so one holder writes once per acquisition.
    pub fn allow_equal(mut self, allow: bool) -> Self {
        self.allow_equal = allow;
        self
    }

    /// Applies `update` (update operators) to the one document matching `filter` if `token` is
    /// newer than the one it stores, storing `token` in the same update.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `update` is not made of update operators, or touches the
    /// token field, or the field name is unusable; [`Error::Mongo`] if the write fails.
    ///
    /// # Cancel safety
    /// Dropping the future may or may not leave the update applied, as with any driver write.
    pub async fn update_one<T: Send + Sync>(
        &self,
        collection: &Collection<T>,
        filter: Document,
        update: Document,
        token: FencingToken,
    ) -> Result<FenceOutcome> {
        let field = self.field.as_str();
        if field.is_empty() || field.starts_with('$') || field.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "fence field {field:?} must be a non-empty field path not starting with '$'"
            )));
        }
        check_operators(&update, field)?;
        let mut update = update;
        match update.get_document_mut("$set") {
            Ok(set) => {
                set.insert(field, token.get());
            }
            Err(_) => {
                update.insert("$set", doc! { field: token.get() });
            }
        }
        let older = if self.allow_equal { "$lte" } else { "$lt" };
        let fenced = doc! { "$and": [filter.clone(), { "$or": [
            { field: { older: token.get() } },
            { field: { "$not": { "$type": "number" } } },
        ] }] };
        let documents = collection.clone_with_type::<Document>();
        let result = documents.update_one(fenced, update).await?;
        if result.matched_count > 0 {
            return Ok(FenceOutcome::Applied);
        }
        let exists = documents
            .find_one(filter)
            .projection(doc! { "_id": 1 })
            .await?
            .is_some();
        Ok(if exists {
            FenceOutcome::Stale
        } else {
            FenceOutcome::NotFound
        })
    }
}
