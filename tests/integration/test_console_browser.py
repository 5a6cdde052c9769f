"""The Recovery Console in a real headless Chromium (Playwright driving Debian's chromium) against
the real stack: a real worker, watcher and console process, the DDP job, a node failure in
monitor mode. A recovery appears live; an approver approves it with a click and watches it
complete; a viewer sees no Approve button and a forged POST is refused.

Set RELAUNCH_SCREENSHOTS=<dir> to save a screenshot of every page there (docs/screenshots is
made that way)."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.devstack import procs
from relaunch.models.config import ConsoleSettings
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.workflows import recovery_client
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.test_recovery import start_training

LIVE = 90_000  # ms: a page must show a change this soon without being reloaded
SHOTS = os.environ.get("RELAUNCH_SCREENSHOTS")


def chromium() -> str:
    for candidate in ("/usr/lib/chromium/chromium", shutil.which("chromium") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("Debian's chromium is not installed (scripts/install-deps.sh installs it)")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield browser
        finally:
            await browser.close()


async def signed_in(browser: Browser, base: str, token: str) -> tuple[BrowserContext, Page]:
    context = await browser.new_context(base_url=base, viewport={"width": 1400, "height": 1000})
    page = await context.new_page()
    await page.goto("/login")
    await page.fill("[data-test=login-token]", token)
    await page.click("[data-test=login-submit]")
    await expect(page.locator("[data-test=user]")).to_be_visible()
    return context, page


async def shot(page: Page, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def console_for(h: Harness) -> tuple[str, dict[str, str]]:
    users = [
        ("vera", ConsoleRole.VIEWER),
        ("april", ConsoleRole.APPROVER),
        ("adam", ConsoleRole.ADMIN),
    ]
    tokens = write_tokens(h.tmp / h.config.name / "console-tokens.json", users)
    port = procs.free_port()
    h.configure(
        console=ConsoleSettings(
            tokens_file=str(h.tmp / h.config.name / "console-tokens.json"), port=port
        )
    )
    h.start("console")
    return f"http://127.0.0.1:{port}", tokens


async def test_a_monitor_mode_recovery_live_in_the_browser(
    make_harness: MakeHarness, browser: Browser
) -> None:
    # A recovery that plans its own drain: its page holds the recommendation and the buttons.
    h = make_harness(Policy(mode=Mode.MONITOR, verify_timeout_s=120, node_decisions=False))
    base, tokens = console_for(h)
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    culprit = nodes[1]

    approver_ctx, overview = await signed_in(browser, base, tokens["april"])
    viewer_ctx, viewer = await signed_in(browser, base, tokens["vera"])
    await overview.goto("/")
    await expect(overview.locator("[data-test=pending-approvals]")).to_be_visible()

    h.kill_node(culprit, job_id)
    incident = h.incident(job_id)

    # It appears on the open overview without a reload, awaiting approval.
    pending = overview.locator("[data-test=pending-row]", has_text=incident)
    await expect(pending).to_be_visible(timeout=LIVE)
    await shot(overview, "overview-pending")

    # A viewer sees the recommendation but no control to act on it.
    await viewer.goto(f"/incidents/{incident}")
    await expect(viewer.locator("[data-test=verdict-nodes]")).to_have_text(culprit)
    assert await viewer.locator("[data-test=approve]").count() == 0
    assert await viewer.locator("[data-test=reject]").count() == 0
    # A viewer's POST, and an approver's POST without the form's CSRF token, are refused.
    forged = {"reason": "forged", "csrf": "not-the-token"}
    refused = await viewer.request.post(f"/incidents/{incident}/approve", form=forged)
    assert refused.status == 403
    no_csrf = await overview.request.post(f"/incidents/{incident}/approve", form=forged)
    assert no_csrf.status == 403
    status = await recovery_client.status(h.client, incident)
    assert status.awaiting_approval and status.stage is Stage.AWAITING_APPROVAL

    # The approver opens it, approves with a reason, and watches it run to the end.
    page = overview
    await page.click(f"[data-test=incident-link]:has-text('{incident}')")
    await expect(page.locator("[data-test=incident-id]")).to_have_text(incident)
    await expect(
        page.locator("[data-test=evidence-line][data-decisive=true]").first
    ).to_be_visible()
    await shot(page, "incident-pending")
    await page.fill("[data-test=approve-reason]", "GPU fell off the bus; drain it")
    await page.click("[data-test=approve]")
    timeline = page.locator("[data-test=timeline]")
    await expect(timeline).to_contain_text(f"drain {culprit}: done", timeout=LIVE)
    await expect(timeline).to_contain_text("approved by april", timeout=LIVE)
    await expect(page.locator("[data-test=stage]").first).to_have_text("done", timeout=LIVE * 2)
    await expect(timeline).to_contain_text("verify", timeout=LIVE)
    await shot(page, "incident-done")
    result = await h.handle(incident).result()
    assert result.stage is Stage.DONE

    # The other pages, as an admin sees them (for the screenshots and a last sanity check).
    admin_ctx, admin = await signed_in(browser, base, tokens["adam"])
    for name, path, marker in [
        ("overview", "/", "kpis"),
        ("nodes", "/nodes", "node-list"),
        ("jobs", "/jobs", "job-list"),
        ("job", f"/jobs/{job_id}?cluster={h.config.name}", "lineage"),
        ("audit", f"/audit?incident={incident}", "audit-rows"),
    ]:
        await admin.goto(path)
        await expect(admin.locator(f"[data-test={marker}]")).to_be_visible()
        await shot(admin, name)
    await expect(admin.locator("[data-test=audit-row]").first).to_be_visible()
    await admin.goto(f"/jobs/{job_id}?cluster={h.config.name}")
    await expect(admin.locator("[data-test=checkpoint]").first).to_have_text(re.compile(r"^\d+$"))
    resume = admin.locator(f"[data-test=node-row]:has-text('{culprit}') [data-test=resume]")
    await admin.goto("/nodes")
    await expect(resume).to_be_visible()
    for ctx in (approver_ctx, viewer_ctx, admin_ctx):
        await ctx.close()
