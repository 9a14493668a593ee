//! The queue's rules, through the functions the engine calls.

use super::*;
use crate::lease::protocol::MAX_TRANSFERS_IN_A_ROW;
use crate::lease::schema::{HOLDERS, READERS};
use crate::lease::undo::Undo;
use mongodb::bson::Document;
use std::time::Duration;

async fn woken_within(ticket: &Ticket, millis: u64) -> Option<Wake> {
    tokio::time::timeout(Duration::from_millis(millis), ticket.woken())
        .await
        .ok()
}

#[tokio::test]
async fn the_first_waiter_is_woken_and_leaving_passes_the_turn_on() {
    let key = key(0, "db", "coll", "fifo");
    let first = Ticket::join(&key, false, None);
    let second = Ticket::join(&key, false, None);
    assert_eq!(wake_first(&key), vec![first.id]);
    assert_eq!(woken_within(&first, 1_000).await, Some(Wake::Attempt));
    // Only the first was woken.
    assert_eq!(woken_within(&second, 20).await, None);
    drop(first);
    // Leaving without the lock: the next takes over polling with an attempt.
    assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Attempt));
    assert_eq!(wake_first(&key), vec![second.id]);
    drop(second);
    assert_eq!(wake_first(&key), Vec::<u64>::new());
    assert!(
        !queues().contains_key(&key.lock),
        "empty queues are removed"
    );
}

#[tokio::test]
async fn a_second_release_wakes_the_next_waiter_while_the_first_is_still_busy() {
    let key = key(0, "db", "coll", "slots");
    let first = Ticket::join(&key, false, None);
    let second = Ticket::join(&key, false, None);
    assert_eq!(wake_first(&key), vec![first.id]);
    // The first has not retried yet; a second freed slot goes to the second waiter.
    assert_eq!(wake_first(&key), vec![second.id]);
    assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Attempt));
    assert_eq!(woken_within(&first, 1_000).await, Some(Wake::Attempt));
    // Both retried and failed; waiting again, the next release goes to the first again.
    let first_id = first.id;
    let waiting = tokio::spawn(async move { (first.woken().await, first) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(wake_first(&key), vec![first_id]);
    let (wake, _first) = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(wake, Wake::Attempt);
}

#[tokio::test]
async fn leaving_with_the_lock_makes_the_next_the_poller_or_wakes_it_when_there_is_room() {
    let key = key(0, "db", "coll", "leave");
    let first = Ticket::join(&key, false, None);
    let second = Ticket::join(&key, false, None);
    first.leave_with_lock(false);
    assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Poll));
    assert!(second.is_first());
    let third = Ticket::join(&key, false, None);
    second.leave_with_lock(true);
    assert_eq!(woken_within(&third, 1_000).await, Some(Wake::Attempt));
}

#[tokio::test]
async fn a_release_wakes_every_reader_up_to_the_next_writer() {
    let key = key(0, "db", "coll", "readers");
    let readers = [
        Ticket::join(&key, true, None),
        Ticket::join(&key, true, None),
    ];
    let writer = Ticket::join(&key, false, None);
    let late_reader = Ticket::join(&key, true, None);
    assert_eq!(wake_first(&key), vec![readers[0].id, readers[1].id]);
    for reader in &readers {
        assert_eq!(woken_within(reader, 1_000).await, Some(Wake::Attempt));
    }
    assert_eq!(woken_within(&writer, 20).await, None);
    assert_eq!(woken_within(&late_reader, 20).await, None);
}

#[tokio::test]
async fn a_wake_before_waiting_is_not_lost_and_is_taken_once() {
    let key = key(0, "db", "coll", "permit");
    let waiter = Ticket::join(&key, false, None);
    wake_first(&key);
    // Woken while busy with an attempt: the next wait returns at once.
    assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
    assert_eq!(woken_within(&waiter, 20).await, None);
    drop(waiter);
    assert!(!queues().contains_key(&key.lock));
}

/// An exclusive lock's offer.
fn offer(lock_id: &str, outcome: Arc<Mutex<Option<Transfer>>>) -> Offer {
    offer_of(Layout::LockDocument, lock_id, outcome)
}

