"""Traces out, end to end: a real recovery (real Slurm, Temporal, PostgreSQL, the DDP job, the
worker and the watcher as processes) traced to an OTLP/HTTP receiver that decodes the real
protobuf. The recovery is one trace under one root span, with a span per activity it ran."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from temporalio.api.enums.v1 import EventType

from relaunch.models.recovery import Mode, Policy, Stage
from relaunch.models.scheduler import JobState
from relaunch.models.tracing import TracingSettings
from tests.integration.conftest import MakeHarness
from tests.integration.harness import Harness
from tests.integration.helpers import wait_job
from tests.integration.serve import serve
from tests.support.otlp import OtlpReceiver, ReceivedSpan, descends_from, tree

HEADERS_ENV = "RELAUNCH_TEST_OTLP_HEADERS"


async def activities_ran(h: Harness, incident: str) -> Counter[str]:
    """Each activity the recovery's history says it ran (ordinary and local), and how often."""
    ran: Counter[str] = Counter()
    async for event in h.handle(incident).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            ran[event.activity_task_scheduled_event_attributes.activity_type.name] += 1
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_local_activity" and "data" in marker.details:
                data = json.loads(marker.details["data"].payloads[0].data)
                ran[data["activity_type"]] += 1
    return ran


async def test_a_recovery_is_one_trace_with_a_span_per_activity(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The processes take the collector's token from their environment, never from the file.
    monkeypatch.setenv(HEADERS_ENV, "authorization=Bearer%20trace-token")
    receiver = OtlpReceiver()
    with serve(receiver.app) as collector:
        h = make_harness(
            Policy(mode=Mode.AUTONOMOUS, verify_timeout_s=120),
            tracing=TracingSettings(
                otlp_endpoint=f"{collector}/v1/traces",
                headers_env=HEADERS_ENV,
                schedule_delay_s=0.5,
            ),
        )
        assert "trace-token" not in h.config_path.read_text()
        h.start("worker")
        h.start("watch")
        job_id = h.submit_ddp()
        job = await wait_job(h.sched, job_id, JobState.RUNNING, timeout=60)
        await h.wait_log(job_id, r"checkpoint saved step=\d+")
        culprit = job.nodes[1]
        h.kill_node(culprit, job_id)
        incident = h.incident(job_id)
        status = await h.wait_stage(incident, {Stage.DONE}, timeout=120)
        ran = await activities_ran(h, incident)
        assert {"investigate", "verify_check"} <= set(ran), ran

        def roots_of(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
            return [
                s
                for s in spans
                if s.is_root and s.attributes.get("relaunch.incident_id") == incident
            ]

        def complete(spans: list[ReceivedSpan]) -> bool:
            roots = roots_of(spans)
            if not roots:
                return False
            runs = Counter(
                s.name.removeprefix("RunActivity:")
                for s in spans
                if s.trace_id == roots[0].trace_id
                and s.name.startswith("RunActivity:")
                and s.attributes.get("temporalWorkflowID") == incident
            )
            return all(runs[name] >= n for name, n in ran.items())

        spans = await receiver.until(complete, f"a span per activity of {incident}", timeout=20)

    # One root span claims the recovery, in all that was sent: the watcher's handover of its
    # first detection, with the incident, the job and the cluster. (A later attempt of the job,
    # the restarted job ended by the test, is another recovery with a root of its own.)
    (root,) = roots_of(spans)
    claims = [
        s
        for s in spans
        if s.name == "relaunch.recovery" and s.attributes.get("relaunch.incident_id") == incident
    ]
    assert claims == [root], [(s.name, s.attributes, s.is_root) for s in claims]
    assert root.attributes["relaunch.job_id"] == job_id
    assert root.attributes["relaunch.cluster"] == h.config.name
    assert root.resource["relaunch.process"] == "watch"
    assert root.resource["service.name"] == "relaunch"
    trace = [s for s in spans if s.trace_id == root.trace_id]
    assert [s for s in trace if s.is_root] == [root]

    def below(name: str) -> list[ReceivedSpan]:
        return [
            s
            for s in trace
            if s.name == name
            and s.attributes.get("temporalWorkflowID") == incident
            and descends_from(s, root, spans)
        ]

    # The watcher's signal-with-start, and the workflow the worker ran, are below it. Later
    # detections handed over to the running recovery are below it too, each under a
    # `relaunch.follow_up` span: none is a root of its own.
    sends = below("SignalWithStartWorkflow:RecoveryWorkflow")
    assert len([s for s in sends if s.parent_id == root.span_id]) == 1, tree(trace, root)
    follow_ups = {s.span_id: s for s in trace if s.name == "relaunch.follow_up"}
    assert all(s.parent_id in follow_ups for s in sends if s.parent_id != root.span_id)
    assert all(s.parent_id == root.span_id for s in follow_ups.values())
    assert all(s.attributes["relaunch.incident_id"] == incident for s in follow_ups.values())
    assert below("RunWorkflow:RecoveryWorkflow")
    assert below("CompleteWorkflow:RecoveryWorkflow")
    # And a span for each activity it ran (each attempt), each carrying the incident and job.
    for name, times in ran.items():
        runs = below(f"RunActivity:{name}")
        assert len(runs) >= times, (name, times, len(runs))
        for run in runs:
            assert run.attributes["relaunch.incident_id"] == incident
            assert run.attributes["relaunch.job_id"] == job_id
            assert run.resource["relaunch.process"] == "worker"
            assert below(f"StartActivity:{name}"), name
    # No activity of the recovery was sent outside its trace.
    strays = [
        s
        for s in spans
        if s.attributes.get("temporalWorkflowID") == incident and s.trace_id != root.trace_id
    ]
    assert strays == []

    # The node's decision (a workflow of its own) was traced too, in the report's trace or,
    # where the recovery's join started it, in the recovery's.
    assert status.node_decision is not None
    assert any(
        s.name == "RunWorkflow:NodeDecisionWorkflow"
        and s.attributes.get("temporalWorkflowID") == status.node_decision
        for s in spans
    )
    # The token reached the collector with every export.
    assert {r.get("authorization") for r in receiver.headers} == {"Bearer trace-token"}
