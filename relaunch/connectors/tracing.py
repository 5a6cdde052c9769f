"""Traces out: OpenTelemetry spans of every recovery, exported over OTLP/HTTP (protobuf).

:func:`start_tracing` is called once by each long-running process (``relaunch worker``,
``relaunch watch``). With ``tracing.otlp_endpoint`` unset it does nothing at all: the SDK is
not imported, no provider or thread is made, no interceptor is added, and the spans Relaunch
opens itself (the watcher's handover, here) are the API's no-op ones. Set, it installs a
global ``TracerProvider`` (:mod:`relaunch.connectors.otlp`) whose ``BatchSpanProcessor``
sends ended spans from a thread of its own, and returns Temporal's tracing interceptor for the
process's client: the client spans (signal-with-start), and on the worker the workflow spans
and one ``RunActivity:<name>`` span per activity (docs/tracing.md). An export never runs on
the event loop, gives up after ``export_timeout_s``, and a collector that does not answer
costs the dropped spans and one warning, never a recovery's time."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

import temporalio.client
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from temporalio.client import WorkflowExecutionDescription

from relaunch.models import tracing as names
from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import Detection

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger("relaunch.tracing")

# How long a stopping process waits for its last spans to leave.
SHUTDOWN_WAIT_S = 5.0


class TracingConfigError(RelaunchError):
    """The variable ``tracing.headers_env`` names is unset or malformed; a person must fix the
    deployment (the configuration file never holds the headers)."""


def export_headers(env_name: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The export request's headers from the variable ``env_name``: ``key=value`` pairs,
    comma-separated, percent-encoded (the format of ``OTEL_EXPORTER_OTLP_HEADERS``). No value
    ever appears in an error."""
    raw = environ.get(env_name)
    if not raw:
        raise TracingConfigError(
            f"environment variable {env_name} (tracing.headers_env) is not set",
            hint="export it in the process's environment (the config file names it, never "
            "holds it)",
        )
    headers: dict[str, str] = {}
    for index, item in enumerate(raw.split(","), start=1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TracingConfigError(
                f"environment variable {env_name}: header {index} is not key=value",
                hint="write it as key=value,key2=value2 (values percent-encoded)",
            )
        headers[unquote(key.strip())] = unquote(value.strip())
    return headers


@dataclass
class Tracing:
    """What :func:`start_tracing` set up: the interceptors for the process's Temporal client
    (workers built on that client take them too) and the provider to flush when the process
    stops. Empty when tracing is off."""

    interceptors: list[temporalio.client.Interceptor] = field(default_factory=list)
    provider: TracerProvider | None = None

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def shutdown(self, wait_s: float = SHUTDOWN_WAIT_S) -> None:
        """Send the spans still queued and stop the export thread, waiting at most ``wait_s``:
        a collector that is gone must not hold up a process that stops."""
        if self.provider is None:
            return
        done = threading.Thread(
            target=self.provider.shutdown, name="relaunch-tracing-shutdown", daemon=True
        )
        done.start()
        done.join(wait_s)
        if done.is_alive():
            log.warning("stopped without waiting for the last spans (collector too slow)")


def start_tracing(
    config: ClusterConfig,
    process: str,
    *,
    environ: Mapping[str, str] | None = None,
    install: bool = True,
) -> Tracing:
    """Set up the export ``config.tracing`` asks for in this process (``process``: ``worker``
    or ``watch``, a resource attribute). ``install`` makes the provider the process's global
    one, which the handover's spans below use (the tests of the provider itself leave it
    out). Raises :class:`TracingConfigError` before anything starts when the headers'
    variable is missing."""
    settings = config.tracing
    if settings.otlp_endpoint is None:
        return Tracing()
    headers = (
        export_headers(settings.headers_env, os.environ if environ is None else environ)
        if settings.headers_env
        else {}
    )
    # The SDK and the exporter are imported here, only where tracing is on.
    from relaunch.connectors.otlp import RelaunchTracingInterceptor, build_provider

    provider = build_provider(settings, config.name, process, headers)
    if install:
        trace.set_tracer_provider(provider)
    log.info(
        "tracing on: spans to %s every %.1fs (service %s)",
        settings.otlp_endpoint,
        settings.schedule_delay_s,
        settings.service_name,
    )
    tracer = provider.get_tracer("relaunch")
    return Tracing(
        interceptors=[RelaunchTracingInterceptor(tracer, config.name)], provider=provider
    )


# The recovery's root span context, kept in its workflow's memo (W3C ``traceparent``) so that
# later detections, from whichever watcher process sends them, are put in its trace.
TRACE_MEMO = "traceparent"
_propagator = TraceContextTextMapPropagator()


def _tracer() -> trace.Tracer:
    # The global provider's (a no-op one until start_tracing installs one).
    return trace.get_tracer("relaunch")


def _detection_attributes(incident: str, det: Detection) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        names.ATTR_INCIDENT: incident,
        names.ATTR_JOB: det.job_id,
        names.ATTR_CLUSTER: det.cluster,
        names.ATTR_ATTEMPT: det.attempt,
        names.ATTR_DETECTION_KIND: det.kind,
        names.ATTR_DETECTION_SOURCE: det.source.value,
    }
    if det.nodes:
        attributes[names.ATTR_NODES] = list(det.nodes)
    return attributes


