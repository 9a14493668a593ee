"""Embedded MongoDB-compatible test server (mongoeco) for this crate's tests and examples.

Usage: python mongoeco_server.py [--port N] [--skewed-port-offset-ms N]
                                 [--transaction-lifetime-limit-seconds S]
                                 [--no-change-streams] [--change-stream-history N]

Prints the connection string on the first line of stdout once the server accepts connections,
then serves until its standard input reaches end-of-file (the parent process exited or closed
the pipe) or it receives SIGTERM/SIGINT. Tying its life to stdin means a crashed test binary
never leaves a server behind.

mongoeco 4.11.0 differs from a real server in ways the crate's code depends on; each shim below
makes it behave like MongoDB at the wire boundary or in its engine, using mongoeco's own
functions (see shared TEST-SERVER.md), and each but shim 4 (exercised by tests/suite/transactions.rs)
has a test of its own in tests/suite/infra_test_server.rs (shim 8: tests/suite/infra_change_streams.rs) that
cites the MongoDB manual page it imitates:

1. Int64 limit/skip/batchSize arguments decoded into plain integers.
2. Cursor ids encoded as Int64.
3. A transaction write conflict reported as WriteConflict (112), TransientTransactionError.
4. A new transaction on a session aborts the session's previous one.
5. An index key-pattern conflict reported as IndexOptionsConflict (85).
6. A write outside a transaction to a document an open transaction has written waits until the
   transaction ends or the write's maxTimeMS runs out; transactions end at their lifetime limit.
7. The server clock can be stepped forward and back at run time (command mongoecoStepClock).
8. Change streams (`watch()`) as on a replica set: `$changeStream` aggregations, awaiting getMores,
   resume tokens over a bounded history, and a command (mongoecoKillChangeStreams) that makes
   every open stream's next getMore fail with CursorNotFound. Its tests are in
   tests/suite/infra_change_streams.rs. With --no-change-streams, `$changeStream` is refused (40573) as
   by a standalone mongod; --change-stream-history N bounds the history (default 5000 events).
9. A `$cond` branch naming a missing field yields a missing value, which `$set`/`$addFields`/
   `$project` leave out (mongoeco stored null).
10. An upsert whose query predicate holds `$expr` is refused (224, QueryFeatureNotAllowed), as
   MongoDB refuses it: a `findAndModify` as a command error, an `update` statement as a write
   error (mongoeco ran them).

With --skewed-port-offset-ms N it also opens a second port on the same in-memory data whose clock
is N milliseconds ahead (behind, if negative): a second router with a skewed clock. Its URI is the
second line of stdout. See serve() below; tests/suite/fault_clock_skew.rs uses it.
"""

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import datetime
import itertools
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time

from mongoeco.api import AsyncCollection, AsyncMongoClient
from mongoeco.api._async._collection_runtime import CollectionRuntimeCoordinator
from mongoeco.change_streams import ChangeStreamHub
from mongoeco.core.aggregation import apply_pipeline
from mongoeco.core.bson_scalars import BsonInt64, utc_bson_now
from mongoeco.engines.memory import MemoryEngine
from mongoeco.errors import OperationFailure
from mongoeco.types import Timestamp
from mongoeco.wire import proxy as wire_proxy
from mongoeco.wire import sessions as wire_sessions
from mongoeco.wire.executor import WireCommandExecutor

# Shim 1: the Rust driver sends limit/skip/batchSize (and cursor ids, in getMore and killCursors)
# as Int64; mongoeco decodes them into its BsonInt64 wrapper, which its own validation then
# rejects. Turn them into plain ints.
_INTEGER_ARGUMENTS = ("limit", "skip", "batchSize", "maxTimeMS", "getMore")
_original_decode_op_msg = wire_proxy.decode_op_msg


def _plain_integers(document):
    if not isinstance(document, dict):
        return
    for key in _INTEGER_ARGUMENTS:
        if isinstance(document.get(key), BsonInt64):
            document[key] = document[key].value
    _plain_integers(document.get("cursor"))
    if isinstance(document.get("cursors"), list):
        document["cursors"] = [
            cursor.value if isinstance(cursor, BsonInt64) else cursor
            for cursor in document["cursors"]
        ]


def _decode_op_msg(header, payload):
    request = _original_decode_op_msg(header, payload)
    _plain_integers(request.body)
    return request


# Shim 2: mongoeco encodes cursor ids as Int32 when they fit; the Rust driver requires Int64.
_original_encode_op_msg_response = wire_proxy.encode_op_msg_response


def _encode_op_msg_response(document, *args, **kwargs):
    cursor = document.get("cursor") if isinstance(document, dict) else None
    if isinstance(cursor, dict) and isinstance(cursor.get("id"), int):
        cursor["id"] = BsonInt64(cursor["id"])
    _error_code_as_a_server_reports_it(document)
    return _original_encode_op_msg_response(document, *args, **kwargs)


# Shims 3 and 5: errors mongoeco sends without a code, which the driver cannot read, get the code
# (and labels) a real server sends.
# - Shim 3: mongoeco refuses to commit a transaction when anything at all was written since the
#   transaction began. A real server reports a write conflict as WriteConflict (112) labelled
#   TransientTransactionError, which tells the client to run the transaction again.
# - Shim 5: creating an index on a key pattern that another index (of another name or options)
#   already has. A real server reports IndexOptionsConflict (85).
_CODELESS_ERRORS = [
    # (errmsg prefix, code, codeName, errorLabels)
    ("Write conflict", 112, "WriteConflict", ["TransientTransactionError"]),
    ("Conflicting index definition", 85, "IndexOptionsConflict", None),
    ("Transaction has been aborted", 251, "NoSuchTransaction", ["TransientTransactionError"]),
]


def _error_code_as_a_server_reports_it(document):
    if not (isinstance(document, dict) and document.get("ok") in (0, 0.0)):
        return
    if "code" in document:
        return
    message = str(document.get("errmsg", ""))
    for prefix, code, code_name, labels in _CODELESS_ERRORS:
        if message.startswith(prefix):
            document["code"] = code
            document["codeName"] = code_name
            if labels:
                document["errorLabels"] = labels
            return


wire_proxy.decode_op_msg = _decode_op_msg
wire_proxy.encode_op_msg_response = _encode_op_msg_response


# Shim 4: a command with startTransaction begins a new transaction (the driver gives it a higher
# txnNumber), and a real server aborts whatever transaction the session still had open: one whose
# commit failed, or whose commit never reached the server. mongoeco ignores startTransaction while
# the session's old transaction is active and carries on with its snapshot and pending writes;
# abort the old one first.
_original_apply_transaction_metadata = wire_sessions.WireSessionStore._apply_transaction_metadata


