"""How a workflow calls its activities: the timeout and retry policy of each family of steps,
waiting out an outage of PostgreSQL or Slurm and a paused cluster on durable timers, and the
audit rows a node's workflow writes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from relaunch.activities.evidence import EvidenceActivities
    from relaunch.models.pause import PAUSED_ERROR
    from relaunch.models.recovery import RecordEventInput

A = TypeVar("A")
R = TypeVar("R")


@dataclass(frozen=True)
class CallPolicy:
    """A named timeout and retry policy for a family of activities."""

    timeout: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None
    # Retries stop when this much time has passed since the first attempt (None: only the
    # retry policy's attempts limit them).
    give_up_after: timedelta | None = None
    # Run locally (audit rows, a look at a job): backoffs longer than this wait on a workflow
    # timer, not in the worker.
    local_retry_threshold: timedelta | None = None


# How long the steps that write or read the audit trail (and read Slurm) keep retrying through
# an outage of PostgreSQL or the Slurm controller: a recovery waits out a failover or a
# maintenance window, and goes on where it stopped, instead of failing for good. Each attempt's
# error is in the worker's log; only errors typed non-retryable end the step at once.
OUTAGE_TOLERANCE = timedelta(hours=24)
# Capped backoff: 1 s doubling to once every 30 s, so a recovery resumes within half a minute
# of the database's return, and hundreds of waiting recoveries cost the database little.
OUTAGE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # unlimited: OUTAGE_TOLERANCE bounds them
)
# The audit rows and the looks at a restarted job run as local activities: in the worker, inside
# the workflow task, without a round trip through the server's task queues (when a switch takes
# out a rack, hundreds of recoveries start at once). A local activity retries inside its
# workflow task, which the worker keeps alive with a workflow-task heartbeat every few seconds;
# from a backoff of 16 s on, each retry waits on a workflow timer instead: a 30-minute outage
# adds about 60 timers to the history rather than hundreds of heartbeat tasks.
LOCAL_RETRY_THRESHOLD = timedelta(seconds=10)

RECORD = CallPolicy(
    timedelta(seconds=15),
    OUTAGE_RETRY,
    give_up_after=OUTAGE_TOLERANCE,
    local_retry_threshold=LOCAL_RETRY_THRESHOLD,
)
OBSERVE = CallPolicy(
    timedelta(seconds=90),
    OUTAGE_RETRY,
    give_up_after=OUTAGE_TOLERANCE,
    local_retry_threshold=LOCAL_RETRY_THRESHOLD,
)
ACT = CallPolicy(
    timedelta(seconds=120),
    RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_interval=timedelta(seconds=20),
        maximum_attempts=5,
        non_retryable_error_types=["InvalidNameError", "InvalidStateError", "JobNotFoundError"],
    ),
    # A worker that dies mid-action is noticed in seconds, and the action retried elsewhere.
    heartbeat=timedelta(seconds=15),
)

# The steps that read Slurm, the job's nodes (probes, SSH), the log store and the database at
# length (investigate, plan): ordinary activities, since a local activity would hold the
# workflow task for as long as it runs; each attempt bounded by its own timeout, retried
# through an outage as the quick steps are.
INVESTIGATE = CallPolicy(
    timedelta(seconds=120),
    OUTAGE_RETRY,
    give_up_after=OUTAGE_TOLERANCE,
)
# `investigate` heartbeats while it runs: one whose worker died is retried elsewhere within
# seconds, not after its two-minute timeout (a worker killed in a rack failure's burst).
INVESTIGATE_BEATING = CallPolicy(
    timedelta(seconds=120),
    OUTAGE_RETRY,
    heartbeat=timedelta(seconds=20),
    give_up_after=OUTAGE_TOLERANCE,
)


# A node lifecycle's looks at the node and its history; retried through an outage of Slurm or
# the database.
NODE_LOOK = CallPolicy(
    timedelta(seconds=60),
    RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30)),
)
# A node lifecycle's changes of the node (reservation, drain, return, ticket): a few attempts,
# then the lifecycle says what failed and hands the node to a person.
NODE_CHANGE = CallPolicy(
    timedelta(seconds=180),
    RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=5,
        non_retryable_error_types=["InvalidNameError", "ValueError"],
    ),
    heartbeat=timedelta(seconds=30),
)
# A node lifecycle's checks, and a rung (a reboot waits for the node): long, heartbeating.
NODE_LONG = CallPolicy(
    timedelta(hours=2),
    RetryPolicy(
        initial_interval=timedelta(seconds=5),
        maximum_interval=timedelta(seconds=60),
        maximum_attempts=3,
        non_retryable_error_types=["InvalidNameError", "ValueError"],
    ),
    heartbeat=timedelta(seconds=15),
)
# A node decision's batch of requeues (and its look again at the node): a few attempts.
REQUEUE = CallPolicy(
    timedelta(seconds=180),
    RetryPolicy(
        initial_interval=timedelta(seconds=2),
        maximum_interval=timedelta(seconds=20),
        maximum_attempts=5,
        non_retryable_error_types=["InvalidNameError"],
    ),
    heartbeat=timedelta(seconds=15),
)

# While a cluster is paused, a step that would change it, its retries spent, waits this long
# before it is called again, doubling to the most: an unpause takes effect within
# PAUSED_MAX_WAIT (sooner while the step's own retries run). Each wait adds about 11 events to
# the waiting workflow's history: about 3,000 a day, so a pause of two weeks stays well under
# Temporal's limit of 51,200.
PAUSED_FIRST_WAIT = timedelta(seconds=5)
PAUSED_MAX_WAIT = timedelta(minutes=5)


async def call(
    step: Callable[[Any, A], Awaitable[R]],
    arg: A,
    policy: CallPolicy,
    summary: str,
    *,
    local: bool = False,
) -> R:
    """Run the activity method ``step`` (its name and result type from its definition) with
    its policy, as a local activity with ``local``. A step that changes the cluster refuses
    while the cluster is paused (ClusterPausedError): once its retries are spent, it is called
    again after a durable timer, until the unpause."""
    wait = PAUSED_FIRST_WAIT
    while True:
        try:
            return await _call_once(step, arg, policy, summary, local=local)
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) else err
            if not (isinstance(cause, ApplicationError) and cause.type == PAUSED_ERROR):
                raise
        await workflow.sleep(wait, summary=f"cluster paused: {summary} waits for the unpause")
        wait = min(wait * 2, PAUSED_MAX_WAIT)


async def _call_once(
    step: Callable[[Any, A], Awaitable[R]],
    arg: A,
    policy: CallPolicy,
    summary: str,
    *,
    local: bool = False,
) -> R:
    if local:
        return await workflow.execute_local_activity_method(
            step,
            arg,
            start_to_close_timeout=policy.timeout,
            schedule_to_close_timeout=policy.give_up_after,
            retry_policy=policy.retry,
            local_retry_threshold=policy.local_retry_threshold,
            summary=summary,
        )
    return await workflow.execute_activity_method(
        step,
        arg,
        start_to_close_timeout=policy.timeout,
        schedule_to_close_timeout=policy.give_up_after,
        heartbeat_timeout=policy.heartbeat,
        retry_policy=policy.retry,
        summary=summary,
    )


class NodeRun(Protocol):
    """What a node's workflow was started with (a decision's input, a lifecycle's)."""

    cluster: str
    node: str
    n: int


