//! The protocol core's decisions, on a test clock.

use std::time::Duration;

use super::*;
use crate::options::LockOptions;

#[test]
fn a_renewal_of_several_leases_renews_them_all_only_with_a_match_per_lease() {
    assert!(renewed_every_lease(Some(3), 3));
    // Two leases in one document (one process's places of a semaphore): one match.
    assert!(!renewed_every_lease(Some(1), 2));
    assert!(!renewed_every_lease(Some(0), 1));
    assert!(!renewed_every_lease(Some(-1), 1));
    assert!(
        !renewed_every_lease(None, 1),
        "no count: read which are live"
    );
}

/// Milliseconds on a test clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Ms(u64);

impl Add<Duration> for Ms {
    type Output = Ms;
    fn add(self, duration: Duration) -> Ms {
        Ms(self.0 + u64::try_from(duration.as_millis()).unwrap())
    }
}

impl Moment for Ms {
    fn since(self, earlier: Ms) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// A lease of 1 s renewed every 200 ms, with a 10 ms margin and 190 ms of skew: relied on
/// for 800 ms after a send.
fn options() -> LockOptions {
    LockOptions::builder()
        .expiry(Duration::from_secs(1))
        .extension_cadence(Duration::from_millis(200))
        .max_clock_skew(Duration::from_millis(190))
        .build()
        .unwrap()
}

#[test]
fn a_deadline_counts_from_the_send_not_the_reply() {
    let options = options();
    assert_eq!(options.lease_lifetime(), Duration::from_millis(800));
    let mut lease = Lease::won(&options, Sent::now(Ms(1_000)), Ms(1_250));
    assert!(!lease.is_lost(Ms(1_799)));
    assert_eq!(lease.lost_at(Ms(1_250)), Some(Ms(1_800)));
    assert_eq!(lease.renew_by(&options), Some(Ms(1_200)));
    // A renewal sent at 1 200 and answered at 1 290 relies on the lease until 2 000.
    assert!(lease.confirmed(&options, Sent::now(Ms(1_200)), Ms(1_290)));
    assert_eq!(lease.lost_at(Ms(1_290)), Some(Ms(2_000)));
    assert_eq!(lease.renew_by(&options), Some(Ms(1_400)));
    // An older request answered later never moves the deadline back.
    assert!(lease.confirmed(&options, Sent::now(Ms(1_100)), Ms(1_300)));
    assert_eq!(lease.lost_at(Ms(1_300)), Some(Ms(2_000)));
    assert_eq!(lease.renew_by(&options), Some(Ms(1_400)));
}

#[test]
fn a_reply_after_the_deadline_neither_wins_nor_extends() {
    let options = options();
    let mut late = Lease::won(&options, Sent::now(Ms(0)), Ms(800));
    assert!(
        late.is_lost(Ms(800)),
        "a win answered at its deadline is lost"
    );
    let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
    assert!(!lease.confirmed(&options, Sent::now(Ms(750)), Ms(800)));
    assert!(lease.is_lost(Ms(800)));
    assert!(!lease.confirmed(&options, Sent::now(Ms(790)), Ms(810)));
    assert!(lease.mark_lost(), "the first report of the loss");
    assert!(!lease.mark_lost());
}

#[test]
fn a_loss_is_due_to_be_reported_until_it_is_reported() {
    let options = options();
    let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
    assert_eq!(lease.report_loss_at(Ms(10)), Some(Ms(800)), "its deadline");
    // Past the deadline (the loop looked away), the loss is due at once, and stays due
    // until reported: its deadline alone (`lost_at`) is gone by then.
    assert_eq!(lease.lost_at(Ms(900)), None);
    assert_eq!(lease.report_loss_at(Ms(900)), Some(Ms(900)));
    assert_eq!(lease.report_loss_at(Ms(950)), Some(Ms(950)));
    assert!(lease.mark_lost());
    assert_eq!(lease.report_loss_at(Ms(1_000)), None, "reported");
    let mut released = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
    released.mark_released(Ms(20));
    assert_eq!(released.report_loss_at(Ms(900)), None);
    assert_eq!(Lease::<Ms>::unbounded().report_loss_at(Ms(900)), None);
}

#[test]
fn max_idle_caps_the_deadline_until_the_work_reports_progress() {
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(1))
        .extension_cadence(Duration::from_millis(200))
        .max_clock_skew(Duration::from_millis(190))
        .max_idle(Duration::from_millis(500))
        .build()
        .unwrap();
    let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
    assert_eq!(
        lease.lost_at(Ms(10)),
        Some(Ms(500)),
        "not 800: idle from the send"
    );
    // A renewal alone does not move it past the idle limit.
    assert!(lease.confirmed(&options, Sent::now(Ms(200)), Ms(210)));
    assert_eq!(lease.lost_at(Ms(210)), Some(Ms(500)));
    // Progress does, as far as the confirmations allow.
    assert!(lease.progressed(&options, Ms(300)));
    assert_eq!(
        lease.lost_at(Ms(300)),
        Some(Ms(800)),
        "the earlier of 200 + 800 (confirmed) and 300 + 500 (idle)"
    );
    assert!(lease.confirmed(&options, Sent::now(Ms(400)), Ms(410)));
    assert_eq!(
        lease.lost_at(Ms(410)),
        Some(Ms(800)),
        "the earlier of 400 + 800 and 800"
    );
    assert!(!lease.idle_ended(Ms(799)));
    // Stalled: lost at the idle limit, for good.
    assert!(lease.is_lost(Ms(800)));
    assert!(lease.idle_ended(Ms(800)));
    assert!(!lease.progressed(&options, Ms(801)));
    assert!(!lease.confirmed(&options, Sent::now(Ms(790)), Ms(802)));
    // Without max_idle, progress changes nothing.
    let plain = LockOptions::builder()
        .expiry(options.expiry())
        .build()
        .unwrap();
    let mut lease = Lease::won(&plain, Sent::now(Ms(0)), Ms(10));
    let before = lease.lost_at(Ms(10));
    assert!(lease.progressed(&plain, Ms(20)));
    assert_eq!(lease.lost_at(Ms(20)), before);
}

