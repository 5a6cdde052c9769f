"""The agent's kernel path, piece by piece: the ``/dev/kmsg`` record parser (facility and
level, the kernel's escapes, continuation lines), the reader (from the end, sequence gaps and
EPIPE counted and passed, user-space records skipped, a saved sequence number), and the
receiver ``POST /intake/agent`` (an agent token reports its own node only; a wrong token,
another node's line, an oversize body, bad JSON, a user-facility record or a control character
is a clear 4xx and nothing is written; what is written is read back as a trusted kernel line).
The console runs in-process (no database is touched on this route)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from relaunch.cli import cli
from relaunch.connectors.telemetry import kernlog
from relaunch.connectors.telemetry.kernlog import (
    KmsgReader,
    parse_journal_entry,
    parse_kmsg,
    split_records,
)
from relaunch.console.app import create_app
from relaunch.console.auth import ConsoleRole, write_tokens
from relaunch.console.intake.common import MAX_BODY
from relaunch.console.web import Services
from relaunch.detection.kernel_lines import kernel_message
from relaunch.detection.signatures import Catalogue
from relaunch.models.agentwire import HeartbeatLine, KernelRecordLine
from relaunch.models.config import ClusterConfig, ConsoleSettings
from relaunch.workers.agent_runtime import Batch, HttpSink, load_kmsg_state, save_kmsg_state

SEGV = (
    "6,439,10251635673,-;python3[10461]: segfault at 0 ip 00007fb61a1bd000 sp 00007ffd20931468 "
    "error 4 in x\\x0aNVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\\x0ay"
    "[0,7fb61a1bd000+1000] likely on CPU 0 (core 0, socket 0)\n"
)
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


# ------------------------------------------------------------------ the record parser


def test_a_record_says_its_facility_level_sequence_and_dictionary() -> None:
    rec = parse_kmsg(f"3,1234,5678,-;{XID}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n".encode())
    assert rec is not None
    assert (rec.facility, rec.level, rec.seq, rec.usec, rec.flags) == (0, 3, 1234, 5678, "-")
    assert rec.kernel and rec.text == XID
    assert dict(rec.fields) == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    # The kernel's own segfault report, as this machine's /dev/kmsg gave it: one record, the
    # user's newlines escaped, its quoted Xid text inside the message, never a line of its own.
    segv = parse_kmsg(SEGV.encode())
    assert segv is not None and segv.kernel and (segv.level, segv.seq) == (6, 439)
    assert "\n" not in segv.text and segv.text.startswith("python3[10461]: segfault at 0")
    # Root writing to /dev/kmsg gets LOG_USER (pri 8..15): never the kernel's.
    for pri in (8, 11, 12, 14):
        user = parse_kmsg(f"{pri},441,11992661205,-;{XID}".encode())
        assert user is not None and not user.kernel and user.facility == 1
    # Not a record: no header, a priority out of range.
    assert parse_kmsg(XID.encode()) is None
    assert parse_kmsg(b"2048,1,1,-;x") is None
    assert parse_kmsg(b" SUBSYSTEM=pci") is None


def test_a_stream_of_records_keeps_continuation_lines_with_their_record() -> None:
    done, rest = split_records(b"6,1,2,-;a\n SUBSYSTEM=x\n14,2,3,-;b\n6,3,4,-;c")
    assert done == [b"6,1,2,-;a\n SUBSYSTEM=x", b"14,2,3,-;b"] and rest == b"6,3,4,-;c"
    done, rest = split_records(b" DEVICE=+x\n6,4,5,-;d\n")
    assert done == [b"6,4,5,-;d"] and rest == b""


def test_journal_entries_are_the_kernels_only_on_its_transport_with_facility_zero() -> None:
    def entry(**fields: str) -> bytes:
        return json.dumps({"MESSAGE": XID, "__REALTIME_TIMESTAMP": "1764900000000000", **fields})

    kernel = parse_journal_entry(entry(_TRANSPORT="kernel", PRIORITY="3"), "n1")
    assert kernel is not None and kernel.kernel and kernel.level == 3
    # journald keeps the facility a user-space write to /dev/kmsg was given.
    user_kmsg = parse_journal_entry(entry(_TRANSPORT="kernel", SYSLOG_FACILITY="1"), "n1")
    assert user_kmsg is not None and not user_kmsg.kernel
    for transport in ("syslog", "journal", "stdout"):  # logger, sd_journal_send, a service
        line = parse_journal_entry(entry(_TRANSPORT=transport, SYSLOG_FACILITY="0"), "n1")
        assert line is not None and not line.kernel


# ------------------------------------------------------------------ the reader


def _records(path: Path, *lines: str) -> None:
    with path.open("a") as fh:
        fh.writelines(line + "\n" for line in lines)


def test_reader_starts_at_the_end_counts_gaps_and_skips_user_space(tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    _records(path, "6,1,10,-;before the agent started")
    reader = KmsgReader("n1", path=str(path))
    assert reader.read() == []
    _records(path, f"3,2,20,-;{XID}", "12,3,30,-;root wrote this", "6,7,40,-;after a gap")
    got = reader.read()
    assert [(r.seq, r.text) for r in got] == [(2, XID), (7, "after a gap")]
    assert (reader.stats.lost, reader.stats.not_kernel, reader.stats.last_seq) == (3, 1, 7)
    lines = reader.lines(got)
    assert [line.node for line in lines] == ["n1", "n1"]
    assert all(line.time is not None and line.time <= datetime.now(UTC) for line in lines)
    # Resumed after a saved sequence number: what was read before is not read again.
    again = KmsgReader("n1", path=str(path), after_seq=2)
    assert [r.seq for r in again.read()] == [7]
    assert (again.stats.lost, again.stats.not_kernel) == (3, 1)


def test_a_saved_sequence_number_holds_for_its_boot_only(tmp_path: Path) -> None:
    state = tmp_path / "state" / "kmsg.json"
    assert load_kmsg_state(state) is None
    save_kmsg_state(state, 4711)
    assert load_kmsg_state(state) == 4711
    state.write_text(json.dumps({"boot_id": "another-boot", "seq": 4711}))
    assert load_kmsg_state(state) is None  # sequence numbers start again at each boot
    state.write_text("{torn")
    assert load_kmsg_state(state) is None


def test_epipe_is_counted_and_the_reader_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/dev/kmsg answers EPIPE when the next record was overwritten before it was read; the
    read after gives the oldest record still kept."""
    path = tmp_path / "kmsg"
    path.write_text("")
    reader = KmsgReader("n1", path=str(path))
    reader._device = True  # one read, one record, as the device gives them
    reads: list[bytes | type[Exception]] = [
        b"6,10,1,-;first\n",
        BrokenPipeError,
        b"6,15,2,-;oldest still kept\n",
        BlockingIOError,
    ]

    def fake_read(fd: int, n: int) -> bytes:
        item = reads.pop(0)
        if isinstance(item, bytes):
            return item
        raise item()

    monkeypatch.setattr(kernlog.os, "read", fake_read)
    assert [r.text for r in reader.read()] == ["first", "oldest still kept"]
    assert (reader.stats.overruns, reader.stats.lost, reader.stats.last_seq) == (1, 4, 15)


