"""slurmrestd (local socket and JWT) reads agree with the CLI's reads of the same moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.devstack.stack import Stack
from relaunch.models.errors import JobNotFoundError, NodeNotFoundError, SchedulerError
from relaunch.models.scheduler import JobState
from tests.conftest import sbatch
from tests.integration.helpers import wait_job


def _rest_clients(stack: Stack) -> dict[str, SlurmRest]:
    return {
        "local": SlurmRest(socket_path=str(stack.slurm.restd_socket)),
        "jwt": SlurmRest(
            base_url=f"http://127.0.0.1:{stack.config.restd_port}",
            minter=JwtMinter(stack.slurm.jwt_key, "root"),
        ),
    }


async def test_rest_reads_match_cli(
    stack: Stack, scheduler: SlurmCli, slurm_env: dict[str, str], workdir: Path
) -> None:
    running = sbatch(
        slurm_env,
        "-N",
        "2",
        f"--output={workdir}/r-%j.out",
        "--comment=relaunch=on,relaunch_cluster=slurmrestd-reads",
        "--wrap=srun sleep 120",
    )
    held = sbatch(slurm_env, "--hold", f"--output={workdir}/h-%j.out", "--wrap=sleep 1")
    try:
        await wait_job(scheduler, running, JobState.RUNNING)
        await scheduler.drain_node("n4", "restd agreement check")
        cli_jobs = {j.job_id: j for j in await scheduler.list_jobs()}
        cli_nodes = {n.name: n for n in await scheduler.list_nodes()}
        for name, rest in _rest_clients(stack).items():
            async with rest:
                rest_jobs = {j.job_id: j for j in await rest.list_jobs()}
                rest_nodes = {n.name: n for n in await rest.list_nodes()}
                for job_id in (running, held):
                    assert rest_jobs[job_id] == cli_jobs[job_id], name
                    assert await rest.get_job(job_id) == cli_jobs[job_id], name
                assert rest_nodes.keys() == cli_nodes.keys(), name
                for node, cli_node in cli_nodes.items():
                    assert rest_nodes[node].display_state == cli_node.display_state, name
                    assert rest_nodes[node].reason == cli_node.reason, name
                assert (await rest.get_node("n4")).drain_flag, name
                with pytest.raises(JobNotFoundError):
                    await rest.get_job("987654")
                with pytest.raises(NodeNotFoundError):
                    await rest.get_node("nosuchnode")
    finally:
        await scheduler.resume_node("n4")
        await scheduler.cancel_job(running)
        await scheduler.cancel_job(held)


async def test_rest_jwt_rejects_a_forged_token(stack: Stack, tmp_path: Path) -> None:
    forged_key = tmp_path / "other.key"
    forged_key.write_bytes(b"not-the-cluster-key-0123456789abcdef")
    rest = SlurmRest(
        base_url=f"http://127.0.0.1:{stack.config.restd_port}",
        minter=JwtMinter(forged_key, "root"),
    )
    async with rest:
        with pytest.raises(SchedulerError) as info:
            await rest.list_nodes()
    assert info.value.hint and "token" in info.value.hint
