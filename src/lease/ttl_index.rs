//! The TTL index that removes lock documents (exclusive, reader-writer, semaphore) a day after
//! their last lease ended ([`RETENTION`]: long enough that fencing tokens never depend on two
//! servers' clocks).
//!
//! Created in the background after the first successful acquisition per collection in the
//! process (unless the options turn that off), so it never delays or fails an acquisition; or
//! explicitly, by [`create_now`]. The registry is keyed by database and
//! collection name, because a `mongodb::Client` has no public identity: a process that talks to
//! two clusters with identically named databases and collections creates the index on the first
//! one only (create it yourself on the other, or use distinct names).

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Document, doc};
use mongodb::options::IndexOptions;
use mongodb::{Collection, IndexModel, Namespace};
use tokio::runtime::Handle;
use tokio::time::Instant;

use super::schema::{EXPIRES_AT, RETENTION, TTL_INDEX_NAME};
use crate::error::error_code;
use crate::sync::Mutex;

/// How long to wait before trying again after an unexpected failure.
const RETRY_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexState {
    Creating,
    Ready,
    RetryAfter(Instant),
}

static REGISTRY: LazyLock<Mutex<HashMap<Namespace, IndexState>>> = LazyLock::new(Mutex::default);

/// Starts creating the TTL index on `collection` unless that is done, under way, or failed
/// less than a minute ago.
pub(crate) fn ensure(runtime: &Handle, collection: &Collection<Document>) {
    let namespace = collection.namespace();
    {
        let mut registry = REGISTRY.lock();
        match registry.get(&namespace) {
            Some(IndexState::Creating | IndexState::Ready) => return,
            Some(IndexState::RetryAfter(at)) if Instant::now() < *at => return,
            _ => {}
        }
        registry.insert(namespace.clone(), IndexState::Creating);
    }
    let collection = collection.clone();
    runtime.spawn(async move {
        // If the runtime shuts down mid-creation, the next acquisition tries again.
        let mut pending = PendingEntry(Some(namespace));
        let state = create(&collection).await;
        if let Some(namespace) = pending.0.take() {
            REGISTRY.lock().insert(namespace, state);
        }
    });
}

/// Forgets a `Creating` entry whose task was dropped before it finished.
struct PendingEntry(Option<Namespace>);

impl Drop for PendingEntry {
    fn drop(&mut self) {
        if let Some(namespace) = self.0.take() {
            REGISTRY.lock().remove(&namespace);
        }
    }
}

async fn create(collection: &Collection<Document>) -> IndexState {
    match create_or_check(collection).await {
        Ok(()) => IndexState::Ready,
        // Reported already; trying again would not change it.
        Err(error) if classify(error_code(&error)) != Failure::Other => IndexState::Ready,
        Err(error) => {
            tracing::warn!(
                collection = %collection.name(),
                %error,
                "could not create the TTL index on expiresAt; trying again after a later acquisition"
            );
            IndexState::RetryAfter(Instant::now() + RETRY_AFTER)
        }
    }
}

/// Creates the TTL index on `collection` now, for
/// [`Provider::create_indexes`](crate::Provider::create_indexes): done once a suitable index is
/// there (ours, or an equivalent one someone else created).
pub(crate) async fn create_now(collection: &Collection<Document>) -> crate::error::Result<()> {
    create_or_check(collection).await?;
    REGISTRY
        .lock()
        .insert(collection.namespace(), IndexState::Ready);
    Ok(())
}

/// Creates our index; if that is refused because an index is in the way or for lack of
/// privileges, checks (and if it is ours, repairs) what is there. The creation's error if no
/// suitable index results.
async fn create_or_check(collection: &Collection<Document>) -> mongodb::error::Result<()> {
    let index = IndexModel::builder()
        .keys(doc! { EXPIRES_AT: 1 })
        .options(
            IndexOptions::builder()
                .name(TTL_INDEX_NAME.to_owned())
                .expire_after(RETENTION)
                .build(),
        )
        .build();
    let Err(error) = collection.create_index(index).await else {
        return Ok(());
    };
    if classify(error_code(&error)) != Failure::Other && check_existing_index(collection).await {
        return Ok(());
    }
    Err(error)
}

#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// An index of that name or on that key exists already (possibly with other options).
    Exists,
    /// Not allowed to create indexes: retrying will not help.
    Unauthorized,
    Other,
}

/// 85 IndexOptionsConflict, 86 IndexKeySpecsConflict, 68 IndexAlreadyExists, 13 Unauthorized.
fn classify(code: Option<i32>) -> Failure {
    match code {
        Some(85 | 86 | 68) => Failure::Exists,
        Some(13) => Failure::Unauthorized,
        _ => Failure::Other,
    }
}

