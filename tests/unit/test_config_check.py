"""Strict configuration: a misspelt key or a nonsensical number in a cluster's configuration is
an error that names it, in `relaunch config check` and at every process start, never a
silently dropped setting or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import relaunch
from relaunch.console.auth import TokensFileError, TokenStore, hash_token
from relaunch.models.config import ClusterConfig

ROOT = Path(relaunch.__file__).resolve().parents[1]  # the tree under test, for subprocesses


def good() -> dict[str, Any]:
    return {
        "name": "dev",
        # Nothing listens on port 9: a process that wrongly starts fails fast, not hangs.
        "temporal_address": "127.0.0.1:9",
        "database_url": "postgresql://relaunch@127.0.0.1:9/relaunch",
        "bundle_dir": "/tmp/relaunch-bundles",
        "watch": {"partitions": ["gpu"], "poll_interval_s": 1.0},
        "policy": {"mode": "monitor", "drain_share": 0.25, "drain_cap": 2},
        "console": {"port": 8400},
        "notify": {"channels": [{"type": "slack", "url_env": "SLACK_URL"}]},
        "lifecycle": {"checks": [{"id": "site", "argv": ["true"]}]},
    }


def with_key(path: list[str | int], key: str, value: Any) -> dict[str, Any]:
    data = good()
    where: Any = data
    for part in path:
        where = where[part]
    where[key] = value
    return data


def refusal(data: dict[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        ClusterConfig.model_validate_json(json.dumps(data))
    return [(tuple(e["loc"]), e["type"]) for e in caught.value.errors()]


# ------------------------------------------------------------------ the models


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ([], "databse_url"),
        (["watch"], "partitons"),
        (["policy"], "mdoe"),
        (["console"], "prot"),
        (["notify"], "chanels"),
    ],
    ids=lambda v: ".".join(map(str, v)) if isinstance(v, list) else v,
)
def test_a_misspelt_key_is_refused_naming_it(path: list[str | int], key: str) -> None:
    assert refusal(with_key(path, key, 1)) == [((*path, key), "extra_forbidden")]


@pytest.mark.parametrize(
    ("path", "key", "value", "kind"),
    [
        (["policy"], "drain_share", 7, "less_than_equal"),
        (["policy"], "drain_share", 0, "greater_than"),
        (["policy"], "drain_cap", -3, "greater_than_equal"),
        (["policy"], "restart_budget", -1, "greater_than_equal"),
        (["policy"], "approval_timeout_s", 0, "greater_than"),
        (["policy"], "verify_timeout_s", 1e9, "less_than_equal"),
        (["policy"], "budget_window_hours", -1, "greater_than"),
        (["policy"], "drain_window_hours", 1e9, "less_than_equal"),
        (["policy"], "suspect_window_hours", 1e9, "less_than_equal"),
        (["notify"], "retry_for_s", 1e12, "less_than_equal"),
        (["notify"], "backoff_max_s", 1e9, "less_than_equal"),
        (["notify"], "lookback_s", 1e12, "less_than_equal"),
        (["lifecycle"], "escalate_after_return_hours", 1e9, "less_than_equal"),
        (["lifecycle"], "same_fault_escalates", 10_000, "less_than_equal"),
    ],
    ids=lambda v: ".".join(map(str, v)) if isinstance(v, list) else str(v),
)
def test_a_number_out_of_bounds_is_refused(
    path: list[str | int], key: str, value: float, kind: str
) -> None:
    assert refusal(with_key(path, key, value)) == [((*path, key), kind)]


def test_a_misspelt_key_in_the_tokens_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    line = {"name": "ana", "role": "intake", "sha256": hash_token("t"), "trusted_heath": True}
    path.write_text(json.dumps([line]))
    path.chmod(0o600)
    with pytest.raises(TokensFileError, match=r"0\.trusted_heath: Extra inputs"):
        TokenStore(path)


# ------------------------------------------------------------------ the command line


def relaunch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "relaunch.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return relaunch("config", "check", "--config", str(path))


def test_config_check_passes_a_good_file_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good()))
    done = check(path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"ok: {path}: cluster dev, mode monitor, partitions watched: gpu, local Slurm"
    ]
    # Every default, as the dev stack writes it (model_dump_json), passes as well.
    minimal = ClusterConfig(name="dev", database_url="postgresql://x@h/db", bundle_dir="/b")
    path.write_text(minimal.model_dump_json(indent=2))
    assert check(path).returncode == 0
    # The edges that make sense stay allowed: drain a whole partition, or none; never restart.
    edges = with_key(["policy"], "drain_share", 1)
    edges["policy"].update(drain_cap=0, restart_budget=0)
    path.write_text(json.dumps(edges))
    assert check(path).returncode == 0


def test_config_check_names_every_problem_on_a_line_of_its_own(tmp_path: Path) -> None:
    data = with_key(["watch"], "partitons", ["gpu"])
    data["policy"].update(mdoe="autonomous", drain_share=7, drain_cap=-3, restart_budget=-1)
    data["notify"]["channels"][0]["colour"] = "red"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    done = check(path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert sorted(done.stderr.splitlines()) == sorted(
        [
            "watch.partitons: unknown key",
            "policy.mdoe: unknown key",
            "policy.drain_share: must be at most 1",
            "policy.drain_cap: must be at least 0",
            "policy.restart_budget: must be at least 0",
            "notify.channels[0].colour: unknown key",
            f"error: {path}: invalid configuration (6 problems)",
        ]
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ('{"name": "dev",', "not valid JSON: EOF while parsing"),
        ("name: dev\n", "not valid JSON: expected ident"),
        ("[1, 2]", "Input should be an object"),
    ],
    ids=["missing", "truncated", "yaml", "not-an-object"],
)
def test_config_check_reports_a_file_it_cannot_use(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "cluster.yaml"
    if content is not None:
        path.write_text(content)
    done = check(path)
    assert done.returncode == 1
    first, last = done.stderr.splitlines()
    assert first.startswith(f"{path}: {problem}")
    assert last == f"error: {path}: invalid configuration (1 problem)"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["worker", "watch"])
def test_a_process_refuses_to_start_on_a_misspelt_key(tmp_path: Path, command: str) -> None:
    path = tmp_path / "bad.yaml"
    data = with_key(["watch"], "partitons", ["gpu"])
    data["policy"]["drain_share"] = 7
    path.write_text(json.dumps(data))
    done = relaunch(command, "--config", str(path), timeout=30)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert "watch.partitons: unknown key" in lines
    assert "policy.drain_share: must be at most 1" in lines
    assert lines[-1].startswith(f"error: {path}: invalid configuration (2 problems)")
    assert "Traceback" not in done.stderr


def test_the_charts_probe_names_every_problem(tmp_path: Path) -> None:
    from tests.unit.test_deploy import load_entrypoint

    path = tmp_path / "cluster.json"
    data = with_key(["watch"], "partitons", ["gpu"])
    data["policy"]["mdoe"] = "autonomous"
    path.write_text(json.dumps(data))
    assert sorted(load_entrypoint().check(path, {})) == [
        f"{path}: policy.mdoe: unknown key",
        f"{path}: watch.partitons: unknown key",
    ]
