//! A held lease as the engine tracks it, where it lives, and the table of a renewal loop's leases
//! (shared with the family, so that a shutdown can release them without the loop).

use std::collections::HashMap;
use std::sync::Arc;

use mongodb::bson::{Bson, Document, doc};
use mongodb::{Collection, Database, Namespace};

use super::handoff;
use super::lost::Loss;
use super::metrics;
use super::schema::{Ending, Layout};
use super::state::LeaseState;
use super::undo::Undo;
use crate::error::shown_name;
use crate::lock_status::LockKind;
use crate::options::LockOptions;
use crate::sync::{Mutex, MutexGuard};

/// Where leases live and how they are renewed: a collection (of a deployment), the layout of
/// the leases in its documents, and the options. What one renewal loop serves.
#[derive(Clone, Debug)]
pub(crate) struct Place {
    pub(crate) collection: Collection<Document>,
    pub(crate) deployment: Deployment,
    pub(crate) layout: Layout,
    pub(crate) options: LockOptions,
}

/// The deployment a lock's commands reach, as far as this process can tell: the `Database` or
/// `Collection` handle the lock was built from.
///
/// A `mongodb::Client` has no identity to compare, and two clients may reach two deployments
/// whose databases and collections have the same names. Handles cloned from one another share
/// their client, so two places count as one deployment when their handles descend from one
/// handle (compared by the address of the client inside it, which this value keeps alive).
/// Handles of one client made apart count as two: that costs a renewal loop each, never a lease
/// renewed or released on another deployment.
#[derive(Clone, Debug)]
pub(crate) enum Deployment {
    /// A lock of a database's lock collection (exclusive, reader-writer, semaphore).
    Database(Database),
    /// A document lock of an application's collection.
    Collection(Collection<Document>),
}

impl Deployment {
    fn identity(&self) -> usize {
        match self {
            Deployment::Database(database) => std::ptr::from_ref(database.client()).addr(),
            Deployment::Collection(collection) => std::ptr::from_ref(collection.client()).addr(),
        }
    }
}

impl PartialEq for Deployment {
    fn eq(&self, other: &Self) -> bool {
        self.identity() == other.identity()
    }
}

impl Eq for Deployment {}

impl std::hash::Hash for Deployment {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.identity().hash(state);
    }
}

impl Place {
    pub(crate) fn namespace(&self) -> Namespace {
        self.collection.namespace()
    }

    /// The update that ends at once whatever lease `lock_id` holds in document `id` (the
    /// cleanup after an attempt whose outcome is unknown: its caller never had the lock).
    pub(crate) fn cleanup_undo(&self, id: &Bson, lock_id: &str, name: &str) -> Undo {
        self.undo(id, lock_id, name, Ending::Cleanup)
    }

    /// The update that ends `lease` as its own release would: keeping an exclusive lock's
    /// `min_hold` window, unless nobody was given the lease (then at once).
    pub(crate) fn ending_undo(&self, lease: &Lease) -> Undo {
        self.undo(&lease.id, &lease.lock_id, &lease.name, lease.ending())
    }

    fn undo(&self, id: &Bson, lock_id: &str, name: &str, ending: Ending) -> Undo {
        Undo {
            collection: self.collection.clone(),
            filter: self.layout.release_filter(id, lock_id),
            update: self.layout.release_update(lock_id, ending),
            write_concern: self.options.write_concern().clone(),
            patience: self.options.expiry(),
            many: false,
            name: name.to_owned(),
        }
    }
}

/// A held lease, as its renewal loop tracks it.
#[derive(Debug)]
pub(crate) struct Lease {
    /// The `_id` of the document holding the lease.
    pub(crate) id: Bson,
    /// How the lock is named in messages.
    pub(crate) name: String,
    /// The kind of lock, for metrics: `exclusive`, `read`, `write`, `semaphore`, `document`.
    pub(crate) kind: LockKind,
    pub(crate) lock_id: String,
    /// Its deadline and lost state, shared with the guard.
    pub(crate) state: Arc<LeaseState>,
    /// Identifies the lock's in-process waiters, to wake one on release.
    pub(crate) waiters: Option<handoff::Key>,
    /// For an exclusive lease: counts it as held in this process until it ends here.
    pub(crate) holding: Option<handoff::Holding>,
}

impl Lease {
    pub(crate) fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// How its release ends it: keeping a `min_hold` window, unless the lease was never
    /// delivered to a caller (won after the caller stopped waiting): nobody ran anything under
    /// it, so nothing is kept.
    pub(crate) fn ending(&self) -> Ending {
        if super::protocol::keeps_window(!self.state.is_undelivered()) {
            Ending::Release
        } else {
            Ending::Cleanup
        }
    }

    /// The lease is over here (released, or its release's outcome is known as well as it will
    /// be): it no longer counts as held in this process.
    pub(crate) fn end_here(&self) {
        if let Some(holding) = &self.holding {
            holding.end();
        }
    }

    /// Why a lease whose deadline has passed is lost: `max_hold` if its hold is over, `max_idle`
    /// if its work stalled, else `otherwise`.
    pub(crate) fn overdue(&self, otherwise: Loss) -> Loss {
        if self.state.hold_ended() {
            Loss::MaxHold
        } else if self.state.idle_ended() {
            Loss::MaxIdle
        } else {
            otherwise
        }
    }

    pub(crate) fn mark_lost(&self, loss: Loss) {
        if self.state.mark_lost() {
            if self.state.is_undelivered() {
                tracing::debug!(lock = %shown_name(&self.name), reason = loss.describe(), "the lease of an acquisition nobody waited for any more ended");
            } else {
                tracing::warn!(lock = %shown_name(&self.name), reason = loss.describe(), "lock lost");
                metrics::lost(self.kind, loss);
            }
        }
        // Local waiters may be able to take it: the first goes back to the busy-wait pace.
        if let Some(holding) = &self.holding {
            holding.end();
        }
    }

    /// Roughly how many bytes this lease adds to a renewal command (its `_id` and lock id appear
    /// in the filter, the lock id once more in an array-member update).
    pub(crate) fn command_bytes(&self) -> usize {
        let id = match &self.id {
            Bson::String(name) => name.len(),
            other => {
                mongodb::bson::to_vec(&doc! { "id": other.clone() }).map_or(64, |raw| raw.len())
            }
        };
        id + 2 * self.lock_id.len() + 32
    }
}

/// The leases of one renewal loop, by lock id. The loop renews them; the family adds them (so that
/// a lease is in the table before its guard exists) and takes them all on shutdown.
#[derive(Debug, Default)]
pub(crate) struct LeaseTable {
    leases: Mutex<HashMap<String, Lease>>,
}

impl LeaseTable {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<String, Lease>> {
        self.leases.lock()
    }
}