/// When our index could not be created (no permission, or an index of that name or on that key
/// exists), checks that an equivalent one is there: a TTL index on `expiresAt` that keeps
/// documents at least [`RETENTION`] after their lease ended. Our own index left by a release
/// that deleted documents as soon as their lease ended (`expireAfterSeconds: 0`) is raised with
/// `collMod`; anything else that falls short gets a warning. Whether a suitable index is there
/// now.
async fn check_existing_index(collection: &Collection<Document>) -> bool {
    let ttl_on_expiry: Vec<TtlIndex> = match collection.list_indexes().await {
        Ok(cursor) => cursor
            .try_collect::<Vec<_>>()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|index| index.keys == doc! { EXPIRES_AT: 1 })
            .map(|index| {
                let options = index.options.unwrap_or_default();
                TtlIndex {
                    ours: options.name.as_deref() == Some(TTL_INDEX_NAME),
                    expire_after: options.expire_after,
                }
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    match verdict(&ttl_on_expiry) {
        Verdict::Suitable => true,
        Verdict::Missing => {
            tracing::warn!(
            collection = %collection.name(),
            "could not create the TTL index on expiresAt and none exists: released lock \
             documents will not be deleted automatically (create {{expiresAt: 1}} with \
             expireAfterSeconds: 86400, or call Provider::purge_expired periodically)"
            );
            false
        }
        Verdict::RaiseOurs(after) => match raise_retention(collection).await {
            Ok(()) => {
                tracing::info!(
                    collection = %collection.name(),
                    from = ?after,
                    to = ?RETENTION,
                    "raised the expireAfterSeconds of the TTL index on expiresAt"
                );
                true
            }
            Err(error) => {
                warn_too_short(collection, after, Some(&error));
                false
            }
        },
        Verdict::TooShort(after) => {
            warn_too_short(collection, after, None);
            false
        }
    }
}

fn warn_too_short(
    collection: &Collection<Document>,
    after: Duration,
    collmod_error: Option<&mongodb::error::Error>,
) {
    tracing::warn!(
        collection = %collection.name(),
        expire_after = ?after,
        collmod_error = collmod_error.map(tracing::field::display),
        "a TTL index on expiresAt deletes lock documents less than a day after their lease \
         ended: fencing tokens may then go backwards when the next acquisition runs on a \
         router or primary whose clock is behind (raise its expireAfterSeconds to 86400 \
         with collMod)"
    );
}

/// Sets our TTL index's `expireAfterSeconds` to [`RETENTION`].
async fn raise_retention(collection: &Collection<Document>) -> mongodb::error::Result<()> {
    let command = doc! {
        "collMod": collection.name(),
        "index": { "name": TTL_INDEX_NAME, "expireAfterSeconds": RETENTION.as_secs() as i64 },
    };
    collection
        .client()
        .database(&collection.namespace().db)
        .run_command(command)
        .await
        .map(drop)
}

/// An index on `{expiresAt: 1}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TtlIndex {
    /// Named [`TTL_INDEX_NAME`]: created by this crate.
    ours: bool,
    /// `None`: not a TTL index.
    expire_after: Option<Duration>,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Suitable,
    Missing,
    /// None keeps documents long enough, and ours is among them: raise its retention.
    RaiseOurs(Duration),
    /// The shortest retention of the TTL indexes on `expiresAt`, none of them ours.
    TooShort(Duration),
}

/// Judges the indexes on `{expiresAt: 1}`: one that keeps documents [`RETENTION`] is enough.
fn verdict(ttl_on_expiry: &[TtlIndex]) -> Verdict {
    let retention = |index: &TtlIndex| index.expire_after;
    if ttl_on_expiry
        .iter()
        .filter_map(retention)
        .any(|after| after >= RETENTION)
    {
        return Verdict::Suitable;
    }
    if let Some(after) = ttl_on_expiry
        .iter()
        .filter(|index| index.ours)
        .find_map(retention)
    {
        return Verdict::RaiseOurs(after);
    }
    match ttl_on_expiry.iter().filter_map(retention).min() {
        None => Verdict::Missing,
        Some(shortest) => Verdict::TooShort(shortest),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_index_codes_mean_done() {
        for code in [85, 86, 68] {
            assert_eq!(classify(Some(code)), Failure::Exists);
        }
        assert_eq!(classify(Some(13)), Failure::Unauthorized);
        assert_eq!(classify(Some(11600)), Failure::Other);
        assert_eq!(classify(None), Failure::Other);
    }

    #[test]
    fn existing_indexes_must_keep_documents_a_day() {
        let theirs = |after: Option<Duration>| TtlIndex {
            ours: false,
            expire_after: after,
        };
        let ours = |after: Option<Duration>| TtlIndex {
            ours: true,
            expire_after: after,
        };
        assert_eq!(verdict(&[]), Verdict::Missing);
        assert_eq!(verdict(&[theirs(None)]), Verdict::Missing);
        assert_eq!(
            verdict(&[theirs(Some(Duration::ZERO))]),
            Verdict::TooShort(Duration::ZERO)
        );
        assert_eq!(verdict(&[theirs(Some(RETENTION))]), Verdict::Suitable);
        assert_eq!(
            verdict(&[ours(Some(Duration::ZERO))]),
            Verdict::RaiseOurs(Duration::ZERO)
        );
        assert_eq!(
            verdict(&[ours(Some(Duration::ZERO)), theirs(Some(RETENTION))]),
            Verdict::Suitable
        );
        // Ours is not a TTL index (someone replaced it): not ours to change.
        assert_eq!(
            verdict(&[ours(None), theirs(Some(Duration::from_secs(5)))]),
            Verdict::TooShort(Duration::from_secs(5))
        );
    }
}
