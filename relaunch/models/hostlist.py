"""Slurm hostlist expressions: ``n[1-3,7]``, ``gpu-a[01-04]``, ``r[1-2]-n[01-02]``, ``a,b[1-2]``."""

from __future__ import annotations

import itertools
import re

from relaunch.models.errors import InvalidNameError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_BRACKETS = re.compile(r"\[([^\]]*)\]")
# Whatever the caller's bound, no expression expands to more names than this (a 52-byte
# ``a[0-999][0-999][0-999]`` would otherwise be a billion strings).
DEFAULT_MAX_HOSTS = 65_536
# Longer numbers are no node index (and int() of thousands of digits is slow or refused).
_MAX_DIGITS = 18


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise InvalidNameError(f"nested brackets in hostlist {_short(expr)}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise InvalidNameError(f"unbalanced ']' in hostlist {_short(expr)}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise InvalidNameError(f"unbalanced '[' in hostlist {_short(expr)}")
    parts.append(expr[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _short(expr: str) -> str:
    """The expression for an error message: a hostile one may be megabytes long."""
    return repr(expr if len(expr) <= 80 else expr[:77] + "...")


def _ranges(body: str, expr: str) -> list[tuple[int, int, int]]:
    """A bracket's ranges as (low, high, zero-padded width), checked but not expanded."""
    out: list[tuple[int, int, int]] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item.strip())
        if not m:
            raise InvalidNameError(f"bad range {_short(item)} in hostlist {_short(expr)}")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        if max(len(lo_text), len(hi_text)) > _MAX_DIGITS:
            raise InvalidNameError(f"number too long in hostlist {_short(expr)}")
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise InvalidNameError(f"descending range {_short(item)} in hostlist {_short(expr)}")
        out.append((lo, hi, len(lo_text) if lo_text.startswith("0") else 0))
    return out


def count(expr: str | None) -> int:
    """How many names :func:`expand` would give, computed without expanding them."""
    if not expr or expr.strip() in {"", "(null)", "None"}:
        return 0
    return sum(_count_part(p, expr) for p in _split_top_level(expr.strip()))


def _count_part(part: str, expr: str) -> int:
    total = 1
    for m in _BRACKETS.finditer(part):
        total *= sum(hi - lo + 1 for lo, hi, _ in _ranges(m.group(1), expr))
        if total > 1 << 62:  # already past any bound; stop multiplying huge numbers
            return total
    return total


def expand(expr: str | None, *, limit: int | None = None) -> list[str]:
    """Expand a hostlist expression into host names, in Slurm's order.

    At most ``limit`` names (the caller's bound: a job's allocation, a cluster's node count),
    and never more than :data:`DEFAULT_MAX_HOSTS`: the size is counted before anything is
    expanded, and an expression over the bound raises :class:`InvalidNameError` at once.

    >>> expand("gpu-a[01-03],n7")
    ['gpu-a01', 'gpu-a02', 'gpu-a03', 'n7']
    """
    if not expr or expr.strip() in {"", "(null)", "None"}:
        return []
    bound = min(limit, DEFAULT_MAX_HOSTS) if limit is not None else DEFAULT_MAX_HOSTS
    parts = _split_top_level(expr.strip())
    total = 0
    for part in parts:
        total += _count_part(part, expr)
        if total > bound:
            raise InvalidNameError(f"hostlist {_short(expr)} names more than {bound} hosts")
    hosts: list[str] = []
    for part in parts:
        pieces: list[list[str]] = []
        pos = 0
        for m in _BRACKETS.finditer(part):
            pieces.append([part[pos : m.start()]])
            pieces.append(
                [
                    str(v).zfill(width)
                    for lo, hi, width in _ranges(m.group(1), expr)
                    for v in range(lo, hi + 1)
                ]
            )
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
        stem = host.rstrip("0123456789")
        if stem == host or len(host) - len(stem) > _MAX_DIGITS:
            singles.append(host)
            order.append(host)
            continue
        # Split by hand: a regex with a lazy prefix backtracks quadratically on long names.
        prefix, digits = stem, host[len(stem) :]
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
