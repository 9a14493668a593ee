//! Fencing tokens.

use std::fmt;

/// A number that strictly increases with every successful acquisition of a lock name.
///
/// Hand it to the resource the lock protects and have the resource reject any write carrying a
/// smaller token than one it has already seen: a holder that lost its lock without noticing (a
/// long GC-style pause, a partition) is then refused instead of corrupting data. See the
/// `fencing` example.
///
/// Tokens are `max(previous + 1, server time in ms × 1000)`, so they also keep increasing after
/// the lock document was deleted by the TTL index, provided the server clock never steps back and
/// every writer of the lock collection uses this crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(i64);

impl FencingToken {
    pub(crate) fn new(value: i64) -> Self {
        FencingToken(value)
    }

    /// The token's value.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<FencingToken> for i64 {
    fn from(token: FencingToken) -> i64 {
        token.0
    }
}
