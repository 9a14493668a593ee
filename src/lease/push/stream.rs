//! The change stream of one family and collection: [`run`].

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mongodb::Collection;
use mongodb::bson::{Document, doc};
use mongodb::change_stream::event::OperationType;
use tokio::sync::watch;

use super::events::{freed, line_head};
use super::{
    NO_STREAMS_PAUSE, NOT_A_REPLICA_SET, POSITION_KEPT, POSITIONS, Position, Pushed, REOPEN_PAUSE,
    WATCHERS, Watcher, WatcherKey, places, saw_line, unhealthy, wake,
};

/// Marks a stream unhealthy when its task ends.
struct Ending {
    key: WatcherKey,
    healthy: Arc<AtomicBool>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        unhealthy(&self.key, &self.healthy);
    }
}

/// How long a `getMore` of the stream waits for events. The stream checks for a change of its
/// subscribers between two `getMore`s only (a `getMore` is never cut short: the driver cannot
/// resume a cursor whose request was dropped), so a new name waits this long at most for its
/// stream, and the stream outlives its last subscriber by as much.
const AWAIT_EVENTS: Duration = Duration::from_secs(1);

/// How long a `getMore` of the stream is waited for (it returns after [`AWAIT_EVENTS`] when
/// nothing happens) before the stream counts as hung: then it is given up and opened again
/// from where it stood.
const GET_MORE_PATIENCE: Duration = Duration::from_secs(10);

