"""Recovery identity and the retry policies that carry a recovery through outages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from relaunch.models.recovery import parse_recovery_id, recovery_workflow_id, same_attempt_ids
from relaunch.workflows.calls import OBSERVE, RECORD, CallPolicy


def test_the_documented_id_and_the_suffix_of_a_reused_job_id() -> None:
    assert recovery_workflow_id("dev", "26", 0) == "relaunch-dev-26-0"
    later = datetime(2026, 12, 3, 6, 12, 0, tzinfo=timezone(timedelta(hours=1)))
    assert recovery_workflow_id("dev", "26", 0, later) == "relaunch-dev-26-0-20261203T051200Z"


def test_what_a_person_types_finds_the_suffixed_recoveries_of_that_attempt_only() -> None:
    ids = [
        "relaunch-dev-26-0-20261203T051200Z",
        "relaunch-dev-26-0",
        "relaunch-dev-26-01",
        "relaunch-dev-26-0-5-0",  # cluster "dev-26-0", job 5: not the same attempt
        "relaunch-dev-26-1-20261203T051200Z",
    ]
    assert same_attempt_ids("relaunch-dev-26-0", ids) == [
        "relaunch-dev-26-0-20261203T051200Z",
        "relaunch-dev-26-0",
    ]
    assert parse_recovery_id("relaunch-dev-26-0") == ("dev", "26", 0)
    assert parse_recovery_id("relaunch-gpu-east-1-418227_3-2") == ("gpu-east-1", "418227_3", 2)
    assert parse_recovery_id("relaunch-dev-26-0-20261203T051200Z") is None


def _retried_for(policy: CallPolicy) -> tuple[timedelta, timedelta]:
    """How long the policy keeps retrying an attempt that always fails at once, and the
    longest wait between two attempts."""
    retry = policy.retry
    assert retry.maximum_attempts == 0  # unlimited: only the time limit ends them
    assert policy.give_up_after is not None
    waited, wait, longest = timedelta(0), retry.initial_interval, timedelta(0)
    while waited + wait <= policy.give_up_after:
        waited += wait
        longest = max(longest, wait)
        wait = min(wait * retry.backoff_coefficient, retry.maximum_interval or wait)
    return waited, longest


def test_audit_writes_and_reads_wait_out_a_long_outage_with_capped_backoff() -> None:
    for policy in (RECORD, OBSERVE):
        waited, longest = _retried_for(policy)
        assert waited >= timedelta(minutes=30)
        assert longest <= timedelta(seconds=30)  # back within half a minute of the database
        # Long local-activity backoffs wait on workflow timers, not in the workflow task.
        assert policy.local_retry_threshold is not None
        assert policy.local_retry_threshold < longest


def test_suffix_is_in_utc_whatever_the_zone() -> None:
    at = datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert recovery_workflow_id("c", "1", 2, at).endswith("-20260101T000001Z")
