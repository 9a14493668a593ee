//! Tasks bound to a lease (the guards' `spawn`): each runs on the lease's runtime; when the lease
//! is lost they are aborted and the lease's cancellation token fires; at the lease's release the
//! token fires and the release waits for them to end (they are aborted should the lease be lost
//! meanwhile); a guard's `abort_tasks` aborts them at once, and so does dropping the guard.

use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lost::LostSignal;
use crate::error::{Error, Result};
use crate::sync::Mutex;

/// The tasks a guard spawned, and what ends them.
#[derive(Debug)]
pub(crate) struct BoundTasks {
    tracker: TaskTracker,
    /// Fires when the lease is lost, at its release, and at `abort`.
    token: CancellationToken,
    aborts: Arc<Mutex<Vec<AbortHandle>>>,
    /// Ends them all when the lease is lost.
    watcher: AbortHandle,
}

impl BoundTasks {
    /// Tasks bound to the lease whose signal is `lost`, watched on `runtime`.
    pub(crate) fn new(runtime: &Handle, lost: LostSignal) -> BoundTasks {
        let token = CancellationToken::new();
        let aborts: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let watcher = runtime
            .spawn({
                let (token, aborts) = (token.clone(), Arc::clone(&aborts));
                async move {
                    lost.wait().await;
                    end_all(&token, &aborts);
                }
            })
            .abort_handle();
        BoundTasks {
            tracker: TaskTracker::new(),
            token,
            aborts,
            watcher,
        }
    }

    /// Spawns `task` on the current Tokio runtime, bound to the lease. A task spawned once the
    /// lease is lost (or its tasks aborted) is aborted at once.
    pub(crate) fn spawn<F>(&self, task: F) -> Result<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        let handle = runtime.spawn(self.tracker.track_future(task));
        self.aborts.lock().push(handle.abort_handle());
        // (After the push: a watcher that fired before it is seen here, one that fires after
        // it aborts this task too.)
        if self.token.is_cancelled() {
            handle.abort();
        }
        Ok(handle)
    }

    /// The token that fires when the lease is lost, at its release, and at `abort`.
    pub(crate) fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Fires the token and aborts every task.
    pub(crate) fn abort(&self) {
        end_all(&self.token, &self.aborts);
    }

    /// At the lease's release: fires the token, then waits until every task has ended, or
    /// aborts them all should the lease be lost first.
    pub(crate) async fn settle(&self, lost: &LostSignal) {
        self.token.cancel();
        self.tracker.close();
        tokio::select! {
            () = self.tracker.wait() => {}
            () = lost.wait() => self.abort(),
        }
    }
}

/// A guard's bound tasks, started at first use: what the guards' `spawn`, `cancellation` and
/// `abort_tasks` reach (through the guard's `bound()`).
#[derive(Debug)]
pub(crate) struct Bound {
    /// The runtime the lease was won on, which watches its loss.
    runtime: Handle,
    lost: LostSignal,
    tasks: std::sync::OnceLock<BoundTasks>,
}

impl Bound {
    /// Nothing bound yet to the lease whose signal is `lost`, won on `runtime`.
    pub(crate) fn new(runtime: Handle, lost: LostSignal) -> Bound {
        Bound {
            runtime,
            lost,
            tasks: std::sync::OnceLock::new(),
        }
    }

    fn tasks(&self) -> &BoundTasks {
        (self.tasks).get_or_init(|| BoundTasks::new(&self.runtime, self.lost.clone()))
    }

    /// See [`BoundTasks::spawn`].
    pub(crate) fn spawn<F>(&self, task: F) -> Result<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks().spawn(task)
    }

    /// See [`BoundTasks::token`].
    pub(crate) fn cancellation(&self) -> CancellationToken {
        self.tasks().token()
    }

    /// See [`BoundTasks::abort`].
    pub(crate) fn abort_tasks(&self) {
        if let Some(tasks) = self.tasks.get() {
            tasks.abort();
        }
    }

    /// At the release: see [`BoundTasks::settle`] (nothing to do if nothing was bound).
    pub(crate) async fn settle(&self) {
        if let Some(tasks) = self.tasks.get() {
            tasks.settle(&self.lost).await;
        }
    }
}

/// Fires `token` and aborts the tasks of `aborts`.
fn end_all(token: &CancellationToken, aborts: &Mutex<Vec<AbortHandle>>) {
    token.cancel();
    for task in aborts.lock().drain(..) {
        task.abort();
    }
}

impl Drop for BoundTasks {
    fn drop(&mut self) {
        self.abort();
        self.watcher.abort();
    }
}

/// The guards' methods for tasks bound to their lease (each guard has a `bound()` that returns
/// its [`Bound`]).
macro_rules! bound_task_methods {
    () => {
        /// Spawns `task` on the current Tokio runtime, bound to this lease: when the lock is
        /// lost, the task is aborted (at its next `.await`) and [`cancellation`](Self::cancellation)
        /// fires; at [`release`](Self::release) the token fires and the release waits for every
        /// bound task to end first (aborting them all should the lock be lost meanwhile);
        /// [`abort_tasks`](Self::abort_tasks) aborts them at once, and so does dropping the
        /// guard. Work that fans out cannot outlive the lock this way.
        ///
        /// ```no_run
        /// # async fn demo(lock: distributed_lock_mongodb::MongoDistributedLock) -> distributed_lock_mongodb::Result<()> {
        /// # async fn copy_shard(_shard: u32) {}
        /// let guard = lock.acquire().await?;
        /// for shard in 0..4 {
        ///     guard.spawn(copy_shard(shard))?;
        /// }
        /// guard.release().await?; // waits for the four copies (aborted if the lock is lost)
        /// # Ok(())
        /// # }
        /// ```
        ///
        /// # Errors
        /// [`Error::NoRuntime`](crate::Error::NoRuntime) outside a Tokio runtime.
        pub fn spawn<F>(&self, task: F) -> $crate::Result<tokio::task::JoinHandle<F::Output>>
        where
            F: std::future::Future + Send + 'static,
            F::Output: Send + 'static,
        {
            self.bound().spawn(task)
        }

        /// A token that fires when the lock is lost, when the release begins, and at
        /// [`abort_tasks`](Self::abort_tasks): for bound tasks (and any other work) to stop at a
        /// point of their choosing rather than at an abort.
        pub fn cancellation(&self) -> $crate::CancellationToken {
            self.bound().cancellation()
        }

        /// Aborts every task bound to this lease by [`spawn`](Self::spawn), and fires
        /// [`cancellation`](Self::cancellation): call it before [`release`](Self::release) to
        /// release without waiting for them.
        pub fn abort_tasks(&self) {
            self.bound().abort_tasks()
        }
    };
}
pub(crate) use bound_task_methods;

/// A guard's `progress`, for a guard whose leases are `$lease` (each a
/// [`HeldLease`](super::held::HeldLease), in an iterator).
macro_rules! progress_method {
    ($guard:ident => $leases:expr) => {
        /// Reports that the holder's work is making progress: with
        /// [`max_idle`](crate::LockOptionsBuilder::max_idle), the lease is renewed only while
        /// this is called at least every `max_idle`; a holder whose work stalls loses the lock
        /// (`lost` fires, loss reason `max_idle`). Cheap (no command is sent); without `max_idle`
        /// it does nothing. Returns whether the lock is still held.
        pub fn progress(&self) -> bool {
            let $guard = self;
            let mut held = true;
            for lease in $leases {
                held &= lease.progress();
            }
            held
        }
    };
}
pub(crate) use progress_method;
