"""Resubmission lineage: which job is the resubmission of which (docs/trust.md, "Resubmission
lineage").

A job's comment is its user's to write, so ``relaunch_parent=<id>`` in a comment proves nothing:
any user can claim to be any job's resubmission. A job is a resubmission (a *child*) only when
Relaunch itself submitted it, which the audit trail says:

* before ``sbatch`` runs, the restart step records its intent: the parent, the parent's uid and
  the digest of a random nonce that only this attempt knows (``resubmit_intent`` row);
* the child carries the nonce in its comment (``relaunch_nonce=<nonce>``);
* right after ``sbatch`` answers, the step records the child's id (``lineage`` row). Every reader
  of lineage (planning, the console, the scorecard) reads these rows, never a comment.

A worker that dies between ``sbatch`` and the ``lineage`` row leaves a child nobody recorded;
its retry finds it by :func:`submitted_earlier`. Anyone may read a submitted job's comment and
copy its nonce, but only after the child exists (so a copy is always submitted later), and only
the parent's own user (or root) can make a job run as the parent's uid.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Collection, Iterable

from relaunch.models.errors import InvalidNameError
from relaunch.models.scheduler import Job

NONCE_KEY = "relaunch_nonce"
NONCE_BYTES = 12  # 96 random bits, 24 hex characters (a comment holds 250 at most)
_NONCE = re.compile(r"[0-9a-f]{24}")
# A recovery reads at most this many generations of a job's lineage.
MAX_DEPTH = 20


def new_nonce() -> str:
    """A fresh nonce for one submission attempt."""
    return secrets.token_hex(NONCE_BYTES)


def checked_nonce(value: object) -> str:
    """``value`` if it is a nonce :func:`new_nonce` could have made."""
    if not isinstance(value, str) or not _NONCE.fullmatch(value):
        raise InvalidNameError(
            f"invalid nonce {value!r}", hint=f"a nonce must match {_NONCE.pattern}"
        )
    return value


def nonce_digest(nonce: str) -> str:
    """What the audit trail keeps of a nonce (the nonce itself appears only in the child)."""
    return hashlib.sha256(nonce.encode()).hexdigest()


def same_user(parent: Job, child: Job) -> bool:
    """Whether ``child`` runs as ``parent``'s user: the same uid from Slurm's JSON (the name,
    which Slurm derives from the uid, only where Slurm listed no uid for the parent)."""
    if parent.user_id is not None:
        return child.user_id == parent.user_id
    return bool(parent.user) and child.user == parent.user


def _order(job: Job) -> tuple[int, str]:
    return (int(job.job_id), "") if job.job_id.isdigit() else (1 << 62, job.job_id)


def submitted_earlier(parent: Job, jobs: Iterable[Job], digests: Collection[str]) -> Job | None:
    """The resubmission of ``parent`` that an earlier attempt submitted and died before
    recording, or None: among ``jobs``, those whose comment carries a nonce whose digest the
    audit trail recorded (``digests``, written before that attempt's ``sbatch``) and that run as
    the parent's user, the first submitted (the lowest job id: a copy of the nonce can only be
    made once the real child is listed, so it always comes later)."""
    if not digests:
        return None
    found = [
        job
        for job in jobs
        if job.job_id != parent.job_id
        and _NONCE.fullmatch(nonce := job.comment_fields.get(NONCE_KEY, ""))
        and nonce_digest(nonce) in digests
        and same_user(parent, job)
    ]
    return min(found, key=_order) if found else None
