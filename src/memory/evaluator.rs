//! The few filters and updates the in-memory document locks evaluate: equalities of top-level
//! fields, and `$set`, `$unset`, `$inc`.

use mongodb::bson::{Bson, Document};

use crate::error::{Error, Result};
use crate::fencing::check_operators;

/// The field the MongoDB document locks keep their lock in by default: reserved in the
/// documents of the in-memory ones too.
pub(super) const LOCK_FIELD: &str = "lock";

/// Refuses a filter that is not made of equalities of top-level fields (operators, dotted
/// paths): the double does not evaluate MongoDB queries. Checked before any document is looked
/// at, so the refusal never depends on the data.
pub(super) fn check_filter(filter: &Document) -> Result<()> {
    for (field, value) in filter {
        let operator = match value {
            Bson::Document(inner) => inner.keys().find(|key| key.starts_with('$')),
            _ => None,
        };
        if field.starts_with('$') || field.contains('.') || operator.is_some() {
            return Err(Error::InvalidArgument(format!(
                "the in-memory document locks match equalities of top-level fields only, not \
                 {field:?}: test such a filter against MongoDB"
            )));
        }
    }
    Ok(())
}

/// Whether `document` matches `filter` (checked by [`check_filter`]): every field of the
/// filter equal to the document's.
pub(super) fn matches(document: &Document, filter: &Document) -> bool {
    filter
        .iter()
        .all(|(field, value)| document.get(field) == Some(value))
}

/// `current + by` as MongoDB's `$inc` computes it: a missing field becomes `by`; two 32-bit
/// integers stay one while the sum fits; a 64-bit integer widens the sum, a double makes it a
/// double. `None` for what is not a number, or an overflow.
pub(super) fn increment(current: Option<&Bson>, by: &Bson) -> Option<Bson> {
    let integer = |value: &Bson| match value {
        Bson::Int32(value) => Some(i64::from(*value)),
        Bson::Int64(value) => Some(*value),
        _ => None,
    };
    let float = |value: &Bson| match value {
        Bson::Double(value) => Some(*value),
        // Precision beyond 2^53 is lost, as in MongoDB's own conversion to a double.
        other => integer(other).map(|value| value as f64),
    };
    match (current, by) {
        (None, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)) => Some(by.clone()),
        (Some(Bson::Int32(a)), Bson::Int32(b)) => a.checked_add(*b).map(Bson::Int32),
        (Some(a @ (Bson::Int32(_) | Bson::Int64(_))), Bson::Int32(_) | Bson::Int64(_)) => {
            integer(a)?.checked_add(integer(by)?).map(Bson::Int64)
        }
        (Some(a), by) => Some(Bson::Double(float(a)? + float(by)?)),
        (None, _) => None,
    }
}

/// Applies `update` ($set, $unset and $inc of top-level fields) to `document`, refusing what
/// MongoDB's document locks refuse (no operators, the lock field) and what the double does not
/// implement.
pub(super) fn apply(document: &mut Document, update: &Document) -> Result<()> {
    check_operators(update, LOCK_FIELD)?;
    let mut updated = document.clone();
    for (operator, fields) in update {
        let Bson::Document(fields) = fields else {
            unreachable_operator(operator)?;
            continue;
        };
        for (field, value) in fields {
            if field.contains('.') || field == "_id" {
                return Err(Error::InvalidArgument(format!(
                    "the in-memory document locks update top-level fields other than _id only, \
                     not {field:?}"
                )));
            }
            match operator.as_str() {
                "$set" => {
                    updated.insert(field, value.clone());
                }
                "$unset" => {
                    updated.remove(field);
                }
                "$inc" => {
                    let Some(sum) = increment(updated.get(field), value) else {
                        return Err(Error::InvalidArgument(format!(
                            "$inc of {field:?}: both the field and the increment must be \
                             numbers, and the sum must fit"
                        )));
                    };
                    updated.insert(field, sum);
                }
                other => unreachable_operator(other)?,
            }
        }
    }
    *document = updated;
    Ok(())
}

/// The refusal of an update operator the double does not implement.
pub(super) fn unreachable_operator(operator: &str) -> Result<()> {
    Err(Error::InvalidArgument(format!(
        "the in-memory document locks implement $set, $unset and $inc, not {operator}: test \
         such an update against MongoDB"
    )))
}
