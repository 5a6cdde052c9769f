"""Attribution: from an incident bundle to a verdict — what failed, which nodes, how sure.

First rules (the attribution milestone refines them): a node-level root cause (an Xid, a link
down) beats the cascade it triggers on every other rank; a node that stopped answering is a node
failure; a user exception is an application error and never blames a node; scheduler states
settle time limits, preemption and cancellation.
"""

from __future__ import annotations

from collections import defaultdict

from relaunch.detection.planning import default_action
from relaunch.detection.signatures import Catalogue, Culprit, SignatureMatch
from relaunch.models.bundle import Bundle
from relaunch.models.recovery import Category, EvidenceLine, Verdict

_NODE_CATEGORIES = {Category.GPU_HARDWARE, Category.NETWORK, Category.NODE_FAILURE}
_STATE_CATEGORIES = {
    "TIMEOUT": Category.TIME_LIMIT,
    "PREEMPTED": Category.PREEMPTION,
    "DEADLINE": Category.TIME_LIMIT,
}
_DOWN_WORDS = ("DOWN", "NOT_RESPONDING", "FAIL")


def _evidence(m: SignatureMatch, source: str) -> EvidenceLine:
    return EvidenceLine(
        source=source, line_no=m.line_no, text=m.text, signature=m.signature, role=m.role
    )


def _culprit(m: SignatureMatch, bundle: Bundle, cat: Catalogue) -> str | None:
    if m.host and m.host in bundle.job.nodes:
        return m.host
    if m.host:
        # Hostnames may be fully qualified where Slurm uses short names.
        short = m.host.split(".")[0]
        if short in bundle.job.nodes:
            return short
    if m.rank is not None and cat.get(m.signature).culprit is Culprit.RANK_PREFIX:
        return bundle.job.rank_node(m.rank)
    return None


def attribute_bundle(bundle: Bundle, catalogue: Catalogue | None = None) -> Verdict:
    """The verdict for one bundle. Pure: the same bundle always gives the same verdict."""
    cat = catalogue or Catalogue.load()
    job = bundle.job
    matches: list[tuple[SignatureMatch, str]] = [
        (m, "logs/job.log") for m in cat.scan(bundle.job_log, source="job_log")
    ]
    for node, text in bundle.node_logs.items():
        matches += [
            (m, f"nodes/{node}.log") for m in cat.scan(text, source="node_log", source_node=node)
        ]
    for sample in bundle.telemetry:
        if sample.xid is not None:
            line = f"NVRM: Xid (telemetry {sample.node} gpu {sample.gpu}): {sample.xid}, telemetry"
            for m in cat.scan(line, source="telemetry", source_node=sample.node):
                matches.append((m, "telemetry.jsonl"))

    roots = [(m, src) for m, src in matches if m.role == "root"]
    cascades = [(m, src) for m, src in matches if m.role == "cascade"]

    # 1. Node-level root causes, grouped by the node they blame.
    node_roots: dict[str, list[tuple[SignatureMatch, str]]] = defaultdict(list)
    for m, src in roots:
        cat_m = Category(m.category)
        if cat_m in _NODE_CATEGORIES:
            culprit = _culprit(m, bundle, cat)
            if culprit:
                node_roots[culprit].append((m, src))
    if node_roots:
        best = max((m for ms in node_roots.values() for m, _ in ms), key=lambda m: m.severity)
        category = Category(best.category)
        culprits = sorted(node_roots)
        evidence = [_evidence(m, src) for ms in node_roots.values() for m, src in ms]
        evidence += [_evidence(m, src) for m, src in cascades[:5]]
        return Verdict(
            category=category,
            culprit_nodes=culprits,
            confidence=0.9,
            action=default_action(category, culprits),
            evidence=evidence,
            summary=f"{best.signature} on {', '.join(culprits)}; "
            f"{len(cascades)} cascade line(s) on other ranks",
        )

    # 2. Nodes that stopped answering (Slurm's view, or slurmd unreachable).
    dead = sorted(
        {n for n, st in job.node_states.items() if any(w in st.upper() for w in _DOWN_WORDS)}
        | set(job.unreachable_nodes)
    )
    if dead:
        return Verdict(
            category=Category.NODE_FAILURE,
            culprit_nodes=dead,
            confidence=0.85,
            action=default_action(Category.NODE_FAILURE, dead),
            evidence=[_evidence(m, src) for m, src in cascades[:5]],
            summary=f"{', '.join(dead)} stopped answering"
            + (f" ({job.node_states.get(dead[0], 'unreachable')})" if dead else ""),
        )

    # 3. Scheduler outcomes that are nobody's fault. A cancelled job was cancelled by someone
    #    (a node failure shows as NODE_FAIL): whatever else its log says, it is not restarted.
    state = job.state.upper()
    if state == "CANCELLED":
        return Verdict(
            category=Category.USER_CANCEL,
            confidence=0.9,
            action=default_action(Category.USER_CANCEL, []),
            evidence=[_evidence(m, src) for m, src in roots if m.signature.startswith("slurm_")][
                :3
            ],
            summary="job cancelled",
        )
    if state in _STATE_CATEGORIES:
        category = _STATE_CATEGORIES[state]
        return Verdict(
            category=category,
            confidence=0.95,
            action=default_action(category, []),
            summary=f"job {state}",
        )

    # 4. An application error (traceback, exception, CUDA OOM) never blames a node.
    app = [(m, src) for m, src in roots if Category(m.category) is Category.APPLICATION]
    if app:
        first = min(app, key=lambda x: x[0].line_no)[0]
        return Verdict(
            category=Category.APPLICATION,
            confidence=0.9,
            action=default_action(Category.APPLICATION, []),
            evidence=[_evidence(m, src) for m, src in app[:10]],
            summary=f"application error: {first.text[:160]}",
        )

    # 5. Other roots (time limit, preemption lines, user cancel) by category.
    other = [(m, src) for m, src in roots]
    if other:
        best = max((m for m, _ in other), key=lambda m: m.severity)
        category = Category(best.category)
        return Verdict(
            category=category,
            confidence=0.8,
            action=default_action(category, []),
            evidence=[_evidence(m, src) for m, src in other[:10]],
            summary=best.text[:160],
        )
    return Verdict(
        category=Category.UNKNOWN,
        confidence=0.3,
        action=default_action(Category.UNKNOWN, []),
        evidence=[_evidence(m, src) for m, src in cascades[:5]],
        summary="no root cause found" + (f"; {len(cascades)} cascade line(s)" if cascades else ""),
    )
