"""slurmrestd on Slurm 24.11 (a 2-node stack of its own) and 22.05 (the session's stack): the
client negotiates the newest data parser each server offers, its reads agree with what
``scontrol ... --json`` says at the same moment, and hold, release and cancel sent over REST
take effect in Slurm."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.composite import SlurmRestScheduler
from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.models.errors import JobNotFoundError, NodeNotFoundError, SchedulerError
from relaunch.models.scheduler import Job, JobState, Node
from tests.conftest import SLURM_RELEASE, sbatch

pytestmark = pytest.mark.xdist_group("slurm-24.11-rest")


@pytest.fixture(scope="module")
def stack_2411() -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="relaunch-rest2411-"))
    stack = Stack(
        root / "state",
        StackConfig.with_free_ports(cluster="restv", slurm="24.11", services=False, nodes=2),
    )
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


def _env(stack: Stack) -> dict[str, str]:
    return {**os.environ, **stack.slurm_env}


def _scontrol_json(stack: Stack, *args: str) -> dict[str, object]:
    done = subprocess.run(
        ["scontrol", *args, "--json"], env=_env(stack), check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _cli_job(stack: Stack, job_id: str) -> Job:
    """The job as ``scontrol show job <id> --json`` of the stack's own release says."""
    raws = _scontrol_json(stack, "show", "job", job_id)["jobs"]
    assert isinstance(raws, list) and len(raws) == 1
    return parse.job_from_json(raws[0])


async def _wait_running(stack: Stack, job_id: str, state: JobState = JobState.RUNNING) -> None:
    for _ in range(120):
        if _cli_job(stack, job_id).state is state:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"job {job_id} did not reach {state}")


def _cli_nodes(stack: Stack) -> dict[str, Node]:
    data = _scontrol_json(stack, "show", "nodes")
    return {node.name: node for node in parse.nodes_from_data(data)}


def _clients(stack: Stack) -> dict[str, SlurmRest]:
    return {
        "local": SlurmRest(socket_path=str(stack.slurm.restd_socket)),
        "jwt": SlurmRest(
            base_url=f"http://127.0.0.1:{stack.config.restd_port}",
            minter=JwtMinter(stack.slurm.jwt_key, "root"),
        ),
    }


