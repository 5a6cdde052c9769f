"""Who Temporal says sent a decision. An approval names its approver (`Approval.by`), a name the
sender chose: anyone who reaches the Temporal frontend can signal `approve` with any name. The
audit row of an approval or rejection also keeps the identity Temporal recorded for the signal or
update that carried it (the sending client's `identity`; what makes it trustworthy, mTLS and
Temporal's authorizer: docs/production.md, "Who may approve")."""

from __future__ import annotations

import asyncio
import logging

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

log = logging.getLogger(__name__)

# A decision arrives as one of these signals (`temporal workflow signal`) or as the `decide`
# update (`relaunch approve`, the console).
DECISION_SIGNALS = {"approve": "approve", "reject": "reject"}
DECIDE_UPDATE = "decide"
LOOKUP_TIMEOUT_S = 10.0
IDENTITY_MAX = 200


async def decision_sender(
    client: Client, workflow_id: str, run_id: str | None, decision: str
) -> dict[str, str]:
    """The identity and the way (``signal`` or ``update``) of the latest decision ``decision``
    (``approve`` or ``reject``) in the workflow's history; {} when none is found or the history
    cannot be read in time (the row is written without it, never held back)."""
    try:
        return await asyncio.wait_for(
            _latest(client, workflow_id, run_id, decision), LOOKUP_TIMEOUT_S
        )
    except Exception as exc:  # noqa: BLE001 - an audit detail: said, and the row written anyway
        log.warning("no sender identity for %s's %s: %s", workflow_id, decision, exc)
        return {}


async def _latest(
    client: Client, workflow_id: str, run_id: str | None, decision: str
) -> dict[str, str]:
    found: dict[str, str] = {}
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            attrs = event.workflow_execution_signaled_event_attributes
            if DECISION_SIGNALS.get(attrs.signal_name) == decision:
                found = {"identity": attrs.identity[:IDENTITY_MAX], "via": "signal"}
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == DECIDE_UPDATE:
                found = {"identity": request.meta.identity[:IDENTITY_MAX], "via": "update"}
    return found
