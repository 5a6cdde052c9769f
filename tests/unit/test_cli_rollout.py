"""`relaunch scorecard` and `relaunch rollout`: a user's mistake is said in one line, before any
connection, never as a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from relaunch.cli.main import cli
from relaunch.models.config import ClusterConfig


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "c.json"
    # A database nobody listens on: a refusal must come before any connection.
    unreachable = "postgresql://relaunch@127.0.0.1:1/none?connect_timeout=1"
    cfg = ClusterConfig(name="c", database_url=unreachable, bundle_dir=str(tmp_path))
    path.write_text(cfg.model_dump_json())
    return path


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["scorecard", "--since", "yesterday"], "since must be a time"),
        (["scorecard", "--since", "99999d"], "reaches back more than 3650 days"),
        (["rollout", "promote", "--by", "ana"], "name one of --category or --partition"),
        (
            ["rollout", "demote", "--category", "hang", "--partition", "gpu", "--by", "ana"],
            "name one of --category or --partition",
        ),
        (["rollout", "promote", "--category", "gpu", "--by", "ana"], "no category 'gpu'"),
        (["rollout", "promote", "--partition", "a;rm -rf /", "--by", "ana"], "partition"),
        (["rollout", "promote", "--category", "hang", "--by", "a\nb"], "invalid name"),
    ],
)
def test_mistakes_are_said_before_any_connection(config: Path, args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, [*args, "--config", str(config)])
    assert result.exit_code != 0
    assert said in result.output, result.output
    assert "Traceback" not in result.output
    assert "cannot reach the audit database" not in result.output
