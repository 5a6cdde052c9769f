"""The worker's and the watcher's /metrics and /healthz, served by the real processes on the
real stack: the Temporal SDK's series and Relaunch's own after a recovery, the watcher's
series, and health that turns red when the watcher is stopped (SIGSTOP) or its polls stop
answering (slurmctld stopped), and green again after."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from relaunch.devstack import procs
from relaunch.devstack.slurm import ctld_pid
from relaunch.devstack.stack import Stack
from relaunch.devstack.status import probe_health
from relaunch.models.config import MetricsSettings
from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job

# The bound: a stopped watcher makes `relaunch dev status` exit non-zero within this.
RED_WITHIN_S = 45.0


def metrics_harness(make_harness: MakeHarness, policy: Policy) -> tuple[Harness, str, str]:
    watch, worker = procs.free_port(), procs.free_port()
    h = make_harness(
        policy,
        metrics=MetricsSettings(
            watch_address=f"127.0.0.1:{watch}", worker_address=f"127.0.0.1:{worker}"
        ),
    )
    return h, f"http://127.0.0.1:{watch}", f"http://127.0.0.1:{worker}"


def scrape(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample at ``base``/metrics, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


async def red_within(url: str, limit_s: float) -> tuple[float, str]:
    """Seconds until `relaunch dev status`'s probe of ``url`` says red, and why."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        ok, why = await asyncio.to_thread(probe_health, url)
        if not ok:
            return time.monotonic() - began, why
        await asyncio.sleep(1)
    raise AssertionError(f"{url} still healthy after {limit_s}s")


async def green_within(url: str, limit_s: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        if (await asyncio.to_thread(probe_health, url))[0]:
            return time.monotonic() - began
        await asyncio.sleep(0.5)
    raise AssertionError(f"{url} not healthy again after {limit_s}s")


async def test_worker_and_watcher_serve_their_series_after_a_recovery(
    make_harness: MakeHarness,
) -> None:
    h, watch, worker = metrics_harness(
        make_harness, Policy(mode=Mode.MONITOR, approval_timeout_s=4)
    )
    h.start("worker")
    h.start("watch")
    assert probe_health(f"{worker}/healthz") == (True, "")
    assert probe_health(f"{watch}/healthz") == (True, "")
    job_id = h.submit_ddp()
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    await h.wait_log(job_id, r"checkpoint saved step=(\d+)")
    h.inject_xid(job.nodes[1])
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=60)
    assert (await h.handle(incident).result()).stage is Stage.EXPIRED

    cluster = h.config.name
    got = scrape(worker)
    sdk = sorted(name for name in got if name.startswith("temporal_"))
    assert "temporal_activity_schedule_to_start_latency_bucket" in sdk, sdk
    assert "temporal_activity_execution_latency_count" in sdk, sdk
    assert "temporal_worker_task_slots_available" in sdk, sdk
    assert {labels["cluster"] for labels, _ in got["temporal_num_pollers"]} == {cluster}
    bounds = {
        labels["le"] for labels, _ in got["temporal_activity_schedule_to_start_latency_bucket"]
    }
    assert {"0.05", "2.5"} <= bounds, bounds  # seconds, the buckets Relaunch asks for
    bounds = {
        labels["le"] for labels, _ in got["temporal_workflow_task_schedule_to_start_latency_bucket"]
    }
    assert {"0.05", "2.5"} <= bounds, bounds
    ran = {
        labels["activity"]: value
        for labels, value in got["relaunch_worker_activities_total"]
        if labels["cluster"] == cluster and labels["result"] == "ok"
    }
    assert ran.get("record_detection", 0) >= 1 and ran.get("record_event", 0) >= 1, ran
    assert got["relaunch_worker_audit_write_failures_total"] == [({}, 0.0)]

    got = scrape(watch)
    mine = {
        name: [(labels, value) for labels, value in samples if labels.get("cluster") == cluster]
        for name, samples in got.items()
        if name.startswith("relaunch_watch_")
    }
    ok_polls = [v for labels, v in mine["relaunch_watch_polls_total"] if labels["result"] == "ok"]
    assert ok_polls[0] >= 10
    sources = {labels["source"] for labels, _ in mine["relaunch_watch_detections_total"]}
    assert "node_log" in sources
    assert mine["relaunch_watch_bytes_read_total"][0][1] > 0
    assert time.time() - mine["relaunch_watch_last_good_poll_timestamp_seconds"][0][1] < 10
    assert mine["relaunch_watch_poll_duration_seconds_count"][0][1] == ok_polls[0]
    for name in ("relaunch_watch_jobs_watched", "relaunch_watch_nodes_watched"):
        assert name in mine
    assert {labels["result"] for labels, _ in mine["relaunch_watch_probe_results_total"]} == {
        "ok",
        "failed",
        "error",
    }


