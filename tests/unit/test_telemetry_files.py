"""TelemetryTail: the watcher's incremental reader of a node's telemetry.jsonl."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from relaunch.connectors.telemetry import (
    ChangeFilter,
    TelemetryTail,
    append_samples,
    attempt_samples,
    pci_key,
    read_job_telemetry,
)
from relaunch.connectors.telemetry.samples import throttle_reasons
from relaunch.models.bundle import TelemetrySample, TelemetrySource
from relaunch.models.scheduler import Job

T0 = datetime(2026, 2, 20, 9, 0, tzinfo=UTC)


def sample(**fields: object) -> TelemetrySample:
    return TelemetrySample.model_validate({"node": "gpu-node-07", "gpu": 0, "time": T0, **fields})


def test_partial_last_line_waits_for_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "nodes" / "gpu-node-07" / "telemetry.jsonl"
    tail = TelemetryTail(path)
    assert tail.read() == []  # no file yet
    append_samples(path, [sample(xid=79, source="nvml")])
    line = sample(ecc_dbe_volatile=2).model_dump_json(exclude_none=True) + "\n"
    with path.open("a") as f:
        f.write(line[:17])
    first = tail.read()
    assert [(s.xid, s.source) for s in first] == [(79, TelemetrySource.NVML)]
    assert tail.malformed == 0
    with path.open("a") as f:
        f.write(line[17:])
    assert [s.ecc_dbe_volatile for s in tail.read()] == [2]
    assert tail.read() == []


def test_malformed_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    path.write_text(
        '{"node": "n1", "xid": 48}\n'
        "not json at all\n"
        '{"gpu": 1}\n'  # no node
        "\n"
        '{"node": "n1", "gpu": 0, "ecc_dbe_volatile": 1, "future_field": true}\n'
    )
    tail = TelemetryTail(path)
    samples = tail.read()
    assert [(s.node, s.xid, s.ecc_dbe_volatile) for s in samples] == [
        ("n1", 48, None),
        ("n1", None, 1),
    ]
    assert tail.malformed == 2
    assert tail.last_error and "not a telemetry sample" in tail.last_error


def test_an_endless_line_is_one_malformed_line(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    tail = TelemetryTail(path)
    with path.open("a") as f:
        f.write('{"node": "n1", "junk": "' + "x" * (2 << 20))  # still no newline
    assert tail.read() == []
    with path.open("a") as f:
        f.write('"}\n')
    append_samples(path, [sample(xid=79)])
    assert [s.xid for s in tail.read()] == [79]
    assert tail.malformed == 1
    assert tail.last_error and "longer than" in tail.last_error


def test_truncated_or_replaced_file_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    append_samples(path, [sample(xid=13)])
    tail = TelemetryTail(path)
    assert len(tail.read()) == 1
    with path.open("a") as f:
        f.write('{"node": "n1", "xi')  # a partial line, then the file is replaced
    os.rename(path, tmp_path / "old.jsonl")
    append_samples(path, [sample(xid=79)])
    assert [s.xid for s in tail.read()] == [79]
    assert tail.truncations == 1
    assert tail.malformed == 0


def test_from_end_skips_history(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.jsonl"
    append_samples(path, [sample(xid=13)])
    tail = TelemetryTail(path, from_end=True)
    assert tail.read() == []
    append_samples(path, [sample(xid=79)])
    assert [s.xid for s in tail.read()] == [79]


def test_old_readers_fields_still_round_trip() -> None:
    text = sample(xid=79, throttle=["hw_thermal"]).model_dump_json(exclude_none=True)
    again = TelemetrySample.model_validate_json(text)
    assert again.xid == 79 and again.throttle == ["hw_thermal"]
    assert TelemetrySample.model_validate({"node": "n1", "gpu": 2, "xid": 48}).source is None


def test_change_filter_treats_dcgm_last_xid_as_a_level() -> None:
    changes = ChangeFilter()
    dcgm = {"source": "dcgm", "xid": 79}
    assert changes.is_news(sample(**dcgm))
    assert not changes.is_news(sample(**dcgm))  # the same "last Xid" again is not news
    assert changes.is_news(sample(source="dcgm", xid=48))
    assert changes.is_news(sample(source="nvml"))
    assert changes.is_news(sample(source="nvml", xid=79))  # an NVML Xid is an event
    assert changes.is_news(sample(source="nvml", xid=79))
    assert changes.is_news(sample(source="nvml", ecc_dbe_volatile=0))  # a counter appeared
    assert not changes.is_news(sample(source="nvml", ecc_dbe_volatile=0))
    assert changes.is_news(sample(source="nvml", ecc_dbe_volatile=1))
    assert not changes.is_news(sample(source="nvml", ecc_dbe_volatile=0))  # driver reload
    assert changes.is_news(sample(source="nvml", ecc_dbe_volatile=0, remapped_rows_pending=True))


def test_pci_and_throttle_helpers() -> None:
    assert pci_key("00000000:07:00.0") == pci_key("PCI:0000:07:00") == "0000:07:00"
    assert pci_key("00000000:00:1B.0") == "0000:00:1b"
    assert pci_key("GPU-123") is None
    assert throttle_reasons(0x1 | 0x4 | 0x80) == ["sw_power_cap", "hw_power_brake"]


def _lines(*samples: TelemetrySample) -> str:
    return "".join(s.model_dump_json(exclude_none=True) + "\n" for s in samples)


def test_attempt_samples_keep_each_gpu_s_baseline_and_what_came_after() -> None:
    early, late = T0 - timedelta(minutes=5), T0 - timedelta(minutes=1)
    text = (
        _lines(sample(time=early, ecc_dbe_volatile=1), sample(time=late, ecc_dbe_volatile=2))
        + _lines(sample(gpu=1, time=early, ecc_dbe_volatile=0))
        + '{"node": "gpu-node-07", "xid": \n'  # torn
        + "not json\n"
        + _lines(sample(time=T0, xid=79), sample(time=None, gpu=None, xid=13))
    )
    kept = attempt_samples(text, T0)
    assert [(s.gpu, s.time, s.ecc_dbe_volatile, s.xid) for s in kept] == [
        (0, late, 2, None),  # GPU 0's last sample before the start
        (1, early, 0, None),
        (0, T0, None, 79),
        (None, None, None, 13),
    ]
    assert len(attempt_samples(text, None)) == 5  # no start: every sample
    assert attempt_samples("", T0) == []


async def test_read_job_telemetry_reads_each_node_s_file(tmp_path: Path) -> None:
    pattern = str(tmp_path / "{node}" / "telemetry.jsonl")
    before = T0 - timedelta(minutes=1)
    append_samples(pattern.format(node="n1"), [sample(node="n1", time=before, xid=31)])
    append_samples(pattern.format(node="n1"), [sample(node="n1", time=T0, xid=79)])
    append_samples(pattern.format(node="n2"), [sample(node="n2", time=T0, xid=48)])
    job = Job(job_id="7", nodes=["n1", "n2", "n3"], start_time=T0)
    read = await read_job_telemetry(job, pattern, limit=1 << 20, timeout_s=5.0)
    assert [(s.node, s.xid) for s in read] == [("n1", 31), ("n1", 79), ("n2", 48)]
    assert await read_job_telemetry(job, None, limit=1 << 20, timeout_s=5.0) == []
