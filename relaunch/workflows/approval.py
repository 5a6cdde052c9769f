"""The approval gate the three workflows that ask a person share (a recovery, a node decision,
a node lifecycle): one decision taken once, the refusal of one none awaits, and the words for
one taken."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.models.recovery import Approval, Decision, DecisionInput

PAST = {Decision.APPROVE: "approved", Decision.REJECT: "rejected"}


class NotAwaitingApprovalError(ApplicationError):
    """A decision the workflow does not take now: it awaits none, or one was already made."""

    def __init__(self, why: str) -> None:
        super().__init__(why, type="NotAwaitingApproval", non_retryable=True)


class Gate:
    """The decision a workflow awaits from a person (a recovery, a node decision, a node
    lifecycle): taken once, by the `decide` update, whose validator refuses one not awaited, or
    by the `approve` / `reject` signals (the Temporal UI's), ignored and said when not awaited."""

    def __init__(self) -> None:
        self.taken: tuple[Decision, Approval] | None = None

    def why_not(self, awaiting: bool, stage: str) -> str | None:
        """Why no decision is taken now (None: one is awaited)."""
        if self.taken is not None:
            decision, by = self.taken
            return f"already {PAST[decision]} by {by.by}"
        return None if awaiting else f"not awaiting approval (stage {stage})"

    def validate(self, inp: DecisionInput, why: str | None) -> None:
        """The `decide` update's validator: refuse a decision not awaited, saying why."""
        if why is not None:
            raise NotAwaitingApprovalError(f"{inp.decision.value} refused: {why}")

    def offer(self, decision: Decision, approval: Approval, why: str | None) -> bool:
        """A signalled decision: taken when one is awaited (True); otherwise ignored."""
        if why is None:
            self.taken = (decision, approval)
            return True
        workflow.logger.warning("ignored %s by %s: %s", decision.value, approval.by, why)
        return False
