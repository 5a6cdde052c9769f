"""Slurm hostlist expressions: ``n[1-3,7]``, ``gpu-a[01-04]``, ``r[1-2]-n[01-02]``, ``a,b[1-2]``."""

from __future__ import annotations

import itertools
import re

from relaunch.models.errors import InvalidNameError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_MAX_HOSTS = 1_000_000


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise InvalidNameError(f"nested brackets in hostlist {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidNameError(f"unbalanced ']' in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise InvalidNameError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append(expr[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _expand_ranges(body: str, expr: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise InvalidNameError(f"bad range {item!r} in hostlist {expr!r}")
        lo_text, hi_text = m.group(1), m.group(2)
        if hi_text is None:
            values.append(lo_text)
            continue
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise InvalidNameError(f"descending range {item!r} in hostlist {expr!r}")
        if hi - lo > _MAX_HOSTS:
            raise InvalidNameError(f"range {item!r} too large in hostlist {expr!r}")
        width = len(lo_text) if lo_text.startswith("0") else 0
        values.extend(str(v).zfill(width) for v in range(lo, hi + 1))
    return values


def expand(expr: str | None) -> list[str]:
    """Expand a hostlist expression into host names, in Slurm's order.

    >>> expand("gpu-a[01-03],n7")
    ['gpu-a01', 'gpu-a02', 'gpu-a03', 'n7']
    """
    if not expr or expr.strip() in {"", "(null)", "None"}:
        return []
    hosts: list[str] = []
    for part in _split_top_level(expr.strip()):
        pieces: list[list[str]] = []
        pos = 0
        for m in re.finditer(r"\[([^\]]*)\]", part):
            pieces.append([part[pos : m.start()]])
            pieces.append(_expand_ranges(m.group(1), expr))
            pos = m.end()
        pieces.append([part[pos:]])
        hosts.extend("".join(combo) for combo in itertools.product(*pieces))
    return hosts


def compress(hosts: list[str]) -> str:
    """The inverse of :func:`expand` for the common case of one numeric suffix per host.

    >>> compress(["n1", "n2", "n3", "n7"])
    'n[1-3,7]'
    """
    groups: dict[tuple[str, int], list[int]] = {}
    singles: list[str] = []
    order: list[tuple[str, int] | str] = []
    for host in hosts:
        m = re.fullmatch(r"(.*?)(\d+)", host)
        if not m:
            singles.append(host)
            order.append(host)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        if not width and (prefix, len(digits)) in groups:
            width = len(digits)  # n10 continues n[08-09] as Slurm does: n[08-10]
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, width = item
        nums = sorted(set(groups[item]))
        if len(nums) == 1:
            out.append(f"{prefix}{str(nums[0]).zfill(width)}")
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for n in [*nums[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            a, b = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(a if start == prev else f"{a}-{b}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
