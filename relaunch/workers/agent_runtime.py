"""The node agent's loop: NVML samples, Xid events and kernel lines, sent where configured.

It sends the first full sample of every GPU at start, then only news (see ``ChangeFilter``):
Xid events as they arrive, counters that went up, new throttle reasons or errors, and every
kernel line the signature catalogue knows. Each sink has its own queue and writer, so a slow
HTTP receiver (retries, backoff) never holds up the file the watcher reads.

With ``heartbeat``, every that many seconds each file sink replaces the small file ``heartbeat``
beside its telemetry file (:mod:`relaunch.connectors.telemetry.heartbeat`): the watcher
reports a node whose agent falls silent. Beats never go into the telemetry stream, so the file
the watcher reads from its start when it meets a node does not grow with them; stdout and HTTP
receivers get none. A clean stop removes the file (a stopped agent is not a dead node).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import httpx

from relaunch.connectors.telemetry.calls import NvmlTimeoutError
from relaunch.connectors.telemetry.files import append_samples
from relaunch.connectors.telemetry.heartbeat import (
    heartbeat_path,
    remove_heartbeat,
    write_heartbeat,
)
from relaunch.connectors.telemetry.kernlog import (
    JournalReader,
    KernelLine,
    KernelLogError,
    KernelLogFile,
    pci_in_line,
)
from relaunch.connectors.telemetry.nvml import NvmlCollector
from relaunch.connectors.telemetry.samples import ChangeFilter, pci_key
from relaunch.detection.kernel_lines import KernelRecord
from relaunch.detection.signatures import Catalogue
from relaunch.models.bundle import TelemetrySample, TelemetrySource

log = logging.getLogger(__name__)

MAX_MESSAGE = 500


class Sink(Protocol):
    """Where samples go."""

    async def send(self, samples: list[TelemetrySample]) -> None: ...


class FileSink:
    """Appends JSON lines to a file (the watcher tails it); heartbeats go beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.heartbeat_path = heartbeat_path(path)

    async def send(self, samples: list[TelemetrySample]) -> None:
        await asyncio.to_thread(append_samples, self.path, samples)

    async def beat(self, node: str, at: datetime) -> None:
        """Replace the heartbeat file (never appended: it stays one small object)."""
        await asyncio.to_thread(write_heartbeat, self.heartbeat_path, node, at)

    async def stop_beating(self) -> None:
        """Remove this agent's heartbeat file: it stopped, the node did not die."""
        await asyncio.to_thread(remove_heartbeat, self.heartbeat_path)


class StdoutSink:
    """Prints JSON lines."""

    async def send(self, samples: list[TelemetrySample]) -> None:
        for sample in samples:
            sys.stdout.write(sample.model_dump_json(exclude_none=True) + "\n")
        sys.stdout.flush()


