"""The example training job on the local cluster: one way to submit it for the demo, the
benchmarks and the end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from relaunch.connectors.slurm.parse import sbatch_job_id
from relaunch.models.errors import SchedulerError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN_SCRIPT = EXAMPLES / "jobs" / "train_ddp.sbatch"
# The same training under torchrun's elastic agent, three nodes of which two train (a spare).
ELASTIC_SCRIPT = EXAMPLES / "jobs" / "train_elastic.sbatch"


def submit_training(
    slurm_env: Mapping[str, str],
    *,
    workdir: Path,
    ckpt_dir: Path | None = None,
    args: Sequence[str] = (),
    comment: str = "relaunch=on",
    script: Path = TRAIN_SCRIPT,
) -> str:
    """Submit the PyTorch DDP example (2 nodes; ``script=ELASTIC_SCRIPT``: under torchrun, 3
    nodes of which 2 train) with this interpreter; its output goes to
    ``<workdir>/train-<job id>.out`` and, unless ``ckpt_dir`` is given, its checkpoints to
    ``<workdir>/checkpoints/<job id>``. Returns the job id."""
    env = {
        **os.environ,
        **slurm_env,
        "RELAUNCH_PYTHON": sys.executable,
        "RELAUNCH_EXAMPLES": str(EXAMPLES),
    }
    env.pop("CKPT_DIR", None)
    if ckpt_dir is not None:
        env["CKPT_DIR"] = str(ckpt_dir)
    result = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--output={workdir}/train-%j.out",
            f"--comment={comment}",
            f"--chdir={workdir}",
            str(script),
            *args,
        ],
        env=env,
        cwd=workdir,  # $SLURM_SUBMIT_DIR: the default checkpoints go under it
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        raise SchedulerError(f"sbatch of the example job failed: {result.stderr.strip()[-300:]}")
    return sbatch_job_id(result.stdout)
