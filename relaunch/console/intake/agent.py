"""Node agents' batches: ``POST /intake/agent``, where ``relaunch agent --post`` sends.

Each node's agent has a token of role ``agent`` named after its node (``relaunch console
token NODE --role agent``): every line of a request must name that node, so a node cannot
speak for another. The body is JSON lines (relaunch/models/agentwire.py): the kernel's own
records, heartbeats, and GPU telemetry samples. A request is checked whole (token, size,
every line, the sender's rate) before anything of it is written; a refusal is a 4xx naming
the line at fault, never a traceback.

Where it lands (the cluster's own configuration, so the watcher reads it as it reads any node):

- kernel records: appended to the node's kernel log, ``node_log_pattern``, one line each in the
  syslog form ``<RFC 3339 time> <node> kernel: <message>`` that the watcher already reads as
  a trusted kernel source (relaunch/detection/kernel_lines.py). Only records of facility 0
  (LOG_KERN) are taken: the agent reads them from /dev/kmsg (or journald's kernel transport),
  where no user-space process can write facility 0, and a line of any other facility is
  refused whole. The message is the kernel's, escaped by the kernel: a control character in
  it is refused too (a line written here is one line).
- samples: appended to the node's ``telemetry_pattern`` file, as ``relaunch agent --output``
  would (dropped, and said in the answer, when the cluster has no telemetry_pattern).
- every request: the node's agent status, ``<kernel log>.agent.json`` (the last batch's time,
  the agent's pid, the kmsg sequence number, records lost and dropped), read by
  ``relaunch agents``; a heartbeat also replaces the ``heartbeat`` file beside the node's
  telemetry file, so the watcher reports an agent that falls silent, and a clean stop
  (``stopping``) removes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relaunch.connectors.telemetry.files import append_bytes, append_samples
from relaunch.connectors.telemetry.heartbeat import (
    heartbeat_path,
    remove_heartbeat,
    write_heartbeat,
)
from relaunch.console.auth import ConsoleRole
from relaunch.console.intake.common import (
    IntakeRefused,
    authorize,
    limit,
    read_body,
    refusal_response,
    target_cluster,
    unavailable,
)
from relaunch.console.web import console
from relaunch.models.agentwire import HeartbeatLine, KernelRecordLine
from relaunch.models.bundle import TelemetrySample

log = logging.getLogger("relaunch.console.intake")

M = TypeVar("M", bound=BaseModel)
STATUS_SUFFIX = ".agent.json"
LINES_PER_EVENT = 100  # a request costs one event of the sender's rate per started 100 lines
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass
class AgentBatch:
    """One request's lines, checked."""

    samples: list[TelemetrySample] = field(default_factory=list)
    kernel: list[KernelRecordLine] = field(default_factory=list)
    beat: HeartbeatLine | None = None

    @property
    def lines(self) -> int:
        return len(self.samples) + len(self.kernel) + (self.beat is not None)


