"""Evidence logs from a log store (Loki, VictoriaLogs) instead of files: the job's output and
each allocated node's kernel log, from the job's start until now, as bundle text."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

from relaunch.connectors.logstores.base import LogLine, LogStore, job_selector, node_selector
from relaunch.models.scheduler import Job

# A job the scheduler reports without a start time: look back this far.
UNSTARTED_WINDOW = timedelta(hours=24)
_STAMPED = re.compile(r"\s*\d{4}-\d\d-\d\d[T ]\d\d:\d\d")


def _job_text(lines: list[LogLine]) -> str:
    return "".join(line.text.rstrip("\n") + "\n" for line in lines)


def _kernel_text(lines: list[LogLine]) -> str:
    """Kernel lines as a syslog file shows them: a line the collector stored without its own
    time gets the store's time in front, so the fault time can still be read from it."""
    out = []
    for line in lines:
        text = line.text.rstrip("\n")
        if not _STAMPED.match(text):
            text = f"{line.time.isoformat()} {text}"
        out.append(text + "\n")
    return "".join(out)


async def fetch_evidence_logs(
    store: LogStore, cluster: str, job: Job, *, now: datetime | None = None
) -> tuple[str, dict[str, str]]:
    """``(job_log, node_logs)`` for the bundle: the newest ``job_lines`` of the job's output and
    the newest ``node_lines`` of each node's kernel log since the job (this attempt) started."""
    settings = store.settings
    end = now or datetime.now(UTC)
    start = job.start_time or end - UNSTARTED_WINDOW
    selectors = {node: node_selector(settings, cluster, node) for node in job.nodes}
    job_lines, *node_lines = await asyncio.gather(
        store.fetch(
            job_selector(settings, cluster, job.job_id), start, end, settings.job_lines, newest=True
        ),
        *(
            store.fetch(selector, start, end, settings.node_lines, newest=True)
            for selector in selectors.values()
            if selector is not None
        ),
    )
    nodes = [node for node, selector in selectors.items() if selector is not None]
    node_logs = {
        node: _kernel_text(lines) for node, lines in zip(nodes, node_lines, strict=True) if lines
    }
    return _job_text(job_lines), node_logs