/// The stream of one family and collection, for as long as it has subscribers.
pub(super) async fn run(
    collection: Collection<Document>,
    key: WatcherKey,
    mut names: watch::Receiver<Vec<String>>,
    healthy: Arc<AtomicBool>,
) {
    // However the task ends (its runtime dropped included), its pollers stop counting on it.
    let _ending = Ending {
        key: key.clone(),
        healthy: Arc::clone(&healthy),
    };
    // Where the family's last stream of the collection stood, if it ended for lack of
    // subscribers, and the names it was filtered to (which `resume` continues).
    let kept = POSITIONS
        .lock()
        .remove(&key)
        .filter(|position| position.ended.elapsed() < POSITION_KEPT);
    let (mut resume, mut watched, mut unheard) = match &kept {
        Some(position) => (
            Some(position.token.clone()),
            position.names.clone(),
            position.unheard.clone(),
        ),
        None => (None, Vec::new(), HashSet::new()),
    };
    // Until this task opens a stream, the position it took is as old as it was.
    let mut since = kept.map(|position| position.ended);
    loop {
        // The watcher is gone (its last subscriber left): so is its stream.
        if names.has_changed().is_err() {
            return;
        }
        let filter = names.borrow_and_update().clone();
        if filter.is_empty() {
            // The last subscriber left: so does the stream, unless one came back meanwhile.
            let mut all = WATCHERS.lock();
            if all.get(&key).is_some_and(Watcher::is_unused) {
                if let Some(watcher) = all.remove(&key) {
                    unheard.extend(watcher.unheard);
                }
                // Before a new watcher can start (it needs `all`).
                if let Some(token) = resume {
                    let mut positions = POSITIONS.lock();
                    positions.retain(|_, position| position.ended.elapsed() < POSITION_KEPT);
                    let ended = since.unwrap_or_else(std::time::Instant::now);
                    positions.insert(
                        key,
                        Position {
                            token,
                            names: watched,
                            unheard,
                            ended,
                        },
                    );
                }
                return;
            }
            continue;
        }
        let pipeline = [doc! { "$match": {
            "$or": [
                { "documentKey._id": { "$in": &filter } },
                { "operationType": { "$in": ["drop", "invalidate"] } },
            ],
        } }];
        let watch = || {
            collection
                .watch()
                .pipeline(pipeline.clone())
                .max_await_time(AWAIT_EVENTS)
        };
        let opened = match &resume {
            Some(token) => match watch().start_after(token.clone()).await {
                Ok(stream) => Ok(stream),
                // The token is gone from the oplog (or refused): afresh.
                Err(_) => {
                    resume = None;
                    watch().await
                }
            },
            None => watch().await,
        };
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(error) => {
                unhealthy(&key, &healthy);
                // A server's refusal (no replica set, no `changeStream` privilege, no support
                // for an option) will not change soon: ask again much later. Anything else (the
                // network, an election) is retried soon.
                let pause = match &*error.kind {
                    mongodb::error::ErrorKind::Command(command)
                        if command.code == NOT_A_REPLICA_SET =>
                    {
                        NO_STREAMS_PAUSE
                    }
                    mongodb::error::ErrorKind::Command(_) => {
                        tracing::warn!(
                            %error,
                            collection = %collection.name(),
                            "cannot watch a lock collection: waiters poll instead"
                        );
                        NO_STREAMS_PAUSE
                    }
                    _ => {
                        tracing::debug!(%error, "cannot open the change stream of a lock collection");
                        REOPEN_PAUSE
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    changed = names.changed() => if changed.is_err() { return },
                }
                continue;
            }
        };
        healthy.store(true, Ordering::Relaxed);
        // A release of a name this stream did not watch until now may have come between its
        // poller's last attempt and now: that poller attempts at once. (Resumed, the names
        // watched before miss nothing; but a release of one the last stream saw while nobody
        // polled for it is told now.)
        if resume.is_none() {
            watched.clear();
        }
        let new: Vec<String> = filter
            .iter()
            .filter(|name| !watched.contains(name) || unheard.contains(*name))
            .cloned()
            .collect();
        unheard.clear();
        since = None;
        // A name that left the filter starts afresh when it comes back (it is new to the stream
        // then): nothing to keep for it, and what is kept stays bounded by the names watched.
        if let Some(watcher) = WATCHERS.lock().get_mut(&key) {
            watcher.unheard.retain(|name| filter.contains(name));
            watcher.places.retain(|name, _| filter.contains(name));
        }
        wake(&key, Some(&new), Pushed::MaybeMissed);
        watched = filter;
        loop {
            let Ok(next) = tokio::time::timeout(GET_MORE_PATIENCE, stream.next_if_any()).await
            else {
                tracing::debug!(
                    collection = %collection.name(),
                    "the change stream of a lock collection got no reply; opening it again"
                );
                unhealthy(&key, &healthy);
                resume = stream.resume_token().or(resume);
                break;
            };
            match next {
                Ok(Some(event)) => {
                    resume = Some(event.id.clone());
                    if matches!(
                        event.operation_type,
                        OperationType::Drop | OperationType::Invalidate
                    ) {
                        // Every lock of the collection is gone: all are free.
                        unhealthy(&key, &healthy);
                        resume = None;
                        wake(&key, None, Pushed::Freed);
                        break;
                    }
                    if let Some((name, ends)) = freed(&event, |name| places(&key, name)) {
                        if let Some(head) = line_head(&event) {
                            saw_line(&key, &name, head);
                        }
                        let pushed = if ends { Pushed::Freed } else { Pushed::Taken };
                        wake(&key, Some(std::slice::from_ref(&name)), pushed);
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(%error, "the change stream of a lock collection failed");
                    unhealthy(&key, &healthy);
                    resume = stream.resume_token().or(resume);
                    tokio::time::sleep(REOPEN_PAUSE).await;
                    break;
                }
            }
            if !stream.is_alive() {
                unhealthy(&key, &healthy);
                resume = None;
                break;
            }
            // Between two `getMore`s: the position is safe to read.
            resume = stream.resume_token().or(resume);
            match names.has_changed() {
                Err(_) => return,
                Ok(true) => {
                    // Other names: open again from here. The same ones (a lock whose poller
                    // changed): go on.
                    let mut now = names.borrow_and_update().clone();
                    now.sort_unstable();
                    let mut before = watched.clone();
                    before.sort_unstable();
                    if now != before {
                        break;
                    }
                }
                Ok(false) => {}
            }
        }
    }
}