#[test]
fn max_hold_caps_every_deadline_and_unbounded_leases_have_none() {
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(1))
        .extension_cadence(Duration::from_millis(200))
        .max_clock_skew(Duration::from_millis(190))
        .max_hold(Duration::from_millis(1_200))
        .build()
        .unwrap();
    let mut lease = Lease::won(&options, Sent::now(Ms(0)), Ms(10));
    assert_eq!(lease.lost_at(Ms(10)), Some(Ms(800)));
    assert!(lease.confirmed(&options, Sent::now(Ms(600)), Ms(610)));
    assert_eq!(
        lease.lost_at(Ms(610)),
        Some(Ms(1_200)),
        "not 1 400: the hold ends"
    );
    assert!(!lease.hold_ended(Ms(1_199)));
    assert!(lease.hold_ended(Ms(1_200)));
    assert!(lease.is_lost(Ms(1_200)));
    let mut unbounded = Lease::<Ms>::unbounded();
    assert!(unbounded.confirmed(&options, Sent::now(Ms(0)), Ms(u64::MAX / 2)));
    assert_eq!(unbounded.lost_at(Ms(u64::MAX / 2)), None);
    assert_eq!(unbounded.renew_by(&options), None);
    assert!(unbounded.mark_released(Ms(u64::MAX / 2)));
    assert!(!unbounded.mark_lost(), "a released lease is never lost");
}