def _apply_transaction_metadata(session, body):
    if body.get("startTransaction") is True and session.transaction_active:
        session.abort_transaction()
    elif body.get("autocommit") is False:
        _refuse_statements_of_a_transaction_the_server_aborted(session)
    return _original_apply_transaction_metadata(session, body)


wire_sessions.WireSessionStore._apply_transaction_metadata = staticmethod(
    _apply_transaction_metadata
)


# Shim 6: a write outside a transaction to a document that an open transaction has written waits
# until that transaction ends (commit or abort), or fails with MaxTimeMSExpired (50) once its
# maxTimeMS runs out, as on MongoDB ("In-progress Transactions and Write Conflicts" in the
# manual's "Production Considerations" for transactions). mongoeco would instead apply the write
# at once and refuse the transaction's commit. The waiting write keeps the `$$NOW` it was given
# when it arrived, as on MongoDB (the variable is fixed for the whole command). A transaction
# open longer than transactionLifetimeLimitSeconds (60 s by default) is aborted, as the server's
# periodic job does, so a write cannot wait forever behind a forgotten transaction.
TRANSACTION_LIFETIME_LIMIT_SECONDS = 60.0  # --transaction-lifetime-limit-seconds
_open_transactions = {}  # session_id -> (session, monotonic start)
_aborted_by_the_server = set()  # session ids whose transaction the lifetime limit ended
_original_start_session_transaction = MemoryEngine._start_session_transaction


def _start_session_transaction(self, session):
    _original_start_session_transaction(self, session)
    _aborted_by_the_server.discard(session.session_id)
    _open_transactions[session.session_id] = (session, time.monotonic())


MemoryEngine._start_session_transaction = _start_session_transaction


def _end_transactions_past_their_lifetime():
    now = time.monotonic()
    for session_id, (session, started) in list(_open_transactions.items()):
        if not session.transaction_active:
            _open_transactions.pop(session_id, None)
        elif now - started > TRANSACTION_LIFETIME_LIMIT_SECONDS:
            session.abort_transaction()
            _open_transactions.pop(session_id, None)
            _aborted_by_the_server.add(session_id)


# A statement of a transaction the server aborted (autocommit: false, no startTransaction) fails
# with NoSuchTransaction (251, labelled TransientTransactionError), as on MongoDB; mongoeco would
# run it outside any transaction, applying its write at once.
def _refuse_statements_of_a_transaction_the_server_aborted(session):
    _end_transactions_past_their_lifetime()
    if session.session_id in _aborted_by_the_server:
        raise OperationFailure(
            "Transaction has been aborted by the server: it outlived its lifetime limit"
        )


# Committing a transaction the server aborted fails the same way; mongoeco would answer ok.
_original_commit_transaction = wire_sessions.WireSessionStore.commit_transaction


def _commit_transaction(self, body):
    session = self._require_session(body)
    _end_transactions_past_their_lifetime()
    if session.session_id in _aborted_by_the_server:
        _aborted_by_the_server.discard(session.session_id)
        raise OperationFailure("Transaction has been aborted by the server: it outlived its lifetime limit")
    return _original_commit_transaction(self, body)


wire_sessions.WireSessionStore.commit_transaction = _commit_transaction


def _written_by_open_transactions(engine, db_name, coll_name, own_session):
    """The _ids of the documents of one collection that open transactions have written."""
    own = getattr(own_session, "session_id", None)
    written = []
    for session_id, state in list(engine._mvcc_states.items()):
        if session_id == own:
            continue
        for change in state.pending_changes:
            if (
                isinstance(change, dict)
                and change.get("db_name") == db_name
                and change.get("coll_name") == coll_name
            ):
                written.append(change.get("document_key", {}).get("_id"))
    return written


def _write_filters(context):
    """The filters of a write command's statements, or None for a command that is not a write."""
    body = context.command_document
    name = context.command_name.lower()
    if name == "update":
        return [statement.get("q") or {} for statement in body.get("updates") or []]
    if name == "delete":
        return [statement.get("q") or {} for statement in body.get("deletes") or []]
    if name == "findandmodify":
        return [body.get("query") or {}]
    if name == "insert":
        return [{"_id": document.get("_id")} for document in body.get("documents") or []]
    return None


async def _documents_held_back(client, context, filters):
    """The _ids of the documents that open transactions have written and that the write's
    statements match, read once when the write arrives: its `$$NOW` stays fixed while it waits,
    so the documents it matched then are the ones it waits for, as on MongoDB."""
    collection = client[context.db_name][context.command_document[context.command_name]]
    written = _written_by_open_transactions(
        client._engine, context.db_name, collection.name, context.session
    )
    if not written:
        return set()
    held_back = set()
    for statement_filter in filters:
        matched = collection.find(
            {"$and": [statement_filter, {"_id": {"$in": written}}]}, {"_id": 1}
        )
        held_back.update(repr(document["_id"]) for document in await matched.to_list(None))
    return held_back


def _still_written(client, context, held_back):
    collection_name = context.command_document[context.command_name]
    written = _written_by_open_transactions(
        client._engine, context.db_name, collection_name, context.session
    )
    return any(repr(document_id) in held_back for document_id in written)


_original_execute_prepared = WireCommandExecutor.execute_prepared


async def _execute_prepared(self, context):
    filters = _write_filters(context)
    in_transaction = context.session is not None and context.session.in_transaction
    if filters and not in_transaction:
        max_time_ms = context.raw_body.get("maxTimeMS")
        give_up = None if not max_time_ms else time.monotonic() + max_time_ms / 1000
        _end_transactions_past_their_lifetime()
        held_back = await _documents_held_back(self._client, context, filters)
        while held_back:
            _end_transactions_past_their_lifetime()
            if not _still_written(self._client, context, held_back):
                break
            if give_up is not None and time.monotonic() >= give_up:
                return {
                    "ok": 0.0,
                    "errmsg": "operation exceeded time limit",
                    "code": 50,
                    "codeName": "MaxTimeMSExpired",
                }
            await asyncio.sleep(0.005)
    return await _original_execute_prepared(self, context)


WireCommandExecutor.execute_prepared = _execute_prepared


# Shim 7: the server's clock can be stepped at run time, as an NTP step or a resumed virtual
# machine steps a real server's system clock: `{mongoecoStepClock: <ms>}` (negative: back) moves
# every clock this server reads (`$$NOW` on every port, `$currentDate`, the TTL deletion) by that
# much from then on, and answers `{ok: 1, offsetMs: <total step>}`. On MongoDB `$$NOW` and the
# TTL monitor both read the server's system clock ("$$NOW" in the manual's "Variables in
# Aggregation Expressions"; "TTL Indexes"), so a step moves both.
CLOCK_STEP_COMMAND = "mongoecoStepClock"
_clock_step = datetime.timedelta(0)


