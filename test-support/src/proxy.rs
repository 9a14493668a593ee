//! A fault-injecting proxy for the reliability suites.
//!
//! Listens on a loopback port and forwards every connection to the MongoDB server. Two kinds of
//! faults, which combine:
//!
//! - **Connection faults** ([`Fault`], [`FaultProxy::set`]): pass traffic, delay it, blackhole it
//!   (connections stay open, nothing is forwarded, new ones are accepted and stalled too) or
//!   refuse it (every connection is closed at once, new ones are closed on accept).
//!   [`FaultProxy::cut_connections`] closes what is open without changing the mode.
//! - **Command faults** ([`Rule`], [`FaultProxy::add_rule`]): the proxy frames both directions
//!   into wire messages and reads each OP_MSG command (name, collection). The first live rule
//!   that matches a command acts on it ([`Action`]): drop its reply and close the connection,
//!   forward it and then hang the connection, hang without forwarding, answer in the server's
//!   place, merge fields into the server's reply, or delay it. The effect concerns only the
//!   connection the command came on. Anything else (the legacy OP_QUERY handshake, replies,
//!   messages the proxy cannot parse) passes through untouched; bytes that do not frame as
//!   MongoDB messages switch that direction of the connection to plain byte forwarding.
//!
//! The Rust driver sends everything as OP_MSG, its handshake (`isMaster`/`hello`) and its
//! monitors' checks included, so rules can match those too. Compressed messages (OP_COMPRESSED,
//! only with a `compressors` option) pass through unmatched.
//!
//! The code under test connects through the proxy ([`proxied_client`]); assertions use a
//! control client that talks to the server directly.
//!
//! # Driver retries and `times`
//!
//! A rule acts on the first `times` matching commands, counting every command the driver sends,
//! retries included. The Rust driver (mongodb 3.9) retries once:
//!
//! - **Reads** (`find`, `aggregate`, `count`, ...; not `getMore`) on any topology, after a network
//!   error or a command error whose code is retryable (10107 NotWritablePrimary, 11602
//!   InterruptedDueToReplStateChange, 91, 189, 11600, 13435, 13436, 6, 7, 89, 9001, 134, 262);
//!   no error label needed.
//! - **Writes** (`insert`, single-document `update`/`delete`, `findAndModify`; not
//!   `updateMany`/`deleteMany`) only where the server supports retryable writes: a replica set
//!   or `mongos`, never a standalone. The embedded mongoeco server reports itself as a
//!   standalone, so the driver sends no `txnNumber` and **never retries writes there**; the
//!   `docker compose` replica set does. A write is retried after a network error (the driver
//!   labels those itself) or a server error labelled `RetryableWriteError`; the driver never
//!   adds that label to a command error: since MongoDB 4.4 the server does, and the driver
//!   relies on it. So [`Action::Reply`] and [`Action::ApplyThenMerge`] add the label as a real
//!   server would: when the command is a retryable write (it carries `txnNumber` and is not
//!   part of a transaction) and the reply's `code` (or `writeConcernError.code`) is a retryable
//!   one, unless the document already has `errorLabels`.
//!
//! [`FaultProxy::pose_as_replica_set_primary`] makes the driver treat the embedded server as a
//! replica set, to see write retries there (with a caveat: mongoeco does not deduplicate them).
//!
//! So, to make an operation fail for the caller with a retryable fault, use `times: 2` where the
//! driver retries (reads anywhere; writes on a replica set), or a client with
//! `retryReads`/`retryWrites` off. With `times: 1` the retry goes through: after
//! [`Action::DropReplyAndClose`] a real replica set recognises the retried write by its
//! `txnNumber` and answers with the first attempt's outcome without applying it again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mongodb::Client;
use mongodb::bson::{Bson, Document};
use mongodb::options::{ClientOptions, ServerAddress};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Forward everything after this delay in each direction (round trip: twice this).
    Latency(Duration),
    /// Keep connections open and forward nothing.
    Blackhole,
    /// Close every connection, now and on accept.
    Refuse,
}

