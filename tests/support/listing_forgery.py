"""The comment a hostile user writes to forge rows of squeue's brief text listing
(``relaunch.connectors.slurm.parse.BRIEF_FORMAT``): shared by the adversarial test that submits
it to the real Slurm, the recording of what Slurm 22.05 prints for it
(tests/fixtures/slurm/forged/), and the unit tests that read that recording.

Slurm prints a comment raw, newline and unit separator included, so a comment can end its own
job's row with fields of its choosing (uid 0, a root-only file as the job's output, times of
its choosing) and add whole rows of jobs that do not exist, of another user.
"""

from __future__ import annotations

from relaunch.connectors.slurm.parse import BRIEF_FIELDS, BRIEF_SEPARATOR

SEP = BRIEF_SEPARATOR
MADE_UP_JOB = "99999"  # a whole row of a made-up job of another user
MADE_UP_TAIL_JOB = "99998"  # a made-up job whose row ends with the real job's last fields
# A start time a year before the real one: old kernel lines pulled into the incident window.
FORGED_START = 1764000000


def _row(values: dict[str, str], upto: str | None = None) -> str:
    """``values`` in the listing's order, each followed by the separator; only the fields up
    to ``upto`` (included) when given."""
    out = []
    for name in BRIEF_FIELDS:
        out.append(values.get(name, "") + SEP)
        if name == upto:
            break
    return "".join(out)


def forging_comment(
    *,
    opt_in: str,
    secret: str,
    node: str,
    other_user: str,
    other_uid: int,
    other_output: str,
    own_job_id: str = "",
) -> str:
    """A comment that makes its own job's row say uid 0 and ``secret`` as its output, and adds
    a RUNNING job of ``other_user`` on ``node`` whose output is ``other_output``. With
    ``own_job_id`` it also closes the forged rows with a job id (what a user would try against
    a listing whose rows end with their id)."""
    close = f"{own_job_id}{SEP}" if own_job_id else ""
    # The rest of the job's own row, after the comment: paths, times and identity forged.
    own_tail = {
        "STDOUT": secret,
        "STDERR": secret,
        "WorkDir": "/",
        "Command": "/bin/true",
        "NumTasks": "1",
        "TimeLimit": "UNLIMITED",
        "SubmitTime": str(FORGED_START),
        "EligibleTime": str(FORGED_START),
        "StartTime": str(FORGED_START),
        "EndTime": "N/A",
        "UserID": "0",
        "GroupID": "0",
    }
    tail = "".join(own_tail[name] + SEP for name in BRIEF_FIELDS[BRIEF_FIELDS.index("STDOUT") :])
    made_up = {
        "JobID": MADE_UP_JOB,
        "ArrayJobID": MADE_UP_JOB,
        "ArrayTaskID": "N/A",
        "Name": "train",
        "UserName": other_user,
        "State": "RUNNING",
        "Reason": "None",
        "exit_code": "0",
        "Partition": "debug",
        "NodeList": node,
        "NumNodes": "1",
        "BatchHost": node,
        "RestartCnt": "0",
        "Requeue": "1",
        "Comment": opt_in,
        "STDOUT": other_output,
        "STDERR": other_output,
        "WorkDir": "/",
        "Command": "/bin/true",
        "NumTasks": "1",
        "TimeLimit": "UNLIMITED",
        "SubmitTime": str(FORGED_START),
        "EligibleTime": str(FORGED_START),
        "StartTime": str(FORGED_START),
        "EndTime": "N/A",
        "UserID": str(other_uid),
        "GroupID": str(other_uid),
    }
    made_up_close = f"{MADE_UP_JOB}{SEP}" if own_job_id else ""
    # The last line: a made-up job's opening fields, up to its comment; Slurm then prints the
    # real job's remaining fields after it.
    head = {**made_up, "JobID": MADE_UP_TAIL_JOB, "ArrayJobID": MADE_UP_TAIL_JOB}
    head.update(State="PENDING", Comment="relaunch=off")
    return (
        f"{opt_in}{SEP}{tail}{close}\n"
        f"{_row(made_up)}{made_up_close}\n"
        f"{_row(head, upto='Requeue')}relaunch=off"
    )