class HttpSink:
    """POSTs each batch as JSON lines with a bearer token, retrying with backoff.

    A batch that cannot be delivered is kept (up to ``max_pending`` samples, oldest dropped
    first) and sent with the next one. The token is never logged."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 10.0,
        attempts: int = 4,
        backoff: float = 0.5,
        max_pending: int = 10_000,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = url
        self._token = token
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.max_pending = max_pending
        self._client = client
        self.pending: list[TelemetrySample] = []
        self.dropped = 0

    async def send(self, samples: list[TelemetrySample]) -> None:
        batch = self.pending + samples
        if len(batch) > self.max_pending:
            self.dropped += len(batch) - self.max_pending
            batch = batch[-self.max_pending :]
        self.pending = []
        if not batch:
            return
        body = "".join(s.model_dump_json(exclude_none=True) + "\n" for s in batch).encode()
        headers = {"Content-Type": "application/x-ndjson"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            status: int | str
            try:
                if self._client is not None:
                    response = await self._client.post(
                        self.url, content=body, headers=headers, timeout=self.timeout
                    )
                else:
                    async with httpx.AsyncClient(timeout=self.timeout) as client:
                        response = await client.post(self.url, content=body, headers=headers)
                status = response.status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            if isinstance(status, int) and status < 300:
                return
            if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
                log.error(
                    "telemetry POST refused; batch dropped",
                    extra={"url": self.url, "status": status, "samples": len(batch)},
                )
                self.dropped += len(batch)
                return
            log.warning(
                "telemetry POST failed",
                extra={"url": self.url, "status": status, "attempt": attempt},
            )
            if attempt < self.attempts:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 8.0)
        self.pending = batch


def kernel_samples(
    lines: Sequence[KernelLine],
    catalogue: Catalogue,
    *,
    collector: NvmlCollector | None = None,
    first_line_no: int = 1,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    record: KernelRecord | None = None,
) -> list[TelemetrySample]:
    """A sample for every kernel line the catalogue matches (Xid, SXid, mlx5, OOM, ...), read
    as a trusted kernel source: a signature counts only at the message start, never on a line
    about a user process (``record``: what the log's previous line said, kept by the caller).

    The Xid number comes from the catalogue's match; the PCI address the line names is mapped
    to the GPU NVML knows at that address, when there is one."""
    record = record if record is not None else KernelRecord()
    out: list[TelemetrySample] = []
    for no, line in enumerate(lines, start=first_line_no):
        match = catalogue.match_line(
            line.text,
            line_no=no,
            source="kernel",
            source_node=line.node,
            kernel=True,
            record=record,
        )
        if match is None:
            continue
        sample = TelemetrySample(
            node=line.node,
            time=line.time or match.timestamp or clock(),
            source=TelemetrySource.KERNEL,
            xid=match.xid,
            signature=match.signature,
            message=line.text[:MAX_MESSAGE],
        )
        pci = pci_in_line(line.text)
        if pci is not None:
            key = pci_key(pci)
            device = collector.device_by_pci(key) if collector is not None and key else None
            if device is not None:
                sample.gpu = device.index
                sample.uuid = device.uuid
                sample.pci_bus_id = device.pci_bus_id
            else:
                sample.pci_bus_id = pci
        out.append(sample)
    return out


class Agent:
    """One node's agent. ``kernel`` is a kernel log file reader, a journal reader, or None."""

    def __init__(
        self,
        *,
        node: str,
        collector: NvmlCollector,
        sinks: Sequence[Sink],
        interval: float,
        kernel: KernelLogFile | JournalReader | None = None,
        catalogue: Catalogue | None = None,
        heartbeat: float = 0.0,
    ) -> None:
        self.node = node
        self.collector = collector
        self.sinks = list(sinks)
        self.interval = interval
        self.kernel = kernel
        self.catalogue = catalogue or Catalogue.load()
        self.heartbeat = heartbeat  # seconds between heartbeats; 0: none
        # Only files get heartbeats (see the module docstring).
        self._beating = [sink for sink in self.sinks if isinstance(sink, FileSink)]
        self._beat_write: asyncio.Future[None] | None = None
        self.changes = ChangeFilter()
        self._queues: list[asyncio.Queue[list[TelemetrySample] | None]] = [
            asyncio.Queue() for _ in self.sinks
        ]
        self._kernel_lines = 0
        self._kernel_record = KernelRecord()

    async def once(self) -> list[TelemetrySample]:
        """One full sample per GPU, sent to every sink."""
        samples = await self.collector.read()
        await self._deliver(samples)
        return samples

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until ``stop`` is set, then flush what is queued and return."""
        first = await self.collector.read()
        self.changes.news(first)
        self._emit(first)
        writers = [
            asyncio.create_task(self._writer(sink, queue), name=f"agent-writer-{i}")
            for i, (sink, queue) in enumerate(zip(self.sinks, self._queues, strict=True))
        ]
        producers = [
            asyncio.create_task(self._poll(), name="agent-poll"),
            asyncio.create_task(self._xids(), name="agent-xid"),
        ]
        if self.kernel is not None:
            producers.append(asyncio.create_task(self._kernel(), name="agent-kernel"))
        if self.heartbeat > 0 and self._beating:
            producers.append(asyncio.create_task(self._heartbeats(), name="agent-heartbeat"))
        stopping = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait(
                [stopping, *producers], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                if task is not stopping and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in [stopping, *producers]:
                task.cancel()
            await asyncio.gather(stopping, *producers, return_exceptions=True)
            self._emit(None)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*writers)
            if self._beat_write is not None:
                # A write already in its thread would otherwise land after the removal (a
                # write hung on a dead filesystem is not waited for long).
                await asyncio.wait({self._beat_write}, timeout=5)
            if self.heartbeat > 0:
                for sink in self._beating:
                    with contextlib.suppress(OSError):
                        await sink.stop_beating()

    def _emit(self, samples: list[TelemetrySample] | None) -> None:
        """Queue ``samples`` for every sink (None: the last batch, then the writers end)."""
        for queue in self._queues:
            queue.put_nowait(samples)

    async def _heartbeats(self) -> None:
        """A heartbeat every ``heartbeat`` seconds to each file sink, whatever NVML does (a
        hung GPU read is reported on its own; the node is still alive) and whatever the
        other sinks' writers are waiting for. A failed write is said when it starts failing
        and when it works again, not at every beat."""
        failing: set[int] = set()
        while True:
            for index, sink in enumerate(self._beating):
                self._beat_write = asyncio.ensure_future(sink.beat(self.node, datetime.now(UTC)))
                try:
                    await asyncio.shield(self._beat_write)
                except OSError as exc:
                    if index not in failing:
                        log.error(
                            "heartbeat write failed",
                            extra={"path": str(sink.heartbeat_path), "error": str(exc)},
                        )
                    failing.add(index)
                else:
                    if index in failing:
                        where = {"path": str(sink.heartbeat_path)}
                        log.info("heartbeat written again", extra=where)
                    failing.discard(index)
            await asyncio.sleep(self.heartbeat)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            news = self.changes.news(await self.collector.read())
            if news:
                self._emit(news)

    async def _xids(self) -> None:
        while True:
            try:
                events = await self.collector.wait_xid(min(self.interval, 1.0))
            except NvmlTimeoutError as exc:
                hung = TelemetrySample(
                    node=self.node,
                    time=datetime.now(UTC),
                    source=TelemetrySource.NVML,
                    errors=[exc.message],
                )
                if self.changes.is_news(hung):
                    self._emit([hung])
                log.warning("NVML event wait hung", extra={"error": exc.message})
                await asyncio.sleep(self.interval)
                continue
            if events:
                self._emit(events)

    async def _kernel(self) -> None:
        kernel = self.kernel
        if isinstance(kernel, KernelLogFile):
            while True:
                self._take_kernel(kernel.read())
                await asyncio.sleep(min(self.interval, 1.0))
        elif isinstance(kernel, JournalReader):
            while True:
                try:
                    async for line in kernel.follow():
                        self._take_kernel([line])
                except KernelLogError as exc:
                    log.warning("journal read failed", extra={"error": exc.message})
                await asyncio.sleep(self.interval)

    def _take_kernel(self, lines: list[KernelLine]) -> None:
        if not lines:
            return
        samples = kernel_samples(
            lines,
            self.catalogue,
            collector=self.collector,
            first_line_no=self._kernel_lines + 1,
            record=self._kernel_record,
        )
        self._kernel_lines += len(lines)
        if samples:
            self._emit(samples)

    async def _writer(self, sink: Sink, queue: asyncio.Queue[list[TelemetrySample] | None]) -> None:
        """Send what is queued for ``sink``, batching what piled up while it was busy."""
        while True:
            batch = await queue.get()
            done = batch is None
            samples = list(batch or [])
            while not queue.empty():
                more = queue.get_nowait()
                if more is None:
                    done = True
                else:
                    samples.extend(more)
            await self._send(sink, samples)
            if done:
                return

    async def _deliver(self, samples: list[TelemetrySample]) -> None:
        for sink in self.sinks:
            await self._send(sink, samples)

    @staticmethod
    async def _send(sink: Sink, samples: list[TelemetrySample]) -> None:
        if not samples:
            return
        try:
            await sink.send(samples)
        except OSError as exc:
            log.error(
                "telemetry sink failed", extra={"sink": type(sink).__name__, "error": str(exc)}
            )
