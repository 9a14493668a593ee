//! The crate's error type.

use std::fmt;
use std::time::Duration;

use crate::lock_status::LockStatus;

/// How many characters of a lock name appear in messages and traces. Names can be up to
/// MongoDB's document size, and a megabyte-long log line helps nobody.
const SHOWN_NAME_CHARS: usize = 100;

/// Shortens `name` for display, marking the cut.
pub(crate) fn shown_name(name: &str) -> String {
    match name.char_indices().nth(SHOWN_NAME_CHARS) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_owned(),
    }
}

/// Everything that can go wrong when using a lock.
///
/// Marked `#[non_exhaustive]`: new failure kinds may be added in minor releases.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock stayed busy until the caller's deadline. Its message says what held it then.
    /// Retrying later is reasonable.
    #[error("{}", busy_message(name, *waited, holders))]
    Timeout {
        /// The lock's name (for a document lock: the collection).
        name: String,
        /// How long the caller waited.
        waited: Duration,
        /// What held the lock when the wait ran out, read just then (one more command, only on
        /// this path): the holder of an exclusive lock or of the locked document, the holders of
        /// a semaphore or a reader-writer lock; each with its lock id, stored details and how
        /// much of its lease was left. Empty if that read failed, or found the lock free again.
        holders: Vec<LockStatus>,
    },

    /// MongoDB did not answer a request in time ([`Operation::AttemptReply`],
    /// [`Operation::Release`], [`Operation::Commit`]): the server is unreachable, overloaded or
    /// behind a half-open connection. What the request did is unknown; the message says what
    /// the crate does about it. Never reported for a busy lock.
    #[error("{}", no_reply_message(*operation, name, *waited))]
    NoReply {
        /// What got no reply.
        operation: Operation,
        /// The lock's name (for a document lock: `collection/_id`, or the collection while
        /// no document is locked yet).
        name: String,
        /// How long the request was waited for.
        waited: Duration,
    },

    /// An option (or argument) is out of range. The message names the offending option and
    /// value; fix the configuration, retrying will not help.
    #[error("invalid lock options: {0}")]
    InvalidOptions(String),

    /// An argument is unusable (an update that is not made of update operators or touches the
    /// lock field, a lock field name MongoDB cannot address, a document that does not
    /// serialize). The message says which; nothing was written.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No document matches the filter given to a [`DocumentLock`](crate::DocumentLock).
    #[error("no document in {collection:?} matches the filter")]
    DocumentNotFound {
        /// The collection searched.
        collection: String,
    },

    /// The collection name cannot hold locks: MongoDB would reject it.
    #[error("invalid collection name {collection:?}: {reason}")]
    InvalidCollectionName {
        /// The rejected name.
        collection: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// The lock was lost (its lease expired, or another client removed or took it) before it
    /// was released. Work done under the lock since then may have overlapped with another
    /// holder's; use fencing tokens to make protected writes safe.
    #[error("lock {:?} was lost before it was released", shown_name(name))]
    LockLost {
        /// The lock's name.
        name: String,
    },

    /// A guard's `extend` was refused: a revocation request targets the lease and its grace
    /// still runs (see [`crate::revocation`]; once the grace is over, `extend` returns
    /// [`Error::LockLost`]). Nothing was written; the lease still ends as it would have. Let the
    /// lock go (release it) before the grace runs out: renewals stop then.
    #[error(
        "the extension of lock {:?} was refused: its holder was asked to let go",
        shown_name(name)
    )]
    RevocationRequested {
        /// The lock's name.
        name: String,
    },

    /// A lease-checked transaction's commit got no definite answer (its reply was lost, or it
    /// kept failing with `UnknownTransactionCommitResult` until the lock was lost or 120 s
    /// passed): **its writes may or may not have been committed**. Nothing else was written by
    /// the crate. Read back what the transaction wrote (or make its writes idempotent) before
    /// running it again; if they are there, they were committed while the lock was held.
    #[error(
        "the commit of a transaction under lock {:?} has an unknown outcome: its writes may or may \
         not have been committed ({reason})",
        shown_name(name)
    )]
    CommitOutcomeUnknown {
        /// The lock's name.
        name: String,
        /// What made the outcome unknown.
        reason: String,
    },

    /// The MongoDB driver reported an error (network, server selection, authorization, write
    /// concern, ...). Inspect it for details; transient errors can be retried. Its message
    /// includes the driver's, so it is not also given as the error's `source()` (an error
    /// chain prints it once).
    #[error("MongoDB error: {0}")]
    Mongo(mongodb::error::Error),

    /// MongoDB answered with something this crate does not understand, for example a lock
    /// document it did not write itself. The message describes what was found.
    #[error("unexpected reply from MongoDB: {0}")]
    UnexpectedReply(String),

    /// The operation must run inside a Tokio runtime (the lease and the driver need one).
    #[error("no Tokio runtime: locks must be used from within a Tokio runtime")]
    NoRuntime,

    /// The [`Provider`](crate::Provider) that created this lock was
    /// [shut down](crate::Provider::shutdown): it acquires nothing any more.
    #[error("the provider of this lock was shut down: it acquires no more locks")]
    ShutDown,

    /// A method of the blocking API (cargo feature `blocking`) was called on a thread that
    /// runs inside a Tokio runtime, where blocking would stall the runtime's other tasks (and
    /// Tokio forbids starting a runtime within a runtime). Nothing was done. Use the async API
    /// ([`Provider`](crate::Provider) and its locks) there instead.
    #[error(
        "a blocking method of distributed_lock_mongodb::blocking was called from within a Tokio \
         runtime, where it would block the runtime's thread; use the async API \
         (distributed_lock_mongodb::Provider and its locks) there"
    )]
    BlockingInAsyncContext,

    /// The blocking API (cargo feature `blocking`) could not start its Tokio runtime (the
    /// operating system refused a thread or an I/O driver). Its message includes the
    /// operating system's, which is not also given as `source()`.
    #[error("could not start the Tokio runtime of the blocking API: {0}")]
    RuntimeStart(std::io::Error),

    /// An administrative delete ([`Provider::purge_expired`](crate::Provider::purge_expired))
    /// was refused because the collection does not look like a lock collection: most of the
    /// documents read from it are not shaped like the lock documents of the kinds configured for
    /// it (a wrong collection name, or one shared with application data). Nothing was changed.
    /// Check the provider's collection settings. (Every administrative delete or update touches
    /// only documents shaped like lock documents in any case.)
    #[error(
        "collection {collection:?} does not look like a lock collection: {reason}; nothing was changed"
    )]
    NotALockCollection {
        /// The collection refused.
        collection: String,
        /// What was found in it.
        reason: String,
    },

    /// A background task of this lock ended before it could report back, typically because its
    /// Tokio runtime is shutting down.
    #[error("the background task of {operation} ended early (is the runtime shutting down?)")]
    BackgroundTaskEnded {
        /// What the task was doing.
        operation: Operation,
    },
}

