"""Embedded MongoDB-compatible test server (mongoeco) for this crate's tests and examples.

Usage: python mongoeco_server.py [--port N]

Prints the connection string on the first line of stdout once the server accepts connections,
then serves until its standard input reaches end-of-file (the parent process exited or closed
the pipe) or it receives SIGTERM/SIGINT. Tying its life to stdin means a crashed test binary
never leaves a server behind.

mongoeco 4.11.0 has two reply-format quirks that the official Rust driver rejects; the two small
shims below fix them at the wire boundary, using mongoeco's own functions (see
shared TEST-SERVER.md, items 1 and 2). tests/test_server.rs covers both.
"""

import argparse
import asyncio
import os
import signal
import sys
import threading

from mongoeco.core.bson_scalars import BsonInt64
from mongoeco.wire import proxy as wire_proxy

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
    return _original_encode_op_msg_response(document, *args, **kwargs)


wire_proxy.decode_op_msg = _decode_op_msg
wire_proxy.encode_op_msg_response = _encode_op_msg_response


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args()

    server = wire_proxy.AsyncMongoEcoProxyServer(host=args.host, port=args.port)
    address = await server.start()
    print(address.uri, flush=True)

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
        await server.close()


if __name__ == "__main__":
    asyncio.run(main())