def test_the_real_dev_kmsg_never_gives_roots_write_as_the_kernels() -> None:
    """As root, a write to /dev/kmsg even with `<3>` is kept with LOG_USER: the reader sees it
    and skips it. (The kernel drops writes past a burst, printk_devkmsg=ratelimit: written
    again until the record is there.)"""
    if os.geteuid() != 0:
        pytest.skip("writing to /dev/kmsg takes root")
    reader = KmsgReader("n1")
    marker = f"relaunch-test-kmsg-{os.getpid()}-{datetime.now(UTC).timestamp()}"
    kept: list[bytes] = []
    for _ in range(15):
        fd = os.open("/dev/kmsg", os.O_WRONLY)
        try:
            os.write(fd, f"<3>{XID} {marker}".encode())
        finally:
            os.close(fd)
        kept = [raw for raw in _all_records() if marker.encode() in raw]
        if kept:
            break
        time.sleep(1)
    assert kept, "the kernel kept none of root's writes"
    assert kept[0].startswith(b"11,")  # LOG_USER | LOG_ERR: the facility the kernel gave it
    got = reader.read()
    assert not [r for r in got if marker in r.text]
    assert reader.stats.not_kernel >= 1
    reader.close()


def _all_records() -> list[bytes]:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out: list[bytes] = []
    try:
        while True:
            try:
                out.append(os.read(fd, 8192))
            except BlockingIOError:
                return out
            except BrokenPipeError:
                continue
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the receiver


