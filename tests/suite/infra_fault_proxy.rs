//! The test infrastructure itself: the fault proxy's command rules and the dedicated embedded
//! server with a skewed second port, against a real wire-protocol server with raw driver calls.

use test_support as common;

use std::time::Duration;

use common::proxy::{self, Action, Fault, FaultProxy, Rule, replies};
use common::server;
use futures::TryStreamExt;
use mongodb::bson::{DateTime, Document, doc};
use mongodb::error::{Error, ErrorKind, WriteFailure};
use mongodb::options::ReadConcern;
use mongodb::{Client, Collection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// A proxy to the test server, a client through it that never retries (so every fault reaches
/// the caller), and a control collection on the server directly.
async fn setup() -> (
    FaultProxy,
    Collection<Document>,
    Collection<Document>,
    Client,
) {
    let (proxy, client) = proxy::proxied_client_with(&server::uri(), |options| {
        options.retry_writes = Some(false);
        options.retry_reads = Some(false);
    })
    .await;
    let name = common::unique("proxy");
    let proxied = client.database(common::DATABASE).collection(&name);
    let control = common::database().await.collection(&name);
    (proxy, proxied, control, client)
}

fn code(error: &Error) -> Option<i32> {
    match error.kind.as_ref() {
        ErrorKind::Command(command) => Some(command.code),
        ErrorKind::Write(WriteFailure::WriteError(write)) => Some(write.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(concern)) => Some(concern.code),
        _ => None,
    }
}

async fn exists(collection: &Collection<Document>, id: &str) -> bool {
    collection
        .find_one(doc! { "_id": id })
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn drop_reply_and_close_applies_the_write_and_reports_a_network_error() {
    let (proxy, proxied, control, _client) = setup().await;
    let rule = proxy.add_rule(Rule::new("insert", Action::DropReplyAndClose));

    let error = proxied.insert_one(doc! { "_id": "a" }).await.unwrap_err();
    assert!(
        matches!(error.kind.as_ref(), ErrorKind::Io(_)),
        "a network error: {error:?}"
    );
    assert!(exists(&control, "a").await, "the insert was applied");
    assert_eq!(proxy.hits(rule), 1);

    // The rule is spent and the client reconnects.
    proxied.insert_one(doc! { "_id": "b" }).await.unwrap();
    assert!(exists(&control, "b").await);
    assert_eq!(proxy.hits(rule), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_then_hang_applies_the_write_and_never_answers() {
    let (proxy, proxied, control, _client) = setup().await;
    let rule = proxy.add_rule(Rule::new("insert", Action::ApplyThenHang));

    let hung = tokio::spawn({
        let proxied = proxied.clone();
        async move { proxied.insert_one(doc! { "_id": "a" }).await }
    });
    assert!(
        common::eventually(Duration::from_secs(10), || exists(&control, "a")).await,
        "the insert was applied"
    );
    // Other connections of the same client still work while this one hangs.
    tokio::time::timeout(
        Duration::from_secs(10),
        proxied.insert_one(doc! { "_id": "b" }),
    )
    .await
    .expect("another connection answers")
    .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(1), proxied.count_documents(doc! {}))
            .await
            .is_ok(),
        "reads on other connections answer too"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!hung.is_finished(), "the hung call never finishes");
    hung.abort();
    assert_eq!(proxy.hits(rule), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hang_applies_nothing_and_never_answers() {
    let (proxy, proxied, control, _client) = setup().await;
    let rule = proxy.add_rule(Rule::new("insert", Action::Hang));

    let call = tokio::time::timeout(
        Duration::from_secs(1),
        proxied.insert_one(doc! { "_id": "a" }),
    )
    .await;
    assert!(call.is_err(), "no answer within a second: {call:?}");
    assert_eq!(proxy.hits(rule), 1);
    assert!(!exists(&control, "a").await, "nothing was forwarded");
    proxied.insert_one(doc! { "_id": "b" }).await.unwrap();
    assert!(exists(&control, "b").await);
}

#[tokio::test]
async fn reply_answers_in_the_servers_place() {
    let (proxy, proxied, control, _client) = setup().await;
    let rule = proxy.add_rule(Rule::new(
        "insert",
        Action::Reply(replies::command_error(10107, "NotWritablePrimary")),
    ));

    let error = proxied.insert_one(doc! { "_id": "a" }).await.unwrap_err();
    assert_eq!(code(&error), Some(10107), "{error:?}");
    assert!(
        !error.contains_label("RetryableWriteError"),
        "not a retryable write (no txnNumber): no label"
    );
    assert!(!exists(&control, "a").await, "nothing was applied");
    assert_eq!(proxy.hits(rule), 1);
}

/// A server labels retryable errors on retryable writes only (4.4+); the proxy does the same.
#[tokio::test]
async fn replies_to_retryable_writes_carry_the_servers_error_label() {
    let (proxy, proxied, _control, client) = setup().await;
    let database = client.database(common::DATABASE);
    let collection = proxied.name().to_owned();
    proxy.add_rule(
        Rule::new(
            "insert",
            Action::Reply(replies::command_error(
                11602,
                "InterruptedDueToReplStateChange",
            )),
        )
        .times(3),
    );
    // As the driver sends a retryable write to a replica set: with a txnNumber.
    let retryable = database
        .run_command(
            doc! { "insert": &collection, "documents": [{ "_id": "a" }], "txnNumber": 1_i64 },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&retryable), Some(11602), "{retryable:?}");
    assert!(
        retryable.contains_label("RetryableWriteError"),
        "{retryable:?}"
    );
    // Part of a transaction: no label.
    let in_transaction = database
        .run_command(doc! {
            "insert": &collection, "documents": [{ "_id": "a" }],
            "txnNumber": 1_i64, "autocommit": false,
        })
        .await
        .unwrap_err();
    assert!(!in_transaction.contains_label("RetryableWriteError"));
    // Not a retryable write: no label.
    let plain = proxied.insert_one(doc! { "_id": "a" }).await.unwrap_err();
    assert_eq!(code(&plain), Some(11602));
    assert!(!plain.contains_label("RetryableWriteError"), "{plain:?}");
}

#[tokio::test]
async fn the_driver_retries_a_write_only_when_the_reply_carries_the_label() {
    let (proxy, client) = proxy::proxied_client_with(&server::uri(), |_| {}).await;
    proxy.pose_as_replica_set_primary();
    let name = common::unique("retry");
    let proxied = client
        .database(common::DATABASE)
        .collection::<Document>(&name);
    let control = common::database().await.collection::<Document>(&name);
    let interrupted = || replies::command_error(11602, "InterruptedDueToReplStateChange");

    // Labelled by the proxy as the server would: retried once; the retry goes through.
    let once = proxy.add_rule(Rule::new("insert", Action::Reply(interrupted())));
    proxied.insert_one(doc! { "_id": "a" }).await.unwrap();
    assert_eq!(proxy.hits(once), 1);
    assert!(exists(&control, "a").await);

    // Only once: a second failure reaches the caller.
    let twice = proxy.add_rule(Rule::new("insert", Action::Reply(interrupted())).times(2));
    let error = proxied.insert_one(doc! { "_id": "b" }).await.unwrap_err();
    assert_eq!(code(&error), Some(11602), "{error:?}");
    assert!(error.contains_label("RetryableWriteError"));
    assert_eq!(proxy.hits(twice), 2);

    // The same code without the label (an explicit empty list): not retried.
    let mut unlabelled = interrupted();
    unlabelled.insert("errorLabels", Vec::<String>::new());
    let bare = proxy.add_rule(Rule::new("insert", Action::Reply(unlabelled)).times(2));
    let error = proxied.insert_one(doc! { "_id": "c" }).await.unwrap_err();
    assert_eq!(code(&error), Some(11602), "{error:?}");
    assert_eq!(proxy.hits(bare), 1, "no retry without the label");

    // A network error is retried without any label (the driver adds it). The retried delete
    // finds nothing left to delete here; a real replica set would recognise the retry and
    // answer with the first attempt's outcome.
    let cut = proxy.add_rule(Rule::new("delete", Action::DropReplyAndClose));
    proxied.delete_one(doc! { "_id": "a" }).await.unwrap();
    assert_eq!(proxy.hits(cut), 1);
    assert!(!exists(&control, "a").await);
    assert!(!exists(&control, "b").await && !exists(&control, "c").await);
}

#[tokio::test]
async fn duplicate_key_replies_show_the_key_in_the_server_response() {
    let (proxy, proxied, control, _client) = setup().await;
    proxy.add_rule(Rule::new(
        "findAndModify",
        Action::Reply(replies::duplicate_key(
            doc! { "_id": 1 },
            doc! { "_id": "a" },
        )),
    ));
    let error = proxied
        .find_one_and_update(doc! { "_id": "a" }, doc! { "$set": { "x": 1 } })
        .upsert(true)
        .await
        .unwrap_err();
    let ErrorKind::Command(command) = error.kind.as_ref() else {
        panic!("a command error: {error:?}");
    };
    assert_eq!(command.code, 11000);
    assert_eq!(command.code_name, "DuplicateKey");
    assert!(
        command.message.starts_with("E11000 duplicate key error")
            && command
                .message
                .contains("index: _id_ dup key: { _id: \"a\" }"),
        "{}",
        command.message
    );
    // CommandError has no keyPattern field: the driver keeps the whole reply instead.
    let response = error.server_response().expect("the server's reply");
    assert_eq!(
        response.get_document("keyPattern").unwrap().to_owned(),
        mongodb::bson::rawdoc! { "_id": 1 }
    );
    assert_eq!(
        response
            .get_document("keyValue")
            .unwrap()
            .get_str("_id")
            .unwrap(),
        "a"
    );
    assert!(!exists(&control, "a").await);

    // insert gets it as a write error; WriteError has no keyPattern either (only errInfo).
    proxy.add_rule(Rule::new(
        "insert",
        Action::Reply(replies::insert_duplicate_key(
            doc! { "name": 1 },
            doc! { "name": "n" },
        )),
    ));
    let error = proxied
        .insert_one(doc! { "_id": "b", "name": "n" })
        .await
        .unwrap_err();
    let ErrorKind::Write(WriteFailure::WriteError(write)) = error.kind.as_ref() else {
        panic!("a write error: {error:?}");
    };
    assert_eq!(write.code, 11000);
    assert!(
        write.message.contains("index: name_1 dup key"),
        "{}",
        write.message
    );
    // No reply is kept with insert errors: mongodb 3.9 builds a new error when it turns the
    // command's InsertMany error into insert_one's Write error (and when insert_many gathers
    // its batches' errors). If this fails, keyPattern became reachable.
    assert!(error.server_response().is_none(), "{error:?}");

    // update_one keeps the reply: the write error's keyPattern is in it.
    proxy.add_rule(Rule::new(
        "update",
        Action::Reply(replies::insert_duplicate_key(
            doc! { "name": 1 },
            doc! { "name": "n" },
        )),
    ));
    let error = proxied
        .update_one(doc! { "_id": "b" }, doc! { "$set": { "name": "n" } })
        .upsert(true)
        .await
        .unwrap_err();
    assert_eq!(code(&error), Some(11000));
    let response = error.server_response().expect("the server's reply");
    let first = response
        .get_array("writeErrors")
        .unwrap()
        .into_iter()
        .next();
    let first = first.unwrap().unwrap().as_document().unwrap().to_owned();
    assert_eq!(
        first.get_document("keyPattern").unwrap().to_owned(),
        mongodb::bson::rawdoc! { "name": 1 }
    );
    assert!(!exists(&control, "b").await);
}

#[tokio::test]
async fn apply_then_merge_adds_a_write_concern_error_to_an_applied_update() {
    let (proxy, proxied, control, _client) = setup().await;
    control
        .insert_one(doc! { "_id": "a", "x": 0 })
        .await
        .unwrap();
    let rule = proxy.add_rule(Rule::new(
        "update",
        Action::ApplyThenMerge(replies::write_concern_error()),
    ));

    let error = proxied
        .update_one(doc! { "_id": "a" }, doc! { "$set": { "x": 1 } })
        .await
        .unwrap_err();
    let ErrorKind::Write(WriteFailure::WriteConcernError(concern)) = error.kind.as_ref() else {
        panic!("a write concern error: {error:?}");
    };
    assert_eq!(concern.code, 64);
    assert_eq!(concern.code_name, "WriteConcernFailed");
    assert_eq!(
        concern.details.as_ref().unwrap().get_bool("wtimeout"),
        Ok(true)
    );
    let stored = control
        .find_one(doc! { "_id": "a" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_i32("x").unwrap(), 1, "the update was applied");
    assert_eq!(proxy.hits(rule), 1);
}

#[tokio::test]
async fn delay_forwards_late() {
    let (proxy, proxied, control, _client) = setup().await;
    let delay = Duration::from_millis(400);
    proxy.add_rule(Rule::new("insert", Action::Delay(delay)));
    let started = Instant::now();
    proxied.insert_one(doc! { "_id": "a" }).await.unwrap();
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    assert!(exists(&control, "a").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_reply_applies_at_once_and_answers_late() {
    let (proxy, proxied, control, _client) = setup().await;
    let delay = Duration::from_millis(600);
    proxy.add_rule(Rule::new("insert", Action::DelayReply(delay)));
    let started = Instant::now();
    let inserting = tokio::spawn({
        let proxied = proxied.clone();
        async move { proxied.insert_one(doc! { "_id": "a" }).await }
    });
    assert!(
        common::eventually(Duration::from_secs(10), || exists(&control, "a")).await,
        "the insert was applied"
    );
    let applied_after = started.elapsed();
    inserting.await.unwrap().unwrap();
    let answered_after = started.elapsed();
    assert!(answered_after >= delay, "{answered_after:?}");
    assert!(
        applied_after < answered_after,
        "applied before it was answered"
    );
}

#[tokio::test]
async fn a_rule_may_require_a_field_to_be_present() {
    let (proxy, proxied, _control, _client) = setup().await;
    let rule = proxy.add_rule(
        Rule::new(
            "aggregate",
            Action::Reply(replies::command_error(123, "NotAReplicaSet")),
        )
        .where_present("readConcern.level")
        .times(usize::MAX),
    );
    let error = proxied
        .aggregate([doc! { "$match": {} }])
        .read_concern(ReadConcern::majority())
        .await
        .unwrap_err();
    assert_eq!(code(&error), Some(123));
    let rows: Vec<Document> = proxied
        .aggregate([doc! { "$match": {} }])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(rows.is_empty());
    assert_eq!(proxy.hits(rule), 1);
}

#[tokio::test]
async fn rules_act_in_order_and_are_spent_after_times_hits() {
    let (proxy, proxied, _control, _client) = setup().await;
    let first = proxy.add_rule(
        Rule::new(
            "insert",
            Action::Reply(replies::command_error(2, "BadValue")),
        )
        .times(2),
    );
    let second = proxy.add_rule(Rule::new(
        "insert",
        Action::Reply(replies::command_error(14, "TypeMismatch")),
    ));
    let mut codes = Vec::new();
    for id in ["a", "b", "c", "d"] {
        codes.push(
            proxied
                .insert_one(doc! { "_id": id })
                .await
                .err()
                .and_then(|error| code(&error)),
        );
    }
    assert_eq!(codes, [Some(2), Some(2), Some(14), None]);
    assert_eq!((proxy.hits(first), proxy.hits(second)), (2, 1));

    // Cleared rules act no more; their hits are kept.
    proxy.add_rule(Rule::new("insert", Action::Hang).times(100));
    proxy.clear_rules();
    proxied.insert_one(doc! { "_id": "e" }).await.unwrap();
    assert_eq!(proxy.hits(first), 2);
}

#[tokio::test]
async fn a_rule_for_one_collection_leaves_the_others_alone() {
    let (proxy, proxied, control, client) = setup().await;
    let other_name = common::unique("other");
    let other = client
        .database(common::DATABASE)
        .collection::<Document>(&other_name);
    let rule = proxy.add_rule(
        Rule::new(
            "insert",
            Action::Reply(replies::command_error(2, "BadValue")),
        )
        .on(proxied.name())
        .times(10),
    );
    other.insert_one(doc! { "_id": "a" }).await.unwrap();
    // Other commands on the same collection pass too.
    assert_eq!(proxied.count_documents(doc! {}).await.unwrap(), 0);
    assert!(proxied.insert_one(doc! { "_id": "a" }).await.is_err());
    assert!(!exists(&control, "a").await);
    assert_eq!(proxy.hits(rule), 1);
}

#[tokio::test]
async fn reads_are_matched_too() {
    let (proxy, proxied, control, _client) = setup().await;
    control.insert_one(doc! { "_id": "a" }).await.unwrap();
    proxy.add_rule(Rule::new(
        "find",
        Action::Reply(replies::command_error(
            11602,
            "InterruptedDueToReplStateChange",
        )),
    ));
    let error = proxied.find_one(doc! {}).await.unwrap_err();
    assert_eq!(code(&error), Some(11602));
    assert!(proxied.find_one(doc! {}).await.unwrap().is_some());

    let rule = proxy.add_rule(Rule::new(
        "aggregate",
        Action::Reply(replies::command_error(2, "BadValue")),
    ));
    let error = proxied
        .aggregate([doc! { "$match": {} }])
        .await
        .unwrap_err();
    assert_eq!(code(&error), Some(2));
    let rows: Vec<Document> = proxied
        .aggregate([doc! { "$match": {} }])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(proxy.hits(rule), 1);
}

#[tokio::test]
async fn a_rule_may_require_a_field_value() {
    let (proxy, proxied, control, _client) = setup().await;
    control.insert_one(doc! { "_id": "a" }).await.unwrap();
    let rule = proxy.add_rule(
        Rule::new(
            "aggregate",
            Action::Reply(replies::command_error(123, "NotAReplicaSet")),
        )
        .where_field("readConcern.level", "linearizable")
        .times(usize::MAX),
    );
    let pipeline = [doc! { "$match": {} }];
    for _ in 0..2 {
        let error = proxied
            .aggregate(pipeline.clone())
            .read_concern(ReadConcern::linearizable())
            .await
            .unwrap_err();
        assert_eq!(code(&error), Some(123));
    }
    for concern in [ReadConcern::local(), ReadConcern::majority()] {
        let rows: Vec<Document> = proxied
            .aggregate(pipeline.clone())
            .read_concern(concern)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
    }
    assert_eq!(proxy.hits(rule), 2);
}

#[tokio::test]
async fn connection_faults_still_work_alongside_rules() {
    let (proxy, proxied, _control, _client) = setup().await;
    proxy.add_rule(Rule::new(
        "insert",
        Action::Delay(Duration::from_millis(100)),
    ));
    proxy.set(Fault::Latency(Duration::from_millis(100)));
    let started = Instant::now();
    proxied.insert_one(doc! { "_id": "a" }).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    proxy.set(Fault::Pass);
    proxy.cut_connections();
    // The pooled connection was closed under the driver: without retries the first call on it
    // may fail; a new connection then works.
    let mut attempts = 0;
    while proxied.insert_one(doc! { "_id": "b" }).await.is_err() {
        attempts += 1;
        assert!(attempts < 5, "the client reconnects");
    }
}

// ---- Framing: the proxy reassembles messages from any fragmentation and survives garbage ----

fn op_msg(request_id: i32, body: &Document) -> Vec<u8> {
    let mut document = Vec::new();
    body.to_writer(&mut document).unwrap();
    let length = i32::try_from(16 + 4 + 1 + document.len()).unwrap();
    let mut message = Vec::new();
    for field in [length, request_id, 0, 2013] {
        message.extend_from_slice(&field.to_le_bytes());
    }
    message.extend_from_slice(&0_u32.to_le_bytes());
    message.push(0);
    message.extend_from_slice(&document);
    message
}

/// Reads one OP_MSG reply and returns its responseTo and body.
async fn read_reply(stream: &mut TcpStream) -> (i32, Document) {
    let mut header = [0_u8; 16];
    stream.read_exact(&mut header).await.unwrap();
    let length = usize::try_from(i32::from_le_bytes(header[..4].try_into().unwrap())).unwrap();
    let mut rest = vec![0_u8; length - 16];
    stream.read_exact(&mut rest).await.unwrap();
    assert_eq!(i32::from_le_bytes(header[12..].try_into().unwrap()), 2013);
    let response_to = i32::from_le_bytes(header[8..12].try_into().unwrap());
    (response_to, Document::from_reader(&mut &rest[5..]).unwrap())
}

#[tokio::test]
async fn fragmented_messages_are_framed_and_garbage_passes_through() {
    let proxy = FaultProxy::start(proxy::upstream_address().await).await;
    let rule = proxy.add_rule(Rule::new(
        "ping",
        Action::Reply(doc! { "ok": 1.0, "injected": true }),
    ));

    // Two pings, the first sent a byte at a time, the second glued to the end of the first.
    let mut stream = TcpStream::connect(proxy.address()).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let ping = doc! { "ping": 1, "$db": "admin" };
    let mut bytes = op_msg(7, &ping);
    bytes.extend(op_msg(8, &ping));
    let split = bytes.len() / 2 + 3; // inside the second message's header
    for byte in &bytes[..split] {
        stream.write_all(&[*byte]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stream.write_all(&bytes[split..]).await.unwrap();
    let (to, first) = read_reply(&mut stream).await;
    assert_eq!((to, first.get_bool("injected")), (7, Ok(true)));
    let (to, second) = read_reply(&mut stream).await;
    assert_eq!(to, 8);
    assert!(
        !second.contains_key("injected"),
        "the rule was spent: {second}"
    );
    assert_eq!(proxy.hits(rule), 1);

    // A length no MongoDB message has: the bytes go to the server as they are, which closes
    // the connection; the proxy goes on serving others.
    let mut garbage = TcpStream::connect(proxy.address()).await.unwrap();
    garbage
        .write_all(&[
            0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
        ])
        .await
        .unwrap();
    let mut sink = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(10), garbage.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "the server closed the garbage connection");

    let mut again = TcpStream::connect(proxy.address()).await.unwrap();
    again.write_all(&op_msg(9, &ping)).await.unwrap();
    let (to, reply) = read_reply(&mut again).await;
    assert_eq!(to, 9);
    assert_eq!(
        reply
            .get_f64("ok")
            .ok()
            .or(reply.get_i32("ok").ok().map(f64::from)),
        Some(1.0)
    );
}

// ---- The dedicated server's skewed port ----

/// The `$$NOW` of one aggregate on `collection` (which holds a document).
async fn server_now(collection: &Collection<Document>) -> DateTime {
    let rows: Vec<Document> = collection
        .aggregate([
            doc! { "$limit": 1 },
            doc! { "$project": { "now": "$$NOW" } },
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    *rows[0].get_datetime("now").unwrap()
}

/// `$$NOW` through the skewed port minus `$$NOW` through the normal one, in milliseconds.
async fn measured_skew(normal: &Collection<Document>, skewed: &Collection<Document>) -> i64 {
    let before = server_now(normal).await;
    let shifted = server_now(skewed).await;
    shifted.timestamp_millis() - before.timestamp_millis()
}

#[tokio::test]
async fn the_skewed_port_shifts_now_and_shares_the_data() {
    let dedicated = tokio::task::spawn_blocking(|| server::start_dedicated(Some(60_000)))
        .await
        .unwrap();
    let skewed_uri = dedicated.skewed_uri.clone().expect("a skewed port");
    let normal = common::database_on(&dedicated.uri)
        .await
        .collection::<Document>("c");
    let skewed = common::database_on(&skewed_uri)
        .await
        .collection::<Document>("c");

    // Data written through one port is visible through the other.
    normal
        .insert_one(doc! { "_id": "from-normal" })
        .await
        .unwrap();
    skewed
        .insert_one(doc! { "_id": "from-skewed" })
        .await
        .unwrap();
    assert!(exists(&skewed, "from-normal").await);
    assert!(exists(&normal, "from-skewed").await);

    let skew = measured_skew(&normal, &skewed).await;
    assert!((58_000..=62_000).contains(&skew), "skew {skew} ms");

    // Writes evaluate $$NOW by the port's clock too.
    let pipeline = vec![doc! { "$set": { "at": "$$NOW" } }];
    normal
        .update_one(doc! { "_id": "from-normal" }, pipeline.clone())
        .await
        .unwrap();
    let stamped = skewed
        .find_one_and_update(doc! { "_id": "from-skewed" }, pipeline)
        .return_document(mongodb::options::ReturnDocument::After)
        .await
        .unwrap()
        .unwrap();
    let normal_at = normal
        .find_one(doc! { "_id": "from-normal" })
        .await
        .unwrap()
        .unwrap();
    let written_skew = stamped.get_datetime("at").unwrap().timestamp_millis()
        - normal_at.get_datetime("at").unwrap().timestamp_millis();
    assert!(
        (58_000..=62_000).contains(&written_skew),
        "skew {written_skew} ms"
    );

    // TTL deletion follows the unshifted clock on both ports: a document that expires in 30 s
    // stays, though the skewed port's clock is past its expiry; an expired one goes.
    let ttl = normal
        .client()
        .database("skew")
        .collection::<Document>("ttl");
    common::create_ttl_index(&ttl, Duration::ZERO).await;
    let now = DateTime::now().timestamp_millis();
    ttl.insert_many([
        doc! { "_id": "live", "expiresAt": DateTime::from_millis(now + 30_000) },
        doc! { "_id": "expired", "expiresAt": DateTime::from_millis(now - 1_000) },
    ])
    .await
    .unwrap();
    let skewed_ttl = skewed
        .client()
        .database("skew")
        .collection::<Document>("ttl");
    assert!(exists(&skewed_ttl, "live").await);
    assert_eq!(skewed_ttl.count_documents(doc! {}).await.unwrap(), 1);
    assert!(exists(&ttl, "live").await);
    assert!(!exists(&ttl, "expired").await);
}

#[tokio::test]
async fn the_skew_may_be_negative() {
    let dedicated = tokio::task::spawn_blocking(|| server::start_dedicated(Some(-60_000)))
        .await
        .unwrap();
    let normal = common::database_on(&dedicated.uri)
        .await
        .collection::<Document>("c");
    let skewed = common::database_on(dedicated.skewed_uri.as_deref().unwrap())
        .await
        .collection::<Document>("c");
    normal.insert_one(doc! { "_id": "one" }).await.unwrap();
    let skew = measured_skew(&normal, &skewed).await;
    assert!((-62_000..=-58_000).contains(&skew), "skew {skew} ms");

    // A dedicated server without skew has one port, and its own data.
    let plain = tokio::task::spawn_blocking(|| server::start_dedicated(None))
        .await
        .unwrap();
    assert!(plain.skewed_uri.is_none());
    let other = common::database_on(&plain.uri)
        .await
        .collection::<Document>("c");
    assert_eq!(other.count_documents(doc! {}).await.unwrap(), 0);
}
