"""Stand-ins for Grafana Loki and VictoriaLogs that speak their documented HTTP query APIs.

Neither store has an installable build here, so these implement, on a real socket, what
Relaunch's connectors use:

- Loki ``GET /loki/api/v1/query_range``: a LogQL stream selector (``=``, ``!=``, ``=~``, ``!~``;
  regexes fully anchored) and line filters (``|=``, ``!=``, ``|~``, ``!~``); ``start``
  inclusive and ``end`` exclusive in nanoseconds (or RFC 3339); ``limit`` (default 100, at most
  ``max_entries``); ``direction`` (default backward); the ``streams`` answer; a plain-text 400
  on a bad query; ``X-Scope-OrgID`` when multi-tenant (401 ``no org id`` without it).
- VictoriaLogs ``/select/logsql/query`` (GET or form POST): ``_time:[a, b]`` / ``[a, b)``
  filters, ``{k="v"}`` stream filters, ``field:="v"`` exact, ``field:"phrase"`` and
  ``"phrase"`` / word filters, ``( )`` grouping, the ``sort by (_time)`` and ``limit N`` pipes;
  ``limit`` / ``start`` / ``end`` arguments (``limit=N``: the N most recent); JSON Lines out;
  ``AccountID`` / ``ProjectID`` tenant headers.

Both can sit behind an auth gateway (basic or bearer: 401 otherwise) and can be told to fail
the next requests with a given status.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class QueryParseError(Exception):
    pass


def rfc3339_ns(text: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time (fraction up to 9 digits)."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", text)
    if not m:
        raise ValueError(f"cannot parse time {text!r}")
    base = datetime.fromisoformat(m.group(1) + (m.group(3).replace("Z", "+00:00")))
    return int(base.timestamp()) * 1_000_000_000 + int((m.group(2) or "0").ljust(9, "0"))


def ns_rfc3339(ns: int) -> str:
    secs, frac = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{frac:09d}Z" if frac else f"{stamp}Z"


class _Scanner:
    """A cursor over a query string with the string-literal rules both languages share."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def col(self) -> int:
        return self.pos + 1

    def ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def at_end(self) -> bool:
        self.ws()
        return self.pos >= len(self.text)

    def peek(self, token: str) -> bool:
        self.ws()
        return self.text.startswith(token, self.pos)

    def take(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.take(token):
            raise QueryParseError(f"col {self.col()}: expecting {token!r}")

    def ident(self) -> str:
        self.ws()
        m = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*").match(self.text, self.pos)
        if not m:
            raise QueryParseError(f"col {self.col()}: expecting a name")
        self.pos = m.end()
        return m.group(0)

    def string(self, quotes: str = '"`') -> str:
        self.ws()
        quote = self.text[self.pos : self.pos + 1]
        if not quote or quote not in quotes:
            raise QueryParseError(f"col {self.col()}: expecting STRING")
        if quote == "`":
            end = self.text.find("`", self.pos + 1)
            if end < 0:
                raise QueryParseError(f"col {self.col()}: unterminated raw string")
            value, self.pos = self.text[self.pos + 1 : end], end + 1
            return value
        j = self.pos + 1
        while j < len(self.text) and self.text[j] != quote:
            j += 2 if self.text[j] == "\\" else 1
        if j >= len(self.text):
            raise QueryParseError(f"col {self.col()}: unterminated string")
        body = self.text[self.pos + 1 : j]
        if quote == "'":
            body = body.replace('"', '\\"').replace("\\'", "'")
        try:
            value = json.loads(f'"{body}"')  # Go's escapes, as far as JSON shares them
        except json.JSONDecodeError as exc:
            raise QueryParseError(f"col {self.col()}: invalid string escape") from exc
        self.pos = j + 1
        return str(value)


# ---------------------------------------------------------------------------- LogQL (Loki)

Matcher = tuple[str, str, str]


def _match(op: str, actual: str, wanted: str) -> bool:
    if op == "=":
        return actual == wanted
    if op == "!=":
        return actual != wanted
    found = re.fullmatch(wanted, actual) is not None
    return found if op == "=~" else not found


def parse_logql(query: str) -> tuple[list[Matcher], list[tuple[str, str]]]:
    """``{k="v", ...} |= "x" ...`` → (label matchers, line filters)."""
    s = _Scanner(query)
    s.expect("{")
    matchers: list[Matcher] = []
    while not s.take("}"):
        if matchers:
            s.expect(",")
        name = s.ident()
        for op in ("=~", "!~", "!=", "="):
            if s.take(op):
                break
        else:
            raise QueryParseError(f"col {s.col()}: syntax error: unexpected, expecting = or =~")
        value = s.string()
        if op in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise QueryParseError(f"col {s.col()}: invalid regex {value!r}") from exc
        matchers.append((name, op, value))
    if not any(op in ("=", "=~") and not _match(op, "", v) for _, op, v in matchers):
        raise QueryParseError(
            "queries require at least one regexp or equality matcher that does not have an "
            'empty-compatible value. For instance, app=~".*" does not meet this requirement, '
            'but app=~".+" will'
        )
    filters: list[tuple[str, str]] = []
    while not s.at_end():
        for op in ("|=", "!=", "|~", "!~"):
            if s.take(op):
                break
        else:
            raise QueryParseError(f"col {s.col()}: syntax error: unexpected {s.text[s.pos]!r}")
        filters.append((op, s.string()))
    return matchers, filters


def _line_ok(line: str, filters: list[tuple[str, str]]) -> bool:
    for op, arg in filters:
        if op == "|=" and arg not in line:
            return False
        if op == "!=" and arg in line:
            return False
        if op == "|~" and not re.search(arg, line):
            return False
        if op == "!~" and re.search(arg, line):
            return False
    return True


# ------------------------------------------------------------------------ shared HTTP frame


@dataclass
class Recorded:
    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]