def stepped_now():
    """The server's clock: the real one plus every step so far."""
    return utc_bson_now() + _clock_step


def _step_clock(body):
    global _clock_step
    step = body.get(CLOCK_STEP_COMMAND)
    step = step.value if isinstance(step, BsonInt64) else step
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return {
            "ok": 0.0,
            "errmsg": f"{CLOCK_STEP_COMMAND} takes a number of milliseconds",
            "code": 14,
            "codeName": "TypeMismatch",
        }
    _clock_step += datetime.timedelta(milliseconds=step)
    return {"ok": 1.0, "offsetMs": int(_clock_step / datetime.timedelta(milliseconds=1))}


_original_dispatch_wire_request = wire_proxy.AsyncMongoEcoProxyServer._dispatch_wire_request


# Shim 10: MongoDB refuses `$expr` anywhere in the query predicate of an upsert, before it
# looks at any document (manual: `db.collection.updateOne()` and `findAndModify`, "Upsert":
# DOCS-14158; SERVER-59704 asks to allow it); mongoeco evaluated it.
_UPSERT_EXPR_MESSAGE = "$expr is not allowed in the query predicate for an upsert"
_QUERY_FEATURE_NOT_ALLOWED = 224


def _holds_expr(predicate):
    if isinstance(predicate, dict):
        return any(key == "$expr" or _holds_expr(value) for key, value in predicate.items())
    if isinstance(predicate, list):
        return any(_holds_expr(item) for item in predicate)
    return False


def _refused_upsert(body):
    """The reply MongoDB gives an upsert with `$expr` in its query, or None for any other
    command. An `update` command is refused only when it is one statement (the crate's): of
    several, MongoDB would still apply those before the refused one."""
    command = next(iter(body), "").lower()
    if command == "findandmodify":
        if body.get("upsert") and _holds_expr(body.get("query") or {}):
            return {
                "ok": 0.0,
                "errmsg": _UPSERT_EXPR_MESSAGE,
                "code": _QUERY_FEATURE_NOT_ALLOWED,
                "codeName": "QueryFeatureNotAllowed",
            }
    elif command == "update":
        updates = body.get("updates") or []
        if len(updates) == 1 and updates[0].get("upsert") and _holds_expr(updates[0].get("q") or {}):
            return {
                "ok": 1.0,
                "n": 0,
                "nModified": 0,
                "writeErrors": [
                    {"index": 0, "code": _QUERY_FEATURE_NOT_ALLOWED, "errmsg": _UPSERT_EXPR_MESSAGE}
                ],
            }
    return None


async def _dispatch_wire_request(self, header, payload, *, connection):
    if header.op_code == wire_proxy.OP_MSG and b"$expr" in payload and b"upsert" in payload:
        refused = _refused_upsert(wire_proxy.decode_op_msg(header, payload).body or {})
        if refused is not None:
            return wire_proxy.encode_op_msg_response(
                refused,
                request_id=next(self._request_ids),
                response_to=header.request_id,
            )
    # A cheap byte check first: only the control command pays for a second decoding.
    if header.op_code == wire_proxy.OP_MSG and CLOCK_STEP_COMMAND.encode() in payload:
        body = wire_proxy.decode_op_msg(header, payload).body
        if isinstance(body, dict) and next(iter(body), None) == CLOCK_STEP_COMMAND:
            return wire_proxy.encode_op_msg_response(
                _step_clock(body),
                request_id=next(self._request_ids),
                response_to=header.request_id,
            )
    return await _original_dispatch_wire_request(self, header, payload, connection=connection)


wire_proxy.AsyncMongoEcoProxyServer._dispatch_wire_request = _dispatch_wire_request

# TTL deletion follows the data-bearing server's clock: the stepped one (mongoeco would judge it
# by the accessing operation's clock on some paths and by the unstepped real clock on others).
# A skewed port's shift is a router's, and does not move it either (see below).
_original_purge = MemoryEngine._purge_expired_documents_locked


def _purge_by_the_servers_clock(self, *args, now, **kwargs):
    del now
    return _original_purge(self, *args, now=stepped_now().replace(tzinfo=datetime.UTC), **kwargs)


MemoryEngine._purge_expired_documents_locked = _purge_by_the_servers_clock


# Shim 9: a `$cond` whose chosen branch names a missing field yields a missing value, and a
# `$set`/`$addFields`/`$project` field whose expression is missing is left out, as on MongoDB
# (manual: "$project (aggregation)", "Conditionally Exclude Fields": documents without
# `author.middle` come out without it). mongoeco evaluates the branch to null and stores
# `field: null`, so an update pipeline that writes a field back unchanged
# (`{$cond: [free, <new>, "$field"]}`) would add it, null, to every document that lacked it.
from mongoeco.core.aggregation import runtime as _aggregation_runtime  # noqa: E402
from mongoeco.core.aggregation import runtime_state as _aggregation_runtime_state  # noqa: E402
from mongoeco.core.aggregation import transform_stages as _aggregation_transform  # noqa: E402

_evaluate_with_missing = _aggregation_runtime._evaluate_expression_with_missing


def _evaluate_with_missing_through_cond(document, expression, variables=None, **kwargs):
    if isinstance(expression, dict) and len(expression) == 1 and "$cond" in expression:
        spec = expression["$cond"]
        if isinstance(spec, list) and len(spec) == 3:
            condition, when_true, when_false = spec
        elif isinstance(spec, dict) and set(spec) == {"if", "then", "else"}:
            condition, when_true, when_false = spec["if"], spec["then"], spec["else"]
        else:
            return _evaluate_with_missing(document, expression, variables, **kwargs)
        # mongoeco's own truthiness, through its own `$cond`.
        chosen = _evaluate_with_missing(document, {"$cond": [condition, True, False]}, variables, **kwargs)
        branch = when_true if chosen else when_false
        return _evaluate_with_missing_through_cond(document, branch, variables, **kwargs)
    return _evaluate_with_missing(document, expression, variables, **kwargs)


for _module in (_aggregation_runtime, _aggregation_runtime_state, _aggregation_transform):
    _module._evaluate_expression_with_missing = _evaluate_with_missing_through_cond


