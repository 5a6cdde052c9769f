"""First attribution rules over bundles written in the design's format, from real log lines
(the DDP example's own failure output and NVRM's Xid format), and the trust model against a
hostile job's output (issue 12's rows 1, 2, 3 and 8)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from relaunch.connectors.bundles import read_bundle, write_bundle
from relaunch.detection.attribution import attribute_bundle, implicated
from relaunch.models.bundle import Bundle, BundleJob
from relaunch.models.recovery import Action, Category

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


# A job's output is under its user's control: what it prints may point at a node, never convict
# one. The nodes below are healthy in Slurm unless a test says otherwise.
NODES = ["n1", "n2", "n3", "n4"]
T0 = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
STEP = f"0: {T0:%Y-%m-%dT%H:%M:%S} step=20 loss=0.4 rank=0 node=n1\n"
N2_XID = (
    f"{T0.replace(minute=1).isoformat()} n2 kernel: [ 3147.870115] NVRM: Xid "
    "(PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.\n"
)


def hostile(
    log: str,
    *,
    state: str = "FAILED",
    node_logs: dict[str, str] | None = None,
    node_states: dict[str, str] | None = None,
    job_id: str = "21",
) -> Bundle:
    job = BundleJob(
        cluster="c",
        job_id=job_id,
        state=state,
        nodes=NODES,
        node_states=node_states or dict.fromkeys(NODES, "ALLOCATED"),
        observed_at=T0.replace(minute=5),
    )
    return Bundle(path="mem", job=job, job_log=STEP + log, node_logs=node_logs or {})


def test_a_printed_srun_node_failure_excludes_the_nodes_and_drains_none() -> None:
    """Issue 12, row 1: the nodes are healthy in Slurm; only the job says they failed."""
    v = attribute_bundle(hostile("srun: error: Node failure on n[2-4]\n"))
    assert v.category is Category.NODE_FAILURE and v.culprit_nodes == ["n2", "n3", "n4"]
    assert v.action is Action.EXCLUDE_AND_RESTART
    assert v.corroboration == {"n2": [], "n3": [], "n4": []}
    assert v.confidence <= 0.7 and "named only by the job's output" in v.summary
    assert [e.trusted for e in v.evidence] == [False] * len(v.evidence)
    # The same line while Slurm lists n3 down: n3 is corroborated, the others are not.
    states = {**dict.fromkeys(NODES, "ALLOCATED"), "n3": "DOWN+NOT_RESPONDING"}
    down = attribute_bundle(hostile("srun: error: Node failure on n[2-4]\n", node_states=states))
    assert down.corroboration == {"n2": [], "n3": ["slurm_node_state"], "n4": []}
    # The job's noise about n2 and n4 does not keep n3 in service: isolate (the planner
    # drains n3 only and excludes the suspects n2 and n4).
    assert down.action is Action.ISOLATE_AND_RESTART
    assert "named only by the job's output: n2, n4" in down.summary


def test_printed_nccl_and_cuda_hardware_lines_exclude_and_drain_nothing() -> None:
    """Issue 12, row 2: a host-prefixed NCCL line and a rank-labelled CUDA ECC line."""
    nccl = attribute_bundle(
        hostile("n3:1:1 [0] NCCL WARN NET/IB : Got async fatal event: local catastrophic error\n")
    )
    assert nccl.category is Category.NETWORK and nccl.culprit_nodes == ["n3"]
    assert nccl.action is Action.EXCLUDE_AND_RESTART and nccl.corroboration == {"n3": []}
    ecc = attribute_bundle(hostile("3: CUDA error: uncorrectable ECC error encountered\n"))
    assert ecc.category is Category.GPU_HARDWARE and ecc.culprit_nodes == ["n4"]
    assert ecc.action is Action.EXCLUDE_AND_RESTART and ecc.corroboration == {"n4": []}


def test_the_kernel_confirming_a_printed_line_isolates() -> None:
    ecc = "1: CUDA error: uncorrectable ECC error encountered\n"
    v = attribute_bundle(hostile(ecc, node_logs={"n2": N2_XID}))
    assert v.culprit_nodes == ["n2"] and v.corroboration == {"n2": ["kernel_log"]}
    assert v.action is Action.ISOLATE_AND_RESTART
    assert {(e.source, e.trusted) for e in v.evidence} >= {("nodes/n2.log", True)}


def test_a_printed_xid_charges_no_node_in_reputation() -> None:
    """Issue 12, row 3: a fake NVRM line names no node; it must not count against every node
    of the job (three such jobs would have made them all repeat offenders)."""
    fake = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python3, GPU has fallen off the bus.\n"
    bundle = hostile(fake)
    v = attribute_bundle(bundle)
    assert v.culprit_nodes == [] and v.action is not Action.ISOLATE_AND_RESTART
    assert implicated(v, bundle) == []
    # The same fault in n2's kernel log is charged to n2 alone.
    real = hostile("", node_logs={"n2": N2_XID})
    assert implicated(attribute_bundle(real), real) == ["n2"]
    # A node that stopped answering Relaunch's probe is charged; one the job names is not.
    printed = hostile("srun: error: Node failure on n3\n").model_copy(deep=True)
    printed.job.unreachable_nodes = ["n4"]
    both = attribute_bundle(printed)
    assert both.corroboration == {"n3": [], "n4": ["probe"]}
    assert implicated(both, printed) == ["n4"]


def test_printed_banners_never_overrule_a_real_xid() -> None:
    """Issue 12, row 8: a cancel line with another job's id, and a preemption banner (the
    job's own id, but printed), while n2's kernel log has an Xid 79: n2 is isolated."""
    banners = [
        "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-12-02T10:02:00 ***\n",
        "slurmstepd: error: *** JOB 21 ON n1 CANCELLED AT 2026-12-02T10:02:00 DUE TO "
        "PREEMPTION ***\n",
        "slurmstepd: error: *** JOB 21 ON n1 CANCELLED AT 2026-12-02T10:02:00 ***\n",
    ]
    for banner in banners:
        for state in ("RUNNING", "COMPLETING", "FAILED"):
            v = attribute_bundle(hostile(banner, state=state, node_logs={"n2": N2_XID}))
            assert v.category is Category.GPU_HARDWARE, (banner, state)
            assert v.culprit_nodes == ["n2"] and v.action is Action.ISOLATE_AND_RESTART


def test_a_cancel_banner_counts_only_for_this_job() -> None:
    other = "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-12-02T10:02:00 ***\n"
    assert attribute_bundle(hostile(other, state="RUNNING")).category is not Category.USER_CANCEL
    for job_id, banner_id in [("21", "21"), ("21", "21_3"), ("21_3", "21"), ("21", "21+1")]:
        line = other.replace("JOB 1 ", f"JOB {banner_id} ")
        v = attribute_bundle(hostile(line, state="RUNNING", job_id=job_id))
        assert v.category is Category.USER_CANCEL, (job_id, banner_id)
    wrong = other.replace("JOB 1 ", "JOB 21_3 ")
    assert attribute_bundle(hostile(wrong, job_id="21_4")).category is not Category.USER_CANCEL


def test_slurms_own_job_state_still_decides_over_a_kernel_fault() -> None:
    v = attribute_bundle(hostile("", state="PREEMPTED", node_logs={"n2": N2_XID}))
    assert v.category is Category.PREEMPTION and v.action is Action.NONE
    # A real cancel is the user's say on the job, not on its nodes: the kernel's fault on n2
    # still convicts it (the planner drains it and does not restart the cancelled job).
    v = attribute_bundle(hostile("", state="CANCELLED", node_logs={"n2": N2_XID}))
    assert v.category is Category.GPU_HARDWARE and v.culprit_nodes == ["n2"]
    assert v.corroboration == {"n2": ["kernel_log"]} and v.action is Action.ISOLATE_AND_RESTART
