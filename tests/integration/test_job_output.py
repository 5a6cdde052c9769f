"""A job of another user names a root secret as its stderr: gathering its evidence on the real
stack (Slurm, PostgreSQL) never reads the secret; the refusal is recorded instead."""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import subprocess
import tempfile
from pathlib import Path

import pytest

from relaunch.activities.deps import Deps
from relaunch.activities.evidence import EvidenceActivities
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.devstack.stack import Stack
from relaunch.models.recovery import GatherInput
from tests.conftest import sbatch

USER = "relaunch-mallory"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs of another user need root")


def other_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", USER], check=True, timeout=30)
        return pwd.getpwnam(USER)


async def test_a_root_secret_named_as_stderr_is_refused_never_read(
    stack: Stack, scheduler: SlurmCli, slurm_env: dict[str, str], tmp_path: Path
) -> None:
    mallory = other_user()
    marker = f"RELAUNCH_SECRET_MARKER_{secrets.token_hex(8)}"
    secret = tmp_path / "env"
    secret.write_text(f"DATABASE_PASSWORD={marker}\n" * 50)
    secret.chmod(0o600)  # root's, as /etc/relaunch/env is
    shared = Path(tempfile.mkdtemp(prefix="relaunch-mallory-"))
    shared.chmod(0o777)
    job_id = sbatch(
        slurm_env,
        f"--uid={mallory.pw_uid}",
        f"--gid={mallory.pw_gid}",
        "--chdir=/tmp",
        f"--output={shared}/out-%j.log",
        f"--error={secret}",
        # Tagged with the stack's own cluster: the harnesses' watchers on this Slurm leave it.
        f"--comment=relaunch=on,relaunch_cluster={stack.config.cluster}",
        "--wrap=echo hello from mallory; exit 1",
    )
    for _ in range(200):
        job = await scheduler.get_job(job_id)
        if job.state.is_terminal:
            break
        await asyncio.sleep(0.3)
    assert job.state.is_terminal, job.state
    assert (job.user_id, job.stderr_path) == (mallory.pw_uid, str(secret))

    config = stack.cluster_config()
    audit = await AuditStore.open(config.database_url)
    incident = f"relaunch-{config.name}-{job_id}-0"
    try:
        await audit.ensure_incident(incident, config.name, job_id, 0)
        evidence = EvidenceActivities(Deps(config=config, scheduler=scheduler, audit=audit))
        summary = await evidence.gather_evidence(
            GatherInput(incident_id=incident, cluster=config.name, job_id=job_id, attempt=0)
        )
        events = await audit.events(incident)
    finally:
        await audit.close()

    bundle = Path(summary.bundle_path)
    stored = b"".join(p.read_bytes() for p in sorted(bundle.rglob("*")) if p.is_file())
    assert marker.encode() not in stored
    assert marker not in summary.model_dump_json()
    assert all(marker not in e.model_dump_json() for e in events)
    # Recorded as refused, with why; the job's own output file was not refused.
    job_json = (bundle / "job.json").read_text()
    assert str(secret) in job_json and "may not" in job_json
    (row,) = [e for e in events if e.kind == "evidence"]
    refused = row.data["refused_paths"]
    assert isinstance(refused, dict) and list(refused) == [str(secret)]
    assert "refused to read" in row.summary