# Shim 8: change streams, as on a replica set (manual: "Change Streams", "Change Events", "Resume a
# Change Stream"). mongoeco captures every committed write in process and hands it to its client's
# change hub (a transaction's writes when it commits); over the wire it refuses `$changeStream`.
# Here one hub, shared by every port, keeps those events in a bounded history (the oplog's part),
# and the wire commands are answered from it:
# - `aggregate` whose first stage is `$changeStream` (options fullDocument "default",
#   "updateLookup" or "whenAvailable", resumeAfter, startAfter, startAtOperationTime,
#   allChangesForCluster), followed by $match/$project/$addFields/$set/$unset/$replaceRoot/
#   $replaceWith stages, on a collection, a database (`aggregate: 1`) or the cluster, opens a
#   tailable-await cursor: Int64 id, firstBatch, postBatchResumeToken.
# - `getMore` on it returns the events that arrived (at most batchSize), waiting up to its
#   maxTimeMS (1 s by default, as awaitData cursors) for one; `killCursors` ends it.
# - Events: _id (the resume token), operationType (insert, update, replace, delete; drop then
#   invalidate when a watched collection is dropped, which closes the cursor), clusterTime (a
#   Timestamp, shared by a transaction's events, which also carry lsid and txnNumber), wallTime,
#   ns, documentKey, fullDocument (inserts and replacements; updates with updateLookup: the
#   document as it is when the event is read, null if gone), updateDescription for updates
#   (updatedFields, removedFields, truncatedArrays: the difference between the document before
#   and after, which is also what MongoDB logs for pipeline updates).
# - Resume token `{_data: "82" + clusterTime (16 hex digits) + event number (16) + flag (2: 01
#   for an invalidate)}`: hex like MongoDB's, starting like them with the event's time. A token
#   older than the history (the first stream of the server starts it; it keeps the last
#   --change-stream-history events) gives ChangeStreamHistoryLost (286), a token of no retained
#   event ChangeStreamFatalError (280), resumeAfter an invalidate InvalidResumeToken (260).
# - `{mongoecoKillChangeStreams: 1}` ends every open change-stream cursor as killCursors from
#   another client would: the next getMore of each (and one waiting) fails with CursorNotFound
#   (43), which drivers resume from by its code alone (change streams spec, "Resumable Error").
# - With --no-change-streams, `$changeStream` is refused as a standalone mongod refuses it (40573).
# Nothing is recorded before the first stream opens (mongoeco then only counts gaps), so the shim
# costs nothing to a server that never opens one; from then on the history is kept even with no
# stream open, as an oplog is, so that a stream resumed later loses nothing. Not imitated: rename
# events, dropDatabase events (a dropped database's collections each yield a drop, but a stream on
# the database gets no dropDatabase and no invalidate), delete events of TTL deletions, pre- and
# post-images, expanded events; see RELIABILITY.md.
CHANGE_STREAMS = True  # --no-change-streams
CHANGE_STREAM_HISTORY = 5_000  # --change-stream-history
KILL_CHANGE_STREAMS_COMMAND = "mongoecoKillChangeStreams"
_CURSOR_IDLE_SECONDS = 600  # cursorTimeoutMillis: idle cursors are ended after 10 minutes
_ALLOWED_STAGES = frozenset(
    ("$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith")
)


@dataclasses.dataclass(slots=True)
class _Change:
    """One entry of the history: a committed write, numbered from 1 in commit order."""

    seq: int
    cluster_time: Timestamp
    wall_time: datetime.datetime
    operation_type: str  # insert, update, replace, delete, drop
    db: str
    coll: str
    document_key: dict | None
    full_document: dict | None
    update_description: dict | None
    transaction: dict | None  # {lsid, txnNumber} for a transaction's writes


@dataclasses.dataclass(slots=True)
class _Stream:
    """An open change-stream cursor: where it stands in the history and what it shows."""

    ns: str
    db: str | None  # None: the whole cluster
    coll: str | None  # None: the whole database
    pipeline: list | None
    full_document: str
    position: int  # the number of the last history entry it has read
    not_before: Timestamp | None = None  # startAtOperationTime
    invalidate_next: bool = False
    ended: bool = False  # invalidated: the cursor closes with this batch
    killed: bool = False  # by mongoecoKillChangeStreams
    used: float = dataclasses.field(default_factory=time.monotonic)


_history: list[_Change] = []
_history_start: tuple | None = None  # (time, inc) when recording began; None: not recording
_last_seq = 0
_last_cluster_time = (0, 0)
_committing: dict | None = None  # the transaction being committed: {lsid, txnNumber, ts}
_streams: dict[int, _Stream] = {}
_FIRST_CURSOR_ID = 1 << 48  # apart from mongoeco's own cursor ids (1, 2, ...)
_cursor_ids = itertools.count(_FIRST_CURSOR_ID)
_arrived: asyncio.Event | None = None  # set when an entry arrives, for getMores waiting


class _Refused(Exception):
    def __init__(self, code, code_name, message):
        super().__init__(message)
        self.reply = {"ok": 0.0, "errmsg": message, "code": code, "codeName": code_name}


def _next_cluster_time():
    """A new cluster time, after every earlier one, from the server's (stepped) clock."""
    global _last_cluster_time
    seconds = int(stepped_now().replace(tzinfo=datetime.UTC).timestamp())
    last_seconds, last_inc = _last_cluster_time
    _last_cluster_time = (seconds, 1) if seconds > last_seconds else (last_seconds, last_inc + 1)
    return _last_cluster_time


def _record(operation_type, db, coll, document_key, full_document, update_description):
    global _last_seq, _arrived
    if _committing is not None:  # one cluster time for all the writes of a transaction
        _committing["ts"] = _committing["ts"] or _next_cluster_time()
        cluster_time = _committing["ts"]
        transaction = {"lsid": _committing["lsid"], "txnNumber": _committing["txnNumber"]}
    else:
        cluster_time, transaction = _next_cluster_time(), None
    _last_seq += 1
    _history.append(
        _Change(
            _last_seq, Timestamp(*cluster_time), stepped_now(), operation_type, db, coll,
            document_key, full_document, update_description, transaction,
        )
    )
    if len(_history) > CHANGE_STREAM_HISTORY + CHANGE_STREAM_HISTORY // 8:  # trimmed in steps
        del _history[: len(_history) - CHANGE_STREAM_HISTORY]
    # mongoeco runs every command on the event loop's thread, so the waiters can be woken here.
    if _arrived is not None:
        _arrived.set()
        _arrived = None


class _ChangeHistoryHub(ChangeStreamHub):
    """The change hub of every port's client: what they commit goes into the history."""

    def should_publish_events(self):
        # False: mongoeco records only a gap per write, without copying any document.
        return _history_start is not None and super().should_publish_events()

    def publish(self, *, operation_type, db_name, coll_name, document_key, **kwargs):
        if _history_start is not None:
            _record(
                operation_type, db_name, coll_name, document_key,
                kwargs.get("full_document"), kwargs.get("update_description"),
            )
        super().publish(  # keeps the hub's own numbering (it retains one event)
            operation_type=operation_type,
            db_name=db_name,
            coll_name=coll_name,
            document_key=document_key,
            **kwargs,
        )