fn offer_of(layout: Layout, lock_id: &str, outcome: Arc<Mutex<Option<Transfer>>>) -> Offer {
    // Never sent: a client of no server.
    let client = mongodb::Client::with_options(mongodb::options::ClientOptions::default())
        .expect("a client");
    Offer {
        lock_id: lock_id.to_owned(),
        layout,
        cleanup: Undo {
            collection: client.database("db").collection("coll"),
            filter: Document::new(),
            update: Vec::new(),
            write_concern: WriteConcern::default(),
            patience: Duration::from_secs(1),
            many: false,
            name: lock_id.to_owned(),
        },
        receiver: Arc::default(),
        write_concern: WriteConcern::default(),
        fair: false,
        taker: Box::new(Recorded(outcome)),
    }
}

/// A waiter that records the outcome delivered to it.
struct Recorded(Arc<Mutex<Option<Transfer>>>);

impl Taker for Recorded {
    fn update(&self, _replacing: &str) -> Vec<Document> {
        Vec::new()
    }

    fn deliver(self: Box<Self>, transfer: Transfer) {
        *self.0.lock() = Some(transfer);
    }
}

fn lock_ids(handoff: Handoff) -> Vec<String> {
    match handoff {
        Handoff::Transfer(offers) => offers.into_iter().map(|offer| offer.lock_id).collect(),
        Handoff::Wake => Vec::new(),
    }
}

#[tokio::test]
async fn a_writer_hands_over_to_the_readers_in_a_row_and_a_place_to_one_waiter() {
    let unheard = || Arc::new(Mutex::new(None));
    let readers = Layout::Members(READERS.to_owned());
    let key = key(0, "db", "coll", "readers-in-a-row");
    let waiters = [
        Ticket::join(&key, true, None),
        Ticket::join(&key, true, None),
        Ticket::join(&key, false, None),
        Ticket::join(&key, true, None),
    ];
    for (waiter, id) in waiters.iter().zip(["r1", "r2", "w", "r3"]) {
        let layout = if id == "w" {
            Layout::Writer
        } else {
            readers.clone()
        };
        waiter.offer(offer_of(layout, id, unheard()));
    }
    let default = WriteConcern::default();
    // A reader's release hands nothing over; nor does an exclusive lock's, to readers.
    assert!(lock_ids(handoff(&key, &default, false, &readers)).is_empty());
    assert!(lock_ids(handoff(&key, &default, false, &Layout::LockDocument)).is_empty());
    // A writer's: every reader up to the next writer, in one command.
    assert_eq!(
        lock_ids(handoff(&key, &default, false, &Layout::Writer)),
        ["r1", "r2"]
    );
    // Busy receiving it, they are passed over; a writer makes no transfer.
    assert!(lock_ids(handoff(&key, &default, false, &Layout::Writer)).is_empty());
    // Nor does anything wake them to attempt meanwhile (the others leaving with the lock
    // wake the next waiter): the transfer's outcome decides.
    assert_eq!(wake_first(&key), vec![waiters[2].id]);
    assert_eq!(wake_first(&key), vec![waiters[3].id]);
    assert_eq!(
        wake_first(&key),
        vec![waiters[2].id],
        "the first not receiving"
    );
    drop(waiters);

    let places = Layout::Members(HOLDERS.to_owned());
    let key = super::key(0, "db", "coll", "one-place");
    let waiters = [
        Ticket::join(&key, false, None),
        Ticket::join(&key, false, None),
    ];
    for (waiter, id) in waiters.iter().zip(["s1", "s2"]) {
        waiter.offer(offer_of(places.clone(), id, unheard()));
    }
    assert_eq!(lock_ids(handoff(&key, &default, false, &places)), ["s1"]);
    assert_eq!(lock_ids(handoff(&key, &default, false, &places)), ["s2"]);
}