@dataclass
class _Server:
    url: str = ""
    basic: tuple[str, str] | None = None
    token: str | None = None
    fail_next: list[int] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def authorized(self, headers: dict[str, str]) -> bool:
        got = headers.get("authorization", "")
        if self.token is not None:
            return got == f"Bearer {self.token}"
        if self.basic is not None:
            creds = base64.b64encode(f"{self.basic[0]}:{self.basic[1]}".encode()).decode()
            return got == f"Basic {creds}"
        return True

    def handle(
        self, method: str, path: str, params: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, str, str]:
        raise NotImplementedError


class _Handler(BaseHTTPRequestHandler):
    server_version = "standin"
    store: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        if method == "POST":
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size).decode()
            params.update({k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()})
        headers = {k.lower(): v for k, v in self.headers.items()}
        store = self.store
        with store.lock:
            store.requests.append(Recorded(method, url.path, params, headers))
            failing = store.fail_next.pop(0) if store.fail_next else None
        if failing is not None:
            status, ctype, text = failing, "text/plain", f"injected failure {failing}\n"
        elif not store.authorized(headers):
            status, ctype, text = 401, "text/plain", "Unauthorized\n"
        else:
            status, ctype, text = store.handle(method, url.path, params, headers)
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")


class _Running:
    def __init__(self, store: _Server) -> None:
        handler = type("Handler", (_Handler,), {"store": store})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------------- Loki


@dataclass
class LokiStandIn(_Server):
    """Loki's query_range over pushed streams; ``multi_tenant`` requires X-Scope-OrgID."""

    multi_tenant: bool = False
    max_entries: int = 5000
    streams: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[int, str]]]] = field(
        default_factory=dict
    )

    def push(
        self, labels: dict[str, str], entries: list[tuple[int, str]], tenant: str = "fake"
    ) -> None:
        key = tuple(sorted(labels.items()))
        with self.lock:
            self.streams.setdefault(tenant, {}).setdefault(key, []).extend(entries)

    @staticmethod
    def _time(text: str) -> int:
        return int(text) if re.fullmatch(r"-?\d+", text) else rfc3339_ns(text)

    def handle(
        self, method: str, path: str, params: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, str, str]:
        if path != "/loki/api/v1/query_range":
            return 404, "text/plain", "404 page not found\n"
        tenant = headers.get("x-scope-orgid", "")
        if self.multi_tenant and not tenant:
            return 401, "text/plain", "no org id\n"
        tenant = tenant if self.multi_tenant else "fake"
        try:
            limit = int(params.get("limit", "100"))
            start, end = self._time(params["start"]), self._time(params["end"])
        except (KeyError, ValueError) as exc:
            return 400, "text/plain", f"invalid parameter: {exc}\n"
        direction = params.get("direction", "backward")
        if direction not in ("forward", "backward"):
            return 400, "text/plain", f"invalid direction {direction!r}\n"
        if limit > self.max_entries:
            return (
                400,
                "text/plain",
                (
                    "max entries limit per query exceeded, limit > max_entries_limit_per_query "
                    f"({limit} > {self.max_entries})\n"
                ),
            )
        if end <= start:
            return 400, "text/plain", "end timestamp must not be before or equal to start time\n"
        try:
            matchers, filters = parse_logql(params.get("query", ""))
        except QueryParseError as exc:
            return 400, "text/plain", f"parse error at line 1, {exc}\n"
        found: list[tuple[int, int, tuple[tuple[str, str], ...], str]] = []
        with self.lock:
            for order, (key, entries) in enumerate(self.streams.get(tenant, {}).items()):
                labels = dict(key)
                if not all(_match(op, labels.get(n, ""), v) for n, op, v in matchers):
                    continue
                for ts, line in entries:
                    if start <= ts < end and _line_ok(line, filters):
                        found.append((ts, order, key, line))
        found.sort(key=lambda e: (e[0], e[1]), reverse=direction == "backward")
        found = found[:limit]
        by_stream: dict[tuple[tuple[str, str], ...], list[list[str]]] = {}
        for ts, _, key, line in found:
            by_stream.setdefault(key, []).append([str(ts), line])
        result = [{"stream": dict(k), "values": v} for k, v in by_stream.items()]
        body = {
            "status": "success",
            "data": {"resultType": "streams", "result": result, "stats": {}},
        }
        return 200, "application/json", json.dumps(body)


