"""Grafana Loki: ``GET /loki/api/v1/query_range`` with a LogQL log query.

Loki caps the entries of one answer at ``limit`` (and refuses a limit above its
``max_entries_limit_per_query``, 5000 by default), so longer ranges are read in pages of
``page_size``: a forward page moves ``start`` to the last timestamp it saw (start is
inclusive), a backward page moves ``end`` to one nanosecond after the oldest (end is
exclusive); the entries at that boundary timestamp come again and are dropped. This is how
``logcli`` pages too.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import httpx

from relaunch.connectors.logstores.base import (
    HttpLogStore,
    LogLine,
    LogSelector,
    from_ns,
    to_ns,
)
from relaunch.models.errors import LogStoreError
from relaunch.models.logstore import quote_literal

log = logging.getLogger(__name__)

QUERY_RANGE = "/loki/api/v1/query_range"

_Entry = tuple[int, str, tuple[tuple[str, str], ...]]


def parse_streams(payload: Any) -> list[_Entry]:
    """The entries of a ``resultType: streams`` answer as (ns, line, labels), unsorted."""
    if not isinstance(payload, dict) or payload.get("status") != "success":
        raise LogStoreError("Loki answered without status success")
    data = payload.get("data")
    if not isinstance(data, dict):
        raise LogStoreError("Loki answered without data")
    if data.get("resultType") != "streams":
        raise LogStoreError(
            f"Loki answered resultType {data.get('resultType')!r}, not streams",
            hint="the query must be a log query (stream selector and filters), not a metric query",
        )
    entries: list[_Entry] = []
    try:
        for stream in data.get("result") or []:
            labels = tuple(
                sorted((str(k), str(v)) for k, v in (stream.get("stream") or {}).items())
            )
            # [ts, line] or, with categorized labels, [ts, line, {structured metadata}]
            for value in stream.get("values") or []:
                entries.append((int(value[0]), str(value[1]), labels))
    except (AttributeError, IndexError, TypeError, ValueError) as exc:
        raise LogStoreError(f"Loki answered an unreadable stream: {exc}") from exc
    return entries


class LokiStore(HttpLogStore):
    """Reads log lines from Loki (multi-tenant with ``X-Scope-OrgID``)."""

    name = "Loki"

    def tenant_headers(self, tenant: str | None) -> dict[str, str]:
        return {"X-Scope-OrgID": tenant} if tenant else {}

    @staticmethod
    def logql(selector: LogSelector) -> str:
        if selector.contains is None:
            return selector.query
        return f"{selector.query} |= {quote_literal(selector.contains)}"

    async def _page(
        self, query: str, start_ns: int, end_ns: int, limit: int, direction: str
    ) -> list[_Entry]:
        params = {
            "query": query,
            "start": str(start_ns),
            "end": str(end_ns),
            "limit": str(limit),
            "direction": direction,
        }
        try:
            response = await self._client.get(QUERY_RANGE, params=params)
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        self._check_status(response.status_code, response.text)
        try:
            payload = response.json()
        except ValueError as exc:
            raise LogStoreError("Loki answered with something that is not JSON") from exc
        entries = parse_streams(payload)
        # Streams come one after another; merge them into one timeline. The sort is stable, so
        # entries with the same timestamp keep Loki's order.
        entries.sort(key=lambda e: e[0], reverse=direction == "backward")
        return entries

    async def fetch(
        self,
        selector: LogSelector,
        start: datetime,
        end: datetime,
        limit: int,
        *,
        newest: bool = False,
    ) -> list[LogLine]:
        query = self.logql(selector)
        direction = "backward" if newest else "forward"
        lo, hi = to_ns(start), to_ns(end)
        got: list[_Entry] = []
        edge: int | None = None
        seen_at_edge: set[_Entry] = set()
        while len(got) < limit and lo < hi:
            want = min(self.settings.page_size, limit - len(got) + len(seen_at_edge))
            page = await self._page(query, lo, hi, want, direction)
            fresh = [e for e in page if not (e[0] == edge and e in seen_at_edge)]
            got.extend(fresh[: limit - len(got)])
            if len(page) < want:
                break  # the range holds no more
            last = page[-1][0]
            at_last = {e for e in page if e[0] == last}
            seen_at_edge = seen_at_edge | at_last if last == edge else at_last
            edge = last
            if len(seen_at_edge) >= self.settings.page_size:
                # More entries share one timestamp than a page holds: paging by time cannot
                # split them, so step past that nanosecond (some of its entries are skipped).
                log.warning("Loki: over %d entries at one timestamp; skipping past it", want)
                seen_at_edge, edge = set(), None
                lo, hi = (lo, last) if newest else (last + 1, hi)
            elif newest:
                hi = last + 1
            else:
                lo = last
            if not fresh:
                break  # no progress (a server that ignores start/end)
        if newest:
            got.reverse()
        return [
            LogLine(time=from_ns(ns), text=text, labels=dict(labels)) for ns, text, labels in got
        ]
