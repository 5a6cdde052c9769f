#!/usr/bin/env bash
# Ready check for the node agent, and the node lifecycle's GPU checks, on a machine WITH an
# NVIDIA GPU (under 2 minutes).
# Every GPU that `nvidia-smi -L` lists must appear in `relaunch agent --once` with its UUID and
# PCI bus id; the agent must then run for a few seconds, write samples and stop on SIGTERM.
# Prints PASS/FAIL lines; exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

command -v nvidia-smi >/dev/null || { fail "nvidia-smi not found: not a GPU machine"; exit 1; }
if [ ! -x .venv/bin/python ]; then
    echo "… creating .venv"
    python3 -m venv .venv && .venv/bin/pip install -q -e . >"$work/pip.log" 2>&1 \
        || { fail "venv setup (see $work/pip.log)"; cat "$work/pip.log"; exit 1; }
fi
PY=.venv/bin/python
node=$(hostname -s)

timeout 30 nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv,noheader >"$work/smi.csv" \
    || { fail "nvidia-smi --query-gpu"; exit 1; }
count=$(timeout 30 nvidia-smi -L | grep -c '^GPU ')
[ "$count" -gt 0 ] && pass "nvidia-smi lists $count GPU(s)" || fail "nvidia-smi lists no GPU"

if timeout 60 "$PY" -m relaunch.cli agent --once --node "$node" \
        >"$work/once.jsonl" 2>"$work/once.err"; then
    pass "relaunch agent --once exited 0"
else
    fail "relaunch agent --once exited $?: $(tail -n 3 "$work/once.err")"
fi
"$PY" - "$work/smi.csv" "$work/once.jsonl" "$node" <<'PYEOF' || failed=1
import json, sys
smi, once, node = sys.argv[1], sys.argv[2], sys.argv[3]
want = {}
for row in open(smi):
    index, uuid, bus = (part.strip() for part in row.split(","))
    want[uuid] = (int(index), bus.lower())
got = {}
for line in open(once):
    sample = json.loads(line)
    got[sample.get("uuid")] = sample
ok = True
for uuid, (index, bus) in sorted(want.items(), key=lambda kv: kv[1]):
    sample = got.get(uuid)
    if sample is None:
        print(f"FAIL GPU {index} {uuid}: not in the agent's output"); ok = False; continue
    checks = {
        "node": sample.get("node") == node,
        "gpu index": sample.get("gpu") == index,
        "pci_bus_id": (sample.get("pci_bus_id") or "").lower() == bus,
    }
    bad = [name for name, good in checks.items() if not good]
    if bad:
        print(f"FAIL GPU {index} {uuid}: wrong {', '.join(bad)}: {sample}"); ok = False
    else:
        fields = sorted(k for k in sample if k not in ("node", "gpu", "time", "source", "uuid"))
        print(f"PASS GPU {index} {uuid} {bus}: {', '.join(fields)}")
    if sample.get("errors"):
        print(f"FAIL GPU {index}: NVML errors {sample['errors']}"); ok = False
extra = set(got) - set(want)
if extra:
    print(f"FAIL the agent reported GPUs nvidia-smi does not list: {sorted(map(str, extra))}"); ok = False
sys.exit(0 if ok else 1)
PYEOF

# The collector running for a few seconds: first samples written, events registered, clean stop.
"$PY" -m relaunch.cli agent --node "$node" --interval 1 --output "$work/run.jsonl" \
    2>"$work/run.err" &
pid=$!
sleep 6
kill -TERM "$pid" 2>/dev/null
for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
if kill -0 "$pid" 2>/dev/null; then
    fail "agent did not stop within 10 s of SIGTERM"; kill -KILL "$pid"
fi
wait "$pid"; rc=$?
[ "$rc" -eq 0 ] && pass "agent stopped cleanly on SIGTERM" || fail "agent exited $rc on SIGTERM"
lines=$(wc -l <"$work/run.jsonl" 2>/dev/null || echo 0)
[ "$lines" -ge "$count" ] && pass "agent wrote $lines sample(s) in 6 s" \
    || fail "agent wrote $lines sample(s), expected at least $count"
grep -q Traceback "$work/run.err" && fail "traceback: $(tail -n 5 "$work/run.err")"

"$PY" - <<'PYEOF' || failed=1
import asyncio, time
from relaunch.connectors.telemetry.nvml import NvmlCollector
async def main() -> bool:
    c = NvmlCollector("check", call_timeout=5)
    await c.start()
    began = time.monotonic()
    events = await c.wait_xid(1.0)
    waited = time.monotonic() - began
    registered = sum(d.events for d in c.devices)
    await c.close()
    print(f"{'PASS' if registered else 'FAIL'} Xid events registered on {registered}/{len(c.devices)} GPU(s)")
    print(f"{'PASS' if waited < 8 else 'FAIL'} event wait returned in {waited:.1f}s ({len(events)} Xid)")
    return bool(registered) and waited < 8
raise SystemExit(0 if asyncio.run(main()) else 1)
PYEOF

# The node lifecycle's GPU checks (relaunch/detection/health_checks.json), run here as the
# lifecycle runs them on a node through srun: the same wrapper, the same pass rules. Nothing is
# reset or changed. DCGM's diagnostic and the NCCL all-reduce take minutes: only with
# RELAUNCH_GPU_CHECK_ALL=1 (and where dcgmi / all_reduce_perf are installed).
"$PY" - "$node" <<'PYEOF' || failed=1
import os, subprocess, sys
from relaunch.detection.health import builtin_checks, judge, wrapped_argv
from relaunch.models.lifecycle import CheckKind
node, ok = sys.argv[1], True
slow = {"gpu-dcgm-diag", "nccl-allreduce"}
gpu = [
    c for c in builtin_checks()
    if c.kind is CheckKind.COMMAND and {"nvidia-smi", "dcgmi"} & set(c.requires)
]
for check in gpu:
    if check.id in slow and os.environ.get("RELAUNCH_GPU_CHECK_ALL") != "1":
        print(f"SKIP lifecycle check {check.id}: set RELAUNCH_GPU_CHECK_ALL=1 to run it")
        continue
    try:
        done = subprocess.run(
            wrapped_argv(check, node), capture_output=True, text=True, timeout=check.timeout_s
        )
        result = judge(check, done.returncode, done.stdout + done.stderr)
    except subprocess.TimeoutExpired:
        result = judge(check, None, "", timed_out=True)
    word = "SKIP" if result.skipped else "PASS" if result.passed else "FAIL"
    print(f"{word} lifecycle check {check.id}: {result.detail}")
    ok = ok and (result.passed or result.skipped)
sys.exit(0 if ok else 1)
PYEOF

[ "$failed" -eq 0 ] && echo "PASS gpu-check" || echo "FAIL gpu-check"
exit "$failed"
