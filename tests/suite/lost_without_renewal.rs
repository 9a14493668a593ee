//! `lost` does not depend on the renewal machinery staying alive: a guard whose renewal loop's
//! runtime shut down is lost at once, and a guard whose loop never gets to run (a starved
//! executor) turns lost by itself at its local deadline.

use test_support as common;

use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn a_guard_whose_runtime_shut_down_is_lost_at_once() {
    let runtime = current_thread();
    let guard = runtime.block_on(async {
        let (lock, _) = common::fresh_lock("shutdown", common::options(30_000, 10_000)).await;
        lock.acquire().await.unwrap()
    });
    let lost = guard.lost();
    assert!(!lost.is_lost());
    // Shutting the runtime down drops its tasks, the renewal loop among them: nobody renews the
    // lease any more, so the guard must not go on claiming the lock for the rest of its 30 s.
    runtime.shutdown_timeout(Duration::from_secs(5));
    assert!(lost.is_lost(), "lost as soon as the renewal loop is gone");
    assert!(guard.is_lost());
    drop(guard); // off any runtime: no panic
}

#[test]
fn a_guard_whose_renewal_loop_never_runs_turns_lost_at_its_deadline() {
    // A current-thread runtime runs its tasks only inside `block_on`: once that returns, the
    // renewal loop it spawned is starved for good.
    let starved = current_thread();
    let expiry = Duration::from_millis(1_000);
    let guard = starved.block_on(async {
        let (lock, _) = common::fresh_lock("starved", common::options(1_000, 300)).await;
        lock.acquire().await.unwrap()
    });
    let lost = guard.lost();
    let acquired = std::time::Instant::now();
    let observer = current_thread();
    observer.block_on(async {
        tokio::time::timeout(expiry * 3, lost.wait())
            .await
            .expect("lost resolves by itself at the local deadline");
    });
    let waited = acquired.elapsed();
    assert!(lost.is_lost() && guard.is_lost());
    // The local deadline is expiry − margin − skew = 1,000 − 10 − 100 ms after the acquisition
    // was sent: not earlier than about that (this only catches a signal that fires at once).
    assert!(
        waited >= Duration::from_millis(700),
        "fired after {waited:?}, before the deadline"
    );
    println!("starved renewal loop: lost after {waited:?} (expiry {expiry:?})");
    drop(guard);
}
