"""Issue 19: GPU faults read the way NVIDIA's Xid catalogue reads them.

The buckets below are transcribed here, independently of ``relaunch/detection/xids/table.json``,
from NVIDIA's catalogue ("Analyzing Xid Errors with the Xid Catalog", the Xids sheet and the
Xid 144-150 decode sheet): the table must agree with them, and a bundle with one such Xid in a
node's kernel log must drain that node exactly when the catalogue's immediate action is a GPU
reset, a reboot or a support call.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from relaunch.cli.verdicts import classify_json, explain
from relaunch.detection.attribution import attribute_bundle, implicated
from relaunch.detection.findings import telemetry_findings
from relaunch.detection.signatures import Catalogue, Role
from relaunch.detection.xids import Bucket, Outcome, judge, xid_table
from relaunch.models.bundle import Bundle, BundleJob, TelemetrySample
from relaunch.models.recovery import Action, Category

# "Unused" codes (deprecated, or for V100 and older): CONTACT_SUPPORT should one appear.
UNUSED = {1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 27, 28,
          29, 30, 33, 34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 61, 65, 73,
          81, 87, 90, 91, 111, 112, 113, 114, 115, 116, 117, 118, 122, 123, 124, 125,
          138}  # fmt: skip
CATALOGUE_BUCKETS: dict[str, set[int]] = {
    "CONTACT_SUPPORT": UNUSED | {142},
    "RESET_GPU": {46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158},
    "RESTART_APP": {8, 11, 13, 25, 31, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 75, 76, 77, 80,
                    82, 83, 84, 85, 86, 88, 89, 94, 139, *range(96, 106), *range(126, 136)},
    "IGNORE": {14, 37, 38, 43, 44, 63, 66, 67, 92, 93, 106, 107, 108, 121, 137, 141, 152, 153,
               157, 160, 161},
    "WORKFLOW_XID_45": {45},
    "WORKFLOW_XID_48": {48},
    "CHECK_MECHANICALS": {54},
    "WORKFLOW_NVLINK_ERR": {74},
    "UPDATE_SWFW": {78},
    "RESTART_BM": {79},
    "RESTART_VM": {151},
    "XID_154": {154},
    "CHECK_UVM": {159},
    "WORKFLOW_NVLINK5_ERR": set(range(144, 151)),
    "": set(range(162, 173)),  # blank in this revision of the catalogue
}  # fmt: skip
DRAINING = {"CONTACT_SUPPORT", "RESET_GPU", "WORKFLOW_XID_48", "CHECK_MECHANICALS",
            "UPDATE_SWFW", "RESTART_BM", "RESTART_VM"}  # fmt: skip
# Relaunch's own choices where the catalogue is blank or conditional (docs/xid-catalogue.md).
OURS_DRAIN = {167, 168, 169, 171, 172}
OURS_NO_DRAIN = {159, 162, 163, 164, 165, 166, 170}

NODES = ["n1", "n2", "n3"]
T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
JOB_LOG = (
    "0: step=40 loss=0.31 rank=0 node=n1\n"
    "1: step=40 loss=0.31 rank=1 node=n2\n"
    "srun: error: n2: task 1: Exited with exit code 1\n"
)


def xid_line(
    code: int, rest: str = "pid=4242, name=python3, an event", pci: str = "0000:3b:00"
) -> str:
    return f"2026-12-03T09:04:00.000000+00:00 n2 kernel: NVRM: Xid (PCI:{pci}): {code}, {rest}"


def kernel_bundle(*lines: str, telemetry: list[TelemetrySample] | None = None) -> Bundle:
    job = BundleJob(
        cluster="c",
        job_id="77",
        state="FAILED",
        nodes=NODES,
        node_states=dict.fromkeys(NODES, "ALLOCATED"),
        observed_at=T0.replace(minute=5),
        submit_time=T0,
    )
    logs = {"n2": "\n".join(lines) + "\n"} if lines else {}
    return Bundle(path="mem", job=job, job_log=JOB_LOG, node_logs=logs, telemetry=telemetry or [])


def drained(bundle: Bundle) -> bool:
    v = attribute_bundle(bundle)
    if v.action is Action.ISOLATE_AND_RESTART:
        assert v.culprit_nodes == ["n2"], v.summary  # the node that logged it, and only it
        assert v.corroboration == {"n2": ["kernel_log"]} or "telemetry" in v.corroboration["n2"]
        return True
    assert v.culprit_nodes == [], v.summary
    return False


def test_the_table_covers_every_code_of_the_catalogue_with_its_bucket() -> None:
    table = xid_table()
    assert sorted(table.rows) == list(range(1, 173))
    transcribed = {code: bucket for bucket, codes in CATALOGUE_BUCKETS.items() for code in codes}
    assert sorted(transcribed) == list(range(1, 173))
    for code, row in table.rows.items():
        assert row.immediate.value == transcribed[code], code
        assert row.action is not Bucket.BLANK, code  # every code has an action Relaunch follows
        assert row.words and row.mnemonic
        if row.relaunch is not None:
            assert row.why, code
    # The catalogue's own tally: 161 of 172 codes carry an immediate action.
    assert sum(1 for r in table.rows.values() if r.immediate is not Bucket.BLANK) == 161


@pytest.mark.parametrize("code", range(1, 173))
def test_every_code_drains_exactly_when_the_catalogue_takes_the_gpu_out(code: int) -> None:
    bucket = next(b for b, codes in CATALOGUE_BUCKETS.items() if code in codes)
    if bucket in ("WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR", "XID_154"):
        pytest.skip("decoded from the line: see the decode tests")
    if code in OURS_DRAIN or code in OURS_NO_DRAIN:
        expected = code in OURS_DRAIN
    else:
        expected = bucket in DRAINING
    assert drained(kernel_bundle(xid_line(code))) is expected, (code, bucket)


def test_xid_45_is_never_a_cause_and_follows_the_other_xid() -> None:
    alone = attribute_bundle(kernel_bundle(xid_line(45, "pid=1, name=python3, Ch 00000008")))
    assert alone.culprit_nodes == [] and alone.folded.get("xid_45") == 1
    after_79 = attribute_bundle(
        kernel_bundle(xid_line(79, "GPU has fallen off the bus."), xid_line(45, "Ch 00000008"))
    )
    assert after_79.culprit_nodes == ["n2"] and after_79.folded.get("xid_45") == 1
    assert after_79.remedies == {"n2": "reboot"}


@pytest.mark.parametrize(
    ("value", "name", "drains", "remedy"),
    [
        (0, "None", False, None),
        (1, "GPU Reset Required", True, "gpu_reset"),
        (2, "Node Reboot Required", True, "reboot"),
        (3, "Drain P2P", True, "gpu_reset"),
        (4, "Drain and Reset", True, "gpu_reset"),
    ],
)
def test_xid_154_follows_the_recovery_action_it_carries(
    value: int, name: str, drains: bool, remedy: str | None
) -> None:
    line = xid_line(154, f"GPU recovery action changed from 0x0 (None) to {value:#x} ({name})")
    v = attribute_bundle(kernel_bundle(line))
    assert (v.action is Action.ISOLATE_AND_RESTART) is drains
    assert v.remedies == ({"n2": remedy} if remedy else {})
    # By name alone, too (a driver that prints no value).
    by_name = judge(154, f", GPU recovery action changed from None to ({name})")
    assert by_name.drains is drains


NVL5 = "{unit} {sev} XC0 i0 Link 10 ({intr:#010x} {status:#010x} 0x0 0x0 0x0 0x0)"


def nvl5_cases() -> list[tuple[int, str, int, int, str]]:
    """Every documented decode variant: (xid, unit, intrInfo, status, bucket), in both
    intrInfo layouts (before and from driver R575)."""
    cases = []
    for unit in xid_table().units:
        layouts = [int(unit.v1, 2), int(unit.v2, 2)]
        if unit.any is not None:
            cases += [(unit.xid, unit.names[-1], intr, 0, unit.any.value) for intr in layouts]
        for reason, bucket in unit.reasons.items():
            cases += [
                (unit.xid, unit.names[-1], intr | int(reason, 2) << 20, 0, bucket.value)
                for intr in layouts
            ]
        for status, bucket in unit.status.items():
            cases += [
                (unit.xid, unit.names[-1], intr, int(status, 16), bucket.value) for intr in layouts
            ]
        for status in unit.promote:
            assert unit.promoted is not None
            cases += [
                (unit.xid, unit.names[-1], intr | bit, int(status, 16), unit.promoted.value)
                for intr, bit in ((layouts[0], 1 << 10), (layouts[1], 1 << 7))
            ]
    return cases


@pytest.mark.parametrize(("xid", "unit", "intr", "status", "bucket"), nvl5_cases())
def test_every_nvlink5_decode_variant(
    xid: int, unit: str, intr: int, status: int, bucket: str
) -> None:
    rest = NVL5.format(unit=unit, sev="Nonfatal", intr=intr, status=status)
    j = judge(xid, ", " + rest)
    assert j.action.value == bucket, j.detail
    drains = drained(kernel_bundle(xid_line(xid, rest)))
    assert drains is (bucket == "RESET_GPU")


def test_one_representative_row_per_nvlink5_unit_against_the_catalogue() -> None:
    """Rows read straight off the decode sheet, independent of nvlink5.json."""
    rows = [
        (144, "SAW_MVB", 0x21, 0x2, True),  # Fatal
        (144, "SAW_MVB", 0x21, 0x4, False),  # Non-fatal, IGNORE
        (145, "RLW_REMAP", 0x82, 0x40, True),  # the NVSentinel fixture's line
        (145, "RLW_REMAP", 0x82, 0x100, False),
        (145, "RLW_RXPIPE", 0xC2, 0x1, False),  # Non-fatal*, promotable ...
        (145, "RLW_RXPIPE", 0x4C2, 0x1, True),  # ... and promoted (bit 10)
        (145, "RLW_TAGSTATE", 0x102, 0x100000, True),
        (146, "TLW_RX_PIPE1", 0x0B, 0x4, True),  # v2 layout
        (146, "TLW_CTRL", 0x123, 0x2, False),
        (147, "TREX", 0x184, 0x1, False),
        (148, "NVLPW_CTRL", 0x5, 0x80000000, False),
        (149, "NETIR_LINK_EVT", 0x025525C6, 0x0, True),  # reason 100101: peer device
        (149, "NETIR_LINK_EVT", 0x1C6 | 0b100110 << 20, 0x0, False),  # reason 100110: IGNORE
        (149, "NETIR_BER_EVENT", 0x226, 0x2, False),
        (149, "NETIR_MFDE_EVENT", 0x246, 0x4, True),
        (150, "MSE_WATCHDOG", 0x0, 0x0, True),
    ]
    for xid, unit, intr, status, fatal in rows:
        rest = NVL5.format(
            unit=unit, sev="Fatal" if fatal else "Nonfatal", intr=intr, status=status
        )
        assert drained(kernel_bundle(xid_line(xid, rest))) is fatal, (xid, unit, hex(intr))


def test_an_nvlink_error_deferring_to_xid_154_follows_it_or_restarts() -> None:
    remap = NVL5.format(unit="RLW_REMAP", sev="Nonfatal", intr=0x82, status=0x1)
    assert judge(145, ", " + remap).outcome is Outcome.FOLLOW_154
    alone = attribute_bundle(kernel_bundle(xid_line(145, remap)))
    assert alone.culprit_nodes == [] and alone.action is Action.RESTART
    assert "XID_154_EVAL" in alone.summary
    reset = xid_line(
        154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    )
    both = attribute_bundle(kernel_bundle(xid_line(145, remap), reset))
    assert both.culprit_nodes == ["n2"] and both.action is Action.ISOLATE_AND_RESTART
    assert both.folded.get("xid_145") == 1 and both.remedies == {"n2": "reboot"}
    # A 154 that asks for nothing leaves the restart.
    none = xid_line(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    assert attribute_bundle(kernel_bundle(xid_line(145, remap), none)).culprit_nodes == []


@pytest.mark.parametrize(
    ("registers", "drains"),
    [
        ("0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0", True),  # reg2 bit 16: field diagnostics
        ("0x10, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", True),  # reg0 bit 4: ECC/parity
        ("0x100, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", True),  # reg0 bit 8: link hardware
        ("0x0, 0x0, 0x0, 0x40000, 0x0, 0x0, 0x0", True),  # reg3 bit 18: fabric reset
        ("0x2, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", True),  # sympathetic: the link still needs a reset
        ("0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", False),  # reg0 bit 0: safe to ignore
        ("0x800001, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0", False),  # reg0 bits 0 and 23
        ("0x0, 0x0, 0x0, 0x0, 0x100000, 0x0, 0x0", False),  # reg4 bit 20: under threshold
        ("0x0, 0x0, 0x0, 0x0, 0x1100000, 0x0, 0x0", True),  # reg4 bit 24 with it: ECC/parity
    ],
)
def test_xid_74_follows_its_register_bits(registers: str, drains: bool) -> None:
    rest = f"pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14({registers})"
    assert drained(kernel_bundle(xid_line(74, rest))) is drains


def test_a_contained_error_restarts_unless_it_repeats_on_the_same_gpu() -> None:
    contained = "pid=7, name=python3, Contained ECC error."
    once = attribute_bundle(kernel_bundle(xid_line(94, contained)))
    assert once.category is Category.GPU_HARDWARE and once.action is Action.RESTART
    assert once.culprit_nodes == []
    twice = kernel_bundle(xid_line(94, contained), xid_line(94, contained))
    v = attribute_bundle(twice)
    assert v.culprit_nodes == ["n2"] and v.action is Action.ISOLATE_AND_RESTART
    assert v.remedies == {"n2": "gpu_reset"}
    other_gpu = kernel_bundle(xid_line(94, contained), xid_line(94, contained, pci="0000:5d:00"))
    assert attribute_bundle(other_gpu).culprit_nodes == []


def test_an_application_xid_restarts_and_charges_no_reputation() -> None:
    """Xid 13 and 31 are the application's to cause: the catalogue restarts it, and a job that
    provokes them (over and over, on purpose) must not make its node a repeat offender."""
    for code, rest in (
        (13, "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address"),
        (31, "MMU Fault: ENGINE GRAPHICS GPC6 faulted @ 0x6f6f_320c2000"),
    ):
        b = kernel_bundle(xid_line(code, rest), xid_line(code, rest))
        v = attribute_bundle(b)
        assert v.action is Action.RESTART and v.culprit_nodes == [], v.summary
        assert v.category is Category.UNKNOWN and "RESTART_APP" in v.summary
        assert implicated(v, b) == []
    # With the application's own error printed, it is the application's (hold).
    printed = kernel_bundle(xid_line(13, "Graphics Exception: ChID 000c"))
    printed.job_log += "1: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert attribute_bundle(printed).action is Action.HOLD


def test_ignored_codes_are_context_and_never_trigger_on_their_own() -> None:
    for code in (43, 63, 92, 121, 137, 157):
        (m,) = Catalogue.load().scan(xid_line(code), source="k", source_node="n2")
        assert m.role is Role.CONTEXT, code


@pytest.mark.parametrize("code", [c for c in range(1, 173) if c not in (74, 154, *range(144, 151))])
def test_telemetry_agrees_with_the_kernel_log(code: int) -> None:
    """An NVML Xid event (the code alone) goes through the same table as the kernel line."""
    catalogue = Catalogue.load()
    (line,) = catalogue.scan(xid_line(code), source="k", source_node="n2")
    sample = TelemetrySample(node="n2", gpu=0, time=T0.replace(minute=4), xid=code)
    findings = telemetry_findings([sample], catalogue, NODES)
    assert [(f.match.xid_action, f.match.xid_outcome, f.role) for f in findings] == [
        (line.xid_action, line.xid_outcome, line.role)
    ]
    from_nvml = drained(kernel_bundle(telemetry=[sample]))
    assert from_nvml is drained(kernel_bundle(xid_line(code)))


def test_a_bare_code_from_telemetry_does_not_decide_what_needs_the_line() -> None:
    for code in (145, 149, 154):
        sample = TelemetrySample(node="n2", gpu=0, time=T0.replace(minute=4), xid=code)
        assert not drained(kernel_bundle(telemetry=[sample])), code
    # NVML gives no registers for Xid 74 either; the catalogue resets the GPU for it.
    sample = TelemetrySample(node="n2", gpu=0, time=T0.replace(minute=4), xid=74)
    assert drained(kernel_bundle(telemetry=[sample]))


def test_classify_json_and_explain_carry_the_catalogue_say() -> None:
    b = kernel_bundle(xid_line(95, "pid=7062, Uncontained: LTC TAG (0x2,0x0). RST: Yes"))
    v = attribute_bundle(b)
    data = json.loads(classify_json("mem", v))
    (xid,) = [e["xid"] for e in data["evidence"] if e.get("xid")]
    assert xid == {
        "code": 95,
        "words": "Uncontained memory error",
        "action": "RESET_GPU",
        "outcome": "drain",
        "remedy": "gpu_reset",
        "detail": "immediate action RESET_GPU",
        "implicates": "gpu",
    }
    assert data["remedies"] == {"n2": "gpu_reset"}
    text = explain(b, v, color=False)
    assert "Xid 95 (Uncontained memory error): NVIDIA's immediate action RESET_GPU" in text
    assert "drain; the node needs a GPU reset" in text


def test_an_unknown_code_restarts_without_isolation() -> None:
    v = attribute_bundle(kernel_bundle(xid_line(250, "pid=1, name=x, something new")))
    assert v.culprit_nodes == [] and v.action is Action.RESTART
