//! The queue of one lock's local waiters: who waits, in which order and group, and whom a
//! release or a push wakes (see the parent module for the rules).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::Notify;

use super::transfer::Offer;

/// What a waiter was woken for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// The lock may be free now: attempt at once.
    Attempt,
    /// Become the poller (or poll at the busy-wait pace again): sleep first, then attempt.
    Poll,
}

pub(super) struct Waiter {
    pub(super) id: u64,
    pub(super) family: u64,
    pub(super) wake: Arc<Notify>,
    /// What it was woken for, until it takes it.
    pub(super) signal: Option<Wake>,
    /// Woken to attempt and not yet back to waiting: further releases wake the next waiter.
    pub(super) busy: bool,
    /// A release took its offer and is handing it the lock: nothing wakes it to attempt until
    /// it leaves or offers again (the transfer's outcome decides; an attempt meanwhile would only
    /// cost a command, or win a second lease).
    pub(super) receiving: bool,
    /// A reader: others like it can hold the lock at the same time.
    pub(super) shared: bool,
    /// A fair lock's waiter: the id of its wait's place in the lock's line.
    pub(super) place: Option<String>,
    pub(super) offer: Option<Offer>,
}

impl Waiter {
    pub(super) fn signal(&mut self, wake: Wake) {
        if wake == Wake::Attempt {
            self.busy = true;
        }
        // An attempt covers a poll.
        if self.signal != Some(Wake::Attempt) {
            self.signal = Some(wake);
        }
        self.wake.notify_one();
    }
}

#[derive(Default)]
pub(super) struct Queue {
    pub(super) waiters: VecDeque<Waiter>,
    /// Exclusive leases of this lock held in this process: lock id and family.
    pub(super) held: Vec<(String, u64)>,
    /// The groups of families known to reach the same deployment, as family → group (the
    /// smallest family id of the group); a family not listed is a group of its own.
    pub(super) groups: HashMap<u64, u64>,
    /// Families that is gone but that still have a waiter or a lease here.
    pub(super) departed: HashSet<u64>,
    pub(super) transfers_in_a_row: u32,
    /// Set by a release that ended a run of transfers (they reached their bound): its waiter
    /// was woken by the release itself, so the next pushed release, most likely that one
    /// coming back through the change stream, wakes nobody here (it would only cost an
    /// attempt). Cleared once someone holds the lock again.
    pub(super) others_turn: bool,
    /// A fair lock's line: the id of its first place, as the last reply or change event seen
    /// here showed it (`None`: nobody waits in line, or nothing known). While it is known, a
    /// release wakes (and hands over to) the waiter of that place only, if it waits here: any
    /// other attempt would fail.
    pub(super) line_head: Option<String>,
}

/// The group of `family` in `groups`.
pub(super) fn group_of(groups: &HashMap<u64, u64>, family: u64) -> u64 {
    groups.get(&family).copied().unwrap_or(family)
}

impl Queue {
    pub(super) fn is_unused(&self) -> bool {
        self.waiters.is_empty() && self.held.is_empty()
    }

    /// Whether `family` has a waiter or a lease here.
    pub(super) fn has(&self, family: u64) -> bool {
        self.waiters.iter().any(|waiter| waiter.family == family)
            || self.held.iter().any(|&(_, holder)| holder == family)
    }

    /// Forgets `family`, that is gone, once it has neither a waiter nor a lease here (a
    /// guard outlives its lock object): the others of its group stay together.
    pub(super) fn forget(&mut self, family: u64) {
        if self.has(family) {
            self.departed.insert(family);
        } else {
            self.groups.remove(&family);
        }
    }

    /// Forgets `family` if it is gone and it has left.
    pub(super) fn forget_if_departed(&mut self, family: u64) {
        if self.departed.contains(&family) && !self.has(family) {
            self.departed.remove(&family);
            self.groups.remove(&family);
        }
    }

    /// Puts the groups of families `a` and `b` together (the caller notes them in `LINKED`).
    pub(super) fn link(&mut self, a: u64, b: u64) {
        let (group_a, group_b) = (group_of(&self.groups, a), group_of(&self.groups, b));
        if group_a == group_b {
            return;
        }
        let (kept, merged) = (group_a.min(group_b), group_a.max(group_b));
        for group in self.groups.values_mut() {
            if *group == merged {
                *group = kept;
            }
        }
        self.groups.insert(a, kept);
        self.groups.insert(b, kept);
    }

    /// Whether an exclusive lease of the lock is held in this process by `family`'s group.
    pub(super) fn held_by_group_of(&self, family: u64) -> bool {
        let group = group_of(&self.groups, family);
        self.held
            .iter()
            .any(|&(_, holder)| group_of(&self.groups, holder) == group)
    }

    /// The waiters of `family`'s group, in order.
    pub(super) fn group_mut(&mut self, family: u64) -> impl Iterator<Item = &mut Waiter> {
        let groups = &self.groups;
        let group = group_of(groups, family);
        self.waiters
            .iter_mut()
            .filter(move |waiter| group_of(groups, waiter.family) == group)
    }

    /// The id of the first waiter of `family`'s group (its poller).
    pub(super) fn first_of(&self, family: u64) -> Option<u64> {
        let group = group_of(&self.groups, family);
        self.waiters
            .iter()
            .find(|waiter| group_of(&self.groups, waiter.family) == group)
            .map(|waiter| waiter.id)
    }

    /// Tells the first waiter of `family`'s group to poll (again) at the busy-wait pace.
    pub(super) fn poll_first(&mut self, family: u64) {
        if let Some(first) = self.group_mut(family).next() {
            first.signal(Wake::Poll);
        }
    }

    /// Wakes the first waiter of `family`'s group not busy with an attempt and, if it shares
    /// the lock, the sharing waiters behind it up to the next exclusive one; returns their ids.
    /// If every waiter is busy, the first one attempts once more when it is back (its attempt
    /// may have been sent before the release). While a fair lock's first place in line is
    /// known, only its waiter is woken, if it waits in this group, and nobody otherwise.
    pub(super) fn wake_first(&mut self, family: u64) -> Vec<u64> {
        if let Some(head) = self.line_head.clone() {
            // Busy or not: its attempt may have reached the server before the release.
            let first_in_line = self
                .group_mut(family)
                .find(|waiter| waiter.place.as_ref() == Some(&head) && !waiter.receiving);
            return match first_in_line {
                Some(waiter) => {
                    waiter.signal(Wake::Attempt);
                    vec![waiter.id]
                }
                None => Vec::new(),
            };
        }
        let mut woken = Vec::new();
        for waiter in self
            .group_mut(family)
            .filter(|waiter| !waiter.busy && !waiter.receiving)
        {
            if !woken.is_empty() && !waiter.shared {
                break;
            }
            waiter.signal(Wake::Attempt);
            woken.push(waiter.id);
            if !waiter.shared {
                break;
            }
        }
        if woken.is_empty()
            && let Some(first) = self.group_mut(family).find(|waiter| !waiter.receiving)
        {
            first.signal(Wake::Attempt);
            woken.push(first.id);
        }
        woken
    }
}
