"""Node lifecycles as the console shows them (docs/lifecycle.md): a node's stage, the checks
that ran on it with their output, and the step that waits for a person, read from the
lifecycle's audit rows (``node_stage``, ``checks``, ``stage``, ``approval`` / ``rejection``).

Rows are written by other versions too: every field read here has a default, and a row that
does not parse is left out rather than failing the page.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ValidationError

from relaunch.connectors.audit import StoredEvent
from relaunch.models.lifecycle import LIFECYCLE_TERMINAL, parse_lifecycle_id
from relaunch.models.search_attributes import Stage

# The rows the nodes page reads of each node's latest lifecycle (the latest of each kind).
LIFECYCLE_KINDS = ("checks", "stage", "approval", "rejection")
DECISION_KINDS = frozenset({"approval", "rejection"})
TERMINAL_NODE_STAGES = frozenset(s.value for s in LIFECYCLE_TERMINAL)


class CheckResultView(BaseModel):
    """One check's result, as its `checks` row holds it."""

    id: str = "?"
    passed: bool = False
    skipped: bool = False
    detail: str = ""
    exit_code: int | None = None
    output: str = ""
    seconds: float = 0.0

    @property
    def result(self) -> str:
        return "skipped" if self.skipped else "passed" if self.passed else "failed"


class ChecksView(BaseModel):
    """One run of the checks on the node (a `checks` row)."""

    row_id: int
    at: datetime
    purpose: str = ""
    passed: bool = False
    state: str = ""
    summary: str = ""
    results: list[CheckResultView] = []

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.result == "failed")


class PendingView(BaseModel):
    """The step a lifecycle (or any incident) waits for a person to decide."""

    request_id: str = ""
    step: str = ""
    summary: str = ""
    at: datetime
    expires_at: datetime | None = None


class LifecycleView(BaseModel):
    """A node's latest lifecycle: its stage (the latest `node_stage` row), its latest checks,
    and the step waiting for a decision, if any."""

    id: str
    node: str
    stage: str
    at: datetime
    summary: str = ""
    checks: ChecksView | None = None
    pending: PendingView | None = None

    @property
    def terminal(self) -> bool:
        return self.stage in TERMINAL_NODE_STAGES


def checks_view(row: StoredEvent) -> ChecksView | None:
    """A `checks` row's run, or None when it does not hold one."""
    data: dict[str, Any] = row.data if isinstance(row.data, dict) else {}
    results: list[CheckResultView] = []
    raw = data.get("results")
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        try:
            results.append(CheckResultView.model_validate(item))
        except ValidationError:
            continue
    try:
        return ChecksView(
            row_id=row.id,
            at=row.at,
            purpose=str(data.get("purpose") or ""),
            passed=bool(data.get("passed", False)),
            state=str(data.get("state") or ""),
            summary=row.summary,
            results=results,
        )
    except ValidationError:
        return None


def pending_of(rows: Iterable[StoredEvent], timeout_s: float) -> PendingView | None:
    """The decision an incident waits for: its latest `stage` row is awaiting_approval and no
    approval or rejection came after it (or names its request). A lifecycle writes no stage
    row when a step is decided, so the latest stage row alone would keep it pending."""
    stage: StoredEvent | None = None
    decisions: list[StoredEvent] = []
    for row in rows:
        if row.kind == "stage" and (stage is None or row.id > stage.id):
            stage = row
        elif row.kind in DECISION_KINDS:
            decisions.append(row)
    if stage is None or stage.stage != Stage.AWAITING_APPROVAL.value:
        return None
    data: dict[str, Any] = stage.data if isinstance(stage.data, dict) else {}
    request = str(data.get("request_id") or "")
    for d in decisions:
        named = d.data.get("request_id") if isinstance(d.data, dict) else None
        if d.id > stage.id or (request and named == request):
            return None
    return PendingView(
        request_id=request,
        step=str(data.get("step") or ""),
        summary=stage.summary.removeprefix("recommend "),
        at=stage.at,
        expires_at=stage.at + timedelta(seconds=timeout_s),
    )


def lifecycle_views(
    stages: dict[str, StoredEvent], rows: Iterable[StoredEvent], timeout_s: float
) -> dict[str, LifecycleView]:
    """node → its latest lifecycle, from each node's latest `node_stage` row (``stages``,
    AuditStore.node_stages) and the latest rows of LIFECYCLE_KINDS of those lifecycles."""
    by_incident: dict[str, list[StoredEvent]] = {}
    for row in rows:
        by_incident.setdefault(row.incident_id, []).append(row)
    views: dict[str, LifecycleView] = {}
    for node, stage in stages.items():
        own = by_incident.get(stage.incident_id, [])
        checks = [c for c in (checks_view(r) for r in own if r.kind == "checks") if c]
        views[node] = LifecycleView(
            id=stage.incident_id,
            node=node,
            stage=str(stage.stage or ""),
            at=stage.at,
            summary=stage.summary,
            checks=max(checks, key=lambda c: c.row_id) if checks else None,
            pending=pending_of(own, timeout_s),
        )
    return views


def lifecycle_node(incident_id: str) -> str | None:
    """The node of a lifecycle's id (None for any other incident)."""
    parsed = parse_lifecycle_id(incident_id)
    return parsed[1] if parsed else None