/// What an [`Error::NoReply`] or [`Error::BackgroundTaskEnded`] interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Waiting to acquire a lock (any kind, including locking a document): it stayed busy
    /// until the caller's deadline.
    Acquire,
    /// One acquisition attempt: MongoDB did not answer in time (at least five seconds, at most
    /// `expiry`). Whether it applied is unknown; the crate ends whatever it may have taken.
    AttemptReply,
    /// Releasing a lock: no try got a reply within `expiry`; the lease ends by itself then.
    Release,
    /// Committing, replacing or checkpointing a locked document: no reply within `expiry`; or
    /// a lease-checked transaction, whose renewal's task ended early.
    Commit,
    /// Extending a lease (a guard's `extend`): no reply before the lease's deadline, or the
    /// server's time limit ran out (its document may be held back by a transaction). Whether
    /// it applied is unknown; the lease keeps the deadline it had.
    Extend,
    /// An administration call or a read of a lock's holders (`status`, `holders`,
    /// `held_locks`, a forced release, a purge, a watch's first read): no reply within the
    /// lock's `expiry` (at least five seconds). A write's outcome is unknown.
    Administration,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Acquire => "acquisition",
            Operation::AttemptReply => "an acquisition attempt",
            Operation::Release => "release",
            Operation::Commit => "commit",
            Operation::Administration => "an administration call",
            Operation::Extend => "an extension",
        })
    }
}

fn busy_message(name: &str, waited: Duration, holders: &[LockStatus]) -> String {
    let name = shown_name(name);
    let busy = format!("timed out after {waited:?} waiting to acquire {name:?}");
    match holders {
        [] => busy,
        holders => format!("{busy}: {}", holders_text(holders)),
    }
}

