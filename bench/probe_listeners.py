"""Simulated slurmd ports for bench/probe_cost.py: plain TCP listeners that accept and close.

Run as its own process (``python bench/probe_listeners.py COUNT``) so that the listeners never
share the probing process's CPU: it binds COUNT listening sockets on 127.0.0.1 (ports the
kernel picks, backlog 128 like slurmd's), prints their ports as one JSON line on stdout, then
accepts every connection and closes it at once, until its stdin closes (the bench ended or
died) or it is sent SIGTERM.

What this stands in for, honestly: to a SYN probe a listening socket is all there is to a
slurmd (the kernel answers the SYN, the process never sees it), so a SYN probe of a simulated
node is the real protocol. To a connect probe it is the real TCP handshake and close, but
slurmd also reads the empty connection and logs two error lines (about 55 µs of its CPU,
bench/results/probe_cost.md); here the listener only accepts and closes, so only the real
slurmds' columns say what a probe costs a node. Relaunch has no authenticated (munge RPC)
probe; one would cost both sides far more (a credential per probe) and is not measured here.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys

MAX_LISTENERS = 4096
BACKLOG = 128  # slurmd listens with SLURM_DEFAULT_LISTEN_BACKLOG (128)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit() or not 1 <= int(argv[0]) <= MAX_LISTENERS:
        print(f"usage: probe_listeners.py COUNT (1..{MAX_LISTENERS})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sel = selectors.DefaultSelector()
    ports = []
    for _ in range(int(argv[0])):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(BACKLOG)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
        ports.append(sock.getsockname()[1])
    stdin = sys.stdin.fileno()
    sel.register(stdin, selectors.EVENT_READ)
    print(json.dumps({"pid": os.getpid(), "ports": ports}), flush=True)
    while True:
        for key, _ in sel.select():
            if key.fd == stdin:
                if not os.read(stdin, 4096):
                    return 0
                continue
            listener = key.fileobj
            assert isinstance(listener, socket.socket)
            while True:
                try:
                    conn, _addr = listener.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:  # EMFILE and the like: the kernel keeps the rest queued
                    break
                conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
