"""The worker's and the watcher's own ``/metrics`` and ``/healthz`` (docs/metrics.md).

Each process serves both paths on one address (``metrics.watch_address`` /
``metrics.worker_address``) from a thread of its own, never from the event loop: a wedged loop
must still be answered, and answered red. ``/healthz`` is 200 only while the process's loop is
alive — an in-process heartbeat task beats every second — and its work goes on (the watcher:
a good poll not long ago; the worker: its Temporal workers still polling); else 503 with the
reason as text. A stopped process (SIGSTOP) does not answer at all, which a probe with a
timeout reads as red too.

The worker's ``/metrics`` is Relaunch's own registry followed by the Temporal SDK's series: the
SDK serves them (its Prometheus exporter) on a loopback port of its own, read at each scrape,
so that one URL carries both."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Detection

log = logging.getLogger("relaunch.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The loop's heartbeat: a beat a second; no beat for this long and the process is red.
BEAT_S = 1.0
LOOP_STALE_S = 10.0
# The watcher is red once its last good poll is older than max(this, POLLS_STALE x interval,
# twice the longest interval between two listings of jobs, all or the active ones:
# relaunch/workers/watch_cadence.py).
POLL_STALE_FLOOR_S = 20.0
POLLS_STALE = 5
POLL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# How long a scrape waits for the SDK's own exporter (loopback).
SDK_SCRAPE_TIMEOUT_S = 2.0

HealthCheck = Callable[[float], str | None]  # monotonic now -> None (fine) or why not


class MetricsAddressError(RelaunchError):
    """The metrics address cannot be listened on (taken, or not this host's)."""


# ---------------------------------------------------------------------- health


@dataclass
class Health:
    """Whether a process is healthy: its loop beat recently and every check passes.

    ``beat`` is called from the event loop (by :func:`heartbeat`); ``verdict`` from the HTTP
    server's thread. Checks take the monotonic time and return the reason for red, or None."""

    started: float = field(default_factory=time.monotonic)
    loop_stale_s: float = LOOP_STALE_S
    checks: list[HealthCheck] = field(default_factory=list)
    last_beat: float | None = None

    def beat(self, now: float | None = None) -> None:
        self.last_beat = time.monotonic() if now is None else now

    def verdict(self, now: float | None = None) -> tuple[bool, str]:
        """(healthy, the text /healthz answers)."""
        now = time.monotonic() if now is None else now
        since = self.started if self.last_beat is None else self.last_beat
        if now - since > self.loop_stale_s:
            return False, f"event loop stalled: no heartbeat for {now - since:.0f}s"
        reasons = [why for check in self.checks if (why := check(now))]
        if reasons:
            return False, "; ".join(reasons)
        return True, "ok"


async def heartbeat(health: Health, interval_s: float = BEAT_S) -> None:
    """Beat ``health`` until cancelled: proof that the event loop still runs."""
    while True:
        health.beat()
        await asyncio.sleep(interval_s)


def poll_stale_s(poll_interval_s: float, reconcile_s: float = 0.0) -> float:
    """How old the watcher's last good poll may be before it is red."""
    return max(POLL_STALE_FLOOR_S, POLLS_STALE * poll_interval_s, 2 * reconcile_s)


# ---------------------------------------------------------------------- the watcher


class _ProbeCollector(Collector):
    """relaunch_watch_probe_results_total from the watcher's own counters (WatchStats)."""

    def __init__(self, cluster: str, counts: Callable[[], tuple[int, int, int]]) -> None:
        self._cluster = cluster
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        probes, failed, errors = self._counts()
        family = CounterMetricFamily(
            "relaunch_watch_probe_results",
            "Liveness probes of watched nodes' slurmd by result: ok, failed (refused, timed "
            "out, unreachable), error (a round that could not probe at all).",
            labels=["cluster", "result"],
        )
        family.add_metric([self._cluster, "ok"], max(0, probes - failed))
        family.add_metric([self._cluster, "failed"], failed)
        family.add_metric([self._cluster, "error"], errors)
        yield family


class WatchMetrics:
    """The watcher's series, all with a ``cluster`` label, in a registry of their own."""

    def __init__(
        self, cluster: str, probe_counts: Callable[[], tuple[int, int, int]] | None = None
    ) -> None:
        self.cluster = cluster
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, ["cluster"]
        self._poll = Histogram(
            "relaunch_watch_poll_duration_seconds",
            "Time one poll of the cluster took (listing, node states, the pass over the jobs).",
            labels,
            buckets=POLL_BUCKETS,
            registry=r,
        ).labels(cluster)
        self._last_good = Gauge(
            "relaunch_watch_last_good_poll_timestamp_seconds",
            "Unix time of the last poll that succeeded (0: none yet).",
            labels,
            registry=r,
        ).labels(cluster)
        polls = Counter(
            "relaunch_watch_polls",
            "Polls of the cluster by result.",
            ["cluster", "result"],
            registry=r,
        )
        self._polls_ok = polls.labels(cluster, "ok")
        self._polls_error = polls.labels(cluster, "error")
        self._jobs = Gauge(
            "relaunch_watch_jobs_watched", "Jobs the last poll watched.", labels, registry=r
        ).labels(cluster)
        self._nodes = Gauge(
            "relaunch_watch_nodes_watched",
            "Nodes the watched jobs run on, as of the last poll.",
            labels,
            registry=r,
        ).labels(cluster)
        self._detections = Counter(
            "relaunch_watch_detections",
            "Detections by source (scheduler, job_log, node_log, progress, telemetry, probe, ...).",
            ["cluster", "source"],
            registry=r,
        )
        self._bytes = Counter(
            "relaunch_watch_bytes_read",
            "Bytes read from watched jobs' output files and their nodes' kernel logs.",
            labels,
            registry=r,
        ).labels(cluster)
        ops = Counter(
            "relaunch_watch_file_ops",
            "File operations (open, stat, read) reading watched jobs' and nodes' logs.",
            ["cluster", "op"],
            registry=r,
        )
        self._ops = [ops.labels(cluster, op) for op in ("open", "stat", "read")]
        if probe_counts is not None:
            r.register(_ProbeCollector(cluster, probe_counts))
        self.last_good_poll: float | None = None  # monotonic
        self.poll_interval_s = 1.0
        self.reconcile_s = 0.0  # the longest interval between two listings of jobs
        self.standby = False  # a watcher that does not act (yet): healthy while its loop runs
        self.leading_since: float | None = None  # monotonic: when its term as leader began

    def polled(self, took_s: float, jobs: int, nodes: int) -> None:
        """A poll that succeeded."""
        self._poll.observe(took_s)
        self._polls_ok.inc()
        self._jobs.set(jobs)
        self._nodes.set(nodes)
        self._last_good.set(time.time())
        self.last_good_poll = time.monotonic()

    def poll_failed(self) -> None:
        self._polls_error.inc()

    def detected(self, detections: Sequence[Detection]) -> None:
        for det in detections:
            self._detections.labels(self.cluster, det.source.value).inc()

    def read(self, nbytes: int) -> None:
        if nbytes > 0:
            self._bytes.inc(nbytes)

    def file_ops(self, ops: tuple[int, int, int]) -> None:
        """Opens, stats and reads made reading one log file."""
        for counter, n in zip(self._ops, ops, strict=True):
            if n:
                counter.inc(n)

    def check(self, started: float) -> HealthCheck:
        """The watcher's health check: a good poll within :func:`poll_stale_s` (counted from
        ``started`` before the first)."""

        def stale(now: float) -> str | None:
            if self.standby:
                return None
            limit = poll_stale_s(self.poll_interval_s, self.reconcile_s)
            last = self.last_good_poll
            # From the last good poll, or from when this process (or its term as the leader,
            # under the lease) began watching, whichever is later.
            since = max(t for t in (started, self.leading_since, last) if t is not None)
            if now - since <= limit:
                return None
            what = "no good poll yet" if last is None else "last good poll"
            return f"{what}: {now - since:.0f}s ago (limit {limit:.0f}s)"

        return stale


# ---------------------------------------------------------------------- the worker


class _AuditFailures(Collector):
    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "relaunch_worker_audit_write_failures",
            "Writes to the audit trail that failed (the activity retries; the row is late).",
            value=self._count(),
        )


