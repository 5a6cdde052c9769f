"""`relaunch agent`: no-GPU exit, the sampling loop (stand-in NVML), POST delivery, SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from relaunch.connectors.telemetry import TelemetryTail
from relaunch.connectors.telemetry.kernlog import KernelLogFile
from relaunch.connectors.telemetry.nvml import NvmlCollector
from relaunch.models.bundle import TelemetrySample
from relaunch.workers.agent import agent
from relaunch.workers.agent_runtime import Agent, FileSink, HttpSink, StdoutSink
from tests.support.fake_nvml import FakeNvml, dgx

REPO = Path(__file__).resolve().parents[2]
HAS_GPU = shutil.which("nvidia-smi") is not None


@pytest.mark.skipif(HAS_GPU, reason="this machine has an NVIDIA driver")
def test_no_gpu_exits_69_with_one_clear_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "relaunch.cli", "agent", "--once", "--node", "n1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 69
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "relaunch agent: no NVIDIA GPU here (NVML: NVML Shared Library Not Found); "
        "run it on a GPU node"
    ]


def test_invalid_node_name_is_refused() -> None:
    result = CliRunner().invoke(agent, ["--once", "--node", "n1;reboot"])
    assert result.exit_code == 2
    assert "invalid node name" in result.output


async def test_agent_sends_first_sample_then_only_news(tmp_path: Path) -> None:
    fake = FakeNvml(dgx(2))
    kern = tmp_path / "kern.log"
    kern.write_text("[1.0] NVRM: Xid (PCI:0000:18:00): 13, an old line, not resent\n")
    out = tmp_path / "nodes" / "gpu-node-07" / "telemetry.jsonl"
    collector = NvmlCollector("gpu-node-07", fake, call_timeout=2)
    await collector.start()
    runner = Agent(
        node="gpu-node-07",
        collector=collector,
        sinks=[FileSink(out)],
        interval=0.2,
        kernel=KernelLogFile(kern, "gpu-node-07"),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    watcher = TelemetryTail(out)
    seen: list[TelemetrySample] = []

    async def until(predicate: object, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen.extend(watcher.read())
            if callable(predicate) and predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out; seen {seen}")

    await until(lambda: len(seen) >= 2)
    assert [(s.gpu, s.source) for s in seen] == [(0, "nvml"), (1, "nvml")]
    await asyncio.sleep(0.6)  # three quiet ticks: nothing new is written
    seen.extend(watcher.read())
    assert len(seen) == 2

    fake.xid(1, 79)
    await until(lambda: any(s.xid == 79 for s in seen))
    fake.gpus[0].ecc_volatile = 1
    await until(lambda: any(s.ecc_dbe_volatile == 1 for s in seen))
    with kern.open("a") as f:
        f.write("[155044.078590] NVRM: Xid (PCI:0000:28:00): 48, pid=7, name=python, DBE\n")
        f.write("[155044.1] usb 7-2.4: new high-speed USB device number 13 using xhci_hcd\n")
    await until(lambda: any(s.source == "kernel" for s in seen))
    stop.set()
    await asyncio.wait_for(task, 5)
    await collector.close()
    seen.extend(watcher.read())
    xid = next(s for s in seen if s.xid == 79)
    assert (xid.gpu, xid.uuid) == (1, fake.gpus[1].uuid)
    kernel = [s for s in seen if s.source == "kernel"]
    assert [(k.signature, k.xid, k.gpu, k.pci_bus_id) for k in kernel] == [
        ("xid_48", 48, 1, "00000000:28:00.0")  # mapped to the GPU NVML knows there
    ]
    assert watcher.malformed == 0


class _Collector(BaseHTTPRequestHandler):
    received: list[tuple[str | None, str | None, bytes]] = []
    failures = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if _Collector.failures > 0:
            _Collector.failures -= 1
            self.send_response(503)
        else:
            type(self).received.append(
                (self.headers["Authorization"], self.headers["Content-Type"], body)
            )
            self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector_url() -> Iterator[str]:
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/telemetry"
    server.shutdown()
    server.server_close()


async def test_post_retries_with_backoff_and_never_logs_the_token(
    collector_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    _Collector.failures = 2
    sink = HttpSink(collector_url, "s3cret-token", backoff=0.05)
    await sink.send([TelemetrySample(node="n1", gpu=0, xid=79)])
    ((auth, content_type, body),) = _Collector.received
    assert auth == "Bearer s3cret-token"
    assert content_type == "application/x-ndjson"
    assert [json.loads(line) for line in body.splitlines()] == [{"node": "n1", "gpu": 0, "xid": 79}]
    assert "s3cret-token" not in caplog.text
    assert "telemetry POST failed" in caplog.text


async def test_undelivered_batch_is_kept_for_the_next(collector_url: str) -> None:
    _Collector.failures = 10
    sink = HttpSink(collector_url, None, attempts=2, backoff=0.01)
    await sink.send([TelemetrySample(node="n1", xid=48)])
    assert len(sink.pending) == 1 and _Collector.received == []
    _Collector.failures = 0
    await sink.send([TelemetrySample(node="n1", xid=79)])
    ((auth, _, body),) = _Collector.received
    assert auth is None
    assert [json.loads(line)["xid"] for line in body.splitlines()] == [48, 79]


def test_sigterm_stops_the_agent_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "telemetry.jsonl"
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from relaunch.connectors.telemetry.nvml import NvmlCollector
        from relaunch.workers.agent import _main
        from relaunch.workers.agent_runtime import Agent, FileSink
        from tests.support.fake_nvml import FakeNvml, dgx

        fake = FakeNvml(dgx(1))
        collector = NvmlCollector("n1", fake, call_timeout=2)
        runner = Agent(node="n1", collector=collector, sinks=[FileSink(Path({str(out)!r}))],
                       interval=0.2)
        asyncio.run(_main(runner, False))
        print("shut down" if not fake.initialised else "NVML left initialised")
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert stdout.strip() == "shut down"
    assert "Traceback" not in stderr
    assert len(out.read_text().splitlines()) == 1


class _StuckSink:
    """A receiver that does not answer until released (an HTTP collector that is down)."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def send(self, samples: list[TelemetrySample]) -> None:
        self.calls += 1
        await self.release.wait()


