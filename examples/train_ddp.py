"""A small, real PyTorch DDP training job (gloo, CPU) for Relaunch's tests and demo.

Launched by `srun` (see jobs/train_ddp.sbatch): one process per task, rank = $SLURM_PROCID,
world = $SLURM_NTASKS. Under torchrun (jobs/train_elastic.sbatch: `$TORCHELASTIC_RUN_ID` set) the
rank, world size and rendezvous address are torchrun's ($RANK, $WORLD_SIZE, $MASTER_ADDR:PORT).
It trains an MLP on synthetic deterministic data, checkpoints atomically
from rank 0 and resumes from the latest checkpoint on every start, so a requeued job continues
where it stopped. The printed lines are a contract other code parses (see README.md):

    step=<N> loss=<x.xxxx> rank=<r> node=<node>
    checkpoint saved step=<N> path=<path>
    worker up node=<node>                   (the process started, torch imported)
    process group ready rank=<r> world=<w>  (the ranks found each other)
    resumed from checkpoint step=<N>        (or: starting from scratch)
    evaluation started step=<N>             (with --eval-every)
    evaluation done step=<N> val_loss=<x.xxxx>
    training finished step=<N>

With ``--progress-style megatron`` the progress, checkpoint and resume lines take Megatron-LM's
shapes instead (see README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
import warnings
import zlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

# The CPU wheel runs without NumPy; keep its import-time warning out of every rank's log.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

CKPT_NAME = "ckpt-latest.pt"
IN_FEATURES, HIDDEN, BATCH = 32, 64, 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=1_000_000, help="last step (default: ~forever)")
    p.add_argument("--step-sleep", type=float, default=0.2, help="seconds to sleep per step")
    p.add_argument("--ckpt-dir", type=Path, required=True, help="shared checkpoint directory")
    p.add_argument("--ckpt-every", type=int, default=10, help="rank 0 checkpoints every N steps")
    p.add_argument("--pg-timeout", type=float, default=60.0, help="process-group timeout (s)")
    p.add_argument("--fail-at-step", type=int, default=None, help="inject an error at step N")
    p.add_argument("--fail-rank", type=int, default=None, help="rank that raises the error")
    p.add_argument(
        "--fail-once",
        action="store_true",
        help="raise the injected error only once (a marker in --ckpt-dir remembers it)",
    )
    p.add_argument(
        "--ckpt-pause", type=float, default=0.0, help="extra seconds rank 0 spends in each save"
    )
    p.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: never)")
    p.add_argument("--eval-pause", type=float, default=0.0, help="seconds each evaluation takes")
    p.add_argument(
        "--sync-every", type=int, default=1, help="all-reduce gradients every N steps (default 1)"
    )
    p.add_argument(
        "--progress-style",
        choices=("pytorch", "megatron"),
        default="pytorch",
        help="shape of the progress, checkpoint and resume lines",
    )
    args = p.parse_args(argv)
    if args.ckpt_every < 1:
        p.error("--ckpt-every must be at least 1")
    if args.sync_every < 1:
        p.error("--sync-every must be at least 1")
    if args.eval_every < 0:
        p.error("--eval-every must be 0 (never) or more")
    if args.ckpt_pause < 0 or args.eval_pause < 0:
        p.error("--ckpt-pause and --eval-pause must not be negative")
    return args


def master_port() -> int:
    """$MASTER_PORT, else one derived from the job id and restart count, so that a requeued
    attempt never tries to bind the port the previous attempt may still hold, and from the
    cluster, so that job 1 of two clusters on one host (parallel test stacks) do not collide.
    Below Linux's ephemeral range (32768 and up): an outgoing connection of any process on the
    host may hold a port there, and the rendezvous would fail to listen (EADDRINUSE)."""
    if port := os.environ.get("MASTER_PORT"):
        return int(port)
    job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "") + os.environ.get("SLURM_CONF", "")
    salt = zlib.crc32(cluster.encode())
    return 20000 + (salt + job_id * 7 + restart) % 12000


def make_model() -> nn.Module:
    torch.manual_seed(0)  # identical initial weights on every rank
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )  # fmt: skip


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic data, a pure function of (step, rank): a resumed run sees the same batches."""
    gen = torch.Generator().manual_seed(step * 1_000_003 + rank)
    x = torch.randn(BATCH, IN_FEATURES, generator=gen)
    teacher = torch.linspace(-1.0, 1.0, IN_FEATURES)
    y = torch.sin(x @ teacher).unsqueeze(1)
    return x, y


