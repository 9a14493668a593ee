//! The in-memory reader-writer lock.

use std::time::Duration;

use super::lock::{MemoryGuard, MemoryLock};
use super::names::Claim;
use crate::error::{Error, Result};
use crate::lease::lost::LostSignal;
use crate::lock_status::LockStatus;
use crate::token::FencingToken;
use crate::watch::LockWatch;

/// An in-memory reader-writer lock; see the [module docs](super) and
/// [`MongoDistributedReaderWriterLock`](crate::MongoDistributedReaderWriterLock), whose
/// behaviour it keeps: readers share the lock, a writer holds it alone, and while a writer
/// waits (not on a single `try_acquire_write`), new readers wait too.
#[derive(Clone, Debug)]
pub struct MemoryReaderWriterLock {
    pub(super) read: MemoryLock,
    pub(super) upgradeable: MemoryLock,
    pub(super) write: MemoryLock,
}

impl MemoryReaderWriterLock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// Waits until a read lock is acquired: when no writer holds the lock and none waits.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_read(&self) -> Result<MemoryReadGuard> {
        self.read.acquire().await.map(MemoryReadGuard)
    }

    /// Waits up to `timeout` for a read lock.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_read_timeout(&self, timeout: Duration) -> Result<MemoryReadGuard> {
        self.read
            .acquire_timeout(timeout)
            .await
            .map(MemoryReadGuard)
    }

    /// One attempt at a read lock: `Ok(None)` if a writer holds the lock or waits for it.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_read(&self) -> Result<Option<MemoryReadGuard>> {
        Ok(self.read.try_acquire().await?.map(MemoryReadGuard))
    }

    /// Attempts at a read lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryReadGuard>> {
        let guard = self.read.try_acquire_timeout(timeout).await?;
        Ok(guard.map(MemoryReadGuard))
    }

    /// Waits until the write lock is acquired: when no reader and no other writer holds it.
    /// New readers wait meanwhile.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_write(&self) -> Result<MemoryGuard> {
        self.write.acquire().await
    }

    /// Waits up to `timeout` for the write lock.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when `timeout` runs out; the refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn acquire_write_timeout(&self, timeout: Duration) -> Result<MemoryGuard> {
        self.write.acquire_timeout(timeout).await
    }

    /// One attempt at the write lock: `Ok(None)` if readers or a writer hold it. It holds back
    /// no reader.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_write(&self) -> Result<Option<MemoryGuard>> {
        self.write.try_acquire().await
    }

    /// Attempts at the write lock for up to `timeout`: `Ok(None)` if it stayed unavailable.
    ///
    /// # Errors
    /// The refusals of [`MemoryLock::acquire`](super::MemoryLock::acquire).
    pub async fn try_acquire_write_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryGuard>> {
        self.write.try_acquire_timeout(timeout).await
    }
}

impl MemoryReaderWriterLock {
    /// The current holders: the writer or the readers (see [`MemoryLock::holders`](super::MemoryLock::holders)).
    ///
    /// # Errors
    /// None: a `Result` as the MongoDB locks'.
    pub async fn holders(&self) -> Result<Vec<LockStatus>> {
        self.write.holders().await
    }

    /// Watches who holds it (see [`MemoryLock::watch`](super::MemoryLock::watch)).
    ///
    /// # Errors
    /// As [`MemoryLock::watch`](super::MemoryLock::watch).
    pub async fn watch(&self, every: Duration) -> Result<LockWatch> {
        self.write.watch(every).await
    }

    /// Waits until the upgradeable read lock is acquired: no writer holds the lock or waits for
    /// it, and no other reader holds it upgradeable.
    ///
    /// # Errors
    /// As [`acquire_read`](Self::acquire_read).
    pub async fn acquire_upgradeable_read(&self) -> Result<MemoryUpgradeableReadGuard> {
        self.upgradeable
            .acquire()
            .await
            .map(MemoryUpgradeableReadGuard::new)
    }

    /// Waits at most `timeout` for the upgradeable read lock.
    ///
    /// # Errors
    /// As [`acquire_read_timeout`](Self::acquire_read_timeout).
    pub async fn acquire_upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<MemoryUpgradeableReadGuard> {
        self.upgradeable
            .acquire_timeout(timeout)
            .await
            .map(MemoryUpgradeableReadGuard::new)
    }

    /// One attempt at the upgradeable read lock.
    ///
    /// # Errors
    /// As [`try_acquire_read`](Self::try_acquire_read).
    pub async fn try_acquire_upgradeable_read(&self) -> Result<Option<MemoryUpgradeableReadGuard>> {
        let guard = self.upgradeable.try_acquire().await?;
        Ok(guard.map(MemoryUpgradeableReadGuard::new))
    }

    /// Attempts at the upgradeable read lock for up to `timeout`.
    ///
    /// # Errors
    /// As [`try_acquire_read_timeout`](Self::try_acquire_read_timeout).
    pub async fn try_acquire_upgradeable_read_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<MemoryUpgradeableReadGuard>> {
        let guard = self.upgradeable.try_acquire_timeout(timeout).await?;
        Ok(guard.map(MemoryUpgradeableReadGuard::new))
    }
}

crate::traits::impl_distributed_reader_writer_lock!(MemoryReaderWriterLock);