/// What a [`Rule`] does to a command it matches.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Forward the command, throw its reply away and close the connection: applied but
    /// unacknowledged (the driver sees a network error).
    DropReplyAndClose,
    /// Forward the command, then forward nothing more on this connection in either direction
    /// and keep it open (a half-open connection: the driver waits forever).
    ApplyThenHang,
    /// Do not forward; leave the connection half-open (nothing applied, no reply ever).
    Hang,
    /// Do not forward; answer with this document as the reply (see [`replies`]).
    Reply(Document),
    /// Forward, then answer with the server's reply with these fields merged in (e.g. a
    /// `writeConcernError` after the write was applied).
    ApplyThenMerge(Document),
    /// Forward after this delay.
    Delay(Duration),
    /// Forward at once (applied), and hold the reply back for this long: a reply slow to come
    /// back.
    DelayReply(Duration),
}

/// A command fault: acts on the first `times` commands called `command` (in `collection`, when
/// given), on whichever connection they arrive. Rules are checked in the order they were added;
/// the first live matching rule acts.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// The command name, e.g. "findAndModify", "update", "insert", "delete", "aggregate",
    /// "find" (compared ignoring ASCII case: the server also accepts `findandmodify`).
    pub command: String,
    /// The collection the command targets (its first field's value, or `collection` for
    /// `getMore`); `None` matches any.
    pub collection: Option<String>,
    /// Fields the command must carry, by dotted path (e.g. `readConcern.level`), with these
    /// values.
    pub fields: Vec<(String, Bson)>,
    /// Fields the command must carry, by dotted path, whatever their values.
    pub present: Vec<String>,
    /// How many matching commands it acts on; then it is spent.
    pub times: usize,
    pub action: Action,
}

impl Rule {
    /// A rule that acts once on `command`, in any collection.
    pub fn new(command: &str, action: Action) -> Rule {
        Rule {
            command: command.to_owned(),
            collection: None,
            fields: Vec::new(),
            present: Vec::new(),
            times: 1,
            action,
        }
    }

    /// Only commands whose field at the dotted `path` equals `value`.
    pub fn where_field(mut self, path: &str, value: impl Into<Bson>) -> Rule {
        self.fields.push((path.to_owned(), value.into()));
        self
    }

    /// Only commands that carry a field at the dotted `path` (e.g. `query.lockId.$in`: a
    /// release that hands a lock over).
    pub fn where_present(mut self, path: &str) -> Rule {
        self.present.push(path.to_owned());
        self
    }

    /// Only commands on `collection`.
    pub fn on(mut self, collection: &str) -> Rule {
        self.collection = Some(collection.to_owned());
        self
    }

    /// Acts on `times` commands instead of one.
    pub fn times(mut self, times: usize) -> Rule {
        self.times = times;
        self
    }

    fn matches(&self, command: &Command) -> bool {
        self.command.eq_ignore_ascii_case(&command.name)
            && self
                .collection
                .as_deref()
                .is_none_or(|wanted| command.collection.as_deref() == Some(wanted))
            && self
                .fields
                .iter()
                .all(|(path, value)| field_at(&command.body, path) == Some(value))
            && self
                .present
                .iter()
                .all(|path| field_at(&command.body, path).is_some())
    }
}

/// Names a rule added with [`FaultProxy::add_rule`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuleId(usize);

/// Ready-made reply documents for [`Action::Reply`] and [`Action::ApplyThenMerge`], shaped like
/// a MongoDB 7 server's.
pub mod replies {
    use mongodb::bson::{Bson, Document, doc};

    /// A command error: `{ok: 0, code, codeName, errmsg}`, e.g. 10107 NotWritablePrimary or
    /// 11602 InterruptedDueToReplStateChange. The proxy adds `errorLabels:
    /// ["RetryableWriteError"]` when the command was a retryable write and the code retryable,
    /// as the server does.
    pub fn command_error(code: i32, code_name: &str) -> Document {
        doc! {
            "ok": 0.0,
            "errmsg": format!("{code_name} (injected by the fault proxy)"),
            "code": code,
            "codeName": code_name,
        }
    }

