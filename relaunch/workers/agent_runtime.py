"""The node agent's loop: NVML samples, Xid events and kernel lines, sent where configured.

It sends the first full sample of every GPU at start, then only news (see ``ChangeFilter``):
Xid events as they arrive, counters that went up, new throttle reasons or errors, and every
kernel line the signature catalogue knows. Each sink has its own queue and writer, so a slow
HTTP receiver (retries, backoff) never holds up the file the watcher reads.

With ``heartbeat``, every that many seconds each file sink replaces the small file ``heartbeat``
beside its telemetry file (:mod:`relaunch.connectors.telemetry.heartbeat`): the watcher
reports a node whose agent falls silent. Beats never go into the telemetry stream, so the file
the watcher reads from its start when it meets a node does not grow with them; stdout gets
none. An HTTP receiver (``POST /intake/agent``) gets each beat as a line of its own
(:class:`~relaunch.models.agentwire.HeartbeatLine`). A clean stop removes the file and tells
the receiver (a stopped agent is not a dead node).

The kernel's own messages (``/dev/kmsg``, or journald's kernel transport: facility 0 only) go
to an HTTP receiver whole, as :class:`~relaunch.models.agentwire.KernelRecordLine` (the
receiver writes them into the node's kernel log, which the watcher reads as the kernel's);
file and stdout sinks get the catalogue's samples of them, as of any kernel log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    KmsgReader,
    KmsgRecord,
    boot_id,
    pci_in_line,
)
from relaunch.connectors.telemetry.nvml import NvmlCollector
from relaunch.connectors.telemetry.samples import ChangeFilter, pci_key
from relaunch.detection.kernel_lines import KernelRecord
from relaunch.detection.signatures import Catalogue
from relaunch.models.agentwire import HeartbeatLine, KernelRecordLine
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


KernelSource = KernelLogFile | JournalReader | KmsgReader


@dataclass
class Batch:
    """What one writer sends at once: samples, the kernel's own records, a heartbeat."""

    samples: list[TelemetrySample] = field(default_factory=list)
    kernel: list[KernelRecordLine] = field(default_factory=list)
    beat: HeartbeatLine | None = None

    def add(self, other: Batch) -> None:
        self.samples.extend(other.samples)
        self.kernel.extend(other.kernel)
        self.beat = other.beat or self.beat


