"""Silent failures on the real stack: a node that dies without a word.

The node's slurmd is killed and the job's processes on it are frozen (SIGSTOP), as a node that
lost power looks from outside: its slurmd no longer answers, and its rank neither prints nor
closes its connections. The job syncs its ranks rarely (``--sync-every``), so the surviving rank
keeps printing progress: no line anywhere says that anything is wrong. Relaunch's own liveness
probe must see it within seconds, the verdict must rest on that trusted probe, and the job must
run again on healthy nodes, resumed from its checkpoint — for PyTorch-style and Megatron-style
progress lines alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from datetime import UTC, datetime

import pytest
from temporalio.service import RPCError

from relaunch.devstack import faults
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job

# What each progress style prints when rank 0 saves a checkpoint.
SAVED = {
    "pytorch": r"checkpoint saved step=(\d+)",
    "megatron": r"successfully saved checkpoint from iteration\s+(\d+)",
}
DETECTION_BUDGET_S = 10.0


@pytest.mark.parametrize("style", ["pytorch", "megatron"])
async def test_a_silent_node_crash_is_seen_by_the_probe_and_the_job_resumes_elsewhere(
    make_harness: MakeHarness, style: str
) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=150))
    h.start("worker")
    h.start("watch")
    job_id = h.submit_ddp("--sync-every", "1000000", "--progress-style", style)
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    culprit, survivor = job.nodes[1], job.nodes[0]
    await h.wait_log(job_id, SAVED[style], timeout=120)
    last_saved = max(int(s) for s in re.findall(SAVED[style], h.log(job_id)))

    crashed_at = datetime.now(UTC)
    started = time.monotonic()
    frozen = faults.freeze_node(h.stack.slurm, culprit, job_id=job_id)
    try:
        assert frozen, f"no process of job {job_id} found on {culprit}"
        incident = h.incident(job_id)
        opened = await _workflow_opened(h, incident, timeout=30)
        assert opened - started <= DETECTION_BUDGET_S, (
            f"the recovery opened {opened - started:.1f}s after the crash"
        )
        # The survivor kept printing: nothing the job's ranks printed told of the crash. The
        # only error lines are Slurm's own (srun, slurmstepd), for the step that the node's
        # decision ended when it requeued the job, before its recovery opened.
        said = [line for line in h.log(job_id).splitlines() if "error" in line.lower()]
        assert all("srun: " in line or "slurmstepd" in line for line in said), said

        status = await h.wait_stage(incident, {Stage.DONE}, timeout=240)
        verdict = status.verdict
        assert verdict is not None and verdict.culprit_nodes == [culprit]
        assert verdict.category.value == "node_failure", verdict.summary
        assert "probe" in verdict.corroboration[culprit], verdict.corroboration

        detections = await h.events(incident, "detection")
        first = min(detections, key=lambda e: str(e.data["detected_at"]))
        assert first.data["kind"] == "node_unreachable" and first.nodes == [culprit], first
        detected = datetime.fromisoformat(str(first.data["detected_at"]))
        assert (detected - crashed_at).total_seconds() <= DETECTION_BUDGET_S

        node = await h.sched.get_node(culprit)
        assert node.drain_flag or node.state.value == "down", node.display_state
        again = await h.sched.get_job(job_id)
        assert again.state is JobState.RUNNING and culprit not in again.nodes, again
        assert again.restart_count == 1

        verified = await h.events(incident, "verify")
        detail = verified[0].summary
        resumed = re.search(r"resumed from checkpoint step (\d+)", detail)
        assert resumed, detail
        assert int(resumed.group(1)) >= last_saved, (detail, last_saved)
        assert style in detail, detail
        assert survivor not in verdict.culprit_nodes  # the healthy node is not blamed
        print(
            f"{style}: recovery opened {opened - started:.1f}s and detected "
            f"{(detected - crashed_at).total_seconds():.1f}s after the crash; verify: {detail}"
        )
    finally:
        faults.release_frozen(frozen)


async def _workflow_opened(h: Harness, incident: str, timeout: float) -> float:
    """The monotonic time at which the recovery workflow was first seen."""
    deadline = time.monotonic() + timeout
    handle = h.handle(incident)
    while time.monotonic() < deadline:
        with contextlib.suppress(RPCError):
            await handle.describe()
            return time.monotonic()
        await asyncio.sleep(0.2)
    raise AssertionError(f"no recovery {incident} within {timeout}s of the crash")
