"""Embedded MongoDB-compatible test server (mongoeco) for this crate's tests and examples.

Usage: python mongoeco_server.py [--port N] [--skewed-port-offset-ms N]
                                 [--transaction-lifetime-limit-seconds S]

Prints the connection string on the first line of stdout once the server accepts connections,
then serves until its standard input reaches end-of-file (the parent process exited or closed
the pipe) or it receives SIGTERM/SIGINT. Tying its life to stdin means a crashed test binary
never leaves a server behind.

mongoeco 4.11.0 differs from a real server in ways the crate's code depends on; each shim below
makes it behave like MongoDB at the wire boundary or in its engine, using mongoeco's own
functions (see shared TEST-SERVER.md), and each but shim 4 (exercised by tests/transactions.rs)
has a test of its own in tests/infra_test_server.rs that cites the MongoDB manual page it
imitates:

1. Int64 limit/skip/batchSize arguments decoded into plain integers.
2. Cursor ids encoded as Int64.
3. A transaction write conflict reported as WriteConflict (112), TransientTransactionError.
4. A new transaction on a session aborts the session's previous one.
5. An index key-pattern conflict reported as IndexOptionsConflict (85).
6. A write outside a transaction to a document an open transaction has written waits until the
   transaction ends or the write's maxTimeMS runs out; transactions end at their lifetime limit.
7. The server clock can be stepped forward and back at run time (command mongoecoStepClock).

With --skewed-port-offset-ms N it also opens a second port on the same in-memory data whose clock
is N milliseconds ahead (behind, if negative): a second router with a skewed clock. Its URI is the
second line of stdout. See start_skewed_port below; tests/fault_clock_skew.rs uses it.
"""

import argparse
import asyncio
import datetime
import os
import signal
import sys
import threading
import time

from mongoeco.api import AsyncMongoClient
from mongoeco.core.bson_scalars import BsonInt64, utc_bson_now
from mongoeco.engines.memory import MemoryEngine
from mongoeco.errors import OperationFailure
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


async def _dispatch_wire_request(self, header, payload, *, connection):
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
    args = parser.parse_args()
    global TRANSACTION_LIFETIME_LIMIT_SECONDS
    TRANSACTION_LIFETIME_LIMIT_SECONDS = args.transaction_lifetime_limit_seconds

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


if __name__ == "__main__":
    asyncio.run(main())