class HttpSink:
    """POSTs each batch as JSON lines with a bearer token, retrying with backoff.

    A batch that cannot be delivered is kept (up to ``max_pending`` lines, oldest dropped
    first) and sent with the next one; a heartbeat is never kept (the next one says more).
    The token is never logged."""

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
        self._own_client = client is None
        self.pending: list[str] = []
        self.dropped = 0
        self.sent_bytes = 0

    async def send(self, samples: list[TelemetrySample]) -> None:
        await self.send_batch(Batch(samples=list(samples)))

    async def send_batch(self, news: Batch) -> None:
        """Send ``news`` after what is pending; a heartbeat goes last."""
        lines = [s.model_dump_json(exclude_none=True) for s in news.samples]
        lines += [r.model_dump_json(exclude_none=True) for r in news.kernel]
        batch = self.pending + lines
        if len(batch) > self.max_pending:
            self.dropped += len(batch) - self.max_pending
            batch = batch[-self.max_pending :]
        self.pending = []
        beat = news.beat
        if beat is not None:
            beat = beat.model_copy(update={"dropped": self.dropped})
        if not batch and beat is None:
            return
        body = "".join(line + "\n" for line in batch)
        if beat is not None:
            body += beat.model_dump_json(exclude_none=True) + "\n"
        data = body.encode()
        headers = {"Content-Type": "application/x-ndjson"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            status: int | str
            try:
                if self._client is None:
                    # One client for the sink's life: its connection (and TLS session) is
                    # kept between batches, so a heartbeat costs one request, not a handshake.
                    self._client = httpx.AsyncClient(timeout=self.timeout)
                response = await self._client.post(
                    self.url, content=data, headers=headers, timeout=self.timeout
                )
                status = response.status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            if isinstance(status, int) and status < 300:
                self.sent_bytes += len(data)
                return
            if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
                log.error(
                    "telemetry POST refused; batch dropped",
                    extra={
                        "url": self.url,
                        "status": status,
                        "samples": len(batch),
                        "error": _said(response),
                    },
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

    async def close(self) -> None:
        """Close the connection this sink opened (not a client it was given)."""
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None


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
    """One node's agent. ``kernel`` is a kernel log file reader, a journal reader, a
    ``/dev/kmsg`` reader, or None; ``collector`` is None on a node read for its kernel
    messages only (no GPU, or ``--no-gpu``)."""

    def __init__(
        self,
        *,
        node: str,
        collector: NvmlCollector | None,
        sinks: Sequence[Sink],
        interval: float,
        kernel: KernelSource | None = None,
        catalogue: Catalogue | None = None,
        heartbeat: float = 0.0,
        kmsg_state: Path | None = None,
    ) -> None:
        self.node = node
        self.collector = collector
        self.sinks = list(sinks)
        self.interval = interval
        self.kernel = kernel
        self.catalogue = catalogue or Catalogue.load()
        self.heartbeat = heartbeat  # seconds between heartbeats; 0: none
        self.kmsg_state = kmsg_state
        # Files and HTTP receivers get heartbeats (see the module docstring).
        self._beating = [sink for sink in self.sinks if isinstance(sink, FileSink)]
        self._posting = any(isinstance(sink, HttpSink) for sink in self.sinks)
        self._beat_write: asyncio.Future[None] | None = None
        self.changes = ChangeFilter()
        self._queues: list[asyncio.Queue[Batch | None]] = [asyncio.Queue() for _ in self.sinks]
        self._kernel_lines = 0
        self._kernel_record = KernelRecord()

    async def once(self) -> list[TelemetrySample]:
        """One full sample per GPU, sent to every sink."""
        samples = await self.collector.read() if self.collector is not None else []
        await self._deliver(samples)
        return samples

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until ``stop`` is set, then flush what is queued and return."""
        producers: list[asyncio.Task[None]] = []
        if self.collector is not None:
            first = await self.collector.read()
            self.changes.news(first)
            self._emit(first)
        writers = [
            asyncio.create_task(self._writer(sink, queue), name=f"agent-writer-{i}")
            for i, (sink, queue) in enumerate(zip(self.sinks, self._queues, strict=True))
        ]
        if self.collector is not None:
            producers.append(asyncio.create_task(self._poll(), name="agent-poll"))
            producers.append(asyncio.create_task(self._xids(), name="agent-xid"))
        if self.kernel is not None:
            producers.append(asyncio.create_task(self._kernel(), name="agent-kernel"))
        if self.heartbeat > 0 and self._beating:
            producers.append(asyncio.create_task(self._heartbeats(), name="agent-heartbeat"))
        if self.heartbeat > 0 and self._posting:
            producers.append(asyncio.create_task(self._post_beats(), name="agent-post-beat"))
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
            if self._posting:
                # A clean stop is said to the receiver: a stopped agent is not a dead node.
                self._emit_http(Batch(beat=self._beat(stopping=True)))
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
            if isinstance(self.kernel, KmsgReader):
                self.kernel.close()
            for poster in self.sinks:
                if isinstance(poster, HttpSink):
                    with contextlib.suppress(httpx.HTTPError, OSError):
                        await poster.close()

    def _emit(self, samples: list[TelemetrySample] | None) -> None:
        """Queue ``samples`` for every sink (None: the last batch, then the writers end)."""
        for queue in self._queues:
            queue.put_nowait(None if samples is None else Batch(samples=list(samples)))

    def _emit_http(self, batch: Batch) -> None:
        """Queue ``batch`` for the HTTP receivers only."""
        for sink, queue in zip(self.sinks, self._queues, strict=True):
            if isinstance(sink, HttpSink):
                queue.put_nowait(batch)

    def _emit_local(self, samples: list[TelemetrySample]) -> None:
        """Queue ``samples`` for the file and stdout sinks only."""
        for sink, queue in zip(self.sinks, self._queues, strict=True):
            if not isinstance(sink, HttpSink):
                queue.put_nowait(Batch(samples=list(samples)))

    def _beat(self, *, stopping: bool = False) -> HeartbeatLine:
        kernel = self.kernel
        source = None
        seq = None
        lost = 0
        if isinstance(kernel, KmsgReader):
            source, seq, lost = "kmsg", kernel.stats.last_seq, kernel.stats.lost
        elif isinstance(kernel, JournalReader):
            source = "journal"
        elif isinstance(kernel, KernelLogFile):
            source = "file"
        return HeartbeatLine(
            node=self.node,
            time=datetime.now(UTC),
            pid=os.getpid(),
            stopping=stopping,
            kernel_source=source,
            kmsg_seq=seq,
            kernel_lost=lost,
        )

    async def _post_beats(self) -> None:
        """A heartbeat line to each HTTP receiver every ``heartbeat`` seconds."""
        while True:
            self._emit_http(Batch(beat=self._beat()))
            await asyncio.sleep(self.heartbeat)

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
        assert self.collector is not None
        while True:
            await asyncio.sleep(self.interval)
            news = self.changes.news(await self.collector.read())
            if news:
                self._emit(news)

    async def _xids(self) -> None:
        assert self.collector is not None
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
        elif isinstance(kernel, KmsgReader):
            await self._kmsg(kernel)
        elif isinstance(kernel, JournalReader):
            while True:
                try:
                    async for line in kernel.follow():
                        # journalctl -k gives journald's kernel transport, which also holds
                        # what root wrote to /dev/kmsg (SYSLOG_FACILITY=1): never the kernel's.
                        if line.kernel:
                            self._take_kernel([line], trusted=True)
                except KernelLogError as exc:
                    log.warning("journal read failed", extra={"error": exc.message})
                await asyncio.sleep(self.interval)

    async def _kmsg(self, kernel: KmsgReader) -> None:
        """Read /dev/kmsg when it has something (poll(2) on the device), a file or FIFO of
        records every quarter of a second."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        watched = False
        if kernel.device:
            loop.add_reader(kernel.fileno(), ready.set)
            watched = True
        said_lost = 0
        try:
            while True:
                records = kernel.read()
                if records:
                    self._take_kmsg(kernel, records)
                if kernel.stats.lost > said_lost:
                    log.warning(
                        "kernel records overwritten before they were read",
                        extra={"lost": kernel.stats.lost - said_lost},
                    )
                    said_lost = kernel.stats.lost
                if watched:
                    ready.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ready.wait(), 5)
                else:
                    await asyncio.sleep(0.25)
        finally:
            if watched:
                loop.remove_reader(kernel.fileno())

    def _take_kmsg(self, kernel: KmsgReader, records: list[KmsgRecord]) -> None:
        lines = kernel.lines(records)
        if self._posting:
            self._emit_http(
                Batch(
                    kernel=[
                        KernelRecordLine(
                            node=self.node,
                            source="kmsg",
                            facility=r.facility,
                            level=r.level,
                            seq=r.seq,
                            usec=r.usec,
                            time=line.time or datetime.now(UTC),
                            text=r.text,
                        )
                        for r, line in zip(records, lines, strict=True)
                    ]
                )
            )
        self._take_kernel(lines, trusted=True, post=False)
        if self.kmsg_state is not None and kernel.stats.last_seq is not None:
            try:
                save_kmsg_state(self.kmsg_state, kernel.stats.last_seq)
            except OSError as exc:
                log.warning("kmsg state not saved", extra={"error": str(exc)})

    def _take_kernel(
        self, lines: list[KernelLine], *, trusted: bool = False, post: bool = True
    ) -> None:
        """Match ``lines`` against the catalogue; their samples go to every sink, or with
        ``post`` False (the records themselves went to the HTTP receivers) to the file and
        stdout sinks only. A trusted journal line (the kernel's transport, facility 0) goes
        to the receivers whole."""
        if not lines:
            return
        if trusted and post and self._posting:
            self._emit_http(
                Batch(
                    kernel=[
                        KernelRecordLine(
                            node=self.node,
                            source="journal",
                            facility=0,
                            level=line.level if line.level is not None else 6,
                            time=line.time or datetime.now(UTC),
                            text=line.text,
                        )
                        for line in lines
                    ]
                )
            )
            post = False
        samples = kernel_samples(
            lines,
            self.catalogue,
            collector=self.collector,
            first_line_no=self._kernel_lines + 1,
            record=self._kernel_record,
        )
        self._kernel_lines += len(lines)
        if samples:
            if post:
                self._emit(samples)
            else:
                self._emit_local(samples)

    async def _writer(self, sink: Sink, queue: asyncio.Queue[Batch | None]) -> None:
        """Send what is queued for ``sink``, batching what piled up while it was busy."""
        while True:
            first = await queue.get()
            done = first is None
            batch = Batch()
            if first is not None:
                batch.add(first)
            while not queue.empty():
                more = queue.get_nowait()
                if more is None:
                    done = True
                else:
                    batch.add(more)
            await self._send(sink, batch)
            if done:
                return

    async def _deliver(self, samples: list[TelemetrySample]) -> None:
        for sink in self.sinks:
            await self._send(sink, Batch(samples=samples))

    @staticmethod
    async def _send(sink: Sink, batch: Batch) -> None:
        try:
            if isinstance(sink, HttpSink):
                await sink.send_batch(batch)
            elif batch.samples:
                await sink.send(batch.samples)
        except OSError as exc:
            log.error(
                "telemetry sink failed", extra={"sink": type(sink).__name__, "error": str(exc)}
            )


def _said(response: httpx.Response) -> str:
    """The start of a receiver's answer (its error), for the log."""
    try:
        return response.text[:300]
    except (UnicodeDecodeError, httpx.HTTPError):
        return ""


def load_kmsg_state(path: Path) -> int | None:
    """The last /dev/kmsg sequence number an earlier run of this boot sent on, or None (no
    file, another boot, unreadable)."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("boot_id") != boot_id():
        return None
    seq = saved.get("seq")
    return seq if isinstance(seq, int) and seq >= 0 else None


def save_kmsg_state(path: Path, seq: int) -> None:
    """Remember ``seq`` for this boot (written aside, then renamed over the old file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps({"boot_id": boot_id(), "seq": seq}) + "\n")
    os.replace(temporary, path)