    /// The duplicate-key command error `findAndModify` gets (E11000, code 11000).
    pub fn duplicate_key(key_pattern: Document, key_value: Document) -> Document {
        doc! {
            "ok": 0.0,
            "errmsg": duplicate_key_message(&key_pattern, &key_value),
            "code": 11000,
            "codeName": "DuplicateKey",
            "keyPattern": key_pattern,
            "keyValue": key_value,
        }
    }

    /// The duplicate-key reply `insert` gets: the command succeeds with a write error.
    pub fn insert_duplicate_key(key_pattern: Document, key_value: Document) -> Document {
        doc! {
            "n": 0,
            "writeErrors": [{
                "index": 0,
                "code": 11000,
                "errmsg": duplicate_key_message(&key_pattern, &key_value),
                "keyPattern": key_pattern,
                "keyValue": key_value,
            }],
            "ok": 1.0,
        }
    }

    /// A write concern timeout, to merge into the server's reply to a write that was applied.
    pub fn write_concern_error() -> Document {
        doc! {
            "writeConcernError": {
                "code": 64,
                "codeName": "WriteConcernFailed",
                "errmsg": "waiting for replication timed out",
                "errInfo": { "wtimeout": true },
            }
        }
    }

    /// The server's message, e.g. `E11000 duplicate key error collection: <ns> index: _id_ dup
    /// key: { _id: "a" }` (the namespace is not known here: `<ns>`).
    fn duplicate_key_message(key_pattern: &Document, key_value: &Document) -> String {
        let index: Vec<String> = key_pattern
            .iter()
            .map(|(field, direction)| match direction {
                Bson::String(kind) => format!("{field}_{kind}"),
                Bson::Int32(order) => format!("{field}_{order}"),
                Bson::Int64(order) => format!("{field}_{order}"),
                other => format!("{field}_{other}"),
            })
            .collect();
        let index = if index == ["_id_1"] {
            "_id_".to_owned()
        } else {
            index.join("_")
        };
        let values: Vec<String> = key_value
            .iter()
            .map(|(field, value)| format!("{field}: {value}"))
            .collect();
        format!(
            "E11000 duplicate key error collection: <ns> index: {index} dup key: {{ {} }}",
            values.join(", ")
        )
    }
}

#[derive(Clone, Copy, Debug)]
struct State {
    fault: Fault,
    /// Bumped by `cut_connections`: connections opened before the bump close.
    generation: u64,
}