#[tokio::test]
async fn transfers_go_to_the_first_waiting_offer_and_stop_after_the_bound() {
    let key = key(0, "db", "coll", "transfer");
    let outcome = Arc::new(Mutex::new(None));
    let waiter = Ticket::join(&key, false, None);
    assert!(
        matches!(
            handoff(&key, &WriteConcern::default(), false, &Layout::LockDocument),
            Handoff::Wake
        ),
        "no offer yet"
    );
    assert_eq!(wake_first(&key), vec![waiter.id]);
    assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
    let mut transfers = 0;
    loop {
        waiter.offer(offer(&format!("w{transfers}"), Arc::clone(&outcome)));
        let _ = woken_within(&waiter, 1).await; // waiting again
        match handoff(&key, &WriteConcern::default(), false, &Layout::LockDocument) {
            Handoff::Transfer(offers) => {
                assert_eq!(offers[0].lock_id, format!("w{transfers}"));
                transfers += 1;
            }
            // With an offer waiting: only at the bound, a plain release that wakes the
            // waiter at once (and hears of its own echo through a stream no more).
            Handoff::Wake => break,
        }
    }
    assert_eq!(transfers, MAX_TRANSFERS_IN_A_ROW);
    assert!(queues()[&key.lock].others_turn);
    // The bound starts over.
    waiter.offer(offer("next", Arc::clone(&outcome)));
    let _ = woken_within(&waiter, 1).await;
    assert!(matches!(
        handoff(&key, &WriteConcern::default(), false, &Layout::LockDocument),
        Handoff::Transfer(_)
    ));
    // A waiter busy receiving a transfer gets nothing else until it waits again.
    waiter.offer(offer("busy", Arc::clone(&outcome)));
    assert!(matches!(
        handoff(&key, &WriteConcern::default(), false, &Layout::LockDocument),
        Handoff::Wake
    ));
    // The offer left behind is told "no transfer" when its waiter leaves.
    drop(waiter);
    assert!(matches!(*outcome.lock(), Some(Transfer::NotDone)));
}

