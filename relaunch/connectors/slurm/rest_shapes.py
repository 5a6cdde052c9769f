"""What differs between slurmrestd's data parsers, kept here so that no caller sees it.

- Which parsers a server offers: its OpenAPI document (``GET /openapi/v3``, or ``/openapi``)
  lists ``/slurm/<version>/...`` paths. Slurm 22.05 (``-s openapi/v0.0.38``) offers v0.0.38;
  24.11 (``-s openapi/slurmctld``) offers v0.0.40, v0.0.41 and v0.0.42.
- Reads: ``GET /jobs``, ``/job/{id}``, ``/nodes``, ``/node/{name}`` answer ``{"jobs": [...]}`` /
  ``{"nodes": [...]}`` on every version; the elements differ (22.05: a state word, numbers and
  times as plain ints, the exit code as a wait status; v0.0.40+: state lists, numbers as
  ``{"set", "infinite", "number"}``, the exit code as ``{"status", "return_code", "signal"}``),
  and ``relaunch.connectors.slurm.parse`` reads both.
- Errors: 22.05 numbers them ``errno``, v0.0.40+ ``error_number``. An unknown job is error 2017
  on both (HTTP 500 on 22.05, 404 on 24.11); an unknown node is 2018 on 22.05, and on 24.11 an
  empty ``nodes`` list with a "Failure to query node" error numbered 0 (HTTP 200).
- A refused JWT (bad signature, expired, unknown user): 22.05 answers HTTP 500 with only
  ``{"error": "Unspecified error", "errno": -1}`` (SLURM_ERROR); 24.11 answers HTTP 511 with
  error 1007 (SLURM_PROTOCOL_AUTHENTICATION_ERROR, "Protocol authentication error"). Both serve
  the OpenAPI document whatever the token.
- Job updates: ``POST /job/{id}`` takes ``{"hold": true}`` on every version (22.05's
  ``job_properties``, v0.0.40+'s ``job_desc_msg``); v0.0.40+ answers a ``results`` list whose
  entries carry their own ``error_code``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from relaunch.models.endpoints import SLURMREST_API_VERSIONS

AUTO = "auto"
# The error numbers of an answer that is slurmctld refusing the token (see above).
TOKEN_REFUSED = frozenset({-1, 1007})
SUPPORTED = SLURMREST_API_VERSIONS
# The paths Relaunch uses; a version counts as offered only when the server has them all.
_NEEDED = ("jobs", "job/{job_id}", "nodes", "node/{node_name}")
_PATH = re.compile(r"/slurm/(v\d+\.\d+\.\d+)/(.+?)/?")


def version_key(version: str) -> tuple[int, ...]:
    """``v0.0.42`` → ``(0, 0, 42)``, for ordering."""
    return tuple(int(part) for part in version.removeprefix("v").split("."))


def offered_versions(document: dict[str, Any]) -> list[str]:
    """The data parsers an OpenAPI document serves every needed path of, oldest first."""
    paths = document.get("paths")
    if not isinstance(paths, dict):
        return []
    found: dict[str, set[str]] = {}
    for path in paths:
        m = _PATH.fullmatch(str(path))
        if m:
            found.setdefault(m.group(1), set()).add(m.group(2))
    usable = [v for v, have in found.items() if all(need in have for need in _NEEDED)]
    return sorted(usable, key=version_key)


def newest_supported(offered: Iterable[str]) -> str | None:
    """The newest version both the server and Relaunch support, or None."""
    common = [v for v in offered if v in SUPPORTED]
    return max(common, key=version_key) if common else None


def error_number(error: dict[str, Any]) -> Any:
    """An entry of ``errors``: 22.05 says ``errno``; v0.0.40+ ``error_number``."""
    return error.get("errno", error.get("error_number", error.get("error_code")))


def update_failures(data: dict[str, Any]) -> list[str]:
    """What a job update or signal answer reports as failed: its ``errors`` (22.05 answers a
    rejected key with 200 and an error) and, on v0.0.40+, each result with an ``error_code``."""
    texts = [
        str(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e)
        for e in data.get("errors") or []
    ]
    results = data.get("results")
    for result in results if isinstance(results, list) else []:
        if isinstance(result, dict) and result.get("error_code") not in (None, 0):
            texts.append(str(result.get("why") or result.get("error") or result))
    return texts
