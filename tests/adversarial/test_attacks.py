"""Hostile jobs on the real stack: rows 1–9 of issue 12's attack table, each tried as a real job
of a non-root Slurm user (``relaunch-mallory``) against a real worker and watcher in autonomous
mode, with a blast-radius guard of one node so that a regression drains at most one.

Every test ends the same way: a fresh ``sinfo`` shows no healthy node drained; a genuine fault
injected afterwards (a real Xid 79 line in a node's kernel log under a bystander's job) is still
detected, attributed on the kernel log's word and drained; the worker and the watcher are still
running; and no token of a root-only secret file is in any bundle, audit row, console page, the
audit export or the services' logs.

The attacks keep off ``n1`` (``-x n1``), so that the genuine fault always has room there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

from relaunch.models.recovery import Action, Category
from relaunch.models.scheduler import JobState
from tests.adversarial.hostile import HOSTILE_USER, OTHER_USER, Tier, ensure_user
from tests.integration.helpers import wait_job

CANARY = "n1"
AWAY = f"--exclude={CANARY}"
FLOOD_LINES = 20


def job(*lines: str, then: str = "exec sleep 900") -> str:
    """A batch script that prints ``lines`` (shell words, so it may name its own job id and
    nodes) and then waits, or ends as ``then`` says."""
    return "#!/bin/bash\n" + "\n".join(lines) + f"\n{then}\n"


async def finish(t: Tier) -> None:
    """What every attack ends with (see the module docstring)."""
    assert t.drained() == {}, f"a healthy node was drained: {t.drained()}"
    await t.genuine_fault_is_caught(CANARY)
    assert set(t.drained()) == {CANARY}
    t.alive()
    await t.no_secret_anywhere()


async def excluded(t: Tier, job_id: str, nodes: list[str], timeout: float = 60) -> None:
    async def check() -> bool:
        return set(nodes) <= set((await t.h.sched.get_job(job_id)).excluded_nodes)

    await t.h.until(check, f"job {job_id} restarted without {nodes}", timeout=timeout)


# ---------------------------------------------------------------------------- row 1


async def test_printed_srun_node_failure_excludes_the_nodes_and_drains_none(arena: Tier) -> None:
    """Row 1: the job prints ``srun: error: Node failure on n[2-4]`` for its own, healthy
    nodes. It restarts without them; nothing is drained."""
    t = arena
    job_id = t.submit(
        job('echo "srun: error: Node failure on $SLURM_JOB_NODELIST"'),
        "-N3",
        "--ntasks-per-node=1",
        AWAY,
    )
    nodes = await t.running(job_id, printed="Node failure on")
    assert nodes == ["n2", "n3", "n4"] and "n[2-4]" in t.log(job_id)
    assert (await t.h.sched.get_job(job_id)).user == HOSTILE_USER  # not root
    status = await t.settled(await t.incident(job_id))
    t.say("1", status)
    verdict, plan = status.verdict, status.plan
    assert verdict is not None and plan is not None, status
    assert verdict.culprit_nodes == nodes
    assert verdict.corroboration == {n: [] for n in nodes}  # named by the job alone
    assert verdict.action is Action.EXCLUDE_AND_RESTART
    assert plan.action is Action.EXCLUDE_AND_RESTART and plan.drain_nodes == []
    assert sorted(plan.suspect_nodes) == nodes and sorted(plan.exclude_nodes) == nodes
    await excluded(t, job_id, nodes)
    await finish(t)


# ---------------------------------------------------------------------------- row 2


async def test_printed_nccl_ib_and_ecc_lines_do_not_convict(arena: Tier) -> None:
    """Row 2: an NCCL "IB async fatal event" naming the job's host, and a rank-prefixed
    uncorrectable ECC line, printed by the job: the named nodes are suspects, not drained."""
    t = arena
    ecc = t.submit(
        job('echo "1: CUDA error: uncorrectable ECC error encountered"'),
        "-N2",
        "--ntasks-per-node=1",
        AWAY,
    )
    ib = t.submit(
        job('echo "$SLURMD_NODENAME:1:1 [0] NCCL WARN NET/IB : Got async fatal event"'),
        "-N1",
        AWAY,
    )
    await t.running(ecc, printed="ECC")
    await t.running(ib, printed="NCCL WARN")
    # Task 1's node and the host the NCCL line names, in the attempt that printed them: as the
    # recovery read the job (Relaunch may have requeued it onto other nodes by now).
    for job_id, task in ((ecc, 1), (ib, 0)):
        incident = await t.incident(job_id)
        status = await t.settled(incident)
        [evidence] = await t.h.events(incident, "evidence")
        suspect = evidence.nodes[task]
        t.say("2", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        assert verdict.culprit_nodes == [suspect], verdict
        assert verdict.corroboration == {suspect: []}
        assert plan.action is Action.EXCLUDE_AND_RESTART and plan.drain_nodes == []
        assert plan.suspect_nodes == [suspect]
    await finish(t)


# ---------------------------------------------------------------------------- row 3


async def test_fake_xid_lines_build_no_reputation_against_another_users_job(
    arena: Tier,
) -> None:
    """Row 3: three jobs print a fake ``NVRM: Xid 79`` line on n3 and n4; a later failure of
    another user's job there, with no culprit of its own, must not drain them as repeat
    offenders, and their reputation stays clean."""
    t = arena
    fake = job(
        'echo "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, '
        'GPU has fallen off the bus."',
        then="sleep 2; exit 1",
    )
    jobs = [t.submit(fake, "-N2", "--ntasks-per-node=1", "-w", "n3,n4") for _ in range(3)]
    for job_id in jobs:
        status = await t.settled(await t.incident(job_id), timeout=180)
        t.say("3", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        assert plan.drain_nodes == [], plan
    nodes = subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "nodes", "--json"]
        + ["--config", str(t.h.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nodes.returncode == 0, nodes.stderr
    reputation = {r["node"]: r["incidents"] for r in map(json.loads, nodes.stdout.splitlines())}
    assert reputation.get("n3", 0) == 0 and reputation.get("n4", 0) == 0, reputation

    bob = ensure_user(OTHER_USER)
    other = t.submit(
        job('echo "epoch 1 step 10 loss 2.1"', then="sleep 2; exit 3"),
        "-N2",
        "--ntasks-per-node=1",
        "-w",
        "n3,n4",
        user=bob,
    )
    status = await t.settled(await t.incident(other))
    t.say("3", status)
    verdict, plan = status.verdict, status.plan
    assert verdict is not None and plan is not None, status
    assert verdict.culprit_nodes == [] and verdict.repeat_offenders == [], verdict
    assert plan.drain_nodes == [], plan
    await finish(t)


async def test_xids_a_job_provokes_on_its_gpu_drain_nothing_and_charge_no_reputation(
    arena: Tier,
) -> None:
    """Issue 19: Xid 13 and 31 are what a GPU's driver logs when the application on it makes an
    illegal access, which a job can do at will. Three jobs in a row on n3, each leaving Xid 31
    and 13 on the same GPU in n3's own kernel log (a trusted source): NVIDIA's catalogue
    restarts the application for them, so every recovery drains nothing, names no culprit, and
    n3's reputation stays clean however often it repeats."""
    t = arena
    node = "n3"
    for _ in range(3):
        job_id = t.submit(
            job('echo "epoch 1 step 10 loss 2.1"', then="sleep 4; exit 1"), "-w", node, "-n1"
        )
        await t.running(job_id, printed="step 10")
        await asyncio.sleep(1.5)  # the watcher has looked at the node's log for this job
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        t.write_kernel(
            node,
            f"{stamp} {node} kernel: NVRM: Xid (PCI:0000:3b:00): 31, pid=4242, name=python3, "
            "channel 0x00000002, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC6 faulted\n"
            f"{stamp} {node} kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, "
            "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address\n",
        )
        status = await t.settled(await t.incident(job_id), timeout=180)
        t.say("19", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        # The kernel's Xids decided it (not a stall): the catalogue's restart, no isolation.
        assert {e.signature for e in verdict.evidence} >= {"xid_31", "xid_13"}, verdict
        assert "RESTART_APP" in verdict.summary, verdict
        assert verdict.culprit_nodes == [] and verdict.repeat_offenders == [], verdict
        assert plan.drain_nodes == [] and plan.action is not Action.ISOLATE_AND_RESTART, plan
    nodes = subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "nodes", "--json"]
        + ["--config", str(t.h.config_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert nodes.returncode == 0, nodes.stderr
    reputation = {r["node"]: r["incidents"] for r in map(json.loads, nodes.stdout.splitlines())}
    assert reputation.get(node, 0) == 0, reputation
    await finish(t)


# ---------------------------------------------------------------------------- row 4


async def test_a_52_byte_hostlist_neither_kills_the_watcher_nor_names_a_node(arena: Tier) -> None:
    """Row 4: ``srun: error: Node failure on a[0-999][0-999][0-999]`` (a billion names)."""
    t = arena
    watcher_pid = t.h.procs["watch"].pid
    job_id = t.submit(
        job('echo "srun: error: Node failure on a[0-999][0-999][0-999]"'), "-N1", AWAY
    )
    nodes = await t.running(job_id, printed="a[0-999]")
    with contextlib.suppress(AssertionError):  # the line may start a recovery (it does now)
        await t.incident(job_id, timeout=20)
    await asyncio.sleep(2)  # more passes of the watcher over the line
    t.alive()
    assert t.h.procs["watch"].pid == watcher_pid
    rows = await t.h.audit.incidents(cluster=t.h.config.name, job_id=job_id)
    # One recovery per interrupted attempt: a requeue's new submit time never passes for a
    # later job given the same id (which would start a second, suffixed recovery).
    attempts = [row.attempt for row in rows]
    assert len(attempts) == len(set(attempts)), [row.id for row in rows]
    for row in rows:  # a recovery it started must name no node
        status = await t.settled(row.id)
        t.say("4", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        assert set(verdict.culprit_nodes) <= set(nodes) and plan.drain_nodes == [], status
        assert not any(n.startswith("a") for n in verdict.culprit_nodes)
    await finish(t)


# ---------------------------------------------------------------------------- row 5


async def test_output_paths_naming_a_root_secret_are_refused_never_read(arena: Tier) -> None:
    """Row 5: ``-e`` at a 0600 root file, and ``-o`` at a symbolic link to it, then scancel:
    the paths are recorded as refused, and no byte of the file reaches any record."""
    t = arena
    link = t.home / "train.out"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(t.secret.path, link)
    os.lchown(link, t.user.pw_uid, t.user.pw_gid)
    direct = t.submit(job('echo "step 1"'), "-N1", AWAY, f"--error={t.secret.path}")
    via_link = t.submit(job('echo "step 1"'), "-N1", AWAY, f"--output={link}")
    for job_id in (direct, via_link):
        # slurmstepd opens the paths as the user and fails: the job ends at once.
        await wait_job(t.h.sched, job_id, JobState.FAILED, timeout=60)
    subprocess.run(["scancel", direct, via_link], env=t.env, timeout=30, check=False)
    for job_id, path in ((direct, t.secret.path), (via_link, link)):
        incident = await t.incident(job_id)
        t.say("5", await t.settled(incident))
        evidence = await t.h.events(incident, "evidence")
        assert evidence, f"no evidence recorded for {incident}"
        assert any("refused" in e.summary and str(path) in e.summary for e in evidence), [
            e.summary for e in evidence
        ]
    await t.no_secret_anywhere()
    await finish(t)


# ---------------------------------------------------------------------------- row 6


async def test_fifo_output_stalls_neither_the_watcher_nor_the_worker(arena: Tier) -> None:
    """Row 6: ``-o`` and ``-e`` FIFOs (slurmstepd waits opening one; a reader that opens the
    other waits for ever). A real Xid 79 on the job's own node is then detected, both FIFOs
    recorded as refused, and the node drained."""
    t = arena
    fifo, fifo_err = t.mkfifo("out.fifo"), t.mkfifo("err.fifo")
    job_id = t.submit(
        job('echo "step 1"'), "-w", CANARY, "-n1", f"--output={fifo}", f"--error={fifo_err}"
    )
    await wait_job(t.h.sched, job_id, JobState.RUNNING, timeout=60)
    await asyncio.sleep(2)  # the watcher's passes meet the FIFO
    t.alive()
    incident = await t.inject_until_detected(CANARY, job_id, timeout=60)
    status = await t.settled(incident, timeout=90)
    t.say("6", status)
    verdict, plan = status.verdict, status.plan
    assert verdict is not None and plan is not None, status
    assert verdict.culprit_nodes == [CANARY] and verdict.corroboration.get(CANARY)
    evidence = await t.h.events(incident, "evidence")
    for path in (fifo, fifo_err):
        assert any("refused" in e.summary and str(path) in e.summary for e in evidence), [
            e.summary for e in evidence
        ]
    await t.h.until(
        lambda: t.drained_by(CANARY, incident), f"{CANARY} drained for {incident}", timeout=60
    )
    t.alive()
    await t.no_secret_anywhere()


# ---------------------------------------------------------------------------- row 7


async def test_a_flood_of_160_kb_lines_does_not_delay_a_genuine_fault(arena: Tier) -> None:
    """Row 7: lines of 160 KB (``"mlx5_core " × 16000 + "Segmentation fault"``, the issue's
    line) and of 140 KB ending in a real segfault message (``"… (core dumped)"``, which the
    multi-pattern engine passes on to the per-signature patterns: seconds each where one of
    them is quadratic). A real Xid 79 elsewhere right after is still drained in the usual
    time, and nothing else is drained."""
    t = arena
    flood = t.submit(
        job(
            "/usr/bin/python3 - <<'EOF'",
            "import sys",
            f'sys.stdout.write(("mlx5_core " * 16000 + "Segmentation fault\\n") * {FLOOD_LINES})',
            'sys.stdout.write(("mlx5_core " * 14000 + "Segmentation fault (core dumped)\\n")'
            f" * {FLOOD_LINES})",
            "EOF",
            'echo "flooded"',
        ),
        "-N1",
        AWAY,
    )
    await t.running(flood, printed="flooded")
    started = time.monotonic()
    await t.genuine_fault_is_caught(CANARY, timeout=90)
    took = time.monotonic() - started
    assert took < 90, f"the genuine fault took {took:.0f}s to be drained behind the flood"
    assert set(t.drained()) == {CANARY}
    t.alive()
    await t.no_secret_anywhere()


# ---------------------------------------------------------------------------- rows 8 and 9


async def test_printed_cancel_and_preemption_banners_do_not_overrule_a_real_xid(
    arena: Tier,
) -> None:
    """Row 8: one job prints a cancel banner of another job id, one a preemption banner of its
    own; a real Xid 79 sits in n2's kernel log. Both recoveries still name n2 on the kernel
    log's word and n2 is drained. Row 9's double count: the two recoveries drain the same
    node at the same time, and the guard (one node) counts it once."""
    t = arena
    off = "relaunch=off"  # opted in once both lines are written: both are in the evidence
    wrong_id = t.submit(
        job('echo "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT $(date +%FT%T) ***"'),
        "-w",
        "n2",
        "-n1",
        comment=off,
    )
    preempted = t.submit(
        job(
            'echo "slurmstepd: error: *** JOB $SLURM_JOB_ID ON $SLURMD_NODENAME CANCELLED AT'
            ' $(date +%FT%T) DUE TO PREEMPTION ***"'
        ),
        "-w",
        "n2",
        "-n1",
        comment=off,
    )
    await t.running(wrong_id, printed="CANCELLED AT")
    await t.running(preempted, printed="DUE TO PREEMPTION")
    t.write_xid("n2")
    for job_id in (wrong_id, preempted):
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", f"Comment={t.opt_in}"],
            env=t.env,
            timeout=30,
            check=True,
        )
    incidents = [await t.incident(j) for j in (wrong_id, preempted)]
    for incident in incidents:
        status = await t.settled(incident)
        t.say("8", status)
        verdict, plan = status.verdict, status.plan
        assert verdict is not None and plan is not None, status
        assert verdict.category is Category.GPU_HARDWARE, verdict
        assert verdict.culprit_nodes == ["n2"] and verdict.corroboration.get("n2"), verdict
        assert plan.action is Action.ISOLATE_AND_RESTART, plan
        # A plan made after the other recovery drained n2 leaves it drained and excludes it.
        assert plan.drain_nodes == ["n2"] or "n2" in plan.exclude_nodes, plan
        guards = await t.h.events(incident, "guard")
        assert not [g.summary for g in guards if "REFUSED" in g.summary]
    drained = t.drained()
    assert list(drained) == ["n2"] and any(i in drained["n2"] for i in incidents), drained
    t.alive()
    await t.no_secret_anywhere()


async def test_a_line_stamped_2099_does_not_age_out_a_real_xid(arena: Tier) -> None:
    """Row 8: one line stamped 2099-01-01 in the job's output must not make the real Xid 79 in
    n2's kernel log look too old to count."""
    t = arena
    job_id = t.submit(job('echo "2099-01-01T00:00:00 step 1 loss 2.31"'), "-w", "n2", "-n1")
    await t.running(job_id, printed="2099-01-01")
    await asyncio.sleep(1.5)  # the watcher has looked at n2's log
    incident = await t.inject_until_detected("n2", job_id)
    status = await t.settled(incident)
    t.say("8/2099", status)
    verdict, plan = status.verdict, status.plan
    assert verdict is not None and plan is not None, status
    assert verdict.category is Category.GPU_HARDWARE, verdict
    assert verdict.culprit_nodes == ["n2"] and verdict.corroboration.get("n2"), verdict
    await t.h.until(lambda: t.drained_by("n2", incident), f"n2 drained for {incident}", timeout=60)
    assert set(t.drained()) == {"n2"}
    t.alive()
    await t.no_secret_anywhere()


# ------------------------------------------------------------- silent-failure rules


async def test_a_printed_lagging_rank_and_hostile_limits_drain_nothing(arena: Tier) -> None:
    """The lagging-rank rule and the per-job limits read the job's own output and comment: a
    job that prints two ranks' progress, then lets rank 1 fall silent while rank 0 goes on,
    with `hang_after=abc,lag_after=1` in its comment (ignored: not a duration, under 5 s),
    opens a recovery that names rank 1's healthy node a suspect at most: nothing is drained,
    the watcher lives on, and the node's probe still answers."""
    t = arena
    both = 'echo "0: step=$i loss=0.5 rank=0"; echo "1: step=$i loss=0.5 rank=1"'
    job_id = t.submit(
        job(
            f"for i in $(seq 1 20); do {both}; sleep 0.2; done",
            'for i in $(seq 21 3000); do echo "0: step=$i loss=0.5 rank=0"; sleep 0.2; done',
        ),
        "-N2",
        "--ntasks-per-node=1",
        # Not n2: the earlier rows' real Xid 79s made it a repeat offender in this arena, and
        # a hang that names no node rightly drains a repeat offender.
        "-w",
        "n3,n4",
        comment=f"{t.opt_in},hang_after=abc,lag_after=1",
    )
    nodes = await t.running(job_id, printed="1: step=20 ")
    status = await t.settled(await t.incident(job_id))
    t.say("lag", status)
    detections = await t.h.events(status.incident_id, "detection")
    kinds = {str(d.data.get("kind")) for d in detections}
    assert "progress_stalled_rank" in kinds and "node_unreachable" not in kinds, kinds
    lagged = [d for d in detections if d.data.get("kind") == "progress_stalled_rank"]
    assert lagged[0].nodes == [nodes[1]], lagged[0]
    plan = status.plan
    assert plan is not None and plan.drain_nodes == [], plan
    await finish(t)


# ------------------------------------------------------- node-health events (issue 17)


async def test_a_printed_nvsentinel_event_is_no_health_event(arena: Tier) -> None:
    """A job prints what NVSentinel would send for a fatal Xid 79 on another node, and an NHC
    drain reason, then fails: only a sender holding an intake token can push a health event,
    so nothing is recorded as one (nor as a drain by others), no source corroborates the named
    node, and nothing is drained."""
    t = arena
    event = json.dumps(
        {
            "agent": "syslog-health-monitor",
            "componentClass": "GPU",
            "checkName": "SysLogsXIDError",
            "isFatal": True,
            "isHealthy": False,
            "errorCode": ["79"],
            "recommendedAction": "RESTART_BM",
            "nodeName": "n4",
            "message": "XID 79: GPU has fallen off the bus",
        }
    )
    hostile = t.submit(
        job(f"echo '{event}'", 'echo "NHC: check_hw_gpu: GPU lost on n4"', then="exit 1"),
        "-N1",
        "-w",
        "n3",
    )
    status = await t.settled(await t.incident(hostile))
    t.say("17", status)
    assert status.plan is None or status.plan.drain_nodes == [], status
    if status.verdict is not None:
        assert not any(
            "health_event" in sources for sources in status.verdict.corroboration.values()
        ), status.verdict
    said = await t.h.audit.events(f"intake-{t.h.config.name}")
    assert [e for e in said if e.kind in ("health_event", "external_drain")] == [], said
    await finish(t)