#[tokio::test]
async fn no_transfer_between_different_write_concerns_or_fairness_and_a_replaced_offer_hears_no() {
    let key = key(0, "db", "coll", "concerns");
    let first = Arc::new(Mutex::new(None));
    let second = Arc::new(Mutex::new(None));
    let waiter = Ticket::join(&key, false, None);
    waiter.offer(offer("first", Arc::clone(&first)));
    waiter.offer(offer("second", Arc::clone(&second)));
    assert!(matches!(*first.lock(), Some(Transfer::NotDone)));
    let majority = WriteConcern::majority();
    assert!(matches!(
        handoff(&key, &majority, false, &Layout::LockDocument),
        Handoff::Wake
    ));
    assert!(second.lock().is_none(), "the offer stands");
    // Nor between a fair lock and an unfair one: the takeover would jump the line.
    assert!(matches!(
        handoff(&key, &WriteConcern::default(), true, &Layout::LockDocument),
        Handoff::Wake
    ));
    assert!(second.lock().is_none(), "the offer stands");
    match handoff(&key, &WriteConcern::default(), false, &Layout::LockDocument) {
        Handoff::Transfer(offers) => assert_eq!(offers[0].lock_id, "second"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_waiter_attempting_after_a_wake_is_busy_until_it_waits_again() {
    let key = key(0, "db", "coll", "allbusy");
    let first = Ticket::join(&key, false, None);
    let second = Ticket::join(&key, false, None);
    assert_eq!(wake_first(&key), vec![first.id]);
    assert_eq!(woken_within(&first, 100).await, Some(Wake::Attempt));
    // The first is attempting: a second release goes to the second waiter.
    assert_eq!(wake_first(&key), vec![second.id]);
    assert_eq!(woken_within(&second, 100).await, Some(Wake::Attempt));
    // Both are attempting; a release now may have come after the first's attempt was
    // sent: it attempts once more when back.
    assert_eq!(wake_first(&key), vec![first.id]);
    assert_eq!(woken_within(&first, 100).await, Some(Wake::Attempt));
}

#[tokio::test]
async fn a_waiter_leaving_after_a_wake_passes_it_to_the_next() {
    let key = key(0, "db", "coll", "passon");
    let first = Ticket::join(&key, false, None);
    let second = Ticket::join(&key, false, None);
    let third = Ticket::join(&key, false, None);
    assert_eq!(wake_first(&key), vec![first.id]);
    assert_eq!(wake_first(&key), vec![second.id]);
    // The second leaves (a timeout, say) without attempting: the third gets the wake.
    drop(second);
    assert_eq!(woken_within(&third, 1_000).await, Some(Wake::Attempt));
    drop(first);
}

#[tokio::test]
async fn a_lease_held_here_slows_the_poller_and_its_end_tells_it_to_poll() {
    let key = key(0, "db", "coll", "holding");
    let waiter = Ticket::join(&key, false, None);
    let holding = Holding::new(&key, "lease");
    assert!(waiter.held_here());
    holding.end();
    holding.end(); // idempotent
    assert!(!waiter.held_here());
    assert_eq!(woken_within(&waiter, 1_000).await, Some(Wake::Poll));
    drop(holding);
    drop(waiter);
    assert!(!queues().contains_key(&key.lock));
}

#[tokio::test]
async fn a_pushed_release_wakes_the_poller_unless_it_echoes_the_one_that_ended_the_transfers() {
    let key = key(0, "db", "coll", "pushed");
    let waiter = Ticket::join(&key, false, None);
    pushed_taken(&key); // taken or renewed by someone: nothing to do
    assert_eq!(woken_within(&waiter, 20).await, None);
    pushed_free(&key, true);
    assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
    // Attempting already: its attempt may have come before the release, so it attempts
    // once more.
    pushed_free(&key, true);
    assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
    // The echo of the release that ended a run of transfers (it woke its waiter itself) is
    // skipped, once.
    queues().get_mut(&key.lock).unwrap().others_turn = true;
    pushed_free(&key, true);
    assert_eq!(woken_within(&waiter, 20).await, None);
    pushed_free(&key, true);
    assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
    // Someone holding the lock ends the exception, here or elsewhere.
    queues().get_mut(&key.lock).unwrap().others_turn = true;
    pushed_taken(&key);
    assert!(!queues()[&key.lock].others_turn);
    queues().get_mut(&key.lock).unwrap().others_turn = true;
    let holding = Holding::new(&key, "local");
    assert!(!queues()[&key.lock].others_turn);
    drop(holding);
}

/// A stream that starts watching a lock may have missed any release before it, whatever ended
/// the last run of transfers: its poller attempts. And the echo of that release, which came
/// before the stream, will never come: the next release pushed is another one, and wakes it.
/// Fails when the start of a watch is dropped while the echo is awaited (after the eighth
/// transfer in a row).
#[tokio::test]
async fn a_stream_starting_to_watch_wakes_the_poller_even_after_a_run_of_transfers() {
    let key = key(0, "db", "coll", "pushed-start");
    let waiter = Ticket::join(&key, false, None);
    queues().get_mut(&key.lock).unwrap().others_turn = true;
    pushed_free(&key, false);
    assert_eq!(woken_within(&waiter, 100).await, Some(Wake::Attempt));
    pushed_free(&key, true);
    assert_eq!(
        woken_within(&waiter, 100).await,
        Some(Wake::Attempt),
        "a release after the stream started is not an echo"
    );
}

fn has_offer(ticket: &Ticket) -> bool {
    queues()[&ticket.key.lock]
        .waiters
        .iter()
        .any(|waiter| waiter.id == ticket.id && waiter.offer.is_some())
}

#[tokio::test]
async fn a_family_keeps_its_group_while_it_lives() {
    // Ids far from the families' (counted from 0 in this process): no real family forgets them. The
    // group keeps the smaller id as its label; a forgotten id never comes back in real use
    // (family ids are never reused), so the test forgets the other one.
    let (eleven, twelve) = (u64::MAX - 12, u64::MAX - 11);
    let (one, two) = (
        key(eleven, "db", "coll", "kept"),
        key(twelve, "db", "coll", "kept"),
    );
    let holding = Holding::new(&one, "lease-of-eleven");
    let ticket = Ticket::join(&two, false, None);
    saw_stored(&two, "lease-of-eleven");
    assert!(ticket.held_here());
    // Family 12 leaves the queue (it got the lock elsewhere, or gave up) and comes back.
    drop(ticket);
    let back = Ticket::join(&two, false, None);
    assert!(
        back.held_here(),
        "known to share the deployment without a new proof"
    );
    drop(back);
    // Its family is dropped while it waits: forgotten once it leaves, though family 11 still
    // uses the queue.
    let last = Ticket::join(&two, false, None);
    forget_family(twelve);
    assert!(last.held_here(), "still here");
    drop(last);
    let new_user = Ticket::join(&two, false, None);
    assert!(!new_user.held_here());
    drop((new_user, holding));
}

#[tokio::test]
async fn families_share_a_queue_only_once_one_saw_the_others_lease_stored() {
    // Families 1 and 2 (locks built apart) wait for one name; family 1 holds a lease.
    let (one, two) = (key(1, "db", "coll", "apart"), key(2, "db", "coll", "apart"));
    let holding = Holding::new(&one, "lease-of-one");
    let first = Ticket::join(&two, false, None);
    let second = Ticket::join(&two, false, None);
    let outcome = Arc::new(Mutex::new(None));
    second.offer(offer("second", Arc::clone(&outcome)));
    // Not known to reach the same deployment: family 2 polls on its own and a release of
    // family 1 neither hands over nor wakes it.
    assert!(first.is_first());
    assert!(!first.held_here());
    assert!(matches!(
        handoff(&one, &WriteConcern::default(), false, &Layout::LockDocument),
        Handoff::Wake
    ));
    assert_eq!(wake_first(&one), Vec::<u64>::new());
    // Any other lock id stored proves nothing.
    saw_stored(&two, "someone-else");
    assert!(!first.held_here());
    // Family 2 saw family 1's lease stored: one group from now on.
    saw_stored(&two, "lease-of-one");
    assert!(first.held_here(), "the lease held by family 1 counts");
    let waiter_of_one = Ticket::join(&one, false, None);
    assert!(first.is_first() && !waiter_of_one.is_first(), "one poller");
    assert_eq!(wake_first(&one), vec![first.id]);
    assert_eq!(woken_within(&first, 100).await, Some(Wake::Attempt));
    // The first is busy attempting: the release of family 1 hands over to the second.
    match handoff(&one, &WriteConcern::default(), false, &Layout::LockDocument) {
        Handoff::Transfer(offers) => assert_eq!(offers[0].lock_id, "second"),
        other => panic!("{other:?}"),
    }
    assert!(!has_offer(&second));
    drop((holding, first, second, waiter_of_one));
    assert!(
        !queues().contains_key(&one.lock),
        "the queue and its groups are gone with its last user"
    );
    // A new queue starts without groups.
    let _holding = Holding::new(&one, "lease-of-one");
    let ticket = Ticket::join(&two, false, None);
    assert!(!ticket.held_here());
}

#[tokio::test]
async fn while_a_fair_locks_first_place_is_known_only_its_waiter_is_woken_or_handed_the_lock() {
    let key = key(0, "db", "coll", "line");
    // Two waits of this process, second and third in line; the first place is elsewhere.
    let second = Ticket::join(&key, false, Some(("W2", Some("W1".to_owned()))));
    let third = Ticket::join(&key, false, Some(("W3", Some("W1".to_owned()))));
    assert_eq!(wake_first(&key), Vec::<u64>::new(), "nobody here is first");
    assert_eq!(woken_within(&second, 20).await, None);
    let outcome = Arc::new(Mutex::new(None));
    let mut fair_offer = offer("third", Arc::clone(&outcome));
    fair_offer.fair = true;
    third.offer(fair_offer);
    assert!(matches!(
        handoff(&key, &WriteConcern::default(), true, &Layout::LockDocument),
        Handoff::Wake
    ));
    assert!(
        outcome.lock().is_none(),
        "no transfer to a wait not first in line"
    );
    // The line moved on (a reply or a change event showed it): the third place is first now,
    // and its waiter, behind another of this process, is the one woken and handed the lock.
    saw_line(&key, Some("W3".to_owned()));
    match handoff(&key, &WriteConcern::default(), true, &Layout::LockDocument) {
        Handoff::Transfer(offers) => assert_eq!(offers[0].lock_id, "third"),
        other => panic!("{other:?}"),
    }
    third.offer(offer("again", Arc::new(Mutex::new(None))));
    assert_eq!(wake_first(&key), vec![third.id]);
    assert_eq!(woken_within(&third, 1_000).await, Some(Wake::Attempt));
    assert_eq!(woken_within(&second, 20).await, None);
    // Once nobody waits in line (or nothing is known), the first local waiter is woken again.
    saw_line(&key, None);
    assert_eq!(wake_first(&key), vec![second.id]);
}

#[tokio::test]
async fn the_first_place_leaving_without_the_lock_makes_the_line_unknown() {
    let key = key(0, "db", "coll", "gone");
    let first = Ticket::join(&key, false, Some(("W1", Some("W1".to_owned()))));
    let second = Ticket::join(&key, false, Some(("W2", Some("W1".to_owned()))));
    assert_eq!(wake_first(&key), vec![first.id]);
    assert_eq!(woken_within(&first, 1_000).await, Some(Wake::Attempt));
    // It leaves without the lock (its wait ran out): who is first is not known here now.
    drop(first);
    assert_eq!(woken_within(&second, 1_000).await, Some(Wake::Attempt));
    let second_id = second.id;
    let waiting = tokio::spawn(async move { (second.woken().await, second) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(wake_first(&key), vec![second_id]);
    let (wake, _second) = tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(wake, Wake::Attempt);
}
