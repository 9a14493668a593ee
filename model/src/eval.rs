//! A small evaluator of the MongoDB query filters, aggregation expressions and update pipelines
//! the lock sends, so that the model applies the crate's own commands to its model document.
//!
//! It covers what the exclusive lock's and the semaphore's commands and the fence use, with
//! MongoDB's semantics for them (a query path through an array of documents, `$filter`, `$size`,
//! `$concatArrays` for a semaphore's `holders`): BSON comparison order across types (a missing field sorts below everything), query
//! comparisons that match only values of a comparable type ("type bracketing"), `$$NOW` fixed for
//! the whole command, `$$REMOVE`. Anything else is refused with a panic naming it, so that a
//! change in the crate's commands cannot be evaluated silently wrong.

use std::cmp::Ordering;

use mongodb::bson::{Bson, DateTime, Document, doc};

/// The value of a field or expression: `None` when missing.
pub type Value = Option<Bson>;

/// Whether `document` matches the query `filter`.
pub fn matches(filter: &Document, document: &Document, now: DateTime) -> bool {
    filter.iter().all(|(key, condition)| match key.as_str() {
        "$and" => array(condition)
            .iter()
            .all(|each| matches(sub_document(each), document, now)),
        "$or" => array(condition)
            .iter()
            .any(|each| matches(sub_document(each), document, now)),
        "$expr" => truthy(&evaluate(condition, document, now)),
        operator if operator.starts_with('$') => panic!("query operator {operator} not modelled"),
        path => match through_array(document, path) {
            // MongoDB's implicit traversal: a path through an array of documents matches when
            // one element's value does, for the equality conditions the crate sends there
            // (https://www.mongodb.com/docs/manual/tutorial/query-array-of-documents/).
            Some(values) => {
                assert!(
                    equality(condition),
                    "only equality is modelled through an array ({path})"
                );
                values.iter().any(|value| field_matches(value, condition))
            }
            None => field_matches(&lookup(document, path), condition),
        },
    })
}

/// The values at `path` in each element of the array its first part names, if it names one.
fn through_array(document: &Document, path: &str) -> Option<Vec<Value>> {
    let (first, rest) = path.split_once('.')?;
    let Some(Bson::Array(items)) = document.get(first) else {
        return None;
    };
    Some(
        items
            .iter()
            .filter_map(Bson::as_document)
            .map(|item| lookup(item, rest))
            .collect(),
    )
}

/// Whether a query condition is a value or `$eq`/`$in` only.
fn equality(condition: &Bson) -> bool {
    match condition {
        Bson::Document(operators) if operators.keys().all(|key| key.starts_with('$')) => {
            operators.keys().all(|key| key == "$eq" || key == "$in")
        }
        _ => true,
    }
}

fn field_matches(value: &Value, condition: &Bson) -> bool {
    let Bson::Document(operators) = condition else {
        return equal(value, &Some(condition.clone()));
    };
    if !operators.keys().all(|key| key.starts_with('$')) {
        return equal(value, &Some(condition.clone()));
    }
    operators
        .iter()
        .all(|(operator, argument)| match operator.as_str() {
            "$eq" => equal(value, &Some(argument.clone())),
            "$ne" => !equal(value, &Some(argument.clone())),
            "$in" => array(argument)
                .iter()
                .any(|each| equal(value, &Some(each.clone()))),
            "$lt" => bracketed(value, argument, |order| order == Ordering::Less),
            "$lte" => bracketed(value, argument, |order| order != Ordering::Greater),
            "$gt" => bracketed(value, argument, |order| order == Ordering::Greater),
            "$gte" => bracketed(value, argument, |order| order != Ordering::Less),
            "$exists" => value.is_some() == truthy(&Some(argument.clone())),
            "$type" => value
                .as_ref()
                .is_some_and(|value| has_type(value, argument)),
            "$not" => !field_matches(value, argument),
            other => panic!("query operator {other} not modelled"),
        })
}

/// A query comparison matches only values of the argument's type class.
fn bracketed(value: &Value, argument: &Bson, accept: impl Fn(Ordering) -> bool) -> bool {
    match value {
        Some(value) if type_rank(value) == type_rank(argument) => {
            accept(compare(&Some(value.clone()), &Some(argument.clone())))
        }
        _ => false,
    }
}