def save_checkpoint(ckpt_dir: Path, state: dict[str, Any]) -> Path:
    """Write to a temp file in the same directory, fsync, then atomically rename over
    ckpt-latest.pt: a reader sees the old checkpoint or the new one, never a torn file."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / CKPT_NAME
    fd, tmp = tempfile.mkstemp(dir=ckpt_dir, prefix=".ckpt-", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; a checkpoint is as readable as any output
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(ckpt_dir, os.O_RDONLY)  # make the rename itself durable
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def load_checkpoint(ckpt_dir: Path) -> dict[str, Any] | None:
    path = ckpt_dir / CKPT_NAME
    if not path.exists():
        return None
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def agreed_step(step: int) -> int:
    """Every rank loaded the checkpoint itself; fail fast unless they all saw the same step."""
    steps = torch.tensor([step, -step], dtype=torch.int64)
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    lo, hi = -int(steps[1]), int(steps[0])
    if lo != hi:
        raise RuntimeError(f"ranks disagree on the checkpoint step: min={lo} max={hi}")
    return step


class Printer:
    """The job's progress, checkpoint and resume lines, PyTorch-example or Megatron-LM shaped.

    Real Megatron prints progress from the last rank only; here every rank prints (``srun -l``
    labels each line), so a watcher sees one progress stream per rank."""

    def __init__(self, style: str, rank: int, node: str, last_step: int) -> None:
        self.megatron = style == "megatron"
        self.rank = rank
        self.node = node
        self.last_step = last_step
        self._since = time.monotonic()

    def progress(self, step: int, loss: float) -> None:
        if not self.megatron:
            print(f"step={step} loss={loss:.4f} rank={self.rank} node={self.node}", flush=True)
            return
        now = time.monotonic()
        ms = (now - self._since) * 1000
        self._since = now
        print(
            f" [{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {step:8d}/{self.last_step:8d} |"
            f" consumed samples: {step * BATCH:12d} | elapsed time per iteration (ms): {ms:.1f} |"
            f" learning rate: {0.01:.6E} | global batch size: {BATCH:5d} | lm loss: {loss:.6E} |"
            " loss scale: 1.0 | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |",
            flush=True,
        )

    def saved(self, step: int, path: Path) -> None:
        if self.megatron:
            print(
                f"  successfully saved checkpoint from iteration {step:7d} to {path.parent}"
                " [ t 1/1, p 1/1 ]",
                flush=True,
            )
        else:
            print(f"checkpoint saved step={step} path={path}", flush=True)

    def resumed(self, step: int, ckpt_dir: Path) -> None:
        if self.megatron:
            print(f" loading checkpoint from {ckpt_dir} at iteration {step}", flush=True)
            print(
                f"  successfully loaded checkpoint from {ckpt_dir} [ t 1/1, p 1/1 ]"
                f" at iteration {step}",
                flush=True,
            )
        else:
            print(f"resumed from checkpoint step={step}", flush=True)
        self._since = time.monotonic()

    def evaluated(self, step: int, loss: float) -> None:
        if self.megatron:
            print(f" validation loss at iteration {step} | lm loss value: {loss:.6E} |", flush=True)
        print(f"evaluation done step={step} val_loss={loss:.4f}", flush=True)
        self._since = time.monotonic()


def evaluate(model: nn.Module, step: int, rank: int, pause: float) -> float:
    """A few held-out batches without gradients, then ``pause`` seconds (a real evaluation's
    length), then a barrier: no rank starts the next step before every rank is done."""
    loss_fn = nn.MSELoss()
    with torch.no_grad():
        losses = [loss_fn(model(x), y).item() for x, y in (batch(-step - i, rank) for i in (1, 2))]
    time.sleep(pause)
    dist.barrier()
    return float(sum(losses) / len(losses))


def init_group(pg_timeout: float) -> tuple[int, int]:
    """Join the process group: torchrun's rendezvous (its agent exported $RANK, $WORLD_SIZE,
    $MASTER_ADDR and $MASTER_PORT for this round) or srun's task ids. Returns (rank, world)."""
    timeout = timedelta(seconds=pg_timeout)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend="gloo", init_method="env://", timeout=timeout)
        return rank, world
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://{addr}:{master_port()}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    return rank, world


def fails_now(args: argparse.Namespace, step: int, rank: int) -> bool:
    """Whether this rank raises the injected application error at this step (once only with
    --fail-once: the marker is written before the raise, so a restart trains on)."""
    if step != args.fail_at_step or rank != args.fail_rank:
        return False
    if not args.fail_once:
        return True
    marker = args.ckpt_dir / f".failed-at-{step}"
    if marker.exists():
        return False
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    node = os.environ.get("SLURMD_NODENAME", os.uname().nodename)
    print(f"worker up node={node}", flush=True)  # torch imported: what a restart waits for
    rank, world = init_group(args.pg_timeout)
    print(f"process group ready rank={rank} world={world}", flush=True)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    last_done = 0
    if (ckpt := load_checkpoint(args.ckpt_dir)) is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        last_done = int(ckpt["step"])
    last_done = agreed_step(last_done)
    out = Printer(args.progress_style, rank, node, args.steps)
    if ckpt is not None:
        out.resumed(last_done, args.ckpt_dir)
    else:
        print("starting from scratch", flush=True)

    ddp = DistributedDataParallel(model)
    loss_fn = nn.MSELoss()
    step = last_done
    for step in range(last_done + 1, args.steps + 1):
        if fails_now(args, step, rank):
            raise RuntimeError(f"injected application error at step {step}")
        x, y = batch(step, rank)
        optimizer.zero_grad(set_to_none=True)
        # Between synchronised steps a rank trains on its own: it keeps printing progress even
        # while a peer is gone, until the next synchronised step blocks it.
        local = step % args.sync_every != 0
        with ddp.no_sync() if local else contextlib.nullcontext():
            loss = loss_fn(ddp(x), y)
            loss.backward()  # DDP all-reduces the gradients across ranks here (unless local)
        optimizer.step()
        out.progress(step, loss.item())
        if rank == 0 and step % args.ckpt_every == 0:
            state = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            path = save_checkpoint(args.ckpt_dir, state)
            time.sleep(args.ckpt_pause)  # a big model's slow save; peers wait in a collective
            out.saved(step, path)
        if args.eval_every and step % args.eval_every == 0:
            print(f"evaluation started step={step}", flush=True)
            out.evaluated(step, evaluate(model, step, rank, args.eval_pause))
        time.sleep(args.step_sleep)

    dist.barrier()  # no rank tears down the group while a peer still needs it
    print(f"training finished step={step}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
