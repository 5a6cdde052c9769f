"""Typed errors. Each says whether retrying may help and, where it can, what to do about it."""

from __future__ import annotations


class RelaunchError(Exception):
    """Base of every error Relaunch raises on purpose.

    ``retryable`` tells callers (and the Temporal activity boundary) whether the same call may
    succeed later; ``hint`` is one line a human can act on.
    """

    retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class InvalidNameError(RelaunchError, ValueError):
    """A node, job id, partition or reason that must not reach a command line."""


class SchedulerError(RelaunchError):
    """A scheduler command or request failed in a way not covered by a narrower class."""


class ControllerUnavailableError(SchedulerError):
    """The scheduler's controller does not answer; retry later."""

    retryable = True


class SchedulerTimeoutError(SchedulerError):
    """A scheduler command did not finish within its timeout."""

    retryable = True


class JobNotFoundError(SchedulerError):
    """The scheduler does not know this job id."""


class NodeNotFoundError(SchedulerError):
    """The scheduler does not know this node."""


class InvalidStateError(SchedulerError):
    """The action does not apply to the object's current state (for example, excluding nodes
    on a job that is already running)."""


class VerificationError(SchedulerError):
    """An action returned success but a fresh read does not show its effect."""

    retryable = True


class StackError(RelaunchError):
    """The local development stack could not be started, stopped or inspected."""