async def test_heartbeats_go_beside_the_file_never_into_it(tmp_path: Path) -> None:
    """Beats replace the small `heartbeat` file beside telemetry.jsonl, whatever another sink
    is waiting for; the telemetry file gains no line from them; a clean stop removes it."""
    fake = FakeNvml(dgx(1))
    out = tmp_path / "nodes" / "n1" / "telemetry.jsonl"
    heartbeat = out.with_name("heartbeat")
    collector = NvmlCollector("n1", fake, call_timeout=2)
    await collector.start()
    stuck = _StuckSink()
    runner = Agent(
        node="n1", collector=collector, sinks=[stuck, FileSink(out)], interval=5, heartbeat=0.2
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    beats: set[str] = set()
    started = time.monotonic()
    while time.monotonic() - started < 1.0:  # about five beats
        await asyncio.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            beats.add(heartbeat.read_text())
    assert stuck.calls == 1  # still stuck on its first batch
    lines = out.read_text().splitlines()
    stuck.release.set()
    stop.set()
    await asyncio.wait_for(task, 5)
    await collector.close()
    assert len(beats) >= 3, beats
    for text in beats:
        assert text.endswith("\n") and text.count("\n") == 1
        body = json.loads(text)
        assert set(body) == {"node", "time", "pid"}
        assert (body["node"], body["pid"]) == ("n1", os.getpid())
    assert [json.loads(line).get("gpu") for line in lines] == [0]  # the GPU's first sample only
    assert len(out.read_text().splitlines()) == 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["telemetry.jsonl"]


async def test_no_heartbeat_in_the_stdout_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeNvml(dgx(1))
    collector = NvmlCollector("n1", fake, call_timeout=2)
    await collector.start()
    runner = Agent(node="n1", collector=collector, sinks=[StdoutSink()], interval=5, heartbeat=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await asyncio.sleep(0.7)
    stop.set()
    await asyncio.wait_for(task, 5)
    await collector.close()
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [sample.get("gpu") for sample in printed] == [0]


def test_heartbeat_interval_is_checked() -> None:
    result = CliRunner().invoke(agent, ["--once", "--node", "n1", "--heartbeat", "0.1"])
    assert result.exit_code == 2
    assert "0 (off) or between 0.5 and 3600" in result.output
    said = " ".join(CliRunner().invoke(agent, ["--help"]).output.split())
    assert "replaces the small file `heartbeat` beside it (never a telemetry line)" in said
    assert "a --post receiver gets a heartbeat line" in said
    assert "stdout gets no heartbeats" in said
