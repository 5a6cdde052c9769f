"""The health events of an attempt's nodes, for its evidence bundle.

The console records every health event pushed in (``POST /intake/health``) before it starts or
joins a recovery, so the evidence reads them from the audit trail: every event on one of the
attempt's nodes from shortly before the attempt started, whichever detection opened the
recovery. The trust of each is what the console recorded from the sender's token; the latest
events of trusted senders and those of the others are read apart, each bounded, so that a flood
of untrusted events never pushes a trusted one out of the evidence."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.detection.findings import CLOCK_SKEW, NODE_LOOKBACK
from relaunch.models.bundle import HealthReport
from relaunch.models.scheduler import Job

HEALTH_KIND = "health_event"
MAX_HEALTH_EVIDENCE = 200  # trusted senders' events read into one bundle: the latest
MAX_UNTRUSTED_EVIDENCE = 100  # and the other senders': the latest, apart
# Without a start or submit time, the events of this long before the evidence is gathered.
UNDATED_LOOKBACK = timedelta(hours=1)


def health_reports(rows: list[StoredEvent]) -> list[HealthReport]:
    """The reports of ``health_event`` rows, each timed by its sender where that is close to
    when the console received it (a sender's clock far off, or a retry hours late, must not
    age the event out of the incident's window), else by its receipt."""
    out: list[HealthReport] = []
    for row in rows:
        if row.kind != HEALTH_KIND or not isinstance(row.data.get("report"), dict):
            continue
        try:
            report = HealthReport.model_validate(row.data["report"])
        except ValidationError:
            continue  # a row another version wrote: not evidence
        said = report.time
        plausible = said is not None and row.at - NODE_LOOKBACK <= said <= row.at + CLOCK_SKEW
        out.append(
            report.model_copy(
                update={
                    "time": said if plausible else row.at,
                    "trusted": row.data.get("trusted") is True,
                }
            )
        )
    return out


async def health_evidence(audit: AuditStore, cluster: str, job: Job) -> list[HealthReport]:
    """The health events recorded for the job's nodes during this attempt."""
    if not job.nodes:
        return []
    start = job.start_time or job.submit_time or datetime.now(UTC) - UNDATED_LOOKBACK
    # Trusted and untrusted senders' events are read apart, each its own latest rows: however
    # many events an untrusted sender pushes in, they never crowd a trusted one out.
    rows = [
        row
        for trusted, limit in ((True, MAX_HEALTH_EVIDENCE), (False, MAX_UNTRUSTED_EVIDENCE))
        for row in await audit.outside_events(
            cluster,
            start - NODE_LOOKBACK,
            kinds=(HEALTH_KIND,),
            nodes=job.nodes,
            limit=limit,
            trusted=trusted,
        )
    ]
    return health_reports(sorted(rows, key=lambda row: row.id))