CHANGE_HUB = _ChangeHistoryHub(max_retained_events=1)
CHANGE_HUB.register_watcher()  # always "watched"; should_publish_events decides

# A dropped collection. mongoeco numbers the writes it hands the hub by its engine's commit
# sequence, and skips any whose number the hub has counted already; but it announces a drop (as
# an "invalidate") to the hub directly, outside that sequence, which puts the hub's count one
# ahead: the next write after every drop was skipped, lost to every stream. So the drop's own
# announcement is left out, and the drop is recorded here, only when the collection existed (a
# drop of a missing one writes no oplog entry on MongoDB).
_publish_without_drops = CollectionRuntimeCoordinator.publish_change_event


def _publish_change_event_but_drops(self, *, operation_type, **kwargs):
    if operation_type == "invalidate" and self._collection._change_hub is CHANGE_HUB:
        return
    _publish_without_drops(self, operation_type=operation_type, **kwargs)


CollectionRuntimeCoordinator.publish_change_event = _publish_change_event_but_drops
_drop_without_its_event = AsyncCollection.drop


async def _drop_with_its_event(self, *, session=None):
    names = await self._engine.list_collections(self._db_name, context=session)
    await _drop_without_its_event(self, session=session)
    if _history_start is not None and self._collection_name in names:
        _record("drop", self._db_name, self._collection_name, None, None, None)


AsyncCollection.drop = _drop_with_its_event

# A transaction's writes reach the hub during its commit: they get its lsid, txnNumber and one
# cluster time, as the entries of its commit's applyOps have on MongoDB.
_commit_without_change_events = wire_sessions.WireSessionStore.commit_transaction


def _commit_transaction_with_its_change_events(self, body):
    global _committing
    _committing = {"lsid": body.get("lsid"), "txnNumber": body.get("txnNumber"), "ts": None}
    try:
        return _commit_without_change_events(self, body)
    finally:
        _committing = None


wire_sessions.WireSessionStore.commit_transaction = _commit_transaction_with_its_change_events

# updateDescription: mongoeco hands the hub an update's new document only. Its update path builds
# the change from a local `original_document` (the document before the update); read it there.
_change_payload_without_description = MemoryEngine._change_payload


def _change_payload_with_description(**kwargs):
    payload = _change_payload_without_description(**kwargs)
    if _history_start is not None and kwargs.get("operation_type") == "update":
        caller = sys._getframe(1).f_locals
        before = caller.get("original_document")
        after = payload.get("full_document")
        if isinstance(before, dict) and isinstance(after, dict):
            pipeline = isinstance(getattr(caller.get("operation"), "update_spec", None), list)
            describe = _pipeline_update_description if pipeline else _update_description
            payload["update_description"] = describe(before, after)
    return payload


MemoryEngine._change_payload = staticmethod(_change_payload_with_description)


def _same(left, right):
    """Equal as BSON values: same types, same field order."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return list(left) == list(right) and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(_same, left, right))
    return left == right


def _update_description(before, after):
    """What changed, as MongoDB's delta oplog entries report it: changed fields by dotted path
    (into subdocuments and arrays), removed fields, and arrays cut to a new size."""
    updated, removed, truncated = {}, [], []

    def compare(old, new, path):
        if isinstance(old, dict) and isinstance(new, dict):
            if [k for k in new if k in old] != [k for k in old if k in new]:
                updated[path] = new  # fields reordered: the whole subdocument
                return
            diff(old, new, path + ".")
        elif isinstance(old, list) and isinstance(new, list):
            if len(new) < len(old):
                truncated.append({"field": path, "newSize": len(new)})
            for index, item in enumerate(new):
                if index >= len(old):
                    updated[f"{path}.{index}"] = item
                elif not _same(old[index], item):
                    compare(old[index], item, f"{path}.{index}")
        else:
            updated[path] = new

    def diff(old, new, prefix):
        for key, value in new.items():
            if key not in old:
                updated[prefix + key] = value
            elif not _same(old[key], value):
                compare(old[key], value, prefix + key)
        removed.extend(prefix + key for key in old if key not in new)

    diff(before, after, "")
    updated.pop("_id", None)
    return {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}


# A pipeline update's change, as MongoDB 5.0 and later log it (server source:
# src/mongo/db/update/document_diff_calculator.cpp, document_diff_serialization.cpp): the two
# documents are walked field by field in order; a subdocument or array that changed is described
# by its own difference, unless that difference (by the server's estimate of its BSON size) would
# be no smaller than the new value: then the whole field is logged as updated. So a writer ended
# by `writer: {fencingToken}` shows as `updatedFields.writer`, not as removed `writer.id`.
# (Modifier updates are logged by what they modify, which `_update_description` approximates.
# Not imitated: a top-level difference no smaller than the document, which the server logs as a
# replacement.)
def _value_size(value):
    """The size of a BSON value (without its type byte and name), as the server counts it."""
    if isinstance(value, dict):
        return 5 + sum(2 + len(str(key).encode()) + _value_size(item) for key, item in value.items())
    if isinstance(value, list):
        return _value_size({str(index): item for index, item in enumerate(value)})
    if isinstance(value, str):
        return 5 + len(value.encode())
    if isinstance(value, bool):
        return 1
    if value is None:
        return 0
    if isinstance(value, int):
        return 4 if -(2**31) <= value < 2**31 else 8
    if type(value).__name__ in ("BsonInt32",):
        return 4
    if type(value).__name__ in ("ObjectId",):
        return 12
    if type(value).__name__ in ("BsonDecimal128", "Decimal128", "Decimal"):
        return 16
    if isinstance(value, (bytes, bytearray)):
        return 5 + len(value)
    return 8  # dates, doubles, Int64, timestamps


class _DiffNode:
    """A node of the difference: a document's (u, i, d, s) or an array's (u, s, l)."""

    def __init__(self, array):
        self.array = array
        self.size = 9 if array else 5
        self.updates, self.inserts, self.deletes, self.subs = {}, {}, [], {}
        self.resize = None

    def add(self, kind, field, value=None):
        child = value.size if kind == "sub" else 1 if kind == "delete" else _value_size(value)
        name = 1 + len(str(field)) if self.array else len(field.encode())
        self.size += name + 2 + child
        if kind == "sub":
            self.size += 0 if self.array else 1
            self.subs[field] = value
            return
        section = {"update": self.updates, "insert": self.inserts, "delete": None}[kind]
        if not self.array and not (self.deletes if kind == "delete" else section):
            self.size += 8
        if kind == "delete":
            self.deletes.append(field)
        else:
            section[field] = value


def _sub_diff(old, new):
    """The difference of two subdocuments or two arrays, or None when it is no smaller than
    `new` (the field is then logged whole)."""
    node = _array_diff(old, new) if isinstance(new, list) else _doc_diff(old, new, limited=True)
    return node if node is not None and _value_size(new) > node.size else None


def _changed(node, key, old, new):
    if type(old) is type(new) and isinstance(new, (dict, list)):
        sub = _sub_diff(old, new)
        if sub is not None:
            node.add("sub", key, sub)
            return
    node.add("update", key, new)


def _doc_diff(old, new, limited):
    node = _DiffNode(array=False)
    new_size = _value_size(new)
    old_items, new_items = list(old.items()), list(new.items())
    i = j = 0
    deletes = []
    while i < len(old_items) and j < len(new_items):
        if limited and new_size < node.size:
            return None
        (old_key, old_value), (new_key, new_value) = old_items[i], new_items[j]
        if old_key == new_key:
            if not _same(old_value, new_value):
                _changed(node, old_key, old_value, new_value)
            i, j = i + 1, j + 1
        else:
            deletes.append(old_key)
            i += 1
    for old_key, _ in old_items[i:]:
        node.add("delete", old_key)
    for new_key, new_value in new_items[j:]:
        node.add("insert", new_key, new_value)
        if new_key in deletes:
            deletes.remove(new_key)
    for old_key in deletes:
        node.add("delete", old_key)
    return node


def _array_diff(old, new):
    node = _DiffNode(array=True)
    new_size = _value_size(new)
    for index, (old_value, new_value) in enumerate(zip(old, new)):
        if new_size < node.size:
            return None
        if not _same(old_value, new_value):
            _changed(node, index, old_value, new_value)
    for index in range(len(old), len(new)):
        node.add("update", index, new[index])
    if len(old) > len(new):
        node.resize = len(new)
        node.size += 7
    return node


def _pipeline_update_description(before, after):
    updated, removed, truncated = {}, [], []

    def flatten(node, path):
        prefix = f"{path}." if path else ""
        for field, value in {**node.updates, **node.inserts}.items():
            updated[f"{prefix}{field}"] = value
        removed.extend(f"{prefix}{field}" for field in node.deletes)
        for field, child in node.subs.items():
            flatten(child, f"{prefix}{field}")
        if node.resize is not None:
            truncated.append({"field": path, "newSize": node.resize})

    flatten(_doc_diff(before, after, limited=False), "")
    updated.pop("_id", None)
    return {"updatedFields": updated, "removedFields": removed, "truncatedArrays": truncated}


def _token(cluster_time, seq, invalidate=False):
    data = f"82{cluster_time.time:08X}{cluster_time.inc:08X}{seq:016X}{int(invalidate):02X}"
    return {"_data": data}


def _entry(seq):
    """The history entry numbered `seq`, or None once trimmed or not yet there."""
    index = seq - _history[0].seq if _history else -1
    return _history[index] if 0 <= index < len(_history) else None


def _position_token(stream):
    """postBatchResumeToken: resuming from it continues after the stream's position."""
    entry = _entry(stream.position)
    if entry is None:  # nothing read yet, or read past what was trimmed
        return _token(Timestamp(*_history_start), stream.position)
    return _token(entry.cluster_time, entry.seq, stream.ended)