# --------------------------------------------------------------------------- VictoriaLogs

Pred = Any  # a callable(entry) -> bool


def _has_phrase(text: str, phrase: str) -> bool:
    """LogsQL phrase filter: the phrase at word boundaries."""
    if phrase == "":
        return text == ""
    for m in re.finditer(re.escape(phrase), text):
        before = text[m.start() - 1] if m.start() else " "
        after = text[m.end()] if m.end() < len(text) else " "
        left_ok = not (before.isalnum() or before == "_") or not (
            phrase[0].isalnum() or phrase[0] == "_"
        )
        right_ok = not (after.isalnum() or after == "_") or not (
            phrase[-1].isalnum() or phrase[-1] == "_"
        )
        if left_ok and right_ok:
            return True
    return False


def _parse_time_range(s: _Scanner) -> Pred:
    opening = "[" if s.take("[") else "(" if s.take("(") else None
    if opening is None:
        raise QueryParseError(f"col {s.col()}: _time filter must be a [start, end] range here")
    m = re.compile(r"\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])").match(s.text, s.pos)
    if not m:
        raise QueryParseError(f"col {s.col()}: cannot parse _time range")
    s.pos = m.end()
    try:
        lo, hi = rfc3339_ns(m.group(1)), rfc3339_ns(m.group(2))
    except ValueError as exc:
        raise QueryParseError(str(exc)) from exc
    closing = m.group(3)

    def pred(e: dict[str, Any]) -> bool:
        t = e["_time_ns"]
        return (t >= lo if opening == "[" else t > lo) and (t <= hi if closing == "]" else t < hi)

    return pred


def _parse_filters(s: _Scanner, closing: str | None) -> list[Pred]:
    preds: list[Pred] = []
    while True:
        if closing is not None and s.take(closing):
            return preds
        if s.at_end() or s.peek("|"):
            if closing is not None:
                raise QueryParseError(f"col {s.col()}: missing {closing!r}")
            return preds
        if s.take("("):
            inner = _parse_filters(s, ")")
            preds.append(lambda e, inner=inner: all(p(e) for p in inner))
        elif s.take("{"):
            matchers: list[Matcher] = []
            while not s.take("}"):
                if matchers:
                    s.expect(",")
                name = s.ident()
                for op in ("=~", "!~", "!=", "="):
                    if s.take(op):
                        break
                else:
                    raise QueryParseError(f"col {s.col()}: expecting = in stream filter")
                matchers.append((name, op, s.string("\"'`")))
            preds.append(
                lambda e, ms=matchers: all(
                    _match(op, e["_stream_fields"].get(n, ""), v) for n, op, v in ms
                )
            )
        elif s.peek('"') or s.peek("'") or s.peek("`"):
            phrase = s.string("\"'`")
            preds.append(lambda e, p=phrase: _has_phrase(str(e.get("_msg", "")), p))
        else:
            name = s.ident()
            if name.lower() in ("or", "not", "and"):
                raise QueryParseError(f"col {s.col()}: {name} is not supported by this stand-in")
            if not s.take(":"):
                preds.append(lambda e, w=name: _has_phrase(str(e.get("_msg", "")), w))
                continue
            if name == "_time":
                preds.append(_parse_time_range(s))
            elif s.take("="):
                value = s.string("\"'`")
                preds.append(lambda e, n=name, v=value: str(e.get(n, "")) == v)
            else:
                value = s.string("\"'`")
                preds.append(lambda e, n=name, v=value: _has_phrase(str(e.get(n, "")), v))


