"""Staged rollout: audited promotions and demotions of a category or a partition.

A mode change is one audit row (kind ``mode_change``) under the cluster's ``rollout-<cluster>``
record: who, when, why, and the mode from then on. The policy Relaunch plans with is the
configuration's, with the latest change of each category and partition laid over it
(:func:`effective_policy`); the canary partition, when set, still limits autonomy to itself.
The activities that plan read it fresh (cached for a few seconds), so a promotion takes effect
at the next plan, with no restart."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from relaunch.connectors.audit import AuditStore
from relaunch.models import names
from relaunch.models.errors import RelaunchError
from relaunch.models.recovery import AuditRecord, Category, Mode, Policy
from relaunch.models.rollout import ModeChange, ScopeKind, rollout_incident

MODE_CHANGE = "mode_change"
CACHE_S = 2.0


class BadScopeError(RelaunchError):
    """A mode change names no category or partition Relaunch knows, or no valid person."""


def scope_name(scope: ScopeKind, name: str) -> str:
    """``name`` checked for ``scope``: a category Relaunch attributes, or a partition name."""
    if scope is ScopeKind.CATEGORY:
        if name not in {c.value for c in Category}:
            raise BadScopeError(
                f"no category {name!r}",
                hint="one of " + ", ".join(c.value for c in Category),
            )
        return name
    return names.partition(name)


def actor_name(by: str) -> str:
    """``by``, checked: letters, digits and `` .@+-_``, at most 64 characters."""
    return names.person(by, "made the change", BadScopeError)


_SPAN_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
LONGEST_SINCE = timedelta(days=3650)


def parse_since(value: str, now: datetime) -> datetime | None:
    """A scorecard's ``since`` (the CLI's ``--since``, the page's and the API's ``?since=``):
    an ISO time (UTC unless it says otherwise) or a span back from ``now`` (``7d``, ``12h``,
    ``30m``), at most ten years back; None when empty. Raises ValueError with what is wrong."""
    value = value.strip()
    if not value:
        return None
    number, unit = value[:-1], value[-1:]
    if unit in _SPAN_UNITS and number.replace(".", "", 1).isdigit():
        seconds = float(number) * _SPAN_UNITS[unit]
        if seconds > LONGEST_SINCE.total_seconds():
            raise ValueError(f"since {value!r} reaches back more than {LONGEST_SINCE.days} days")
        return now - timedelta(seconds=seconds)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"since must be a time (2026-05-01T08:00) or a span back (7d, 12h, 30m), not {value!r}"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def mode_changes(store: AuditStore, cluster: str) -> list[ModeChange]:
    """Every mode change of the cluster, oldest first."""
    rows = await store.events(rollout_incident(cluster))
    changes = []
    for row in rows:
        if row.kind != MODE_CHANGE:
            continue
        data = row.data
        raw_mode = data.get("mode")
        changes.append(
            ModeChange(
                cluster=cluster,
                scope=ScopeKind(str(data["scope"])),
                name=str(data["name"]),
                mode=Mode(str(raw_mode)) if raw_mode else None,
                by=row.actor,
                reason=str(data.get("reason") or ""),
                at=row.at,
            )
        )
    return changes


async def change_mode(
    store: AuditStore,
    cluster: str,
    scope: ScopeKind,
    name: str,
    mode: Mode | None,
    *,
    by: str,
    reason: str = "",
) -> ModeChange:
    """Record a promotion (``autonomous``), a demotion (``monitor``) or a return to the
    configuration (``None``) of one category or partition."""
    name = scope_name(scope, name)
    by = actor_name(by)
    reason = "".join(ch for ch in reason.strip() if ch.isprintable())[:300]
    change = ModeChange(
        cluster=cluster,
        scope=scope,
        name=name,
        mode=mode,
        by=by,
        reason=reason,
        at=datetime.now(UTC),
    )
    incident = rollout_incident(cluster)
    await store.ensure_incident(incident, cluster, "", 0)
    what = mode.value if mode else "as configured"
    await store.record(
        AuditRecord(
            incident_id=incident,
            kind=MODE_CHANGE,
            at=change.at,
            actor=by,
            summary=f"{scope.value} {name} → {what} by {by}" + (f": {reason}" if reason else ""),
            data={
                "scope": scope.value,
                "name": name,
                "mode": mode.value if mode else None,
                "reason": reason,
            },
        )
    )
    return change


def effective_policy(policy: Policy, changes: Sequence[ModeChange]) -> Policy:
    """``policy`` with the latest change of each category and partition laid over it."""
    if not changes:
        return policy
    categories = dict(policy.category_modes)
    partitions = dict(policy.partition_modes)
    for change in changes:  # oldest first: the latest wins
        if change.scope is ScopeKind.CATEGORY:
            category = Category(change.name)
            categories.pop(category, None)
            mode = change.mode or policy.category_modes.get(category)
            if mode is not None:
                categories[category] = mode
        else:
            partitions.pop(change.name, None)
            mode = change.mode or policy.partition_modes.get(change.name)
            if mode is not None:
                partitions[change.name] = mode
    return policy.model_copy(update={"category_modes": categories, "partition_modes": partitions})


class PolicyCache:
    """The cluster's effective policy for the activities that plan: the configuration's with
    the mode changes over it, read at most every ``CACHE_S`` seconds. A database that does not
    answer leaves the last policy read (or the configuration's): a mode change is never
    guessed."""

    def __init__(self, store: AuditStore, cluster: str) -> None:
        self._store, self._cluster = store, cluster
        self._changes: list[ModeChange] = []
        self._read_at = float("-inf")

    async def apply(self, policy: Policy) -> Policy:
        now = time.monotonic()
        if now - self._read_at >= CACHE_S:
            try:
                self._changes = await mode_changes(self._store, self._cluster)
                self._read_at = now
            except RelaunchError:
                pass
        return effective_policy(policy, self._changes)
