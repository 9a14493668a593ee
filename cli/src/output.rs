//! What `dlock` prints: a table for people, or one JSON document for scripts (`--json`).

use std::io::Write;
use std::time::Duration;

use distributed_lock_mongodb::{LockKind, LockStatus, Purgeable};
use mongodb::bson::{Bson, DateTime};
use serde_json::{Value, json};

use crate::Waiter;

/// Prints `holders` (a table, or a JSON array); `empty` is the table's text when there are none.
pub fn holders(holders: &[LockStatus], json: bool, empty: &str) {
    if json {
        let rows: Vec<Value> = holders.iter().map(holder_json).collect();
        out(&Value::Array(rows).to_string());
    } else if holders.is_empty() {
        out(empty);
    } else {
        out(table(holders).trim_end());
    }
}

/// The outcome of a forced release; `kept_until` is the end of a `min_hold` window that keeps
/// the lock taken all the same.
pub fn released(
    name: &str,
    released: &[String],
    gone: &[String],
    kept_until: Option<DateTime>,
    json: bool,
) {
    if json {
        out(&json!({
            "name": name,
            "released": released,
            "already_gone": gone,
            "kept_until": date(kept_until),
        })
        .to_string());
        return;
    }
    let mut line = format!("released {} of {name:?}", count(released.len(), "holder"));
    if let Some(until) = kept_until {
        line.push_str(&format!(
            "; its min_hold window keeps it taken until {} (server time)",
            time(until)
        ));
    }
    if !gone.is_empty() {
        line.push_str(&format!(
            " ({} had already released or changed: {})",
            count(gone.len(), "holder"),
            gone.join(", ")
        ));
    }
    out(&line);
}

/// What a purge would delete (`--dry-run`).
pub fn would_purge(due: &Purgeable, json: bool) {
    if json {
        out(&json!({ "would_delete": due.count, "names": due.names }).to_string());
    } else if due.count == 0 {
        out("nothing to delete: no lock document's last lease ended over a day ago");
    } else {
        out(&format!(
            "would delete {} ({})",
            count_of(due.count, "expired lock document"),
            some_names(due)
        ));
    }
}

/// `3 holders`, for a count that may be large.
pub fn count_of(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", plural(n))
}

/// The names a purge would delete, as far as they were read: `a, b, c and 7 more`.
pub fn some_names(due: &Purgeable) -> String {
    let names: Vec<String> = due.names.iter().map(|name| cell(name)).collect();
    let more = due.count.saturating_sub(names.len() as u64);
    match more {
        0 => names.join(", "),
        more => format!("{} and {more} more", names.join(", ")),
    }
}

/// A server time, as RFC 3339.
pub fn time(at: DateTime) -> String {
    at.try_to_rfc3339_string()
        .unwrap_or_else(|_| at.timestamp_millis().to_string())
}

/// The outcome of a purge.
pub fn purged(deleted: u64, json: bool) {
    if json {
        out(&json!({ "deleted": deleted }).to_string());
    } else {
        out(&format!(
            "deleted {deleted} expired lock document{}",
            plural(deleted)
        ));
    }
}

