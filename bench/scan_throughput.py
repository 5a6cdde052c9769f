"""Scan throughput benchmark: the catalogue scan and end-to-end ``relaunch classify``.

1. Scan: the 1 GiB mixed training log of bench/attribution.py, scanned in 64 MiB chunks by the
   hyperscan engine; MB/s per CPU-second (one core) and of wall time.
2. Classify: a bundle whose 256 MiB job log is full of NCCL INFO lines (Megatron-style, ``srun
   -l`` labels, NCCL bootstrap lines for the peer addresses, iteration lines, and a real IB
   completion error at the end); ``relaunch classify --json`` runs in a child process, and its
   CPU time (user + system, from wait4) and peak RSS (ru_maxrss) are reported.

The relaunch package measured is the one Python imports: put a different tree first on
``PYTHONPATH`` to measure it (how the "before" numbers were taken from a pristine copy of the
previous commit). Generated logs are cached under ``--work``. Prints a Markdown block.

Usage:
    python bench/scan_throughput.py [--work /tmp/relaunch-scan-bench] [--scan-mb 1024]
        [--classify-mb 256] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Appended, not prepended: a tree named on PYTHONPATH keeps its relaunch package first.
sys.path.append(str(ROOT))

from bench.attribution import make_log, scan_file  # noqa: E402
from relaunch.detection.signatures import Catalogue  # noqa: E402

NODES = [f"gpu{n:03d}" for n in range(8)]
RANKS = 64


def make_nccl_bundle(path: Path, size: int, seed: int = 11) -> None:
    """A bundle whose job log is ``size`` bytes of NCCL INFO-heavy Megatron output."""
    rnd = random.Random(seed)
    (path / "logs").mkdir(parents=True, exist_ok=True)
    boot = []
    for r in range(RANKS):
        n = r // 8
        boot.append(
            f"{r}: gpu{n:03d}:{100000 + r}:{100000 + r} [{r % 8}] NCCL INFO Bootstrap : "
            f"Using ib0:10.0.0.{n + 1}<0>"
        )
        boot.append(
            f"{r}: gpu{n:03d}:{100000 + r}:{100000 + r} [{r % 8}] NCCL INFO NET/IB : Using "
            f"[0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.{n + 1}<0>"
        )
    written = 0
    with (path / "logs" / "job.log").open("w") as fh:
        text = "\n".join(boot) + "\n"
        fh.write(text)
        written += len(text)
        i = 0
        block: list[str] = []
        while written < size:
            i += 1
            r = i % RANKS
            n = r // 8
            kind = rnd.random()
            if kind < 0.90:
                line = (
                    f"{r}: gpu{n:03d}:{100000 + r}:{200000 + i % 977} [{r % 8}] NCCL INFO "
                    f"Channel {i % 32:02d}/32 : {r}[{r % 8}] -> {(r + 1) % RANKS}[{(r + 1) % 8}]"
                    f" [send] via NET/IB/{r % 4}/GDRDMA"
                )
            elif kind < 0.97:
                line = (
                    f"{r}: gpu{n:03d}:{100000 + r}:{100000 + r} [{r % 8}] NCCL INFO "
                    f"comm 0x{i:x} rank {r} nRanks {RANKS} nNodes 8 localRanks 8 localRank "
                    f"{r % 8} MNNVL 0"
                )
            else:
                line = (
                    f"{r}: [2026-12-02 10:{(i // 60) % 60:02d}:{i % 60:02d}] iteration "
                    f"{i:>8}/ 1000000 | consumed samples: {i * 1024} | elapsed time per "
                    f"iteration (ms): {1000 + rnd.random() * 50:.1f} | lm loss: "
                    f"{2 + rnd.random():.6E} |"
                )
            block.append(line)
            if len(block) == 4096:
                text = "\n".join(block) + "\n"
                fh.write(text)
                written += len(text)
                block.clear()
        fh.write(
            "9: gpu001:100009:100009 [1] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got "
            "completion from peer 10.0.0.3<53994> with status=12 opcode=0 len=0 vendor err 129 "
            "(Recv) localGid ::ffff:10.0.0.2 remoteGidsfe80::1\n"
        )
    (path / "job.json").write_text(
        '{"cluster": "bench", "job_id": "1", "state": "FAILED", "exit_code": "1:0", '
        f'"nodes": {NODES!r}, "observed_at": "2026-12-02T11:00:00+00:00"}}'.replace("'", '"')
    )


# Runs the command in a fresh child and reports its rusage: a child forked straight from this
# process would inherit this process's resident size in its peak RSS (the scan's buffers).
_LAUNCHER = """
import json, os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "maxrss_kb": usage.ru_maxrss}),
      file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def classify_child(bundle: Path) -> tuple[float, float, int, str]:
    """(wall s, CPU s, peak RSS in bytes, stdout) of ``relaunch classify --json bundle``."""
    code = "import sys; from relaunch.cli import main; sys.argv[0] = 'relaunch'; main()"
    wall = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCHER, "-c", code, "classify", "--json", str(bundle)],
        capture_output=True,
        text=True,
        check=False,
        cwd=bundle.parent,  # not the checkout: the package measured is the one on the path
    )
    took = time.perf_counter() - wall
    if done.returncode != 0:
        raise SystemExit(f"classify failed: exit {done.returncode}: {done.stderr[-2000:]}")
    usage = json.loads(done.stderr.strip().splitlines()[-1])
    return took, usage["cpu"], usage["maxrss_kb"] * 1024, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/relaunch-scan-bench"))
    parser.add_argument("--scan-mb", type=int, default=1024)
    parser.add_argument("--classify-mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs")
    parser.add_argument("--skip-scan", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import relaunch

    print(f"relaunch from {Path(relaunch.__file__).parent}", flush=True)
    rows: list[str] = []

    bundle = args.work / f"nccl-{args.classify_mb}m"
    if not (bundle / "job.json").exists():
        print(f"generating {bundle} …", flush=True)
        make_nccl_bundle(bundle, args.classify_mb << 20)
    mb = (bundle / "logs" / "job.log").stat().st_size / 1e6
    runs = [classify_child(bundle) for _ in range(args.repeat)]
    wall, cpu, rss, out = min(runs, key=lambda r: r[1])
    rows.append(
        f"| `relaunch classify --json`, {mb:.0f} MB NCCL INFO log | {mb / cpu:.0f} MB/s per "
        f"CPU-s ({cpu:.2f} CPU-s, {wall:.2f} s wall) | peak RSS {rss / 1e6:.0f} MB |"
    )
    print(rows[-1], flush=True)
    print(out.strip()[:400], flush=True)
    if not args.skip_scan:
        log = args.work / f"mixed-{args.scan_mb}m.log"
        if not log.exists():
            print(f"generating {log} …", flush=True)
            make_log(log, args.scan_mb << 20)
        mb = log.stat().st_size / 1e6
        catalogue = Catalogue.load(engine="hyperscan")
        best = min((scan_file(log, catalogue) for _ in range(args.repeat)), key=lambda r: r[1])
        wall, cpu, matches = best
        rows.append(
            f"| scan, hyperscan, {mb:.0f} MB mixed log | {mb / cpu:.0f} MB/s per CPU-s "
            f"({mb / wall:.0f} MB/s wall) | {matches} matches |"
        )
        print(rows[-1], flush=True)

    print("\n| what | throughput | other |\n|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