class Env:
    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self.tokens = write_tokens(
            tmp_path / "tokens.json",
            [("n1", ConsoleRole.AGENT), ("n2", ConsoleRole.AGENT), ("am", ConsoleRole.INTAKE)],
        )
        (tmp_path / "tokens.json").chmod(0o600)
        self.root = tmp_path / "nodes"
        fields: dict[str, Any] = {
            "node_log_pattern": str(self.root / "{node}" / "kern.log"),
            "telemetry_pattern": str(self.root / "{node}" / "telemetry.jsonl"),
            **config,
        }
        self.config = ClusterConfig(
            name="c1",
            database_url="postgresql://nobody@127.0.0.1:1/none",  # this route reads no database
            bundle_dir=str(tmp_path / "bundles"),
            console=ConsoleSettings(tokens_file=str(tmp_path / "tokens.json")),
            **fields,
        )
        self.app = create_app(self.config, Services(), secret="kmsg-test-secret-0123456789")
        self.client = TestClient(self.app)

    def post(self, body: bytes | str, token: str | None = "n1", **headers: str) -> httpx.Response:
        if token is not None:
            headers["authorization"] = f"Bearer {self.tokens.get(token, token)}"
        data = body.encode() if isinstance(body, str) else body
        return self.client.post("/intake/agent", content=data, headers=headers)

    def kern(self, node: str = "n1") -> Path:
        return self.root / node / "kern.log"


def record(node: str = "n1", **changes: Any) -> str:
    line = {
        "record": "kernel",
        "node": node,
        "source": "kmsg",
        "facility": 0,
        "level": 3,
        "seq": 7,
        "usec": 123,
        "time": "2026-12-05T01:50:04.123456+00:00",
        "text": XID,
        **changes,
    }
    return json.dumps(line) + "\n"


@pytest.mark.parametrize(
    ("body", "token", "status", "words"),
    [
        (record(), None, 401, "bearer token is required"),
        (record(), "rl_not-a-token", 401, "unknown or revoked token"),
        (record(), "am", 403, "am is a intake, not a node's agent"),
        (record("n2"), "n1", 403, "may report node n1 only"),
        (record() + record("n2"), "n1", 403, "line 2 names 'n2'"),
        ("{not json\n", "n1", 400, "line 1 is not valid JSON"),
        ("[1, 2]\n", "n1", 422, "not a JSON object"),
        ("\n\n", "n1", 400, "holds no line"),
        (record(facility=1), "n1", 422, "facility 1 is not the kernel's (0)"),
        (record(level=9), "n1", 422, "line 1: level"),
        (record(text="a\nfake: line"), "n1", 422, "control character"),
        (record(record="syslog"), "n1", 422, "unknown record 'syslog'"),
        (record(extra=1), "n1", 422, "line 1: extra"),
        (record() + "x" * MAX_BODY, "n1", 413, "body larger than"),
    ],
)
def test_the_receiver_refuses_clearly_and_writes_nothing(
    tmp_path: Path, body: str, token: str | None, status: int, words: str
) -> None:
    env = Env(tmp_path)
    got = env.post(body, token)
    assert got.status_code == status, got.text
    assert words in got.json()["error"] and "Traceback" not in got.text
    assert not env.root.exists()  # nothing of the request was written


def test_a_received_kernel_record_is_a_trusted_kernel_line_of_its_node(tmp_path: Path) -> None:
    env = Env(tmp_path)
    beat = HeartbeatLine(
        node="n1", time=datetime.now(UTC), pid=42, kernel_source="kmsg", kmsg_seq=7
    ).model_dump_json()
    got = env.post(record() + beat + "\n")
    assert got.status_code == 200, got.text
    assert got.json()["written"] == {"kernel": 1, "samples": 0, "heartbeat": True}
    [line] = env.kern().read_text().splitlines()
    assert line == f"2026-12-05T01:50:04.123456+00:00 n1 kernel: {XID}"
    message = kernel_message(line)
    assert message is not None and message.text == XID  # the watcher's own reading: trusted
    [match] = Catalogue.load().scan_lines(
        [(1, line)], source="kern.log", source_node="n1", kernel=True
    )
    assert match.xid == 79
    assert (env.root / "n1" / "heartbeat").is_file()  # the watcher's silent-agent check
    status = json.loads((env.root / "n1" / "kern.log.agent.json").read_text())
    assert (status["node"], status["kmsg_seq"], status["kernel_records"]) == ("n1", 7, 1)
    # A clean stop removes the heartbeat file: a stopped agent is not a dead node.
    stop = HeartbeatLine(node="n1", time=datetime.now(UTC), pid=42, stopping=True)
    assert env.post(stop.model_dump_json()).status_code == 200
    assert not (env.root / "n1" / "heartbeat").exists()


