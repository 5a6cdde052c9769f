"""The catalogue's three workflows that read the line: Xid 74's registers, Xid 144–150's
interrupt info and error status, Xid 154's recovery action. Each returns the bucket the line
decodes to and how it got there, in words an operator can check against the catalogue.

Bounded by construction: each reads at most the first few hundred characters after the code
with anchored, linear patterns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from relaunch.detection.xids.table import Bucket, Nvl5Unit

_WINDOW = 512

# Xid 74: `NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)`.
_XID74_REGS = re.compile(
    r"link\s{0,4}\d{1,3}\s{0,4}\(((?:\s{0,4}0x[0-9A-Fa-f]{1,8}\s{0,4},?){1,7})\)"
)
# The catalogue's WORKFLOW_NVLINK_ERR, by register (0 = the first) and bit. Bits it says can be
# ignored, or that only count the ECC errors corrected below a threshold:
_XID74_IGNORED = {0: frozenset({0, 23, 30}), 4: frozenset({20, 23, 26, 29})}
# Bits that are "generally sympathetic or secondary errors" of another one:
_XID74_SYMPATHETIC = {0: frozenset({1, 20}), 3: frozenset({16, 17})}
_XID74_WORDS = {
    0: {4: "ECC/parity", 5: "ECC/parity", 21: "marginal signal integrity",
        22: "marginal signal integrity", 27: "report if repeated", 29: "report if repeated"},
    2: {0: "ECC/parity", 1: "ECC/parity", 2: "ECC/parity", 6: "ECC/parity",
        13: "not expected in production", 16: "field diagnostics if repeated",
        19: "field diagnostics if repeated", 17: "report if repeated", 18: "report if repeated"},
    3: {18: "sympathetic, but the fabric needs a reset"},
}  # fmt: skip

# Xid 144–150: `RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040 0x0 ...)`.
_NVL5_UNIT = re.compile(
    r"^,?\s{0,4}(?:pid=[^,]{0,64},\s{0,4})?(?:name=[^,]{0,64},\s{0,4})?(?P<unit>[A-Z][A-Z0-9_]{0,40})"
)
_NVL5_REGS = re.compile(r"\((?P<intr>0x[0-9A-Fa-f]{1,8})[\s,]{1,4}(?P<status>0x[0-9A-Fa-f]{1,8})")
_NVL5_SEVERITY = re.compile(r"\b(?P<word>Fatal|Non-?[Ff]atal|NonFatal)\b")

# Xid 154: `GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)`.
_XID154_TO = re.compile(
    r"\bto\s{1,4}(?P<value>0x[0-9A-Fa-f]{1,8})?\s{0,4}(?:\((?P<name>[^)]{1,40})\))?"
)
# NVML's nvmlDeviceGpuRecoveryAction_t values (the driver prints the same numbers).
_RECOVERY: dict[int, tuple[str, Bucket]] = {
    0: ("None", Bucket.IGNORE),
    1: ("GPU Reset Required", Bucket.RESET_GPU),
    2: ("Node Reboot Required", Bucket.RESTART_BM),
    3: ("Drain P2P", Bucket.RESET_GPU),
    4: ("Drain and Reset", Bucket.RESET_GPU),
    5: ("GPU Reset (bus)", Bucket.RESET_GPU),
}
_RECOVERY_BY_NAME = {name.lower(): value for value, (name, _) in _RECOVERY.items()}


def decode_xid74(rest: str) -> tuple[Bucket, str]:
    """Xid 74's registers → RESET_GPU, or IGNORE when only ignorable bits are set. The
    catalogue's trigger text says a GPU reset or node reboot clears an Xid 74, so a line without
    registers, or with any bit other than the ignorable ones, needs a reset."""
    found = _XID74_REGS.search(rest[:_WINDOW])
    if found is None:
        return Bucket.RESET_GPU, "no registers on the line: a GPU reset clears an Xid 74"
    regs = [int(v, 16) for v in re.findall(r"0x[0-9A-Fa-f]+", found.group(1))]
    bits = [(reg, bit) for reg, value in enumerate(regs) for bit in range(32) if value >> bit & 1]
    if not bits:
        return Bucket.RESET_GPU, "all registers zero: a GPU reset clears an Xid 74"
    named = ", ".join(f"reg{reg} bit {bit} ({_bit_words(reg, bit)})" for reg, bit in bits[:6])
    if all(bit in _XID74_IGNORED.get(reg, ()) for reg, bit in bits):
        return Bucket.IGNORE, f"{named}: ignorable bits only"
    return Bucket.RESET_GPU, f"{named}: the link needs a GPU reset"


def _bit_words(reg: int, bit: int) -> str:
    if bit in _XID74_IGNORED.get(reg, ()):
        return "ignorable" if reg == 0 else "corrected, under threshold"
    if bit in _XID74_SYMPATHETIC.get(reg, ()):
        return "sympathetic"
    if reg == 0 and bit in {8, 9, 12, 16, 17, 24, 28}:
        return "possible link hardware"
    return _XID74_WORDS.get(reg, {}).get(bit, "not in the catalogue")


def decode_nvlink5(code: int, rest: str, units: Sequence[Nvl5Unit]) -> tuple[Bucket, str]:
    """Xid 144–150 by the catalogue's decode sheet: the unit from intrInfo (either driver
    generation's layout), then the error status or link-down reason. A line that cannot be
    decoded follows its own Fatal/Non-fatal word; one without even that is left to a line that
    can be decoded (telemetry's bare code: no action), or, with registers, goes to support."""
    text = rest[:_WINDOW]
    unit_found = _NVL5_UNIT.match(text)
    printed = unit_found["unit"] if unit_found else ""
    regs = _NVL5_REGS.search(text)
    if regs is not None:
        intr, status = int(regs["intr"], 16), int(regs["status"], 16)
        candidates = [u for u in units if u.xid == code]
        named = [u for u in candidates if printed in u.names]
        for unit in named or candidates:
            for layout in ("v1", "v2"):
                bucket = _unit_action(unit, layout, intr, status)
                if bucket is not None:
                    name = printed if printed in unit.names else unit.names[-1]
                    return bucket, (
                        f"{name} intrInfo {intr:#010x} ({layout}), status "
                        f"{status:#010x} → {bucket.value}"
                    )
    severity = _NVL5_SEVERITY.search(text)
    if severity is not None:
        fatal = severity["word"] == "Fatal"
        bucket = Bucket.RESET_GPU if fatal else Bucket.IGNORE
        said = severity["word"]
        return bucket, f"{printed or 'unit ?'} not in the decode sheet; the line says {said}"
    if regs is None:
        return Bucket.IGNORE, "no registers to decode (the kernel line decides)"
    return Bucket.CONTACT_SUPPORT, f"{printed or 'unit ?'} not in the decode sheet"


def _unit_action(unit: Nvl5Unit, layout: str, intr: int, status: int) -> Bucket | None:
    if layout == "v1":
        matches, promoted = (intr & 0x3FF) == int(unit.v1, 2), bool(intr >> 10 & 1)
    else:
        matches, promoted = (intr & 0x7F) == int(unit.v2, 2), bool(intr >> 7 & 1)
    if not matches:
        return None
    reason = intr >> 20 & 0x3F
    if unit.reasons:
        return unit.reasons.get(f"{reason:06b}")
    if reason != int(unit.reason, 2):
        return None
    if unit.any is not None:
        return unit.any
    by_value = {int(k, 16): v for k, v in unit.status.items()}
    bucket = by_value.get(status)
    if bucket is not None and promoted and status in {int(k, 16) for k in unit.promote}:
        return unit.promoted
    return bucket


def decode_xid154(rest: str) -> tuple[Bucket, str]:
    """Xid 154's new recovery action → its bucket: None needs nothing; a GPU reset, a drain of
    peer-to-peer traffic or a drain and reset take the GPU out for a reset; a node reboot, the
    node. Without the value (telemetry's bare code) the kernel line decides."""
    found = _XID154_TO.search(rest[:_WINDOW])
    value: int | None = None
    if found is not None and found["value"]:
        value = int(found["value"], 16)
    elif found is not None and found["name"]:
        value = _RECOVERY_BY_NAME.get(found["name"].strip().lower())
    if value is None:
        return Bucket.IGNORE, "no recovery action on the line (the kernel line decides)"
    if value not in _RECOVERY:
        return Bucket.CONTACT_SUPPORT, f"recovery action {value:#x} is not one NVML names"
    name, bucket = _RECOVERY[value]
    return bucket, f"recovery action {value:#x} ({name}) → {bucket.value}"
