"""The health-check catalogue and the remediation ladder: pure logic, no I/O.

The catalogue (``health_checks.json`` beside this module, plus the site's own checks from the
cluster configuration) says what a drained node must pass before it returns to service; the
lifecycle's activities run the checks and this module judges what they printed. The ladder says
which rungs to try, cheapest first, once the first checks fail. See docs/lifecycle.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path

from pydantic import BaseModel, Field

from relaunch.models.bundle import TelemetrySample
from relaunch.models.lifecycle import (
    OUTPUT_MAX,
    CheckKind,
    CheckResult,
    HealthCheck,
    LifecycleSettings,
    NodeJob,
    Rung,
    reservation_name,
)
from relaunch.models.recovery import Category
from relaunch.models.scheduler import JobState

CATALOGUE = Path(__file__).with_name("health_checks.json")
# What the wrapper prints (and exits 0 after) when a program a check requires is missing.
SKIP_MARK = "relaunch-check-skip: "
# What the wrapper prints just before and just after the check: the uid of every process on
# the node (the node's own process table, read by the step, which runs as root).
CENSUS_MARK = "relaunch-census:"
# Runs the check's command only where every program it requires is installed on the node,
# between two censuses of the node's processes, and exits with the command's status:
# ``sh -c WRAPPER sh <how many required> <required...> <argv...>``.
_WRAPPER = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do command -v "$1" >/dev/null 2>&1 || '
    '{ echo "' + SKIP_MARK + '$1 is not installed on ${SLURMD_NODENAME:-$(hostname)}"; exit 0; }; '
    "shift; n=$((n-1)); done; "
    'c() { echo "' + CENSUS_MARK + '" '
    "$(ps -e -o uid= 2>/dev/null | { sort -un 2>/dev/null || cat; }); }; "
    'c; "$@"; r=$?; c; exit $r'
)
# Not a person: the overflow uid and (uid_t)-1.
_NOT_USERS = frozenset({65534, 4294967295})


class Catalogue(BaseModel):
    about: str = ""
    checks: list[HealthCheck] = Field(default_factory=list)


@cache
def builtin_checks() -> tuple[HealthCheck, ...]:
    """The catalogue shipped with Relaunch."""
    data = json.loads(CATALOGUE.read_text())
    return tuple(Catalogue.model_validate(data).checks)


def checks_for(settings: LifecycleSettings, category: Category) -> list[HealthCheck]:
    """The checks to run on a node drained for ``category``: the catalogue's (less those the
    site turned off), then the site's own, each only where its categories allow."""
    checks = [c for c in builtin_checks() if c.id not in settings.skip_checks]
    seen = {c.id for c in checks}
    checks += [c for c in settings.checks if c.id not in seen]
    return [c for c in checks if not c.categories or category in c.categories]


def wrapped_argv(check: HealthCheck, node: str) -> list[str]:
    """The argv run on the node: the check's command behind the wrapper that skips it where a
    program it requires is missing. ``{node}`` in the command is the node's name."""
    argv = [a.replace("{node}", node) for a in check.argv]
    return ["sh", "-c", _WRAPPER, "sh", str(len(check.requires)), *check.requires, *argv]


def clip(text: str, limit: int = OUTPUT_MAX) -> str:
    """``text`` with its middle cut where it is longer than ``limit`` (head and tail kept)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return text[:half] + f"\n[... {len(text) - limit} characters cut ...]\n" + text[-half:]


def split_census(output: str, uid_min: int, ignore: Collection[int] = ()) -> tuple[str, list[int]]:
    """The check's output without the wrapper's census lines, and the uids from ``uid_min`` up
    (but ``ignore``, service accounts) that the censuses saw. Every census line counts: a line
    the check's own output forges can only add users (an inconclusive run), never hide one."""
    kept: list[str] = []
    users: set[int] = set()
    for line in output.splitlines(keepends=True):
        if not line.startswith(CENSUS_MARK):
            kept.append(line)
            continue
        for word in line[len(CENSUS_MARK) :].split()[:100_000]:
            if word.isascii() and word.isdigit() and len(word) <= 10:
                uid = int(word)
                if uid >= uid_min and uid not in _NOT_USERS and uid not in ignore:
                    users.add(uid)
    return "".join(kept), sorted(users)


