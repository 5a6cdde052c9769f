"""Attribution: from an incident bundle to a verdict — what failed, which nodes, how sure.

The rules, in the order they are tried (docs/failure-signatures.md §1 and §3):

1. Scheduler facts that end the question: a cancelled job was cancelled, a preempted one
   preempted; a time limit is a time limit unless training had stopped long before (a hang).
2. Node-level root causes (Xid, SXid, NIC, ECC telemetry, a node failure Slurm reports, a node
   that stopped answering) blame their nodes, every one of them, whatever the cascade on the
   other ranks says; the same Xid 119/120 on most nodes points at the driver instead. An Xid
   counts as NVIDIA's Xid catalogue says (relaunch/detection/xids): only a code whose immediate
   action is a GPU reset, a reboot or a support call takes its node out; one that asks for a
   restart of the application restarts without isolation (unless the catalogue's repeat rule
   makes it the GPU's), an Xid 154 decides for the NVLink errors it summarises, and the rest
   are context.
3. An application root (an exception, an OOM, a non-finite loss, a segfault, an OOM kill behind
   a bare ``Killed``) never blames a node; infrastructure roots restart without blame. The
   earliest such root decides between them.
4. No root anywhere: watchdog timeouts or stalled progress mean a hang, blamed on the straggler
   rank's node when an explicit map names it; the other fallout is network or unknown.
5. Reputation is a prior: where the evidence names no node, a repeat offender among the job's
   nodes is named, at low confidence.

Cascade, teardown and context lines never decide; they are folded into counts.

Trust (docs/trust.md): every finding is trusted or job-controlled by where it was read. The
job's output (``logs/job.log``) is job-controlled whatever it looks like; a node's kernel log,
agent telemetry, Slurm's node states, Relaunch's own probes and the health events of senders
whose console token is trusted with them (``health.jsonl``) are trusted; a health event of any
other sender (``health-untrusted.jsonl``) may point, like the job's output, never convict.
Job-controlled evidence may name a culprit, but only trusted evidence corroborates it
(``Verdict.corroboration``) and only a corroborated culprit is drained by default: the others
are excluded from the job's restart. Printed banners that end a recovery count only for this
job and never overrule a trusted hardware root.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Mapping
from datetime import timedelta

from relaunch.detection.findings import (
    HUNG_TASK_FILESYSTEM,
    Finding,
    Findings,
    collect,
    line_hosts,
)
from relaunch.detection.health_events import untrusted_health_nodes
from relaunch.detection.hung_tasks import hung_tasks
from relaunch.detection.planning import default_action
from relaunch.detection.signatures import Catalogue, Role, SignatureMatch
from relaunch.detection.straggler import find_stragglers
from relaunch.detection.xids import OUTCOMES, Bucket, Implicates, Outcome, Remedy, xid_table
from relaunch.models.bundle import HEALTH_FILE, Bundle
from relaunch.models.recovery import (
    RESTARTING,
    Action,
    Category,
    EvidenceLine,
    Verdict,
    XidEvidence,
)

NODE_CATEGORIES = frozenset({Category.GPU_HARDWARE, Category.NETWORK, Category.NODE_FAILURE})
# Slurm's words for a node that is down or failing, matched as whole words of its state
# (``DOWN+NOT_RESPONDING``): ``POWERED_DOWN`` / ``POWERING_DOWN`` is power saving, not a fault.
_DOWN_WORDS = frozenset({"DOWN", "NOT_RESPONDING", "FAIL", "FAILING"})
# sinfo's one-character suffixes of a state (``down*``, ``idle~``): none is part of the word.
_STATE_SUFFIXES = "*~#!%$@^-"
_DRIVER_XIDS = frozenset({119, 120})
_CONFIRMED_BY_OOM = frozenset({"srun_task_killed"})
STALL_AFTER = timedelta(minutes=10)
REPEAT_WINDOW = timedelta(hours=24)
_IMPLICATING = NODE_CATEGORIES | {Category.HANG, Category.UNKNOWN}
_PCI = re.compile(r"Xid \((?:PCI:)?([0-9A-Fa-f:.]+)")
# Xid outcomes that restart the application without isolating a node.
_RESTART_ONLY = frozenset({Outcome.RESTART, Outcome.FOLLOW_154})
_RUNGS = (Remedy.GPU_RESET, Remedy.REBOOT, Remedy.ESCALATE)  # the ladder, cheapest first
# Lines that show PyTorch's watchdog tore the process down itself.
_TEARDOWN_SIGNALS = frozenset(
    {"nccl_teardown", "nccl_watchdog_timeout", "nccl_watchdog_exception", "nccl_heartbeat_timeout"}
)
REPEAT_OFFENDER = 3
# The trusted sources a culprit's corroboration can name (docs/trust.md).
KERNEL_LOG = "kernel_log"
TELEMETRY = "telemetry"
SLURM_NODE_STATE = "slurm_node_state"
PROBE = "probe"
HEALTH_EVENT = "health_event"
REPUTATION = "reputation"
# Findings of these categories on a node are a fault of that node when a trusted source has them.
_CONVICTING = NODE_CATEGORIES | {Category.HANG}
# `*** JOB 12 ON n1 CANCELLED ...`, `*** STEP 12.0 ...`: the id of the job the banner is about.
_BANNER_ID = re.compile(r"\*\*\* (?:JOB|STEP) (?P<id>\S+) ")


def attribute_bundle(
    bundle: Bundle,
    catalogue: Catalogue | None = None,
    *,
    reputation: Mapping[str, int] | None = None,
    repeat_offender: int = REPEAT_OFFENDER,
) -> Verdict:
    """The verdict for one bundle. Pure: the same bundle (and reputation) gives the same
    verdict. ``reputation`` is each node's count of recent incidents that implicated it."""
    cat = catalogue or Catalogue.load()
    found = collect(bundle, cat)
    found.items = [f for f in found.items if not _foreign_banner(f, bundle.job.job_id)]
    found.items = _resolve_xids(found)
    found.items = [_gpu_held(f) for f in found.items]
    verdict = _decide(bundle, found)
    # A running job whose ranks advance, with no trusted fault: nothing to restart (yet). An
    # application error the job reports about itself still holds it (that harms no one else).
    still = verdict.action in RESTARTING and _still_running(bundle, found)
    folded = Counter(f.signature for f in found.by_role(Role.CASCADE, Role.TEARDOWN))
    verdict.folded = dict(sorted(folded.items(), key=lambda kv: (-kv[1], kv[0])))
    if (
        not still
        and not verdict.culprit_nodes
        and verdict.category
        in (
            Category.HANG,
            Category.NETWORK,
            Category.UNKNOWN,
            Category.NODE_FAILURE,
        )
    ):
        _apply_reputation(verdict, bundle, reputation or {}, repeat_offender)
    verdict.corroboration = corroborate(bundle, found, verdict)
    verdict.remedies = _remedies(verdict)
    verdict.action = default_action(verdict.category, verdict.culprit_nodes, verdict.corroboration)
    if verdict.repeat_offenders:  # drain and check the hardware, whatever the category says
        verdict.action = Action.ISOLATE_AND_RESTART
    if still:
        verdict.still_running, verdict.action = True, Action.NONE
        verdict.confidence = min(verdict.confidence, 0.5)
        verdict.summary += (
            f"; the job still runs and its ranks advance (step {bundle.job.progress_step}), and "
            "no trusted source names a fault: recorded, no action"
        )
    elif verdict.action in (Action.EXCLUDE_AND_RESTART, Action.ISOLATE_AND_RESTART):
        # A job's own output can be written to name any node: how sure the line is of its
        # node says nothing about whether the node is at fault.
        if verdict.action is Action.EXCLUDE_AND_RESTART:
            verdict.confidence = min(verdict.confidence, 0.7)
        told = untrusted_health_nodes(verdict)
        named = [n for n, by in verdict.corroboration.items() if not by]
        if by_job := [n for n in named if n not in told]:
            verdict.summary += (
                f"; named only by the job's output: {', '.join(by_job)} (excluded, not drained)"
            )
        if by_sender := [n for n in named if n in told]:
            verdict.summary += (
                f"; named only by a health event of an untrusted sender: {', '.join(by_sender)}"
                " (excluded, not drained)"
            )
    return verdict