async def test_24_11_negotiates_the_newest_parser_and_reads_agree_with_scontrol(
    stack_2411: Stack, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = _env(stack_2411)
    version = subprocess.run(
        ["scontrol", "--version"], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert " 24.11." in version, version  # "slurm-wlm 24.11.5"
    running = sbatch(env, "-N", "2", f"--output={tmp_path}/r-%j.out", "--wrap=sleep 120")
    held = sbatch(
        env, "--hold", "--comment=relaunch=on", f"--output={tmp_path}/h-%j.out", "--wrap=sleep 1"
    )
    failed = sbatch(env, "-N", "1", f"--output={tmp_path}/f-%j.out", "--wrap=exit 3")
    try:
        await _wait_running(stack_2411, running)
        # Its exit code is read below: it must have run (a loaded machine starts it late).
        await _wait_running(stack_2411, failed, JobState.FAILED)
        subprocess.run(
            ["scontrol", "update", "NodeName=n2", "State=DRAIN", "Reason=restd 24.11 check"],
            env=env,
            check=True,
        )
        cli_jobs = {job_id: _cli_job(stack_2411, job_id) for job_id in (running, held)}
        assert cli_jobs[held].held and cli_jobs[running].nodes == ["n1", "n2"]
        cli_nodes = _cli_nodes(stack_2411)
        for name, rest in _clients(stack_2411).items():
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="relaunch.slurmrestd"):
                async with rest:
                    rest_jobs = {j.job_id: j for j in await rest.list_jobs()}
                    for job_id, cli_job in cli_jobs.items():
                        assert rest_jobs[job_id] == cli_job, name
                        assert await rest.get_job(job_id) == cli_job, name
                    assert rest_jobs[failed].exit_code.code == 3, name
                    rest_nodes = {n.name: n for n in await rest.list_nodes()}
                    assert rest_nodes == cli_nodes, name
                    drained = await rest.get_node("n2")
                    assert drained.drain_flag and drained.reason == "restd 24.11 check", name
                    with pytest.raises(JobNotFoundError):
                        await rest.get_job("987654")
                    with pytest.raises(NodeNotFoundError):
                        await rest.get_node("nosuchnode")
                    assert rest.api_version == "v0.0.42", name
            chosen = [r.getMessage() for r in caplog.records if "data parser" in r.getMessage()]
            assert len(chosen) == 1 and "using data parser v0.0.42" in chosen[0], chosen
            assert "v0.0.40, v0.0.41, v0.0.42" in chosen[0], chosen
    finally:
        subprocess.run(["scontrol", "update", "NodeName=n2", "State=RESUME"], env=env, check=False)
        subprocess.run(["scancel", running, held, failed], env=env, check=False)


async def test_24_11_hold_release_cancel_over_rest_take_effect(
    stack_2411: Stack, tmp_path: Path
) -> None:
    env = _env(stack_2411)
    # Pending for an hour: holdable, and nothing runs.
    job = sbatch(env, "--begin=now+3600", f"--output={tmp_path}/p-%j.out", "--wrap=sleep 1")
    for name, rest in _clients(stack_2411).items():
        sched = SlurmRestScheduler(rest, env=stack_2411.slurm_env)
        try:
            held = await sched.hold_job(job)
            assert held.changed, name
            assert _cli_job(stack_2411, job).held, name  # Slurm's own view, read fresh
            released = await sched.release_job(job)
            assert released.changed, name
            after = _cli_job(stack_2411, job)
            assert after.state is JobState.PENDING and not after.held, name
        finally:
            await sched.aclose()
    sched = SlurmRestScheduler(
        SlurmRest(socket_path=str(stack_2411.slurm.restd_socket)), env=stack_2411.slurm_env
    )
    try:
        assert (await sched.cancel_job(job)).changed
        assert _cli_job(stack_2411, job).state is JobState.CANCELLED
        assert not (await sched.cancel_job(job)).changed  # retried: nothing sent
    finally:
        await sched.aclose()


async def test_24_11_a_pinned_version_it_does_not_serve_is_a_clear_error(
    stack_2411: Stack,
) -> None:
    async with SlurmRest(
        socket_path=str(stack_2411.slurm.restd_socket), api_version="v0.0.38"
    ) as rest:
        with pytest.raises(SchedulerError, match="does not serve GET /slurm/v0.0.38/nodes") as info:
            await rest.list_nodes()
    assert info.value.hint and "api_version" in info.value.hint
    async with SlurmRest(
        socket_path=str(stack_2411.slurm.restd_socket), api_version="v0.0.40"
    ) as rest:
        assert {n.name for n in await rest.list_nodes()} == {"n1", "n2"}
        assert rest.api_version == "v0.0.40"


async def test_24_11_jwt_rejects_a_forged_token(stack_2411: Stack, tmp_path: Path) -> None:
    forged = tmp_path / "other.key"
    forged.write_bytes(b"not-the-cluster-key-0123456789abcdef")
    rest = SlurmRest(
        base_url=f"http://127.0.0.1:{stack_2411.config.restd_port}",
        minter=JwtMinter(forged, "root"),
    )
    async with rest:
        with pytest.raises(SchedulerError, match="refused a freshly minted JWT token") as info:
            await rest.list_nodes()
    assert info.value.hint and "jwt_key" in info.value.hint
    assert rest._minter is not None and rest._minter.minted == 2  # renewed once, then given up


async def test_24_11_an_expired_token_is_renewed(stack_2411: Stack) -> None:
    calls = [0]

    def clock() -> float:  # the first token is minted two hours in the past
        calls[0] += 1
        return time.time() - (7200 if calls[0] == 1 else 0)

    minter = JwtMinter(stack_2411.slurm.jwt_key, "root", 1800, renew_before_s=60, clock=clock)
    async with SlurmRest(
        base_url=f"http://127.0.0.1:{stack_2411.config.restd_port}", minter=minter
    ) as rest:
        assert {n.name for n in await rest.list_nodes()} == {"n1", "n2"}
    assert minter.minted == 2


@pytest.mark.skipif(SLURM_RELEASE != "22.05", reason="the session's stack is not Slurm 22.05")
async def test_22_05_negotiates_v0_0_38(stack: Stack) -> None:
    for name, rest in _clients(stack).items():
        async with rest:
            assert {n.name for n in await rest.list_nodes()} >= {"n1", "n2"}, name
            assert rest.api_version == "v0.0.38", name