def _history_lost():
    return _Refused(
        286,
        "ChangeStreamHistoryLost",
        "Resume of change stream was not possible, as the resume point may no longer be in the "
        "oplog.",
    )


def _resume_position(token, start_after, stream):
    """Sets where a stream resumed with `token` (resumeAfter or startAfter) starts."""
    data = token.get("_data") if isinstance(token, dict) else None
    if not (isinstance(data, str) and len(data) == 36 and data.startswith("82")):
        raise _Refused(2, "BadValue", f"Bad resume token: {token!r}")
    try:
        cluster_time = (int(data[2:10], 16), int(data[10:18], 16))
        seq, invalidate = int(data[18:34], 16), data[34:] == "01"
    except ValueError:
        raise _Refused(2, "BadValue", f"Bad resume token: {token!r}") from None
    if invalidate and not start_after:
        raise _Refused(
            260,
            "InvalidResumeToken",
            "Attempting to resume a change stream using 'resumeAfter' is not allowed from an "
            "invalidate notification.",
        )
    first = _history[0].seq if _history else _last_seq + 1
    if cluster_time < _history_start or seq < first - 1:
        raise _history_lost()
    entry = _entry(seq)
    if seq > _last_seq or (entry is not None and entry.cluster_time != Timestamp(*cluster_time)):
        raise _Refused(
            280, "ChangeStreamFatalError", "cannot resume stream; the resume token was not found."
        )
    stream.position = seq
    # Resumed at a drop of its own collection: the invalidate that followed it comes next.
    stream.invalidate_next = (
        not invalidate
        and entry is not None
        and entry.operation_type == "drop"
        and _shows(stream, entry)
        and stream.coll is not None
    )


def _shows(stream, entry):
    if stream.db is None:
        return entry.db not in ("admin", "config", "local")
    return entry.db == stream.db and (stream.coll is None or entry.coll == stream.coll)


async def _event(client, stream, entry):
    """The change event of `entry`, as `stream` shows it (before its own pipeline)."""
    event = {
        "_id": _token(entry.cluster_time, entry.seq),
        "operationType": entry.operation_type,
        "clusterTime": entry.cluster_time,
        "wallTime": entry.wall_time,
    }
    full_document = entry.full_document
    if entry.operation_type == "update":
        full_document = None
        if stream.full_document == "updateLookup":
            lookup = client.get_database(entry.db).get_collection(entry.coll)
            full_document = await lookup.find_one(entry.document_key)
        if stream.full_document in ("updateLookup", "whenAvailable"):
            event["fullDocument"] = full_document
    elif full_document is not None:
        event["fullDocument"] = full_document
    event["ns"] = {"db": entry.db, "coll": entry.coll}
    if entry.document_key is not None:
        event["documentKey"] = entry.document_key
    if entry.update_description is not None:
        event["updateDescription"] = entry.update_description
    if entry.transaction is not None:
        event.update(entry.transaction)
    if not stream.pipeline:
        return event
    shown = apply_pipeline([copy.deepcopy(event)], stream.pipeline)
    if not shown:
        return None
    if not _same(shown[0].get("_id"), event["_id"]):
        raise _Refused(
            280,
            "ChangeStreamFatalError",
            "Encountered an event whose _id field, which contains the resume token, was modified "
            "by the pipeline.",
        )
    return shown[0]


