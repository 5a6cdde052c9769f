"""Serve an ASGI app on a free local port in a thread (a real HTTP server for real senders)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from starlette.types import ASGIApp

from relaunch.devstack import procs


@contextmanager
def serve(app: ASGIApp, path: str = "/healthz") -> Iterator[str]:
    port = procs.free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise AssertionError("test server did not start")
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def get(url: str, **kw: object) -> httpx.Response:
    return httpx.get(url, timeout=10, **kw)  # type: ignore[arg-type]
