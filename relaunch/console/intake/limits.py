"""How much one intake token may push in: a token bucket per sender's token.

Each token may push ``intake_burst`` events at once and ``intake_events_per_minute`` on average
(ConsoleSettings); a request whose events do not fit is refused whole with 429 and a
Retry-After (the seconds until they would), before anything is recorded, so that one sender
can neither fill the audit trail nor crowd another sender's events out of a recovery's
evidence. The buckets live in the console's process: a restart refills them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_SENDERS = 10_000  # buckets kept; the tokens file names the senders, so this is never reached


@dataclass
class _Bucket:
    level: float
    at: float


@dataclass
class IntakeLimits:
    """Per-token buckets: ``take(key, n)`` spends ``n`` events or says how long to wait."""

    per_minute: int
    burst: int
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def take(self, key: str, n: int) -> float | None:
        """Spend ``n`` events of ``key``'s bucket: None when they fit, else the seconds until
        they would (nothing is spent then). A request of more than ``burst`` events costs
        ``burst``: it waits for a full bucket, and is never refused for good."""
        now, rate = self.clock(), self.per_minute / 60.0
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_SENDERS:
                self._buckets.clear()
            bucket = self._buckets[key] = _Bucket(float(self.burst), now)
        bucket.level = min(float(self.burst), bucket.level + (now - bucket.at) * rate)
        bucket.at = now
        cost = min(n, self.burst)
        if bucket.level >= cost:
            bucket.level -= cost
            return None
        return (cost - bucket.level) / rate


def retry_after(seconds: float) -> str:
    """A Retry-After header's value: whole seconds, at least one."""
    return str(max(1, math.ceil(seconds)))