pub struct FaultProxy {
    address: SocketAddr,
    state: watch::Sender<State>,
    rules: Arc<Rules>,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on the current runtime; it stops with the runtime.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let address = listener.local_addr().expect("local address");
        let (state, _) = watch::channel(State {
            fault: Fault::Pass,
            generation: 0,
        });
        let states = state.subscribe();
        let rules = Arc::new(Rules::default());
        let accepted_rules = Arc::clone(&rules);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let states = states.clone();
                if states.borrow().fault == Fault::Refuse {
                    drop(client);
                    continue;
                }
                tokio::spawn(relay(client, upstream, states, Arc::clone(&accepted_rules)));
            }
        });
        FaultProxy {
            address,
            state,
            rules,
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn set(&self, fault: Fault) {
        self.state.send_modify(|state| state.fault = fault);
    }

    /// Closes every open connection (their unforwarded bytes are discarded).
    pub fn cut_connections(&self) {
        self.state.send_modify(|state| state.generation += 1);
    }

    /// Adds a command fault after the existing ones.
    pub fn add_rule(&self, rule: Rule) -> RuleId {
        let mut table = self.rules.table();
        let id = RuleId(table.next_id);
        table.next_id += 1;
        table.hits.insert(id, 0);
        table.live.push((id, rule));
        id
    }

    /// How many commands the rule has acted on so far (also after [`FaultProxy::clear_rules`]).
    pub fn hits(&self, rule: RuleId) -> usize {
        self.rules.table().hits.get(&rule).copied().unwrap_or(0)
    }

    /// Removes one rule (its hits stay counted).
    pub fn remove_rule(&self, rule: RuleId) {
        self.rules.table().live.retain(|(id, _)| *id != rule);
    }

    /// Removes every rule (connections already hanging stay so), including those of
    /// [`FaultProxy::pose_as_replica_set_primary`].
    pub fn clear_rules(&self) {
        self.rules.table().live.clear();
    }

    /// Makes the driver see a replica-set primary (as the `docker compose` server is) where the
    /// server is a standalone (as mongoeco is): adds rules merging `setName` and friends into
    /// every `hello`/`isMaster` reply. The driver then sends retryable writes (with a
    /// `txnNumber`) and retries them. mongoeco ignores `txnNumber` and so does not recognise a
    /// retried write: a retry after [`Action::DropReplyAndClose`] or [`Action::ApplyThenHang`]
    /// applies the write a second time, where a real replica set would answer with the first
    /// attempt's outcome. Realistic with faults that keep the first attempt from being applied.
    pub fn pose_as_replica_set_primary(&self) {
        let me = self.address.to_string();
        let fields = mongodb::bson::doc! {
            "setName": "rs0", "setVersion": 1, "hosts": [&me], "primary": &me, "me": &me,
            "secondary": false,
        };
        for command in ["hello", "isMaster"] {
            self.add_rule(
                Rule::new(command, Action::ApplyThenMerge(fields.clone())).times(usize::MAX),
            );
        }
    }
}

#[derive(Default)]
struct Rules {
    table: Mutex<RuleTable>,
}

#[derive(Default)]
struct RuleTable {
    live: Vec<(RuleId, Rule)>,
    hits: HashMap<RuleId, usize>,
    next_id: usize,
}

impl Rules {
    fn table(&self) -> MutexGuard<'_, RuleTable> {
        // A panicking test thread must not take the proxy down with it.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The action of the first live rule matching the command, counted as a hit.
    fn take(&self, command: &Command) -> Option<Action> {
        let mut table = self.table();
        let RuleTable { live, hits, .. } = &mut *table;
        for (id, rule) in live.iter() {
            let count = hits.entry(*id).or_default();
            if *count < rule.times && rule.matches(command) {
                *count += 1;
                return Some(rule.action.clone());
            }
        }
        None
    }
}

/// What to do with the server's reply to a command a rule acted on.
enum ReplyPlan {
    DropAndClose,
    /// Pass the reply on after this delay.
    Delay(Duration),
    /// Merge these fields; the request decides the error labels.
    Merge {
        fields: Document,
        request: Document,
    },
}

/// State shared by the four halves of one proxied connection.
#[derive(Default)]
struct Connection {
    /// By request id.
    plans: Mutex<HashMap<i32, ReplyPlan>>,
    /// Set once a hanging action took effect: nothing more is forwarded either way.
    hung: AtomicBool,
}

impl Connection {
    fn plans(&self) -> MutexGuard<'_, HashMap<i32, ReplyPlan>> {
        self.plans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_hung(&self) -> bool {
        self.hung.load(Ordering::SeqCst)
    }
}

/// A unit of work for a writer.
enum Item {
    /// Write `bytes` once `due` has passed; with `then_hang`, the connection hangs from then on
    /// (`bytes` may be empty: a pure hang marker).
    Send {
        due: Instant,
        bytes: Vec<u8>,
        then_hang: bool,
    },
    /// Close the connection (after what was queued before).
    Close,
}

impl Item {
    fn send(due: Instant, bytes: Vec<u8>) -> Item {
        Item::Send {
            due,
            bytes,
            then_hang: false,
        }
    }
}

