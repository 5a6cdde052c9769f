"""In-cluster mode against the stack's real JWT slurmrestd (Slurm 22.05's v0.0.38, or 24.11's
v0.0.42 with RELAUNCH_TEST_SLURM=24.11): reads and
hold/release/cancel over REST with tokens the process mints and renews itself, the other actions
over the CLI, and a whole recovery run that way. The evidence of what went over REST is
slurmrestd's own log, which records every request it routes."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.composite import SlurmRestScheduler
from relaunch.connectors.slurm.factory import slurm_rest, slurm_scheduler
from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.devstack.stack import Stack
from relaunch.models.config import ClusterConfig
from relaunch.models.endpoints import SlurmRestSettings
from relaunch.models.errors import SchedulerError
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from tests.conftest import sbatch
from tests.integration.conftest import MakeHarness
from tests.integration.helpers import wait_job
from tests.integration.test_recovery import start_training

# The data parser `auto` picks on each release (tests/integration/test_rest_versions.py).
NEWEST = {"22.05": "v0.0.38", "24.11": "v0.0.42"}


def api(stack: Stack) -> str:
    """The path prefix of the data parser the client uses on this stack's release."""
    return f"/slurm/{NEWEST[stack.config.slurm]}"


def rest_settings(stack: Stack, **overrides: object) -> SlurmRestSettings:
    values: dict[str, object] = {
        "url": f"http://127.0.0.1:{stack.config.restd_port}",
        "user": "root",
        "jwt_key_file": str(stack.slurm.jwt_key),
        **overrides,
    }
    return SlurmRestSettings.model_validate(values)


def rest_scheduler(stack: Stack, **overrides: object) -> SlurmRestScheduler:
    config = ClusterConfig(
        name="restmode",
        **stack.slurm.config_fields,
        database_url=stack.database_url,
        bundle_dir="/nonexistent",
        slurmrestd=rest_settings(stack, **overrides),
    )
    sched = slurm_scheduler(config)
    assert isinstance(sched, SlurmRestScheduler)
    return sched


class RestdLog:
    """What the stack's JWT slurmrestd logs from now on: it records every request it routes
    ("operations_router: [...] GET /slurm/v0.0.38/nodes") and every failed authentication."""

    def __init__(self, stack: Stack) -> None:
        self.path = stack.slurm.root / "log" / "slurmrestd-jwt.log"
        self.start = self.path.stat().st_size

    def text(self) -> str:
        with open(self.path, "rb") as fh:
            fh.seek(self.start)
            return fh.read().decode(errors="replace")

    def requests(self) -> list[str]:
        return re.findall(r"operations_router: \S+ ((?:GET|POST|DELETE|PUT) \S+)", self.text())