class WorkerMetrics:
    """The worker's own series: activities by result, failed audit writes."""

    def __init__(self, cluster: str, audit_failures: Callable[[], int] | None = None) -> None:
        self.cluster = cluster
        self.registry = CollectorRegistry(auto_describe=True)
        self.activities = Counter(
            "relaunch_worker_activities",
            "Activity executions this worker finished, by activity and result "
            "(ok, error, cancelled).",
            ["cluster", "activity", "result"],
            registry=self.registry,
        )
        if audit_failures is not None:
            self.registry.register(_AuditFailures(audit_failures))

    def interceptor(self) -> Interceptor:
        """A worker interceptor that counts each activity execution."""
        return _ActivityCounting(self)


class _ActivityCounting(Interceptor):
    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _CountActivity(next, self._metrics)


class _CountActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, metrics: WorkerMetrics) -> None:
        super().__init__(next)
        self._metrics = metrics

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        name = getattr(input.fn, "__name__", "unknown")
        result = "error"
        try:
            value = await super().execute_activity(input)
            result = "ok"
            return value
        except asyncio.CancelledError:
            result = "cancelled"
            raise
        finally:
            self._metrics.activities.labels(self._metrics.cluster, name, result).inc()


def free_loopback_port() -> int:
    """A loopback port nothing listens on now (for the SDK's own exporter)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_sdk_metrics(port: int, timeout_s: float = SDK_SCRAPE_TIMEOUT_S) -> bytes:
    """The Temporal SDK exporter's text, or a comment saying why it is missing."""
    try:
        with urllib.request.urlopen(  # noqa: S310 - a loopback URL of our own
            f"http://127.0.0.1:{port}/metrics", timeout=timeout_s
        ) as resp:
            return bytes(resp.read())
    except (OSError, urllib.error.URLError) as exc:
        return f"# the Temporal SDK's metrics did not answer: {exc}\n".encode()


