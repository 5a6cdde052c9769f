"""The health-check catalogue and the remediation ladder (relaunch/detection/health.py)."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from relaunch.detection.health import (
    builtin_checks,
    checks_for,
    clip,
    judge,
    judge_counters,
    ladder_for,
    split_census,
    wrapped_argv,
)
from relaunch.models.bundle import TelemetrySample
from relaunch.models.lifecycle import CheckKind, HealthCheck, LifecycleSettings, Rung
from relaunch.models.recovery import Category

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def test_the_catalogue_loads_and_ids_are_unique() -> None:
    ids = [c.id for c in builtin_checks()]
    assert len(ids) == len(set(ids)) and {"storage-rw", "gpu-smi", "agent-counters"} <= set(ids)


def test_site_checks_follow_the_catalogue_and_skips_apply() -> None:
    site = HealthCheck(id="site-fs", argv=["true"])
    settings = LifecycleSettings(checks=[site], skip_checks=["gpu-dcgm-diag"])
    ids = [c.id for c in checks_for(settings, Category.GPU_HARDWARE)]
    assert ids[-1] == "site-fs" and "gpu-dcgm-diag" not in ids
    # A network fault does not run the GPU-only diagnostic, nor a GPU check its categories omit.
    assert "gpu-dcgm-diag" not in [c.id for c in checks_for(LifecycleSettings(), Category.NETWORK)]


def test_bad_check_ids_and_patterns_are_refused() -> None:
    with pytest.raises(ValidationError):
        HealthCheck(id="Bad id; rm", argv=["true"])
    with pytest.raises(ValidationError):
        HealthCheck(id="ok", argv=["true"], fail_pattern="(")


def run(check: HealthCheck) -> tuple[int, str]:
    done = subprocess.run(
        wrapped_argv(check, "n7"), capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    return done.returncode, done.stdout + done.stderr


def test_a_missing_program_skips_the_check_with_the_reason() -> None:
    check = HealthCheck(
        id="gpu", argv=["nvidia-smi-nowhere", "-q"], requires=["nvidia-smi-nowhere"]
    )
    code, out = run(check)
    result = judge(check, code, out)
    assert result.skipped and not result.passed
    assert "nvidia-smi-nowhere is not installed on" in result.detail


def test_the_wrapper_runs_the_command_with_the_node_filled_in() -> None:
    check = HealthCheck(id="echo", argv=["echo", "node={node}"], requires=["echo"])
    code, out = run(check)
    assert code == 0 and split_census(out, 1000)[0].strip() == "node=n7"
    assert judge(check, code, out).passed and judge(check, code, out).output.strip() == "node=n7"


def test_exit_code_and_patterns_decide() -> None:
    check = HealthCheck(id="smi", argv=["x"], fail_pattern=r"Pending\s*:\s*Yes", pass_pattern="GPU")
    assert judge(check, 0, "GPU 0\n  Pending : No\n").passed
    failed = judge(check, 0, "GPU 0\n  Pending : Yes\n")
    assert not failed.passed and "Pending : Yes" in failed.detail
    assert "lacks" in judge(check, 0, "nothing\n").detail
    assert judge(check, 2, "GPU 0\nboom\n").detail == "exit 2: boom"
    srun = "Xid 79: GPU has fallen off the bus\n\nsrun: error: n4: task 0: Exited with exit code 1"
    assert judge(check, 1, srun).detail == "exit 1: Xid 79: GPU has fallen off the bus"
    assert "no answer within" in judge(check, None, "", timed_out=True).detail


def test_output_keeps_head_and_tail() -> None:
    text = "a" * 5000 + "END"
    kept = clip(text, 100)
    assert kept.startswith("a" * 50) and kept.endswith("END") and "cut" in kept


def sample(gpu: int, minutes: int, **counters: object) -> TelemetrySample:
    return TelemetrySample.model_validate(
        {"node": "n1", "gpu": gpu, "time": T0 + timedelta(minutes=minutes), **counters}
    )


def test_counters_fail_on_new_dbe_or_a_pending_remap() -> None:
    check = next(c for c in builtin_checks() if c.kind is CheckKind.TELEMETRY)
    clean = [sample(0, -5, ecc_dbe_volatile=1), sample(0, 5, ecc_dbe_volatile=1)]
    assert judge_counters(check, clean, T0).passed
    grew = [sample(0, -5, ecc_dbe_volatile=1), sample(0, 5, ecc_dbe_volatile=3)]
    assert "1 → 3" in judge_counters(check, grew, T0).detail
    pending = [sample(1, 5, remapped_rows_pending=True)]
    assert "remapped_rows_pending" in judge_counters(check, pending, T0).detail
    assert judge_counters(check, [], T0).skipped


def test_the_ladder_by_remedy_category_and_default_ends_in_escalate() -> None:
    settings = LifecycleSettings()
    assert ladder_for(settings, "gpu_reset", Category.GPU_HARDWARE) == [
        Rung.GPU_RESET,
        Rung.REBOOT,
        Rung.ESCALATE,
    ]
    assert ladder_for(settings, "escalate", Category.GPU_HARDWARE) == [Rung.ESCALATE]
    assert ladder_for(settings, None, Category.NETWORK) == [Rung.REBOOT, Rung.ESCALATE]
    site = LifecycleSettings(ladders={"network": [Rung.RESUME_AFTER_CHECKS, Rung.REBOOT]})
    assert ladder_for(site, None, Category.NETWORK) == [Rung.REBOOT, Rung.ESCALATE]
    assert ladder_for(site, None, Category.NODE_FAILURE) == [Rung.ESCALATE]


H200 = Path(__file__).parents[1] / "fixtures" / "health" / "nvidia-smi-q-row-remapper-h200.txt"


def test_gpu_smi_passes_a_healthy_h200_and_fails_each_flag_set() -> None:
    check = next(c for c in builtin_checks() if c.id == "gpu-smi")
    healthy = H200.read_text()
    assert judge(check, 0, healthy).passed
    for field in ("Pending", "Remapping Failure Occurred"):
        broken = re.sub(rf"({field}\s*:) No", r"\1 Yes", healthy, count=1)
        assert broken != healthy
        result = judge(check, 0, broken)
        assert not result.passed and "Yes" in result.detail, field
    lost = "Unable to determine the device handle for GPU0000:00:06.0: GPU is lost."
    assert not judge(check, 0, lost).passed