def trusted_source(path: str) -> str | None:
    """The trusted source a finding was read from, by its path in the bundle; None when the
    job could have written it (its output)."""
    if path.startswith("nodes/"):
        return KERNEL_LOG
    if path.startswith("telemetry"):
        return TELEMETRY
    if path == HEALTH_FILE:  # a sender whose token is trusted with health events
        return HEALTH_EVENT
    return None


def corroborate(bundle: Bundle, found: Findings, verdict: Verdict) -> dict[str, list[str]]:
    """Each culprit's trusted sources: a fault the node's kernel log, telemetry or a trusted
    sender's health event reports on it during the job, Slurm listing it down, Relaunch's probe
    getting no answer, or (for a repeat offender) its record of incidents with trusted
    evidence. [] = named by the job alone."""
    job = bundle.job
    out: dict[str, list[str]] = {}
    for node in verdict.culprit_nodes:
        sources = {
            src
            for f in found.items
            if f.node == node
            and f.role is Role.ROOT
            and f.category in _CONVICTING
            and (src := trusted_source(f.path))
        }
        if node in job.nodes and _down_in_slurm(job.node_states.get(node, "")):
            sources.add(SLURM_NODE_STATE)
        if node in job.nodes and node in job.unreachable_nodes:
            sources.add(PROBE)
        if node in verdict.repeat_offenders:
            sources.add(REPUTATION)
        out[node] = sorted(sources)
    return out