def test_without_node_log_pattern_the_receiver_says_so(tmp_path: Path) -> None:
    env = Env(tmp_path, node_log_pattern=None)
    got = env.post(record())
    assert got.status_code == 503 and "has no node_log_pattern" in got.json()["error"]


def test_the_agents_http_sink_speaks_the_receivers_language(tmp_path: Path) -> None:
    """The agent's own sink, against the console app: kernel records, then the heartbeat;
    the node's status is what `relaunch agents` prints, and it says a silent agent is stale."""
    env = Env(tmp_path)

    async def send() -> None:
        transport = httpx.ASGITransport(app=env.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            sink = HttpSink("http://console/intake/agent", env.tokens["n2"], client=client)
            now = datetime.now(UTC)
            kernel = [
                KernelRecordLine(
                    node="n2", source="kmsg", facility=0, level=6, seq=s, usec=s, time=now, text=t
                )
                for s, t in ((1, "mlx5_core 0000:3b:00.0: link down"), (2, XID))
            ]
            beat = HeartbeatLine(node="n2", time=now, pid=1, kernel_source="kmsg", kmsg_seq=2)
            await sink.send_batch(Batch(kernel=kernel, beat=beat))
            assert sink.pending == [] and sink.sent_bytes > 0

    asyncio.run(send())
    assert len(env.kern("n2").read_text().splitlines()) == 2
    cfg = tmp_path / "cluster.json"
    cfg.write_text(env.config.model_dump_json())
    shown = CliRunner().invoke(cli, ["agents", "--config", str(cfg)])
    assert shown.exit_code == 0, shown.output
    assert "n2\tok\t" in shown.output and "kernel kmsg seq 2" in shown.output
    # An agent silent for longer than --stale-after is stale, and the check fails.
    status = env.root / "n2" / "kern.log.agent.json"
    row = json.loads(status.read_text())
    row["last_batch"] = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    status.write_text(json.dumps(row))
    shown = CliRunner().invoke(cli, ["agents", "--config", str(cfg), "--stale-after", "60"])
    assert shown.exit_code == 1 and "n2\tSTALE\t" in shown.output


# ------------------------------------------------------------------ the unit and its install

REPO = Path(__file__).resolve().parents[2]


def test_the_install_script_writes_a_root_only_token_and_a_unit_systemd_accepts(
    tmp_path: Path,
) -> None:
    token = tmp_path / "token"
    token.write_text("rl_" + "x" * 43 + "\n")
    script = REPO / "deploy" / "install-agent.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    venv = Path(sys.executable).parent.parent
    root = tmp_path / "root"
    argv = [str(script), "--url", "https://console.example:8400/intake/agent"]
    argv += ["--token-file", str(token), "--no-gpu", "--node", "gpu-017", "--root", str(root)]
    done = subprocess.run([*argv, "--venv", str(venv)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    env = root / "etc" / "relaunch" / "agent.env"
    assert env.stat().st_mode & 0o777 == 0o600
    assert env.read_text().splitlines() == [
        f"RELAUNCH_AGENT_TOKEN=rl_{'x' * 43}",
        "RELAUNCH_AGENT_POST=https://console.example:8400/intake/agent",
        "RELAUNCH_AGENT_ARGS=--no-gpu --node gpu-017",
    ]
    unit = root / "etc" / "systemd" / "system" / "relaunch-agent.service"
    text = unit.read_text()
    assert f"ExecStart={venv}/bin/relaunch agent --kernel-log kmsg" in text
    assert "EnvironmentFile=/etc/relaunch/agent.env" in text
    assert "DeviceAllow=/dev/kmsg r" in text and "AmbientCapabilities=CAP_SYSLOG" in text
    assert "\nProtectKernelLogs=" not in text and "\nPrivateDevices=" not in text
    if shutil.which("systemd-analyze"):
        verified = subprocess.run(
            ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True
        )
        assert verified.returncode == 0, verified.stderr
    # Mistakes are said, and nothing is written.
    bad = subprocess.run(
        [
            str(script),
            "--url",
            "ftp://x",
            "--token-file",
            str(token),
            "--root",
            str(tmp_path / "b"),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--url must be" in bad.stderr
    assert not (tmp_path / "b").exists()
