"""Traces out: the ``tracing`` settings, the setup a process makes from them, the export to a
real OTLP/HTTP receiver (the real protobuf), and the spans the watcher's handover opens."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from relaunch.connectors import tracing
from relaunch.connectors.otlp import RelaunchTracingInterceptor, _UntracedWithoutParent, job_of
from relaunch.connectors.tracing import TracingConfigError, export_headers, start_tracing
from relaunch.devstack import procs
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import Detection, DetectionSource
from relaunch.models.tracing import TracingSettings
from tests.integration.serve import serve
from tests.support.otlp import OtlpReceiver


def cluster(**tracing_settings: Any) -> ClusterConfig:
    return ClusterConfig(
        name="dev",
        database_url="postgresql://x@127.0.0.1/x",
        bundle_dir="/tmp/b",
        tracing=TracingSettings(**tracing_settings),
    )


# ------------------------------------------------------------------ settings


def test_tracing_is_off_unless_an_endpoint_is_set() -> None:
    config = ClusterConfig.model_validate(
        {"name": "dev", "database_url": "postgresql://x@h/x", "bundle_dir": "/b"}
    )
    assert config.tracing.otlp_endpoint is None and not config.tracing.enabled
    on = TracingSettings(otlp_endpoint="https://otel.example:4318/v1/traces")
    assert on.enabled and on.schedule_delay_s == 2.0 and on.service_name == "relaunch"


@pytest.mark.parametrize(
    "endpoint",
    ["otel:4318/v1/traces", "grpc://otel:4317", "http:///v1/traces", "http://otel:x/v1/traces"],
)
def test_an_endpoint_that_is_no_http_url_is_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="otlp_endpoint|port"):
        TracingSettings(otlp_endpoint=endpoint)


def test_secrets_in_the_file_are_refused_and_never_echoed() -> None:
    cases: list[dict[str, object]] = [
        {"otlp_endpoint": "http://user:s3cret-token@otel:4318/v1/traces"},
        {"headers_env": "authorization=Bearer s3cret-token"},
        {"headers": {"authorization": "Bearer s3cret-token"}},
    ]
    for case in cases:
        with pytest.raises(ValidationError) as refused:
            TracingSettings.model_validate(case)
        assert "s3cret-token" not in str(refused.value), case


@pytest.mark.parametrize("field", ["export_timeout_s", "schedule_delay_s"])
def test_timings_are_bounded(field: str) -> None:
    for bad in (0, 61):
        with pytest.raises(ValidationError):
            TracingSettings.model_validate({field: bad})


# ------------------------------------------------------------------ headers


def test_headers_come_from_the_named_variable_percent_decoded() -> None:
    env = {"OTLP_HEADERS": "authorization=Bearer%20abc, x-scope-orgid=team-a,"}
    assert export_headers("OTLP_HEADERS", env) == {
        "authorization": "Bearer abc",
        "x-scope-orgid": "team-a",
    }


def test_a_missing_or_malformed_headers_variable_says_so_without_the_value() -> None:
    with pytest.raises(TracingConfigError, match="OTLP_HEADERS .* is not set"):
        export_headers("OTLP_HEADERS", {})
    with pytest.raises(TracingConfigError, match="header 2 is not key=value") as bad:
        export_headers("OTLP_HEADERS", {"OTLP_HEADERS": "a=1,s3cret-token"})
    assert "s3cret-token" not in str(bad.value)
    with pytest.raises(TracingConfigError):  # before any provider or thread is made
        start_tracing(cluster(otlp_endpoint="http://o:4318/v1/traces", headers_env="NOPE"), "x")


# ------------------------------------------------------------------ setup


def test_no_endpoint_no_provider_no_interceptor_no_sdk() -> None:
    off = start_tracing(cluster(), "worker")
    assert off.interceptors == [] and off.provider is None and not off.enabled
    off.shutdown()  # nothing to do
    # The SDK and the exporter are not even imported (a fresh interpreter: this one has).
    probe = (
        "import sys\n"
        "from relaunch.connectors.tracing import start_tracing\n"
        "from relaunch.workflows import recovery_client\n"
        "from relaunch.models.config import ClusterConfig\n"
        "c = ClusterConfig(name='dev', database_url='postgresql://x@h/x', bundle_dir='/b')\n"
        "assert start_tracing(c, 'watch').provider is None\n"
        "loaded = [m for m in sys.modules if m.startswith(('opentelemetry.sdk', "
        "'opentelemetry.exporter', 'temporalio.contrib.opentelemetry'))]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


def test_an_endpoint_gives_the_temporal_interceptor_and_a_provider() -> None:
    on = start_tracing(
        cluster(otlp_endpoint="http://127.0.0.1:9/v1/traces", service_name="relaunch-a"),
        "worker",
        install=False,
    )
    try:
        (interceptor,) = on.interceptors
        assert isinstance(interceptor, RelaunchTracingInterceptor)
        assert isinstance(interceptor, TracingInterceptor)  # Temporal's, client and worker
        assert on.provider is not None
        resource = dict(on.provider.resource.attributes)
        assert resource["service.name"] == "relaunch-a"
        assert resource["relaunch.cluster"] == "dev"
        assert resource["relaunch.process"] == "worker"
    finally:
        on.shutdown(wait_s=1)


def test_spans_reach_the_receiver_as_otlp_protobuf_with_the_headers() -> None:
    receiver = OtlpReceiver()
    with serve(receiver.app) as base:
        on = start_tracing(
            cluster(otlp_endpoint=f"{base}/v1/traces", headers_env="OTLP_HEADERS"),
            "watch",
            environ={"OTLP_HEADERS": "authorization=Bearer%20t0ken"},
            install=False,
        )
        assert on.provider is not None
        tracer = on.provider.get_tracer("test")
        with (
            tracer.start_as_current_span("outer", attributes={"relaunch.job_id": "26"}),
            tracer.start_as_current_span("inner"),
        ):
            pass
        on.shutdown(wait_s=10)  # flushes what is queued
    spans = {s.name: s for s in receiver.snapshot()}
    assert spans["outer"].is_root and spans["inner"].parent_id == spans["outer"].span_id
    assert spans["outer"].attributes == {"relaunch.job_id": "26"}
    assert spans["inner"].resource["relaunch.process"] == "watch"
    assert receiver.headers[0]["authorization"] == "Bearer t0ken"


def test_an_unreachable_collector_costs_nothing_but_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = procs.free_port()  # nothing listens there
    on = start_tracing(
        cluster(otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces", export_timeout_s=0.5),
        "worker",
        install=False,
    )
    assert on.provider is not None
    tracer = on.provider.get_tracer("test")
    caplog.set_level(logging.INFO, logger="relaunch.tracing")
    began = time.monotonic()
    for _ in range(200):
        with tracer.start_as_current_span("step"):
            pass
    assert time.monotonic() - began < 1.0  # ending a span only queues it
    for _ in range(3):  # three failed exports (on this thread, to see them fail)
        with tracer.start_as_current_span("step"):
            pass
        on.provider.force_flush()
    began = time.monotonic()
    on.shutdown(wait_s=3)
    assert time.monotonic() - began < 3.5
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        f"traces do not reach http://127.0.0.1:{port}/v1/traces: spans are dropped until it "
        "answers (said once)"
    ]


def test_activity_spans_name_the_job_only_for_a_jobs_recovery() -> None:
    assert job_of("relaunch-dev-26-0") == "26"
    assert job_of("relaunch-dev-26_3-1") == "26_3"
    assert job_of("relaunch-dev-node-n-2-1") is None  # a node decision, node "n-2"
    assert job_of("relaunch-dev-lifecycle-n-2-1") is None
    assert job_of("something-else") is None


async def test_an_activity_of_an_untraced_workflow_sends_no_span(
    spans: InMemorySpanExporter,
) -> None:
    seen: list[bool] = []

    class Next(ActivityInboundInterceptor):
        async def execute_activity(self, input: ExecuteActivityInput) -> Any:
            with tracing._tracer().start_as_current_span("RunActivity:x") as span:
                seen.append(span.get_span_context().trace_flags.sampled)
            return None

    interceptor = RelaunchTracingInterceptor(trace.NoOpTracer(), "dev")
    untraced = _UntracedWithoutParent(Next(None), interceptor.header_key)  # type: ignore[arg-type]
    await untraced.execute_activity(
        ExecuteActivityInput(fn=len, args=[], executor=None, headers={})
    )
    assert seen == [False] and spans.get_finished_spans() == ()
    # With the workflow's trace context in its headers, the activity is traced as usual.
    header = {interceptor.header_key: Payload()}
    await untraced.execute_activity(
        ExecuteActivityInput(fn=len, args=[], executor=None, headers=header)
    )
    assert seen == [False, True] and len(spans.get_finished_spans()) == 1


# ------------------------------------------------------------------ the handover's spans


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """What the handover's spans would send (the global provider is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer("relaunch"))
    return exporter


