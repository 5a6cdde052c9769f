"""The scorecard: every recommendation Relaunch made, what operators did with it, and whether
the action taken proved right (the rules are in relaunch/models/rollout.py and docs/autonomy.md).

It is read from the audit trail alone, in one query over the window's rows (only the fields it
judges by are taken out of each row's data), and judged in memory: its cost grows with the
window's rows, not with how often it is asked."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import dict_row

from relaunch.connectors.audit import AuditStore
from relaunch.models.config import ClusterConfig
from relaunch.models.lifecycle import parse_lifecycle_id
from relaunch.models.node_decision import parse_node_decision_id
from relaunch.models.recovery import Category, Mode, Policy, parse_recovery_id
from relaunch.models.rollout import (
    ActionKind,
    Judged,
    Outcome,
    Precision,
    Recommendation,
    Response,
    RolloutSettings,
    ScopeCard,
    ScopeKind,
    Scorecard,
    Suggestion,
    Tally,
)
from relaunch.rollout.policy import effective_policy, mode_changes

# The fields each kind of row is judged by (a plan's evidence and history stay in the trail).
_ROWS = """
    select e.incident_id, i.job_id, e.kind, e.at, e.actor, e.stage, e.nodes,
        case when e.kind = 'plan' then e.data->>'mode' end as mode,
        case when e.kind = 'plan' then e.data->>'action' end as action,
        case when e.kind in ('plan', 'verdict') then e.data->>'category' end as category,
        case e.kind
            when 'plan' then coalesce(e.data->'node_plan'->>'partition',
                                      e.data->>'guard_partition')
            when 'evidence' then e.data->'job'->>'partition' end as partition,
        case when e.kind = 'plan' and jsonb_typeof(e.data->'report'->'running') = 'array'
            then array(select r->>'job_id'
                       from jsonb_array_elements(e.data->'report'->'running') r) end as running,
        case e.kind
            when 'action' then e.data->>'step'
            when 'checks' then e.data->>'purpose'
            when 'node_decision' then e.data->>'requeue_by'
            when 'external_drain' then e.data->>'reason' end as what,
        case e.kind
            when 'action' then e.data->>'target'
            -- the resubmission Relaunch recorded of its own sbatch (never a job's comment)
            when 'lineage' then e.data->>'child' end as target,
        case e.kind
            when 'action' then coalesce((e.data->>'changed')::boolean, false)
            when 'checks' then coalesce((e.data->>'passed')::boolean, false) end as flag
    from audit_events e join incidents i on i.id = e.incident_id
    where i.cluster = %(cluster)s and e.at >= %(since)s and e.kind = any(%(kinds)s)
        and (e.kind <> 'stage' or e.stage in ('awaiting_approval', 'rejected', 'expired'))
        and (e.kind <> 'node_stage' or e.stage = 'escalated')
    order by e.id
"""
_KINDS = [
    "plan",
    "evidence",
    "verdict",
    "action",
    "stage",
    "approval",
    "rejection",
    "checks",
    "node_stage",
    "node_decision",
    "external_drain",
    "verify",
    "lineage",
]
# The scorecard lists this many of the newest recommendations and judged actions (its counts
# cover every one in the window).
LISTED = 1000
_RESTART_ACTIONS = {"restart", "exclude_and_restart", "isolate_and_restart"}
Row = dict[str, Any]


@dataclass
class _Incident:
    id: str
    job_id: str
    created: datetime
    rows: list[Row] = field(default_factory=list)
    _by_kind: dict[str, list[Row]] | None = None

    def of(self, kind: str) -> list[Row]:
        if self._by_kind is None:
            self._by_kind = defaultdict(list)
            for row in self.rows:
                self._by_kind[row["kind"]].append(row)
        return self._by_kind.get(kind, [])

    def first(self, kind: str) -> Row | None:
        rows = self.of(kind)
        return rows[0] if rows else None

    def stages(self) -> set[str]:
        return {r["stage"] for r in self.of("stage") if r["stage"]}

    @property
    def category(self) -> str:
        for row in (self.first("plan"), self.first("verdict")):
            if row and row["category"]:
                return str(row["category"])
        return Category.UNKNOWN.value

    @property
    def partition(self) -> str:
        for row in (self.first("plan"), self.first("evidence")):
            if row and row["partition"]:
                return str(row["partition"])
        return ""


class _Trail:
    """The window's rows by incident, with the lookups the judging needs."""

    def __init__(self, rows: Iterable[Row]) -> None:
        self.incidents: dict[str, _Incident] = {}
        self.external_drains: list[Row] = []
        for row in rows:
            inc = self.incidents.get(row["incident_id"])
            if inc is None:
                inc = self.incidents[row["incident_id"]] = _Incident(
                    row["incident_id"], row["job_id"], row["at"]
                )
            inc.rows.append(row)
            if row["kind"] == "external_drain":
                self.external_drains.append(row)
        self.recoveries: set[str] = set()
        self.decisions: set[str] = set()
        self.by_job: dict[str, list[_Incident]] = defaultdict(list)
        self.lifecycles: dict[str, list[_Incident]] = defaultdict(list)
        for inc in self.incidents.values():
            # Which workflow an incident is, read from its id once (the names are documented).
            if "-node-" in inc.id and parse_node_decision_id(inc.id):
                self.decisions.add(inc.id)
            elif "-lifecycle-" in inc.id and (parsed := parse_lifecycle_id(inc.id)):
                self.lifecycles[parsed[1]].append(inc)
            elif parse_recovery_id(inc.id):
                self.recoveries.add(inc.id)
                self.by_job[inc.job_id].append(inc)

        for incs in self.by_job.values():
            incs.sort(key=lambda i: i.created)
        self._created = {job: [i.created for i in incs] for job, incs in self.by_job.items()}

    def later_of_job(self, job: str, after: datetime, until: datetime) -> list[_Incident]:
        """The job's incidents that began in (after, until], by time."""
        times = self._created.get(job)
        if not times:
            return []
        lo, hi = bisect_right(times, after), bisect_right(times, until)
        return self.by_job[job][lo:hi]


def _mode(value: object) -> Mode:
    """A plan's mode; anything but ``autonomous`` (a row from another version) reads as monitor:
    an unreadable row never makes Relaunch look more trusted than it was."""
    return Mode.AUTONOMOUS if value == Mode.AUTONOMOUS.value else Mode.MONITOR


def _action_kind(decision: bool, plan: Row) -> ActionKind:
    action = str(plan["action"] or "none")
    if plan["nodes"] or decision:
        return ActionKind.DRAIN
    if action in _RESTART_ACTIONS:
        return ActionKind.RESTART
    if action == "hold":
        return ActionKind.HOLD
    return ActionKind.NONE


def _response(inc: _Incident, mode: Mode) -> tuple[Response, str]:
    stages = inc.stages()
    if inc.first("approval"):
        return Response.APPROVED, f"approved by {inc.first('approval')['actor']}"  # type: ignore[index]
    if inc.first("rejection") or "rejected" in stages:
        row = inc.first("rejection")
        return Response.REJECTED, f"rejected by {row['actor']}" if row else "rejected"
    if "expired" in stages:
        return Response.EXPIRED, "no decision before the approval expired"
    if "awaiting_approval" in stages:
        return Response.PENDING, "awaiting approval"
    if mode is Mode.AUTONOMOUS:
        return Response.AUTONOMOUS, "acted alone"
    return Response.NOT_ASKED, "nothing needed approval"


class _Judge:
    def __init__(self, trail: _Trail, settings: RolloutSettings, now: datetime) -> None:
        self.trail, self.settings, self.now = trail, settings, now
        self.window = timedelta(seconds=settings.restart_ok_after_s)

    def drain(self, node: str, at: datetime) -> tuple[Outcome, str]:
        """A drain: by the node's first lifecycle after it (its diagnosis), else pending."""
        for life in sorted(self.trail.lifecycles.get(node, []), key=lambda i: i.created):
            if life.created < at - timedelta(seconds=5):
                continue
            for row in life.rows:
                if row["kind"] == "checks" and row["what"] == "diagnose":
                    if row["flag"]:
                        return Outcome.WRONG, f"{life.id}: {node} passed its diagnosis"
                    return Outcome.RIGHT, f"{life.id}: {node} failed its diagnosis"
                if row["kind"] == "node_stage" and row["stage"] == "escalated":
                    return Outcome.RIGHT, f"{life.id}: {node} sent to repair"
            return Outcome.PENDING, f"{life.id}: not diagnosed yet"
        return Outcome.PENDING, f"no lifecycle of {node} has judged it"

    def restart(self, inc: _Incident, category: str, at: datetime) -> tuple[Outcome, str]:
        """A restart: wrong when the job failed the same way within the window; right once it
        was seen running again (the recovery's verification) and ran the window out."""
        # The job, and the resubmission this recovery recorded submitting (its lineage row).
        jobs = [inc.job_id, *(str(r["target"]) for r in inc.of("lineage") if r["target"])]
        for job in jobs:
            for later in self.trail.later_of_job(job, at, at + self.window):
                if later.category == category:
                    return Outcome.WRONG, f"{later.id}: {category} again"
        ran = next((r["at"] for r in inc.of("verify") if r["at"] >= at), None)
        if ran is None:
            return Outcome.PENDING, "not seen running again yet"
        if self.now - ran >= self.window:
            return Outcome.RIGHT, f"ran {self.window.total_seconds():g}s without {category}"
        return Outcome.PENDING, "running; the window has not passed"

    def hold(self, job: str, category: str, at: datetime) -> tuple[Outcome, str]:
        """A hold: right when the job was then cancelled or failed the same way again."""
        for later in self.trail.later_of_job(job, at, at + self.window):
            if later.category in (category, Category.USER_CANCEL.value):
                return Outcome.RIGHT, f"{later.id}: {later.category}"
        if self.now - at >= self.window:
            return Outcome.WRONG, "no cancel and no same failure within the window"
        return Outcome.PENDING, "the window has not passed"


def _combine(outcomes: list[Outcome]) -> Outcome:
    if not outcomes:
        return Outcome.PENDING
    if Outcome.WRONG in outcomes:
        return Outcome.WRONG
    if Outcome.PENDING in outcomes:
        return Outcome.PENDING
    return Outcome.RIGHT


def _acted_differently(
    trail: _Trail, inc: _Incident, nodes: list[str], jobs: list[str], judge: _Judge
) -> str | None:
    """What operators did instead of the recommendation: a drain of its nodes (or its jobs'
    nodes) by someone else, or its job cancelled."""
    start = inc.created
    until = start + judge.window
    for row in trail.external_drains:
        if start <= row["at"] <= until and set(row["nodes"]) & set(nodes):
            return f"{','.join(row['nodes'])} drained by someone else ({row['what']})"
    for job in jobs:
        for later in trail.later_of_job(job, start, until):
            if later.category == Category.USER_CANCEL.value:
                return f"job {job} cancelled ({later.id})"
    return None


def _recommendations(
    trail: _Trail, judge: _Judge, since: datetime
) -> tuple[list[Recommendation], list[Judged]]:
    recs: list[Recommendation] = []
    judged: list[Judged] = []
    for inc in trail.incidents.values():
        plan = inc.first("plan")
        if plan is None or plan["at"] < since:
            continue
        mode = _mode(plan["mode"])
        kind = _action_kind(inc.id in trail.decisions, plan)
        category, partition = inc.category, inc.partition
        jobs = [str(j) for j in plan["running"] or [] if j] or ([inc.job_id] if inc.job_id else [])
        nodes = [str(n) for n in plan["nodes"]]
        response, why = _response(inc, mode)
        if response in (Response.REJECTED, Response.EXPIRED, Response.PENDING):
            # The nodes it concerned: those it would drain, the job's, the verdict's.
            seen = {
                n
                for r in (plan, inc.first("evidence"), inc.first("verdict"))
                if r
                for n in r["nodes"]
            }
            other = _acted_differently(trail, inc, sorted(seen), jobs, judge)
            if other:
                response, why = Response.ACTED_DIFFERENTLY, other
        # The actions carried out under this plan, each judged.
        outcomes: list[Outcome] = []
        for row in inc.of("action"):
            step, target = row["what"], str(row["target"] or "")
            if not row["flag"]:
                continue
            if step == "drain":
                outcome, how = judge.drain(target, row["at"])
                act = ActionKind.DRAIN
            elif step == "restart" and inc.id in trail.recoveries:
                outcome, how = judge.restart(inc, category, row["at"])
                act = ActionKind.RESTART
            elif step == "hold":
                outcome, how = judge.hold(inc.job_id, category, row["at"])
                act = ActionKind.HOLD
            else:
                continue
            outcomes.append(outcome)
            judged.append(
                Judged.model_construct(
                    incident_id=inc.id,
                    at=row["at"],
                    action=act,
                    target=target or inc.job_id,
                    category=category,
                    partition=partition,
                    mode=mode,
                    outcome=outcome,
                    why=how,
                )
            )
        acted = response in (Response.APPROVED, Response.AUTONOMOUS, Response.NOT_ASKED)
        outcome = _combine(outcomes) if acted and kind is not ActionKind.NONE else Outcome.NONE
        if acted and kind is not ActionKind.NONE and not outcomes:
            outcome = Outcome.PENDING
        recs.append(
            Recommendation.model_construct(
                incident_id=inc.id,
                at=plan["at"],
                category=category,
                partition=partition,
                action=kind,
                mode=mode,
                response=response,
                outcome=outcome,
                nodes=nodes,
                jobs=jobs,
                why=why,
            )
        )
    # Restarts a node decision made for joined recoveries (which have no plan of their own).
    for inc in trail.incidents.values():
        if inc.id not in trail.recoveries or inc.first("plan") is not None:
            continue
        joined = inc.first("node_decision")
        decision = trail.incidents.get(str(joined["what"])) if joined else None
        plan = decision.first("plan") if decision else None
        if plan is None or plan["at"] < since:
            continue
        mode = _mode(plan["mode"])
        for row in inc.of("action"):
            if row["what"] != "restart" or not row["flag"]:
                continue
            outcome, how = judge.restart(inc, inc.category, row["at"])
            judged.append(
                Judged.model_construct(
                    incident_id=inc.id,
                    at=row["at"],
                    action=ActionKind.RESTART,
                    target=inc.job_id,
                    category=inc.category,
                    partition=inc.partition,
                    mode=mode,
                    outcome=outcome,
                    why=how,
                )
            )
    recs.sort(key=lambda r: r.at)
    judged.sort(key=lambda j: j.at)
    return recs, judged


def _count(tally: Tally, rec: Recommendation) -> None:
    tally.recommended += 1
    setattr(tally, rec.response.value, getattr(tally, rec.response.value) + 1)
    if rec.response is Response.APPROVED and rec.outcome is Outcome.RIGHT:
        tally.approved_right += 1
    if rec.response is Response.APPROVED and rec.outcome is Outcome.WRONG:
        tally.approved_wrong += 1
    if rec.response is Response.AUTONOMOUS and rec.outcome is Outcome.WRONG:
        tally.autonomous_wrong += 1


def _precision(judged: Iterable[Judged], action: ActionKind) -> Precision:
    p = Precision()
    for j in judged:
        if j.action is not action:
            continue
        if j.outcome is Outcome.RIGHT:
            p.right += 1
        elif j.outcome is Outcome.WRONG:
            p.wrong += 1
        else:
            p.pending += 1
    return p


def _scope_mode(policy: Policy, scope: ScopeKind, name: str) -> Mode:
    """The mode a category or partition runs in everywhere (a category under a canary runs
    in monitor mode outside it)."""
    default = policy.mode if policy.canary_partition is None else Mode.MONITOR
    if scope is ScopeKind.CATEGORY:
        try:
            return policy.category_modes.get(Category(name), default)
        except ValueError:
            return default
    return policy.partition_modes.get(name, policy.default_mode_on(name))


def _cards(
    scope: ScopeKind, recs: list[Recommendation], judged: list[Judged], policy: Policy
) -> list[ScopeCard]:
    by_recs: dict[str, list[Recommendation]] = defaultdict(list)
    by_judged: dict[str, list[Judged]] = defaultdict(list)
    category = scope is ScopeKind.CATEGORY
    for rec in recs:
        by_recs[rec.category if category else rec.partition].append(rec)
    for j in judged:
        by_judged[j.category if category else j.partition].append(j)
    cards = []
    for name in sorted(by_recs.keys() | by_judged.keys()):
        tally = Tally()
        for rec in by_recs.get(name, []):
            _count(tally, rec)
        mine = by_judged.get(name, [])
        cards.append(
            ScopeCard(
                kind=scope,
                name=name,
                mode=_scope_mode(policy, scope, name),
                tally=tally,
                drains=_precision(mine, ActionKind.DRAIN),
                restarts=_precision(mine, ActionKind.RESTART),
                holds=_precision(mine, ActionKind.HOLD),
            )
        )
    return cards


def _suggestions(
    cards: list[ScopeCard],
    recs: list[Recommendation],
    judged: list[Judged],
    policy: Policy,
    settings: RolloutSettings,
) -> list[Suggestion]:
    out: list[Suggestion] = []
    for card in cards:
        t = card.tally
        share = t.approved_right_share
        if (
            card.mode is Mode.MONITOR
            and card.name
            and t.decided >= settings.promote_min_decisions
            and share is not None
            and share >= settings.promote_min_share
        ):
            out.append(
                Suggestion(
                    change="promote",
                    scope=card.kind,
                    name=card.name,
                    to=Mode.AUTONOMOUS,
                    why=f"{t.approved_right} of {t.decided} decisions approved and right "
                    f"({share:.0%} ≥ {settings.promote_min_share:.0%}, "
                    f"at least {settings.promote_min_decisions} decisions)",
                    incidents=[
                        r.incident_id
                        for r in recs
                        if r.response is Response.APPROVED
                        and card.name in (r.category, r.partition)
                    ][-20:],
                )
            )
    # A wrong autonomous action: demote what made it autonomous (its category's own mode, else
    # its partition's, else the canary partition it ran on, else the category against the
    # default), while it still is.
    wrong: dict[tuple[ScopeKind, str], list[str]] = defaultdict(list)
    for j in judged:
        if j.mode is not Mode.AUTONOMOUS or j.outcome is not Outcome.WRONG:
            continue
        try:
            category: Category | None = Category(j.category)
        except ValueError:
            category = None
        if category is not None and policy.category_modes.get(category) is Mode.AUTONOMOUS:
            scope = (ScopeKind.CATEGORY, j.category)
        elif policy.partition_modes.get(j.partition) is Mode.AUTONOMOUS:
            scope = (ScopeKind.PARTITION, j.partition)
        elif j.partition in policy.partition_modes or category in policy.category_modes:
            continue  # demoted since
        elif policy.canary_partition == j.partition and policy.mode is Mode.AUTONOMOUS:
            scope = (ScopeKind.PARTITION, j.partition)
        elif policy.mode is Mode.AUTONOMOUS and category is not None:
            scope = (ScopeKind.CATEGORY, j.category)
        else:
            continue  # demoted since
        wrong[scope].append(f"{j.incident_id}: {j.action.value} {j.target}: {j.why}")
    for (kind, name), whys in wrong.items():
        out.append(
            Suggestion(
                change="demote",
                scope=kind,
                name=name,
                to=Mode.MONITOR,
                why=f"{len(whys)} wrong autonomous action(s): " + "; ".join(whys[:3]),
                incidents=sorted({w.split(":", 1)[0] for w in whys}),
            )
        )
    return out


async def load_scorecard(
    store: AuditStore,
    config: ClusterConfig,
    *,
    since: datetime | None = None,
    now: datetime | None = None,
) -> Scorecard:
    """The cluster's scorecard over the recommendations made since ``since`` (default: the
    configured window)."""
    settings = config.rollout
    now = now or datetime.now(UTC)
    since = since or now - timedelta(days=settings.window_days)
    async with store.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_ROWS, {"cluster": config.name, "since": since, "kinds": _KINDS})
        rows = await cur.fetchall()
    policy = effective_policy(config.policy, await mode_changes(store, config.name))
    trail = _Trail(rows)
    judge = _Judge(trail, settings, now)
    recs, judged = _recommendations(trail, judge, since)
    total = Tally()
    for rec in recs:
        _count(total, rec)
    categories = _cards(ScopeKind.CATEGORY, recs, judged, policy)
    partitions = _cards(ScopeKind.PARTITION, recs, judged, policy)
    return Scorecard(
        cluster=config.name,
        since=since,
        generated_at=now,
        settings=settings,
        total=total,
        drains=_precision(judged, ActionKind.DRAIN),
        restarts=_precision(judged, ActionKind.RESTART),
        holds=_precision(judged, ActionKind.HOLD),
        categories=categories,
        partitions=partitions,
        suggestions=_suggestions(categories + partitions, recs, judged, policy, settings),
        recommendations=recs[-LISTED:],
        judged=judged[-LISTED:],
    )
