"""Record what Slurm prints for a job whose comment forges rows of the brief text listing
(tests/support/listing_forgery.py), in tests/fixtures/slurm/forged/. Run as root against a local
dev stack (`relaunch dev up`, then `export SLURM_CONF=...`), from the repository root:

    python -m tests.support.record_listing_forgery

It submits one job as relaunch-mallory (created if missing) with the forging comment, records
squeue's brief listing without and with the closing job id, and `squeue --json`; then the user
rewrites the comment (`scontrol update`, as that user) to close the forged rows with the job's
own id, and the listing is recorded again; the job is cancelled at the end.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from relaunch.connectors.slurm import parse
from tests.adversarial.hostile import ensure_user
from tests.support.listing_forgery import forging_comment

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "forged"
PLAIN = ",".join(f"{name}:0{parse.BRIEF_SEPARATOR}" for name in parse.BRIEF_FIELDS)
CLOSED = PLAIN + f",{parse.BRIEF_CLOSE}:0{parse.BRIEF_SEPARATOR}"


def run(argv: list[str], user: str | None = None) -> str:
    prefix = ["runuser", "-u", user, "--"] if user else []
    env = {**os.environ, "SLURM_TIME_FORMAT": "%s"}
    done = subprocess.run(prefix + argv, env=env, capture_output=True, timeout=60, check=True)
    return done.stdout.decode()


def record(suffix: str) -> None:
    for name, fmt in (("plain", PLAIN), ("closed", CLOSED)):
        text = run(["squeue", "--states=all", "--noheader", f"--Format={fmt}"])
        (HERE / f"brief_{name}{suffix}.txt").write_text(text)
    (HERE / f"squeue{suffix}.json").write_text(run(["squeue", "--json"]))


def main() -> None:
    user = ensure_user("relaunch-mallory")
    home = Path(tempfile.mkdtemp(prefix="relaunch-forged-"))
    home.chmod(0o755)
    os.chown(home, user.pw_uid, user.pw_gid)
    args = dict(
        opt_in="relaunch=on",
        secret="/etc/relaunch/env",
        node="n2",
        other_user="relaunch-bob",
        other_uid=1003,
        other_output="/tmp/bob.out",
    )
    script = "#!/bin/bash\nexec sleep 600\n"
    done = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--uid={user.pw_uid}",
            f"--gid={user.pw_gid}",
            f"--chdir={home}",
            f"--output={home}/%j.out",
            "--nodelist=n1",
            f"--comment={forging_comment(**args)}",  # type: ignore[arg-type]
        ],
        input=script,
        text=True,
        capture_output=True,
        timeout=60,
        check=True,
    )
    job_id = done.stdout.strip().split(";")[0]
    try:
        time.sleep(2)
        record("")
        adapted = forging_comment(**args, own_job_id=job_id)  # type: ignore[arg-type]
        run(["scontrol", "update", f"JobId={job_id}", f"Comment={adapted}"], user=user.pw_name)
        record("_adapted")
    finally:
        subprocess.run(["scancel", job_id], timeout=60, check=False)


if __name__ == "__main__":
    main()