def implicated(verdict: Verdict, bundle: Bundle) -> list[str]:
    """The nodes this incident counts against in their reputation: those a trusted source
    implicates — a culprit corroborated by this incident's trusted evidence, or an allocated
    node whose kernel log or telemetry holds one of the verdict's root lines. A node named by
    the job's output alone, or for its reputation alone, is not charged; nor is any node for a
    failure that was nobody's (application, cancellation, time limit)."""
    if verdict.category not in _IMPLICATING:
        return []
    charged = {n for n, sources in verdict.corroboration.items() if set(sources) - {REPUTATION}}
    charged |= {
        e.node
        for e in verdict.evidence
        if e.trusted
        and e.role == Role.ROOT.value
        and e.node in bundle.job.nodes
        # An Xid that only restarts the application may be the job's own doing (Xid 13, 31).
        and (e.xid is None or e.xid.outcome == Outcome.DRAIN.value)
    }
    return sorted(n for n in charged if n is not None)


def suspects(verdict: Verdict) -> list[str]:
    """Culprits named by job-controlled evidence alone (what other users' jobs may confirm).
    A node an untrusted sender's health event names is not one: that sender is not the job's
    user, and may name nodes under the jobs of any number of users."""
    told = untrusted_health_nodes(verdict)
    return sorted(n for n, by in verdict.corroboration.items() if not by and n not in told)


def _decide(bundle: Bundle, found: Findings) -> Verdict:
    job = bundle.job
    state = job.state.upper().split()[0] if job.state.strip() else ""
    roots = [f for f in found.by_role(Role.ROOT) if not _pointer(f, found)]
    # What no job can write: a node-level fault a kernel log, telemetry or a trusted health
    # event reports on one of the job's nodes, a node Slurm lists down, a node Relaunch's probes
    # found unreachable. Neither a printed banner nor a cancel (even a real one, from the job's
    # own error trap) hides it: the node is convicted and drained (a cancelled job is not
    # restarted: planning.make_plan).
    hardware = _trusted_hardware_root(bundle, roots) or bool(_dead_nodes(bundle))
    if state == "CANCELLED" and not hardware:
        return _verdict(Category.USER_CANCEL, [], 0.95, _first(roots, "slurm_"), "job cancelled")
    # scancel shows in the job's log at once, while Slurm may still list the job RUNNING or
    # COMPLETING for a moment: a cancel of the whole job (not a step: srun kills a step the same
    # way after a bad exit) is the user's, whatever its dying ranks print after it.
    # The banner is printed into the job's own output, so it is job-controlled.
    job_cancels = [
        f for f in roots if f.signature == "slurm_cancelled" and _JOB_CANCEL.search(f.match.text)
    ]
    if job_cancels and not hardware and state in ("", "RUNNING", "COMPLETING"):
        return _verdict(Category.USER_CANCEL, [], 0.9, job_cancels[:3], "job cancelled (scancel)")
    # Likewise Slurm's preemption line comes before the state settles (and a requeued job is
    # soon PENDING again): the line decides, not the momentary state. Slurm's own PREEMPTED
    # state decides whatever the nodes say (Slurm requeues or ends the job itself).
    preempted = [f for f in roots if f.signature == "slurm_preemption"]
    if state == "PREEMPTED" or (
        preempted and not hardware and state in ("", "RUNNING", "COMPLETING", "PENDING", "REQUEUED")
    ):
        return _verdict(Category.PREEMPTION, [], 0.95, _first(roots, "slurm_"), "job preempted")

    stalled = _stalled(bundle)
    storage = [f for f in roots if f.signature == HUNG_TASK_FILESYSTEM]
    if state in ("TIMEOUT", "DEADLINE"):
        if stalled and storage:
            return _infrastructure(
                storage[0], storage, bundle, f"ran into its time limit, {stalled}"
            )
        if stalled:
            return _hang(bundle, found, f"ran into its time limit, {stalled}")
        return _verdict(
            Category.TIME_LIMIT, [], 0.95, _first(roots, "slurm_"), "job hit its time limit"
        )

    node_verdict = _node_roots(bundle, found, roots)
    if node_verdict is not None:
        return node_verdict

    decisive = [f for f in roots if f.category in (Category.APPLICATION, Category.INFRASTRUCTURE)]
    decisive += _confirmed_kills(found)
    if decisive:
        first = min(decisive, key=_order)
        under = [f for f in decisive if f.signature in UNDER_THE_JOB]
        if first.signature == "python_exception" and under:
            # A bare exception line (often a wrapper: CheckpointException, a RuntimeError
            # around a failed save) says less than what failed under the job.
            first = min(under, key=_order)
        category = first.category
        same = [f for f in decisive if f.category is category]
        if category is Category.APPLICATION:
            summary = f"application error: {first.match.text[:160]}"
            return _verdict(category, [], 0.9, same, summary)
        return _infrastructure(first, same, bundle, first.match.text[:160])

    restarts = [f for f in roots if _restart_only(f)]
    if restarts:
        return _xid_restart(restarts)

    network = [f for f in roots if f.category is Category.NETWORK]
    if network:
        summary = f"network error, no node named: {network[0].match.text[:160]}"
        return _verdict(Category.NETWORK, [], 0.6, network, summary)

    hang_roots = [f for f in roots if f.category is Category.HANG]
    if hang_roots:
        return _hang(bundle, found, f"hang on rank(s): {hang_roots[0].match.text[:120]}")

    unknown = [f for f in roots if f.category is Category.UNKNOWN]
    if unknown:
        first = min(unknown, key=_order)
        summary = f"a rank died, cause not confirmed: {first.match.text[:120]}"
        return _verdict(Category.UNKNOWN, [], 0.4, unknown, summary)

    if state == "NODE_FAIL":
        summary = "Slurm reports a node failure; no node named"
        return _verdict(Category.NODE_FAILURE, [], 0.6, [], summary)

    hang_lines = [f for f in found.by_role(Role.ROOT, Role.CASCADE) if f.category is Category.HANG]
    if hang_lines or stalled or state in ("RUNNING", "COMPLETING"):
        return _hang(bundle, found, stalled or f"{len(hang_lines)} hang line(s), no root cause")

    # Roots no rule above decided on (e.g. a scheduler line the job's state does not bear out,
    # a node-level line that names no node; none is unknown): the most severe one decides.
    if roots:
        best = max(roots, key=lambda f: (f.match.severity, -_order(f)[1]))
        return _verdict(best.category, [], 0.7, roots, best.match.text[:160])
    return _verdict(Category.UNKNOWN, [], 0.3, [], "no root cause found")


