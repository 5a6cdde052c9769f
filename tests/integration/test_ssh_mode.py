"""SSH mode: the Slurm CLI backend through a real sshd on loopback in front of the real Slurm."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relaunch.connectors.slurm.commands import LINEAGE_KEY, SlurmCli
from relaunch.connectors.slurm.ssh import SshRunner
from relaunch.devstack.stack import Stack
from relaunch.models.errors import (
    InvalidNameError,
    SchedulerTimeoutError,
    SshAuthError,
    SshHostKeyError,
    SshUnavailableError,
)
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from tests.conftest import sbatch
from tests.integration.conftest import MakeHarness
from tests.integration.helpers import wait_job
from tests.integration.sshd import Sshd


@pytest.fixture
async def runner(sshd: Sshd, stack: Stack) -> AsyncIterator[SshRunner]:
    r = SshRunner(sshd.settings(), env=stack.slurm_env)
    yield r
    await r.close()


@pytest.fixture
def remote(runner: SshRunner) -> SlurmCli:
    return SlurmCli(runner=runner)


async def test_reads_over_ssh_equal_local_reads_on_one_connection(
    sshd: Sshd, runner: SshRunner, remote: SlurmCli, scheduler: SlurmCli
) -> None:
    logins = sshd.accepted_logins()
    assert [(n.name, n.state, n.partitions) for n in await remote.list_nodes()] == [
        (n.name, n.state, n.partitions) for n in await scheduler.list_nodes()
    ]
    remote_jobs = {j.job_id: (j.name, j.state) for j in await remote.list_jobs()}
    local_jobs = {j.job_id: (j.name, j.state) for j in await scheduler.list_jobs()}
    assert remote_jobs.keys() == local_jobs.keys()
    for _ in range(3):
        await remote.list_nodes()
    assert runner.connections_opened == 1 and runner.commands_sent >= 5
    assert sshd.accepted_logins() == logins + 1
    assert ["squeue", "--json", "--states=all"] in sshd.slurm_commands()


async def test_drain_and_resume_over_ssh(sshd: Sshd, remote: SlurmCli, scheduler: SlurmCli) -> None:
    node = (await scheduler.list_nodes())[-1].name
    # Allowed reason characters that a shell would still read as syntax: `(`, `)`, `#`.
    reason = "ssh test (xid 79) #1"
    try:
        drained = await remote.drain_node(node, reason)
        assert drained.changed
        seen = await scheduler.get_node(node)
        assert seen.drain_flag and seen.reason == reason
        assert ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"] in (
            sshd.slurm_commands()
        )
        resumed = await remote.resume_node(node)
        assert resumed.changed and not (await scheduler.get_node(node)).drain_flag
        assert ["scontrol", "update", f"NodeName={node}", "State=RESUME"] in sshd.slurm_commands()
    finally:
        if (await scheduler.get_node(node)).drain_flag:
            await scheduler.resume_node(node)


async def test_unknown_or_changed_host_key_is_refused(sshd: Sshd, stack: Stack) -> None:
    empty = sshd.root / "known_hosts.empty"
    empty.write_text("")
    for known_hosts in (sshd.wrong_known_hosts, empty):
        runner = SshRunner(sshd.settings(known_hosts=str(known_hosts)), env=stack.slurm_env)
        with pytest.raises(SshHostKeyError) as err:
            await runner.run(["sinfo", "--version"])
        assert not err.value.retryable
        assert f"127.0.0.1:{sshd.port}" in str(err.value) and str(known_hosts) in str(err.value)
        assert runner.commands_sent == 0
    missing = SshRunner(sshd.settings(known_hosts=str(sshd.root / "absent")))
    with pytest.raises(SshHostKeyError, match="cannot read the known_hosts file"):
        await missing.run(["sinfo", "--version"])


async def test_a_key_the_host_does_not_authorize_is_refused(sshd: Sshd) -> None:
    runner = SshRunner(sshd.settings(key_file=str(sshd.other_key)))
    with pytest.raises(SshAuthError) as err:
        await runner.run(["sinfo", "--version"])
    assert not err.value.retryable and str(sshd.other_key) in str(err.value)
    absent = SshRunner(sshd.settings(key_file=str(sshd.root / "no-such-key")))
    with pytest.raises(SshAuthError, match="cannot read the SSH key"):
        await absent.run(["sinfo", "--version"])


async def test_sshd_going_away_is_retryable_and_the_runner_reconnects(
    sshd: Sshd, runner: SshRunner, remote: SlurmCli
) -> None:
    await remote.list_nodes()
    try:
        # Dropped while a command runs: it may have run, so it is reported, not repeated.
        slow = asyncio.create_task(runner.run(["sleep", "5"]))
        await asyncio.sleep(1)
        sshd.stop()
        with pytest.raises(SshUnavailableError, match="dropped while sleep ran") as dropped:
            await slow
        assert dropped.value.retryable
        with pytest.raises(SshUnavailableError, match=f"127.0.0.1:{sshd.port}") as down:
            await remote.list_nodes()
        assert down.value.retryable
    finally:
        if sshd.proc is None:
            sshd.start()
    assert await remote.list_nodes()
    assert runner.connections_opened == 2


async def test_a_dropped_idle_connection_is_reopened_without_an_error(
    sshd: Sshd, runner: SshRunner, remote: SlurmCli
) -> None:
    await remote.list_nodes()
    sshd.drop_connections()
    assert await remote.list_nodes()
    assert runner.connections_opened == 2


async def test_an_overrunning_command_times_out_and_is_killed_remotely(
    sshd: Sshd, runner: SshRunner
) -> None:
    marker = f"{37 + uuid.uuid4().int % 1000 / 1000:.3f}"
    start = time.monotonic()
    with pytest.raises(SchedulerTimeoutError, match="did not answer within 1s"):
        await runner.run(["sleep", marker], timeout=1)
    assert time.monotonic() - start < 3
    deadline = time.monotonic() + 10
    while _running(f"sleep {marker}"):
        assert time.monotonic() < deadline, "the remote command was not killed"
        await asyncio.sleep(0.2)


def _running(pattern: str) -> bool:
    found = subprocess.run(["pgrep", "-f", f"^{pattern}$"], capture_output=True, timeout=10)
    return found.returncode == 0


HOSTILE = [
    "x; touch {pwned}",
    "$(touch {pwned})",
    "`touch {pwned}`",
    "a\ntouch {pwned}",
    "' ; touch {pwned} ; '",
    '" && touch {pwned} #',
    "-n",
    "*",
    "${{IFS}}touch${{IFS}}{pwned}",
]


async def test_hostile_arguments_arrive_as_literal_words(
    sshd: Sshd, runner: SshRunner, tmp_path: Path
) -> None:
    pwned = tmp_path / "pwned"
    words = [w.format(pwned=pwned) for w in HOSTILE]
    result = await runner.run(["printf", "%s\\0", *words])
    assert result.returncode == 0
    assert result.stdout.split("\0")[:-1] == words
    assert ["printf", "%s\\0", *words] in sshd.slurm_commands()
    assert not pwned.exists()


async def test_hostile_job_name_and_comment_reach_slurm_literally(
    sshd: Sshd,
    remote: SlurmCli,
    scheduler: SlurmCli,
    slurm_env: dict[str, str],
    workdir: Path,
) -> None:
    pwned = workdir / "pwned"
    name = f"x; touch {pwned} `touch {pwned}`"
    # Tagged with a cluster no harness watches: other tests' watchers share this Slurm.
    comment = f"relaunch=on,relaunch_cluster=ssh-literal,note=$(touch {pwned});'\"`id`"
    job_id = sbatch(
        slurm_env,
        f"--job-name={name}",
        f"--comment={comment}",
        f"--output={workdir}/hostile-%j.out",
        script="#!/bin/sh\ntrue\n",
    )
    child_id = None
    try:
        await wait_job(scheduler, job_id, JobState.COMPLETED)
        result = await remote.resubmit_job(job_id)
        child_id = result.new_job_id
        assert result.changed and child_id
        child = await scheduler.get_job(child_id)
        assert child.name == name
        assert child.comment == f"{comment},{LINEAGE_KEY}={job_id}"
        sent = [c for c in sshd.slurm_commands() if c[:1] == ["sbatch"]]
        assert f"--job-name={name}" in sent[-1]
        await wait_job(scheduler, child_id, JobState.COMPLETED)
        # A newline or a `;` in a drain reason never reaches sshd at all.
        before = len(sshd.commands())
        for reason in ("x; touch /tmp/pwned", "a\nb", "$(id)"):
            with pytest.raises(InvalidNameError):
                await remote.drain_node("n1", reason)
        assert len(sshd.commands()) == before
        assert not pwned.exists()
    finally:
        await scheduler.cancel_job(job_id)
        if child_id:
            await scheduler.cancel_job(child_id)


# ------------------------------------------------------------------ end to end


async def test_autonomous_recovery_through_ssh_mode(make_harness: MakeHarness, sshd: Sshd) -> None:
    # The worker and watcher reach Slurm only through the loopback sshd.
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120), ssh=sshd.settings())
    assert h.config.ssh is not None
    sent_before = len(sshd.commands())
    h.start("worker")
    h.start("watch")
    job_id = h.submit_ddp()
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    culprit = job.nodes[1]
    await h.wait_log(job_id, r"checkpoint saved step=(1[05]|[2-9]\d)")
    last_ckpt = int(re.findall(r"checkpoint saved step=(\d+)", h.log(job_id))[-1])
    h.kill_node(culprit, job_id)

    incident = h.incident(job_id)
    status = await h.wait_stage(incident, {Stage.DONE}, timeout=180)
    assert status.verdict is not None and status.verdict.culprit_nodes == [culprit]

    node = await h.sched.get_node(culprit)
    # Drained by the node's decision, which the job's recovery joined.
    assert status.node_decision is not None
    assert node.drain_flag and status.node_decision in node.reason
    job = await h.sched.get_job(job_id)
    assert job.state is JobState.RUNNING and culprit not in job.nodes
    resumed = await h.wait_log(job_id, r"resumed from checkpoint step=(\d+)")
    assert int(resumed.group(1)) >= last_ckpt

    # The watcher's reads and the worker's drain and requeue all went through sshd.
    sent = sshd.slurm_commands()[sent_before:]
    brief = ["env", "SLURM_TIME_FORMAT=%s", "squeue", "--states=all", "--noheader"]
    assert any(c[:5] == brief for c in sent), sent[:5]  # the listing the requeue decides on
    drains = [
        c for c in sent if c[:4] == ["scontrol", "update", f"NodeName={culprit}", "State=DRAIN"]
    ]
    assert len(drains) == 1 and status.node_decision in drains[0][4]
    assert ["scontrol", "requeue", job_id] in sent
