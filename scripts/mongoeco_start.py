"""Starts an embedded test server through the fork server of scripts/mongoeco_server.py
(`--fork-server`, started by scripts/test) when MONGOECO_FORK_SERVER names its socket, and as
`python mongoeco_server.py ARGS` otherwise: the same server either way, on this process's standard
input, output and error, and this process ends when it does, with its exit status. Imports only
the standard library, so it starts in milliseconds (run it with `python -I -S`)."""
import json
import os
import socket
import sys

SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mongoeco_server.py")


def main():
    path = os.environ.get("MONGOECO_FORK_SERVER")
    if path:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(path)
            socket.send_fds(connection, [json.dumps(sys.argv[1:]).encode()], [0, 1, 2])
        except OSError:
            connection = None  # no fork server (any more): start the server here instead
        if connection is not None:
            # The server runs now; its end (or the fork server's, which says nothing) ends this.
            status = connection.recv(16)
            sys.exit(int(status) if status else 1)
    os.execv(sys.executable, [sys.executable, SERVER, *sys.argv[1:]])


main()