fn has_type(value: &Bson, wanted: &Bson) -> bool {
    match wanted.as_str() {
        Some("number") => matches!(value, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)),
        Some("date") => matches!(value, Bson::DateTime(_)),
        Some("string") => matches!(value, Bson::String(_)),
        Some("object") => matches!(value, Bson::Document(_)),
        other => panic!("$type {other:?} not modelled"),
    }
}

/// Applies an update pipeline (`$set`/`$addFields`, `$unset`, `$replaceWith`) to `document`.
pub fn apply_pipeline(pipeline: &[Document], document: &Document, now: DateTime) -> Document {
    pipeline.iter().fold(document.clone(), |current, stage| {
        let (name, argument) = stage.iter().next().expect("a stage");
        match name.as_str() {
            "$set" | "$addFields" => {
                let mut next = current.clone();
                for (field, expression) in sub_document(argument) {
                    match evaluate(expression, &current, now) {
                        Some(value) => set_path(&mut next, field, value),
                        None => remove_path(&mut next, field),
                    }
                }
                next
            }
            "$replaceWith" => match evaluate(argument, &current, now) {
                Some(Bson::Document(next)) => next,
                other => panic!("$replaceWith needs a document, got {other:?}"),
            },
            "$unset" => {
                let mut next = current;
                let fields = match argument {
                    Bson::String(field) => vec![field.clone()],
                    other => array(other)
                        .iter()
                        .map(|field| field.as_str().expect("a field name").to_owned())
                        .collect(),
                };
                for field in fields {
                    remove_path(&mut next, &field);
                }
                next
            }
            other => panic!("pipeline stage {other} not modelled"),
        }
    })
}

/// Sets the field at `path` (dotted: inside embedded documents, created where missing).
fn set_path(document: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            document.insert(path, value);
        }
        Some((first, rest)) => {
            let inner = document
                .entry(first.to_owned())
                .or_insert_with(|| Bson::Document(Document::new()));
            match inner {
                Bson::Document(inner) => set_path(inner, rest, value),
                other => panic!("setting {path} inside {other} is not modelled"),
            }
        }
    }
}

/// Removes the field at `path` (dotted: inside embedded documents), if it is there.
fn remove_path(document: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            document.remove(path);
        }
        Some((first, rest)) => match document.get_mut(first) {
            Some(Bson::Document(inner)) => remove_path(inner, rest),
            None => {}
            Some(other) => panic!("removing {path} inside {other} is not modelled"),
        },
    }
}

/// Applies an update made of operators (`$set` with constant values and `$unset`, dotted paths
/// included).
pub fn apply_operators(update: &Document, document: &Document) -> Document {
    let mut next = document.clone();
    for (operator, fields) in update {
        for (field, value) in sub_document(fields) {
            match operator.as_str() {
                "$set" => set_path(&mut next, field, value.clone()),
                "$unset" => remove_path(&mut next, field),
                other => panic!("update operator {other} not modelled"),
            }
        }
    }
    next
}

/// Runs an aggregation `pipeline` of `$match` and `$project` stages (a projection of computed
/// fields, which keeps `_id`) over `documents`, with `$$NOW` = `now`.
pub fn aggregate(pipeline: &[Document], documents: &[Document], now: DateTime) -> Vec<Document> {
    let mut rows = documents.to_vec();
    for stage in pipeline {
        let (name, argument) = stage.iter().next().expect("a stage");
        rows = match (name.as_str(), argument) {
            ("$match", Bson::Document(filter)) => rows
                .into_iter()
                .filter(|row| matches(filter, row, now))
                .collect(),
            ("$project", Bson::Document(fields)) => rows
                .iter()
                .map(|row| {
                    let mut projected = Document::new();
                    projected.insert("_id", row.get("_id").cloned().unwrap_or(Bson::Null));
                    for (field, expression) in fields {
                        if let Some(value) = evaluate(expression, row, now) {
                            projected.insert(field, value);
                        }
                    }
                    projected
                })
                .collect(),
            _ => panic!("stage {name} not modelled"),
        };
    }
    rows
}

