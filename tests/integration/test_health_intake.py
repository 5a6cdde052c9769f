"""Node-health events and external drains on the real stack (Slurm, Temporal, PostgreSQL, the
DDP training job, a real worker and watcher).

An NVSentinel HealthEvent (fatal, Xid 79, GPU, RESTART_BM) posted to the console's intake with
a token trusted with health events starts the recovery of the watched job on that node, whose
verdict convicts the node with the event as its evidence, and the node is drained; the same
event from an intake token not trusted with them only excludes the node from its job's restart.
A drain someone else makes (`scontrol update ... state=drain reason="NHC: ..."`) on a node a
watched job holds is recorded once and shows on the node's history: the CLI and the console.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from relaunch.cli.console import TemporalDecider
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.web import Services
from relaunch.models.config import ConsoleSettings
from relaunch.models.recovery import Approval, Mode, Policy, Stage
from relaunch.workflows.recovery import RecoveryWorkflow
from tests.integration.conftest import MakeHarness
from tests.integration.harness import REPO, Harness
from tests.integration.serve import serve
from tests.integration.test_recovery import start_training

SECRET = "health-intake-test-secret-0123456789"
NHC = "NHC: check_hw_ib: No IB port is ACTIVE"


def nvsentinel_xid79(node: str, **changes: Any) -> dict[str, Any]:
    """What NVSentinel's syslog-health-monitor sends for an Xid 79 (protojson), with
    ``changes`` laid over it."""
    return {
        "version": 1,
        "agent": "syslog-health-monitor",
        "componentClass": "GPU",
        "checkName": "SysLogsXIDError",
        "isFatal": True,
        "isHealthy": False,
        "message": "XID 79; Resolution: RESTART_BM",
        "recommendedAction": "RESTART_BM",
        "errorCode": ["79"],
        "entitiesImpacted": [{"entityType": "PCI", "entityValue": "0000:17:00"}],
        "metadata": {
            "JOURNAL_MESSAGE": "NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus."
        },
        "generatedTimestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "nodeName": node,
        "processingStrategy": "EXECUTE_REMEDIATION",
        **changes,
    }


def console_app(h: Harness, tmp: Path) -> tuple[Any, dict[str, str]]:
    tokens = write_tokens(
        tmp / "tokens.json",
        [("nvs", ConsoleRole.INTAKE), ("hc", ConsoleRole.INTAKE), ("vera", ConsoleRole.VIEWER)],
        trusted_health={"nvs"},
    )
    h.configure(console=ConsoleSettings(tokens_file=str(tmp / "tokens.json")))
    services = Services(scheduler=h.sched, deliver=TemporalDecider(h.config).deliver)
    return create_app(h.config, services, secret=SECRET), tokens


async def post(url: str, token: str, body: dict[str, Any]) -> httpx.Response:
    return await asyncio.to_thread(
        httpx.post,
        f"{url}/intake/health",
        json=body,
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


async def test_nvsentinel_event_convicts_its_node_only_from_a_trusted_sender(
    make_harness: MakeHarness, tmp_path: Path
) -> None:
    h = make_harness(Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=180))
    app, tokens = console_app(h, tmp_path)
    h.start("worker")  # no watcher: the health events are the only way these recoveries start
    job_id, nodes, _ = await start_training(h)
    pointed = nodes[0]
    with serve(app) as url:
        # From a sender not trusted with health events, while the job runs: the event is
        # recorded and points at the job, and starts no recovery (issue 29 row 5: any intake
        # token could otherwise requeue any watched job).
        untrusted = await post(url, tokens["hc"], nvsentinel_xid79(pointed))
        assert untrusted.status_code == 200, untrusted.text
        assert untrusted.json()["trusted"] is False
        [event] = untrusted.json()["events"]
        # (A job of an earlier test that ended on that node may be pointed at as well: an
        # untrusted event joins the recovery of a job that ended abnormally.)
        assert event["pointed"] == [job_id]
        assert all(d["job_id"] != job_id for d in event["detections"]), event
        first = h.incident(job_id, 0)
        assert await h.events(first, "detection") == []
        assert not (await h.sched.get_node(pointed)).drain_flag
        assert (await h.sched.get_job(job_id)).restart_count == 0

        # From a sender trusted with them, for the same node of the same attempt: the
        # attempt's recovery convicts the node on the event, cited as evidence, and the node's
        # decision drains it.
        convicted = pointed
        trusted = await post(url, tokens["nvs"], nvsentinel_xid79(convicted))
        assert trusted.status_code == 200, trusted.text
        assert trusted.json()["trusted"] is True
        # (Other watched jobs that ended on that node, an earlier test's, are told as well.)
        assert job_id in [d["job_id"] for d in trusted.json()["events"][0]["detections"]]
        second = first
        status = await h.wait_stage(second, {Stage.VERIFYING, Stage.DONE}, timeout=120)
        verdict = status.verdict
        assert verdict is not None and verdict.culprit_nodes == [convicted]
        assert verdict.category.value == "gpu_hardware"
        assert verdict.corroboration == {convicted: ["health_event"]}
        [line] = [e for e in verdict.evidence if e.source == "health.jsonl"]
        assert line.trusted and line.node == convicted and line.xid and line.xid.code == 79
        [det] = await h.events(second, "detection")
        assert det.data["source"] == "health_event" and det.nodes == [convicted]
        node = await h.sched.get_node(convicted)
        assert node.drain_flag and f"relaunch-{h.config.name}-node-{convicted}" in node.reason

        # The node's history on the console shows the events, and whose were trusted.
        page = await asyncio.to_thread(
            httpx.get,
            f"{url}/nodes",
            headers={"authorization": f"Bearer {tokens['vera']}"},
            timeout=30,
        )
        assert page.status_code == 200
        assert 'data-kind="health_event"' in page.text and "untrusted sender" in page.text


async def test_an_external_drain_of_a_watched_job_s_node_shows_on_its_history(
    make_harness: MakeHarness, tmp_path: Path
) -> None:
    h = make_harness(Policy(mode=Mode.MONITOR))
    app, tokens = console_app(h, tmp_path)
    h.start("worker")
    h.start("watch")
    job_id, nodes, _ = await start_training(h)
    drained = nodes[1]
    since = datetime.now(UTC) - timedelta(minutes=1)
    subprocess.run(
        ["scontrol", "update", f"nodename={drained}", "state=drain", f"reason={NHC}"],
        env={**os.environ, **h.stack.slurm_env},
        check=True,
        capture_output=True,
        timeout=30,
    )

    async def recorded() -> bool:
        rows = await h.audit.outside_events(h.config.name, since, kinds=("external_drain",))
        return bool(rows)

    await h.until(recorded, "no external_drain row", timeout=30)
    [row] = await h.audit.outside_events(h.config.name, since, kinds=("external_drain",))
    assert row.nodes == [drained] and row.data["reason"] == NHC
    assert job_id in row.data["jobs"] and row.data["reason_time"]
    assert "DRAIN" in str(row.data["state"]) and row.actor == (row.data["user"] or "slurm")
    await asyncio.sleep(6)  # the watcher looks again: the same drain is not recorded twice
    assert len(await h.audit.outside_events(h.config.name, since, kinds=("external_drain",))) == 1

    history = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "relaunch.cli", "nodes", "history", drained]
        + ["--config", str(h.config_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert history.returncode == 0, history.stderr
    assert "drained outside Relaunch" in history.stdout and NHC in history.stdout
    listing = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "relaunch.cli", "nodes", "--json", "--config", str(h.config_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    lines = [json.loads(line) for line in listing.stdout.splitlines()]
    [mine] = [line for line in lines if line["node"] == drained]
    assert mine["outside"][-1]["kind"] == "external_drain"
    with serve(app) as url:
        page = await asyncio.to_thread(
            httpx.get,
            f"{url}/nodes",
            headers={"authorization": f"Bearer {tokens['vera']}"},
            timeout=30,
        )
    assert page.status_code == 200
    assert 'data-kind="external_drain"' in page.text and NHC in page.text

    # The watcher also takes a drain that appears under a job as a sign for the job (its
    # node_state:DRAIN detection): that recovery waits for a person here; turn it down.
    incident = h.incident(job_id)
    done = {Stage.AWAITING_APPROVAL, Stage.HELD, Stage.NO_ACTION, Stage.DONE}
    status = await h.wait_stage(incident, done, timeout=60)
    if status.awaiting_approval:
        await h.handle(incident).signal(RecoveryWorkflow.reject, Approval(by="test"))
