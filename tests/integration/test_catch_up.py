"""Catch-up from accounting on a real cluster with slurmdbd (Slurm 22.05 and 24.11): a watched
job that fails while the watcher is stopped, and that slurmctld forgets (MinJobAge=2), is found
in sacct when the watcher starts again and recorded once as missed, with its end time and the
time it was seen; a job that is not opted in is not; a second restart records nothing twice.

The stack is this module's own (accounting on, a MinJobAge of 2 s: the session's stack keeps
600, which other tests rely on), one per release.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relaunch.connectors.audit import AuditStore, StoredEvent
from relaunch.devstack.stack import Stack, StackConfig
from relaunch.models.config import ClusterConfig
from relaunch.workers.watch_catchup import CAUGHT_UP, MISSED
from relaunch.workers.watch_main import run_watch

pytestmark = [pytest.mark.xdist_group("catch_up")]
# Both releases, or the one a run of the suite is for (RELAUNCH_TEST_SLURM, tests/conftest.py).
RELEASES = (
    [os.environ["RELAUNCH_TEST_SLURM"]]
    if os.environ.get("RELAUNCH_TEST_SLURM")
    else [
        "22.05",
        "24.11",
    ]
)


@pytest.fixture(scope="module", params=RELEASES)
def acct_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="relaunch-catchup-"))
    root.chmod(0o755)
    stack = Stack(
        root / "state",
        StackConfig.with_free_ports(
            cluster="cu",
            slurm=request.param,
            nodes=2,
            services=False,
            accounting=True,
            min_job_age=2,
        ),
    )
    try:
        stack.up()
        yield stack
    finally:
        stack.down()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def audit(acct_stack: Stack) -> AsyncIterator[AuditStore]:
    store = await AuditStore.open(acct_stack.database_url)
    try:
        yield store
    finally:
        await store.close()


class RunningWatcher:
    """``relaunch watch`` in this process (as the service runs it), started and stopped."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(run_watch(config, self._stop))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(self._task, 30)


def _sh(stack: Stack, *argv: str) -> str:
    env = {**os.environ, **stack.slurm_env}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def _last_good(config: ClusterConfig) -> str | None:
    assert config.watch.state_file
    try:
        return str(json.loads(Path(config.watch.state_file).read_text())["last_good_poll"])
    except FileNotFoundError:
        return None


async def _until(what: str, check: object, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


async def _caught(audit: AuditStore, cluster: str) -> list[StoredEvent]:
    return [e for e in await audit.events(f"intake-{cluster}") if e.kind == CAUGHT_UP]


async def _restart_and_catch_up(config: ClusterConfig) -> RunningWatcher:
    """Start the watcher and wait until its catch-up at start has run (it then writes its
    last good poll at once)."""
    before = _last_good(config)
    watcher = RunningWatcher(config)
    await _until("the watcher's catch-up at start", lambda: _last_good(config) != before, 60)
    return watcher


async def test_a_job_end_missed_while_stopped_is_caught_up_once(
    acct_stack: Stack, audit: AuditStore, tmp_path: Path
) -> None:
    config = acct_stack.cluster_config()
    cluster = config.name
    assert not await _caught(audit, cluster)
    # A first run: the watcher knows its last good poll, then stops.
    watcher = await _restart_and_catch_up(config)
    await watcher.stop()
    stopped_at = datetime.now(UTC)

    tmp_path.chmod(0o755)
    watched = _sh(
        acct_stack,
        "sbatch",
        "--parsable",
        "--comment=relaunch=on",
        f"--output={tmp_path}/w-%j.out",
        "--wrap",
        "sleep 1; exit 3",
    )
    unwatched = _sh(
        acct_stack, "sbatch", "--parsable", f"--output={tmp_path}/u-%j.out", "--wrap", "exit 3"
    )

    def forgotten() -> bool:
        listed = _sh(acct_stack, "squeue", "--states=all", "--noheader", "--format=%i").split()
        ended = _sh(acct_stack, "sacct", "-X", "-n", "-P", "-o", "JobIDRaw,State,End")
        rows = {line.split("|")[0]: line.split("|") for line in ended.splitlines()}
        return (
            watched not in listed
            and unwatched not in listed
            and rows.get(watched, ["", ""])[1] == "FAILED"
            and unwatched in rows
        )

    await _until("slurmctld to forget both jobs (MinJobAge=2) and sacct to hold them", forgotten)
    ended_epoch = int(
        _sh(
            acct_stack,
            "env",
            "SLURM_TIME_FORMAT=%s",
            "sacct",
            "-X",
            "-n",
            "-P",
            "-o",
            "End",
            "-j",
            watched,
        )
    )

    watcher = await _restart_and_catch_up(config)
    await watcher.stop()
    rows = await _caught(audit, cluster)
    assert [r.data["job_id"] for r in rows] == [watched], "only the watched job, once"
    row = rows[0]
    assert row.data["outcome"] == MISSED
    assert row.data["state"] == "FAILED"
    assert datetime.fromisoformat(str(row.data["ended_at"])).timestamp() == ended_epoch
    seen = datetime.fromisoformat(str(row.data["seen_at"]))
    assert seen > stopped_at and seen.timestamp() >= ended_epoch
    assert f"job {watched} ended FAILED" in row.summary and "missed" in row.summary

    # Restarted again (its state file removed: it looks catch_up_window_s back), nothing twice.
    assert config.watch.state_file
    Path(config.watch.state_file).unlink()
    watcher = await _restart_and_catch_up(config)
    await watcher.stop()
    assert [r.data["job_id"] for r in await _caught(audit, cluster)] == [watched]