/// Evaluates an aggregation expression against `document`, with `$$NOW` = `now`.
pub fn evaluate(expression: &Bson, document: &Document, now: DateTime) -> Value {
    match expression {
        Bson::String(text) if text == "$$NOW" => Some(Bson::DateTime(now)),
        Bson::String(text) if text == "$$REMOVE" => None,
        Bson::String(text) if text == "$$ROOT" => Some(Bson::Document(document.clone())),
        Bson::String(text) if text.starts_with("$$") => panic!("variable {text} not modelled"),
        Bson::String(text) if text.starts_with('$') => lookup(document, &text[1..]),
        Bson::Array(items) => Some(Bson::Array(
            items
                .iter()
                .map(|item| evaluate(item, document, now).unwrap_or(Bson::Null))
                .collect(),
        )),
        Bson::Document(fields) => match fields.iter().next() {
            Some((operator, argument)) if operator.starts_with('$') => {
                assert_eq!(fields.len(), 1, "an operator expression has one field");
                operator_expression(operator, argument, document, now)
            }
            _ => {
                let mut object = Document::new();
                for (field, value) in fields {
                    if let Some(value) = evaluate(value, document, now) {
                        object.insert(field, value);
                    }
                }
                Some(Bson::Document(object))
            }
        },
        constant => Some(constant.clone()),
    }
}

