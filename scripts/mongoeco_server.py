"""Embedded MongoDB-compatible test server (mongoeco) for this crate's tests and examples.

Usage: python mongoeco_server.py [--port N] [--skewed-port-offset-ms N]

Prints the connection string on the first line of stdout once the server accepts connections,
then serves until its standard input reaches end-of-file (the parent process exited or closed
the pipe) or it receives SIGTERM/SIGINT. Tying its life to stdin means a crashed test binary
never leaves a server behind.

mongoeco 4.11.0 has two reply-format quirks that the official Rust driver rejects; the two small
shims below fix them at the wire boundary, using mongoeco's own functions (see
shared TEST-SERVER.md, items 1 and 2); tests/infra_test_server.rs covers both. A third gives its
transaction write conflicts the code and label a real server uses, and a fourth lets a new
transaction abort the session's previous one, as a real server does (tests/transactions.rs
depends on both). A fifth gives an index key-pattern conflict the server's code
(tests/round_trips.rs depends on it).

With --skewed-port-offset-ms N it also opens a second port on the same in-memory data whose clock
is N milliseconds ahead (behind, if negative): a second router with a skewed clock. Its URI is the
second line of stdout. See start_skewed_port below; tests/fault_proxy.rs covers it.
"""

import argparse
import asyncio
import datetime
import os
import signal
import sys
import threading

from mongoeco.api import AsyncMongoClient
from mongoeco.core.bson_scalars import BsonInt64, utc_bson_now
from mongoeco.engines.memory import MemoryEngine
from mongoeco.wire import proxy as wire_proxy
from mongoeco.wire import sessions as wire_sessions

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
    return _original_apply_transaction_metadata(session, body)


wire_sessions.WireSessionStore._apply_transaction_metadata = staticmethod(
    _apply_transaction_metadata
)


# The skewed port. On a real cluster `$$NOW` is evaluated by the mongos (or primary) that runs the
# command, so clients behind different routers can see different clocks. mongoeco takes an
# operation's clock (`$$NOW`, `$currentDate`, ...) from its client's `now_factory`, and a wire
# server serves one client; so the second port is a second wire server whose own client shares the
# first one's engine (the data) and has a shifted `now_factory`. Cursors and sessions are per
# port, as they are per router.
#
# TTL deletion: mongoeco deletes expired documents when they are accessed, judging expiry by the
# accessing operation's clock on some paths and by the real clock on others. A real cluster's TTL
# monitor runs on the data-bearing nodes with their own clock, whichever router a client uses; so
# with a skewed port, every TTL judgement uses the unshifted clock (the "shards'" clock, the same
# as the normal port's).
async def start_skewed_port(engine, host: str, offset_ms: int):
    offset = datetime.timedelta(milliseconds=offset_ms)
    client = AsyncMongoClient(engine, now_factory=lambda: utc_bson_now() + offset)
    await client.__aenter__()  # connects the shared engine (it counts its users)
    server = wire_proxy.AsyncMongoEcoProxyServer(client=client, host=host, port=0)
    await server.start()

    original_purge = MemoryEngine._purge_expired_documents_locked

    def purge_by_unshifted_clock(self, *args, now, **kwargs):
        del now  # the operation's clock, shifted on the skewed port
        unshifted = utc_bson_now().replace(tzinfo=datetime.UTC)
        return original_purge(self, *args, now=unshifted, **kwargs)

    MemoryEngine._purge_expired_documents_locked = purge_by_unshifted_clock
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
    args = parser.parse_args()

    skewed = None
    if args.skewed_port_offset_ms is None:
        server = wire_proxy.AsyncMongoEcoProxyServer(host=args.host, port=args.port)
        address = await server.start()
    else:
        engine = MemoryEngine()
        server = wire_proxy.AsyncMongoEcoProxyServer(
            engine=engine, host=args.host, port=args.port
        )
        address = await server.start()
        skewed = await start_skewed_port(engine, args.host, args.skewed_port_offset_ms)
    print(address.uri, flush=True)
    if skewed is not None:
        print(skewed[1].address.uri, flush=True)

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
        if skewed is not None:
            skewed_client, skewed_server = skewed
            await skewed_server.close()
            await skewed_client.close()
        await server.close()


if __name__ == "__main__":
    asyncio.run(main())
