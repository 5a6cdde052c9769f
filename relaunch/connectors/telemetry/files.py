"""Telemetry as JSON lines in a file: the node agent appends, the watcher tails, the evidence
step reads the end of it.

In the dev stack each node's agent writes ``.relaunch/nodes/<node>/telemetry.jsonl`` on a
shared filesystem and the watcher reads every node's file with a :class:`TelemetryTail`; the
evidence step reads the job's nodes' files once with :func:`read_job_telemetry`.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from relaunch.connectors.joboutput import FileAccess, read_tail
from relaunch.connectors.logs import DEFAULT_MAX_READ, FileTail
from relaunch.detection.lines import MAX_LINE_BYTES, LineSplitter
from relaunch.models.bundle import TelemetrySample
from relaunch.models.scheduler import Job

log = logging.getLogger(__name__)


class TelemetryTail:
    """Incremental reader of a telemetry JSONL file.

    Each :meth:`read` returns the samples in the complete lines appended since the last call.
    A partial last line waits for its newline (the writer may be mid-write); a line that is not
    a valid sample is skipped and counted in ``malformed`` (``last_error`` says why). A missing
    file reads as empty; a truncated or replaced file is read again from its start. Never raises
    for the file's content.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        from_end: bool = False,
        max_read: int = DEFAULT_MAX_READ,
    ) -> None:
        self.path = Path(path)
        self._tail = FileTail.at_end(path, max_read=max_read) if from_end else FileTail(path)
        self._lines = LineSplitter()
        self.malformed = 0
        self.last_error: str | None = None

    @property
    def truncations(self) -> int:
        return self._tail.truncations

    def read(self) -> list[TelemetrySample]:
        """The samples appended since the last read (maybe none)."""
        before = self._tail.truncations
        data = self._tail.read()
        if self._tail.truncations != before:
            self._lines.reset()
        cut = self._lines.cut_lines
        out: list[TelemetrySample] = []
        for raw in self._lines.feed(data):
            if not raw.strip():
                continue
            try:
                out.append(TelemetrySample.model_validate(json.loads(raw)))
            except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
                self.malformed += 1
                self.last_error = f"{self.path}: not a telemetry sample: {_short(exc)}"
                log.warning("skipping a malformed telemetry line", extra={"path": str(self.path)})
        if self._lines.cut_lines != cut:  # its cut start was counted as malformed above
            self.last_error = f"{self.path}: a line longer than {MAX_LINE_BYTES} bytes"
        return out


def append_samples(path: str | os.PathLike[str], samples: list[TelemetrySample]) -> None:
    """Append ``samples`` to ``path`` as JSON lines, in one write, creating parent folders.

    One ``write`` on an ``O_APPEND`` descriptor keeps concurrent writers' lines whole.
    """
    if not samples:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(s.model_dump_json(exclude_none=True) + "\n" for s in samples).encode()
    append_bytes(target, data)


def append_bytes(path: Path, data: bytes, *, mode: int = 0o644, nofollow: bool = False) -> None:
    """Append ``data`` through one ``O_APPEND`` descriptor, written whole (a reader sees whole
    lines); ``nofollow`` refuses a link in place of the file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
    fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0), mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def attempt_samples(text: str, start: datetime | None) -> list[TelemetrySample]:
    """The samples in ``text`` (JSON lines) that matter to a job attempt started at ``start``:
    each GPU's last sample before the start (the baseline a counter must rise above), then
    every sample from the start on (and any without a time), in file order. A torn or foreign
    line is skipped: the agent's other lines still count. ``start`` None keeps every sample."""
    before: dict[int | None, TelemetrySample] = {}
    during: list[TelemetrySample] = []
    for line in text.splitlines():
        try:
            sample = TelemetrySample.model_validate_json(line)
        except ValueError:
            continue
        if start and sample.time and sample.time < start:
            before[sample.gpu] = sample
        else:
            during.append(sample)
    return [*before.values(), *during]


async def read_job_telemetry(
    job: Job, pattern: str | None, *, limit: int, timeout_s: float
) -> list[TelemetrySample]:
    """The job's nodes' agent samples (the last ``limit`` bytes of each node's file, the path
    ``pattern`` with ``{node}`` filled in): see :func:`attempt_samples`."""
    if not pattern:
        return []
    out: list[TelemetrySample] = []
    for node in job.nodes:
        read = await read_tail(
            pattern.format(node=node), FileAccess.operator_file(), limit, timeout_s=timeout_s
        )
        out += attempt_samples(read.text, job.start_time)
    return out


def _short(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


async def read_node_telemetry(
    node: str, pattern: str | None, *, limit: int, timeout_s: float
) -> list[TelemetrySample]:
    """The last ``limit`` bytes of one node's agent samples (every sample, torn lines skipped);
    none where no ``pattern`` is configured or the file is missing."""
    if not pattern:
        return []
    read = await read_tail(
        pattern.format(node=node), FileAccess.operator_file(), limit, timeout_s=timeout_s
    )
    return [s for s in attempt_samples(read.text, None) if s.node == node]
