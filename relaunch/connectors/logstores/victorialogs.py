"""VictoriaLogs: ``POST /select/logsql/query`` with a LogsQL query; the answer is streamed
JSON Lines, one entry per line (``_msg``, ``_time`` in RFC 3339, ``_stream`` and the other
fields).

The time range is both in the query (``_time:[start, end)``) and in the ``start`` / ``end``
arguments. With ``limit=N`` VictoriaLogs answers the N most recent entries; for the first N the
query sorts by ``_time`` and cuts with the ``limit`` pipe. Either way the order of the answer is
not relied on: entries are sorted here.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx

from relaunch.connectors.logstores.base import HttpLogStore, LogLine, LogSelector
from relaunch.models.errors import LogStoreError
from relaunch.models.logstore import quote_literal

QUERY = "/select/logsql/query"
_INTERNAL = {"_msg", "_time", "_stream", "_stream_id"}


def rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_entry(raw: str) -> LogLine:
    """One JSON line of the answer as a LogLine; labels are the entry's other string fields."""
    try:
        entry = json.loads(raw)
        stamp = datetime.fromisoformat(str(entry["_time"]).replace("Z", "+00:00"))
    except (ValueError, KeyError, TypeError) as exc:
        raise LogStoreError(f"VictoriaLogs answered an unreadable entry: {exc}") from exc
    if not isinstance(entry, dict):
        raise LogStoreError("VictoriaLogs answered an entry that is not an object")
    labels = {k: str(v) for k, v in entry.items() if k not in _INTERNAL}
    if isinstance(entry.get("_stream"), str):
        labels["_stream"] = entry["_stream"]
    return LogLine(time=stamp.astimezone(UTC), text=str(entry.get("_msg", "")), labels=labels)


class VictoriaLogsStore(HttpLogStore):
    """Reads log entries from VictoriaLogs (tenant as ``AccountID[:ProjectID]`` headers)."""

    name = "VictoriaLogs"

    def tenant_headers(self, tenant: str | None) -> dict[str, str]:
        if not tenant:
            return {}
        account, _, project = tenant.partition(":")
        return {"AccountID": account, "ProjectID": project or "0"}

    @staticmethod
    def logsql(
        selector: LogSelector, start: datetime, end: datetime, limit: int, *, newest: bool
    ) -> str:
        query = f"_time:[{rfc3339(start)}, {rfc3339(end)}) ({selector.query})"
        if selector.contains is not None:
            query += f" {quote_literal(selector.contains)}"
        if not newest:
            query += f" | sort by (_time) | limit {limit}"
        return query

    async def fetch(
        self,
        selector: LogSelector,
        start: datetime,
        end: datetime,
        limit: int,
        *,
        newest: bool = False,
    ) -> list[LogLine]:
        form = {
            "query": self.logsql(selector, start, end, limit, newest=newest),
            "start": rfc3339(start),
            "end": rfc3339(end),
        }
        if newest:
            form["limit"] = str(limit)
        lines: list[LogLine] = []
        try:
            async with self._client.stream("POST", QUERY, data=form) as response:
                if response.status_code >= 400:
                    body = (await response.aread()).decode(errors="replace")
                    self._check_status(response.status_code, body)
                async for raw in response.aiter_lines():
                    if raw.strip():
                        lines.append(parse_entry(raw))
                    if len(lines) >= limit:
                        break  # closing the stream stops the query on the server
        except httpx.TransportError as exc:
            raise self._transport_error(exc) from exc
        lines.sort(key=lambda line: line.time)
        return lines