class NodeRows:
    """How a node's workflow (a decision, a lifecycle) writes its audit rows: its incident (its
    own id) has no job, its attempt is the workflow's number, and each row names the node."""

    _id: str
    _input: NodeRun | None

    async def _record(
        self,
        kind: str,
        summary: str,
        *,
        stage: str | None = None,
        actor: str = "relaunch",
        dedupe: str | None = None,
        data: dict[str, object] | None = None,
    ) -> None:
        inp = self._input
        assert inp is not None
        await call(
            EvidenceActivities.record_event,
            RecordEventInput(
                incident_id=self._id,
                cluster=inp.cluster,
                job_id="",
                attempt=inp.n,
                kind=kind,
                summary=summary[:2000],  # a row, not a log: what it quotes is cut
                stage=stage,
                actor=actor,
                nodes=[inp.node],
                data=data or {},
                dedupe=dedupe,
            ),
            RECORD,
            f"audit: {kind}",
            local=True,
        )


def job_not_found(err: ActivityError | ApplicationError) -> bool:
    """Whether the step failed because the scheduler no longer knows the job (an activity's
    error comes wrapped in an ActivityError; a local activity's, as it was raised)."""
    cause = err.cause if isinstance(err, ActivityError) else err
    return isinstance(cause, ApplicationError) and cause.type == "JobNotFoundError"
