"""torchrun's elastic agent for jobs/train_elastic.sbatch, started from Python so that it forks
its worker instead of starting a new interpreter.

The same agent as `torchrun` (torch.distributed.launcher.api.elastic_launch: c10d rendezvous,
--nnodes MIN:MAX, the redundancy list that keeps hot spares) with one difference: the training
function runs in a process forked from the agent (start_method "fork"), after the agent has
imported torch and what the first optimizer imports (torch._dynamo, about a second here). A step
started again on a spare then waits for one interpreter's start-up, not two.

Usage (one per node, under srun):
    python elastic_launch.py --nnodes 2:2 --rdzv-endpoint HOST:PORT --rdzv-id ID \\
        [--rdzv-conf k=v,...] [--max-restarts N] [--monitor-interval S] -- <train_ddp.py args>
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch._dynamo  # noqa: E402, F401 - warm for the forked worker (the optimizer imports it)
import torch.optim  # noqa: E402, F401
import train_ddp  # noqa: E402
from torch.distributed.launcher.api import LaunchConfig, elastic_launch  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--nnodes", required=True, help="MIN:MAX nodes that train (MAX: one number)")
    p.add_argument("--rdzv-endpoint", required=True, help="HOST:PORT of the c10d store")
    p.add_argument("--rdzv-id", required=True, help="the rendezvous id (one per step)")
    p.add_argument("--rdzv-conf", default="", help="k=v,... (is_host, join_timeout, ...)")
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--monitor-interval", type=float, default=0.2)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then train_ddp.py's args")
    args = p.parse_args()
    lo, _, hi = args.nnodes.partition(":")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        p.error("--nnodes is MIN:MAX or N")
    args.min_nodes, args.max_nodes = int(lo), int(hi or lo)
    if args.train_args[:1] == ["--"]:
        args.train_args = args.train_args[1:]
    return args


def train(argv: list[str]) -> int:
    """The worker: train_ddp.main, its exception's traceback printed as a plain run prints it
    (the agent otherwise keeps it in an error file)."""
    try:
        return train_ddp.main(argv)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        raise


def main() -> None:
    args = parse_args()
    conf = dict(kv.split("=", 1) for kv in args.rdzv_conf.split(",") if "=" in kv)
    config = LaunchConfig(
        min_nodes=args.min_nodes,
        max_nodes=args.max_nodes,
        nproc_per_node=1,
        run_id=args.rdzv_id,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_backend="c10d",
        rdzv_configs=conf,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
        start_method="fork",
    )
    elastic_launch(config, train)(args.train_args)


if __name__ == "__main__":
    main()