/// What held a lock, in one line: "held by lock id … (owner …, host …, pid …) with 12.3 s of its
/// lease left", or "held by 3 holders: …; …", or "holder unknown".
pub(crate) fn holders_text(holders: &[LockStatus]) -> String {
    let holder = |holder: &LockStatus| {
        let mut text = match &holder.lock_id {
            Some(lock_id) => format!("lock id {lock_id}"),
            None => "its last holder's minimum hold".to_owned(),
        };
        let who: Vec<String> = [
            holder.owner().map(|owner| format!("owner {owner}")),
            holder.host().map(|host| format!("host {host}")),
            holder.pid().map(|pid| format!("pid {pid}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !who.is_empty() {
            text.push_str(&format!(" ({})", who.join(", ")));
        }
        if let Some(remaining) = holder.remaining {
            text.push_str(&format!(
                " with {:.1} s of its lease left",
                remaining.as_secs_f64()
            ));
        }
        if let Some(kept) = holder.kept {
            text.push_str(&format!(", {:.1} s more", kept.as_secs_f64()));
        }
        text
    };
    match holders {
        [] => "holder unknown".to_owned(),
        [only] => format!("held by {}", holder(only)),
        many => format!(
            "held by {} holders: {}",
            many.len(),
            many.iter().map(holder).collect::<Vec<_>>().join("; ")
        ),
    }
}

fn no_reply_message(operation: Operation, name: &str, waited: Duration) -> String {
    let name = shown_name(name);
    match operation {
        Operation::Acquire => {
            format!("waiting to acquire {name:?} got no reply from MongoDB within {waited:?}")
        }
        Operation::AttemptReply => format!(
            "an acquisition attempt on {name:?} got no reply from MongoDB within {waited:?}"
        ),
        Operation::Release => format!(
            "the release of {name:?} got no reply from MongoDB within {waited:?}; the lease \
             ends by itself at its expiry"
        ),
        Operation::Commit => format!(
            "the commit of {name:?} got no reply from MongoDB within {waited:?}; whether it \
             was applied is unknown"
        ),
        Operation::Administration => format!(
            "an administration call on {name:?} got no reply from MongoDB within {waited:?}; \
             whether a write it made was applied is unknown"
        ),
        Operation::Extend => format!(
            "the extension of {name:?}'s lease got no reply from MongoDB within {waited:?}; \
             whether it was applied is unknown, and the lease keeps the deadline it had"
        ),
    }
}

impl From<mongodb::error::Error> for Error {
    fn from(error: mongodb::error::Error) -> Self {
        Error::Mongo(error)
    }
}

impl Error {
    /// Whether the lock stayed busy until the caller's deadline ([`Error::Timeout`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// Whether MongoDB did not answer a request in time ([`Error::NoReply`]).
    pub fn is_no_reply(&self) -> bool {
        matches!(self, Error::NoReply { .. })
    }

    /// Whether the lock had been lost before it was released ([`Error::LockLost`]).
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. })
    }

    /// Whether the caller's input is at fault ([`Error::InvalidOptions`],
    /// [`Error::InvalidArgument`], [`Error::InvalidCollectionName`] or
    /// [`Error::NotALockCollection`]).
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidOptions(_)
                | Error::InvalidArgument(_)
                | Error::InvalidCollectionName { .. }
                | Error::NotALockCollection { .. }
        )
    }
}

impl Error {
    /// Whether the failure is likely to pass by itself: no reply in time, a network error, no
    /// primary (an election), a primary stepping down or shutting down. Waiting acquisitions
    /// retry these within their deadline (see the crate docs).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::NoReply { operation, .. } => *operation == Operation::AttemptReply,
            Error::Mongo(error) => is_transient_driver_error(error),
            _ => false,
        }
    }
}

