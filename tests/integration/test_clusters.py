"""Two real Slurm clusters side by side, as `relaunch dev up --clusters a,b` runs them: each its
own munged, slurmctld, slurmds, worker and watcher; one Temporal, one PostgreSQL and one console
for both. The same node name fails on both, a minute apart: each recovery drains its own
cluster's node only; a's worker, killed, delays a's recovery and nothing of b's; an approver
limited to a cannot see or decide b's incidents, in the console or with a's configuration in the
CLI; the blast-radius guard and the nodes' reputation count per cluster."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright, expect
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaunch.connectors.audit import AuditStore
from relaunch.devstack import faults, procs
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.devstack.workload import submit_training
from relaunch.models.config import WatchSettings
from relaunch.models.lifecycle import LifecycleSettings
from relaunch.models.recovery import (
    TERMINAL_STAGES,
    Mode,
    Policy,
    RecoveryStatus,
    Stage,
    recovery_workflow_id,
)
from relaunch.models.scheduler import JobState
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.integration.helpers import wait_job
from tests.integration.test_console_browser import chromium, shot, signed_in

pytestmark = pytest.mark.xdist_group("clusters")

RELAUNCH = [sys.executable, "-m", "relaunch.cli"]
NODE = "n2"  # the node name that fails on both clusters


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack of clusters a and b with their services, on free ports; both act on their own
    (autonomous mode), their watchers look every half second. Its files stay with pytest's
    temporary folders (the services' logs, for a failure)."""
    root = tmp_path_factory.mktemp("clusters")
    root.chmod(0o755)
    stack = Stack(root / "state", StackConfig.with_free_ports("b", cluster="a", cred_expire=10))
    try:
        for home in stack.clusters:  # written before `up`, which keeps a configuration it finds
            config = stack.cluster_config(home.name).model_copy(
                update={
                    "policy": Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=150),
                    "watch": WatchSettings(poll_interval_s=0.5),
                    # The drains are what this test checks: no lifecycle returns the nodes.
                    "lifecycle": LifecycleSettings(enabled=False),
                }
            )
            home.config_path.parent.mkdir(parents=True, exist_ok=True)
            home.config_path.write_text(config.model_dump_json(indent=2))
            for node in home.slurm.nodes:
                home.node_log(node).parent.mkdir(parents=True, exist_ok=True)
                home.node_log(node).touch()
        stack.up()  # returns once every worker, watcher and the console works
        status = stack.status()  # `relaunch dev status`: every cluster's parts, by name
        assert status.healthy, [p for p in status.parts if not p.healthy]
        names = {p.name for p in status.parts}
        for name in ("a", "b"):
            assert {f"slurmctld {name}", f"slurmd {name} n2", f"relaunch worker {name}"} <= names
        assert "relaunch console" in names
        yield stack
    finally:
        stack.down()
        shutil.rmtree(stack.state_dir / "postgres", ignore_errors=True)


def tokens(stack: Stack) -> dict[str, str]:
    """The console's sign-in tokens by user name (tokens.txt: name role token [clusters])."""
    lines = stack.console_tokens.read_text().splitlines()
    return {f[0]: f[2] for f in (line.split() for line in lines if not line.startswith("#"))}


async def status(client: Client, incident: str) -> RecoveryStatus:
    handle = client.get_workflow_handle_for(RecoveryWorkflow.run, incident)
    return await handle.query(RecoveryWorkflow.status)


async def wait_done(client: Client, incident: str, timeout: float) -> RecoveryStatus:
    deadline = time.monotonic() + timeout
    last: RecoveryStatus | None = None
    while time.monotonic() < deadline:
        try:
            last = await status(client, incident)
        except Exception:  # not started yet, or no worker to answer the query
            last = None
        if last is not None and last.stage in TERMINAL_STAGES:
            assert last.stage is Stage.DONE, f"{incident}: {last.stage} {last.outcome}"
            return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"{incident} not done in {timeout}s: {last}")


