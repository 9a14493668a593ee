//! A mutex that ignores poisoning, as tokio's own `loom/std/mutex.rs` does.
//!
//! The crate's mutexes guard bookkeeping (queues, registries, lease tables) that every write leaves
//! consistent before anything can panic; a panic elsewhere while one is held must not turn every
//! later lock, release and renewal of the process into a panic too. So a lock always returns the
//! guard: a poisoned mutex is locked as a healthy one.

use std::fmt;
use std::sync::PoisonError;

pub(crate) use std::sync::MutexGuard;

/// A [`std::sync::Mutex`] whose [`lock`](Mutex::lock) never fails.
#[derive(Default)]
pub(crate) struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub(crate) const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Locks the mutex, blocking the thread until it can, whether or not a holder panicked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_tuple("Mutex")
            .field(&&*self.lock())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_whose_holder_panicked_still_locks_with_what_it_left() {
        let mutex = std::sync::Arc::new(Mutex::new(1));
        let holder = std::sync::Arc::clone(&mutex);
        let panicked = std::thread::spawn(move || {
            let mut value = holder.lock();
            *value = 2;
            panic!("a holder panics");
        })
        .join();
        assert!(panicked.is_err());
        assert!(mutex.0.is_poisoned());
        assert_eq!(*mutex.lock(), 2);
        assert_eq!(format!("{mutex:?}"), "Mutex(2)");
    }
}