/// Prints lock `name`'s `holders` as seen now by `dlock watch`: the time and a table, or one
/// JSON line. Whether the output is still read (a closed pipe ends the watch).
pub fn watched(name: Option<&str>, holders: &[LockStatus], waiters: &[Waiter], json: bool) -> bool {
    let at = DateTime::now();
    let text = if json {
        let rows: Vec<Value> = holders.iter().map(holder_json).collect();
        let waiting: Vec<Value> = waiters.iter().map(waiter_json).collect();
        json!({
            "at": at.try_to_rfc3339_string().unwrap_or_default(),
            "name": name,
            "holders": rows,
            "waiters": waiting,
        })
        .to_string()
    } else {
        let mut text = match (holders.is_empty(), name) {
            (true, Some(name)) => format!("{}  {name:?} is free", time(at)),
            (true, None) => format!("{}  no lock is held", time(at)),
            (false, _) => format!("{}\n{}", time(at), table(holders).trim_end()),
        };
        for waiter in waiters {
            let places = waiter
                .places
                .map(|places| format!(" for {places} places"))
                .unwrap_or_default();
            text.push_str(&format!(
                "\nwaiting: {} {:?}{places}, mark {} ({} left)",
                kind(waiter.kind),
                cell(&waiter.name),
                cell(&waiter.id),
                duration(waiter.remaining),
            ));
        }
        text
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .is_ok()
}

fn waiter_json(waiter: &Waiter) -> Value {
    json!({
        "name": waiter.name,
        "kind": kind(waiter.kind),
        "mark": waiter.id,
        "places": waiter.places,
        "remaining_ms": millis(Some(waiter.remaining)),
    })
}

/// Prints `text` and a newline on stdout; a reader that went away (`dlock list | head -1`) is
/// not an error worth a panic.
fn out(text: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

/// What a cell shows of `text` stored by any client: control characters (a newline, a
/// terminal escape) as `?`, so they cannot break the table or drive the operator's terminal.
fn cell(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `1 holder`, `2 holders`.
pub fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", plural(n as u64))
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn kind(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "exclusive",
        LockKind::Write => "write",
        LockKind::Read => "read",
        LockKind::Semaphore => "semaphore",
        LockKind::Document => "document",
        _ => "other",
    }
}

fn date(date: Option<DateTime>) -> Value {
    date.and_then(|date| date.try_to_rfc3339_string().ok())
        .map_or(Value::Null, Value::String)
}

fn millis(duration: Option<Duration>) -> Value {
    duration.map_or(Value::Null, |duration| {
        json!(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    })
}

fn holder_json(holder: &LockStatus) -> Value {
    let details = holder.details.as_ref();
    json!({
        "name": holder.name,
        "kind": kind(holder.kind),
        "held": holder.is_held(),
        "lock_id": holder.lock_id,
        "fencing_token": holder.fencing_token.map(|token| token.get()),
        "acquired_at": date(holder.acquired_at),
        "renewed_at": date(holder.renewed_at),
        "expires_at": date(holder.expires_at),
        "remaining_ms": millis(holder.remaining),
        "kept_ms": millis(holder.kept),
        "min_hold_until": date(holder.min_hold_until),
        "held_for_ms": millis(holder.held_for()),
        "owner": holder.owner(),
        "host": holder.host(),
        "pid": holder.pid(),
        "extra": details
            .filter(|details| !details.extra.is_empty())
            .map(|details| Bson::Document(details.extra.clone()).into_relaxed_extjson()),
        "revocation": holder.revocation.as_ref().map(|revocation| json!({
            "priority": revocation.priority,
            "grace_until": date(Some(revocation.grace_until)),
            "grace_left_ms": millis(Some(revocation.grace_left)),
            "by_operator": revocation.by_operator,
        })),
    })
}

/// `0.4 s`, `12.3 s`, `5 min 3 s`, `3 h 12 min`, `2 d 4 h`.
pub fn duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{:.1} s", duration.as_secs_f64()),
        60..3_600 => format!("{} min {} s", seconds / 60, seconds % 60),
        3_600..86_400 => format!("{} h {} min", seconds / 3_600, seconds % 3_600 / 60),
        _ => format!("{} d {} h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
}

/// The holders as a table with a header line, one line per holder.
pub fn table(holders: &[LockStatus]) -> String {
    let mut header = vec![
        "NAME", "KIND", "LOCK ID", "TOKEN", "LEFT", "HELD FOR", "OWNER", "HOST", "PID",
    ];
    let with_extra = holders.iter().any(|holder| {
        holder
            .details
            .as_ref()
            .is_some_and(|details| !details.extra.is_empty())
    });
    if with_extra {
        header.push("DETAILS");
    }
    let text = |value: Option<String>| value.unwrap_or_else(|| "-".to_owned());
    let rows: Vec<Vec<String>> = holders
        .iter()
        .map(|holder| {
            let mut row = vec![
                holder.name.clone(),
                kind(holder.kind).to_owned(),
                text(holder.lock_id.clone()),
                text(holder.fencing_token.map(|token| token.to_string())),
                match (holder.remaining, holder.kept) {
                    (Some(remaining), _) => duration(remaining),
                    (None, Some(kept)) => format!("kept {}", duration(kept)),
                    (None, None) => "free".to_owned(),
                },
                text(holder.held_for().map(duration)),
                text(holder.owner().map(str::to_owned)),
                text(holder.host().map(str::to_owned)),
                text(holder.pid().map(|pid| pid.to_string())),
            ];
            if with_extra {
                let extra = holder.details.as_ref().map(|details| &details.extra);
                row.push(text(extra.filter(|extra| !extra.is_empty()).map(|extra| {
                    Bson::Document(extra.clone())
                        .into_relaxed_extjson()
                        .to_string()
                })));
            }
            row.into_iter().map(|text| cell(&text)).collect()
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .chain([header[column].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.clone());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_cannot_drive_the_terminal() {
        assert_eq!(cell("orders/1842"), "orders/1842");
        assert_eq!(cell("a\nb\u{1b}[31mred"), "a?b?[31mred");
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(Duration::from_millis(400)), "0.4 s");
        assert_eq!(duration(Duration::from_millis(12_340)), "12.3 s");
        assert_eq!(duration(Duration::from_secs(303)), "5 min 3 s");
        assert_eq!(
            duration(Duration::from_secs(3 * 3600 + 12 * 60)),
            "3 h 12 min"
        );
        assert_eq!(
            duration(Duration::from_secs(2 * 86_400 + 4 * 3600)),
            "2 d 4 h"
        );
    }
}