def _node_roots(bundle: Bundle, found: Findings, roots: list[Finding]) -> Verdict | None:
    """Rule 2: node-level roots and dead nodes blame their nodes."""
    job = bundle.job
    by_node: dict[str, list[Finding]] = defaultdict(list)
    driver: dict[str, list[Finding]] = defaultdict(list)
    contained_nodes = {
        f.node for f in roots if _restart_only(f) and f.category in NODE_CATEGORIES and f.node
    }
    hard_nodes = {f.node for f in roots if f.path.startswith("nodes/") and not _restart_only(f)}
    for f in roots:
        if f.category not in NODE_CATEGORIES or _restart_only(f):
            continue
        if f.node in contained_nodes - hard_nodes and f.path == "logs/job.log":
            continue  # the rank's ECC error is the contained Xid (94) seen from the job
        if f.match.xid in _DRIVER_XIDS and f.node:
            driver[f.node].append(f)
        # An srun hostlist can name several nodes; every other source names one at most.
        for node in [f.node] if f.node else line_hosts(f.match, job.nodes):
            by_node[node].append(f)
    if len(driver) >= 3 and len(driver) * 2 >= len(job.nodes):
        lines = [g[0] for g in driver.values()]
        return _verdict(
            Category.INFRASTRUCTURE,
            [],
            0.75,
            lines,
            f"Xid {lines[0].match.xid} on {len(driver)} of {len(job.nodes)} nodes: "
            "the driver, not the GPUs",
        )
    dead = _dead_nodes(bundle)
    if not by_node and not dead:
        return None
    evidence = [f for fs in by_node.values() for f in fs]
    if by_node:
        best = max(evidence, key=lambda f: (f.match.severity, -_order(f)[1]))
        category = best.category
    else:
        category = Category.NODE_FAILURE
    culprits = sorted(set(by_node) | set(dead))
    confidence = min(
        [_confidence(f, bundle) for f in evidence] + ([0.85] if set(dead) - set(by_node) else [])
    )
    parts = [f"{_named(f)} on {node}" for node, fs in sorted(by_node.items()) for f in fs[:1]]
    parts += [f"{n} {job.node_states.get(n, 'unreachable')}" for n in dead if n not in by_node]
    cascades = len(found.by_role(Role.CASCADE))
    summary = "; ".join(parts) + f"; {cascades} cascade line(s) on other ranks"
    return _verdict(category, culprits, confidence, evidence, summary)


