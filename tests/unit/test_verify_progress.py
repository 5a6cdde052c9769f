"""A look at the restarted job (verify_check) confirms that it resumed from its checkpoint and
trains past it, in the words of whichever framework the job uses, and names that framework in
the audit trail."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from temporalio.testing import ActivityEnvironment

from relaunch.activities.actions import ActionActivities
from relaunch.activities.deps import Deps
from relaunch.connectors.audit import AuditStore
from relaunch.connectors.slurm.commands import SlurmCli
from relaunch.models.config import ClusterConfig
from relaunch.models.recovery import AuditRecord, VerifyCheck, VerifyInput
from relaunch.models.scheduler import Job, JobState


class Cluster(SlurmCli):
    """The restarted job, running on healthy nodes, its output in ``log``."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.job = Job(
            job_id="9",
            user_id=os.getuid(),
            group_id=os.getgid(),
            state=JobState.RUNNING,
            nodes=["n3", "n4"],
            stdout_path=str(log),
        )

    async def get_job_brief(self, job_id: str) -> Job:
        return self.job


class Audit:
    def __init__(self) -> None:
        self.rows: list[AuditRecord] = []

    async def record(self, row: AuditRecord, dedupe_key: str | None = None) -> bool:
        self.rows.append(row)
        return True


async def verify(log: Path, checkpoint: int, pattern: str | None = None) -> VerifyCheck:
    config = ClusterConfig(name="dev", database_url="postgresql://x", bundle_dir="/tmp")
    config.watch.progress_pattern = pattern
    deps = Deps(config=config, scheduler=Cluster(log), audit=cast(AuditStore, Audit()))
    inp = VerifyInput(
        incident_id="relaunch-dev-9-0",
        cluster="dev",
        job_id="9",
        avoid_nodes=["n2"],
        checkpoint_step=checkpoint,
        timeout_s=2.0,
    )
    result: Any = await ActivityEnvironment().run(ActionActivities(deps).verify_check, inp)
    return cast(VerifyCheck, result)


MEGATRON_LOG = """\
0:  [2026-02-02 12:10:01] iteration      230/  100000 | consumed samples: 29440 |
0:   successfully saved checkpoint from iteration     230 to /ckpt/gpt [ t 1/1, p 1/1 ]
0:  loading checkpoint from /ckpt/gpt at iteration 230
0:   successfully loaded checkpoint from /ckpt/gpt [ t 1/1, p 1/1 ] at iteration 230
1:  [2026-02-02 12:13:00] iteration      231/  100000 | consumed samples: 29568 |
1:  [2026-02-02 12:13:01] iteration      232/  100000 | consumed samples: 29696 |
1:  [2026-02-02 12:13:02] iteration      233/  100000 | consumed samples: 29824 |
"""


async def test_a_megatron_resume_is_confirmed_with_its_framework(tmp_path: Path) -> None:
    log = tmp_path / "slurm-9.out"
    log.write_text(MEGATRON_LOG)
    outcome = await verify(log, checkpoint=230)
    assert outcome.done
    assert outcome.detail == (
        "RUNNING on n3,n4; resumed from checkpoint step 230 (last saved before the fault: 230),"
        " now at step 233 (megatron)"
    )


async def test_the_example_job_s_resume_still_counts(tmp_path: Path) -> None:
    log = tmp_path / "slurm-9.out"
    log.write_text(
        "0: checkpoint saved step=10 path=/ckpt/ckpt-latest.pt\n"
        "0: resumed from checkpoint step=10\n1: resumed from checkpoint step=10\n"
        "0: step=11 loss=0.1 rank=0 node=n3\n1: step=11 loss=0.1 rank=1 node=n4\n"
        "0: step=12 loss=0.1 rank=0 node=n3\n"
    )
    outcome = await verify(log, checkpoint=10)
    assert outcome.detail.endswith("now at step 12 (pytorch)")


async def test_a_resume_from_an_older_checkpoint_is_not_this_restart_s(tmp_path: Path) -> None:
    log = tmp_path / "slurm-9.out"
    # An earlier attempt's resume from 200; the checkpoint saved before this fault was 230.
    log.write_text(MEGATRON_LOG.replace("iteration 230\n", "iteration 200\n"))
    outcome = await verify(log, checkpoint=230)
    assert not outcome.done and not outcome.failed
    assert outcome.detail == "RUNNING on n3,n4; waiting for progress past the checkpoint"


async def test_the_job_s_own_progress_pattern_shows_the_steps(tmp_path: Path) -> None:
    log = tmp_path / "slurm-9.out"
    log.write_text("0: resumed from checkpoint step=10\n0: iter 11 done\n0: iter 14 done\n")
    outcome = await verify(log, checkpoint=10, pattern=r"^iter (?P<step>\d+) done")
    assert "now at step 14 (pytorch)" in outcome.detail
