"""The export side of tracing, imported only where ``tracing.otlp_endpoint`` is set (it loads
the OpenTelemetry SDK): the provider and its OTLP/HTTP exporter, and Temporal's tracing
interceptor as the worker and the watcher use it. See :mod:`relaunch.connectors.tracing`."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import temporalio.activity
import temporalio.worker
from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from temporalio.contrib.opentelemetry import TracingInterceptor

from relaunch.connectors.tracing import untraced_context
from relaunch.models import tracing as names
from relaunch.models.lifecycle import parse_lifecycle_id
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.recovery import parse_recovery_id
from relaunch.models.tracing import TracingSettings

log = logging.getLogger("relaunch.tracing")

# The exporter logs every failed batch (and every retry) itself; a collector that is down for
# an hour would fill the process's log. Relaunch says it once instead (SaysWhenFailing).
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
)


def build_provider(
    settings: TracingSettings, cluster: str, process: str, headers: Mapping[str, str]
) -> TracerProvider:
    """A provider whose spans carry ``service.name``, ``relaunch.cluster`` and
    ``relaunch.process``, sent in batches to ``settings.otlp_endpoint``."""
    assert settings.otlp_endpoint is not None
    for name in _EXPORTER_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    resource = Resource.create(
        {
            SERVICE_NAME: settings.service_name,
            names.ATTR_CLUSTER: cluster,
            names.ATTR_PROCESS: process,
        }
    )
    exporter = OTLPSpanExporter(
        endpoint=settings.otlp_endpoint, headers=dict(headers), timeout=settings.export_timeout_s
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(
            SaysWhenFailing(exporter, settings.otlp_endpoint),
            schedule_delay_millis=settings.schedule_delay_s * 1000,
            export_timeout_millis=settings.export_timeout_s * 1000,
        )
    )
    return provider


class SaysWhenFailing(SpanExporter):
    """An exporter that says once when its exports start failing, and once when they succeed
    again."""

    def __init__(self, exporter: SpanExporter, endpoint: str) -> None:
        self.exporter = exporter
        self.endpoint = endpoint
        self.failing = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.exporter.export(spans)
        if result is SpanExportResult.FAILURE and not self.failing:
            self.failing = True
            log.warning(
                "traces do not reach %s: spans are dropped until it answers (said once)",
                self.endpoint,
                extra={"dropped": len(spans)},
            )
        elif result is SpanExportResult.SUCCESS and self.failing:
            self.failing = False
            log.info("traces reach %s again", self.endpoint)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class RelaunchTracingInterceptor(TracingInterceptor):
    """Temporal's ``TracingInterceptor`` (client, workflow and activity spans), with two
    things for the activities:

    - every ``RunActivity`` span carries ``relaunch.incident_id`` (the workflow's id),
      ``relaunch.cluster`` and, for a job's recovery, ``relaunch.job_id``: a search by
      incident finds its activities;
    - an activity whose workflow was started without a trace (by a process that does not
      trace, e.g. the console's intake) is not traced either: its span would be a root of its
      own, one per activity, each claiming the incident."""

    def __init__(self, tracer: trace.Tracer, cluster: str) -> None:
        super().__init__(tracer)
        self.cluster = cluster

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        traced = super().intercept_activity(_IncidentAttributes(next, self.cluster))
        return _UntracedWithoutParent(traced, self.header_key)


class _UntracedWithoutParent(temporalio.worker.ActivityInboundInterceptor):
    def __init__(self, next: temporalio.worker.ActivityInboundInterceptor, header: str) -> None:
        super().__init__(next)
        self.header = header

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        if self.header in input.headers:
            return await super().execute_activity(input)
        token = context.attach(untraced_context())
        try:
            return await super().execute_activity(input)
        finally:
            context.detach(token)


class _IncidentAttributes(temporalio.worker.ActivityInboundInterceptor):
    def __init__(self, next: temporalio.worker.ActivityInboundInterceptor, cluster: str) -> None:
        super().__init__(next)
        self.cluster = cluster

    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        span = trace.get_current_span()  # the RunActivity span, just opened
        if span.is_recording():
            incident = temporalio.activity.info().workflow_id
            span.set_attribute(names.ATTR_CLUSTER, self.cluster)
            if incident:
                span.set_attribute(names.ATTR_INCIDENT, incident)
                job = job_of(incident)
                if job is not None:
                    span.set_attribute(names.ATTR_JOB, job)
        return await super().execute_activity(input)


def job_of(incident: str) -> str | None:
    """The job id of a job's recovery; None for a node's workflows (looked at first: a node
    may be named ``n-2``, which would read as a job)."""
    if parse_lifecycle_id(incident) is not None or parse_node_decision_id(incident) is not None:
        return None
    parsed = parse_recovery_id(incident)
    return parsed[1] if parsed is not None else None
