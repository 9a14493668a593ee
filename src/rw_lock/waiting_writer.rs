//! The waiting-writer marker: a writer that waits holds back new readers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mongodb::bson::{Document, doc};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use crate::error::shown_name;
use crate::lease::Target;
use crate::lease::schema::{EMBEDDED_ID, ID, WAITING_WRITER};

/// A waiting writer's marker, removed when the wait ends without the lock (also on drop).
pub(super) struct WaitingWriter {
    pub(super) target: Arc<Target>,
    pub(super) runtime: Handle,
    pub(super) id: String,
    /// Whether an attempt may have placed the marker.
    pub(super) placed: AtomicBool,
}

impl WaitingWriter {
    /// Starts removing the marker, if one may have been placed; once.
    pub(super) fn remove(&self) -> Option<JoinHandle<()>> {
        if !self.placed.swap(false, Ordering::Relaxed) {
            return None;
        }
        let collection = self.target.collection.clone();
        let (filter, update) = removal(&self.target.name, &self.id);
        let write_concern = self.target.options.write_concern().clone();
        let name = self.target.name.clone();
        Some(self.runtime.spawn(async move {
            let removed = collection
                .update_one(filter, update)
                .write_concern(write_concern)
                .await;
            if let Err(error) = removed {
                tracing::warn!(
                    lock = %shown_name(&name),
                    %error,
                    "could not remove the waiting-writer marker; it ends with its lease"
                );
            }
        }))
    }
}

/// The filter and update (of operators) that remove the waiting writer `id`'s marker from
/// reader-writer lock `name`, if it is still there.
pub(crate) fn removal(name: &str, id: &str) -> (Document, Document) {
    let filter = doc! { ID: name, format!("{WAITING_WRITER}.{EMBEDDED_ID}"): id };
    (filter, doc! { "$unset": { WAITING_WRITER: "" } })
}

impl Drop for WaitingWriter {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}