def detection(**kw: Any) -> Detection:
    base: dict[str, Any] = {
        "cluster": "dev",
        "job_id": "26",
        "attempt": 0,
        "source": DetectionSource.NODE_LOG,
        "kind": "signature:xid_79",
        "nodes": ["n2"],
        "detected_at": datetime.now(UTC) - timedelta(seconds=3),
    }
    return Detection(**{**base, **kw})


class Running:
    """A running recovery's description, as far as the handover reads it: its memo."""

    def __init__(self, memo: dict[str, str]) -> None:
        self.memo = memo

    async def memo_value(self, key: str, default: Any = None, *, type_hint: Any = None) -> Any:
        return self.memo.get(key, default)


async def test_the_first_detection_opens_the_recovery_root(spans: InMemorySpanExporter) -> None:
    det = detection()
    root = tracing.recovery_span("relaunch-dev-26-0", det)
    memo = tracing.trace_memo(root)
    root.end()
    (sent,) = spans.get_finished_spans()
    assert sent.name == "relaunch.recovery" and sent.parent is None
    assert dict(sent.attributes or {}) == {
        "relaunch.incident_id": "relaunch-dev-26-0",
        "relaunch.job_id": "26",
        "relaunch.cluster": "dev",
        "relaunch.attempt": 0,
        "relaunch.detection.kind": "signature:xid_79",
        "relaunch.detection.source": "node_log",
        "relaunch.nodes": ("n2",),
    }
    # It opens when the watcher saw the interruption, not when the signal left.
    assert sent.start_time == int(det.detected_at.timestamp() * 1e9)
    context = root.get_span_context()
    assert list(memo) == ["traceparent"]
    assert memo["traceparent"].startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")