#[test]
fn rounds_go_a_cadence_apart_and_wait_for_a_suspect_round_only_so_long() {
    let options = options();
    let mut renewals = Renewals::new(Ms(0));
    renewals.lease_added(Ms(200), false);
    assert_eq!(renewals.due_at([]), Ms(200));
    let round = renewals.round_sent(&options, Ms(200));
    assert_eq!(renewals.planned(), Ms(400));
    // Unanswered, the round is given up at its leases' deadline at the latest, and
    // the next round waits for it until three quarters of the way there.
    let give_up = give_up_at(&options, round, Some(Ms(1_300)));
    assert_eq!(give_up, Ms(1_000));
    assert_eq!(give_up_at(&options, round, Some(Ms(350))), Ms(350));
    assert_eq!(give_up_at(&options, round, None), Ms(200));
    assert_eq!(suspect_at(round, give_up), Ms(800));
    assert_eq!(renewals.due_at([suspect_at(round, give_up)]), Ms(800));
    assert_eq!(
        renewals.due_at([Ms(300)]),
        Ms(400),
        "never before the planned round"
    );
    renewals.retry_soon(&options, Ms(300));
    assert_eq!(renewals.planned(), Ms(350));
    renewals.lease_added(Ms(600), true);
    assert_eq!(
        renewals.planned(),
        Ms(350),
        "no later than planned for the others"
    );
    renewals.renew_now(Ms(310));
    assert_eq!(renewals.planned(), Ms(310));
}

#[test]
fn an_attempt_whose_caller_left_is_undone_once_and_its_win_released() {
    let options = options();
    let mut attempt = Attempt::sent(&options, Ms(0), None);
    assert_eq!(attempt.reply_limit(), Ms(1_000));
    let left = attempt.caller_left();
    assert!(left.undo && !left.release && left.tell == Tell::Nothing);
    let won = attempt.answered(Reply::Won, true);
    assert!(!won.undo && won.release && won.tell == Tell::Nothing);
    assert!(!attempt.caller_left().undo, "one undo");
}

#[test]
fn an_unanswered_or_unknown_attempt_is_undone_and_a_late_win_released() {
    let options = options();
    let mut attempt = Attempt::sent(&options, Ms(0), Some(Ms(10)));
    assert_eq!(
        attempt.reply_limit(),
        Ms(1_000),
        "at least 5 s, at most the expiry"
    );
    assert_eq!(attempt.waited(Ms(999)), Step::NOTHING);
    let given_up = attempt.waited(Ms(1_000));
    assert!(given_up.undo && given_up.tell == Tell::NoReply);
    let late = attempt.answered(Reply::Won, true);
    assert!(late.release && !late.undo && late.tell == Tell::Nothing);

    let mut unknown = Attempt::sent(&options, Ms(0), None);
    let step = unknown.answered(Reply::Unknown, true);
    assert!(step.undo && step.tell == Tell::Error);
    let mut refused = Attempt::sent(&options, Ms(0), None);
    let step = refused.answered(Reply::Refused, true);
    assert!(!step.undo && step.tell == Tell::Error);
}

#[test]
fn a_win_is_handed_out_only_to_a_waiting_caller_whose_attempt_a_shutdown_left_alone() {
    let options = options();
    let mut attempt = Attempt::sent(&options, Ms(0), None);
    assert_eq!(attempt.answered(Reply::Won, true).tell, Tell::Lease);
    let mut taken = Attempt::sent(&options, Ms(0), None);
    let step = taken.answered(Reply::Won, false);
    assert!(
        step.release && step.tell == Tell::Busy,
        "released, and not acquired"
    );
    let mut busy = Attempt::sent(&options, Ms(0), None);
    assert_eq!(busy.answered(Reply::Busy, true).tell, Tell::Busy);
    assert_eq!(busy.waited(Ms(10_000)), Step::NOTHING, "told already");
}

#[test]
fn a_release_hands_over_only_a_live_lease_without_min_hold_to_waiters() {
    let plain = options();
    assert!(hands_over(&plain, false, true));
    assert!(!hands_over(&plain, false, false), "nobody waits");
    assert!(!hands_over(&plain, true, true), "lost before its release");
    let min_hold = LockOptions::builder()
        .min_hold(Duration::from_millis(500))
        .build()
        .unwrap();
    assert!(!hands_over(&min_hold, false, true), "stays taken");
}

