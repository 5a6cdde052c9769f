"""``POST /intake/alertmanager``: Alertmanager's webhook. An alert points and never convicts
(docs/trust.md): a detection of source ``alert`` only for a job that already ended abnormally;
a job still running is left alone."""

from __future__ import annotations

import logging
import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from relaunch.console.intake.common import (
    MAX_ALERTS,
    IntakeRefused,
    Target,
    already_delivered,
    authorize,
    candidates,
    cluster_jobs,
    deliver_all,
    json_body,
    limit,
    make_detection,
    parse_model,
    record_row,
    refusal_response,
    target_cluster,
    trim,
    unavailable,
)
from relaunch.console.web import console
from relaunch.models.errors import InvalidNameError, RelaunchError
from relaunch.models.intake import (
    Alert,
    AlertmanagerPayload,
    AlertStatus,
)
from relaunch.models.intake import intake_incident as intake_incident  # where intake rows go
from relaunch.models.recovery import DetectionSource
from relaunch.models.scheduler import Job

log = logging.getLogger("relaunch.console.intake.alertmanager")
_ALERTNAME = re.compile(r"[A-Za-z0-9_:.-]{1,100}")


def _check_alert(i: int, alert: Alert) -> tuple[str | None, str | None]:
    if not _ALERTNAME.fullmatch(alert.name):
        raise IntakeRefused(
            422, f"invalid alertname {alert.name!r}", f"alerts.{i}.labels.alertname"
        )
    try:
        node = alert.node()
    except InvalidNameError as exc:
        label = next(
            lb for lb in ("Hostname", "hostname", "node", "instance") if alert.labels.get(lb)
        )
        raise IntakeRefused(422, exc.message, f"alerts.{i}.labels.{label}") from exc
    try:
        job_id = alert.job_id()
    except InvalidNameError as exc:
        label = "slurm_job_id" if alert.labels.get("slurm_job_id") else "job"
        raise IntakeRefused(422, exc.message, f"alerts.{i}.labels.{label}") from exc
    return node, job_id


def _alert_row(payload: AlertmanagerPayload, alert: Alert) -> dict[str, object]:
    return {
        "source": "alertmanager",
        "receiver": trim(payload.receiver, 100),
        "group_key": trim(payload.groupKey, 200),
        "status": alert.status.value,
        "trusted": False,  # an alert points at a node or job; it never convicts (docs/trust.md)
        "fingerprint": alert.key,
        "starts_at": alert.startsAt.isoformat(),
        "labels": {trim(k, 60): trim(v, 200) for k, v in list(alert.labels.items())[:30]},
        "annotations": {trim(k, 60): trim(v, 500) for k, v in list(alert.annotations.items())[:10]},
    }


async def alertmanager(request: Request) -> Response:
    c = console(request)
    try:
        user = authorize(request, c)
        cl = target_cluster(request, c, user)
        payload: AlertmanagerPayload = parse_model(AlertmanagerPayload, await json_body(request))
        if len(payload.alerts) > MAX_ALERTS:
            raise IntakeRefused(
                422,
                f"at most {MAX_ALERTS} alerts in one notification (set max_alerts in "
                "Alertmanager's webhook_config)",
                "alerts",
            )
        checked = [_check_alert(i, a) for i, a in enumerate(payload.alerts)]
        limit(request, c, user, max(1, len(payload.alerts)))
    except IntakeRefused as exc:
        return refusal_response(exc)
    report: list[dict[str, object]] = []
    try:
        jobs: list[Job] | None = None
        for alert, (node, job_id) in zip(payload.alerts, checked, strict=True):
            key = f"am:{alert.key}:{alert.startsAt.isoformat()}"
            summary = f"alert {alert.name} {alert.status.value}" + (f" on {node}" if node else "")
            status_key = key if alert.status is AlertStatus.FIRING else f"{key}:resolved"
            new = await record_row(
                c, cl, summary, status_key, _alert_row(payload, alert), [node] if node else []
            )
            entry: dict[str, object] = {
                "alert": alert.name,
                "fingerprint": alert.key,
                "status": alert.status.value,
                "recorded": new,
            }
            report.append(entry)
            if alert.status is AlertStatus.RESOLVED:
                entry["note"] = "resolved: recorded, no action"
                continue
            if node is None and job_id is None:
                entry["note"] = "names no node or Slurm job: recorded, no action"
                continue
            if await already_delivered(c, cl, key):
                entry["note"] = "already delivered"
                continue
            jobs = jobs if jobs is not None else await cluster_jobs(cl)
            found = candidates(cl, jobs, node, job_id)
            # An alert is the sender's say-so, whoever wrote its labels: it points a recovery
            # at a node (source `alert`, never trusted), and it never restarts by itself a job
            # that has not ended abnormally (docs/trust.md).
            targets = [
                Target(
                    detection=make_detection(
                        cl,
                        job,
                        nodes,
                        DetectionSource.ALERT,
                        f"alert:{alert.name}",
                        alert.text(),
                        alert.startsAt,
                    ),
                    source_key=key,
                )
                for job, nodes in found
                if job.state.is_abnormal_end
            ]
            pointed = [job.job_id for job, _ in found if not job.state.is_abnormal_end]
            if pointed:
                entry["pointed"] = pointed
                entry["note"] = (
                    f"points at job {', '.join(pointed)}, still {found[0][0].state.value}: "
                    "recorded, no action (an alert alone restarts no running job)"
                )
            entry["detections"] = await deliver_all(c, cl, key, targets, summary)
    except RelaunchError as exc:
        log.warning("intake from alertmanager not delivered: %s", exc.message)
        return unavailable(f"not delivered, retry later: {exc.message}")
    except Exception as exc:  # Temporal unreachable, RPC errors: the sender retries on 5xx
        log.warning("intake from alertmanager not delivered: %s", type(exc).__name__)
        return unavailable(f"not delivered, retry later: {type(exc).__name__}")
    return JSONResponse({"accepted": len(payload.alerts), "alerts": report})