# ---------------------------------------------------------------------- the server


class MetricsServer:
    """``/metrics`` and ``/healthz`` on ``(host, port)``, from a daemon thread."""

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        health: Health,
        *,
        extra: Callable[[], bytes] | None = None,
    ) -> None:
        self.registry, self.health, self.extra = registry, health, extra
        server = self
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A scraper that gave up (its timeout while this process was stopped) is no
                # error of ours; anything else is logged, not printed.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    log.exception("the metrics server failed to answer %s", client_address)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, server.metrics_text(), CONTENT_TYPE)
                elif path == "/healthz":
                    ok, text = server.health.verdict()
                    self._answer(200 if ok else 503, (text + "\n").encode(), "text/plain")
                else:
                    self._answer(404, b"not found: /metrics and /healthz only\n", "text/plain")

            def _answer(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every few seconds is not news

        try:
            self._httpd = Server(address, Handler)
        except OSError as exc:
            host, port = address
            raise MetricsAddressError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}",
                hint="is another process on that port? set metrics.*_address to a free one, or off",
            ) from exc
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="metrics-server", daemon=True
        )

    def metrics_text(self) -> bytes:
        text = generate_latest(self.registry)
        if self.extra is not None:
            text += self.extra()
        return text

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextlib.asynccontextmanager
async def serving(
    address: tuple[str, int] | None,
    registry: CollectorRegistry,
    health: Health,
    *,
    extra: Callable[[], bytes] | None = None,
    what: str = "process",
) -> Any:
    """Serve ``/metrics`` and ``/healthz`` while the block runs (nothing when ``address`` is
    None, the ``off`` setting), with the loop's heartbeat; yields the server or None."""
    if address is None:
        yield None
        return
    # No *_created series beside each counter: nothing reads them.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    server = MetricsServer(address, registry, health, extra=extra).start()
    beating = asyncio.create_task(heartbeat(health))
    host = f"[{address[0]}]" if ":" in address[0] else address[0]
    log.info(
        "%s metrics on http://%s:%d/metrics, health on /healthz",
        what,
        host,
        server.port,
        extra={"metrics_url": f"http://{host}:{server.port}/metrics"},
    )
    try:
        yield server
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
        server.close()