async def test_later_detections_join_the_root_and_are_never_roots(
    spans: InMemorySpanExporter,
) -> None:
    root = tracing.recovery_span("relaunch-dev-26-0", detection())
    memo = tracing.trace_memo(root)
    root.end()
    running: Any = Running(memo)
    later = await tracing.follow_up_span(running, "relaunch-dev-26-0", detection(), 3)
    later.end()
    first, joined = spans.get_finished_spans()
    assert joined.name == "relaunch.follow_up" and joined.parent is not None
    assert joined.parent.span_id == first.context.span_id
    assert joined.context.trace_id == first.context.trace_id
    assert (joined.attributes or {})["relaunch.detections"] == 3


async def test_a_recovery_started_untraced_keeps_its_later_detections_untraced(
    spans: InMemorySpanExporter,
) -> None:
    running: Any = Running({})
    later = await tracing.follow_up_span(running, "relaunch-dev-26-0", detection(), 1)
    assert not later.get_span_context().trace_flags.sampled
    assert tracing.trace_memo(later) == {}
    later.end()
    assert spans.get_finished_spans() == ()


def test_without_a_provider_the_handover_spans_are_no_ops() -> None:
    # No provider installed in this process: the API's no-op span, nothing in the memo.
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a global provider was installed by another test")
    root = tracing.recovery_span("relaunch-dev-26-0", detection())
    assert not root.is_recording() and tracing.trace_memo(root) == {}
