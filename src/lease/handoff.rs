//! In-process handoff: a release wakes the longest-waiting waiter for the same lock in this
//! process at once, instead of leaving it to finish its busy-wait sleep.
//!
//! Waiters queue in FIFO order from their first failed attempt until their `acquire*` call ends
//! (successfully, with an error, or cancelled). A release wakes only the first of them: waking
//! all would cost a command each. Only the first waiter polls the server at the busy-wait pace
//! (to notice releases by other processes); the others are woken in turn by local releases and
//! poll only at the slowest pace, as a safety net. When the first waiter leaves without the lock
//! (timeout, error, cancellation) the next one is woken to take over polling. Waiters in other
//! processes keep their own busy-wait.
//!
//! The queue is process-wide, keyed by database, collection and lock name. Two clusters with the
//! same names would at worst wake a waiter early, which costs one attempt.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use tokio::sync::Notify;

/// Identifies one lock across the process: database, collection and name.
pub(crate) type Key = Arc<str>;

pub(crate) fn key(database: &str, collection: &str, name: &str) -> Key {
    // Database and collection names cannot contain NUL (names are validated before use).
    format!("{database}\0{collection}\0{name}").into()
}

struct Waiter {
    id: u64,
    wake: Arc<Notify>,
    /// Woken and not yet back to waiting: a further release wakes the next waiter instead (a
    /// semaphore can free several slots before the first woken waiter retries).
    woken: bool,
}

static QUEUES: LazyLock<Mutex<HashMap<Key, VecDeque<Waiter>>>> = LazyLock::new(Mutex::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

fn queues() -> MutexGuard<'static, HashMap<Key, VecDeque<Waiter>>> {
    QUEUES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A place in a lock's queue of local waiters; leaves the queue when dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    key: Key,
    id: u64,
    wake: Arc<Notify>,
    /// Set when leaving with the lock: its release will wake the next waiter.
    acquired: bool,
}

impl Ticket {
    /// Joins the back of `key`'s queue.
    pub(crate) fn join(key: &Key) -> Ticket {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        queues()
            .entry(Arc::clone(key))
            .or_default()
            .push_back(Waiter {
                id,
                wake: Arc::clone(&wake),
                woken: false,
            });
        Ticket {
            key: Arc::clone(key),
            id,
            wake,
            acquired: false,
        }
    }

    /// Whether this waiter is the longest-waiting one (the one that polls the server).
    pub(crate) fn is_first(&self) -> bool {
        queues()
            .get(&self.key)
            .and_then(VecDeque::front)
            .is_some_and(|first| first.id == self.id)
    }

    /// Leaves the queue holding the lock (the release will wake the next waiter).
    pub(crate) fn leave_with_lock(mut self) {
        self.acquired = true;
    }

    /// Resolves when a release woke this waiter (immediately if it was woken since the last
    /// call).
    pub(crate) async fn woken(&self) {
        // Waiting again: releases may wake this waiter again. (While it was busy retrying they
        // went to the next waiter.)
        if let Some(me) = queues()
            .get_mut(&self.key)
            .and_then(|queue| queue.iter_mut().find(|waiter| waiter.id == self.id))
        {
            me.woken = false;
        }
        self.wake.notified().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut queues = queues();
        if let Some(queue) = queues.get_mut(&self.key) {
            let was_first = queue.front().is_some_and(|first| first.id == self.id);
            queue.retain(|waiter| waiter.id != self.id);
            if was_first && !self.acquired {
                // Someone must go on polling for releases by other processes.
                if let Some(next) = queue.front() {
                    next.wake.notify_one();
                }
            }
            if queue.is_empty() {
                queues.remove(&self.key);
            }
        }
    }
}

/// Wakes the longest-waiting waiter of `key` that is not already woken, if any; returns its id.
pub(crate) fn wake_first(key: &Key) -> Option<u64> {
    let mut queues = queues();
    let first = queues
        .get_mut(key)?
        .iter_mut()
        .find(|waiter| !waiter.woken)?;
    first.woken = true;
    first.wake.notify_one();
    Some(first.id)
}

/// Wakes waiter `id` again if it is still waiting (its first attempt may have reached the server
/// before the release did).
pub(crate) fn wake_again(key: &Key, id: u64) {
    if let Some(waiter) = queues()
        .get(key)
        .and_then(|queue| queue.iter().find(|waiter| waiter.id == id))
    {
        waiter.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn the_first_waiter_is_woken_and_leaving_passes_the_turn_on() {
        let key = key("db", "coll", "fifo");
        let first = Ticket::join(&key);
        let second = Ticket::join(&key);
        assert_eq!(wake_first(&key), Some(first.id));
        tokio::time::timeout(Duration::from_secs(1), first.woken())
            .await
            .unwrap();
        // Only the first was woken.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), second.woken())
                .await
                .is_err()
        );
        drop(first);
        assert_eq!(wake_first(&key), Some(second.id));
        tokio::time::timeout(Duration::from_secs(1), second.woken())
            .await
            .unwrap();
        drop(second);
        assert_eq!(wake_first(&key), None);
        assert!(!queues().contains_key(&key), "empty queues are removed");
    }

    fn waiting_id(key: &Key) -> u64 {
        queues()
            .get(key)
            .and_then(|queue| queue.front())
            .map(|waiter| waiter.id)
            .unwrap()
    }

    #[tokio::test]
    async fn a_second_release_wakes_the_next_waiter_while_the_first_is_still_busy() {
        let key = key("db", "coll", "slots");
        let first = Ticket::join(&key);
        let second = Ticket::join(&key);
        assert_eq!(wake_first(&key), Some(first.id));
        // The first has not retried yet; a second freed slot goes to the second waiter.
        assert_eq!(wake_first(&key), Some(second.id));
        tokio::time::timeout(Duration::from_secs(1), second.woken())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), first.woken())
            .await
            .unwrap();
        // Both retried and failed; waiting again, the next release goes to the first again.
        let waiting = tokio::spawn(async move {
            first.woken().await;
            first
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(wake_first(&key), Some(waiting_id(&key)));
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn a_first_waiter_leaving_without_the_lock_hands_polling_to_the_next() {
        let key = key("db", "coll", "takeover");
        let first = Ticket::join(&key);
        let second = Ticket::join(&key);
        drop(first); // timed out or cancelled
        tokio::time::timeout(Duration::from_secs(1), second.woken())
            .await
            .unwrap();
        assert!(second.is_first());
    }

    #[tokio::test]
    async fn a_wake_before_waiting_is_not_lost_and_wake_again_skips_departed_waiters() {
        let key = key("db", "coll", "permit");
        let waiter = Ticket::join(&key);
        let id = wake_first(&key).unwrap();
        // Woken while busy with an attempt: the next wait returns at once.
        tokio::time::timeout(Duration::from_millis(100), waiter.woken())
            .await
            .unwrap();
        wake_again(&key, id);
        tokio::time::timeout(Duration::from_millis(100), waiter.woken())
            .await
            .unwrap();
        drop(waiter);
        wake_again(&key, id); // gone: nothing to wake, no panic
        assert!(!queues().contains_key(&key));
    }
}
