"""The kill switch: a cluster paused by a person stops every change Relaunch makes to it.

A pause or an unpause is one audit row (kind ``pause`` or ``unpause``) under the cluster's
``control-<cluster>`` record: who, when, why. The latest of them is the cluster's state. While
paused, every activity that would change the cluster (drain, fence, requeue, hold, resubmit,
resume, reservation, check job, reboot, GPU reset, repair ticket) refuses with
:class:`ClusterPausedError` before it touches anything; the workflow that called it waits and
calls it again, so an approved action happens after the unpause without anyone redoing it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from relaunch.models.errors import RelaunchError

PAUSE = "pause"
UNPAUSE = "unpause"
# The error type the workflows wait out (the activity boundary names errors by class).
PAUSED_ERROR = "ClusterPausedError"


def control_incident(cluster: str) -> str:
    """The audit record a cluster's pauses and unpauses belong to (every audit row names one)."""
    return f"control-{cluster}"


class PauseState(BaseModel):
    """Whether a cluster is paused now: the latest pause or unpause row (none: running)."""

    cluster: str
    paused: bool = False
    by: str = Field(default="", description="who paused (or unpaused) it")
    reason: str = ""
    at: datetime | None = None

    def describe(self) -> str:
        if not self.paused:
            return f"cluster {self.cluster} is not paused"
        why = f": {self.reason}" if self.reason else ""
        return f"cluster {self.cluster} is paused by {self.by}{why}"


class ClusterPausedError(RelaunchError):
    """The cluster is paused: nothing that changes it may run. Retried by Temporal within the
    step's retry policy (no history events); when those attempts are spent, the workflow waits
    on a timer and calls the step again (relaunch/workflows/calls.py: ``call``)."""

    retryable = True

    def __init__(self, state: PauseState) -> None:
        super().__init__(state.describe(), hint="`relaunch unpause` lets it act again")
        self.state = state
