"""Later detections of an interruption the watcher has already handed over, held and handed over
together.

One interruption shows several signs a few seconds apart: a node's Xid line, then its probes
failing, then Slurm's job and node states, then the job's requeue. The first sign starts the
job attempt's recovery at once. Each later one used to be a signal of its own, and each signal a
workflow task and an audit row: when a rack fails, 500 recoveries got some 1,400 of them in the
first minute, on the same server and worker as the recoveries themselves. Now the later signs of
a recovery this watcher handed over are held for ``hold_s`` from the first of them and handed over
together, in one `detections` signal: every one still reaches the recovery's timeline, a few
seconds later. Nothing decides on them there (the recovery reads the job, its nodes and their logs
itself), so nothing waits for them either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relaunch.models.recovery import Detection

# Recoveries remembered as handed over; the oldest are forgotten beyond this (a later sign of
# one of those is then handed over at once, as a first one is: nothing is lost).
MAX_REMEMBERED = 50_000


@dataclass
class Held:
    since: float
    detections: list[Detection] = field(default_factory=list)


class FollowUps:
    """Which recoveries were handed over (by workflow id), and their later signs held."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._handed: dict[str, float] = {}
        self._held: dict[str, Held] = {}

    def handed(self, workflow_id: str, now: float) -> None:
        """A first sign of ``workflow_id`` was handed over at ``now``."""
        self._handed[workflow_id] = now
        if len(self._handed) > MAX_REMEMBERED:  # dicts keep insertion order: oldest first
            for old in list(self._handed)[: len(self._handed) - MAX_REMEMBERED]:
                del self._handed[old]

    def hold(self, groups: dict[str, list[Detection]], now: float) -> list[Detection]:
        """Take the groups of recoveries already handed over out of ``groups`` and hold them;
        the detections held."""
        if self.hold_s <= 0:
            return []
        taken: list[Detection] = []
        for workflow_id in [w for w in groups if w in self._handed]:
            dets = groups.pop(workflow_id)
            self._held.setdefault(workflow_id, Held(now)).detections.extend(dets)
            taken.extend(dets)
        return taken

    def due(self, now: float, *, everything: bool = False) -> dict[str, list[Detection]]:
        """The held signs whose hold is over (all of them with ``everything``), in order;
        they stay held until :meth:`delivered`."""
        return {
            workflow_id: held.detections
            for workflow_id, held in self._held.items()
            if everything or now - held.since >= self.hold_s
        }

    def delivered(self, workflow_id: str) -> None:
        self._held.pop(workflow_id, None)

    def next_due_in(self, now: float) -> float | None:
        """Seconds until the next hold is over; None when nothing is held."""
        if not self._held:
            return None
        return max(0.0, min(h.since for h in self._held.values()) + self.hold_s - now)

    def __len__(self) -> int:
        return sum(len(h.detections) for h in self._held.values())