def parse_logsql(query: str) -> tuple[list[Pred], bool, int | None]:
    """Filters, whether the ``sort by (_time)`` pipe is there, and the ``limit`` pipe's N."""
    s = _Scanner(query)
    preds = _parse_filters(s, None)
    if not preds:
        raise QueryParseError("missing filter")
    sort, limit = False, None
    while s.take("|"):
        if s.take("sort"):
            s.expect("by")
            s.expect("(")
            if s.ident() != "_time":
                raise QueryParseError("this stand-in sorts by _time only")
            s.expect(")")
            sort = True
        elif s.take("limit"):
            m = re.compile(r"\s*(\d+)").match(s.text, s.pos)
            if not m:
                raise QueryParseError(f"col {s.col()}: limit needs a number")
            s.pos, limit = m.end(), int(m.group(1))
        else:
            raise QueryParseError(f"col {s.col()}: unsupported pipe")
    if not s.at_end():
        raise QueryParseError(f"col {s.col()}: unexpected {s.text[s.pos :]!r}")
    return preds, sort, limit


@dataclass
class VictoriaLogsStandIn(_Server):
    """VictoriaLogs' /select/logsql/query over ingested entries, per (AccountID, ProjectID)."""

    entries: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)

    def ingest(
        self,
        stream: dict[str, str],
        entries: list[tuple[int, str]],
        *,
        fields: dict[str, str] | None = None,
        tenant: tuple[str, str] = ("0", "0"),
    ) -> None:
        stream_text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(stream.items())) + "}"
        with self.lock:
            bucket = self.entries.setdefault(tenant, [])
            for ts, msg in entries:
                bucket.append(
                    {
                        "_msg": msg,
                        "_time_ns": ts,
                        "_stream": stream_text,
                        "_stream_fields": dict(stream),
                        **stream,
                        **(fields or {}),
                    }
                )

    @staticmethod
    def _time(text: str) -> int:
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return int(float(text) * 1_000_000_000)
        return rfc3339_ns(text)

    def handle(
        self, method: str, path: str, params: dict[str, str], headers: dict[str, str]
    ) -> tuple[int, str, str]:
        if path != "/select/logsql/query":
            return 404, "text/plain", "unsupported path requested\n"
        tenant = (headers.get("accountid", "0"), headers.get("projectid", "0"))
        query = params.get("query", "")
        try:
            preds, sort, pipe_limit = parse_logsql(query)
            start = self._time(params["start"]) if "start" in params else None
            end = self._time(params["end"]) if "end" in params else None
            limit = int(params["limit"]) if params.get("limit") else None
        except (QueryParseError, ValueError) as exc:
            return 400, "text/plain", f"cannot parse query [{query}]: {exc}\n"
        with self.lock:
            found = [
                e
                for e in self.entries.get(tenant, [])
                if (start is None or e["_time_ns"] >= start)
                and (end is None or e["_time_ns"] <= end)
                and all(p(e) for p in preds)
            ]
        if sort:
            found.sort(key=lambda e: e["_time_ns"])
        if pipe_limit is not None:
            found = found[:pipe_limit]
        if limit is not None:
            # the N most recent, newest first (the client must not rely on the order)
            found = sorted(found, key=lambda e: e["_time_ns"], reverse=True)[:limit]
        out = []
        for e in found:
            row = {k: v for k, v in e.items() if k not in ("_time_ns", "_stream_fields")}
            row["_time"] = ns_rfc3339(e["_time_ns"])
            out.append(json.dumps(row, sort_keys=True) + "\n")
        return 200, "application/stream+json", "".join(out)


def serve(store: _Server) -> Iterator[str]:
    """Run ``store`` on a free local port for the duration of a ``with``/fixture; yields its URL."""
    running = _Running(store)
    store.url = running.url
    try:
        yield running.url
    finally:
        running.stop()