async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    mut states: watch::Receiver<State>,
    rules: Arc<Rules>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let generation = states.borrow().generation;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let connection = Arc::new(Connection::default());
    let (to_server, for_server) = mpsc::unbounded_channel();
    let (to_client, for_client) = mpsc::unbounded_channel();
    let requests = read_requests(
        client_read,
        to_server,
        to_client.clone(),
        Arc::clone(&connection),
        rules,
        states.clone(),
    );
    let replies = read_replies(
        server_read,
        to_client,
        Arc::clone(&connection),
        states.clone(),
    );
    let server_writer = write(
        server_write,
        for_server,
        Arc::clone(&connection),
        states.clone(),
    );
    let client_writer = write(client_write, for_client, connection, states.clone());
    let closed = async move {
        let _ = states
            .wait_for(|state| state.generation != generation || state.fault == Fault::Refuse)
            .await;
    };
    // Whichever ends first ends the connection; dropping the halves closes both sockets.
    tokio::select! {
        () = requests => {}
        () = replies => {}
        () = server_writer => {}
        () = client_writer => {}
        () = closed => {}
    }
}

/// The delay `Fault::Latency` currently adds in each direction.
fn latency(states: &watch::Receiver<State>) -> Duration {
    match states.borrow().fault {
        Fault::Latency(delay) => delay,
        _ => Duration::ZERO,
    }
}

