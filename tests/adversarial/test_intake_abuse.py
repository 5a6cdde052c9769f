"""Intakes flooded or misused (issue 29, rows 5 and 6), on the real stack: a real worker and
watcher, real Slurm jobs of the non-root user, and the console in-process over real HTTP,
delivering through the real Temporal.

- A trusted sender's health event still convicts and drains its node after another intake
  token pushed 300 untrusted events about the same nodes (the evidence read only the latest
  200 rows of both).
- An Alertmanager alert naming a running job's node is recorded as an untrusted pointer and
  restarts nothing; a genuine Xid after it is still drained.
- Control: a trusted health event drains its node, and only that node, with and without
  job-written noise (a printed NVSentinel event and NHC line naming the job's other node).

The unit tier (tests/unit/test_intake_abuse.py) covers the rest of these rows: 413 on a chunked
body, 429, duplicates, the repair role, notification bodies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaunch.cli.console import TemporalDecider
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.models.config import ConsoleSettings
from relaunch.models.scheduler import JobState
from tests.adversarial.hostile import Tier
from tests.integration.serve import serve
from tests.integration.test_health_intake import nvsentinel_xid79

CANARY = "n1"
PAIR = ["n3", "n4"]  # the job's nodes: the event names n3, the job's noise n4
SECRET = "intake-abuse-adversarial-secret-0123456789"


xid79 = nvsentinel_xid79  # the same event as the health-intake tier sends


@contextmanager
def console(t: Tier, tmp: Path, **limits: int) -> Iterator[tuple[str, dict[str, str]]]:
    """The console with intake tokens (``nvs`` trusted with health events, ``hc`` not, ``am``
    Alertmanager's), delivering through the real Temporal, served on a local port."""
    tokens = write_tokens(
        tmp / "intake-tokens.json",
        [("nvs", ConsoleRole.INTAKE), ("hc", ConsoleRole.INTAKE), ("am", ConsoleRole.INTAKE)],
        trusted_health={"nvs"},
    )
    config = t.h.config.model_copy(
        update={"console": ConsoleSettings(tokens_file=str(tmp / "intake-tokens.json"), **limits)}
    )
    services = Services(scheduler=t.h.sched, deliver=TemporalDecider(config).deliver)
    with serve(create_app(config, services, secret=SECRET)) as url:
        yield url, tokens


def post(url: str, path: str, token: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{url}{path}", json=body, headers={"authorization": f"Bearer {token}"}, timeout=60
    )


NOISE = (
    "#!/bin/bash\n"
    "i=0\n"
    "while true; do\n"
    "  echo '{event}'\n"
    '  echo "NHC: check_hw_gpu: GPU lost on n4"\n'
    '  echo "step=$i loss=0.5"\n'
    "  i=$((i+1)); sleep 0.5\n"
    "done\n"
)
QUIET = '#!/bin/bash\necho "ready on $SLURMD_NODENAME"\nexec sleep 900\n'


async def convicted_and_drained(t: Tier, url: str, token: str, job_id: str) -> str:
    """Post the trusted sender's Xid 79 on n3: the job's recovery convicts n3 on the event and
    drains it, and only it. Returns the incident."""
    r = post(url, "/intake/health", token, xid79(PAIR[0]))
    assert r.status_code == 200, r.text
    assert r.json()["trusted"] is True and r.json()["events"][0]["detections"], r.text
    return await drained_on_the_event(t, job_id)


async def drained_on_the_event(t: Tier, job_id: str) -> str:
    """The job's recovery convicts n3 on the trusted health event and drains n3 only."""
    incident = await t.incident(job_id)
    status = await t.settled(incident)
    t.say("29.6", status)
    assert status.verdict is not None and status.verdict.culprit_nodes == [PAIR[0]], status
    assert status.verdict.corroboration == {PAIR[0]: ["health_event"]}, status.verdict
    await t.h.until(
        lambda: t.drained_by(PAIR[0], incident), f"{PAIR[0]} drained for {incident}", timeout=90
    )
    assert set(t.drained()) == {PAIR[0]}, t.drained()
    return incident


@pytest.mark.parametrize("noise", [False, True], ids=["quiet", "noisy"])
async def test_a_trusted_health_event_drains_its_node_with_and_without_job_noise(
    arena: Tier, tmp_path: Path, noise: bool
) -> None:
    """Control: the job prints nothing, or prints every half second an NVSentinel event for a
    fatal Xid 79 on its other node, an NHC line naming it and progress lines; the trusted
    event on n3 drains n3, and the job's words drain nothing."""
    t = arena
    # What NVSentinel would send for n4, as the job prints it (no kernel line in it, which
    # the watcher would take as a pointer of its own and restart the job without n4).
    printed = json.dumps(xid79(PAIR[1], metadata={}))
    script = NOISE.format(event=printed) if noise else QUIET
    job_id = t.submit(script, "-N2", "-w", ",".join(PAIR))
    await t.running(job_id, printed="step=2" if noise else "ready")
    with console(t, tmp_path) as (url, tokens):
        await convicted_and_drained(t, url, tokens["nvs"], job_id)
    t.alive()


async def test_a_flood_of_untrusted_events_does_not_push_a_trusted_one_out(
    arena: Tier, tmp_path: Path
) -> None:
    """NVSentinel (trusted) reports a fatal Xid 79 on n3 while no watched job runs there;
    another intake token then pushes 300 untrusted events about n3 and n4 (more than the 200
    latest rows the evidence used to read, with no rate limit here so that the evidence alone
    must keep the trusted event); then a job on n3 and n4 fails, its output naming n3. The
    trusted event, from moments before the job, still corroborates n3: it is drained."""
    t = arena
    limits = {"intake_burst": 1_000_000, "intake_events_per_minute": 1_000_000}
    with console(t, tmp_path, **limits) as (url, tokens):
        r = post(url, "/intake/health", tokens["nvs"], xid79(PAIR[0]))
        assert r.status_code == 200, r.text
        assert "no watched job runs on" in r.json()["events"][0]["note"], r.text
        for batch in range(3):
            events = [
                xid79(
                    PAIR[i % 2],
                    isFatal=False,
                    isHealthy=True,
                    recommendedAction="NONE",
                    errorCode=[],
                    message=f"all clear {batch}-{i}",
                )
                for i in range(100)
            ]
            flood = post(url, "/intake/health", tokens["hc"], {"events": events})
            assert flood.status_code == 200, flood.text
            assert all(e["recorded"] for e in flood.json()["events"])
        script = f'#!/bin/bash\necho "srun: error: Node failure on {PAIR[0]}"\nexec sleep 900\n'
        job_id = t.submit(script, "-N2", "-w", ",".join(PAIR))
        await t.running(job_id, printed="Node failure on")
        await drained_on_the_event(t, job_id)
    t.alive()


async def test_an_alert_on_a_running_job_s_node_restarts_nothing(
    arena: Tier, tmp_path: Path
) -> None:
    """Alertmanager (an intake token) posts a firing DCGM Xid 79 alert naming the node of a
    running job whose ranks are fine: recorded as an untrusted pointer, no recovery, no
    requeue, nothing drained; a genuine Xid afterwards is still caught and drained."""
    t = arena
    job_id = t.submit(QUIET, "-N2", "-w", ",".join(PAIR))
    await t.running(job_id, printed="ready")
    alert = {
        "version": "4",
        "status": "firing",
        "receiver": "relaunch",
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "DCGMXidError",
                    "Hostname": PAIR[0],
                    "gpu": "0",
                    "xid": "79",
                    "severity": "critical",
                },
                "annotations": {"summary": f"GPU 0 on {PAIR[0]}: Xid 79, fallen off the bus"},
                "startsAt": datetime.now(UTC).isoformat(),
            }
        ],
    }
    with console(t, tmp_path) as (url, tokens):
        r = post(url, "/intake/alertmanager", tokens["am"], alert)
        assert r.status_code == 200, r.text
        await asyncio.sleep(10)  # what a recovery would have started by now
        incidents = await t.h.audit.incidents(cluster=t.h.config.name, job_id=job_id)
        assert incidents == [], [i.id for i in incidents]
        job = await t.h.sched.get_job(job_id)
        assert job.state is JobState.RUNNING and job.restart_count == 0, job
        [entry] = r.json()["alerts"]
        assert entry["pointed"] == [job_id] and "no action" in entry["note"], entry
        intake = await t.h.audit.events(f"intake-{t.h.config.name}")
        [row] = [e for e in intake if e.data.get("source") == "alertmanager"]
        assert row.data["trusted"] is False and row.nodes == [PAIR[0]]
    assert t.drained() == {}, t.drained()
    await t.genuine_fault_is_caught(CANARY)
    t.alive()