fn operator_expression(
    operator: &str,
    argument: &Bson,
    document: &Document,
    now: DateTime,
) -> Value {
    let arguments = || -> Vec<Value> {
        array(argument)
            .iter()
            .map(|each| evaluate(each, document, now))
            .collect()
    };
    let pair = || -> (Value, Value) {
        let values = arguments();
        assert_eq!(values.len(), 2, "{operator} takes two arguments");
        (values[0].clone(), values[1].clone())
    };
    let boolean = |value: bool| Some(Bson::Boolean(value));
    match operator {
        "$literal" => Some(argument.clone()),
        "$cond" => {
            let (condition, then, otherwise) = match argument {
                Bson::Array(items) => (&items[0], &items[1], &items[2]),
                Bson::Document(form) => (
                    form.get("if").expect("if"),
                    form.get("then").expect("then"),
                    form.get("else").expect("else"),
                ),
                other => panic!("$cond argument {other} not modelled"),
            };
            if truthy(&evaluate(condition, document, now)) {
                evaluate(then, document, now)
            } else {
                evaluate(otherwise, document, now)
            }
        }
        // Unlike a query's, an expression's equality tells a missing field from null.
        "$eq" => {
            let (a, b) = pair();
            boolean(compare(&a, &b) == Ordering::Equal)
        }
        "$ne" => {
            let (a, b) = pair();
            boolean(compare(&a, &b) != Ordering::Equal)
        }
        "$lt" | "$lte" | "$gt" | "$gte" => {
            let (a, b) = pair();
            let order = compare(&a, &b);
            boolean(match operator {
                "$lt" => order == Ordering::Less,
                "$lte" => order != Ordering::Greater,
                "$gt" => order == Ordering::Greater,
                _ => order != Ordering::Less,
            })
        }
        // MongoDB's `$and` and `$or` stop at the first false (true) argument
        // (https://www.mongodb.com/docs/manual/reference/operator/aggregation/and/, .../or/):
        // so does the model, which saves it evaluating the rest (expressions have no effects).
        "$and" => boolean(
            array(argument)
                .iter()
                .all(|each| truthy(&evaluate(each, document, now))),
        ),
        "$or" => boolean(
            array(argument)
                .iter()
                .any(|each| truthy(&evaluate(each, document, now))),
        ),
        "$not" => boolean(!truthy(&arguments()[0])),
        "$ifNull" => arguments()
            .into_iter()
            .find(|value| !matches!(value, None | Some(Bson::Null)))
            .unwrap_or(Some(Bson::Null)),
        "$max" => arguments()
            .into_iter()
            .filter(|value| !matches!(value, None | Some(Bson::Null)))
            .max_by(compare)
            .unwrap_or(Some(Bson::Null)),
        "$add" => {
            let values = arguments();
            let mut millis = 0_i64;
            let mut date = false;
            for value in &values {
                match value {
                    Some(Bson::DateTime(at)) => {
                        date = true;
                        millis += at.timestamp_millis();
                    }
                    None | Some(Bson::Null) => return Some(Bson::Null),
                    Some(number) => millis += integer(number),
                }
            }
            Some(if date {
                Bson::DateTime(DateTime::from_millis(millis))
            } else {
                Bson::Int64(millis)
            })
        }
        "$multiply" => Some(Bson::Int64(
            arguments()
                .iter()
                .map(|value| integer(value.as_ref().expect("a number")))
                .product(),
        )),
        "$toLong" => evaluate(argument, document, now).map(|value| Bson::Int64(long(&value))),
        "$convert" => {
            let form = sub_document(argument);
            assert_eq!(form.get_str("to"), Ok("long"), "$convert to long only");
            match evaluate(form.get("input").expect("input"), document, now) {
                None | Some(Bson::Null) => {
                    evaluate(form.get("onNull").expect("onNull"), document, now)
                }
                Some(value) => match value {
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::DateTime(_) => {
                        Some(Bson::Int64(long(&value)))
                    }
                    Bson::Boolean(flag) => Some(Bson::Int64(i64::from(flag))),
                    Bson::String(text) if text.parse::<i64>().is_ok() => {
                        Some(Bson::Int64(text.parse().expect("checked")))
                    }
                    _ => evaluate(form.get("onError").expect("onError"), document, now),
                },
            }
        }
        // The expression form: whether the first value is among the second's.
        "$in" => {
            let (value, set) = pair();
            let Some(Bson::Array(set)) = set else {
                panic!("$in needs an array, got {set:?}");
            };
            boolean(
                set.into_iter()
                    .any(|item| compare(&value, &Some(item)) == Ordering::Equal),
            )
        }
        "$setIsSubset" => {
            let (subset, set) = pair();
            let (Some(Bson::Array(subset)), Some(Bson::Array(set))) = (subset, set) else {
                panic!("$setIsSubset needs two arrays");
            };
            boolean(subset.into_iter().all(|item| {
                set.iter().any(|other| {
                    compare(&Some(item.clone()), &Some(other.clone())) == Ordering::Equal
                })
            }))
        }
        // Later documents' fields win; null and missing arguments are skipped.
        "$mergeObjects" => {
            let mut merged = Document::new();
            for value in arguments() {
                match value {
                    Some(Bson::Document(object)) => merged.extend(object),
                    None | Some(Bson::Null) => {}
                    Some(other) => panic!("$mergeObjects of {other} not modelled"),
                }
            }
            Some(Bson::Document(merged))
        }
        "$objectToArray" => match evaluate(argument, document, now) {
            Some(Bson::Document(object)) => Some(Bson::Array(
                object
                    .iter()
                    .map(|(field, value)| Bson::Document(doc! { "k": field, "v": value.clone() }))
                    .collect(),
            )),
            other => panic!("$objectToArray of {other:?} not modelled"),
        },
        "$map" => {
            let form = sub_document(argument);
            let name = form.get_str("as").expect("as");
            let each = form.get("in").expect("in");
            let input = evaluate(form.get("input").expect("input"), document, now);
            let Some(Bson::Array(items)) = input else {
                panic!("$map over {input:?} not modelled");
            };
            Some(Bson::Array(
                items
                    .iter()
                    .map(|item| {
                        evaluate(&bind(each, name, item), document, now).unwrap_or(Bson::Null)
                    })
                    .collect(),
            ))
        }
        "$filter" => {
            let form = sub_document(argument);
            let name = form.get_str("as").expect("as");
            let cond = form.get("cond").expect("cond");
            let input = evaluate(form.get("input").expect("input"), document, now);
            let Some(Bson::Array(items)) = input else {
                panic!("$filter over {input:?} not modelled");
            };
            Some(Bson::Array(
                items
                    .into_iter()
                    .filter(|item| truthy(&evaluate(&bind(cond, name, item), document, now)))
                    .collect(),
            ))
        }
        // One expression that yields an array: the sum of its numbers; several: the sum of
        // those that are numbers. Anything else counts as nothing, as in MongoDB.
        "$sum" => {
            let values = match argument {
                Bson::Array(_) => arguments(),
                _ => match evaluate(argument, document, now) {
                    Some(Bson::Array(items)) => items.into_iter().map(Some).collect(),
                    other => vec![other],
                },
            };
            let numbers = values.iter().filter_map(|value| match value {
                Some(number @ (Bson::Int32(_) | Bson::Int64(_))) => Some(integer(number)),
                _ => None,
            });
            Some(Bson::Int64(numbers.sum()))
        }
        "$size" => match evaluate(argument, document, now) {
            Some(Bson::Array(items)) => Some(Bson::Int32(
                i32::try_from(items.len()).expect("a small array"),
            )),
            other => panic!("$size of {other:?}: MongoDB fails the command"),
        },
        // The element at an index (from the end if negative); missing past either end, null
        // for a null or missing array.
        "$arrayElemAt" => {
            let (array, index) = pair();
            let index = integer(index.as_ref().expect("an index"));
            match array {
                Some(Bson::Array(items)) => {
                    let len = i64::try_from(items.len()).expect("a small array");
                    let at = if index < 0 { len + index } else { index };
                    usize::try_from(at)
                        .ok()
                        .and_then(|at| items.get(at).cloned())
                }
                None | Some(Bson::Null) => Some(Bson::Null),
                Some(other) => panic!("$arrayElemAt of {other}: MongoDB fails the command"),
            }
        }
        // Null or missing if any argument is; otherwise the arrays one after the other.
        "$concatArrays" => {
            let mut joined = Vec::new();
            for value in arguments() {
                match value {
                    Some(Bson::Array(items)) => joined.extend(items),
                    None | Some(Bson::Null) => return Some(Bson::Null),
                    Some(other) => panic!("$concatArrays of {other}: MongoDB fails the command"),
                }
            }
            Some(Bson::Array(joined))
        }
        "$type" => Some(Bson::String(
            match evaluate(argument, document, now) {
                None => "missing",
                Some(Bson::Document(_)) => "object",
                Some(Bson::DateTime(_)) => "date",
                Some(Bson::String(_)) => "string",
                Some(Bson::Int64(_)) => "long",
                Some(Bson::Int32(_)) => "int",
                Some(Bson::Null) => "null",
                Some(Bson::Array(_)) => "array",
                Some(other) => panic!("$type of {other} not modelled"),
            }
            .to_owned(),
        )),
        other => panic!("expression operator {other} not modelled"),
    }
}

