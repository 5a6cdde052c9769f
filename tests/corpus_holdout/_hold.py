"""Helpers for make_holdout.py that tests/corpus/_lib.py does not have.

The job-log builder (``Job``) is reused from tests/corpus/_lib.py (imported, not copied). What is
new here: node logs whose syslog stamps carry a time zone (ISO with an offset, or BSD stamps in
the node's local time), compact cascades that keep 64- and 128-rank bundles under 100 KB, and
hostlist-compressed srun lines. Every line follows a format of docs/failure-signatures.md.
"""

from __future__ import annotations

import random
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "corpus"))

from _lib import Job  # noqa: E402

S = timedelta(seconds=1)
M = timedelta(minutes=1)


class KLog:
    """One node's kernel/syslog lines; ``tz`` is the node's UTC offset in minutes.

    Styles: ``iso`` (``2026-03-14T03:12:40.123456+01:00 host kernel: [ up] text``), ``isoj``
    (the same without the uptime stamp, as journald forwards it), ``bsd`` (local time, no zone),
    ``raw`` (``<3>[ up] text``), ``caller`` (``[ up][ T1946] text``) and ``dmesg``.
    """

    def __init__(self, node: str, style: str, tz: int, boot: datetime, rng: random.Random):
        self.node, self.style, self.rng = node, style, rng
        self.zone = timezone(timedelta(minutes=tz))
        self.boot = boot
        self.rows: list[tuple[datetime, str]] = []

    def _up(self, when: datetime) -> str:
        s = (when - self.boot).total_seconds() + self.rng.random()
        whole = int(s)
        return f"[{whole:6d}.{int((s - whole) * 1e6):06d}]"

    def _stamp(self, when: datetime) -> str:
        loc = when.astimezone(self.zone)
        if self.style in ("iso", "isoj"):
            if not loc.microsecond:
                loc = loc.replace(microsecond=self.rng.randint(0, 999999))
            return loc.isoformat(timespec="microseconds")
        return f"{loc:%b} {loc.day:>2} {loc:%H:%M:%S}"

    def kern(self, when: datetime, text: str, level: int = 3) -> None:
        st, up = self.style, self._up(when)
        if st in ("iso", "bsd"):
            line = f"{self._stamp(when)} {self.node} kernel: {up} {text}"
        elif st == "isoj":
            line = f"{self._stamp(when)} {self.node} kernel: {text}"
        elif st == "raw":
            line = f"<{level}>{up} {text}"
        elif st == "caller":
            line = f"{up}[{'T' + str(self.rng.randint(700, 3900)):>6}] {text}"
        else:
            line = f"{up} {text}"
        self.rows.append((when, line))

    def daemon(self, when: datetime, proc: str, text: str) -> None:
        if self.style not in ("iso", "isoj", "bsd"):
            return
        self.rows.append((when, f"{self._stamp(when)} {self.node} {proc}: {text}"))

    def noise(self, start: datetime, end: datetime, n: int, job_id: str) -> None:
        rng = self.rng
        span = max(1, int((end - start).total_seconds()))
        for _ in range(n):
            when = start + timedelta(seconds=rng.randint(0, span))
            k = rng.randint(0, 8)
            if k == 0:
                self.daemon(
                    when,
                    "systemd[1]",
                    f"Started session-c{rng.randint(100, 999)}.scope - Session "
                    f"c{rng.randint(100, 999)} of User slurm.",
                )
            elif k == 1:
                self.daemon(
                    when,
                    f"chronyd[{rng.randint(800, 1300)}]",
                    "Selected source 10.1.0.3 (time2.site.example.net)",
                )
            elif k == 2:
                self.daemon(
                    when,
                    f"slurmd[{rng.randint(1800, 2600)}]",
                    f"slurmd: launch task StepId={job_id}.0 request from UID:20417 GID:20417 "
                    f"HOST:10.1.0.9 PORT:{rng.randint(20000, 60000)}",
                )
            elif k == 3:
                self.kern(
                    when,
                    f"mlx5_cmd_out_err:838:(pid {rng.randint(100000, 999999)}): ACCESS_REG(0x805)"
                    " op_mod(0x1) failed, status bad operation(0x2), syndrome (0x305684), "
                    "err(-22)",
                    level=6,
                )
            elif k == 4:
                self.kern(
                    when,
                    f"perf: interrupt took too long ({rng.randint(2600, 3900)} > "
                    f"{rng.randint(2400, 2590)}), lowering kernel.perf_event_max_sample_rate to "
                    f"{rng.randint(40000, 79000)}",
                    level=4,
                )
            elif k == 5:
                self.daemon(
                    when,
                    f"CRON[{rng.randint(30000, 90000)}]",
                    "(root) CMD (/usr/sbin/nhc -q)",
                )
            elif k == 6:
                self.daemon(
                    when,
                    f"sshd[{rng.randint(3000, 9000)}]",
                    f"Accepted publickey for slurm from 10.1.0.9 port {rng.randint(30000, 60000)}"
                    " ssh2: ED25519 SHA256:3fQz9",
                )
            elif k == 7:
                self.daemon(
                    when,
                    "systemd-logind[1203]",
                    f"Removed session c{rng.randint(100, 999)}.",
                )
            else:
                self.daemon(
                    when,
                    f"nvidia-persistenced[{rng.randint(1400, 1700)}]",
                    "Verbose syslog connection opened",
                )

    def text(self) -> str:
        return "".join(line + "\n" for _, line in sorted(self.rows, key=lambda r: r[0]))


def klog(
    J: Job, node: str, style: str, tz: int = 0, noise: int = 8, boot_days: int | None = None
) -> KLog:
    """The node log of ``node`` in ``J`` (created once, with benign noise around the job)."""
    if node not in J.nodelogs:
        days = boot_days if boot_days is not None else J.rng.randint(2, 60)
        boot = J.start - timedelta(days=days, seconds=J.rng.randint(0, 86000))
        kl = KLog(node, style, tz, boot, J.rng)
        kl.noise(J.start - timedelta(hours=3), J.start + timedelta(hours=4), noise, J.job_id)
        J.nodelogs[node] = kl  # type: ignore[assignment]
    return J.nodelogs[node]  # type: ignore[return-value]


def tasks(lst: list[int]) -> str:
    """``task 3`` or ``tasks 0-7,9`` as srun prints them."""
    lst = sorted(lst)
    if len(lst) == 1:
        return f"task {lst[0]}"
    runs, start, prev = [], lst[0], lst[0]
    for x in [*lst[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        if x is not None:
            start = prev = x
    return "tasks " + ",".join(runs)


def short_timeout(J: Job, r: int, when: datetime, seq: int, op: str = "ALLREDUCE") -> None:
    """Watchdog timeout plus the one-line teardown (keeps big cascades small), §2.1."""
    J.wd_timeout(r, when, seq, op, teardown=False)
    if J.pt == "new":
        J.c10(
            r,
            when + timedelta(milliseconds=31),
            "E",
            1601,
            "To avoid data inconsistency, we are taking the entire process down.",
        )
    else:
        J.c10(
            r,
            when + timedelta(milliseconds=31),
            "E",
            915,
            "Some NCCL operations have failed or timed out. Due to the asynchronous nature of "
            "CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data. To "
            "avoid this inconsistency, we are taking the entire process down.",
        )


def others(J: Job, skip: list[int]) -> list[int]:
    return [r for r in range(J.world) if r not in skip]
