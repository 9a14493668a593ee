//! Fencing tokens, and reading the numbers they are stored as.

use std::fmt;

use mongodb::bson::Bson;

/// A number that strictly increases with every successful acquisition of a lock name.
///
/// Hand it to the resource the lock protects and have the resource reject any write carrying a
/// smaller token than one it has already seen: a holder that lost its lock without noticing (a
/// long GC-style pause, a partition) is then refused instead of corrupting data. See the
/// `fencing` example.
///
/// Tokens are `max(previous + 1, server time in ms × 1000)`, so they also keep increasing after
/// the lock document was deleted by the TTL index, provided no server clock steps back by more
/// than a day (how long a lock document is kept after its lease ended) and every writer of the
/// lock collection uses this crate.
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

/// Reads a stored number written as Int32, Int64 or Double (servers and other clients may narrow
/// or widen it). Anything else, and doubles that are not whole or out of range, give `None`.
pub(crate) fn read_i64(value: &Bson) -> Option<i64> {
    match *value {
        Bson::Int32(v) => Some(i64::from(v)),
        Bson::Int64(v) => Some(v),
        // i64::MAX as f64 rounds up to 2^63, hence the strict upper bound.
        Bson::Double(v) if v.fract() == 0.0 && v >= i64::MIN as f64 && v < i64::MAX as f64 => {
            Some(v as i64)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_tolerantly() {
        assert_eq!(read_i64(&Bson::Int32(7)), Some(7));
        assert_eq!(read_i64(&Bson::Int64(1 << 40)), Some(1 << 40));
        assert_eq!(read_i64(&Bson::Double(12.0)), Some(12));
        assert_eq!(read_i64(&Bson::Double(12.5)), None);
        assert_eq!(read_i64(&Bson::Double(f64::NAN)), None);
        assert_eq!(read_i64(&Bson::Double(1e300)), None);
        assert_eq!(read_i64(&Bson::String("12".into())), None);
        assert_eq!(read_i64(&Bson::Null), None);
    }
}