def judge(
    check: HealthCheck,
    exit_code: int | None,
    output: str,
    *,
    seconds: float = 0.0,
    timed_out: bool = False,
    uid_min: int = 1000,
    ignore_uids: Collection[int] = (),
) -> CheckResult:
    """Whether a command check passed, from its exit code and output (the wrapper's census
    lines taken out, and the users they saw kept in ``users``)."""
    output, users = split_census(output, uid_min, ignore_uids)
    kept = clip(output)
    first = next((ln for ln in output.splitlines() if ln.startswith(SKIP_MARK)), None)
    if first is not None and exit_code == 0:
        return CheckResult(
            id=check.id,
            passed=False,
            skipped=True,
            detail="skipped: " + first[len(SKIP_MARK) :][:200],
            exit_code=exit_code,
            output=kept,
            seconds=seconds,
            users=users,
        )

    def result(passed: bool, detail: str) -> CheckResult:
        return CheckResult(
            id=check.id,
            passed=passed,
            detail=detail[:300],
            exit_code=exit_code,
            output=kept,
            seconds=seconds,
            users=users,
        )

    if timed_out:
        return result(False, f"no answer within {check.timeout_s:g}s")
    if exit_code != 0:
        # The check's own last words, not srun's "task 0: Exited with exit code 1".
        lines = [ln for ln in output.splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if not ln.startswith("srun: ")), "")
        return result(False, f"exit {exit_code}" + (f": {last.strip()[:200]}" if last else ""))
    if check.fail_pattern and (m := re.search(check.fail_pattern, output, re.MULTILINE)):
        return result(False, f"output has {m.group(0)[:120]!r}")
    if check.pass_pattern and not re.search(check.pass_pattern, output, re.MULTILINE):
        return result(False, f"output lacks {check.pass_pattern!r}")
    return result(
        True, "exit 0" + (f", {check.pass_pattern!r} found" if check.pass_pattern else "")
    )


def judge_counters(
    check: HealthCheck, samples: Sequence[TelemetrySample], since: datetime
) -> CheckResult:
    """A telemetry check: the node agent's counters since ``since`` (the fault). A flag
    (pending, failure) set in the latest sample of a GPU fails it; a count (ecc_dbe_volatile)
    fails it when it grew after ``since``. No sample from the node: skipped."""
    assert check.kind is CheckKind.TELEMETRY
    by_gpu: dict[int | None, list[TelemetrySample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    problems: list[str] = []
    seen = 0
    for gpu, rows in sorted(by_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        rows.sort(key=lambda s: s.time or since)
        latest = rows[-1]
        before = [s for s in rows if s.time is not None and s.time <= since]
        for counter in check.counters:
            now = getattr(latest, counter, None)
            if now is None:
                continue
            seen += 1
            if isinstance(now, bool):
                if now:
                    problems.append(f"GPU {gpu}: {counter} set")
                continue
            then = next(
                (
                    getattr(s, counter)
                    for s in reversed(before)
                    if getattr(s, counter, None) is not None
                ),
                None,
            )
            if then is not None and now > then:
                problems.append(f"GPU {gpu}: {counter} {then} → {now} since the fault")
    if not seen:
        return CheckResult(
            id=check.id,
            passed=False,
            skipped=True,
            detail="skipped: no counters from the node agent",
        )
    if problems:
        return CheckResult(id=check.id, passed=False, detail="; ".join(problems)[:300])
    return CheckResult(
        id=check.id, passed=True, detail=f"{seen} counters clean across {len(by_gpu)} GPU(s)"
    )


def ladder_for(settings: LifecycleSettings, remedy: str | None, category: Category) -> list[Rung]:
    """The rungs to try once the first checks fail: by the Xid catalogue's remedy, else the
    fault's category, else the default ladder; always ending in escalate."""
    ladders = settings.ladders
    rungs = (
        ladders.get(remedy or "")
        or ladders.get(category.value)
        or ladders.get("default")
        or [Rung.ESCALATE]
    )
    out: list[Rung] = []
    for r in rungs:
        if r is not Rung.RESUME_AFTER_CHECKS and r not in out:
            out.append(r)
    if Rung.ESCALATE in out:
        out = out[: out.index(Rung.ESCALATE)]
    return [*out, Rung.ESCALATE]


def foreign_jobs(jobs: Sequence[NodeJob], node: str) -> list[NodeJob]:
    """The jobs on ``node`` that keep its checks from starting: every job Slurm lists there
    (running, completing, suspended, ...) but Relaunch's own, root's jobs in the node's
    maintenance reservation (which admits root only). A job's name is never asked: a user
    chooses it. A pending job holds nothing there."""
    own = reservation_name(node)
    return [
        j
        for j in jobs
        if j.state is not JobState.PENDING
        and not j.state.is_terminal
        and not (j.uid == 0 and j.reservation == own)
    ]


def describe_jobs(jobs: Sequence[NodeJob]) -> str:
    """``job 12 (uid 1001, RUNNING), ...``: for the audit trail (Slurm's fields only)."""
    shown = [
        f"job {j.job_id} (uid {j.uid if j.uid is not None else '?'}, {j.state.value})"
        for j in jobs[:5]
    ]
    more = f" and {len(jobs) - 5} more" if len(jobs) > 5 else ""
    return ", ".join(shown) + more


def inconclusive_reason(results: Sequence[CheckResult], after: Sequence[NodeJob]) -> str:
    """Why a run whose checks failed says nothing about the node, or "": a user's process was
    on the node while a failed check ran (its census), or a user's job was there when the run
    ended (Slurm's fresh view). A user could have made the check fail; the node goes to a
    person, never up the ladder."""
    failed = [r for r in results if not r.skipped and not r.passed]
    if not failed:
        return ""
    why: list[str] = []
    beside = sorted({u for r in failed for u in r.users})
    if beside:
        ids = ", ".join(r.id for r in failed if r.users)
        why.append(
            f"{ids} failed while processes of uid {', '.join(map(str, beside[:10]))} "
            "were on the node"
        )
    if after:
        why.append(f"{describe_jobs(after)} on the node as the checks ended")
    return "; ".join(why)[:400]