# Infrastructure roots that name what failed under the job (storage, a node-local resource,
# the rendezvous port): the job is not at fault, and a restart (elsewhere) is right.
GPU_HELD = "cuda_oom_gpu_held"
UNDER_THE_JOB = frozenset(
    {
        HUNG_TASK_FILESYSTEM,
        GPU_HELD,
        "filesystem_error",
        "node_resource_exhausted",
        "nccl_shm_exhausted",
        "store_address_in_use",
    }
)


# PyTorch's CUDA OOM message (c10/cuda/CUDACachingAllocator.cpp, since 2.1): the GPU's capacity,
# then, from NVML, `Process <pid> has <size> memory in use. ` for every *other* process on the
# GPU and `Including non-PyTorch memory, this process has <size> ...` for its own.
_OOM_CAPACITY = re.compile(r"GPU \d+ has a total capacity of (\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)")
_OOM_OTHER = re.compile(r"Process (\d{1,10}) has (\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB) memory in use")
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# Other processes holding at least this share of the GPU: the job did not run itself out.
HELD_SHARE = 0.5


def _gpu_held(f: Finding) -> Finding:
    """A CUDA OOM whose message shows other processes holding most of the GPU's memory (a
    previous attempt's ranks that never exited, another job on a shared node) is a node-local
    resource taken from under the job, not the job's own OOM: infrastructure, restart."""
    if f.signature != "cuda_oom":
        return f
    capacity = _OOM_CAPACITY.search(f.match.text)
    others = _OOM_OTHER.findall(f.match.text)
    if capacity is None or not others:
        return f
    total = float(capacity[1]) * _UNITS[capacity[2]]
    held = sum(float(size) * _UNITS[unit] for _, size, unit in others)
    if total <= 0 or held < HELD_SHARE * total:
        return f
    update = {"signature": GPU_HELD, "category": Category.INFRASTRUCTURE, "role": Role.ROOT}
    return Finding(f.match.model_copy(update=update), f.path, f.node, f.time)


def _infrastructure(first: Finding, same: list[Finding], bundle: Bundle, why: str) -> Verdict:
    """An infrastructure verdict (restart; no node blamed, none drained) that names what failed:
    the file system and the nodes whose tasks hung in it, the resource, the port."""
    hung = [f for f in same if f.signature == HUNG_TASK_FILESYSTEM]
    if hung:
        systems: list[str] = []
        for f in hung:
            for fs in _hung_filesystems(f, bundle):
                if fs not in systems:
                    systems.append(fs)
        nodes = sorted({f.node for f in hung if f.node})
        named = (
            f"storage: tasks blocked in {'/'.join(systems) or 'a file system'} "
            f"on {', '.join(nodes) or 'the nodes'}"
        )
    else:
        named = resource(first, bundle)
    return _verdict(Category.INFRASTRUCTURE, [], 0.8, same, f"infrastructure ({named}): {why}")


def _hung_filesystems(f: Finding, bundle: Bundle) -> list[str]:
    node_log = bundle.node_logs.get(f.node or "", "")
    return next((t.filesystems for t in hung_tasks(node_log) if t.line_no == f.match.line_no), [])


_PORT = re.compile(r"(?:port: |:)(\d{2,5})\b(?:, useIpv6| \(errno: 98)")
_WRITER = re.compile(r"PytorchStreamWriter|unexpected pos \d|write\(\): fd \d")
_QUOTED_PATH = re.compile(r"'(/[^'\n]{1,255})'|\b(/dev/shm)/")
# A path's first parts that name its file system (/lustre/fs1, /gpfs/scratch, /dev/shm).
_MOUNT_DEPTH = 2


def resource(f: Finding, bundle: Bundle) -> str:
    """What an infrastructure root names as having failed under the job: the storage (the file
    system a hung task or an I/O error points at), a node-local resource (/dev/shm, /tmp, file
    descriptors, a full disk), the rendezvous port, the driver or the GPU runtime."""
    text = f.match.text
    sig = f.signature
    if sig == HUNG_TASK_FILESYSTEM:
        systems = _hung_filesystems(f, bundle)
        return f"storage: tasks blocked in {'/'.join(systems) or 'a file system'} on {f.node}"
    if sig == "store_address_in_use":
        port = _PORT.search(text)
        return f"rendezvous port {port[1]} in use" if port else "rendezvous port in use"
    if sig == GPU_HELD:
        pids = ", ".join(pid for pid, _, _ in _OOM_OTHER.findall(text))
        where = f" on {f.node}" if f.node else ""
        return f"node-local resource: GPU memory held by other processes{where} (pid {pids})"
    if sig == "nccl_shm_exhausted":
        return "node-local resource: /dev/shm too small or full (NCCL shared memory)"
    if sig == "node_resource_exhausted":
        if "Too many open files" in text:
            return "node-local resource: file descriptors"
        if "shared memory" in text:
            return "node-local resource: /dev/shm too small or full"
        path = _path(text)
        where = path if path else "a disk"
        return f"node-local resource: no space left on {where}"
    if sig == "filesystem_error":
        path = _path(text)
        what = "a checkpoint write failed" if _WRITER.search(text) else "I/O error"
        return f"storage: {what} on {path}" if path else f"storage: {what}"
    if f.match.xid is not None:
        return "GPU driver"
    return sig