async def test_reads_match_the_cli_and_hold_release_cancel_go_over_rest(
    stack: Stack, scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    API = api(stack)
    running = sbatch(slurm_env, "-N", "2", f"--output={workdir}/r-%j.out", "--wrap=srun sleep 120")
    pending = sbatch(
        slurm_env, "--begin=now+3600", f"--output={workdir}/p-%j.out", "--wrap=sleep 1"
    )
    sched = rest_scheduler(stack)
    restd = RestdLog(stack)
    try:
        await wait_job(scheduler, running, JobState.RUNNING)
        cli_jobs = {j.job_id: j for j in await scheduler.list_jobs()}
        rest_jobs = {j.job_id: j for j in await sched.list_jobs()}
        for job_id in (running, pending):
            assert rest_jobs[job_id] == cli_jobs[job_id]
            assert await sched.get_job(job_id) == cli_jobs[job_id]
        cli_nodes = {n.name: n.display_state for n in await scheduler.list_nodes()}
        assert {n.name: n.display_state for n in await sched.list_nodes()} == cli_nodes

        held = await sched.hold_job(pending)
        assert held.changed and "JobHeld" in held.after
        assert (await scheduler.get_job(pending)).held  # the CLI sees it too
        assert not (await sched.hold_job(pending)).changed  # a retry does nothing
        assert (await sched.release_job(pending)).changed
        assert not (await scheduler.get_job(pending)).held
        assert not (await sched.release_job(pending)).changed
        cancelled = await sched.cancel_job(running)
        assert cancelled.changed and cancelled.after.startswith("CANCELLED")
        assert (await scheduler.get_job(running)).state.is_terminal
        assert not (await sched.cancel_job(running)).changed

        routed = restd.requests()
        assert f"POST {API}/job/{pending}" in routed
        assert routed.count(f"POST {API}/job/{pending}") == 2  # hold, release; no retry posts
        assert routed.count(f"DELETE {API}/job/{running}") == 1
        assert f"GET {API}/jobs" in routed and f"GET {API}/nodes" in routed
        assert f"GET {API}/job/{running}" in routed  # the verifying reads
    finally:
        await sched.aclose()
        await scheduler.cancel_job(running)
        await scheduler.cancel_job(pending)


async def test_drain_goes_over_the_cli_and_is_verified_over_rest(
    stack: Stack, scheduler: SlurmCli
) -> None:
    API = api(stack)
    sched = rest_scheduler(stack)
    restd = RestdLog(stack)
    try:
        drained = await sched.drain_node("n3", "rest-mode drain check")
        assert drained.changed and (await scheduler.get_node("n3")).drain_flag
        assert not (await sched.drain_node("n3", "rest-mode drain check")).changed
        routed = restd.requests()
        assert routed.count(f"GET {API}/node/n3") >= 3  # before, verify, retry's before
        assert not [r for r in routed if not r.startswith("GET ")]  # no node update over REST
    finally:
        await sched.aclose()
        await scheduler.resume_node("n3")


async def test_short_lived_tokens_are_renewed_before_they_expire(stack: Stack) -> None:
    sched = rest_scheduler(stack, token_lifetime_s=3, renew_before_s=1)
    minter = sched.rest._minter
    assert minter is not None
    try:
        await sched.list_nodes()
        first_expiry = minter.expires_at
        await asyncio.sleep(3.5)  # the first token has expired by now
        assert len(await sched.list_nodes()) == stack.config.nodes
        assert minter.minted == 2 and minter.expires_at > first_expiry
    finally:
        await sched.aclose()


async def test_an_expired_token_is_renewed_after_slurmctld_refuses_it(stack: Stack) -> None:
    API = api(stack)
    calls = [0]

    def clock() -> float:
        # The first token is minted two hours in the past (a suspended host, a clock step):
        # valid as far as the minter knows, expired as far as slurmctld knows.
        calls[0] += 1
        return time.time() - (7200 if calls[0] == 1 else 0)

    minter = JwtMinter(stack.slurm.jwt_key, "root", 1800, renew_before_s=60, clock=clock)
    restd = RestdLog(stack)
    async with SlurmRest(
        base_url=f"http://127.0.0.1:{stack.config.restd_port}", minter=minter
    ) as rest:
        assert len(await rest.list_nodes()) == stack.config.nodes
    assert minter.minted == 2
    # api_version auto: the first request reads the OpenAPI document, and that is where the
    # expired token is refused (minted twice above); the document is read once, then the nodes.
    assert restd.requests()[-2:] == ["GET /openapi/v3", f"GET {API}/nodes"]


async def test_a_wrong_key_is_refused_clearly_and_a_rotated_key_picked_up(
    stack: Stack, tmp_path: Path
) -> None:
    key_file = tmp_path / "jwt.key"
    key_file.write_bytes(b"not the cluster's key, but long enough 0123456789")
    rest = slurm_rest(rest_settings(stack, jwt_key_file=str(key_file)))
    async with rest:
        with pytest.raises(SchedulerError, match="refused a freshly minted JWT token") as info:
            await rest.list_jobs()
        assert info.value.hint and "AuthAltParameters=jwt_key" in info.value.hint
        assert not info.value.retryable
        key_file.write_bytes(stack.slurm.jwt_key.read_bytes())  # the operator fixes the key
        assert await rest.ping()


async def test_end_to_end_recovery_through_slurmrestd_with_jwt(
    make_harness: MakeHarness, stack: Stack
) -> None:
    API = api(stack)
    h = make_harness(
        Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120),
        # Short tokens, so that the worker and the watcher renew theirs during the recovery.
        slurmrestd=rest_settings(stack, token_lifetime_s=20, renew_before_s=5),
    )
    restd = RestdLog(stack)
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    culprit = nodes[1]
    await h.wait_log(job_id, r"checkpoint saved step=(1[05]|[2-9]\d)")
    h.kill_node(culprit, job_id)

    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.DONE}, timeout=180)
    assert status.verdict is not None and status.verdict.culprit_nodes == [culprit]
    node = await h.sched.get_node(culprit)  # the harness's own reads are the CLI's
    # Drained by the node's decision, which the job's recovery joined.
    assert status.node_decision is not None
    assert node.drain_flag and status.node_decision in node.reason
    job = await h.sched.get_job(job_id)
    assert job.state is JobState.RUNNING and culprit not in job.nodes
    await h.wait_log(job_id, r"resumed from checkpoint step=(\d+)")
    kinds = [e.kind for e in await h.events(incident)]
    for kind in ("detection", "evidence", "verdict", "node_decision", "action", "verify"):
        assert kind in kinds

    # What slurmrestd itself routed: the watcher's polls (the job list every 0.5 s for well
    # over 20 s, so across token renewals; the node list while a watched job runs), the
    # worker's evidence and verification reads of the job, and the drain's fresh read and
    # verification of the culprit.
    routed = restd.requests()
    assert routed.count(f"GET {API}/jobs") > 40 and f"GET {API}/nodes" in routed
    assert f"GET {API}/job/{job_id}" in routed
    assert routed.count(f"GET {API}/node/{culprit}") >= 2
    assert "authentication failed" not in restd.text()
    for name in ("worker", "watch"):
        text = (h.tmp / f"{name}.log").read_text(errors="replace")
        assert "Slurm reads over slurmrestd" in text, text[-2000:]
        assert "slurmrestd refused" not in text  # no token was ever refused
