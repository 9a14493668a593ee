//! Who holds a lock: details stored with each holder, shown by status queries.

use std::sync::OnceLock;

use mongodb::bson::{Bson, Document, doc};

use crate::token::read_i64;

/// Who holds a lock, stored next to the holder's lease and shown by
/// [`Provider::held_locks`](crate::Provider::held_locks) and the `holders` methods of the
/// reader-writer lock and the semaphore.
///
/// Reader-writer locks and semaphores store the details of the process by default (host and
/// process id, no owner); set an owner or extra fields with their `with_details`. The plain
/// exclusive lock stores none unless asked to (see
/// [`MongoDistributedLock::with_details`](crate::MongoDistributedLock::with_details)), because
/// DistributedLock.MongoDB (.NET) refuses lock documents with fields it does not know.
///
/// Details are informational: nothing reads them to decide who holds a lock.
///
/// ```
/// use distributed_lock_mongodb::LockDetails;
/// use mongodb::bson::doc;
///
/// let details = LockDetails::new()
///     .with_owner("billing-worker")
///     .with_extra(doc! { "job": "nightly-invoices" });
/// assert_eq!(details.pid, Some(std::process::id()));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LockDetails {
    /// Who holds the lock, in the application's words (a service, a user, a job).
    pub owner: Option<String>,
    /// The holder's host name.
    pub host: Option<String>,
    /// The holder's process id.
    pub pid: Option<u32>,
    /// Anything else the application wants to show.
    pub extra: Document,
}

const OWNER: &str = "owner";
const HOST: &str = "host";
const PID: &str = "pid";
const EXTRA: &str = "extra";

impl LockDetails {
    /// This process's details: its host name and process id, no owner, no extra fields.
    ///
    /// The host name comes from `/proc/sys/kernel/hostname` (Linux), else from the `HOSTNAME`
    /// or `COMPUTERNAME` environment variables; it is `None` if none of them is set.
    pub fn new() -> Self {
        LockDetails {
            owner: None,
            host: host_name().cloned(),
            pid: Some(std::process::id()),
            extra: Document::new(),
        }
    }

    /// Sets the owner.
    #[must_use]
    pub fn with_owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Sets the extra fields.
    #[must_use]
    pub fn with_extra(mut self, extra: Document) -> Self {
        self.extra = extra;
        self
    }

    /// The stored form: only the fields that are set.
    pub(crate) fn to_document(&self) -> Document {
        let mut stored = doc! {};
        if let Some(owner) = &self.owner {
            stored.insert(OWNER, owner.as_str());
        }
        if let Some(host) = &self.host {
            stored.insert(HOST, host.as_str());
        }
        if let Some(pid) = self.pid {
            stored.insert(PID, i64::from(pid));
        }
        if !self.extra.is_empty() {
            stored.insert(EXTRA, self.extra.clone());
        }
        stored
    }

    /// Reads stored details tolerantly: fields of the wrong type count as unset.
    pub(crate) fn from_bson(value: &Bson) -> Option<LockDetails> {
        let stored = value.as_document()?;
        Some(LockDetails {
            owner: stored.get_str(OWNER).ok().map(str::to_owned),
            host: stored.get_str(HOST).ok().map(str::to_owned),
            pid: stored
                .get(PID)
                .and_then(read_i64)
                .and_then(|pid| u32::try_from(pid).ok()),
            extra: stored.get_document(EXTRA).cloned().unwrap_or_default(),
        })
    }
}

impl Default for LockDetails {
    /// The same as [`LockDetails::new`].
    fn default() -> Self {
        LockDetails::new()
    }
}

fn host_name() -> Option<&'static String> {
    static HOST_NAME: OnceLock<Option<String>> = OnceLock::new();
    HOST_NAME
        .get_or_init(|| {
            let from_kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
            from_kernel
                .or_else(|| std::env::var("HOSTNAME").ok())
                .or_else(|| std::env::var("COMPUTERNAME").ok())
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_round_trip_through_their_stored_form() {
        let details = LockDetails::new()
            .with_owner("me")
            .with_extra(doc! { "job": 7 });
        let stored = Bson::Document(details.to_document());
        assert_eq!(LockDetails::from_bson(&stored), Some(details));
    }

    #[test]
    fn unset_and_odd_fields_read_as_none() {
        let odd = Bson::Document(doc! { "owner": 5, "pid": -1, "extra": "x" });
        let read = LockDetails::from_bson(&odd).unwrap();
        assert_eq!(
            (read.owner, read.host, read.pid, read.extra),
            (None, None, None, Document::new())
        );
        assert_eq!(LockDetails::from_bson(&Bson::Null), None);
        assert!(
            !LockDetails::new()
                .with_owner("o")
                .to_document()
                .contains_key(EXTRA)
        );
    }
}