/// Server error codes of a replica-set state change, a network problem or slow replication: the
/// set the driver retries writes on, plus a write-concern timeout and a command that ran out of
/// its server-side time limit (an attempt held back on the server, behind a transaction say; its
/// outcome is unknown like that of any failed attempt, and it is cleaned up after).
const TRANSIENT_CODES: [i32; 14] = [
    6,     // HostUnreachable
    7,     // HostNotFound
    50,    // MaxTimeMSExpired
    64,    // WriteConcernFailed (wtimeout: replication is slow)
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    189,   // PrimarySteppedDown
    262,   // ExceededTimeLimit
    9001,  // SocketException
    10107, // NotWritablePrimary
    11600, // InterruptedAtShutdown
    11602, // InterruptedDueToReplStateChange
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

fn is_transient_driver_error(error: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    matches!(
        error.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ConnectionPoolCleared { .. }
            | ErrorKind::ServerSelection { .. }
    ) || error.contains_label("RetryableWriteError")
        || error_code(error).is_some_and(|code| TRANSIENT_CODES.contains(&code))
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Duplicate key (E11000).
const DUPLICATE_KEY: i32 = 11000;

/// Whether a driver error is a duplicate-key error: two clients upserted the same `_id` at once
/// and the server did not retry it. The lock then has another holder; the attempt failed.
pub(crate) fn is_duplicate_key(error: &mongodb::error::Error) -> bool {
    error_code(error) == Some(DUPLICATE_KEY)
}

/// Whether a driver error is a duplicate key on `_id` (not on some other unique index): the
/// document exists already. Read from the reply's `keyPattern` where the server sent one (the
/// command error itself, or its first write error), else from the index name in the message.
pub(crate) fn is_duplicate_id(error: &mongodb::error::Error) -> bool {
    if !is_duplicate_key(error) {
        return false;
    }
    let reply = error
        .server_response()
        .and_then(|raw| mongodb::bson::Document::try_from(raw.to_owned()).ok());
    let key_pattern = reply.as_ref().and_then(|reply| {
        reply.get_document("keyPattern").ok().or_else(|| {
            reply
                .get_array("writeErrors")
                .ok()?
                .first()?
                .as_document()?
                .get_document("keyPattern")
                .ok()
        })
    });
    match key_pattern {
        Some(pattern) => pattern.keys().eq(["_id"]),
        None => {
            duplicate_key_message(error).is_some_and(|message| message.contains(" index: _id_ "))
        }
    }
}

fn duplicate_key_message(error: &mongodb::error::Error) -> Option<&str> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match error.kind.as_ref() {
        ErrorKind::Command(command) => Some(&command.message),
        ErrorKind::Write(WriteFailure::WriteError(write)) => Some(&write.message),
        _ => None,
    }
}

/// The server's error code carried by a driver error, if any.
pub(crate) fn error_code(error: &mongodb::error::Error) -> Option<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match error.kind.as_ref() {
        ErrorKind::Command(command) => Some(command.code),
        ErrorKind::Write(WriteFailure::WriteError(write)) => Some(write.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(concern)) => Some(concern.code),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::doc;
    use mongodb::error::{CommandError, ErrorKind, WriteError, WriteFailure};

    /// An error chain (each `source()` after the error itself) names the driver's problem once.
    #[test]
    fn a_chain_prints_the_driver_error_once() {
        let command: CommandError = mongodb::bson::from_document(
            doc! { "code": 13, "codeName": "Unauthorized", "errmsg": "not authorized on locks" },
        )
        .expect("valid command error document");
        let error = Error::Mongo(ErrorKind::Command(command).into());
        let mut chain = vec![error.to_string()];
        let mut source = std::error::Error::source(&error);
        while let Some(next) = source {
            chain.push(next.to_string());
            source = next.source();
        }
        let text = chain.join(": ");
        assert!(text.starts_with("MongoDB error: "), "{text}");
        assert_eq!(text.matches("not authorized on locks").count(), 1, "{text}");
        let runtime = Error::RuntimeStart(std::io::Error::other("no threads left"));
        assert!(std::error::Error::source(&runtime).is_none());
        assert!(
            runtime.to_string().ends_with("no threads left"),
            "{runtime}"
        );
    }

    fn command_error(code: i32) -> mongodb::error::Error {
        let command: CommandError =
            mongodb::bson::from_document(doc! { "code": code, "codeName": "X", "errmsg": "x" })
                .expect("valid command error document");
        ErrorKind::Command(command).into()
    }

    fn write_error(code: i32) -> mongodb::error::Error {
        let write: WriteError =
            mongodb::bson::from_document(doc! { "code": code, "errmsg": "E11000 duplicate key" })
                .expect("valid write error document");
        ErrorKind::Write(WriteFailure::WriteError(write)).into()
    }

    #[test]
    fn duplicate_key_is_recognised_as_write_and_command_error() {
        assert!(is_duplicate_key(&write_error(11000)));
        assert!(is_duplicate_key(&command_error(11000)));
    }

    #[test]
    fn only_a_duplicate_id_means_the_document_exists() {
        let on = |index: &str| {
            let write: WriteError = mongodb::bson::from_document(doc! {
                "code": 11000,
                "errmsg": format!("E11000 duplicate key error collection: db.c index: {index} dup key: {{ x: 1 }}"),
            })
            .expect("valid write error document");
            mongodb::error::Error::from(ErrorKind::Write(WriteFailure::WriteError(write)))
        };
        assert!(is_duplicate_id(&on("_id_")));
        assert!(!is_duplicate_id(&on("email_1")));
        assert!(!is_duplicate_id(&on("_id_email")));
        assert!(!is_duplicate_id(&write_error(121)));
    }

    #[test]
    fn other_errors_are_not_duplicate_keys() {
        assert!(!is_duplicate_key(&write_error(121)));
        assert!(!is_duplicate_key(&command_error(13)));
        let io = mongodb::error::Error::from(std::io::Error::other("reset"));
        assert!(!is_duplicate_key(&io));
        assert_eq!(error_code(&io), None);
    }

    #[test]
    fn elections_and_network_errors_are_transient_other_errors_are_not() {
        for code in [10107, 11602, 189, 91] {
            assert!(Error::Mongo(command_error(code)).is_transient(), "{code}");
        }
        let io = mongodb::error::Error::from(std::io::Error::other("reset"));
        assert!(Error::Mongo(io).is_transient());
        assert!(
            !Error::Mongo(command_error(13)).is_transient(),
            "unauthorized"
        );
        assert!(!Error::Mongo(write_error(11000)).is_transient());
        let no_reply = Error::NoReply {
            operation: Operation::AttemptReply,
            name: "n".into(),
            waited: Duration::from_secs(5),
        };
        assert!(no_reply.is_transient());
        let busy = Error::Timeout {
            name: "n".into(),
            waited: Duration::from_secs(5),
            holders: Vec::new(),
        };
        assert!(!busy.is_transient());
        assert!(!Error::InvalidArgument("x".into()).is_transient());
    }

    #[test]
    fn timeout_messages_read_as_sentences() {
        let busy = |holders| Error::Timeout {
            name: "jobs".into(),
            waited: Duration::from_secs(5),
            holders,
        };
        assert_eq!(
            busy(Vec::new()).to_string(),
            "timed out after 5s waiting to acquire \"jobs\""
        );
        let holder = |lock_id: &str, owner: Option<&str>| LockStatus {
            name: "jobs".into(),
            kind: crate::lock_status::LockKind::Semaphore,
            lock_id: Some(lock_id.into()),
            acquired_at: None,
            expires_at: None,
            renewed_at: None,
            fencing_token: None,
            remaining: Some(Duration::from_millis(12_340)),
            kept: None,
            min_hold_until: None,
            details: owner.map(|owner| crate::LockDetails::new().with_owner(owner)),
            places: 1,
            upgradeable: false,
            revocation: None,
        };
        let one = busy(vec![holder("7f3a", Some("worker-7"))]).to_string();
        assert!(
            one.starts_with(
                "timed out after 5s waiting to acquire \"jobs\": held by lock id 7f3a (owner \
                 worker-7, host "
            ),
            "{one}"
        );
        assert!(one.ends_with("with 12.3 s of its lease left"), "{one}");
        assert!(!one.contains('\n'), "one line: {one}");
        let two = busy(vec![holder("a", None), holder("b", None)]).to_string();
        assert!(
            two.contains("held by 2 holders: lock id a with 12.3 s of its lease left; lock id b"),
            "{two}"
        );
        let no_reply = |operation| Error::NoReply {
            operation,
            name: "jobs".into(),
            waited: Duration::from_secs(5),
        };
        assert_eq!(
            no_reply(Operation::AttemptReply).to_string(),
            "an acquisition attempt on \"jobs\" got no reply from MongoDB within 5s"
        );
        assert!(
            no_reply(Operation::Release)
                .to_string()
                .starts_with("the release of")
        );
        let ended = Error::BackgroundTaskEnded {
            operation: Operation::Release,
        };
        assert_eq!(
            ended.to_string(),
            "the background task of release ended early (is the runtime shutting down?)"
        );
    }

    #[test]
    fn long_names_are_shortened_in_messages() {
        let name = "é".repeat(1_000);
        let message = Error::LockLost { name: name.clone() }.to_string();
        assert!(message.len() < 400, "{message}");
        assert!(message.contains('…'));
        assert_eq!(shown_name("short"), "short");
        assert_eq!(shown_name(&"a".repeat(100)), "a".repeat(100));
    }

    #[test]
    fn helpers_classify_variants() {
        let timeout = Error::Timeout {
            name: "n".into(),
            waited: Duration::from_millis(5),
            holders: Vec::new(),
        };
        assert!(timeout.is_timeout() && !timeout.is_lock_lost() && !timeout.is_no_reply());
        let no_reply = Error::NoReply {
            operation: Operation::Release,
            name: "n".into(),
            waited: Duration::from_millis(5),
        };
        assert!(no_reply.is_no_reply() && !no_reply.is_timeout());
        assert!(Error::LockLost { name: "n".into() }.is_lock_lost());
        assert!(Error::InvalidOptions("expiry".into()).is_invalid_input());
    }
}
