"""How a node lifecycle hands its node to repair and waits for it
(relaunch/workflows/lifecycle.py): the repair ticket, the node drained with it as the reason, the
wait for the `returned` signal (weeks, continuing as new), and the validation after it."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.lifecycle import LifecycleActivities
    from relaunch.models.lifecycle import (
        CheckRun,
        EscalateInput,
        LifecycleCarry,
        LifecycleFault,
        LifecycleInput,
        NodeStage,
        NodeStepInput,
        RepairReturn,
        Rung,
    )
    from relaunch.models.recovery import Approval, AutoAction
    from relaunch.workflows.calls import NODE_CHANGE, NodeRows, call

# While the node waits for its repair, the lifecycle wakes this often to start afresh
# (continue-as-new) where Temporal suggests it: it may wait for weeks.
REPAIR_WAKE = timedelta(days=1)


class Escalate(Exception):
    """Go to repair, for this reason."""


class Repair(NodeRows):
    """The lifecycle's repair; its state and the steps it shares are the lifecycle's."""

    _input: LifecycleInput | None
    _faults: list[LifecycleFault]
    _ladder: list[Rung]
    _tried: list[Rung]
    _runs: list[CheckRun]
    _repaired: RepairReturn | None
    _ticket: str
    _outcome: str
    _visits: int
    _decisions: int

    if TYPE_CHECKING:

        def _step(self) -> NodeStepInput: ...
        def _asks(self, action: AutoAction) -> bool: ...
        async def _ask(self, step: str, summary: str) -> Approval: ...
        async def _checks(self, purpose: str, *, ask: bool = False) -> CheckRun: ...
        async def _hold(self, why: str = "checks failed") -> None: ...
        async def _return(self, why: str) -> None: ...
        async def _stage_to(self, stage: NodeStage, summary: str, **data: object) -> None: ...

    async def _repair(self, why: str, *, waiting: bool = False) -> None:
        """Hand the node to repair and wait until someone says it is repaired; then validate it
        and return it, or hand it back. ``waiting``: handed over already (continued as new)."""
        inp = self._input
        assert inp is not None
        while True:
            if not waiting:
                await self._hand_over(why)
            waiting = False
            await self._until_repaired(why)
            repair = self._repaired
            assert repair is not None
            await self._record(
                "repaired",
                f"{inp.node} repaired, says {repair.by}"
                + (f" (ticket {repair.ticket})" if repair.ticket else "")
                + (f": {repair.note}" if repair.note else ""),
                actor=repair.by,
                dedupe=f"repaired:{self._visits}",
                data=repair.model_dump(mode="json"),
            )
            await self._stage_to(NodeStage.VALIDATING, f"validating {inp.node} after its repair")
            try:
                run = await self._checks("validate after repair")
                if run.passed:
                    await self._return("validated after repair: " + run.summary())
                    return
                await self._hold()
                why = f"failed its checks after the repair: {run.summary()}"
                if run.inconclusive:
                    why = f"the checks after the repair were inconclusive: {run.inconclusive}"
            except Escalate as again:
                why = str(again)
            except ActivityError as err:
                why = f"the checks could not run: {err.cause or err}"

    async def _hand_over(self, why: str) -> None:
        """The repair ticket, and the node drained with it as the reason."""
        inp = self._input
        assert inp is not None
        if self._asks(AutoAction.REPAIR_TICKET):
            try:
                await self._ask("repair_ticket", f"post a repair ticket for {inp.node}: {why}")
            except Escalate as no:
                self._outcome = f"{inp.node} waits for a person: {why}"
                await self._stage_to(
                    NodeStage.ESCALATED,
                    f"{self._outcome}; no repair ticket ({no}): the node stays out until someone "
                    "says it is repaired",
                    ticket="",
                    why=why,
                )
                return
        try:
            ticket = await call(
                LifecycleActivities.escalate,
                EscalateInput(
                    **self._step().model_dump(),
                    faults=self._faults,
                    runs=self._runs[-3:],
                    tried=self._tried,
                    why=why,
                ),
                NODE_CHANGE,
                f"repair ticket for {inp.node}",
            )
            self._ticket = ticket.ticket
            detail = ticket.detail
        except ActivityError as err:
            detail = f"the ticket could not be posted ({err.cause or err}); the node stays out"
        self._outcome = f"{inp.node} to repair: {why}"
        await self._stage_to(
            NodeStage.ESCALATED, f"{self._outcome}; {detail}", ticket=self._ticket, why=why
        )

    async def _until_repaired(self, why: str) -> None:
        """Wait for the `returned` signal, waking daily to continue as new where the history
        has grown long (a node may wait weeks for a part)."""
        inp = self._input
        assert inp is not None
        self._repaired = None
        while self._repaired is None:
            try:
                await workflow.wait_condition(
                    lambda: self._repaired is not None,
                    timeout=REPAIR_WAKE,
                    timeout_summary="repair",
                )
            except TimeoutError:
                if workflow.info().is_continue_as_new_suggested():
                    workflow.continue_as_new(
                        inp.model_copy(
                            update={
                                "carry": LifecycleCarry(
                                    faults=self._faults,
                                    ladder=self._ladder,
                                    tried=self._tried,
                                    runs=self._runs[-3:],
                                    ticket=self._ticket,
                                    visits=self._visits,
                                    decisions=self._decisions,
                                    why=why,
                                )
                            }
                        )
                    )