def recovery_span(incident: str, det: Detection) -> trace.Span:
    """The root span of the recovery ``incident``, opened when the watcher saw ``det`` (its
    first detection) and not yet ended: the caller ends it only when its signal-with-start
    started the recovery's run, so a recovery has one root however many senders race."""
    started_at = min(int(det.detected_at.timestamp() * 1e9), time.time_ns())
    return _tracer().start_span(
        names.RECOVERY_SPAN,
        context=Context(),  # a root, whatever span the caller is in
        kind=trace.SpanKind.INTERNAL,
        attributes=_detection_attributes(incident, det),
        start_time=started_at,
    )


async def follow_up_span(
    running: WorkflowExecutionDescription, incident: str, det: Detection, count: int
) -> trace.Span:
    """The span of handing ``count`` later detections (``det`` the first) to the running
    recovery ``incident``: a child of its root, read from the workflow's memo. A recovery
    started without tracing has no root to join, and its later detections are not traced."""
    carrier = await running.memo_value(TRACE_MEMO, None, type_hint=str)
    parent = _propagator.extract({TRACE_MEMO: carrier}) if carrier else untraced_context()
    attributes = _detection_attributes(incident, det)
    attributes[names.ATTR_DETECTIONS] = count
    return _tracer().start_span(
        names.FOLLOW_UP_SPAN, context=parent, kind=trace.SpanKind.INTERNAL, attributes=attributes
    )


def trace_memo(span: trace.Span) -> dict[str, str]:
    """The memo entry that carries ``span`` (a recovery's root) to later senders; none when the
    span is not sent (tracing off)."""
    if not span.get_span_context().trace_flags.sampled:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, trace.set_span_in_context(span))
    return {TRACE_MEMO: carrier[TRACE_MEMO]} if TRACE_MEMO in carrier else {}


def untraced_context() -> Context:
    """A context whose parent span is not sampled: the spans made below it are never sent,
    and a context propagated from them (to a workflow, an activity) is not sampled either."""
    parent = trace.SpanContext(
        trace_id=random.getrandbits(128) or 1,
        span_id=random.getrandbits(64) or 1,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent), Context())


@contextmanager
def node_report_span(cluster: str, node: str) -> Iterator[trace.Span]:
    """The watcher's report of a failed node to its decision, as a root span of its own (the
    decision's trace when the report starts it). A no-op span when tracing is off."""
    with _tracer().start_as_current_span(
        names.NODE_REPORT_SPAN,
        context=Context(),
        attributes={names.ATTR_CLUSTER: cluster, names.ATTR_NODE: node},
    ) as span:
        yield span
