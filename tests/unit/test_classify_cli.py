"""`relaunch classify` and `relaunch explain` as a user runs them (design contract)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from relaunch.cli import cli
from relaunch.connectors.bundles import write_bundle
from relaunch.models.bundle import BundleJob

XID = (
    "2026-11-30T10:01:00+00:00 n2 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
    "GPU has fallen off the bus."
)
CASCADE = "0: [rank0]: RuntimeError: NCCL error: remote process exited or there was a network error"


def make(tmp: Path, name: str, log: str, node_logs: dict[str, str] | None = None) -> Path:
    job = BundleJob(
        cluster="c",
        job_id="9",
        state="FAILED",
        nodes=["n1", "n2"],
        observed_at=datetime(2026, 11, 30, 10, 5, tzinfo=UTC),
    )
    return write_bundle(tmp / name, job, log, node_logs)


def test_classify_json_is_one_object_per_bundle(tmp_path: Path) -> None:
    hw = make(tmp_path, "hw", "\n".join([CASCADE] * 5) + "\n", {"n2": XID + "\n"})
    app = make(tmp_path, "app", "1: Traceback (most recent call last):\n1: KeyError: 'lr'\n")
    result = CliRunner().invoke(cli, ["classify", str(hw), str(app), "--json"])
    assert result.exit_code == 0, result.output
    first, second = (json.loads(line) for line in result.output.splitlines())
    assert set(first) == {
        "bundle",
        "category",
        "culprit_nodes",
        "action",
        "confidence",
        "evidence",
        "corroboration",
        "remedies",
    }
    assert (first["bundle"], first["category"], first["culprit_nodes"]) == (
        str(hw),
        "gpu_hardware",
        ["n2"],
    )
    assert first["action"] == "isolate_and_restart" and 0 < first["confidence"] <= 1
    assert first["corroboration"] == {"n2": ["kernel_log"]}
    assert first["remedies"] == {"n2": "reboot"}  # Xid 79: RESTART_BM
    assert first["evidence"][0] == {
        "source": "nodes/n2.log",
        "line_no": 1,
        "text": XID,
        "signature": "xid_79",
        "xid": {
            "code": 79,
            "words": "GPU has fallen off the bus",
            "action": "RESTART_BM",
            "outcome": "drain",
            "remedy": "reboot",
            "detail": "immediate action RESTART_BM",
            "implicates": "node",
        },
    }
    assert (second["category"], second["culprit_nodes"], second["action"]) == (
        "application",
        [],
        "hold",
    )
    assert second["corroboration"] == {} and second["remedies"] == {}


def test_classify_excludes_a_node_only_the_jobs_output_names(tmp_path: Path) -> None:
    """Issue 12, row 1 as a user sees it: a printed srun line, the nodes healthy in Slurm."""
    printed = make(tmp_path, "printed", "srun: error: Node failure on n[1-2]\n")
    result = CliRunner().invoke(cli, ["classify", str(printed), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["category"], out["culprit_nodes"], out["action"]) == (
        "node_failure",
        ["n1", "n2"],
        "exclude_and_restart",
    )
    assert out["corroboration"] == {"n1": [], "n2": []}
    explained = CliRunner().invoke(cli, ["explain", str(printed), "--no-color"]).output
    assert "logs/job.log:1 (job-controlled)" in explained
    assert "n1: named only by job-controlled evidence" in explained


def test_classify_reports_a_bad_bundle_and_goes_on(tmp_path: Path) -> None:
    good = make(tmp_path, "good", "0: ValueError: nope\n")
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["classify", str(tmp_path / "empty"), str(good), "--json"])
    assert result.exit_code == 1
    assert "not an incident bundle (no job.json)" in result.stderr
    assert json.loads(result.stdout)["category"] == "application"
    assert "Traceback" not in result.output


def test_explain_shows_the_decisive_line_and_folds_the_cascade(tmp_path: Path) -> None:
    hw = make(tmp_path, "hw", "\n".join([CASCADE] * 5) + "\n", {"n2": XID + "\n"})
    result = CliRunner().invoke(cli, ["explain", str(hw), "--no-color"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "verdict: gpu_hardware on n2" in out
    assert "decisive lines:" in out and "nodes/n2.log:1 (trusted) [n2] xid_79" in out
    assert "n2: corroborated by kernel_log" in out
    assert "folded: 5 cascade/teardown line(s)" in out and "nccl_error ×5" in out
    missing = CliRunner().invoke(cli, ["explain", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "not an incident bundle" in missing.output
