"""Two real `relaunch watch` processes on one cluster configuration (relaunch/workers/
watch_lease.py): one leads, the other says it is a standby; a fault is detected once; the
leader is killed with SIGKILL and the standby takes over within seconds (measured and
printed); a fault after the takeover is detected by the new leader."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psycopg

from relaunch.connectors.lease import lock_parts
from relaunch.models.recovery import Approval, Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from relaunch.workers.watch_lease import watch_lease_key
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.integration.conftest import MakeHarness
from tests.integration.harness import REPO, Harness
from tests.integration.helpers import wait_job

# PostgreSQL frees a killed leader's lock at once; the standby tries every second.
TAKEOVER_LIMIT_S = 10.0


def start_second_watcher(h: Harness) -> Path:
    """A second `relaunch watch` on the harness's own configuration file (stopped with the
    harness's processes); its log."""
    log_path = h.tmp / f"{h.config.name}-watch-2.log"
    log = open(log_path, "ab")  # noqa: SIM115 - owned by the process
    h.procs["watch-2"] = subprocess.Popen(
        [sys.executable, "-m", "relaunch.cli", "watch", "--config", str(h.config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    return log_path


async def wait_line(path: Path, pattern: str, timeout: float = 60.0) -> float:
    """Wait for a line matching ``pattern`` in the log at ``path``; when it was written (its
    own timestamp, as ``time.time()``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            if re.search(pattern, line):
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                return stamp.timestamp()  # the log's local time, as time.time()
        await asyncio.sleep(0.05)
    tail = path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"
    raise AssertionError(f"no {pattern!r} in {path.name} after {timeout}s:\n{tail}")


async def test_one_watcher_acts_and_the_standby_takes_over_after_sigkill(
    make_harness: MakeHarness,
) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR))
    cluster = h.config.name
    h.start("worker")
    h.start("watch")  # ready: it leads ("watching cluster")
    first_log = h.tmp / "watch.log"
    assert re.search(f"leader for cluster {cluster}", first_log.read_text())
    second_log = start_second_watcher(h)
    await wait_line(
        second_log, f"standby for cluster {cluster}: another watcher holds the cluster "
        rf"\(relaunch-watch {cluster} on \S+ pid {h.procs['watch'].pid}"
    )  # fmt: skip

    job_id = h.submit_ddp()
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    await h.wait_log(job_id, r"checkpoint saved step=\d+")
    nodes = job.nodes
    h.inject_xid(nodes[1])
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=90)
    await asyncio.sleep(3)  # several polls and log passes of both watchers
    status = await h.handle(incident).query(RecoveryWorkflow.status)
    assert status.detections == 1, f"{status.detections} detections of one fault"
    rows = await h.events(incident, "detection")
    assert [r.nodes for r in rows] == [[nodes[1]]]
    assert [i.id for i in await h.audit.incidents(cluster=cluster, job_id=job_id)] == [incident]
    second = second_log.read_text()
    assert incident in first_log.read_text()
    assert incident not in second and "watching cluster" not in second
    assert f"reported node {nodes[1]}" not in second
    assert second.count("standby for cluster") == 1  # said once, not at every try

    killed = time.time()
    h.kill("watch")  # SIGKILL
    took = await wait_line(second_log, f"leader for cluster {cluster}", TAKEOVER_LIMIT_S) - killed
    print(f"\ntakeover after SIGKILL: {took:.2f}s")
    await wait_line(second_log, f"watching cluster {cluster}")
    await asyncio.sleep(2)  # a node's kernel log is news from the new leader's second pass

    h.inject_xid(nodes[0])

    async def second_detection() -> bool:
        return len(await h.events(incident, "detection")) >= 2

    await h.until(second_detection, "the new leader's detection", timeout=60)
    rows = await h.events(incident, "detection")
    assert sorted(r.nodes for r in rows) == sorted([[nodes[0]], [nodes[1]]])
    await wait_line(second_log, f"reported node {nodes[0]}|{incident}")
    status = await h.handle(incident).query(RecoveryWorkflow.status)
    assert status.detections == 2
    if status.awaiting_approval:
        await h.handle(incident).signal(RecoveryWorkflow.reject, Approval(by="test"))


async def test_a_leader_whose_lease_session_ends_stops_and_the_standby_acts(
    make_harness: MakeHarness, database_url: str
) -> None:
    """The database ends the leader's session (a restart, a failover, an administrator): the
    leader says it lost the lease and waits as a standby, the other leads, and a fault is
    detected once, by the new leader only."""
    h = make_harness(Policy(mode=Mode.MONITOR))
    cluster = h.config.name
    h.start("worker")
    h.start("watch")
    first_log = h.tmp / "watch.log"
    second_log = start_second_watcher(h)
    await wait_line(second_log, f"standby for cluster {cluster}")
    job_id = h.submit_ddp()
    job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
    await h.wait_log(job_id, r"checkpoint saved step=\d+")

    with psycopg.connect(database_url, autocommit=True) as conn:
        ended = conn.execute(
            "select pg_terminate_backend(pid) from pg_locks where locktype = 'advisory'"
            " and granted and classid = %s and objid = %s",
            lock_parts(watch_lease_key(cluster)),
        ).fetchall()
    assert ended == [(True,)]
    cut = time.time()
    lost = await wait_line(first_log, f"lost the lease of cluster {cluster}", 10) - cut
    took = await wait_line(second_log, f"leader for cluster {cluster}", 10) - cut
    print(f"\nlease session ended: leader stopped after {lost:.2f}s, standby led after {took:.2f}s")
    assert lost < 3 and took < TAKEOVER_LIMIT_S
    await wait_line(
        first_log, rf"standby for cluster {cluster}: .*pid {h.procs['watch-2'].pid}", 10
    )
    await wait_line(second_log, f"watching cluster {cluster}")
    await asyncio.sleep(2)  # a node's kernel log is news from the new leader's second pass

    h.inject_xid(job.nodes[1])
    incident = h.incident(job_id)
    await h.wait_stage(incident, {Stage.AWAITING_APPROVAL}, timeout=90)
    await asyncio.sleep(3)
    status = await h.handle(incident).query(RecoveryWorkflow.status)
    assert status.detections == 1, f"{status.detections} detections of one fault"
    assert incident in second_log.read_text()
    assert incident not in first_log.read_text()
    if status.awaiting_approval:
        await h.handle(incident).signal(RecoveryWorkflow.reject, Approval(by="test"))
