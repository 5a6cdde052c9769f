"""Strict patterns for every name that can reach a command line.

Slurm itself accepts more than these patterns; Relaunch deliberately accepts less, so that no
value read from a log, a webhook or a user can smuggle an option or a shell word into a command.
"""

from __future__ import annotations

import re

from relaunch.models.errors import InvalidNameError, RelaunchError

_NODE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_JOB_ID = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10})?(?:\+[0-9]{1,4})?")
_PARTITION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
# Reason text goes to `scontrol ... reason=<text>` as one argv element; it is still kept to
# printable ASCII without quotes or shell metacharacters so that it reads the same everywhere
# (including over SSH, where the remote side re-parses the command line).
_REASON = re.compile(r"[A-Za-z0-9 _.,:/@#()+=-]{1,200}")
# A job comment is copied from Slurm's own record onto a resubmission; printable ASCII only.
_COMMENT = re.compile(r"[\x20-\x7e]{0,250}")


def _check(kind: str, value: object, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidNameError(
            f"invalid {kind} {value!r}",
            hint=f"a {kind} must match {pattern.pattern}",
        )
    return value


def node_name(value: object) -> str:
    """Return ``value`` if it is a safe node name, else raise InvalidNameError."""
    return _check("node name", value, _NODE)


def job_id(value: object) -> str:
    """Return ``value`` (an int or a digit string, optionally ``N_M`` for an array task)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return _check("job id", value, _JOB_ID)


def partition(value: object) -> str:
    """Return ``value`` if it is a safe partition name."""
    return _check("partition", value, _PARTITION)


def cluster_name(value: object) -> str:
    """Return ``value`` if it is a safe cluster name."""
    return _check("cluster name", value, _CLUSTER)


def user_name(value: object) -> str:
    """Return ``value`` if it is a safe POSIX user name."""
    return _check("user name", value, _USER)


def reason(value: object) -> str:
    """Return ``value`` if it is a safe drain/hold reason."""
    return _check("reason", value, _REASON)


def comment(value: object) -> str:
    """Return ``value`` if it is a safe job comment."""
    return _check("comment", value, _COMMENT)


# Who did something (`--by`, a console user's name): it reaches the audit trail and pages,
# never a command line.
_PERSON = re.compile(r"[\w][\w .@+-]{0,63}")


def person(by: str, doing: str, error: type[RelaunchError] = InvalidNameError) -> str:
    """``by`` stripped, checked as a name of who ``doing`` (``"pauses"``): letters, digits
    and `` .@+-_``, at most 64 characters; ``error`` (saying so) otherwise."""
    name = by.strip()
    if not _PERSON.fullmatch(name):
        raise error(
            f"invalid name {name[:80]!r} for who {doing}",
            hint="--by: letters, digits, spaces and . @ + - _ (at most 64)",
        )
    return name
