"""A node lifecycle decided in the console, in a real browser, on the stack's "life" cluster (the
cluster of tests/integration/test_lifecycle.py, in the same xdist group so that the two never
run at once; this test uses n4, which that one leaves alone).

A real worker, watcher and console process; the lifecycle in monitor mode. n4's GPU fails
under a user's job (an Xid 79 line in its kernel log, the dev cluster's GPU fault marked; the
node itself stays up); the recovery drains n4 and hands it to its lifecycle, whose first checks
fail. On the nodes page an approver sees the stage and the failed checks and approves the reboot
with a click (a viewer has no button);
the checks after the reboot still fail on the GPU (its output there to unfold), and the
approver rejects the next rung, a GPU reset: the node goes to repair. The repair system's
callback (`POST /intake/repair`) says it is repaired, the checks pass, and the return approved
on the nodes page puts n4 back in service.

RELAUNCH_SCREENSHOTS=docs/screenshots makes docs/screenshots/nodes-lifecycle.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable

import httpx
import pytest
from playwright.async_api import Locator, Page, async_playwright, expect
from temporalio.client import Client

from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.devstack import faults, procs
from relaunch.devstack.stack import Stack
from relaunch.models.config import ConsoleSettings
from relaunch.models.errors import RelaunchError
from relaunch.models.lifecycle import LifecycleSettings, LifecycleStatus, NodeStage, lifecycle_id
from relaunch.models.recovery import AutoAction, Mode, Policy
from relaunch.workflows.lifecycle import NodeLifecycleWorkflow
from tests.conftest import sbatch
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import restore_lifecycles
from tests.integration.test_console_browser import chromium, shot, signed_in

pytestmark = [pytest.mark.xdist_group("lifecycle"), pytest.mark.timeout(600)]
CLUSTER = "life"
NODE = "n4"
WAIT = 180.0


def console_with_intake(h: Harness) -> tuple[str, dict[str, str]]:
    """The harness's console process, with a viewer, an approver and the repair system's
    intake token."""
    path = h.tmp / h.config.name / "console-tokens.json"
    tokens = write_tokens(
        path,
        [
            ("vera", ConsoleRole.VIEWER),
            ("april", ConsoleRole.APPROVER),
            ("fixit", ConsoleRole.REPAIR),
        ],
    )
    port = procs.free_port()
    h.configure(console=ConsoleSettings(tokens_file=str(path), port=port))
    h.start("console")
    return f"http://127.0.0.1:{port}", tokens


async def test_a_lifecycle_is_decided_on_the_nodes_page(
    stack: Stack, make_harness: MakeHarness, temporal_client: Client
) -> None:
    home = stack.home(CLUSTER)
    layout = home.slurm
    sched = stack.scheduler(CLUSTER)
    (home.root / "checks").mkdir(parents=True, exist_ok=True)
    h = make_harness(
        Policy(
            mode=Mode.AUTONOMOUS,
            verify_timeout_s=60,
            drain_share=1.0,
            drain_cap=10,
            # The monitor-mode lifecycle asks for its rungs and return here, not its checks
            # and ticket (tests/unit/test_monitor_asks.py has those asked).
            auto_actions=[AutoAction.CHECKS, AutoAction.REPAIR_TICKET],
        )
    )
    h.sched = sched
    lifecycle = LifecycleSettings.model_validate(
        {
            **stack.lifecycle_settings(home).model_dump(),
            # Time for the user's job to end before the checks (cancelled below).
            "settle_s": 15.0,
            "mode": Mode.MONITOR,
            # A reboot, then a GPU reset (each asked for): the reset waits while the checks
            # after the reboot show the GPU check's failure on the node itself.
            "ladders": {"reboot": ["reboot", "gpu_reset", "escalate"]},
        }
    )
    h.configure(**layout.config_fields, lifecycle=lifecycle)
    try:
        base, tokens = console_with_intake(h)
        h.start("worker")
        h.start("watch")
        await _story(h, stack, base, tokens, temporal_client)
    finally:
        for proc in list(h.procs):
            h.kill(proc)
        await restore_lifecycles(home, sched, h.config.name, temporal_client)


async def _story(
    h: Harness, stack: Stack, base: str, tokens: dict[str, str], client: Client
) -> None:
    home = stack.home(CLUSTER)
    layout = home.slurm
    sched = h.sched
    name = h.config.name
    lid = lifecycle_id(name, NODE, 1)
    node_dir = home.root / "nodes" / NODE

    async def status() -> LifecycleStatus | None:
        try:
            return await client.get_workflow_handle(lid).query(NodeLifecycleWorkflow.status)
        except Exception:
            return None

    async def until(check: Callable[[LifecycleStatus], bool], what: str) -> LifecycleStatus:
        deadline = time.monotonic() + WAIT
        last = None
        while time.monotonic() < deadline:
            last = await status()
            if last is not None and check(last):
                return last
            await asyncio.sleep(0.5)
        raise AssertionError(f"{lid}: {what} after {WAIT}s: {last}")

    async def stages() -> list[str]:
        return [str(e.stage) for e in await h.events(lid, "node_stage")]

    # ---- n4's GPU fails under a user's job: drained, then its lifecycle.
    env = {**os.environ, **layout.env}
    job = sbatch(
        env,
        "-w", NODE, "-N1", "-J", "victim",
        f"--comment=relaunch=on,relaunch_cluster={name}",
        "-o", str(h.tmp / f"victim-{NODE}-%j.out"),
        script="#!/bin/sh\nsleep 600\n",
    )  # fmt: skip
    h.jobs.append(job)
    deadline = time.monotonic() + 60
    while _job_state(env, job) != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} not running"
        await asyncio.sleep(0.3)
    await asyncio.sleep(2)  # the watcher has seen it running
    faults.mark_gpu_fault(node_dir)
    h.inject_xid(NODE)

    async def drained() -> bool:
        return "drained" in await stages()

    await h.until(drained, f"{NODE}'s lifecycle drained", timeout=90)
    # The user gives up on the job (whatever its recovery did with it) while the lifecycle
    # lets the node settle: the node is free for the checks.
    with contextlib.suppress(RelaunchError):  # requeued or resubmitted by its recovery
        await sched.cancel_job(job)
    asked = await until(lambda s: s.pending is not None, "no pending step")
    assert asked.pending is not None and asked.pending.step == "reboot", asked
    assert asked.stage is NodeStage.REMEDIATING
    assert (await sched.get_node(NODE)).drain_flag
    diagnosis = (await h.events(lid, "checks"))[0].data
    assert diagnosis["purpose"] == "diagnose" and not diagnosis["passed"], diagnosis

    # ---- the repair callback, while nothing waits for a repair: refused, with the reason.
    repair_url = f"{base}/intake/repair"
    intake = {"authorization": f"Bearer {tokens['fixit']}"}
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(repair_url, json={"node": NODE, "by": "tech"}, headers=intake)
        assert r.status_code == 409 and "remediating" in r.json()["error"], r.text
        r = await http.post(repair_url, json={"node": "n1", "by": "tech"}, headers=intake)
        assert r.status_code == 404, r.text

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            # A viewer sees the stage and the checks, and no control to decide.
            viewer_ctx, viewer = await signed_in(browser, base, tokens["vera"])
            await viewer.goto("/nodes")
            row = viewer.locator(f"[data-test=lifecycle][data-node={NODE}]")
            await expect(row).to_have_attribute("data-stage", "remediating")
            await expect(row.locator("[data-test=lifecycle-readonly]")).to_be_visible()
            assert await viewer.locator("[data-test=lifecycle-approve]").count() == 0

            # The approver: the diagnosis failed, the reboot waits. Approve it.
            ctx, page = await signed_in(browser, base, tokens["april"])
            await page.goto("/nodes")
            row = page.locator(f"[data-test=lifecycle][data-node={NODE}]")
            pending = row.locator("[data-test=lifecycle-pending]")
            await expect(row).to_have_attribute("data-stage", "remediating")
            await expect(pending).to_have_attribute("data-step", "reboot")
            await expect(row.locator("[data-test=lifecycle-link]")).to_have_text(lid)
            await expect(row.locator("[data-test=checks-outcome]")).to_have_text("failed")
            await expect(row.locator("[data-test=check-results]")).to_have_attribute(
                "data-purpose", "diagnose"
            )
            await row.locator("[data-test=lifecycle-approve-reason]").fill("GPU fault: reboot")
            await row.locator("[data-test=lifecycle-approve]").click()
            await expect(page).to_have_url(re.compile(r"/nodes$"))

            # The lifecycle moves on: n4 rebooted, checked again on the node itself; the GPU
            # check still fails, and the next rung (a GPU reset) waits.
            asked = await until(
                lambda s: s.pending is not None and s.pending.step == "gpu_reset",
                "no GPU reset asked",
            )
            assert asked.tried == ["reboot"], asked
            await _page_until(page, pending, "data-step", "gpu_reset")
            await expect(row.locator("[data-test=check-results]")).to_have_attribute(
                "data-purpose", "validate after reboot"
            )
            gpu = row.locator("[data-test=check-result][data-check=dev-gpu]")
            await expect(gpu).to_have_attribute("data-result", "failed")
            output = gpu.locator("[data-test=check-output]")
            await expect(output).to_be_hidden()  # folded until asked for
            await gpu.locator("summary").click()
            await expect(output).to_contain_text("GPU has fallen off the bus")
            basics = row.locator("[data-test=check-result][data-check=node-basics]")
            await expect(basics).to_have_attribute("data-result", "passed")
            skipped = row.locator("[data-test=check-result][data-check=gpu-smi]")
            await expect(skipped).to_contain_text(f"nvidia-smi is not installed on {NODE}")
            await shot(page, "nodes-lifecycle")
            # The viewer's page, reloaded: the same, still without controls.
            await viewer.reload()
            await expect(viewer.locator("[data-test=lifecycle-pending]")).to_have_attribute(
                "data-step", "gpu_reset"
            )
            assert await viewer.locator("[data-test=lifecycle-reject]").count() == 0
            await viewer_ctx.close()

            # Reject it: the node goes to repair, drained with its ticket.
            await row.locator("[data-test=lifecycle-reject-reason]").fill("needs a new GPU")
            await row.locator("[data-test=lifecycle-reject]").click()
            await expect(page).to_have_url(re.compile(r"/nodes$"))
            held = await until(lambda s: s.stage is NodeStage.ESCALATED, "not escalated")
            assert held.tried == ["reboot"] and held.ticket == lid, held
            await _page_until(page, row, "data-stage", "escalated")
            await expect(page.locator(f"[data-test=node-row][data-node={NODE}]")).to_contain_text(
                f"relaunch: repair {lid}"
            )

            # Repaired for real: the repair system's callback; validated; the return asked.
            faults.clear_gpu_fault(node_dir)
            async with httpx.AsyncClient(timeout=30) as http:
                body = {"node": NODE, "by": "tech", "ticket": lid, "note": "GPU replaced"}
                r = await http.post(repair_url, json=body, headers=intake)
            assert r.status_code == 202, r.text
            assert r.json()["lifecycle"] == lid
            await until(
                lambda s: s.pending is not None and s.pending.step == "return", "no return asked"
            )
            await _page_until(page, pending, "data-step", "return")
            await expect(row.locator("[data-test=checks-outcome]")).to_have_text("passed")
            await expect(row.locator("[data-test=check-results]")).to_have_attribute(
                "data-purpose", "validate after repair"
            )
            await row.locator("[data-test=lifecycle-approve]").click()
            await until(lambda s: s.stage is NodeStage.RETURNED, "not returned")
            await _page_until(page, row, "data-stage", "returned")
            # The lifecycle's own page: its stages, every check run, the decisions.
            await page.click(f"[data-test=lifecycle][data-node={NODE}] [data-test=lifecycle-link]")
            await expect(page.locator("[data-test=incident-id]")).to_have_text(lid)
            await expect(page.locator("[data-test=lifecycle-node]")).to_have_text(NODE)
            await expect(page.locator("[data-test=check-run]")).to_have_count(
                len(await h.events(lid, "checks"))
            )
            await expect(page.locator("[data-test=decision-row]")).to_have_count(3)
            await ctx.close()
        finally:
            await browser.close()

    n4 = await sched.get_node(NODE)
    assert not n4.drain_flag and n4.responding, n4.display_state
    decided = [
        (e.kind, e.actor, e.data["step"], e.data["reason"])
        for e in await h.events(lid)
        if e.kind in {"approval", "rejection"}
    ]
    assert decided == [
        ("approval", "april", "reboot", "GPU fault: reboot"),
        ("rejection", "april", "gpu_reset", "needs a new GPU"),
        ("approval", "april", "return", ""),
    ]
    repaired = await h.events(lid, "repaired")
    assert [(r.actor, r.data["note"]) for r in repaired] == [("tech", "GPU replaced")]
    assert (await stages())[-1] == "returned"


def _job_state(env: dict[str, str], job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()


async def _page_until(page: Page, locator: Locator, attr: str, value: str) -> None:
    """Reload the page until ``locator`` has ``attr`` = ``value`` (the nodes page is not live:
    it reads Slurm at each load)."""
    deadline = time.monotonic() + 60
    seen = None
    while time.monotonic() < deadline:
        await page.reload()
        seen = await locator.get_attribute(attr) if await locator.count() else None
        if seen == value:
            return
        await asyncio.sleep(1)
    raise AssertionError(f"{attr} still {seen!r}, not {value!r}, after 60s")