async def _next_batch(client, stream, limit):
    """The events after the stream's position that it shows, at most `limit`; moves it on."""
    batch = []
    while len(batch) < limit and not stream.ended:
        if stream.invalidate_next:
            entry = _entry(stream.position)
            batch.append(
                {
                    "_id": _token(entry.cluster_time, entry.seq, invalidate=True),
                    "operationType": "invalidate",
                    "clusterTime": entry.cluster_time,
                    "wallTime": entry.wall_time,
                }
            )
            stream.ended = True
            break
        if stream.position >= _last_seq:
            break
        entry = _entry(stream.position + 1)
        if entry is None:  # trimmed before this stream read it
            raise _history_lost()
        stream.position = entry.seq
        if not _shows(stream, entry):
            continue
        if stream.not_before is not None and (entry.cluster_time.time, entry.cluster_time.inc) < (
            stream.not_before.time,
            stream.not_before.inc,
        ):
            continue
        event = await _event(client, stream, entry)
        if event is not None:
            batch.append(event)
        stream.invalidate_next = entry.operation_type == "drop" and stream.coll is not None
    return batch


def _batch_limit(value, default):
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


async def _open_change_stream(client, body):
    global _history_start
    if not CHANGE_STREAMS:
        raise _Refused(
            40573, "Location40573", "The $changeStream stage is only supported on replica sets"
        )
    db, target = body.get("$db", "test"), body.get("aggregate")
    options, *stages = body.get("pipeline")
    options = options["$changeStream"]
    if not isinstance(options, dict):
        raise _Refused(14, "TypeMismatch", "the $changeStream stage takes a document")
    for stage in stages:
        if not (
            isinstance(stage, dict) and len(stage) == 1 and next(iter(stage)) in _ALLOWED_STAGES
        ):
            raise _Refused(
                20, "IllegalOperation", f"{stage!r} is not permitted in a $changeStream pipeline"
            )
    full_document = options.get("fullDocument", "default")
    if full_document not in ("default", "updateLookup", "whenAvailable"):
        raise _Refused(2, "BadValue", f"fullDocument {full_document!r} is not supported here")
    if options.get("fullDocumentBeforeChange", "off") != "off":
        raise _Refused(2, "BadValue", "fullDocumentBeforeChange is not supported here")
    resume_options = ("resumeAfter", "startAfter", "startAtOperationTime")
    if sum(option in options for option in resume_options) > 1:
        raise _Refused(
            40674,
            "Location40674",
            "Only one type of resume option is allowed, but multiple were found.",
        )
    if options.get("allChangesForCluster") and (db != "admin" or target != 1):
        raise _Refused(
            72, "InvalidOptions", "allChangesForCluster needs `aggregate: 1` on the admin database"
        )
    if _history_start is None:  # the first stream of this server: the history starts now
        _history_start = _next_cluster_time()
    if options.get("allChangesForCluster"):
        scope, ns = (None, None), "admin.$cmd.aggregate"
    elif target == 1:
        scope, ns = (db, None), f"{db}.$cmd.aggregate"
    else:
        scope, ns = (db, target), f"{db}.{target}"
    stream = _Stream(ns, *scope, stages or None, full_document, position=_last_seq)
    if "resumeAfter" in options or "startAfter" in options:
        start_after = "startAfter" in options
        token = options["startAfter" if start_after else "resumeAfter"]
        _resume_position(token, start_after, stream)
    elif "startAtOperationTime" in options:
        at = options["startAtOperationTime"]
        if not isinstance(at, Timestamp):
            raise _Refused(14, "TypeMismatch", "startAtOperationTime takes a timestamp")
        if (at.time, at.inc) < _history_start:
            raise _history_lost()
        stream.not_before = at
        stream.position = next(
            (
                entry.seq - 1
                for entry in _history
                if (entry.cluster_time.time, entry.cluster_time.inc) >= (at.time, at.inc)
            ),
            _last_seq,
        )
    batch_size = _batch_limit((body.get("cursor") or {}).get("batchSize"), 101)
    batch = await _next_batch(client, stream, batch_size)
    cursor_id = 0
    if not stream.ended:
        now = time.monotonic()
        for stale in [i for i, s in _streams.items() if now - s.used > _CURSOR_IDLE_SECONDS]:
            del _streams[stale]
        cursor_id = next(_cursor_ids)
        _streams[cursor_id] = stream
    return {
        "cursor": {
            "firstBatch": batch,
            "postBatchResumeToken": _position_token(stream),
            "id": cursor_id,
            "ns": stream.ns,
        },
        "ok": 1.0,
    }


async def _get_more(client, cursor_id, body):
    stream = _streams.get(cursor_id)
    try:
        if stream is None or stream.killed:
            raise _Refused(43, "CursorNotFound", f"cursor id {cursor_id} not found")
        limit = body.get("batchSize") or sys.maxsize
        deadline = time.monotonic() + (body.get("maxTimeMS") or 1000) / 1000
        while True:
            batch = await _next_batch(client, stream, limit)
            remaining = deadline - time.monotonic()
            if batch or stream.ended or remaining <= 0:
                break
            await _wait_for_entries(remaining)
            if stream.killed:
                raise _Refused(43, "CursorNotFound", f"cursor id {cursor_id} not found")
    except _Refused:
        _streams.pop(cursor_id, None)
        raise
    stream.used = time.monotonic()
    if stream.ended:
        _streams.pop(cursor_id, None)
    return {
        "cursor": {
            "nextBatch": batch,
            "postBatchResumeToken": _position_token(stream),
            "id": 0 if stream.ended else cursor_id,
            "ns": stream.ns,
        },
        "ok": 1.0,
    }


async def _wait_for_entries(timeout):
    global _arrived
    if _arrived is None:
        _arrived = asyncio.Event()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_arrived.wait(), timeout)


def _kill_cursors(body):
    ids = body.get("cursors") or []
    killed = [cursor_id for cursor_id in ids if _streams.pop(cursor_id, None) is not None]
    return {
        "cursorsKilled": killed,
        "cursorsNotFound": [cursor_id for cursor_id in ids if cursor_id not in killed],
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    }


def _kill_change_streams():
    global _arrived
    for stream in _streams.values():
        stream.killed = True
    if _arrived is not None:  # getMores waiting fail now
        _arrived.set()
        _arrived = None
    return {"ok": 1.0, "cursorsKilled": len(_streams)}


def _ours(cursor_id):
    return isinstance(cursor_id, int) and cursor_id >= _FIRST_CURSOR_ID


