"""Reading and writing incident bundles on disk (format in relaunch.models.bundle)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ValidationError

from relaunch.connectors.files import write_atomic
from relaunch.models.bundle import (
    HEALTH_FILE,
    UNTRUSTED_HEALTH_FILE,
    Bundle,
    BundleJob,
    HealthReport,
    TelemetrySample,
)
from relaunch.models.errors import RelaunchError

# A job log up to this size is held in memory as text; a bigger one is read from disk.
INLINE_LOG_BYTES = 4 << 20


class BundleError(RelaunchError):
    """A bundle directory is missing or malformed."""


def write_bundle(
    path: Path,
    job: BundleJob,
    job_log: str,
    node_logs: dict[str, str] | None = None,
    telemetry: list[TelemetrySample] | None = None,
    health: list[HealthReport] | None = None,
) -> Path:
    """Write (or overwrite, atomically per file) a bundle directory. Health events go to
    ``health.jsonl`` or ``health-untrusted.jsonl`` by their sender's trust."""
    write_atomic(path / "job.json", job.model_dump_json(indent=2, exclude_none=True))
    write_atomic(path / "logs" / "job.log", job_log)
    for node, text in (node_logs or {}).items():
        write_atomic(path / "nodes" / f"{node}.log", text)
    if telemetry:
        write_atomic(
            path / "telemetry.jsonl",
            "".join(s.model_dump_json(exclude_none=True) + "\n" for s in telemetry),
        )
    for name, trusted in ((HEALTH_FILE, True), (UNTRUSTED_HEALTH_FILE, False)):
        lines = [r for r in health or [] if r.trusted is trusted]
        if lines:
            write_atomic(
                path / name, "".join(r.model_dump_json(exclude_none=True) + "\n" for r in lines)
            )
    return path


def _read_health(path: Path) -> list[HealthReport]:
    """Both health files; a line's trust is its file's, whatever the line says."""
    out: list[HealthReport] = []
    for name, trusted in ((HEALTH_FILE, True), (UNTRUSTED_HEALTH_FILE, False)):
        file = path / name
        if not file.is_file():
            continue
        for no, line in enumerate(file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                report = HealthReport.model_validate(json.loads(line))
            except (ValueError, ValidationError) as exc:
                raise BundleError(f"{file}:{no}: not a health event ({exc})") from exc
            out.append(report.model_copy(update={"trusted": trusted}))
    return out


def read_bundle(path: Path) -> Bundle:
    """Load a bundle, with a clear error naming what is wrong."""
    job_file = path / "job.json"
    if not job_file.is_file():
        raise BundleError(f"{path}: not an incident bundle (no job.json)")
    try:
        job = BundleJob.model_validate_json(job_file.read_text())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BundleError(f"{job_file}: {where}: {first['msg']}") from exc
    log_file = path / "logs" / "job.log"
    job_log, job_log_file = "", None
    if log_file.is_file():
        with log_file.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > INLINE_LOG_BYTES:
                # Attribution reads a big log from disk in chunks; only its end is held here.
                fh.seek(size - INLINE_LOG_BYTES)
                job_log_file = str(log_file)
            job_log = fh.read(INLINE_LOG_BYTES).decode("utf-8", errors="replace")
    node_logs = {}
    nodes_dir = path / "nodes"
    if nodes_dir.is_dir():
        for f in sorted(nodes_dir.glob("*.log")):
            node_logs[f.stem] = f.read_text(errors="replace")
    telemetry = []
    tele_file = path / "telemetry.jsonl"
    if tele_file.is_file():
        for no, line in enumerate(tele_file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                telemetry.append(TelemetrySample.model_validate(json.loads(line)))
            except (ValueError, ValidationError) as exc:
                raise BundleError(f"{tele_file}:{no}: not a telemetry sample ({exc})") from exc
    return Bundle(
        path=str(path),
        job=job,
        job_log=job_log,
        job_log_file=job_log_file,
        node_logs=node_logs,
        telemetry=telemetry,
        health=_read_health(path),
    )
