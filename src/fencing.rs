//! Fenced writes: the resource's half of fencing (the tokens are in `token`).

use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{ReadConcern, ReadPreference, SelectionCriteria};

use crate::error::{Error, Result};
use crate::token::FencingToken;

/// Accepts only update-operator documents that leave `protected` (a field) alone.
pub(crate) fn check_operators(update: &Document, protected: &str) -> Result<()> {
    if update.is_empty() {
        return Err(Error::InvalidArgument("the update is empty".to_owned()));
    }
    for (operator, fields) in update {
        if !operator.starts_with('$') {
            return Err(Error::InvalidArgument(format!(
                "the update must consist of update operators such as $set, found {operator:?}"
            )));
        }
        let Bson::Document(fields) = fields else {
            return Err(Error::InvalidArgument(format!(
                "the update operator {operator} needs a document of fields"
            )));
        };
        let touches = |path: &str| {
            path == protected
                || path
                    .strip_prefix(protected)
                    .is_some_and(|rest| rest.starts_with('.'))
        };
        if let Some(path) = fields.keys().find(|path| touches(path)) {
            return Err(Error::InvalidArgument(format!(
                "the update must not touch {protected:?} (found {path:?} under {operator})"
            )));
        }
        // `$rename` writes the field named by each value: `{$rename: {a: "lock"}}` would
        // overwrite the protected field with `a`.
        if operator == "$rename"
            && let Some(target) = fields
                .values()
                .filter_map(Bson::as_str)
                .find(|target| touches(target))
        {
            return Err(Error::InvalidArgument(format!(
                "the update must not touch {protected:?} (found a $rename to {target:?})"
            )));
        }
    }
    Ok(())
}

/// Reads whose result is acted on go to the primary, whatever the client's default read
/// preference.
fn primary() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::Primary)
}

/// Whether a document matches `filter`, read on the primary with read concern `local`: the caller
/// acts on the answer (a fenced write that matched nothing; a document lock with nothing to lock).
pub(crate) async fn exists_on_primary(
    collection: &Collection<Document>,
    filter: Document,
) -> mongodb::error::Result<bool> {
    let found = collection
        .find_one(filter)
        .projection(doc! { "_id": 1 })
        .selection_criteria(primary())
        .read_concern(ReadConcern::local())
        .await?;
    Ok(found.is_some())
}

/// The default field that remembers the last fencing token written to a document.
pub const DEFAULT_FENCE_FIELD: &str = "fencingToken";

/// Applies updates to a protected resource only for holders with a current fencing token.
///
/// The target document remembers the largest token that wrote to it (in `fencingToken` by
/// default). A write carrying a token that is not greater (or, with
/// [`with_allow_equal`](Self::with_allow_equal), not at least as great) is refused, and the check and the
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
    #[must_use]
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }

    /// Also accept a token equal to the stored one (several writes by one holder). Defaults to
    /// false: every write needs a newer token, so one holder writes once per acquisition.
    #[must_use]
    pub fn with_allow_equal(mut self, allow: bool) -> Self {
        self.allow_equal = allow;
        self
    }

    /// Matches the documents of `filter` whose stored token is older than `token` (or equal, if
    /// allowed), or not a number (never written by a fenced write).
    pub(crate) fn fenced_filter(&self, filter: Document, token: FencingToken) -> Document {
        let field = self.field.as_str();
        let older = if self.allow_equal { "$lte" } else { "$lt" };
        doc! { "$and": [filter, { "$or": [
            { field: { older: token.get() } },
            { field: { "$not": { "$type": "number" } } },
        ] }] }
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
        let fenced = self.fenced_filter(filter.clone(), token);
        let documents = collection.clone_with_type::<Document>();
        let result = documents.update_one(fenced, update).await?;
        if result.matched_count > 0 {
            return Ok(FenceOutcome::Applied);
        }
        Ok(if exists_on_primary(&documents, filter).await? {
            FenceOutcome::Stale
        } else {
            FenceOutcome::NotFound
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_must_be_operators_that_leave_the_lock_alone() {
        check_operators(&doc! { "$set": { "status": "done", "locked": 1 } }, "lock").unwrap();
        check_operators(&doc! { "$inc": { "n": 1 }, "$unset": { "x": "" } }, "lock").unwrap();
        for bad in [
            doc! {},
            doc! { "status": "done" },
            doc! { "$set": 5 },
            doc! { "$set": { "lock": {} } },
            doc! { "$unset": { "lock.id": "" } },
            doc! { "$rename": { "lock": "old" } },
            doc! { "$rename": { "draft": "lock" } },
            doc! { "$rename": { "draft": "lock.expiresAt" } },
            doc! { "$setOnInsert": { "lock": 1 }, "$set": { "a": 1 } },
            doc! { "$currentDate": { "lock.expiresAt": true } },
            doc! { "$max": { "lock": 5 } },
        ] {
            let error = check_operators(&bad, "lock").unwrap_err();
            assert!(matches!(error, Error::InvalidArgument(_)), "{bad}: {error}");
        }
        check_operators(&doc! { "$rename": { "draft": "final" } }, "lock").unwrap();
        check_operators(&doc! { "$rename": { "locker": "lockers" } }, "lock").unwrap();
    }
}
