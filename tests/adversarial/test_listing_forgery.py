"""Issue 29, row 2: Slurm's text listing forged from a job's comment, on the real stack, as the
non-root user relaunch-mallory.

What Slurm 22.05 really does (measured on the local stack): ``sbatch --comment`` and
``--job-name`` accept a newline, the unit separator ``\\x1f``, ESC sequences, BEL and C1 bytes,
and a job's own user may rewrite its comment later (``scontrol update JobId=<id>
Comment=...``, exit 0). ``squeue --Format`` and ``squeue -o`` print the name and the comment raw,
newline and separator included, and so does ``scontrol show job`` (``Comment=`` spans lines);
``squeue --json`` quotes them (``"\\n"``, ``"\\u001f"``) and parses. A 64 KiB comment is refused
by sbatch ("Pathname of a file, directory or other parameter too long"). Accounting (sacct) is
off on the dev stack. The recording is in tests/fixtures/slurm/forged/.

So the comment of tests/support/listing_forgery.py ends its own row of the text listing with
uid 0 and the root-only secret as the job's output and a start time a year back, and adds a
RUNNING job 99999 of relaunch-bob on n2 whose "output" holds a fault line, and a job 99998.
Believed, the watcher would read the secret as root into a recovery's bundle and start a
recovery for a job that does not exist. Relaunch now asks squeue for each row opened and closed
by the job id, refuses a listing where a user's text broke a row, and reads ``squeue --json``.
"""

from __future__ import annotations

import asyncio
import os

import psycopg

from relaunch.models.scheduler import JobState
from tests.adversarial.hostile import OTHER_USER, QUIET_JOB, Tier, ensure_user
from tests.integration.helpers import wait_job
from tests.support.listing_forgery import MADE_UP_JOB, MADE_UP_TAIL_JOB, forging_comment

FORGED_IDS = (MADE_UP_JOB, MADE_UP_TAIL_JOB)
SETTLE_S = 10.0  # twenty of the watcher's polls (0.5 s) with the forged listing


async def test_a_comment_that_forges_listing_rows_forges_no_job_identity_or_output(
    arena: Tier,
) -> None:
    bob = ensure_user(OTHER_USER)
    bait = arena.home / "made-up.out"
    bait.write_text("srun: error: Node failure on n2\nslurmstepd: error: *** JOB CANCELLED ***\n")
    os.chown(bait, arena.user.pw_uid, arena.user.pw_gid)
    comment = forging_comment(
        # The comma ends the cluster's tag before the forged fields: an option with a control
        # character in it is no option at all, and a job that names no Relaunch cluster is
        # every test cluster's on the session's Slurm (an alert intake's, once it is cancelled).
        opt_in=f"{arena.opt_in},",
        secret=str(arena.secret.path),
        node="n2",
        other_user=bob.pw_name,
        other_uid=bob.pw_uid,
        other_output=str(bait),
    )
    job_id = arena.submit(QUIET_JOB, "-w", "n1", "-n1", comment=comment)
    await arena.running(job_id, printed="ready on n1")
    await asyncio.sleep(SETTLE_S)

    # No recovery for a job that does not exist, none recorded of the made-up user, and no
    # byte of the root-only file anywhere.
    cluster = arena.h.config.name
    made_up = {j: await arena.h.audit.incidents(cluster=cluster, job_id=j) for j in FORGED_IDS}
    own = await arena.h.audit.incidents(cluster=cluster, job_id=job_id)
    with psycopg.connect(arena.h.stack.database_url) as conn:
        # This tier's cluster only: other tests on the session's stack run jobs of that user
        # for real (the lineage tier's victim).
        rows = conn.execute(
            "select e::text from audit_events e where e::text like %s"
            " and (e.incident_id like %s or e.incident_id like %s)",
            (f"%{bob.pw_name}%", f"%-{cluster}-%", f"%-{cluster}"),
        ).fetchall()
    print(  # shown with -rP, for the report
        f"row 2: incidents of made-up jobs {[i.id for v in made_up.values() for i in v]}, "
        f"of the forging job {[i.id for i in own]}, audit rows naming {bob.pw_name}: {len(rows)}"
    )
    assert made_up == {j: [] for j in FORGED_IDS}
    assert rows == [], rows
    assert own == []
    await arena.no_secret_anywhere()
    assert arena.drained() == {}

    # What the watcher and the evidence read is what Slurm's JSON says of the job.
    sched = arena.h.sched
    real, brief = await sched.get_job(job_id), await sched.get_job_brief(job_id)
    assert real.user_id == arena.user.pw_uid and real.user == arena.user.pw_name
    for job in (brief, *[j for j in await sched.list_jobs_brief() if j.job_id == job_id]):
        assert (job.user, job.user_id, job.group_id) == (real.user, real.user_id, real.group_id)
        assert job.stdout_path == real.stdout_path == f"{arena.home}/{job_id}.out"
        assert job.start_time == real.start_time and job.submit_time == real.submit_time
    listed = {j.job_id for j in await sched.list_jobs_brief()}
    assert not listed & set(FORGED_IDS)
    arena.alive()
    # The watcher did poll the forged listing, and read the JSON one instead.
    watch_log = (arena.h.tmp / "watch.log").read_text(errors="replace")
    assert "squeue's text listing is not used (line " in watch_log

    # The forging job still runs (the watcher reads the JSON listing meanwhile): a genuine
    # fault on another node is still caught and drained.
    await arena.genuine_fault_is_caught("n3")
    assert (await wait_job(sched, job_id, JobState.RUNNING, timeout=10)).nodes == ["n1"]