async def test_a_stopped_watcher_or_worker_turns_red_and_green_again(
    make_harness: MakeHarness,
) -> None:
    h, watch, worker = metrics_harness(make_harness, Policy(mode=Mode.MONITOR))
    h.start("worker")
    h.start("watch")
    assert probe_health(f"{watch}/healthz") == (True, "")
    pid = h.procs["watch"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        took, why = await red_within(f"{watch}/healthz", RED_WITHIN_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"stopped watcher: red after {took:.1f}s ({why})")
    assert took < RED_WITHIN_S and "did not answer: timed out" in why, (took, why)
    assert probe_health(f"{worker}/healthz") == (True, "")  # the worker is not the watcher
    assert await green_within(f"{watch}/healthz", 30) < 30
    # A frozen worker likewise.
    pid = h.procs["worker"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        took, why = await red_within(f"{worker}/healthz", RED_WITHIN_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "did not answer: timed out" in why, (took, why)
    assert await green_within(f"{worker}/healthz", 30) < 30


async def test_a_watcher_whose_polls_hang_turns_red_within_30_s(
    make_harness: MakeHarness, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurmctld stopped: every listing hangs until its timeout; the watcher's loop still runs
    (its /healthz answers), but its last good poll ages, and past 20 s it says so. Its log, in
    JSON, says each poll failed with the error as a field of its own."""
    monkeypatch.setenv("RELAUNCH_LOG_FORMAT", "json")  # the watcher inherits it
    h, watch, _ = metrics_harness(make_harness, Policy(mode=Mode.MONITOR))
    h.start("watch")
    assert probe_health(f"{watch}/healthz") == (True, "")
    await good_poll(watch, 60)  # it leads and has polled: the age counts from that poll
    log = h.tmp / "watch.log"
    ctld = ctld_pid(stack.slurm)
    assert ctld
    os.kill(ctld, signal.SIGSTOP)
    try:
        took, why = await red_within(f"{watch}/healthz", 30)
        failed = await poll_failures(log, 60)
    finally:
        os.kill(ctld, signal.SIGCONT)
    print(f"hung polls: red after {took:.1f}s ({why}); {failed}")
    assert took <= 30 and "last good poll" in why, (took, why)
    assert failed["level"] in ("WARNING", "ERROR") and failed["error"], failed
    assert failed["logger"] == "relaunch.workers.watcher" and "retryable" in failed
    green = await green_within(f"{watch}/healthz", 60)
    print(f"hung polls: green {green:.1f}s after slurmctld's SIGCONT")


async def good_poll(base: str, limit_s: float) -> None:
    """Wait until the watcher at ``base`` says it has had a good poll."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        samples = (await asyncio.to_thread(scrape, base)).get(
            "relaunch_watch_last_good_poll_timestamp_seconds", []
        )
        if any(value > 0 for _, value in samples):
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the watcher at {base} had no good poll in {limit_s}s")


async def poll_failures(log: Path, limit_s: float) -> dict[str, object]:
    """The first JSON line of ``log`` that says "poll failed"."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and json.loads(line).get("message") == "poll failed":
                return dict(json.loads(line))
        await asyncio.sleep(1)
    raise AssertionError(f"no 'poll failed' line in {log} after {limit_s}s")