/// Proof that an in-memory upgradeable read lock is held: as
/// [`UpgradeableReadGuard`](crate::UpgradeableReadGuard), it reads beside plain readers, keeps
/// writers out, upgrades to the write lock (with the next fencing token) once it is the only
/// holder, whatever writer waits, and downgrades back to reading.
#[must_use = "dropping the guard releases the upgradeable read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MemoryUpgradeableReadGuard {
    // Dropped in this order (as fields are): the write lock before the read lock.
    writer: Option<MemoryGuard>,
    read: MemoryGuard,
}

impl MemoryUpgradeableReadGuard {
    fn new(read: MemoryGuard) -> Self {
        MemoryUpgradeableReadGuard { writer: None, read }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// Whether it holds the write lock now (one not lost).
    pub fn is_upgraded(&self) -> bool {
        self.live_writer().is_some()
    }

    /// The write lock's fencing token while upgraded, `None` while reading or once it is lost.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.live_writer().map(MemoryGuard::fencing_token)
    }

    fn live_writer(&self) -> Option<&MemoryGuard> {
        self.writer.as_ref().filter(|writer| !writer.is_lost())
    }

    /// A signal that turns true when the read lock, or the write lock held now, is lost.
    pub fn lost(&self) -> LostSignal {
        let mut lost = self.read.lost();
        if let Some(writer) = &self.writer {
            lost = lost.and(&writer.lost());
        }
        lost
    }

    /// Whether the read lock, or the write lock while held, is lost.
    pub fn is_lost(&self) -> bool {
        self.read.is_lost() || self.writer.as_ref().is_some_and(MemoryGuard::is_lost)
    }

    /// Waits until it holds the write lock too; [`Error::LockLost`] once the read lock is lost.
    ///
    /// # Errors
    /// As [`UpgradeableReadGuard::upgrade`](crate::UpgradeableReadGuard::upgrade).
    pub async fn upgrade(&mut self) -> Result<()> {
        self.upgrade_within(None).await.map(|_| ())
    }

    /// One upgrade attempt: whether it holds the write lock now.
    ///
    /// # Errors
    /// As [`upgrade`](Self::upgrade).
    pub async fn try_upgrade(&mut self) -> Result<bool> {
        self.upgrade_within(Some(Duration::ZERO)).await
    }

    /// Upgrade attempts for up to `timeout`: whether it holds the write lock now.
    ///
    /// # Errors
    /// As [`upgrade`](Self::upgrade).
    pub async fn try_upgrade_timeout(&mut self, timeout: Duration) -> Result<bool> {
        self.upgrade_within(Some(timeout)).await
    }

    async fn upgrade_within(&mut self, timeout: Option<Duration>) -> Result<bool> {
        if self.is_upgraded() {
            return Ok(true);
        }
        self.writer = None; // a lost write lock ends
        if self.read.is_lost() {
            return Err(Error::LockLost {
                name: self.name().to_owned(),
            });
        }
        let lost = self.read.lost();
        let upgrade = self.read.lock_for(Claim::Upgrade(self.read.acquisition()));
        let won = async {
            match timeout {
                None => upgrade.acquire().await.map(Some),
                Some(timeout) => upgrade.try_acquire_timeout(timeout).await,
            }
        };
        let won = tokio::select! {
            biased;
            () = lost.wait() => Err(Error::LockLost { name: self.name().to_owned() }),
            won = won => won,
        }?;
        self.writer = won;
        Ok(self.writer.is_some())
    }

    /// Ends the write lock and goes on reading.
    ///
    /// # Errors
    /// As [`MemoryGuard::release`].
    pub async fn downgrade(&mut self) -> Result<()> {
        match self.writer.take() {
            Some(writer) => writer.release().await,
            None => Ok(()),
        }
    }

    /// Checks `by` and that no lock it holds is lost, as [`MemoryGuard::extend`].
    ///
    /// # Errors
    /// As [`MemoryGuard::extend`].
    pub async fn extend(&self, by: Duration) -> Result<()> {
        let written = match &self.writer {
            Some(writer) => writer.extend(by).await,
            None => Ok(()),
        };
        let read = self.read.extend(by).await;
        written.and(read)
    }

    /// Releases the write lock (if held), then the read lock: the first error.
    ///
    /// # Errors
    /// As [`MemoryGuard::release`].
    pub async fn release(self) -> Result<()> {
        let MemoryUpgradeableReadGuard { writer, read } = self;
        let written = match writer {
            Some(writer) => writer.release().await,
            None => Ok(()),
        };
        let read = read.release().await;
        written.and(read)
    }
}

crate::traits::impl_distributed_upgradeable_read_guard!(MemoryUpgradeableReadGuard);

/// Proof that a [`MemoryReaderWriterLock`](super::MemoryReaderWriterLock) is held to read; behaves as
/// [`ReadGuard`](crate::ReadGuard) does (no fencing token).
#[must_use = "dropping the guard releases the read lock at once"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MemoryReadGuard(MemoryGuard);

impl MemoryReadGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// A signal that turns true when the read lock is lost (only at the provider's shutdown).
    pub fn lost(&self) -> LostSignal {
        self.0.lost()
    }

    /// Whether the read lock is lost.
    pub fn is_lost(&self) -> bool {
        self.0.is_lost()
    }

    /// Extends the lease to at least `by` from now; see [`MemoryGuard::extend`].
    ///
    /// # Errors
    /// As [`MemoryGuard::extend`].
    pub async fn extend(&self, by: Duration) -> Result<()> {
        self.0.extend(by).await
    }

    /// Releases the read lock and wakes its waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) if the read lock was lost before.
    pub async fn release(self) -> Result<()> {
        self.0.release().await
    }
}

crate::traits::impl_distributed_read_guard!(MemoryReadGuard);
