"""What a job printed never drives the operator's terminal in `relaunch show` and `explain`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.cli.incidents import format_timeline
from relaunch.cli.terminal import printable
from relaunch.cli.verdicts import explain
from relaunch.connectors.audit import StoredEvent
from relaunch.connectors.bundles import read_bundle, write_bundle
from relaunch.detection.attribution import attribute_bundle
from relaunch.models.bundle import BundleJob
from relaunch.models.config import ClusterConfig


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[31mred\x1b[0m text", "red text"),  # CSI colours
        ("ok\x1b[2K\x1b[1A\rforged line", "okforged line"),  # erase, cursor up, carriage return
        ("\x1b]0;new title\x07after", "after"),  # OSC window title, BEL-terminated
        ("\x1b]52;c;ZWNobyBwd25lZA==\x1b\\after", "after"),  # OSC 52: write the clipboard
        ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink
        ("\x1bPq#0;2;0;0;0\x1b\\sixel", "sixel"),  # DCS
        ("\x9b31mC1 CSI", "31mC1 CSI"),  # an 8-bit CSI loses its power with its introducer
        ("back\x08\x08space\x7f", "backspace"),
        ("lone \x1b", "lone "),
        ("abc\u202edcba", "abcdcba"),  # a right-to-left override
    ],
)
def test_escape_sequences_and_controls_are_removed(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_text_newlines_and_tabs_are_kept() -> None:
    text = "rank 3:\tNCCL WARN NET/IB — ошибка ✓\nnext line"
    assert printable(text) == text


def test_stripping_is_linear_on_hostile_input() -> None:
    hostile = "\x1b]" * 200_000 + "\x1b[" + "1;" * 200_000
    started = time.monotonic()
    printable(hostile)
    assert time.monotonic() - started < 1.0


def test_the_timeline_shows_a_hostile_summary_inertly() -> None:
    at = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
    event = StoredEvent(
        id=1,
        incident_id="relaunch-dev-7-0",
        kind="detection",
        at=at,
        summary="job_log: x \x1b]0;pwned\x07\x1b[2J\x1b[Hfake: node n1 healthy",
    )
    config = ClusterConfig(name="dev", database_url="postgresql://x", bundle_dir="/tmp")
    out = format_timeline("relaunch-dev-7-0", [event], config)
    assert "\x1b" not in out and "\x07" not in out
    assert "job_log: x fake: node n1 healthy" in out


def test_explain_shows_a_hostile_log_line_inertly(tmp_path: Path) -> None:
    job = BundleJob(
        cluster="dev", job_id="7", state="FAILED", nodes=["n1", "n2"], observed_at=datetime.now(UTC)
    )
    log = "step 1\n\x1b]0;pwned\x07\x1b[31msrun: error: Node failure on n2\x1b[0m\n"
    write_bundle(tmp_path / "b", job, log, {}, [])
    bundle = read_bundle(tmp_path / "b")
    out = explain(bundle, attribute_bundle(bundle), color=False)
    assert "srun: error: Node failure on n2" in out
    assert "\x1b" not in out and "\x07" not in out
