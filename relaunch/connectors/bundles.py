"""Reading and writing incident bundles on disk (format in relaunch.models.bundle)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pydantic import ValidationError

from relaunch.models.bundle import Bundle, BundleJob, TelemetrySample
from relaunch.models.errors import RelaunchError

# A job log up to this size is held in memory as text; a bigger one is read from disk.
INLINE_LOG_BYTES = 4 << 20


class BundleError(RelaunchError):
    """A bundle directory is missing or malformed."""


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_bundle(
    path: Path,
    job: BundleJob,
    job_log: str,
    node_logs: dict[str, str] | None = None,
    telemetry: list[TelemetrySample] | None = None,
) -> Path:
    """Write (or overwrite, atomically per file) a bundle directory."""
    _atomic_write(path / "job.json", job.model_dump_json(indent=2, exclude_none=True))
    _atomic_write(path / "logs" / "job.log", job_log)
    for node, text in (node_logs or {}).items():
        _atomic_write(path / "nodes" / f"{node}.log", text)
    if telemetry:
        _atomic_write(
            path / "telemetry.jsonl",
            "".join(s.model_dump_json(exclude_none=True) + "\n" for s in telemetry),
        )
    return path


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
    )
