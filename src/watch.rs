//! Watching a lock without holding it: its holders, kept up to date in the background.

use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::lease::acquire::ReadHolders;
use crate::lease::{ATTEMPT_SERVER_TIME, Observation, PushFrom};
use crate::lock_status::LockStatus;

/// What tells a watch at once that its lock changed, besides its cadence.
pub(crate) enum Changes {
    /// The lock's change stream (on a replica set or sharded cluster).
    Stream(PushFrom),
    /// A signal of the process (the in-memory double's: every acquisition and release).
    Local(watch::Receiver<()>),
}

/// The holders of a lock, watched without holding it (every kind has a `watch`): free or held,
/// by whom (lock ids, details), with which fencing tokens and how much of each lease is left,
/// or kept taken by a finished holder's [`min_hold`](crate::LockOptions::min_hold) window.
///
/// A background task reads the lock at the cadence given to `watch`; on a replica set or
/// sharded cluster it also reads it as soon as the lock's change stream shows a change (an
/// acquisition, a renewal, a release), so a change of holder shows within about a round trip,
/// and the cadence is only a safety net. A lease that ends at its expiry (its holder died)
/// makes no change event: the watch shows it held until its next read, at most `every` later. [`changed`](Self::changed) resolves when the set of
/// holders changes (who holds it, not how much of the lease is left: the latter is refreshed at
/// every read without a notification). The task ends when the `LockWatch` is dropped.
///
/// ```no_run
/// # async fn demo(database: mongodb::Database) -> distributed_lock_mongodb::Result<()> {
/// use std::time::Duration;
/// use distributed_lock_mongodb::MongoDistributedLock;
///
/// let lock = MongoDistributedLock::new("nightly-report", &database);
/// let mut watch = lock.watch(Duration::from_secs(5)).await?;
/// loop {
///     match watch.holders().first() {
///         Some(holder) if holder.is_held() => {
///             println!("held by {:?} (token {:?})", holder.lock_id, holder.fencing_token)
///         }
///         Some(kept) => println!("kept taken by a min_hold window for {:?}", kept.kept),
///         None => println!("free"),
///     }
///     watch.changed().await?;
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct LockWatch {
    holders: watch::Receiver<Vec<LockStatus>>,
    task: JoinHandle<()>,
}

impl LockWatch {
    /// Reads `lock` once (its errors are the caller's), then keeps reading it every `every` and
    /// at each change `changes` tells of.
    pub(crate) async fn start<L>(
        lock: L,
        every: Duration,
        changes: Option<Changes>,
    ) -> Result<LockWatch>
    where
        L: ReadHolders + Send + 'static,
    {
        if every.is_zero() {
            return Err(Error::InvalidArgument(
                "watch: the cadence between reads must be longer than zero".to_owned(),
            ));
        }
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        // Seen from now on: a change during the first read is read again.
        let mut changes = changes.map(|changes| match changes {
            Changes::Stream((collection, family, name)) => {
                Seen::Stream(Observation::new(&runtime, &collection, family, &name))
            }
            Changes::Local(mut local) => {
                local.mark_unchanged();
                Seen::Local(local)
            }
        });
        let (sender, holders) = watch::channel(read_holders(&lock).await?);
        let task = runtime.spawn(async move {
            loop {
                let pushed = async {
                    match &mut changes {
                        Some(Seen::Stream(observation)) => observation.changed().await,
                        Some(Seen::Local(local)) => {
                            if local.changed().await.is_err() {
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    () = pushed => {}
                    () = sender.closed() => return,
                }
                if let Err(error) = refresh(&lock, &sender).await {
                    tracing::debug!(%error, "a lock watch could not read the lock; trying again");
                }
            }
        });
        Ok(LockWatch { holders, task })
    }

    /// The holders as last read (empty: free). An exclusive lock that nobody holds while its
    /// last holder's [`min_hold`](crate::LockOptions::min_hold) window keeps it taken shows one
    /// entry without a lock id, whose [`kept`](LockStatus::kept) says for how long more.
    pub fn holders(&self) -> Vec<LockStatus> {
        self.holders.borrow().clone()
    }

    /// Whether someone held the lock at the last read.
    pub fn is_held(&self) -> bool {
        self.holders.borrow().iter().any(LockStatus::is_held)
    }

    /// Whether nobody held the lock and no `min_hold` window kept it taken at the last read: an
    /// attempt then would have won. (A lease ends at its expiry without a change event, so a
    /// holder that died shows as holding it until the next read, at most `every` later.)
    pub fn is_free(&self) -> bool {
        self.holders.borrow().is_empty()
    }

    /// Resolves when the holders change (another lock id holds it, or it became free).
    ///
    /// # Errors
    /// [`Error::BackgroundTaskEnded`] if the watch's task ended (its runtime shut down).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn changed(&mut self) -> Result<()> {
        self.holders
            .changed()
            .await
            .map_err(|_| Error::BackgroundTaskEnded {
                operation: crate::error::Operation::Acquire,
            })
    }

    /// A receiver of the holders, to share the watch (the task still ends with this
    /// `LockWatch`).
    pub fn subscribe(&self) -> watch::Receiver<Vec<LockStatus>> {
        self.holders.clone()
    }
}

/// [`Changes`], followed.
enum Seen {
    Stream(Observation),
    Local(watch::Receiver<()>),
}

impl Drop for LockWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `lock`'s holders, waited for at most [`ATTEMPT_SERVER_TIME`] (a reply not come by then is
/// behind a half-open connection, on which the driver would wait for ever).
async fn read_holders<L: ReadHolders>(lock: &L) -> Result<Vec<LockStatus>> {
    tokio::time::timeout(ATTEMPT_SERVER_TIME, lock.read_holders())
        .await
        .map_err(|_| Error::NoReply {
            operation: crate::error::Operation::Administration,
            name: String::new(),
            waited: ATTEMPT_SERVER_TIME,
        })?
}

/// Reads `lock` and stores its holders, notifying the receivers if who holds it changed.
async fn refresh<L: ReadHolders>(lock: &L, sender: &watch::Sender<Vec<LockStatus>>) -> Result<()> {
    let read = read_holders(lock).await?;
    sender.send_if_modified(|holders| {
        let who =
            |holders: &[LockStatus]| -> Vec<(Option<String>, Option<crate::token::FencingToken>)> {
                holders
                    .iter()
                    .map(|holder| (holder.lock_id.clone(), holder.fencing_token))
                    .collect()
            };
        let changed = who(holders) != who(&read);
        *holders = read;
        changed
    });
    Ok(())
}