def _path(text: str) -> str:
    """The file system a quoted path sits on: its first parts (``/lustre/fs1``), /tmp or
    /dev/shm as themselves."""
    found = _QUOTED_PATH.search(text)
    if found is None:
        return ""
    path = found[1] or found[2]
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["dev", "shm"]:
        return "/dev/shm"
    if parts[:1] == ["tmp"]:
        return "/tmp"
    return "/" + "/".join(parts[:_MOUNT_DEPTH])


def _down_in_slurm(state: str) -> bool:
    """DOWN, FAIL or not responding: our own ``+NOT_RESPONDING`` flag or sinfo's ``*``. Each
    ``+``-separated word is compared whole (``POWERED_DOWN`` is not ``DOWN``)."""
    words = {w.strip().rstrip(_STATE_SUFFIXES) for w in state.upper().split("+")}
    return state.strip().endswith("*") or bool(words & _DOWN_WORDS)


def _dead_nodes(bundle: Bundle) -> list[str]:
    """The job's nodes that Slurm lists down or not responding, or that Relaunch's probes
    found unreachable: what no job can print (docs/trust.md)."""
    job = bundle.job
    return sorted(
        {n for n, st in job.node_states.items() if n in job.nodes and _down_in_slurm(st)}
        | {n for n in job.unreachable_nodes if n in job.nodes}
    )


def _still_running(bundle: Bundle, found: Findings) -> bool:
    """Whether the job still runs and its ranks advance (Slurm lists it RUNNING, its attempt
    printed progress, and the watcher measured no stall), with no trusted source naming a
    fault: no node-level or hang root in a kernel log, telemetry or a trusted health event,
    no node Slurm lists down, none Relaunch's probes found unreachable. The progress lines are
    the job's own words: they can only ever hold this job's own restart back."""
    job = bundle.job
    state = job.state.upper().split()[0] if job.state.strip() else ""
    if state != "RUNNING" or job.progress_step is None or job.last_progress_at is not None:
        return False
    if _dead_nodes(bundle):
        return False
    return not any(
        f.role is Role.ROOT and f.category in _CONVICTING and trusted_source(f.path)
        for f in found.items
    )


def _trusted_hardware_root(bundle: Bundle, roots: list[Finding]) -> bool:
    """Whether a kernel log or telemetry reports a node-level fault on one of the job's nodes
    (a contained error, which a restart clears, is not one)."""
    return any(
        f.category in NODE_CATEGORIES
        and not _restart_only(f)
        and f.node in bundle.job.nodes
        and trusted_source(f.path)
        for f in roots
    )


def _foreign_banner(f: Finding, job_id: str) -> bool:
    """A Slurm ``*** JOB|STEP <id> ...`` banner about some other job: printed text, not news
    of this one (a step id counts for its job; an array or heterogeneous job's ``12_3`` /
    ``12+1`` for ``12`` and the other way round)."""
    found = _BANNER_ID.search(f.match.text) if f.signature.startswith("slurm_") else None
    return found is not None and not _names_job(found["id"], job_id)


def _names_job(banner_id: str, job_id: str) -> bool:
    named = banner_id.split(".", 1)[0]  # a step: 12.0, 12.batch
    return job_id in (named, _base_id(named)) or named == _base_id(job_id)


def _base_id(job_id: str) -> str:
    return re.split(r"[_+]", job_id, maxsplit=1)[0]


def _confidence(f: Finding, bundle: Bundle) -> float:
    """How sure the node behind one finding is, by where the node came from."""
    if trusted_source(f.path):
        return 0.95
    if f.match.host:
        return 0.9
    if bundle.job.ranks is not None:
        return 0.85
    return 0.7  # a rank label read as a node index: one task per node assumed


def _named(f: Finding) -> str:
    """A finding as a verdict's summary names it: an Xid by its catalogue words and action."""
    row = xid_table().row(f.match.xid) if f.match.xid is not None else None
    if row is None or f.match.xid_action is None:
        return f.signature
    return f"Xid {row.code} ({row.words}; {f.match.xid_action})"


