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


class SshUnavailableError(ControllerUnavailableError):
    """The SSH host in front of Slurm cannot be reached, or the connection dropped while a
    command ran (it may or may not have run); retry later."""


class SshHostKeyError(SchedulerError):
    """The SSH host's key is not in the known_hosts file, or differs from the key recorded
    there. Never retried: a human must check the key."""


class SshAuthError(SchedulerError):
    """The SSH host refused the client key, or the key file cannot be read."""


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


class RefusedPathError(RelaunchError):
    """A file a job named (its stdout/stderr) that Relaunch will not read: not a regular file,
    a symbolic link, outside the allowed roots, or not readable by the job's own user."""


class ResubmitIdentityError(InvalidStateError):
    """A resubmission that could not run as the job's own user (the submitting identity can
    neither pass ``--uid`` nor is it that user). Never retried: the configuration must change."""


class StackError(RelaunchError):
    """The local development stack could not be started, stopped or inspected."""


class LogStoreError(RelaunchError):
    """A log store (Loki, VictoriaLogs) refused or failed a query; retrying will not help."""


class LogStoreUnavailableError(LogStoreError):
    """The log store cannot be reached, timed out, or answered 5xx / 429; retry later."""

    retryable = True


class LogQueryError(LogStoreError):
    """The log store rejected the query itself (HTTP 400): its own error text is in the message."""


class LogStoreAuthError(LogStoreError):
    """The log store refused the credentials or the tenant (HTTP 401 / 403)."""
