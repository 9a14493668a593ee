//! What a shutdown waits for and undoes: the family's work under way ([`Work`]).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Debug;

use super::Moment;

/// The work under way of one family of locks that may leave a lease on the server (attempts,
/// releases, transfers, cleanups), each piece with what undoes it (`U`): what a shutdown waits
/// for and undoes. Pieces are named by their tracker's ids.
///
/// The rules that keep a shutdown from leaving two holders are decided here:
/// - a piece with a settle deadline (an attempt or a transfer: the instant by which the server
///   has applied or given up on its last command) is due to be undone only once that deadline
///   has passed ([`Work::take_due`]); every other piece at once;
/// - a piece whose undo was taken is gone: its work must not send another command
///   ([`Work::settle_by`] says false), nor start what its undo would miss ([`Work::add_undo`]),
///   nor hand on what it won ([`Work::settle`](super::Work::settle)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Work<I, U> {
    pieces: BTreeMap<u64, Piece<I, U>>,
    /// Pieces whose task ended unfinished, oldest first.
    abandoned: VecDeque<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Piece<I, U> {
    undo: Vec<U>,
    /// `None`: due at once.
    settle_by: Option<I>,
}

/// What is due to be undone at one instant ([`Work::take_due`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Due<I, U> {
    /// Undo these now (their pieces are forgotten).
    pub undo: Vec<U>,
    /// The earliest settle deadline of the work still under way, if any.
    pub next: Option<I>,
}

/// Where a piece of unknown outcome stands ([`Work::settling`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Settling<I, U> {
    /// A command may still land until then.
    WaitUntil(I),
    /// Send this undo, then finish the piece (it stays tracked, due at once, until then).
    Undo(Vec<U>),
    /// A shutdown took the piece: it sends the undo.
    Taken,
}

impl<I, U> Default for Work<I, U> {
    fn default() -> Work<I, U> {
        Work {
            pieces: BTreeMap::new(),
            abandoned: VecDeque::new(),
        }
    }
}

impl<I: Moment, U: Clone> Work<I, U> {
    /// Starts tracking piece `id`, undone by `undo`, with a settle deadline if it may still
    /// change the lock document until then.
    pub fn track(&mut self, id: u64, undo: Vec<U>, settle_by: Option<I>) {
        self.pieces.insert(id, Piece { undo, settle_by });
    }

    /// Adds to what undoes `id` (a release that becomes a transfer: the waiters' leases too).
    /// False if a shutdown took its undo already (it would not send this one).
    pub fn add_undo(&mut self, id: u64, undo: U) -> bool {
        match self.pieces.get_mut(&id) {
            Some(piece) => {
                piece.undo.push(undo);
                true
            }
            None => false,
        }
    }

    /// `id` is about to send a command the server applies or gives up on by `at`: a shutdown
    /// waits until then before undoing it. False if a shutdown took its undo already: the
    /// command must not be sent.
    pub fn settle_by(&mut self, id: u64, at: I) -> bool {
        match self.pieces.get_mut(&id) {
            Some(piece) => {
                piece.settle_by = Some(at);
                true
            }
            None => false,
        }
    }

    /// The outcome of `id` is known: nobody sends its undo from now on. True if nobody took it
    /// before (what the work did stands, and may be handed to its caller); false if a shutdown
    /// took it (it is being undone: hand nothing on).
    pub fn settle(&mut self, id: u64) -> bool {
        self.pieces.remove(&id).is_some()
    }

    /// `id` is over: nothing of it is left to undo.
    pub fn finish(&mut self, id: u64) {
        self.pieces.remove(&id);
    }

    /// The task of `id` ended unfinished (its runtime was dropped): its undo is due at once, and
    /// kept for a shutdown, or a family that goes on, to send ([`Work::take_abandoned`]). At most
    /// `keep` abandoned pieces are kept: past that the oldest is forgotten, and its undo
    /// returned (its lease, if any, ends at its expiry).
    pub fn abandon(&mut self, id: u64, keep: usize) -> Option<Vec<U>> {
        if let Some(piece) = self.pieces.get_mut(&id) {
            piece.settle_by = None;
            self.abandoned.push_back(id);
        }
        if self.abandoned.len() > keep {
            let oldest = self.abandoned.pop_front()?;
            return self.pieces.remove(&oldest).map(|piece| piece.undo);
        }
        None
    }

    /// Takes the undo of every abandoned piece, forgetting them.
    pub fn take_abandoned(&mut self) -> Vec<U> {
        let abandoned = std::mem::take(&mut self.abandoned);
        abandoned
            .into_iter()
            .filter_map(|id| self.pieces.remove(&id))
            .flat_map(|piece| piece.undo)
            .collect()
    }

    /// Takes the undo of every piece due `now` (forgetting those pieces), and tells when the
    /// next will be: what a shutdown does, again and again, until nothing is left.
    pub fn take_due(&mut self, now: I) -> Due<I, U> {
        let due: Vec<u64> = self
            .pieces
            .iter()
            .filter(|(_, piece)| piece.settle_by.is_none_or(|settle_by| settle_by <= now))
            .map(|(id, _)| *id)
            .collect();
        self.abandoned.clear();
        let undo = due
            .into_iter()
            .filter_map(|id| self.pieces.remove(&id))
            .flat_map(|piece| piece.undo)
            .collect();
        let next = self
            .pieces
            .values()
            .filter_map(|piece| piece.settle_by)
            .min();
        Due { undo, next }
    }

    /// For `id`, whose outcome stays unknown, `now`: wait until its settle deadline, or send its
    /// undo (it stays tracked, due at once, until finished: a shutdown meanwhile sends it too,
    /// which is harmless, and never finds the piece gone before its undo went out).
    pub fn settling(&mut self, id: u64, now: I) -> Settling<I, U> {
        match self.pieces.get_mut(&id) {
            None => Settling::Taken,
            Some(Piece {
                settle_by: Some(at),
                ..
            }) if now < *at => Settling::WaitUntil(*at),
            Some(piece) => {
                piece.settle_by = None;
                Settling::Undo(piece.undo.clone())
            }
        }
    }

    /// Whether no work is under way.
    pub fn is_idle(&self) -> bool {
        self.pieces.is_empty()
    }

    /// How many pieces are tracked, and how many of them are abandoned.
    pub fn counts(&self) -> (usize, usize) {
        (self.pieces.len(), self.abandoned.len())
    }

    /// Whether `id` is tracked.
    pub fn tracks(&self, id: u64) -> bool {
        self.pieces.contains_key(&id)
    }
}