/// `expression` with the variable `$$name` (and the paths below it) replaced by `value` (and its
/// parts), as literals: how `$map` evaluates its `in` for each item.
fn bind(expression: &Bson, name: &str, value: &Bson) -> Bson {
    match expression {
        Bson::String(text) => {
            let Some(rest) = text.strip_prefix(&format!("$${name}")) else {
                return expression.clone();
            };
            let part = if rest.is_empty() {
                Some(value.clone())
            } else if let Some(path) = rest.strip_prefix('.') {
                lookup(sub_document(value), path)
            } else {
                // Another variable whose name starts with this one's.
                return expression.clone();
            };
            match part {
                Some(part) => Bson::Document(doc! { "$literal": part }),
                None => Bson::String("$$REMOVE".to_owned()),
            }
        }
        Bson::Array(items) => {
            Bson::Array(items.iter().map(|item| bind(item, name, value)).collect())
        }
        Bson::Document(fields) => Bson::Document(
            fields
                .iter()
                .map(|(field, inner)| (field.clone(), bind(inner, name, value)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn lookup(document: &Document, path: &str) -> Value {
    let mut current = document;
    let mut parts = path.split('.').peekable();
    while let Some(part) = parts.next() {
        let value = current.get(part)?;
        if parts.peek().is_none() {
            return Some(value.clone());
        }
        current = match value {
            Bson::Document(inner) => inner,
            Bson::Array(_) => panic!("a path through an array ({path}) is not modelled"),
            _ => return None,
        };
    }
    None
}

fn array(value: &Bson) -> &Vec<Bson> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected an array, got {value}"))
}

fn sub_document(value: &Bson) -> &Document {
    value
        .as_document()
        .unwrap_or_else(|| panic!("expected a document, got {value}"))
}

fn truthy(value: &Value) -> bool {
    match value {
        None | Some(Bson::Null) | Some(Bson::Boolean(false)) => false,
        Some(Bson::Int32(0)) | Some(Bson::Int64(0)) => false,
        Some(Bson::Double(number)) => *number != 0.0,
        Some(_) => true,
    }
}

fn integer(value: &Bson) -> i64 {
    match value {
        Bson::Int32(number) => i64::from(*number),
        Bson::Int64(number) => *number,
        other => panic!("integer expected, got {other}"),
    }
}

fn long(value: &Bson) -> i64 {
    match value {
        Bson::DateTime(at) => at.timestamp_millis(),
        Bson::Double(number) => *number as i64,
        other => integer(other),
    }
}

/// MongoDB's order of types: missing and null, numbers, strings, objects, arrays, booleans, dates.
fn type_rank(value: &Bson) -> u8 {
    match value {
        Bson::Null => 1,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => 2,
        Bson::String(_) => 3,
        Bson::Document(_) => 4,
        Bson::Array(_) => 5,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        other => panic!("comparison of {other} not modelled"),
    }
}

fn compare(a: &Value, b: &Value) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => {
            let ranks = type_rank(a).cmp(&type_rank(b));
            if ranks != Ordering::Equal {
                return ranks;
            }
            match (a, b) {
                (Bson::String(a), Bson::String(b)) => a.cmp(b),
                (Bson::DateTime(a), Bson::DateTime(b)) => a.cmp(b),
                (Bson::Boolean(a), Bson::Boolean(b)) => a.cmp(b),
                (Bson::Null, Bson::Null) => Ordering::Equal,
                (Bson::Double(_), _) | (_, Bson::Double(_)) => {
                    panic!("comparison of doubles not modelled")
                }
                (a, b) => integer(a).cmp(&integer(b)),
            }
        }
    }
}

fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Some(a), Some(b)) if type_rank(a) == type_rank(b) => {
            compare(&Some(a.clone()), &Some(b.clone())) == Ordering::Equal
        }
        (None, None) => true,
        // A missing field equals null in a query.
        (None, Some(Bson::Null)) | (Some(Bson::Null), None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> DateTime {
        DateTime::from_millis(millis)
    }

    /// The crate's forced release matches a lock document by its shape (`$map` over
    /// `$objectToArray`, `$setIsSubset`, `$in`), and no application document.
    #[test]
    fn a_forced_release_matches_lock_documents_by_their_shape_only() {
        let now = at(1_000);
        let filter = distributed_lock_mongodb::__model::force_release_filter("n");
        let lock = doc! {
            "_id": "n", "lockId": "a", "expiresAt": at(2_000), "acquiredAt": at(500),
            "fencingToken": 7_i64,
        };
        assert!(matches(&filter, &lock, now));
        let mut with_details = lock.clone();
        with_details.insert("details", doc! { "owner": "x" });
        assert!(
            matches(&filter, &with_details, now),
            "details are a lock's field"
        );
        let mut application = lock.clone();
        application.insert("payload", "the application's");
        assert!(
            !matches(&filter, &application, now),
            "a field no lock writes"
        );
        let mut without_token = lock.clone();
        without_token.remove("fencingToken");
        assert!(
            !matches(&filter, &without_token, now),
            "every lock has a token"
        );
        let mut released = lock.clone();
        released.remove("lockId");
        assert!(!matches(&filter, &released, now), "no lease to end");
        let ended = apply_pipeline(
            &distributed_lock_mongodb::__model::force_release_update(),
            &lock,
            now,
        );
        assert_eq!(ended.get("lockId"), None);
        assert_eq!(ended.get_datetime("expiresAt"), Ok(&now));
        assert_eq!(ended.get_i64("fencingToken"), Ok(7));
    }

    #[test]
    fn a_query_path_through_an_array_matches_when_one_element_does() {
        let stored = doc! { "_id": "s", "m": [{ "id": "a" }, { "id": "b" }] };
        let now = at(0);
        assert!(matches(&doc! { "m.id": "b" }, &stored, now));
        assert!(!matches(&doc! { "m.id": "c" }, &stored, now));
        assert!(matches(
            &doc! { "m.id": { "$in": ["c", "a"] } },
            &stored,
            now
        ));
        assert!(!matches(&doc! { "m.id": { "$in": ["c"] } }, &stored, now));
        let empty = doc! { "_id": "s", "m": [] };
        assert!(!matches(&doc! { "m.id": "a" }, &empty, now));
    }

    #[test]
    fn dotted_paths_set_and_unset_embedded_fields() {
        let stored = doc! { "w": { "id": "a", "t": 3_i64 } };
        let now = at(0);
        let set = apply_pipeline(
            &[doc! { "$set": { "w.e": "$$NOW", "x.y": 1_i64 } }],
            &stored,
            now,
        );
        assert_eq!(
            set,
            doc! { "w": { "id": "a", "t": 3_i64, "e": now }, "x": { "y": 1_i64 } }
        );
        let unset = apply_pipeline(&[doc! { "$unset": ["w.id", "w.e", "z.q"] }], &set, now);
        assert_eq!(unset, doc! { "w": { "t": 3_i64 }, "x": { "y": 1_i64 } });
    }

    #[test]
    fn filter_keeps_the_items_its_condition_holds_for() {
        let stored = doc! { "m": [{ "id": "a", "n": 1_i64 }, { "id": "b", "n": 5_i64 }] };
        let kept = evaluate(
            &Bson::from(doc! { "$filter": {
                "input": "$m",
                "as": "x",
                "cond": { "$gt": ["$$x.n", 2_i64] },
            } }),
            &stored,
            at(0),
        );
        assert_eq!(kept, Some(Bson::from(vec![doc! { "id": "b", "n": 5_i64 }])));
    }

    #[test]
    fn sum_adds_the_numbers_of_an_array_or_of_its_arguments() {
        let stored = doc! { "m": [{ "p": 2_i64 }, { "q": 1 }, { "p": 3 }] };
        let places = doc! { "$sum": { "$map": {
            "input": "$m",
            "as": "x",
            "in": { "$ifNull": ["$$x.p", 1_i64] },
        } } };
        assert_eq!(
            evaluate(&Bson::from(places), &stored, at(0)),
            Some(Bson::Int64(6))
        );
        let mixed = doc! { "$sum": [1_i64, "a", 2, "$missing"] };
        assert_eq!(
            evaluate(&Bson::from(mixed), &stored, at(0)),
            Some(Bson::Int64(3))
        );
    }

    #[test]
    fn array_elem_at_picks_from_either_end_and_is_missing_past_them() {
        let stored = doc! { "m": ["a", "b"] };
        let at_index = |index: i64| {
            let expression = doc! { "$arrayElemAt": ["$m", index] };
            evaluate(&Bson::from(expression), &stored, at(0))
        };
        assert_eq!(at_index(0), Some(Bson::from("a")));
        assert_eq!(at_index(-1), Some(Bson::from("b")));
        assert_eq!(at_index(2), None);
        assert_eq!(at_index(-3), None);
        let of_missing = doc! { "$arrayElemAt": ["$nothing", 0_i64] };
        assert_eq!(
            evaluate(&Bson::from(of_missing), &stored, at(0)),
            Some(Bson::Null)
        );
    }

    #[test]
    fn size_counts_and_concat_arrays_joins() {
        let stored = doc! { "m": [1_i64, 2_i64] };
        let size = evaluate(&Bson::from(doc! { "$size": "$m" }), &stored, at(0));
        assert_eq!(size, Some(Bson::Int32(2)));
        let joined = evaluate(
            &Bson::from(doc! { "$concatArrays": ["$m", [3_i64]] }),
            &stored,
            at(0),
        );
        assert_eq!(joined, Some(Bson::from(vec![1_i64, 2, 3])));
        // Null if an argument is missing (https://www.mongodb.com/docs/manual/reference/operator/aggregation/concatArrays/).
        let missing = evaluate(
            &Bson::from(doc! { "$concatArrays": ["$nothing", [3_i64]] }),
            &stored,
            at(0),
        );
        assert_eq!(missing, Some(Bson::Null));
    }

    #[test]
    fn map_binds_its_variable_for_each_item() {
        let stored = doc! { "a": 1_i64, "b": "x" };
        let names = evaluate(
            &Bson::from(doc! { "$map": {
                "input": { "$objectToArray": "$$ROOT" },
                "as": "field",
                "in": "$$field.k",
            } }),
            &stored,
            at(0),
        );
        assert_eq!(names, Some(Bson::from(vec!["a", "b"])));
    }

    #[test]
    fn merge_objects_lets_later_fields_win_and_skips_missing_arguments() {
        let stored = doc! { "a": 1, "b": { "c": 2 } };
        let merged = evaluate(
            &Bson::from(doc! { "$mergeObjects": ["$$ROOT", "$missing", { "a": 3, "d": 4 }] }),
            &stored,
            at(0),
        );
        assert_eq!(
            merged,
            Some(Bson::from(doc! { "a": 3, "b": { "c": 2 }, "d": 4 }))
        );
    }

    #[test]
    fn comparisons_follow_mongodbs_type_order_and_query_bracketing() {
        let now = at(1_000);
        let stored = doc! { "expiresAt": at(500), "token": 3_i64 };
        assert!(truthy(&evaluate(
            &Bson::from(doc! { "$lte": ["$expiresAt", "$$NOW"] }),
            &stored,
            now
        )));
        // A missing field sorts below every date: the lock is free.
        assert!(truthy(&evaluate(
            &Bson::from(doc! { "$lte": ["$missing", "$$NOW"] }),
            &stored,
            now
        )));
        // Queries compare within a type only: a missing token is not "less than 5".
        assert!(matches(&doc! { "token": { "$lt": 5_i64 } }, &stored, now));
        assert!(!matches(&doc! { "other": { "$lt": 5_i64 } }, &stored, now));
        assert!(matches(
            &doc! { "other": { "$not": { "$type": "number" } } },
            &stored,
            now
        ));
        assert!(matches(
            &doc! { "token": { "$in": [1_i64, 3_i64] } },
            &stored,
            now
        ));
    }

    #[test]
    fn expressions_tell_missing_from_null_where_queries_do_not() {
        let now = at(1_000);
        let stored = doc! { "nothing": Bson::Null };
        assert!(matches(&doc! { "missing": Bson::Null }, &stored, now));
        assert!(!truthy(&evaluate(
            &Bson::from(doc! { "$eq": ["$missing", Bson::Null] }),
            &stored,
            now
        )));
        assert!(truthy(&evaluate(
            &Bson::from(doc! { "$eq": ["$nothing", Bson::Null] }),
            &stored,
            now
        )));
        assert!(truthy(&evaluate(
            &Bson::from(doc! { "$ne": ["$missing", "$nothing"] }),
            &stored,
            now
        )));
    }

    #[test]
    fn convert_to_long_reads_numbers_in_strings_and_booleans() {
        let convert = |input: Bson| {
            evaluate(
                &Bson::from(doc! { "$convert": {
                    "input": input, "to": "long", "onError": "error", "onNull": "null",
                } }),
                &doc! {},
                at(0),
            )
        };
        assert_eq!(convert(Bson::from("42")), Some(Bson::Int64(42)));
        assert_eq!(convert(Bson::from("x")), Some(Bson::from("error")));
        assert_eq!(convert(Bson::Boolean(true)), Some(Bson::Int64(1)));
        assert_eq!(convert(Bson::Null), Some(Bson::from("null")));
        assert_eq!(convert(Bson::from(doc! {})), Some(Bson::from("error")));
    }

    #[test]
    #[should_panic(expected = "through an array")]
    fn paths_through_arrays_are_refused() {
        lookup(&doc! { "a": [{ "b": 1 }] }, "a.b");
    }

    #[test]
    fn pipelines_set_and_unset_with_a_fixed_now() {
        let now = at(2_000);
        let stored = doc! { "_id": "n", "lockId": "a", "expiresAt": at(3_000) };
        let ended = apply_pipeline(
            &[
                doc! { "$set": { "expiresAt": "$$NOW" } },
                doc! { "$unset": "lockId" },
            ],
            &stored,
            now,
        );
        assert_eq!(ended, doc! { "_id": "n", "expiresAt": at(2_000) });
        let removed = apply_pipeline(
            &[
                doc! { "$set": { "x": { "$cond": [false, 1, "$$REMOVE"] }, "y": { "$add": ["$$NOW", 5_i64] } } },
            ],
            &stored,
            now,
        );
        assert_eq!(removed.get("x"), None);
        assert_eq!(removed.get_datetime("y"), Ok(&at(2_005)));
    }

    #[test]
    fn a_replacement_writes_a_whole_document_or_keeps_the_root() {
        let now = at(2_000);
        let stored =
            doc! { "_id": "n", "lockId": "a", "details": { "o": 1 }, "expiresAt": at(1_000) };
        let replace = |free: bool| {
            apply_pipeline(
                &[doc! { "$replaceWith": { "$cond": [
                    free,
                    { "_id": "$_id", "lockId": "b", "expiresAt": "$$NOW" },
                    "$$ROOT",
                ] } }],
                &stored,
                now,
            )
        };
        assert_eq!(
            replace(true),
            doc! { "_id": "n", "lockId": "b", "expiresAt": at(2_000) }
        );
        assert_eq!(replace(false), stored);
    }
}
