//! What ends a lease whose fate is not known here: one update filtered by its lock id, which can
//! never touch anyone else's lease.

use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::Document;
use mongodb::options::WriteConcern;

use crate::error::shown_name;

/// An update that ends whatever lease a lock id may hold: the cleanup of an acquisition attempt
/// whose outcome is unknown, or a release sent (again) by a shutdown.
#[derive(Clone, Debug)]
pub(crate) struct Undo {
    pub(crate) collection: Collection<Document>,
    /// Contains the lock id, so it matches only what that lock id holds.
    pub(crate) filter: Document,
    pub(crate) update: Vec<Document>,
    pub(crate) write_concern: WriteConcern,
    /// How long to wait for the reply (the lease's `expiry`: by then the lease has ended anyway).
    pub(crate) patience: Duration,
    /// Whether to send an `update_many`: for a filter without the document's `_id` (a document
    /// lock's cleanup), which a sharded collection accepts only as a multi-document update before
    /// MongoDB 7.0. A lock id is in at most one document, so it changes the same as `update_one`.
    pub(crate) many: bool,
    /// The lock's name, for messages.
    pub(crate) name: String,
}

#[cfg(test)]
impl Undo {
    /// An undo for a server nobody listens on: sending it takes its whole `patience`.
    pub(crate) async fn unanswered(patience: Duration) -> Undo {
        let client =
            mongodb::Client::with_uri_str("mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=60000")
                .await
                .expect("a valid URI");
        Undo {
            collection: client.database("d").collection("c"),
            filter: mongodb::bson::doc! { "lockId": "a" },
            update: vec![mongodb::bson::doc! { "$set": { "x": 1 } }],
            write_concern: WriteConcern::default(),
            patience,
            many: false,
            name: "n".into(),
        }
    }
}

impl Undo {
    /// Sends the update and waits at most its `patience` for the reply; whether it ended a
    /// lease. Failures are logged: the lease, if any, ends at its expiry.
    pub(crate) async fn send(&self) -> bool {
        let (filter, update) = (self.filter.clone(), self.update.clone());
        let sent = async {
            if self.many {
                self.collection
                    .update_many(filter, update)
                    .write_concern(self.write_concern.clone())
                    .await
            } else {
                self.collection
                    .update_one(filter, update)
                    .write_concern(self.write_concern.clone())
                    .await
            }
        };
        let name = shown_name(&self.name);
        match tokio::time::timeout(self.patience, sent).await {
            Ok(Ok(result)) => {
                let ended = result.modified_count > 0;
                if ended {
                    tracing::debug!(lock = %name, "ended a lease whose outcome was unknown");
                }
                ended
            }
            Ok(Err(error)) => {
                tracing::debug!(lock = %name, %error, "could not end a lease whose outcome was unknown; it ends at its expiry");
                false
            }
            Err(_elapsed) => {
                tracing::debug!(lock = %name, "no reply to the update ending a lease whose outcome was unknown; it ends at its expiry");
                false
            }
        }
    }
}
