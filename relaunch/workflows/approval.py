"""What the three workflows that ask a person share: the refusal of a decision none awaits,
and the words for one taken."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.models.recovery import Decision

PAST = {Decision.APPROVE: "approved", Decision.REJECT: "rejected"}


class NotAwaitingApprovalError(ApplicationError):
    """A decision the recovery does not take now: it awaits none, or one was already made."""

    def __init__(self, why: str) -> None:
        super().__init__(why, type="NotAwaitingApproval", non_retryable=True)