def _restart_only(f: Finding) -> bool:
    """An Xid whose catalogue action restarts the application and isolates nothing."""
    return f.match.xid_outcome in _RESTART_ONLY and f.role is Role.ROOT


def _resolve_xids(found: Findings) -> list[Finding]:
    """The catalogue's rules across lines. An NVLink error that defers to Xid 154
    (XID_154_EVAL) folds as a cascade where a 154 on the same GPU asks for a reset or reboot
    (the 154 decides), and restarts the application where none does. A code with a repeat
    rule (a contained error) that recurs on the same GPU within a day, counting this node's
    log from before the job, becomes the GPU's: it drains for a GPU reset."""
    decisive_154 = {
        (f.node, _pci(f.match.text))
        for f in found.items
        if f.match.xid == 154 and f.match.xid_outcome is Outcome.DRAIN
    }
    day = (found.first_time - REPEAT_WINDOW) if found.first_time else None
    history = [f for f in found.stale if f.time is None or day is None or f.time >= day]
    seen = Counter(
        (f.match.xid, f.node or "", _pci(f.match.text))
        for f in found.items + history
        if _restart_only(f) and f.node
    )
    out: list[Finding] = []
    for f in found.items:
        gpu = (f.node, _pci(f.match.text))
        if f.match.xid_outcome is Outcome.FOLLOW_154 and gpu in decisive_154:
            f = _xid_as(f, role=Role.CASCADE, detail="an Xid 154 on this GPU decides")
        elif _restart_only(f) and f.match.xid is not None:
            row = xid_table().row(f.match.xid)
            times = seen[(f.match.xid, f.node or "", _pci(f.match.text))]
            if row is not None and row.repeats_convict and times >= row.repeats_convict:
                detail = f"{times} on this GPU within {REPEAT_WINDOW.total_seconds() / 3600:g} h"
                f = _xid_as(f, drain=True, detail=detail)
        out.append(f)
    return out


def _xid_as(f: Finding, *, role: Role | None = None, drain: bool = False, detail: str) -> Finding:
    update: dict[str, object] = {"xid_detail": f"{f.match.xid_detail}; {detail}"}
    if role is not None:
        update["role"] = role
    if drain:
        update.update(
            signature=f"{f.signature}_repeated",
            category=Category.GPU_HARDWARE,
            role=Role.ROOT,
            severity=4,
            xid_action=Bucket.RESET_GPU.value,
            xid_outcome=Outcome.DRAIN,
        )
    return Finding(f.match.model_copy(update=update), f.path, f.node, f.time)


def _xid_restart(restarts: list[Finding]) -> Verdict:
    """Xids whose catalogue action is to restart the application: restart, isolate nothing. A
    code the catalogue puts on the application (Xid 13, 31, ...) makes the cause unknown, so a
    second time holds for a person; one on the GPU (a contained memory error) is hardware."""
    first = min(restarts, key=_order)
    hardware = [f for f in restarts if f.category is Category.GPU_HARDWARE]
    row = xid_table().row(first.match.xid or 0)
    words = row.words if row else "not in the catalogue"
    action = first.match.xid_action or "none"
    summary = (
        f"Xid {first.match.xid} ({words}) on {first.node or '?'}: NVIDIA's catalogue says "
        f"{action}, so the job restarts and no node is isolated"
    )
    if hardware:
        return _verdict(Category.GPU_HARDWARE, [], 0.8, restarts, summary)
    return _verdict(Category.UNKNOWN, [], 0.5, restarts, summary)


def _remedies(verdict: Verdict) -> dict[str, str]:
    """Each culprit's rung on the remediation ladder: the costliest its drained Xids ask for."""
    out: dict[str, str] = {}
    for e in verdict.evidence:
        if e.xid is None or e.xid.remedy is None or e.node not in verdict.culprit_nodes:
            continue
        rung = Remedy(e.xid.remedy)
        if e.node not in out or _RUNGS.index(rung) > _RUNGS.index(Remedy(out[e.node])):
            out[e.node] = rung.value
    return out


def xid_remedy(m: SignatureMatch) -> str | None:
    """The remediation rung an Xid line that drains its node calls for (None for any other)."""
    if m.xid_action is None or m.xid_outcome is not Outcome.DRAIN:
        return None
    bucket = Bucket(m.xid_action)
    remedy = OUTCOMES[bucket][1] if bucket in OUTCOMES else None
    return remedy.value if remedy else None


