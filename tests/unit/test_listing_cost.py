"""The listing-cost benchmark's readings: slurmctld's RPC counts and serving time from a real
`sdiag` (Slurm 22.05), per call net of an idle window, and slurmrestd's `last_update`."""

from pathlib import Path

from bench.listing_cost import parse_last_update, parse_sdiag, per_call, rpc_delta

SDIAG = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05" / "sdiag.txt"


def test_sdiag_gives_count_and_total_time_by_message_type_only() -> None:
    assert parse_sdiag(SDIAG.read_text()) == {
        "REQUEST_PARTITION_INFO": (5, 814),
        "MESSAGE_NODE_REGISTRATION_STATUS": (4, 1365),
        "REQUEST_NODE_INFO": (3, 787),
        "REQUEST_JOB_INFO": (2, 331),
    }  # the "by user" section's root line is not a message type


def test_per_call_takes_off_the_idle_windows_background() -> None:
    before = {"REQUEST_JOB_INFO": (2, 300), "REQUEST_STATS_INFO": (1, 10)}
    after = {
        "REQUEST_JOB_INFO": (12, 50_300),
        "REQUEST_PARTITION_INFO": (10, 2_000),
        "REQUEST_STATS_INFO": (2, 20),
        "REQUEST_PING": (1, 5),
    }
    busy = rpc_delta(before, after)
    assert busy["REQUEST_JOB_INFO"] == (10, 50_000)
    # The quiet window as long: sdiag's own call and a ping of slurmctld's own.
    idle = {"REQUEST_STATS_INFO": (1, 10), "REQUEST_PING": (1, 5)}
    counts, ms = per_call(busy, idle, 10)
    assert counts == {"REQUEST_JOB_INFO": 1.0, "REQUEST_PARTITION_INFO": 1.0}
    assert ms == 5.2  # (50,000 + 2,000) µs over 10 calls


def test_last_update_of_each_api_version() -> None:
    assert parse_last_update({"last_update": 1796457762}) == 1796457762  # v0.0.38
    newer = {"last_update": {"set": True, "infinite": False, "number": 1796457762}}
    assert parse_last_update(newer) == 1796457762
    # v0.0.42's "no change" answer says 0: the poller keeps its own time instead.
    assert parse_last_update({"last_update": {"set": True, "number": 0}}) is None
    assert parse_last_update({"jobs": []}) is None
