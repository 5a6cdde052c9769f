"""The scorecard page in a real headless Chromium (Playwright driving Debian's chromium), on a
console served on a local port over an embedded PostgreSQL that holds a realistic history
(tests/support/scorecard_story.py; no Slurm or Temporal needed): an admin sees the suggestions
and promotes one with a click, the page then shows the change; a viewer sees no button.

RELAUNCH_SCREENSHOTS=docs/screenshots saves docs/screenshots/scorecard.png."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.async_api import Browser, ConsoleMessage, expect

from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from tests.integration.serve import serve
from tests.integration.test_console_browser import browser, shot, signed_in  # noqa: F401
from tests.support.postgres import embedded_postgres
from tests.support.scorecard_story import scorecard_config, write_story

pytestmark = [pytest.mark.timeout(240)]
SECRET = "console-scorecard-browser-secret-0123456789"


async def test_the_scorecard_in_the_browser(browser: Browser, tmp_path: Path) -> None:  # noqa: F811
    with embedded_postgres("relaunch-scorecard-browser-") as url:
        story = await write_story(url, "gpu-a", hostile=False)
        users = [("ops", ConsoleRole.ADMIN), ("vera", ConsoleRole.VIEWER)]
        tokens = write_tokens(tmp_path / "tokens.json", users)
        config = scorecard_config("gpu-a", url, str(tmp_path / "gpu-a"))
        app = create_app(config, Services(), tokens_file=tmp_path / "tokens.json", secret=SECRET)
        with serve(app) as base:
            context, page = await signed_in(browser, base, tokens["ops"])
            errors: list[str] = []

            def on_console(message: ConsoleMessage) -> None:
                if message.type == "error":
                    errors.append(message.text)

            page.on("console", on_console)
            await page.click("[data-test=nav-scorecard]")
            await expect(page.locator("[data-test=suggestion]")).to_have_count(2)
            await expect(page.locator("[data-test=recommended-total]")).to_have_text("13")
            drains = page.locator("[data-test=precision-drain]")
            await expect(drains).to_contain_text("drains: 3 right, 1 wrong, 1 pending")
            await shot(page, "scorecard")

            # Promote network with a click: recorded with the admin's name and reason.
            network = page.locator("[data-test=suggestion][data-name=network]")
            await expect(
                network.locator(f'a[href="/incidents/{story.network[0]}"]')
            ).to_be_visible()
            await network.locator("[data-test=suggestion-reason]").fill("3 of 3 right; reviewed")
            await network.locator("[data-test=suggestion-promote]").click()
            row = page.locator("[data-test=scope-row][data-scope=category][data-name=network]")
            await expect(row).to_have_attribute("data-mode", "autonomous")
            await expect(page.locator("[data-test=suggestion]")).to_have_count(1)
            change = page.locator("[data-test=mode-change]").first
            await expect(change).to_contain_text("ops")
            await expect(change).to_contain_text("3 of 3 right; reviewed")
            assert errors == []  # no CSP violation, no failed asset
            await context.close()

            # A viewer sees the suggestion that is left, and no button.
            context, viewer = await signed_in(browser, base, tokens["vera"])
            await viewer.goto("/scorecard")
            await expect(viewer.locator("[data-test=suggestion]")).to_have_count(1)
            assert await viewer.locator("[data-test=suggestion-form]").count() == 0
            await context.close()