def xid_evidence(f: Finding) -> XidEvidence | None:
    """The catalogue's say on a finding's Xid line, for the verdict's evidence."""
    m = f.match
    if m.xid is None or m.xid_action is None or m.xid_outcome is None:
        return None
    row = xid_table().row(m.xid)
    return XidEvidence(
        code=m.xid,
        words=row.words if row else "not in NVIDIA's Xid catalogue",
        action=m.xid_action,
        outcome=m.xid_outcome.value,
        remedy=xid_remedy(m),
        detail=m.xid_detail or "",
        implicates=(row.implicates if row else Implicates.GPU).value,
    )


def _pci(text: str) -> str:
    found = _PCI.search(text)
    return found.group(1).lower() if found else ""


def _pointer(f: Finding, found: Findings) -> bool:
    """An srun ``Aborted`` task is a pointer, not a cause, when the watchdog aborted it."""
    if f.signature != "srun_task_signal" or "Aborted" not in f.match.text:
        return False
    return any(g.signature in _TEARDOWN_SIGNALS for g in found.items)


def _confirmed_kills(found: Findings) -> list[Finding]:
    """A bare ``Killed`` is an OOM when a kernel or cgroup OOM record confirms it."""
    confirms = [f for f in found.items if f.role is Role.CONFIRM]
    if not confirms:
        return []
    kills = [f for f in found.items if f.signature in _CONFIRMED_BY_OOM]
    return confirms + kills


def _stalled(bundle: Bundle) -> str:
    job = bundle.job
    if job.last_progress_at is None:
        return ""
    gap = job.observed_at - job.last_progress_at
    if gap < STALL_AFTER:
        return ""
    return f"no progress for {gap.total_seconds():.0f} s before {job.observed_at:%H:%M:%S}"


def _hang(bundle: Bundle, found: Findings, why: str) -> Verdict:
    job = bundle.job
    known = [int(r) for r in job.ranks] if job.ranks else []
    report = find_stragglers(found.job_lines, known)
    culprits: list[str] = []
    for rank in report.ranks:
        node = found.rank_hosts.get(rank) or (job.ranks or {}).get(str(rank))
        if node and node in job.nodes:
            culprits.append(node)
    lines = [f for f in found.items if f.category is Category.HANG]
    stuck = {f.node for f in lines if f.role is Role.ROOT and f.node}
    if len(stuck) * 2 <= len(job.nodes):  # stuck everywhere singles out no node
        culprits += stuck
    culprits = sorted(set(culprits))
    summary = why + (f"; straggler: {report.reason}" if report.reason else "")
    confidence = 0.75 if culprits else 0.6
    return _verdict(Category.HANG, culprits, confidence, lines, summary)


def _apply_reputation(
    verdict: Verdict, bundle: Bundle, reputation: Mapping[str, int], k: int
) -> None:
    offenders = sorted(n for n in bundle.job.nodes if reputation.get(n, 0) >= k)
    if not offenders:
        return
    verdict.culprit_nodes = offenders
    verdict.confidence = min(verdict.confidence, 0.5)
    counts = ", ".join(f"{n} ({reputation[n]} incidents)" for n in offenders)
    verdict.summary += f"; repeat offender(s) in this job: {counts} — drain and check the hardware"
    verdict.repeat_offenders = offenders


def _order(f: Finding) -> tuple[float, int]:
    """Time order when the line states a time, else log order."""
    return (f.time.timestamp() if f.time else float("inf"), f.match.line_no)


_JOB_CANCEL = re.compile(r"\*\*\* JOB \S+ (?:ON \S+ )?CANCELLED(?: AT \S+)? \*\*\*")


def _first(findings: list[Finding], prefix: str) -> list[Finding]:
    return [f for f in findings if f.signature.startswith(prefix)][:3]


def _dedupe(findings: list[Finding]) -> list[Finding]:
    """One finding per (signature, node, source file): copies across ranks are one observation;
    the same fault seen by the kernel log and by telemetry is shown from both."""
    seen: dict[tuple[str, str | None, str], Finding] = {}
    for f in sorted(findings, key=_order):
        seen.setdefault((f.signature, f.node, f.path), f)
    return list(seen.values())


def _verdict(
    category: Category,
    culprits: list[str],
    confidence: float,
    findings: list[Finding],
    summary: str,
) -> Verdict:
    counts = Counter((f.signature, f.node, f.path) for f in findings)
    findings = _dedupe(findings)
    evidence = [
        EvidenceLine(
            source=f.path,
            line_no=f.match.line_no,
            text=f.match.text,
            signature=f.signature,
            role=f.match.role,
            node=f.node,
            count=counts[(f.signature, f.node, f.path)],
            trusted=trusted_source(f.path) is not None,
            xid=xid_evidence(f),
        )
        for f in findings[:20]
    ]
    return Verdict(
        category=category,
        culprit_nodes=culprits,
        confidence=confidence,
        action=default_action(category, culprits, {}),
        evidence=evidence,
        summary=summary,
    )
