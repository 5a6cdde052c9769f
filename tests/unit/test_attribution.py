"""First attribution rules over bundles written in the design's format, from real log lines
(the DDP example's own failure output and NVRM's Xid format)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from relaunch.connectors.bundles import read_bundle, write_bundle
from relaunch.detection.attribution import attribute_bundle
from relaunch.models.bundle import BundleJob
from relaunch.models.recovery import Category

GLOO = (
    "0: [rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:553] Connection closed by peer [127.0.0.1]:27348. This is typically caused by a "
    "remote worker crashing."
)
APP_LOG = "\n".join(
    [
        "0: step=14 loss=0.5100 rank=0 node=n3",
        "1: step=14 loss=0.5100 rank=1 node=n4",
        "1: [rank1]: Traceback (most recent call last):",
        '1: [rank1]:   File "/work/examples/train_ddp.py", line 154, in main',
        "1: [rank1]: RuntimeError: injected application error at step 15",
        GLOO,
        "srun: error: n4: task 1: Exited with exit code 1",
        "0: slurmstepd-n3: error: *** STEP 21.0 ON n3 CANCELLED AT 2026-12-02T12:54:29 ***",
    ]
)
XID = (
    "2026-12-02T13:18:40.591853+00:00 n4 kernel: [ 3147.870115] NVRM: Xid (PCI:0000:3b:00): "
    "79, pid=4242, name=python3, GPU has fallen off the bus."
)


def bundle(
    tmp: Path,
    log: str,
    *,
    state: str = "FAILED",
    node_logs: dict[str, str] | None = None,
    node_states: dict[str, str] | None = None,
    unreachable: list[str] | None = None,
) -> Path:
    job = BundleJob(
        cluster="c",
        job_id="21",
        state=state,
        nodes=["n3", "n4"],
        node_states=node_states or {"n3": "IDLE", "n4": "IDLE"},
        unreachable_nodes=unreachable or [],
        observed_at=datetime.now(UTC),
    )
    return write_bundle(tmp, job, log, node_logs)


def test_user_exception_is_application_and_blames_no_node(tmp_path: Path) -> None:
    v = attribute_bundle(read_bundle(bundle(tmp_path, APP_LOG)))
    assert v.category is Category.APPLICATION and v.culprit_nodes == []
    assert v.action.value == "hold"
    assert any("injected application error" in e.text for e in v.evidence)
    assert not any("Connection closed" in e.text for e in v.evidence)


def test_xid_on_one_node_beats_the_cascade_on_the_other(tmp_path: Path) -> None:
    log = "0: step=20 loss=0.4 rank=0 node=n3\n" + GLOO + "\n"
    v = attribute_bundle(read_bundle(bundle(tmp_path, log, node_logs={"n4": XID + "\n"})))
    assert v.category is Category.GPU_HARDWARE and v.culprit_nodes == ["n4"]
    assert v.evidence[0].signature == "xid_79" and v.evidence[0].source == "nodes/n4.log"


def test_unreachable_node_is_a_node_failure(tmp_path: Path) -> None:
    v = attribute_bundle(
        read_bundle(bundle(tmp_path, GLOO + "\n", state="RUNNING", unreachable=["n4"]))
    )
    assert v.category is Category.NODE_FAILURE and v.culprit_nodes == ["n4"]


def test_node_down_in_slurm_is_a_node_failure(tmp_path: Path) -> None:
    v = attribute_bundle(
        read_bundle(
            bundle(
                tmp_path,
                "",
                state="NODE_FAIL",
                node_states={"n3": "MIXED", "n4": "DOWN+NOT_RESPONDING"},
            )
        )
    )
    assert v.category is Category.NODE_FAILURE and v.culprit_nodes == ["n4"]


def test_time_limit_and_cancel_take_no_action(tmp_path: Path) -> None:
    timeout = attribute_bundle(read_bundle(bundle(tmp_path / "t", "", state="TIMEOUT")))
    assert timeout.category is Category.TIME_LIMIT and timeout.action.value == "none"
    cancel = attribute_bundle(read_bundle(bundle(tmp_path / "c", "", state="CANCELLED")))
    assert cancel.category is Category.USER_CANCEL and cancel.action.value == "none"


def test_cascade_alone_is_unknown(tmp_path: Path) -> None:
    v = attribute_bundle(read_bundle(bundle(tmp_path, GLOO + "\n", state="FAILED")))
    assert v.category is Category.UNKNOWN and v.culprit_nodes == []


def test_cancelled_job_is_a_user_cancel_whatever_its_log_says(tmp_path: Path) -> None:
    log = "srun: error: n4: task 1: Killed\n" + GLOO + "\n"
    v = attribute_bundle(read_bundle(bundle(tmp_path, log, state="CANCELLED")))
    assert v.category is Category.USER_CANCEL and v.action.value == "none"


def test_a_scancel_in_the_log_is_the_users_before_slurm_lists_the_job_cancelled(
    tmp_path: Path,
) -> None:
    """Evidence gathered right after a scancel can still see the job RUNNING; its dying ranks'
    connection errors must not turn the user's cancel into a network failure to restart."""
    log = (
        "0: step=20 loss=0.4\n"
        "slurmstepd: error: *** JOB 21 ON n3 CANCELLED AT 2026-12-02T20:19:37 ***\n"
        "srun: error: n4: task 1: Killed\n" + GLOO + "\n"
    )
    for state in ("RUNNING", "COMPLETING"):
        v = attribute_bundle(read_bundle(bundle(tmp_path / state, log, state=state)))
        assert v.category is Category.USER_CANCEL and v.action.value == "none", state
        assert v.culprit_nodes == []
    # A step cancelled by srun after a rank's bad exit looks alike but is no user's cancel.
    step = log.replace("*** JOB 21 ON n3", "*** STEP 21.0 ON n3")
    v = attribute_bundle(read_bundle(bundle(tmp_path / "step", step, state="RUNNING")))
    assert v.category is not Category.USER_CANCEL


def test_a_preemption_line_decides_before_slurm_lists_the_job_preempted(tmp_path: Path) -> None:
    """Seen in the benchmark: evidence read while the preempted job was still RUNNING was taken
    for a hang and its node drained."""
    log = (
        "0: step=20 loss=0.4\n"
        "slurmstepd: error: *** JOB 21 ON n3 CANCELLED AT 2026-12-02T20:36:50 DUE TO "
        "PREEMPTION ***\n" + GLOO + "\n"
    )
    for state in ("RUNNING", "COMPLETING", "PENDING"):
        v = attribute_bundle(read_bundle(bundle(tmp_path / state, log, state=state)))
        assert v.category is Category.PREEMPTION and v.action.value == "none", state
        assert v.culprit_nodes == []
