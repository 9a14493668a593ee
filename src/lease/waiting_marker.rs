//! A waiting marker: a waiter that must not be starved holds back the others while it waits (a
//! reader-writer lock's writer holds back new readers; a semaphore's waiter for several places
//! holds back the places it needs; a fair lock's waiter holds back those behind it in line), by
//! a marker with a lease of its own in the lock's document (a fair lock's: a place in the array
//! [`LINE`]).
//! Each attempt of the waiter places or renews it; the attempt that wins removes it; a wait that
//! ends without the lock removes it here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mongodb::bson::{Document, doc};
use mongodb::options::UpdateModifications;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::Target;
use super::revoke;
use super::schema::REVOKE;
use super::schema::{EMBEDDED_ID, ID, LINE, new_lock_id};
use super::{handoff, line};
use crate::error::{Error, Result, shown_name};
use crate::sync::Mutex;

/// A waiter's marker in the field `field` of its lock's document, removed when the wait ends
/// without the lock (also on drop).
pub(crate) struct WaitingMarker {
    target: Arc<Target>,
    runtime: Handle,
    field: &'static str,
    /// The marker's id (one per wait).
    pub(crate) id: String,
    /// Whether an attempt may have placed the marker.
    placed: AtomicBool,
    /// A place in line: the first place of the line as the wait's last reply showed it.
    head_seen: Mutex<Option<String>>,
}

impl WaitingMarker {
    /// A new wait's marker in `field` of `target`'s document; [`Error::NoRuntime`] outside a
    /// Tokio runtime.
    pub(crate) fn new(target: &Arc<Target>, field: &'static str) -> Result<Arc<WaitingMarker>> {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Ok(Arc::new(WaitingMarker {
            target: Arc::clone(target),
            runtime,
            field,
            id: new_lock_id(),
            placed: AtomicBool::new(false),
            head_seen: Mutex::new(None),
        }))
    }

    /// Whether the marker says which wait goes first: a place in a fair lock's line, or a
    /// revoking wait's request (the wait it names is the one the lock is kept for).
    pub(crate) fn in_line(&self) -> bool {
        self.field == LINE || self.field == REVOKE
    }

    /// A reply (of an attempt or a transfer) of this wait returned `document`: as a place in
    /// line, notes which place is first (for a revoking wait: whose request is stored), for this
    /// wait and for the lock's local waiters (see `handoff`: a release wakes only the waiter of
    /// the first place).
    pub(crate) fn saw(&self, document: &Document) {
        let head = match self.field {
            LINE => line::head(document),
            // (Only its own request makes it first: another's, an operator's or a lapsed one
            // names no local waiter, and would leave the local ones unwoken.)
            REVOKE => revoke::request_id(document).filter(|id| *id == self.id),
            _ => return,
        };
        handoff::saw_line(&self.target.waiters, head.clone());
        *self.head_seen.lock() = head;
    }

    /// As a place in line: its id, and the first place as its last reply showed it.
    pub(crate) fn place(&self) -> Option<(&str, Option<String>)> {
        self.in_line()
            .then(|| (self.id.as_str(), self.head_seen.lock().clone()))
    }

    /// The target whose document holds the marker.
    pub(crate) fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// An attempt about to be sent may place the marker.
    pub(crate) fn may_be_placed(&self) {
        self.placed.store(true, Ordering::Relaxed);
    }

    /// The attempt that won removed the marker: nothing is left to remove.
    pub(crate) fn removed_by_win(&self) {
        self.placed.store(false, Ordering::Relaxed);
    }

    /// Starts removing the marker, if one may have been placed; once.
    pub(crate) fn remove(&self) -> Option<JoinHandle<()>> {
        if !self.placed.swap(false, Ordering::Relaxed) {
            return None;
        }
        let collection = self.target.collection.clone();
        let (filter, update): (Document, UpdateModifications) = if self.field == LINE {
            let (filter, pipeline) = line::removal(&self.target.name, &self.id);
            (filter, pipeline.into())
        } else {
            let (filter, operators) = removal(&self.target.name, self.field, &self.id);
            (filter, operators.into())
        };
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
                    "could not remove a waiting marker; it ends with its lease"
                );
            }
        }))
    }

    /// Ends the wait: the marker is removed unless the wait `won` (its winning update removed
    /// it), and waited for when the wait ran out (`Ok(None)`: the others may go on as soon as
    /// this returns); after an error, dropping the marker removes it in the background.
    pub(crate) async fn end<T>(&self, result: &Result<Option<T>>) {
        match result {
            Ok(Some(_)) => self.removed_by_win(),
            Ok(None) => {
                if let Some(removal) = self.remove() {
                    let _ = removal.await;
                }
            }
            Err(_) => {}
        }
    }
}

/// The filter and update (of operators) that remove the marker `id` from the field `field` of
/// lock `name`'s document, if it is still there.
pub(crate) fn removal(name: &str, field: &str, id: &str) -> (Document, Document) {
    let filter = doc! { ID: name, format!("{field}.{EMBEDDED_ID}"): id };
    (filter, doc! { "$unset": { field: "" } })
}

pub(crate) use super::schema::marker_lease_millis;

impl Drop for WaitingMarker {
    fn drop(&mut self) {
        let _ = self.remove();
    }
}
