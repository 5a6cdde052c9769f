"""The node lifecycle's activities: look at the drained node, fence it off in a maintenance
reservation, run the health checks on it through Slurm, apply a rung of the remediation ladder,
hand it to repair, return it to service. Thin: Slurm, the audit trail and the repair webhook
do the work (relaunch/workflows/lifecycle.py orchestrates).

Each side effect reads fresh state first and verifies after, so a retried activity (a worker
killed mid-step) finds its work done rather than doing it twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pwd
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from temporalio import activity
from temporalio.service import RPCError

from relaunch.activities.deps import Deps, beat, keeps_heartbeating, typed_errors
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.maintenance import NodeMaintenance, RebootRefusedError
from relaunch.connectors.telemetry.files import read_node_telemetry
from relaunch.detection.health import (
    checks_for,
    describe_jobs,
    foreign_jobs,
    inconclusive_reason,
    judge,
    judge_counters,
    ladder_for,
    wrapped_argv,
)
from relaunch.models.errors import NodeNotFoundError, RelaunchError, SchedulerError
from relaunch.models.lifecycle import (
    CheckKind,
    CheckResult,
    CheckRun,
    ChecksInput,
    EscalateInput,
    EscalateResult,
    HoldInput,
    NodeJob,
    NodeStepInput,
    ReturnResult,
    Rung,
    RungInput,
    RungResult,
    StartInput,
    StartResult,
    reservation_name,
)
from relaunch.models.recovery import LIFECYCLE_REASON_PREFIX, RELAUNCH_REASONS
from relaunch.models.scheduler import NodeState

log = logging.getLogger("relaunch.activities.lifecycle")
TELEMETRY_READ = 1 << 20
WEBHOOK_TIMEOUT_S = 15.0
# A rebooted node counts as back once this many reads a second apart find it answering.
BACK_READS = 3
# A validation waits this long for a node that does not answer yet (just rebooted or repaired).
ANSWER_WAIT_S = 60.0
# How often the checks look again whether a draining node's jobs have ended.
CLEAR_POLL_S = 3.0


class RepairWebhookError(RelaunchError):
    """The repair webhook did not take the ticket (retried)."""

    retryable = True


def service_uids(names: Sequence[str]) -> frozenset[int]:
    """The uids of the service accounts ``names`` (those this host knows)."""
    uids = set()
    for name in names:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    return frozenset(uids)


def repair_reason(ticket: str) -> str:
    return f"{LIFECYCLE_REASON_PREFIX}repair {ticket}"


def hold_reason(why: str, lifecycle_id: str) -> str:
    return f"{LIFECYCLE_REASON_PREFIX}{why} ({lifecycle_id})"


class LifecycleActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def _maintenance(self) -> NodeMaintenance:
        sched = self.deps.scheduler
        if not isinstance(sched, SlurmCli):
            raise SchedulerError("this scheduler cannot run node maintenance (Slurm CLI needed)")
        return sched.maintenance()

    # ------------------------------------------------------------------ start

    @activity.defn(name="lifecycle_start")
    @typed_errors
    async def start(self, inp: StartInput) -> StartResult:
        """A fresh read of the node, the ladder for its fault, and whether it goes straight to
        repair: the catalogue says so, it is a lemon (returned by a lifecycle within the window
        and failing again), or it had the same fault too often in the window."""
        fault, settings = inp.fault, inp.settings
        try:
            node = await self.deps.scheduler.get_node(inp.node)
        except NodeNotFoundError:
            return StartResult(drained=False, state="not in Slurm", ladder=[])
        out = node.drain_flag or node.state is NodeState.DOWN or not node.responding
        ladder = ladder_for(settings, fault.remedy, fault.category)
        since = datetime.now(UTC) - timedelta(hours=settings.escalate_after_return_hours)
        history = await self.deps.audit.node_lifecycle_events(inp.cluster, inp.node, since)
        returned = [e for e in history if e.kind == "node_stage" and e.stage == "returned"]
        same = {
            e.incident_id
            for e in history
            if e.kind == "lifecycle_fault"
            and fault.kind
            and e.data.get("kind") == fault.kind
            and e.incident_id != inp.lifecycle_id
        }
        escalate = ""
        if fault.remedy == Rung.ESCALATE.value:
            escalate = "the Xid catalogue sends this fault to repair"
        elif returned:
            last = returned[-1]
            escalate = (
                f"returned to service by {last.incident_id} at {last.at:%Y-%m-%d %H:%M} and "
                f"failing again within {settings.escalate_after_return_hours:g} h"
            )
        elif fault.kind and len(same) + 1 >= settings.same_fault_escalates:
            escalate = (
                f"{fault.kind} {len(same) + 1} times within "
                f"{settings.escalate_after_return_hours:g} h"
            )
        else:
            escalate = await self._repeat_offender(inp)
        return StartResult(
            drained=out,
            state=node.display_state,
            reason=node.reason,
            ladder=ladder,
            escalate=escalate,
        )

    async def _repeat_offender(self, inp: StartInput) -> str:
        """Why the node is a repeat offender (its reputation: incidents that implicated it on
        trusted evidence within the policy's window), or ""."""
        policy = self.deps.config.policy
        since = datetime.now(UTC) - timedelta(hours=policy.repeat_offender_window_hours)
        reputation = await self.deps.audit.node_reputation(inp.cluster, since)
        rep = next((r for r in reputation if r.node == inp.node), None)
        if rep is None or rep.incidents < policy.repeat_offender_incidents:
            return ""
        return (
            f"a repeat offender: {rep.incidents} incidents implicated it within "
            f"{policy.repeat_offender_window_hours:g} h"
        )

    # ------------------------------------------------------------------ reservation

    @activity.defn(name="lifecycle_reserve")
    @typed_errors
    @keeps_heartbeating
    async def reserve(self, inp: NodeStepInput) -> str:
        """Fence the node off in its maintenance reservation (no user job starts there), then
        clear the drain so that the checks can run on it as Slurm steps, unless a job is still
        on it (a draining node is not drained yet: the checks wait for it). Returns the node's
        state after, from a fresh read."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_reserve")
        maint = self._maintenance()
        beat(f"reserve {inp.node}")
        await maint.reserve_node(reservation_name(inp.node), inp.node)
        busy = foreign_jobs(await maint.jobs_on_node(inp.node), inp.node)
        if busy:
            node = await self.deps.scheduler.get_node(inp.node)
            return f"{node.display_state}, still running {describe_jobs(busy)}"
        return await self._undrain(inp)

    async def _undrain(self, inp: NodeStepInput) -> str:
        """Clear the drain inside the reservation; the node's state after, from a fresh read."""
        node = await self.deps.scheduler.get_node(inp.node)
        if node.drain_flag and node.responding:  # a silent node stays drained: nothing runs there
            beat(f"undrain {inp.node} inside {reservation_name(inp.node)}")
            await self.deps.scheduler.resume_node(inp.node)
            node = await self.deps.scheduler.get_node(inp.node)
        return node.display_state

    async def _until_clear(self, inp: ChecksInput) -> list[NodeJob]:
        """Wait (up to the settings' drain_wait_s) until Slurm lists no job on the node but
        Relaunch's own; the jobs still there after it ([] once clear). A wait is recorded: why,
        and how long it took."""
        maint = self._maintenance()
        busy = foreign_jobs(await maint.jobs_on_node(inp.node), inp.node)
        if not busy:
            return []
        limit = inp.settings.drain_wait_s
        info = activity.info()
        key = f"{info.workflow_run_id}:{info.activity_id}"
        await self.deps.audit_row(
            inp.lifecycle_id,
            "checks_wait",
            f"{inp.purpose}: {inp.node} still runs {describe_jobs(busy)}: no check starts "
            f"beside a job; waiting up to {limit:g}s",
            dedupe=f"checks_wait:{key}",
            nodes=[inp.node],
            data={"jobs": [j.model_dump(mode="json") for j in busy], "purpose": inp.purpose},
        )
        t0 = time.monotonic()
        while busy and time.monotonic() - t0 < limit:
            beat(f"wait for {describe_jobs(busy)} to leave {inp.node}")
            await asyncio.sleep(min(CLEAR_POLL_S, max(0.0, limit - (time.monotonic() - t0))))
            busy = foreign_jobs(await maint.jobs_on_node(inp.node), inp.node)
        waited = time.monotonic() - t0
        await self.deps.audit_row(
            inp.lifecycle_id,
            "checks_waited",
            f"{inp.node} clear after {waited:.0f}s: the checks start"
            if not busy
            else f"{inp.node} still runs {describe_jobs(busy)} after {waited:.0f}s: no check "
            "started",
            dedupe=f"checks_waited:{key}",
            nodes=[inp.node],
            data={"seconds": round(waited, 1), "jobs": [j.model_dump(mode="json") for j in busy]},
        )
        return busy

    @activity.defn(name="lifecycle_hold")
    @typed_errors
    async def hold(self, inp: HoldInput) -> str:
        """Drain the node again while it waits for a person or the next rung (its checks
        failed, or a person must approve its return); the reservation stays."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_hold")
        result = await self._maintenance().set_drain_reason(
            inp.node, hold_reason(inp.why, inp.lifecycle_id)
        )
        return result.note

    # ------------------------------------------------------------------ checks

    @activity.defn(name="lifecycle_checks")
    @typed_errors
    @keeps_heartbeating
    async def run_checks(self, inp: ChecksInput) -> CheckRun:
        """Run the catalogue's checks for the fault on the node, one Slurm step each inside
        its reservation; telemetry checks read the node agent's counters."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_checks")
        started = datetime.now(UTC)
        maint = self._maintenance()
        settings = inp.settings
        env = {"RELAUNCH_CHECK_DIR": settings.check_workdir} if settings.check_workdir else {}
        results: list[CheckResult] = []
        node = await self.deps.scheduler.get_node(inp.node)
        # A validation waits for a node just rebooted or repaired; a diagnosis waits only for
        # a node slurmctld has not marked DOWN (a slurmd that missed one ping answers again;
        # one the decision fenced, or Slurm timed out, does not).
        wait = ANSWER_WAIT_S if inp.purpose != "diagnose" or node.state is not NodeState.DOWN else 0
        waits_until = time.monotonic() + wait
        while not node.responding and time.monotonic() < waits_until:
            beat(f"wait for {inp.node} to answer")
            await asyncio.sleep(1)
            node = await self.deps.scheduler.get_node(inp.node)
        if not node.responding:
            results.append(
                CheckResult(
                    id="slurmd",
                    passed=False,
                    detail=f"the node's slurmd does not answer ({node.display_state}): no check "
                    "can run there",
                )
            )
            return CheckRun(
                purpose=inp.purpose,
                results=results,
                started_at=started,
                finished_at=datetime.now(UTC),
            )
        # A draining node is not drained yet: no check starts beside a job, and one whose job
        # never leaves says nothing about the node.
        busy = await self._until_clear(inp)
        if busy:
            return CheckRun(
                purpose=inp.purpose,
                started_at=started,
                finished_at=datetime.now(UTC),
                inconclusive=f"{describe_jobs(busy)} still on {inp.node} after "
                f"{settings.drain_wait_s:g}s: no check started beside it",
            )
        await self._undrain(inp)
        ignored = await asyncio.to_thread(service_uids, settings.census_ignore_users)
        started = datetime.now(UTC)
        for check in checks_for(settings, inp.category):
            beat(f"check {check.id} on {inp.node}")
            if check.kind is CheckKind.TELEMETRY:
                samples = await read_node_telemetry(
                    inp.node,
                    self.deps.config.telemetry_pattern,
                    limit=TELEMETRY_READ,
                    timeout_s=10,
                )
                results.append(judge_counters(check, samples, inp.since))
                continue
            t0 = time.monotonic()
            try:
                code, output, _ = await maint.run_on_node(
                    inp.node,
                    wrapped_argv(check, inp.node),
                    reservation_name=reservation_name(inp.node),
                    timeout_s=check.timeout_s,
                    job_name=f"relaunch-check-{check.id}"[:80],
                    env=env,
                )
            except SchedulerError as exc:  # srun itself failed: the check did not pass
                results.append(
                    CheckResult(
                        id=check.id,
                        passed=False,
                        detail=f"could not run: {exc}"[:300],
                        seconds=time.monotonic() - t0,
                    )
                )
                continue
            results.append(
                judge(
                    check,
                    code,
                    output,
                    seconds=round(time.monotonic() - t0, 2),
                    timed_out=code is None,
                    # No census: no uid (all are below 2**32) counts as a user's.
                    uid_min=settings.user_uid_min if settings.census else 1 << 32,
                    ignore_uids=ignored,
                )
            )
        run = CheckRun(
            purpose=inp.purpose,
            results=results,
            started_at=started,
            finished_at=datetime.now(UTC),
        )
        if run.failed:  # a user could have made it fail: then it says nothing about the node
            after = foreign_jobs(await maint.jobs_on_node(inp.node), inp.node)
            run.inconclusive = inconclusive_reason(results, after)
        return run

    # ------------------------------------------------------------------ rungs

    @activity.defn(name="lifecycle_rung")
    @typed_errors
    @keeps_heartbeating
    async def apply_rung(self, inp: RungInput) -> RungResult:
        """Apply one rung that changes the node: a GPU reset or a reboot, and wait for the node
        to come back. ``done`` False where the rung is not available here."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_rung")
        # Once per fault, even across a worker killed mid-rung: the rung's start is written
        # first (a dedupe key) and its ask is confirmed by a second row once the command was
        # taken. A retry that finds the ask confirmed only waits for the node; one that finds
        # a start without it (the worker died in between, perhaps killing the command with it)
        # asks again, and says so: a node never rebooted would wait drained for good.
        first = await self.deps.audit_row(
            inp.lifecycle_id,
            "rung_started",
            f"{inp.rung.value} {inp.node}",
            dedupe=f"rung_started:{inp.rung.value}",
            nodes=[inp.node],
        )
        again = ""
        if not first:
            earlier, asked = await self._earlier(inp)
            if earlier is not None:
                return RungResult(
                    rung=inp.rung, done=False, detail=f"an earlier attempt: {earlier}"
                )
            if asked and inp.rung is Rung.REBOOT:
                back = await self._until_back(inp, time.monotonic(), "an earlier attempt")
                return back.model_copy(update={"detail": back.detail + " (not asked again)"})
            if asked:
                return RungResult(
                    rung=inp.rung, done=True, detail="applied by an earlier attempt (not again)"
                )
            again = " (asked again: the earlier attempt died before its ask was confirmed)"
        if inp.rung is Rung.GPU_RESET:
            result = await self._gpu_reset(inp)
            if result.done:
                await self._asked(inp, result.detail)
        elif inp.rung is Rung.REBOOT:
            result = await self._reboot(inp)
        else:
            result = RungResult(
                rung=inp.rung, done=False, detail=f"{inp.rung.value} changes nothing"
            )
        if not result.done:  # a retry must not take "started" for "applied"
            await self._rung_row(inp, "rung_not_applied", result.detail, {"detail": result.detail})
        return result.model_copy(update={"detail": result.detail + again}) if again else result

    async def _earlier(self, inp: RungInput) -> tuple[str | None, bool]:
        """What an earlier attempt of this rung left: why it did not apply it (None if it did
        not say), and whether its ask was confirmed."""
        not_applied, asked = None, False
        for event in await self.deps.audit.events(inp.lifecycle_id):
            if not event.summary.startswith(inp.rung.value):
                continue
            if event.kind == "rung_not_applied":
                not_applied = str(event.data.get("detail", event.summary))
            elif event.kind == "rung_asked":
                asked = True
        return not_applied, asked

    async def _asked(self, inp: RungInput, how: str) -> None:
        """Confirm that the rung's command was taken: a retry from here on only waits."""
        await self._rung_row(inp, "rung_asked", how)

    async def _rung_row(
        self, inp: RungInput, kind: str, detail: str, data: dict[str, object] | None = None
    ) -> None:
        """A row of this rung's trail, once per rung and kind."""
        await self.deps.audit_row(
            inp.lifecycle_id,
            kind,
            f"{inp.rung.value} {inp.node}: {detail}"[:500],
            dedupe=f"{kind}:{inp.rung.value}",
            nodes=[inp.node],
            data=data,
        )

    async def _gpu_reset(self, inp: RungInput) -> RungResult:
        maint = self._maintenance()
        code, output, _ = await maint.run_on_node(
            inp.node,
            [
                "sh",
                "-c",
                'command -v nvidia-smi >/dev/null || { echo "no nvidia-smi"; exit 3; }; '
                "nvidia-smi -r",
            ],
            reservation_name=reservation_name(inp.node),
            timeout_s=120,
            job_name="relaunch-gpu-reset",
        )
        if code == 3 and "no nvidia-smi" in output:
            return RungResult(
                rung=Rung.GPU_RESET, done=False, detail=f"nvidia-smi is not installed on {inp.node}"
            )
        if code != 0:
            last = (output.strip().splitlines() or [""])[-1][:200]
            return RungResult(
                rung=Rung.GPU_RESET, done=True, detail=f"nvidia-smi -r failed (exit {code}): {last}"
            )
        return RungResult(rung=Rung.GPU_RESET, done=True, detail="nvidia-smi -r: GPUs reset")

    async def _reboot(self, inp: RungInput) -> RungResult:
        settings, sched = inp.settings, self.deps.scheduler
        before = await sched.get_node(inp.node)
        asked = time.monotonic()
        if settings.reboot_command:
            argv = [a.replace("{node}", inp.node) for a in settings.reboot_command]
            beat(f"reboot {inp.node}: {Path(argv[0]).name}")
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), 120)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return RungResult(rung=Rung.REBOOT, done=True, detail="reboot command hung")
            if proc.returncode != 0:
                text = out.decode(errors="replace").strip()[-200:]
                return RungResult(
                    rung=Rung.REBOOT,
                    done=True,
                    detail=f"reboot command failed (exit {proc.returncode}): {text}",
                )
            how = "the site's reboot command"
        else:
            beat(f"scontrol reboot {inp.node}")
            try:
                await self._maintenance().reboot_node(inp.node, inp.reason)
            except RebootRefusedError as exc:
                return RungResult(rung=Rung.REBOOT, done=False, detail=str(exc))
            how = "scontrol reboot"
        await self._asked(inp, how)
        return await self._until_back(inp, asked, how, before=before.display_state)

    async def _until_back(
        self, inp: RungInput, asked: float, how: str, *, before: str = "?"
    ) -> RungResult:
        """Wait for the rebooted node to answer again (up to the reboot timeout)."""
        settings, sched = inp.settings, self.deps.scheduler
        deadline = asked + settings.reboot_timeout_s
        steady = 0  # a node just back may flap (slurmctld pinged it before it could answer)
        while time.monotonic() < deadline:
            beat(f"wait for {inp.node} to come back")
            node = await sched.get_node(inp.node)
            rebooting = any(f.startswith("REBOOT") for f in node.flags)
            steady = steady + 1 if node.responding and not rebooting else 0
            if steady >= BACK_READS:
                waited = time.monotonic() - asked
                return RungResult(
                    rung=Rung.REBOOT,
                    done=True,
                    detail=f"rebooted by {how}; back after {waited:.0f}s ({node.display_state}, "
                    f"was {before})",
                )
            await asyncio.sleep(1)
        return RungResult(
            rung=Rung.REBOOT,
            done=True,
            detail=f"rebooted by {how}, not back within {settings.reboot_timeout_s:g}s",
        )

    # ------------------------------------------------------------------ repair

    @activity.defn(name="lifecycle_escalate")
    @typed_errors
    @keeps_heartbeating
    async def escalate(self, inp: EscalateInput) -> EscalateResult:
        """Post the repair ticket (once: the webhook gets an Idempotency-Key), drain the node
        with the ticket as its reason, and end its maintenance reservation."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_escalate")
        settings = inp.settings
        ticket = inp.lifecycle_id
        posted = False
        detail = "no repair webhook configured: the ticket is the audit trail"
        if settings.repair_webhook is not None:
            beat("post the repair ticket")
            ticket, detail = await self._post_ticket(inp)
            posted = True
        node = await self.deps.scheduler.get_node(inp.node)
        if node.drain_flag and not node.reason.startswith(RELAUNCH_REASONS):
            detail += f"; {inp.node} drained by someone else ({node.reason}): reason kept"
        else:
            await self._maintenance().set_drain_reason(inp.node, repair_reason(ticket))
        await self._maintenance().unreserve_node(reservation_name(inp.node))
        return EscalateResult(ticket=ticket, posted=posted, detail=detail)

    async def _post_ticket(self, inp: EscalateInput) -> tuple[str, str]:
        settings = inp.settings
        assert settings.repair_webhook is not None
        reputation = await self.deps.audit.node_reputation(
            inp.cluster,
            datetime.now(UTC)
            - timedelta(hours=self.deps.config.policy.repeat_offender_window_hours),
        )
        rep = next((r for r in reputation if r.node == inp.node), None)
        incidents = sorted({f.incident_id for f in inp.faults})
        body = {
            "ticket_for": inp.lifecycle_id,
            "cluster": inp.cluster,
            "node": inp.node,
            "why": inp.why,
            "faults": [f.model_dump(mode="json") for f in inp.faults],
            "incidents": incidents,
            "bundles": [
                str(Path(self.deps.config.bundle_dir) / i)
                for i in incidents
                if (Path(self.deps.config.bundle_dir) / i).exists()
            ],
            "history": [
                {
                    "incident": e.incident_id,
                    "kind": e.kind,
                    "at": e.at.isoformat(),
                    "summary": e.summary,
                }
                for i in incidents
                for e in await self.deps.audit.events(i)
            ][-200:],
            "checks": [r.model_dump(mode="json") for r in inp.runs],
            "failed_checks": [f.model_dump(mode="json") for r in inp.runs[-1:] for f in r.failed],
            "tried": [r.value for r in inp.tried],
            "reputation": rep.model_dump(mode="json") if rep else None,
        }
        headers = {"Idempotency-Key": inp.lifecycle_id}
        if settings.repair_webhook_token_file:
            token = (
                await asyncio.to_thread(Path(settings.repair_webhook_token_file).read_text)
            ).strip()
            headers["Authorization"] = f"Bearer {token}"
        try:
            async with httpx.AsyncClient(timeout=WEBHOOK_TIMEOUT_S) as client:
                resp = await client.post(str(settings.repair_webhook), json=body, headers=headers)
        except httpx.HTTPError as exc:
            # The URL may carry a secret: say only what failed.
            raise RepairWebhookError(f"repair webhook unreachable ({type(exc).__name__})") from exc
        if resp.status_code >= 300:
            raise RepairWebhookError(f"repair webhook answered {resp.status_code}")
        ticket = inp.lifecycle_id
        try:
            answer = resp.json()
            if isinstance(answer, dict):
                given = answer.get("ticket") or answer.get("id") or answer.get("key")
                if isinstance(given, str | int) and str(given).strip():
                    ticket = str(given).strip()[:64]
        except ValueError:
            pass
        safe = "".join(c for c in ticket if c.isalnum() or c in "-_.#/:")[:64] or inp.lifecycle_id
        return safe, f"repair ticket {safe} posted ({resp.status_code})"

    # ------------------------------------------------------------------ return

    @activity.defn(name="lifecycle_return")
    @typed_errors
    @keeps_heartbeating
    async def return_node(self, inp: NodeStepInput) -> ReturnResult:
        """Return the node to service: clear the drain, end the reservation, and verify with a
        fresh read that the node takes jobs again."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_return")
        sched = self.deps.scheduler
        beat(f"return {inp.node}")
        node = await sched.get_node(inp.node)
        if node.drain_flag:
            if not node.reason.startswith(RELAUNCH_REASONS):
                return ReturnResult(
                    returned=False,
                    detail=f"drained by someone else meanwhile ({node.reason}): left as it is",
                )
            await sched.resume_node(inp.node)
        await self._maintenance().unreserve_node(reservation_name(inp.node))
        after = await sched.get_node(inp.node)
        waits_until = time.monotonic() + ANSWER_WAIT_S  # a node that flaps after its reboot
        while not after.drain_flag and not after.responding and time.monotonic() < waits_until:
            beat(f"wait for {inp.node} to answer")
            await asyncio.sleep(1)
            after = await sched.get_node(inp.node)
        ok = not after.drain_flag and after.responding
        if ok:
            await self._close_decisions(inp)
        return ReturnResult(
            returned=ok,
            detail=f"{inp.node} back in service ({after.display_state})"
            if ok
            else f"{inp.node} not back in service ({after.display_state})",
        )

    @activity.defn(name="lifecycle_release")
    @typed_errors
    async def release(self, inp: NodeStepInput) -> ReturnResult:
        """End a suspect's maintenance reservation and nothing else: a suspect was never
        drained, so no drain is cleared here (one made meanwhile is a real fault's, and stands).
        Verified with a fresh read."""
        await self.deps.unless_paused(inp.lifecycle_id, "lifecycle_release")
        await self._maintenance().unreserve_node(reservation_name(inp.node))
        after = await self.deps.scheduler.get_node(inp.node)
        ok = not after.drain_flag and after.responding
        return ReturnResult(
            returned=ok,
            detail=f"its reservation ended; {inp.node} "
            + ("in service" if ok else "not in service")
            + f" ({after.display_state})",
        )

    async def _close_decisions(self, inp: NodeStepInput) -> None:
        """Tell the node's open decision that the node is back: its next failure starts the
        next decision (and so a fresh drain and lifecycle) instead of joining this one."""
        client = self.deps.temporal
        if client is None:
            return
        query = (
            f'WorkflowType="NodeDecisionWorkflow" AND ExecutionStatus="Running" AND '
            f'RelaunchCluster="{inp.cluster}" AND RelaunchNodes="{inp.node}"'
        )
        note = f"{inp.node} returned to service by {inp.lifecycle_id}"
        # Imported here: the workflow modules import the activities.
        from relaunch.workflows.node_decision import NodeDecisionWorkflow

        try:
            async for wf in client.list_workflows(query, limit=10):
                await client.get_workflow_handle_for(NodeDecisionWorkflow.run, wf.id).signal(
                    NodeDecisionWorkflow.back_in_service, note
                )
        except RPCError as exc:  # the decision then closes after its join window, as before
            log.warning("could not tell %s's decision it is back: %s", inp.node, exc)
