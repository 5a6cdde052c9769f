"""A stand-in OpenTelemetry collector: the OTLP/HTTP traces endpoint (``POST /v1/traces``,
protobuf), decoding each ``ExportTraceServiceRequest`` with the real OTLP protobuf classes and
keeping its spans (and the request headers) for a test to read. Serve ``receiver.app`` with
``tests.integration.serve.serve``."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PROTOBUF = "application/x-protobuf"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it; ids in hex, ``parent_id`` empty for a root."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]]
    start_ns: int
    end_ns: int

    @property
    def is_root(self) -> bool:
        return not self.parent_id


@dataclass
class OtlpReceiver:
    """Answers 200 with an ``ExportTraceServiceResponse`` (or ``status`` when set), and keeps
    what it decoded."""

    status: int = 200
    spans: list[ReceivedSpan] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])

    async def _traces(self, request: Request) -> Response:
        if request.headers.get("content-type") != PROTOBUF:
            return Response("OTLP/HTTP takes protobuf here", status_code=415)
        body = await request.body()
        encoding = request.headers.get("content-encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        received = [
            ReceivedSpan(
                trace_id=span.trace_id.hex(),
                span_id=span.span_id.hex(),
                parent_id=span.parent_span_id.hex(),
                name=span.name,
                kind=span.kind,
                attributes=_attributes(span.attributes),
                resource=_attributes(resource_spans.resource.attributes),
                links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                start_ns=span.start_time_unix_nano,
                end_ns=span.end_time_unix_nano,
            )
            for resource_spans in export.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self.headers.append(dict(request.headers))
            if self.status == 200:
                self.spans.extend(received)
        if self.status != 200:
            return Response(b"", status_code=self.status)
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    async def until(
        self, check: Callable[[list[ReceivedSpan]], bool], what: str, timeout: float = 20
    ) -> list[ReceivedSpan]:
        """The spans received once ``check`` holds for them; AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"{what} after {timeout}s; {len(spans)} spans: {names}")
            await asyncio.sleep(0.2)


def descends_from(span: ReceivedSpan, root: ReceivedSpan, spans: list[ReceivedSpan]) -> bool:
    """Whether ``span`` is below ``root`` by parent links among ``spans`` (same trace)."""
    by_id = {s.span_id: s for s in spans if s.trace_id == root.trace_id}
    seen: set[str] = set()
    current: ReceivedSpan | None = span
    while current is not None and current.trace_id == root.trace_id:
        if current.parent_id == root.span_id:
            return True
        if current.span_id in seen:
            return False
        seen.add(current.span_id)
        current = by_id.get(current.parent_id)
    return False


def tree(spans: list[ReceivedSpan], root: ReceivedSpan) -> str:
    """``root`` and what is below it, indented (for a failing assertion's message)."""
    children: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        if span.trace_id == root.trace_id:
            children.setdefault(span.parent_id, []).append(span)
    lines: list[str] = []

    def walk(span: ReceivedSpan, depth: int) -> None:
        lines.append(f"{'  ' * depth}{span.name} {span.attributes.get('temporalWorkflowID', '')}")
        for child in sorted(children.get(span.span_id, []), key=lambda s: s.start_ns):
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines)