/// Reads the client's messages and queues them for the server, applying the rules.
async fn read_requests(
    mut from: OwnedReadHalf,
    to_server: mpsc::UnboundedSender<Item>,
    to_client: mpsc::UnboundedSender<Item>,
    connection: Arc<Connection>,
    rules: Arc<Rules>,
    mut states: watch::Receiver<State>,
) {
    let mut framer = Framer::default();
    let mut buffer = vec![0_u8; 64 * 1024];
    // Set once a hanging action was queued: later input is read (to notice the client closing)
    // and discarded.
    let mut hanging = false;
    loop {
        if states
            .wait_for(|s| s.fault != Fault::Blackhole)
            .await
            .is_err()
        {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if hanging || connection.is_hung() {
            continue;
        }
        framer.push(&buffer[..read]);
        while let Some(frame) = framer.next() {
            let due = Instant::now() + latency(&states);
            let (bytes, action, request) = match frame {
                Frame::Raw(bytes) => (bytes, None, None),
                Frame::Message(bytes) => match parse_command(&bytes) {
                    Some(command) => {
                        let action = rules.take(&command);
                        (bytes, action, Some(command))
                    }
                    None => (bytes, None, None),
                },
            };
            let item = match (action, request) {
                (Some(action), Some(request)) => {
                    match apply(action, bytes, request, due, &connection, &to_client) {
                        Some(item) => item,
                        None => continue,
                    }
                }
                _ => Item::send(due, bytes),
            };
            if matches!(
                item,
                Item::Send {
                    then_hang: true,
                    ..
                }
            ) {
                hanging = true;
            }
            if to_server.send(item).is_err() {
                return;
            }
            if hanging {
                break;
            }
        }
    }
}

/// What to queue for the server for a command a rule acts on (`None`: nothing).
fn apply(
    action: Action,
    bytes: Vec<u8>,
    request: Command,
    due: Instant,
    connection: &Connection,
    to_client: &mpsc::UnboundedSender<Item>,
) -> Option<Item> {
    match action {
        Action::Delay(delay) => Some(Item::send(due + delay, bytes)),
        Action::DelayReply(delay) => {
            connection
                .plans()
                .insert(request.request_id, ReplyPlan::Delay(delay));
            Some(Item::send(due, bytes))
        }
        Action::Hang => Some(Item::Send {
            due,
            bytes: Vec::new(),
            then_hang: true,
        }),
        Action::ApplyThenHang => Some(Item::Send {
            due,
            bytes,
            then_hang: true,
        }),
        Action::DropReplyAndClose => {
            connection
                .plans()
                .insert(request.request_id, ReplyPlan::DropAndClose);
            Some(Item::send(due, bytes))
        }
        Action::ApplyThenMerge(fields) => {
            connection.plans().insert(
                request.request_id,
                ReplyPlan::Merge {
                    fields,
                    request: request.body,
                },
            );
            Some(Item::send(due, bytes))
        }
        Action::Reply(mut reply) => {
            label_as_the_server_would(&request.body, &mut reply);
            let message = op_msg(next_request_id(), request.request_id, 0, &reply);
            if let Some(message) = message
                && !request.more_to_come
            {
                let _ = to_client.send(Item::send(due, message));
            }
            None
        }
    }
}

/// Reads the server's messages and queues them for the client, applying the reply plans.
async fn read_replies(
    mut from: OwnedReadHalf,
    to_client: mpsc::UnboundedSender<Item>,
    connection: Arc<Connection>,
    mut states: watch::Receiver<State>,
) {
    let mut framer = Framer::default();
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        if states
            .wait_for(|s| s.fault != Fault::Blackhole)
            .await
            .is_err()
        {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if connection.is_hung() {
            continue;
        }
        framer.push(&buffer[..read]);
        while let Some(frame) = framer.next() {
            let mut due = Instant::now() + latency(&states);
            let bytes = match frame {
                Frame::Raw(bytes) => bytes,
                Frame::Message(bytes) => {
                    let plan = connection.plans().remove(&header(&bytes).response_to);
                    match plan {
                        None => bytes,
                        Some(ReplyPlan::Delay(delay)) => {
                            due += delay;
                            bytes
                        }
                        Some(ReplyPlan::DropAndClose) => {
                            let _ = to_client.send(Item::Close);
                            // The client writer closes the connection once it gets there.
                            return std::future::pending().await;
                        }
                        Some(ReplyPlan::Merge { fields, request }) => {
                            merge_reply(&bytes, fields, &request).unwrap_or(bytes)
                        }
                    }
                }
            };
            if to_client.send(Item::send(due, bytes)).is_err() {
                return;
            }
        }
    }
}

/// Writes queued items in order, honouring their due time, blackholing and hanging.
async fn write(
    mut to: OwnedWriteHalf,
    mut items: mpsc::UnboundedReceiver<Item>,
    connection: Arc<Connection>,
    mut states: watch::Receiver<State>,
) {
    while let Some(item) = items.recv().await {
        let Item::Send {
            due,
            bytes,
            then_hang,
        } = item
        else {
            return;
        };
        tokio::time::sleep_until(due).await;
        if states
            .wait_for(|s| s.fault != Fault::Blackhole)
            .await
            .is_err()
        {
            return;
        }
        if then_hang {
            // Before writing: the reply must find the connection hung already.
            connection.hung.store(true, Ordering::SeqCst);
        } else if connection.is_hung() {
            continue;
        }
        if to.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

// ---- Wire messages ----

const HEADER_LEN: usize = 16;
/// Larger than any real message (the server's maxMessageSizeBytes is 48 MB): a header claiming
/// more is not MongoDB's.
const MAX_MESSAGE_LEN: usize = 64 * 1024 * 1024;
const OP_MSG: i32 = 2013;
const CHECKSUM_PRESENT: u32 = 1;
const MORE_TO_COME: u32 = 1 << 1;
/// The codes a MongoDB server labels `RetryableWriteError` on a retryable write.
const RETRYABLE_WRITE_CODES: [i32; 13] = [
    6, 7, 89, 91, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// Splits a byte stream into wire messages; partial messages wait for the rest. A length that
/// cannot be a MongoDB message switches to passing bytes through as they come.
#[derive(Default)]
struct Framer {
    buffer: Vec<u8>,
    raw: bool,
}

enum Frame {
    /// One whole message (at least a header).
    Message(Vec<u8>),
    /// Bytes that do not frame: forward as they are.
    Raw(Vec<u8>),
}

impl Framer {
    fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    fn next(&mut self) -> Option<Frame> {
        if self.buffer.is_empty() {
            return None;
        }
        if self.raw {
            return Some(Frame::Raw(std::mem::take(&mut self.buffer)));
        }
        let length = read_i32(&self.buffer, 0)?;
        match usize::try_from(length) {
            Ok(length) if (HEADER_LEN..=MAX_MESSAGE_LEN).contains(&length) => {
                if self.buffer.len() < length {
                    return None;
                }
                let rest = self.buffer.split_off(length);
                Some(Frame::Message(std::mem::replace(&mut self.buffer, rest)))
            }
            _ => {
                self.raw = true;
                Some(Frame::Raw(std::mem::take(&mut self.buffer)))
            }
        }
    }
}

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(i32::from_le_bytes(field.try_into().ok()?))
}

struct Header {
    request_id: i32,
    response_to: i32,
    op_code: i32,
}

/// The header of a framed message (at least `HEADER_LEN` bytes).
fn header(message: &[u8]) -> Header {
    Header {
        request_id: read_i32(message, 4).unwrap_or(0),
        response_to: read_i32(message, 8).unwrap_or(0),
        op_code: read_i32(message, 12).unwrap_or(0),
    }
}

/// The flag bits and body (the kind 0 section) of an OP_MSG; `None` for anything else or
/// anything malformed.
fn op_msg_body(message: &[u8]) -> Option<(u32, Document)> {
    if header(message).op_code != OP_MSG {
        return None;
    }
    let flags = u32::from_le_bytes(message.get(HEADER_LEN..HEADER_LEN + 4)?.try_into().ok()?);
    let end = if flags & CHECKSUM_PRESENT == 0 {
        message.len()
    } else {
        message.len().checked_sub(4)?
    };
    let mut at = HEADER_LEN + 4;
    while at < end {
        let kind = message[at];
        at += 1;
        // Both kinds start with an i32 size that counts itself.
        let size = usize::try_from(read_i32(message, at)?).ok()?;
        let section = message.get(at..at.checked_add(size)?.min(end))?;
        match kind {
            0 => {
                let mut reader = section;
                return Some((flags, Document::from_reader(&mut reader).ok()?));
            }
            1 => at = at.checked_add(size)?,
            _ => return None,
        }
    }
    None
}

/// A command as the rules see it.
struct Command {
    name: String,
    collection: Option<String>,
    body: Document,
    request_id: i32,
    more_to_come: bool,
}

fn parse_command(message: &[u8]) -> Option<Command> {
    let (flags, body) = op_msg_body(message)?;
    let (name, target) = body.iter().next()?;
    let collection = match target {
        Bson::String(collection) => Some(collection.clone()),
        _ => body.get_str("collection").ok().map(str::to_owned),
    };
    Some(Command {
        name: name.clone(),
        collection,
        request_id: header(message).request_id,
        more_to_come: flags & MORE_TO_COME != 0,
        body,
    })
}

/// The value at a dotted `path` in `body`.
fn field_at<'a>(body: &'a Document, path: &str) -> Option<&'a Bson> {
    let (first, rest) = path
        .split_once('.')
        .map_or((path, None), |(a, b)| (a, Some(b)));
    let value = body.get(first)?;
    match rest {
        None => Some(value),
        Some(rest) => field_at(value.as_document()?, rest),
    }
}

fn next_request_id() -> i32 {
    // Far from the driver's own counter, for readable traces.
    static NEXT: AtomicI32 = AtomicI32::new(1 << 30);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// An OP_MSG with one body section.
fn op_msg(request_id: i32, response_to: i32, flags: u32, body: &Document) -> Option<Vec<u8>> {
    let mut document = Vec::new();
    body.to_writer(&mut document).ok()?;
    let length = i32::try_from(HEADER_LEN + 4 + 1 + document.len()).ok()?;
    let mut message = Vec::with_capacity(HEADER_LEN + 5 + document.len());
    for field in [length, request_id, response_to, OP_MSG] {
        message.extend_from_slice(&field.to_le_bytes());
    }
    message.extend_from_slice(&flags.to_le_bytes());
    message.push(0);
    message.extend_from_slice(&document);
    Some(message)
}

/// The server's reply with `fields` merged into its body (`None` if it is not an OP_MSG).
fn merge_reply(reply: &[u8], fields: Document, request: &Document) -> Option<Vec<u8>> {
    let (flags, mut body) = op_msg_body(reply)?;
    body.extend(fields);
    label_as_the_server_would(request, &mut body);
    let header = header(reply);
    // Rebuilt without the checksum (the driver does not require one).
    op_msg(
        header.request_id,
        header.response_to,
        flags & !CHECKSUM_PRESENT,
        &body,
    )
}

/// Adds `errorLabels: ["RetryableWriteError"]` where a MongoDB 4.4+ server would: a retryable
/// error code in answer to a retryable write (`txnNumber` present, outside a transaction).
fn label_as_the_server_would(request: &Document, reply: &mut Document) {
    let retryable_write = request.contains_key("txnNumber") && !request.contains_key("autocommit");
    if !retryable_write || reply.contains_key("errorLabels") {
        return;
    }
    let code = |document: &Document| match document.get("code") {
        Some(Bson::Int32(code)) => Some(*code),
        Some(Bson::Int64(code)) => i32::try_from(*code).ok(),
        Some(Bson::Double(code)) => Some(*code as i32),
        _ => None,
    };
    let write_concern_code = reply.get_document("writeConcernError").ok().and_then(code);
    if code(reply)
        .or(write_concern_code)
        .is_some_and(|code| RETRYABLE_WRITE_CODES.contains(&code))
    {
        reply.insert("errorLabels", vec![Bson::from("RetryableWriteError")]);
    }
}

// ---- Clients ----

/// The address of a single-host MongoDB URI.
pub async fn address_of(uri: &str) -> SocketAddr {
    let options = ClientOptions::parse(uri).await.expect("valid MongoDB URI");
    let Some(ServerAddress::Tcp { host, port }) = options.hosts.first().cloned() else {
        panic!(
            "the fault proxy needs a single-host MongoDB URI, got {:?}",
            options.hosts
        );
    };
    tokio::net::lookup_host((host.as_str(), port.unwrap_or(27017)))
        .await
        .expect("resolve the MongoDB host")
        .next()
        .expect("an address for the MongoDB host")
}

/// The test server's address, from its URI (a single host).
pub async fn upstream_address() -> SocketAddr {
    address_of(&crate::server::uri()).await
}

/// A proxy to the test server and a client that connects through it (directly, no discovery),
/// with short timeouts so a refused server is noticed quickly.
pub async fn proxied_client() -> (FaultProxy, Client) {
    proxied_client_with(&crate::server::uri(), |_| {}).await
}

/// Like [`proxied_client`], to the server at `uri`, with client options changed by `configure`
/// (e.g. `retry_writes = Some(false)`).
pub async fn proxied_client_with(
    uri: &str,
    configure: impl FnOnce(&mut ClientOptions),
) -> (FaultProxy, Client) {
    let proxy = FaultProxy::start(address_of(uri).await).await;
    let client = client_through_with(&proxy, uri, configure).await;
    (proxy, client)
}

/// A client of the server at `uri` that connects through `proxy` (started on another runtime,
/// say, to outlive this one as a network outlives a process).
pub async fn client_through(proxy: &FaultProxy, uri: &str) -> Client {
    client_through_with(proxy, uri, |_| {}).await
}

async fn client_through_with(
    proxy: &FaultProxy,
    uri: &str,
    configure: impl FnOnce(&mut ClientOptions),
) -> Client {
    let mut options = ClientOptions::parse(uri).await.expect("valid MongoDB URI");
    options.hosts = vec![ServerAddress::Tcp {
        host: proxy.address().ip().to_string(),
        port: Some(proxy.address().port()),
    }];
    options.direct_connection = Some(true);
    options.repl_set_name = None;
    options.server_selection_timeout = Some(Duration::from_secs(5));
    options.connect_timeout = Some(Duration::from_secs(2));
    configure(&mut options);
    Client::with_options(options).expect("valid client options")
}
