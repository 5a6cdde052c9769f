"""Node-health events pushed in by other systems (NVSentinel, a health checker) as findings.

A health event is read the way the rest of the bundle is: an Xid it reports goes through
NVIDIA's Xid catalogue like a kernel line (the kernel line the sender read, where it sends it,
so that the decodes of Xid 74, 144-150 and 154 apply; else a line made of the code), so an Xid
13 restarts the application and an Xid 79 takes its node out whatever the sender recommends.
Any other fatal event is a root of its component's category (a GPU or NVSwitch: GPU hardware;
a NIC: network; anything else: the node), except one whose sender recommends only restarting
the application (infrastructure: a restart, no blame). Healthy and non-fatal events are no
evidence.

Which of them may convict a node is not decided here: a finding's path says where it was read
(``health.jsonl`` for senders whose token is trusted with health events, else
``health-untrusted.jsonl``: :func:`health_path`), and attribution's trust rules do the rest
(docs/trust.md). :func:`relaunch.detection.findings.collect` places the matches on nodes.
"""

from __future__ import annotations

import re

from relaunch.detection.signatures import MAX_TEXT, Catalogue, Role, SignatureMatch
from relaunch.models.bundle import HEALTH_FILE, UNTRUSTED_HEALTH_FILE, HealthReport
from relaunch.models.recovery import Category, Verdict

HEALTH_SIGNATURE = "health_event"
MAX_XIDS = 4  # codes of one event read as Xids (a real event names one)
# `79`, `XID_79`, `Xid 79`, NVSentinel's NVLink5 `145.RLW_REMAP`; an SXID is an NVSwitch's.
_XID_CODE = re.compile(r"(?i)(?P<xid>xid[ _-]?)?(?P<code>\d{1,3})(?:\.[\w-]{1,64})?")
_GPU_WORDS = ("gpu", "nvswitch", "nvlink", "dcgm", "xid")
_NETWORK_WORDS = ("nic", "network", "infiniband", "ethernet", "hca", "ib", "net", "link")


def health_path(report: HealthReport) -> str:
    """Where a report is read in the bundle: its trust is its file's."""
    return HEALTH_FILE if report.trusted else UNTRUSTED_HEALTH_FILE


def component_category(component: str) -> Category:
    """The category of a fault of ``component`` (NVSentinel's componentClass, or the generic
    shape's component): GPU-side, network, else the node."""
    words = re.split(r"[^a-z0-9]+", component.lower())
    if any(w.startswith(_GPU_WORDS) for w in words if w):
        return Category.GPU_HARDWARE
    if any(w in _NETWORK_WORDS or w.startswith(("infiniband", "ethernet")) for w in words):
        return Category.NETWORK
    return Category.NODE_FAILURE


def xid_codes(report: HealthReport) -> list[int]:
    """The Xid codes an event reports: a code that says so (``XID_79``), or a bare number from
    an Xid check (NVSentinel's SysLogsXIDError sends ``["79"]``) or a GPU component."""
    check = report.check.lower()
    xid_check = "xid" in check and "sxid" not in check
    gpu = component_category(report.component) is Category.GPU_HARDWARE
    out: list[int] = []
    for code in report.error_codes:
        found = _XID_CODE.fullmatch(code.strip())
        if found is None:
            continue
        if found["xid"] or ((xid_check or gpu) and "sxid" not in code.lower()):
            value = int(found["code"])
            if value > 0 and value not in out:
                out.append(value)
    return out[:MAX_XIDS]


def health_matches(report: HealthReport, no: int, catalogue: Catalogue) -> list[SignatureMatch]:
    """What one report says, as matches (``no``: its line in the bundle's file); none for a
    healthy or non-fatal one. Placing them on a node is the caller's (findings.collect)."""
    if report.is_healthy or not report.is_fatal:
        return []
    matches = [_xid_match(report, code, no, catalogue) for code in xid_codes(report)]
    found = [m for m in matches if m is not None] or [_event_match(report, no)]
    return [
        m.model_copy(
            update={
                "text": _said(report, m.text),
                "host": report.node,
                "timestamp": report.time or m.timestamp,
                "source": "health",
            }
        )
        for m in found
    ]


def _xid_match(
    report: HealthReport, code: int, no: int, catalogue: Catalogue
) -> SignatureMatch | None:
    """The catalogue's reading of Xid ``code``: from the kernel line the sender read when it
    has this code, else from a line made of the code, the GPU's PCI address and the message."""
    if report.journal:
        m = catalogue.match_line(report.journal, line_no=no, source="health")
        if m is not None and m.xid == code:
            return m
    pci = next((e[4:] for e in report.entities if e.upper().startswith("PCI:")), "")
    where = f"PCI:{pci}" if pci else f"health {report.node}"
    line = f"NVRM: Xid ({where[:60]}): {code}, {report.message or report.check}"
    return catalogue.match_line(line, line_no=no, source="health")


def _event_match(report: HealthReport, no: int) -> SignatureMatch:
    """A fatal event that reports no Xid: a root of its component's category, or an
    infrastructure root where the sender recommends only restarting the application."""
    restart_app = report.recommended_action == "RESTART_APP"
    category = Category.INFRASTRUCTURE if restart_app else component_category(report.component)
    codes = ",".join(report.error_codes[:4])
    what = " ".join(
        part
        for part in (
            report.component or "node",
            report.check,
            f"[{codes}]" if codes else "",
            f"recommends {report.recommended_action}",
        )
        if part
    )
    return SignatureMatch(
        signature=HEALTH_SIGNATURE,
        category=category,
        role=Role.ROOT,
        severity=5,
        source="health",
        line_no=no,
        text=f"{what}: {report.message}" if report.message else what,
    )


def _said(report: HealthReport, text: str) -> str:
    """The evidence line: who said it, then what."""
    by = report.source or "health event"
    line = f"{report.node} {by} (sent by {report.sender or '?'}): {text}"
    return line[:MAX_TEXT]


def untrusted_health_nodes(verdict: Verdict) -> set[str]:
    """The nodes a verdict's evidence names through the health event of a sender not trusted
    with them: they may be excluded from the job's restart, never drained, and they are no
    user's suspicion (the sender is not the job's user: docs/trust.md)."""
    return {e.node for e in verdict.evidence if e.source == UNTRUSTED_HEALTH_FILE and e.node}
