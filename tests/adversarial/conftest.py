"""Fixtures of the hostile-job tier: the session's real stack, a non-root Slurm user whose jobs
are the attacks, a root-only secret, and per test module one Relaunch cluster (a real worker
and watcher as processes, and the console in-process against the same PostgreSQL).

A module may set ``POLICY`` (a :class:`Policy`) and ``SSH_USER`` (run the cluster's Slurm
commands over the session's real sshd as that account)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaunch.connectors.audit import AuditStore
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.devstack.stack import Stack
from relaunch.models.config import ConsoleSettings
from relaunch.models.recovery import Mode, Policy
from tests.adversarial.hostile import HOSTILE_USER, Secret, Tier, ensure_user
from tests.integration.harness import Harness
from tests.integration.sshd import Sshd, sshd  # noqa: F401 - the session's real sshd fixture

# Autonomous, so that a drain would really happen; a guard of one node, so that a regression
# drains at most one healthy node of the four.
# Each recovery plans its own drain here, so that every row's verdict and plan are the job's
# own to check: what a hostile job's output can make of a plan. Node decisions are joined only
# on the same trusted convictions (tests/unit/test_node_decision.py), and the burst benchmark's
# trust variant runs this tier's question at rack scale.
DEFAULT_POLICY = Policy(
    mode=Mode.AUTONOMOUS,
    drain_share=0.25,
    drain_cap=1,
    verify_timeout_s=20,
    approval_timeout_s=900,
    node_decisions=False,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/adversarial/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
async def tier(stack: Stack, request: pytest.FixtureRequest) -> AsyncIterator[Tier]:
    """The module's Relaunch cluster on the session's stack: its worker and watcher running,
    the hostile user's directory, the secret file, and a console client (a viewer's token)."""
    user = ensure_user(HOSTILE_USER)
    root = Path(tempfile.mkdtemp(prefix="relaunch-adv-"))
    root.chmod(0o755)  # the hostile user writes its job output below
    home = root / "mallory"
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)
    secret = Secret.create(root / "etc-relaunch")
    client = await Client.connect(
        stack.temporal_address, namespace="default", data_converter=pydantic_data_converter
    )
    audit = await AuditStore.open(stack.database_url)
    h = Harness(stack, root, client, audit, getattr(request.module, "POLICY", DEFAULT_POLICY))
    tokens_file = root / "tokens.json"
    token = write_tokens(tokens_file, [("vera", ConsoleRole.VIEWER)])["vera"]
    updates: dict[str, object] = {
        "console": ConsoleSettings(tokens_file=str(tokens_file)),
        # Every detection reaches its recovery's timeline at once: a row's "never detected"
        # must not pass because a held sign had not been handed over yet.
        "watch": h.config.watch.model_copy(update={"follow_up_hold_s": 0.0}),
    }
    ssh_user = getattr(request.module, "SSH_USER", None)
    if ssh_user:
        server: Sshd = request.getfixturevalue("sshd")
        ensure_user(ssh_user)
        # A new account's password is locked ("!"), and sshd without PAM refuses a locked
        # account even for a key; "*" still allows no password.
        subprocess.run(["usermod", "-p", "*", ssh_user], check=True, timeout=60)
        # The SSH account runs squeue/sbatch itself: it must reach slurm.conf and munge's
        # socket under the session's stack directory (created 0700).
        stack.state_dir.parent.chmod(0o711)
        updates["ssh"] = server.settings(user=ssh_user)
    h.configure(**updates)
    h.start("worker")
    h.start("watch")
    app = create_app(h.config, Services(scheduler=h.sched), secret="adversarial-tier-" * 3)
    try:
        with TestClient(app, follow_redirects=False) as console:
            yield Tier(h, user, home, secret, console, token)
    finally:
        services = list(h.procs.values())
        try:
            await h.stop()
        except subprocess.TimeoutExpired:  # a service stuck on an attack: do not leave it
            for proc in services:
                proc.kill()
            h.procs.clear()
            await h.stop()
        await h.restore_nodes()
        await audit.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def arena(tier: Tier) -> AsyncIterator[Tier]:
    """The module's tier for one test, on a cluster whose nodes are all idle and in service
    (a job submitted while a node still registers can be refused for good: BadConstraints);
    afterwards the test's jobs are cancelled, blocked FIFO writers released, and every node
    back in service."""
    cancel_strangers(tier)
    await tier.h.restore_nodes()
    await schedulable(tier)
    # A job of an earlier test that was still completing (requeued) is pending by now: its
    # start on a node would take the node from this test (a CI run's "Resources" wait).
    if cancel_strangers(tier):
        await tier.h.restore_nodes()
    try:
        yield tier
    finally:
        if tier.h.jobs:
            subprocess.run(["scancel", *tier.h.jobs], env=tier.env, timeout=30, check=False)
        tier.release_fifos()
        tier.h.jobs.clear()
        await tier.h.restore_nodes()
        tier.release_fifos()


async def schedulable(tier: Tier, timeout: float = 90.0) -> None:
    """Wait until the cluster schedules a job on every node. Nodes that list idle may not be
    fully registered yet, and Slurm refuses a job submitted then for good (BadConstraints; a CI
    run's first job): a probe job over all of them, not opted in, submitted again until it runs."""
    nodes = len(tier.h.stack.slurm.nodes)
    deadline = time.monotonic() + timeout
    while True:
        probe = subprocess.run(
            ["sbatch", "--parsable", f"-N{nodes}", "--comment=relaunch=off", "-o", "/dev/null",
             "--wrap", "true"],
            env=tier.env, capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip().split(";")[0]  # fmt: skip
        while time.monotonic() < deadline:
            shown = subprocess.run(
                ["squeue", "-h", "-t", "all", "-j", probe, "-o", "%T %r"],
                env=tier.env, capture_output=True, text=True, timeout=30, check=False,
            ).stdout.split()  # fmt: skip
            if not shown or shown[0] in {"RUNNING", "COMPLETING", "COMPLETED"}:
                return
            if "BadConstraints" in shown[1:]:
                break  # refused for good: cancel it and submit again
            await asyncio.sleep(0.5)
        subprocess.run(["scancel", probe], env=tier.env, timeout=30, check=False)
        if time.monotonic() >= deadline:
            raise AssertionError(f"no job runs on all {nodes} nodes after {timeout:.0f}s")
        await asyncio.sleep(1.0)


# Every state a job can leave again (squeue's default leaves out some, e.g. REQUEUED and
# REQUEUE_HOLD: a requeued job of an earlier test would come back and take a node).
UNFINISHED = (
    "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,RESIZING,REQUEUED,REQUEUE_FED,"
    "REQUEUE_HOLD,SIGNALING,STAGE_OUT,STOPPED"
)


def cancel_strangers(tier: Tier) -> list[str]:
    """Cancel the jobs of earlier tests on this worker's cluster (their harnesses' own clean-up
    may still be under way): the arena needs every node idle. The jobs cancelled."""
    listed = subprocess.run(
        ["squeue", "-h", "-t", UNFINISHED, "-o", "%i|%k"],
        env=tier.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    # Every one, the tier's own included: a test's jobs are its own (submitted after this),
    # and one Relaunch resubmitted for an earlier test carries the tier's option too.
    strangers = [
        job_id
        for line in listed.splitlines()
        if (job_id := line.partition("|")[0].strip()).isdigit()
    ]
    if strangers:
        subprocess.run(["scancel", *strangers], env=tier.env, timeout=30, check=False)
    return strangers