#[test]
fn a_document_attempt_inserts_once_and_then_locks_or_finds_the_lock_busy() {
    let plain = DocumentAttempt::new(false);
    assert_eq!(plain.no_match(), DocumentStep::CheckExists);
    let mut inserting = DocumentAttempt::new(true);
    assert_eq!(inserting.no_match(), DocumentStep::Insert);
    let mut duplicate = inserting;
    assert_eq!(duplicate.inserted(true), DocumentStep::Busy);
    assert_eq!(inserting.inserted(false), DocumentStep::Lock);
    assert_eq!(inserting.no_match(), DocumentStep::Busy, "inserts once");
}

#[test]
fn a_release_hands_over_to_the_first_free_waiter_that_takes_it_and_the_sharers_behind() {
    let waiter = |busy, takes_over| InLine { busy, takes_over };
    let mut in_a_row = 0;
    let line = [waiter(true, Some(false)), waiter(false, Some(false))];
    assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![1]));
    assert_eq!(in_a_row, 1);
    // The first free waiter cannot take it (a writer behind a writer's release): nobody
    // behind it overtakes it, and the run of transfers ends.
    let line = [waiter(false, None), waiter(false, Some(false))];
    let plain = Handover::Release { run_ended: false };
    assert_eq!(handover(line, &mut in_a_row), plain);
    assert_eq!(in_a_row, 0);
    // Readers behind a writer's release, up to the first that cannot take it.
    let line = [
        waiter(false, Some(true)),
        waiter(true, None),
        waiter(false, Some(true)),
        waiter(false, None),
        waiter(false, Some(true)),
    ];
    assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![0, 2]));
    assert_eq!(handover([], &mut in_a_row), plain, "nobody waits");
    // A run of transfers ends at its bound, then starts again.
    let line = [waiter(false, Some(false))];
    for _ in 0..MAX_TRANSFERS_IN_A_ROW {
        assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![0]));
    }
    let ended = Handover::Release { run_ended: true };
    assert_eq!(handover(line, &mut in_a_row), ended);
    assert_eq!(handover(line, &mut in_a_row), Handover::To(vec![0]));
}

#[test]
fn only_a_lease_someone_was_given_keeps_its_window() {
    assert!(keeps_window(true));
    assert!(!keeps_window(false), "nobody ran under it");
}

#[test]
fn a_transfer_hands_over_only_what_it_applied_and_no_shutdown_took() {
    let handed = transfer_answered(TransferReply::Applied, true);
    assert!(handed.hand_over && !handed.undo_waiters && !handed.undo_when_settled);
    let taken = transfer_answered(TransferReply::Applied, false);
    assert!(
        !taken.hand_over && !taken.undo_waiters && !taken.undo_when_settled,
        "the shutdown that took it ends the leases"
    );
    let missed = transfer_answered(TransferReply::NotApplied, true);
    assert!(!missed.hand_over && !missed.undo_waiters && !missed.undo_when_settled);
    let unknown = transfer_answered(TransferReply::Unknown, true);
    assert!(!unknown.hand_over && unknown.undo_waiters && unknown.undo_when_settled);
}

#[test]
fn a_shutdown_waits_for_work_until_its_settle_deadline_and_then_undoes_it() {
    let mut work = Work::<Ms, &str>::default();
    work.track(1, vec!["attempt"], Some(Ms(500)));
    work.track(2, vec!["release"], None);
    work.track(3, vec!["finished"], None);
    work.finish(3);
    let due = work.take_due(Ms(0));
    assert_eq!(due.undo, vec!["release"]);
    assert_eq!(
        due.next,
        Some(Ms(500)),
        "the attempt waits for its deadline"
    );
    let due = work.take_due(Ms(499));
    assert!(due.undo.is_empty());
    let due = work.take_due(Ms(500));
    assert_eq!((due.undo, due.next), (vec!["attempt"], None));
    assert!(work.is_idle());
    work.finish(1); // a late finish of forgotten work changes nothing
    assert!(work.is_idle());
}