def append(path: Path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def kill_worker(stack: Stack, cluster: str) -> None:
    pid = stack.home(cluster).service_pid("worker")
    assert pid is not None, f"no worker of cluster {cluster}"
    os.kill(pid, signal.SIGKILL)
    procs.wait_for(lambda: not procs.pid_alive(pid), 10, f"worker {cluster} killed")


async def test_two_clusters_the_same_node_name_fails_on_both(two: Stack, tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    stack = two
    client = await Client.connect(
        stack.temporal_address, namespace="default", data_converter=pydantic_data_converter
    )
    jobs: dict[str, str] = {}
    for name in ("a", "b"):
        workdir = tmp_path / name
        workdir.mkdir(mode=0o755)
        jobs[name] = submit_training(
            stack.home(name).slurm.env,
            workdir=workdir,
            args=["--step-sleep", "0.2", "--ckpt-every", "5"],
        )
    for name in ("a", "b"):
        job = await wait_job(stack.scheduler(name), jobs[name], JobState.RUNNING, timeout=90)
        assert NODE in job.nodes, job  # 2-node jobs on an idle 4-node cluster: n1 and n2
    await asyncio.sleep(2)  # a watcher's poll or two: it has seen the jobs and their nodes
    since = datetime.now(UTC) - timedelta(minutes=1)
    incidents = {name: recovery_workflow_id(name, jobs[name], 0) for name in ("a", "b")}

    # a's worker dies; then n2 fails on a, and a few seconds later n2 fails on b.
    kill_worker(stack, "a")
    for name in ("a", "b"):
        append(stack.node_log(NODE, name), faults.xid79_line(NODE))
        await asyncio.sleep(3)

    # b's recovery goes its whole way while a's waits for a worker.
    done_b = await wait_done(client, incidents["b"], timeout=240)
    assert done_b.verdict is not None and done_b.verdict.culprit_nodes == [NODE]
    b_nodes = {n.name: n for n in await stack.scheduler("b").list_nodes()}
    assert b_nodes[NODE].drain_flag, b_nodes[NODE]
    assert b_nodes[NODE].reason.startswith("relaunch incident relaunch-b-"), b_nodes[NODE]
    assert not any(n.drain_flag for name, n in b_nodes.items() if name != NODE)
    a_nodes = {n.name: n for n in await stack.scheduler("a").list_nodes()}
    assert not any(n.drain_flag for n in a_nodes.values()), "b's recovery touched cluster a"
    assert (await stack.scheduler("a").get_job(jobs["a"])).restart_count == 0

    # An approver of a only: b's incident is not theirs, in the console or the CLI.
    token = tokens(stack)
    async with httpx.AsyncClient(base_url=stack.console_url, timeout=20) as http:
        approver_a = {"authorization": f"Bearer {token['approver-a']}"}
        seen = await http.get(f"/incidents/{incidents['b']}", headers=approver_a)
        assert seen.status_code == 403, seen.text[:300]
        decided = await http.post(f"/incidents/{incidents['b']}/approve", headers=approver_a)
        assert decided.status_code == 403, decided.text[:300]
        listed = await http.get("/audit.json", headers=approver_a)
        assert listed.status_code == 200
        assert incidents["b"] not in listed.text
        admin = {"authorization": f"Bearer {token['admin']}"}
        shown = await http.get(f"/incidents/{incidents['b']}", headers=admin)
        assert shown.status_code == 200
    refused = subprocess.run(
        [
            *RELAUNCH,
            "approve",
            incidents["b"],
            "--by",
            "alice",
            "--cluster",
            "a",
            "--state-dir",
            str(stack.state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert f"incident {incidents['b']} is of cluster b, not of cluster a" in refused.stderr
    assert "Traceback" not in refused.stderr

    # a's worker is back (`relaunch dev up` restarts what is not running): a recovers, on a.
    await asyncio.to_thread(stack.up)
    done_a = await wait_done(client, incidents["a"], timeout=240)
    assert done_a.verdict is not None and done_a.verdict.culprit_nodes == [NODE]
    a_nodes = {n.name: n for n in await stack.scheduler("a").list_nodes()}
    assert a_nodes[NODE].drain_flag and not any(
        n.drain_flag for name, n in a_nodes.items() if name != NODE
    )
    assert a_nodes[NODE].reason.startswith("relaunch incident relaunch-a-"), a_nodes[NODE]
    b_job = await stack.scheduler("b").get_job(jobs["b"])
    assert b_job.restart_count == 1, b_job  # a's recovery did not requeue b's job a second time

    # The guard and the reputation count per cluster: each cluster's n2 with its own
    # incidents only.
    audit = await AuditStore.open(stack.database_url)
    try:
        for name in ("a", "b"):
            assert await audit.drained_nodes(name, since) == [NODE]
            reputation = {r.node: r for r in await audit.node_reputation(name, since)}
            assert set(reputation) == {NODE}, reputation
            recent = reputation[NODE].recent
            assert reputation[NODE].incidents == len(recent), reputation
            assert all(i.startswith(f"relaunch-{name}-") for i in recent), recent
            rows = await audit.incidents(cluster=name, since=since)
            assert rows and all(r.cluster == name for r in rows)
    finally:
        await audit.close()
    await console_shows_both(stack, incidents, token)
    for name in ("a", "b"):
        shown = subprocess.run(
            [*RELAUNCH, "show", incidents[name], "--cluster", name, "--state-dir",
             str(stack.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr


async def console_shows_both(
    stack: Stack, incidents: dict[str, str], token: dict[str, str]
) -> None:
    """The console in a real browser: an admin sees both clusters' incidents and the cluster
    filter; the approver of a sees a's only (RELAUNCH_SCREENSHOTS: docs/screenshots)."""
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            context, page = await signed_in(browser, stack.console_url, token["admin"])
            await page.goto("/")
            await expect(page.locator("[data-test=cluster-nav]")).to_be_visible()
            for name in ("a", "b"):
                await expect(page.locator(f"[data-test=cluster-{name}]")).to_be_visible()
                await expect(page.locator(f"text={incidents[name]}").first).to_be_visible()
            await shot(page, "overview-clusters")
            await page.goto("/nodes?cluster=b")
            await expect(page.locator("text=relaunch incident relaunch-b-").first).to_be_visible()
            await shot(page, "nodes-cluster-b")
            await context.close()
            context, page = await signed_in(browser, stack.console_url, token["approver-a"])
            await page.goto("/")
            await expect(page.locator("[data-test=user-clusters]")).to_have_text("cluster a")
            await expect(page.locator(f"text={incidents['a']}").first).to_be_visible()
            assert await page.locator(f"text={incidents['b']}").count() == 0
            await context.close()
        finally:
            await browser.close()
