"""The scale benchmark's slurmctld cost: RPC counts read from a real `sdiag` (Slurm 22.05, the
dev stack after a squeue and an sinfo), and the rate over a window from two readings."""

from pathlib import Path

from bench.faults.scale import parse_sdiag_rpcs, rpc_rates

SDIAG = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "22.05" / "sdiag.txt"


def test_counts_come_from_the_by_message_type_section_only() -> None:
    counts = parse_sdiag_rpcs(SDIAG.read_text())
    assert counts == {
        "REQUEST_PARTITION_INFO": 5,
        "MESSAGE_NODE_REGISTRATION_STATUS": 4,
        "REQUEST_NODE_INFO": 3,
        "REQUEST_JOB_INFO": 2,
    }  # the "by user" section's root count:14 is not a message type


def test_rates_are_what_moved_over_the_window() -> None:
    before = {"REQUEST_JOB_INFO": 2, "REQUEST_NODE_INFO": 3}
    after = {"REQUEST_JOB_INFO": 42, "REQUEST_NODE_INFO": 3, "REQUEST_PING": 10}
    rates = rpc_rates(before, after, 20.0)
    assert rates == {"total": 2.5, "by_type": {"REQUEST_JOB_INFO": 2.0, "REQUEST_PING": 0.5}}
