"""An audit trail written the way the recoveries, node decisions and lifecycles write it: the
rows the scorecard judges (tests/unit/test_scorecard.py, the console's scorecard tests)."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

from relaunch.connectors.audit import AuditStore
from relaunch.models.recovery import AuditRecord

_ids = itertools.count(1)


class Trail:
    """Writes audit rows the way the recoveries, node decisions and lifecycles write them."""

    def __init__(self, store: AuditStore, cluster: str) -> None:
        self.store, self.cluster = store, cluster

    async def row(
        self,
        incident: str,
        kind: str,
        at: datetime,
        *,
        job_id: str = "",
        stage: str | None = None,
        nodes: list[str] | None = None,
        actor: str = "relaunch",
        **data: Any,
    ) -> None:
        await self.store.ensure_incident(incident, self.cluster, job_id, 0)
        await self.store.record(
            AuditRecord(
                incident_id=incident,
                kind=kind,
                at=at,
                actor=actor,
                stage=stage,
                nodes=nodes or [],
                summary=f"{kind} #{next(_ids)}",
                data=data,
            )
        )

    async def node_decision(
        self,
        node: str,
        at: datetime,
        *,
        category: str,
        partition: str,
        mode: str = "monitor",
        answer: str | None = "approve",
        diagnose_passed: bool | None = False,
        job: str | None = None,
    ) -> str:
        """A node decision: its plan, the operators' answer, the drain, and the node's lifecycle
        diagnosis (``diagnose_passed``: None, not diagnosed yet). ``job``: a joined recovery,
        requeued by it."""
        n = next(_ids)
        inc = f"relaunch-{self.cluster}-node-{node}-{n}"
        running = [{"job_id": job, "partition": partition}] if job else []
        await self.row(
            inc,
            "plan",
            at,
            nodes=[node],
            mode=mode,
            action="isolate_and_restart",
            category=category,
            drain_nodes=[node],
            node_plan={"partition": partition},
            report={"running": running},
        )
        acted = mode == "autonomous"
        if mode == "monitor":
            await self.row(inc, "stage", at, stage="awaiting_approval", nodes=[node])
            if answer == "approve":
                await self.row(inc, "approval", at + timedelta(seconds=5), actor="ana")
                acted = True
            elif answer == "reject":
                await self.row(inc, "rejection", at + timedelta(seconds=5), actor="bo")
                await self.row(inc, "stage", at + timedelta(seconds=5), stage="rejected")
            elif answer == "expire":
                await self.row(inc, "stage", at + timedelta(seconds=30), stage="expired")
        if acted:
            drained = at + timedelta(seconds=6)
            await self.row(
                inc, "action", drained, nodes=[node], step="drain", changed=True, target=node
            )
            life = f"relaunch-{self.cluster}-lifecycle-{node}-{n}"
            await self.row(life, "node_stage", drained, stage="drained", nodes=[node])
            if diagnose_passed is not None:
                await self.row(
                    life,
                    "checks",
                    drained + timedelta(seconds=5),
                    nodes=[node],
                    purpose="diagnose",
                    passed=diagnose_passed,
                )
        if job:
            rec = f"relaunch-{self.cluster}-{job}-0"
            await self.row(rec, "evidence", at, job_id=job, job={"partition": partition})
            await self.row(rec, "verdict", at, job_id=job, nodes=[node], category=category)
            await self.row(rec, "node_decision", at, job_id=job, requeue_by=inc)
            if acted:
                await self.row(
                    rec,
                    "action",
                    at + timedelta(seconds=7),
                    job_id=job,
                    step="restart",
                    changed=True,
                    target=job,
                )
                await self.row(rec, "verify", at + timedelta(seconds=9), job_id=job)
        return inc

    async def recovery(
        self,
        job: str,
        attempt: int,
        at: datetime,
        *,
        category: str,
        partition: str,
        action: str,
        mode: str = "monitor",
        answer: str | None = None,
        nodes: list[str] | None = None,
        verified: bool = True,
    ) -> str:
        """A job's own recovery: evidence, verdict, plan, the operators' answer, its action
        (``verified``: the restarted job was seen running)."""
        inc = f"relaunch-{self.cluster}-{job}-{attempt}"
        await self.row(inc, "evidence", at, job_id=job, nodes=nodes, job={"partition": partition})
        await self.row(inc, "verdict", at, job_id=job, category=category)
        if action == "none":
            await self.row(inc, "plan", at, job_id=job, mode=mode, action="none", category=category)
            return inc
        await self.row(inc, "plan", at, job_id=job, mode=mode, action=action, category=category)
        acted = mode == "autonomous" or action == "hold"
        if mode == "monitor" and action != "hold":
            await self.row(inc, "stage", at, job_id=job, stage="awaiting_approval")
            if answer == "approve":
                await self.row(inc, "approval", at, job_id=job, actor="ana")
                acted = True
            elif answer == "expire":
                await self.row(inc, "stage", at + timedelta(seconds=30), job=job, stage="expired")
        if acted:
            step = "hold" if action == "hold" else "restart"
            await self.row(
                inc, "action", at + timedelta(seconds=1), job_id=job, step=step, changed=True
            )
            if step == "restart" and verified:
                await self.row(inc, "verify", at + timedelta(seconds=2), job_id=job)
        return inc