#[test]
fn work_whose_undo_was_taken_sends_nothing_more_and_hands_nothing_on() {
    let mut work = Work::<Ms, &str>::default();
    work.track(1, vec!["releasing"], None);
    assert!(work.add_undo(1, "waiter"), "still tracked: accepted");
    assert!(work.settle_by(1, Ms(500)), "sent");
    assert!(work.take_due(Ms(499)).undo.is_empty());
    assert_eq!(work.take_due(Ms(500)).undo, vec!["releasing", "waiter"]);
    assert!(!work.settle_by(1, Ms(600)), "taken: no command goes out");
    assert!(!work.add_undo(1, "later"), "taken: nothing more is started");
    assert!(!work.settle(1), "taken: nothing is handed on");

    work.track(2, vec!["attempt"], Some(Ms(500)));
    assert!(work.settle(2), "nobody took it: what it did stands");
    assert!(!work.tracks(2), "settled: no longer tracked");
    assert!(
        work.take_due(Ms(1_000)).undo.is_empty(),
        "and nobody undoes it"
    );
}

#[test]
fn work_of_unknown_outcome_is_undone_once_settled_unless_a_shutdown_took_it() {
    let mut work = Work::<Ms, &str>::default();
    work.track(1, vec!["transfer"], Some(Ms(500)));
    assert_eq!(work.settling(1, Ms(100)), Settling::WaitUntil(Ms(500)));
    assert_eq!(work.settling(1, Ms(500)), Settling::Undo(vec!["transfer"]));
    assert!(work.tracks(1), "tracked until its undo went out");
    assert_eq!(
        work.take_due(Ms(0)).undo,
        vec!["transfer"],
        "due at once for a shutdown meanwhile"
    );
    assert_eq!(work.settling(1, Ms(600)), Settling::Taken);
}

#[test]
fn abandoned_work_is_due_at_once_and_kept_up_to_a_bound() {
    let mut work = Work::<Ms, u64>::default();
    work.track(0, vec![0], Some(Ms(60_000)));
    for id in 1..=4 {
        work.track(id, vec![id], Some(Ms(60_000)));
        let forgotten = work.abandon(id, 3);
        assert_eq!(
            forgotten,
            (id == 4).then(|| vec![1]),
            "the oldest past three"
        );
    }
    assert_eq!(work.counts(), (4, 3));
    assert!(
        work.tracks(0),
        "live work is never forgotten for abandoned work"
    );
    assert_eq!(work.take_abandoned(), vec![2, 3, 4]);
    assert_eq!(work.counts(), (1, 0));
    work.track(5, vec![5], Some(Ms(60_000)));
    work.abandon(5, 3);
    let due = work.take_due(Ms(0));
    assert_eq!((due.undo, due.next), (vec![5], Some(Ms(60_000))));
    assert_eq!(work.counts(), (1, 0));
}

#[test]
fn the_engines_clocks_measure_time_since_an_earlier_instant_and_never_below_zero() {
    let now = boot_time::Instant::now();
    let later = now + Duration::from_millis(250);
    assert_eq!(later.since(now), Duration::from_millis(250));
    assert_eq!(now.since(later), Duration::ZERO);
    let now = tokio::time::Instant::now();
    let later = now + Duration::from_millis(250);
    assert_eq!(later.since(now), Duration::from_millis(250));
    assert_eq!(now.since(later), Duration::ZERO);
    // What the renewal loop makes of them: a round unanswered three quarters of the way.
    assert_eq!(
        suspect_at(Sent::now(now), later),
        now + Duration::from_micros(187_500)
    );
}

#[test]
fn the_reply_limit_is_at_least_five_seconds_and_at_most_the_expiry() {
    let options = LockOptions::builder()
        .expiry(Duration::from_secs(30))
        .build()
        .unwrap();
    let ms = |ms: u64| Ms(ms);
    assert_eq!(attempt_reply_limit(&options, ms(0), None), ms(30_000));
    assert_eq!(attempt_reply_limit(&options, ms(0), Some(ms(0))), ms(5_000));
    assert_eq!(
        attempt_reply_limit(&options, ms(0), Some(ms(7_000))),
        ms(7_000)
    );
    assert_eq!(
        attempt_reply_limit(&options, ms(0), Some(ms(60_000))),
        ms(30_000)
    );
}