def parse_batch(body: bytes, node: str) -> AgentBatch:
    """The lines of a request from ``node``'s agent; IntakeRefused naming the first line at
    fault: not JSON (400), another node's (403), an unknown shape or a field out of bounds
    (422), a kernel record of another facility than the kernel's (422)."""
    batch = AgentBatch()
    for no, raw in enumerate(body.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"line {no}"
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise IntakeRefused(400, f"{where} is not valid JSON", where) from None
        if not isinstance(obj, dict):
            raise IntakeRefused(422, f"{where} is not a JSON object", where)
        said = obj.get("node")
        if said != node:
            raise IntakeRefused(
                403,
                f"the agent token of node {node} may report node {node} only ({where} names "
                f"{str(said)[:64]!r}): nothing of this request was written",
                f"{where}.node",
            )
        kind = obj.get("record")
        if kind == "kernel":
            record = _validate(KernelRecordLine, obj, where)
            if record.facility != 0:
                raise IntakeRefused(
                    422,
                    f"{where}: facility {record.facility} is not the kernel's (0); only the "
                    "kernel's own messages are taken",
                    f"{where}.facility",
                )
            if _CONTROL.search(record.text):
                raise IntakeRefused(
                    422, f"{where}: the message holds a control character", f"{where}.text"
                )
            batch.kernel.append(record)
        elif kind == "heartbeat":
            batch.beat = _validate(HeartbeatLine, obj, where)
        elif kind is None:
            batch.samples.append(_validate(TelemetrySample, obj, where))
        else:
            raise IntakeRefused(
                422,
                f"{where}: unknown record {str(kind)[:32]!r} (kernel, heartbeat, or a sample)",
                f"{where}.record",
            )
    if batch.lines == 0:
        raise IntakeRefused(400, "the body holds no line", "body")
    return batch


def _validate(model: type[M], obj: dict[str, object], where: str) -> M:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = ".".join(str(p) for p in first["loc"]) or "line"
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise IntakeRefused(422, f"{where}: {name}: {msg}", f"{where}.{name}") from None


def kernel_log_line(record: KernelRecordLine) -> str:
    """A kernel record as the line the watcher reads: a syslog line tagged ``kernel:``."""
    stamp = record.time.astimezone(UTC).isoformat(timespec="microseconds")
    return f"{stamp} {record.node} kernel: {record.text}\n"


def status_path(kernel_log: str | os.PathLike[str]) -> Path:
    """Where the receiver keeps a node agent's status: beside its kernel log."""
    path = Path(kernel_log)
    return path.with_name(path.name + STATUS_SUFFIX)


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` in one write on an O_APPEND descriptor (a reader sees whole lines);
    the folder and the file are the service's own (0750, 0640), never a link."""
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    append_bytes(path, data, mode=0o640, nofollow=True)


def _replace(path: Path, obj: dict[str, object]) -> None:
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(temporary, flags, 0o640)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


def write_batch(
    batch: AgentBatch,
    node: str,
    *,
    kernel_log: str,
    telemetry: str | None,
    remote: str | None,
    now: datetime,
) -> dict[str, object]:
    """Write one checked batch where the watcher reads it; what was written, for the answer."""
    if batch.kernel:
        _append(Path(kernel_log), "".join(map(kernel_log_line, batch.kernel)).encode())
    written: dict[str, object] = {"kernel": len(batch.kernel), "samples": 0}
    if batch.samples and telemetry is not None:
        append_samples(telemetry, batch.samples)
        written["samples"] = len(batch.samples)
    elif batch.samples:
        written["note"] = "the cluster has no telemetry_pattern: samples not kept"
    beat = batch.beat
    if beat is not None and telemetry is not None:
        beating = heartbeat_path(telemetry)
        if beat.stopping:
            remove_heartbeat(beating)
        else:
            write_heartbeat(beating, node, now)
    state = status_path(kernel_log)
    status: dict[str, object] = {}
    try:
        previous = json.loads(state.read_text())
        status = previous if isinstance(previous, dict) else {}
    except (OSError, ValueError):
        pass
    status.update({"node": node, "last_batch": now.isoformat(), "remote": remote})
    if batch.kernel:
        status["last_kernel_record"] = batch.kernel[-1].time.isoformat()
        status["kernel_records"] = int(str(status.get("kernel_records", 0))) + len(batch.kernel)
    if beat is not None:
        status.update(
            {
                "last_heartbeat": now.isoformat(),
                "agent_time": beat.time.isoformat(),
                "pid": beat.pid,
                "stopped": beat.stopping,
                "kernel_source": beat.kernel_source,
                "kmsg_seq": beat.kmsg_seq,
                "kernel_lost": beat.kernel_lost,
                "dropped": beat.dropped,
            }
        )
    _replace(state, status)
    written["heartbeat"] = beat is not None
    return written


async def agent_batch(request: Request) -> Response:
    c = console(request)
    try:
        user = authorize(request, c, ConsoleRole.AGENT)
        node = user.name
        cl = target_cluster(request, c, user)
        batch = parse_batch(await read_body(request), node)
        limit(request, c, user, 1 + (batch.lines - 1) // LINES_PER_EVENT)
    except IntakeRefused as exc:
        return refusal_response(exc)
    pattern = cl.config.node_log_pattern
    if not pattern:
        return unavailable(
            f"cluster {cl.name} has no node_log_pattern: this console has nowhere to write "
            "node kernel logs (docs/agent.md)"
        )
    telemetry = cl.config.telemetry_pattern
    locks: dict[str, asyncio.Lock] | None = getattr(request.app.state, "agent_locks", None)
    if locks is None:
        locks = request.app.state.agent_locks = {}
    lock = locks.setdefault(f"{cl.name}/{node}", asyncio.Lock())
    try:
        async with lock:
            written = await asyncio.to_thread(
                write_batch,
                batch,
                node,
                kernel_log=pattern.replace("{node}", node),
                telemetry=telemetry.replace("{node}", node) if telemetry else None,
                remote=request.client.host if request.client else None,
                now=datetime.now(UTC),
            )
    except OSError as exc:
        log.warning("agent batch of %s not written: %s", node, exc.strerror or exc)
        return unavailable(f"not written, retry later: {exc.strerror or type(exc).__name__}")
    return JSONResponse({"node": node, "cluster": cl.name, "written": written})


def agent_statuses(node_log_pattern: str) -> list[dict[str, object]]:
    """Every node agent's status the receiver keeps under ``node_log_pattern``, by node."""
    pattern = Path(status_path(node_log_pattern.replace("{node}", "*")))
    rows: list[dict[str, object]] = []
    for path in sorted(Path(pattern.anchor).glob(str(pattern.relative_to(pattern.anchor)))):
        try:
            row = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(row, dict) and isinstance(row.get("node"), str):
            rows.append(row)
    return sorted(rows, key=lambda r: str(r["node"]))


def routes() -> list[Route]:
    return [Route("/intake/agent", agent_batch, methods=["POST"])]