async def _change_stream_command(client, body):
    """The reply to a change-stream command, or None for any other command."""
    name = next(iter(body), None)
    pipeline = body.get("pipeline")
    try:
        if (
            name == "aggregate"
            and isinstance(pipeline, list)
            and pipeline
            and isinstance(pipeline[0], dict)
            and "$changeStream" in pipeline[0]
        ):
            return await _open_change_stream(client, body)
        if name == "getMore" and _ours(body["getMore"]):
            return await _get_more(client, body["getMore"], body)
        if name == "killCursors" and any(map(_ours, body.get("cursors") or [])):
            return _kill_cursors(body)
        if name == KILL_CHANGE_STREAMS_COMMAND:
            return _kill_change_streams()
    except _Refused as refused:
        return refused.reply
    return None


_dispatch_without_change_streams = wire_proxy.AsyncMongoEcoProxyServer._dispatch_wire_request


async def _dispatch_change_stream_commands(self, header, payload, *, connection):
    # Cheap byte checks first: other commands pay nothing, and getMore and killCursors a second
    # decoding only once this server has opened a change stream.
    if header.op_code == wire_proxy.OP_MSG and (
        b"$changeStream" in payload
        or KILL_CHANGE_STREAMS_COMMAND.encode() in payload
        or (_history_start is not None and (b"getMore" in payload or b"killCursors" in payload))
    ):
        try:
            body = wire_proxy.decode_op_msg(header, payload).body
        except Exception:
            body = None  # mongoeco reports it
        reply = await _change_stream_command(self._client, body) if isinstance(body, dict) else None
        if reply is not None:
            return wire_proxy.encode_op_msg_response(
                reply, request_id=next(self._request_ids), response_to=header.request_id
            )
    return await _dispatch_without_change_streams(self, header, payload, connection=connection)


wire_proxy.AsyncMongoEcoProxyServer._dispatch_wire_request = _dispatch_change_stream_commands


# The skewed port. On a real cluster `$$NOW` is evaluated by the mongos (or primary) that runs the
# command, so clients behind different routers can see different clocks. mongoeco takes an
# operation's clock (`$$NOW`, `$currentDate`, ...) from its client's `now_factory`, and a wire
# server serves one client; so the second port is a second wire server whose own client shares the
# first one's engine (the data) and has a shifted `now_factory`. Cursors and sessions are per
# port, as they are per router. TTL deletion keeps the data-bearing server's clock (shim 7's
# purge), whichever port a client uses, as a real cluster's TTL monitor runs on the shards.
async def serve(engine, host: str, port: int, shift: datetime.timedelta):
    """A wire server on `engine` whose clock is the server's (stepped) clock plus `shift`."""
    client = AsyncMongoClient(engine, now_factory=lambda: stepped_now() + shift)
    client._change_hub = CHANGE_HUB  # shim 8: one change history for all ports (no argument for it)
    await client.__aenter__()  # connects the shared engine (it counts its users)
    server = wire_proxy.AsyncMongoEcoProxyServer(client=client, host=host, port=port)
    await server.start()
    return client, server


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--skewed-port-offset-ms",
        type=int,
        default=None,
        metavar="N",
        help="also serve the same data on a second (free) port whose clock is off by N ms",
    )
    parser.add_argument(
        "--transaction-lifetime-limit-seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="abort transactions open longer than this (MongoDB's default: 60)",
    )
    parser.add_argument(
        "--no-change-streams",
        action="store_true",
        help="refuse $changeStream (error 40573) as a standalone mongod does",
    )
    parser.add_argument(
        "--change-stream-history",
        type=int,
        default=5_000,
        metavar="N",
        help="change events kept for resuming streams (older tokens: ChangeStreamHistoryLost)",
    )
    args = parser.parse_args()
    global TRANSACTION_LIFETIME_LIMIT_SECONDS, CHANGE_STREAMS, CHANGE_STREAM_HISTORY
    TRANSACTION_LIFETIME_LIMIT_SECONDS = args.transaction_lifetime_limit_seconds
    CHANGE_STREAMS = not args.no_change_streams
    CHANGE_STREAM_HISTORY = max(1, args.change_stream_history)

    engine = MemoryEngine()
    ports = [await serve(engine, args.host, args.port, datetime.timedelta(0))]
    if args.skewed_port_offset_ms is not None:
        skew = datetime.timedelta(milliseconds=args.skewed_port_offset_ms)
        ports.append(await serve(engine, args.host, 0, skew))
    for _client, server in ports:
        print(server.address.uri, flush=True)

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # End-of-file on stdin means whoever started us is gone.
    # A daemon thread, so that a signal-initiated exit does not wait for the blocking read.
    def wait_for_eof() -> None:
        # Raw reads on the descriptor: a buffered reader's lock would abort interpreter shutdown.
        while os.read(sys.stdin.fileno(), 65536):
            pass
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_for_eof, daemon=True).start()
    try:
        await stop.wait()
    finally:
        for client, server in reversed(ports):
            await server.close()
            await client.close()


def fork_server(path: str) -> None:
    """Starts servers by forking this process, whose imports are done: about 1.3 CPU seconds
    less per server than starting Python afresh (scripts/test starts one of these for the whole
    suite, which starts some seventy servers).

    Listens on the Unix socket `path`. Each connection (from scripts/mongoeco_start.py) sends a
    server's arguments, as JSON, with its standard input, output and error (SCM_RIGHTS); a child
    forked for it runs main() on them exactly as `python mongoeco_server.py ARGS` would, and the
    connection gets the child's exit status when it ends. Serves until its own standard input
    reaches end-of-file. The children never see this loop: each starts from the state the imports
    left, as a fresh process would.
    """
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".binding")
    listener.listen(64)
    os.rename(path + ".binding", path)  # clients find the socket only once it accepts
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    waiting = {}  # child pid -> the connection that asked for it
    while True:
        for key, _ in selector.select(timeout=0.1):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(connection, 65536, 3)
                pid = os.fork()
                if pid == 0:
                    # The child keeps none of the fork server's descriptors but the ones sent.
                    selector.close()
                    for each in [listener, connection, *waiting.values()]:
                        each.close()
                    _run_forked(json.loads(message), fds)  # never returns
                for fd in fds:
                    os.close(fd)
                waiting[pid] = connection
            elif not os.read(sys.stdin.fileno(), 65536):
                # The script that started it may have removed the socket's folder already.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                with contextlib.suppress(OSError):
                    connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                connection.close()


def _run_forked(arguments, fds) -> None:
    """In a child of fork_server(): becomes a server started with `arguments`, on the standard
    input, output and error `fds`, and exits when it ends."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.argv = [sys.argv[0], *arguments]
        asyncio.run(main())
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported as a fresh process would, then exit
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--fork-server":
        fork_server(sys.argv[2])
    else:
        asyncio.run(main())
